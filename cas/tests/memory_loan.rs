//! Devices' request buffers count against the store's memory budget: a
//! loan that does not fit is refused naming the figures, a loan shrinks
//! what the chunk index's summary may grow into (it then finds fewer
//! duplicates; writes never fail), and dropping it gives that back.

mod common;

use cas::{Error, StoreOptions};
use common::*;

const MIB: u64 = 1 << 20;

fn opts() -> StoreOptions {
    // 8 MiB for the index beside 128 MiB of compaction memory.
    StoreOptions { memory_budget_bytes: 136 * MIB, compaction_memory_bytes: 128 * MIB, ..small_opts() }
}

#[test]
fn a_loan_beyond_the_budget_is_refused_with_the_figures() {
    let (_mem, store) = mem_store(opts());
    let e = store.lend_memory(9 * MIB, "the tag buffers of image x").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::MemoryBudget(_)), "{e}");
    for figure in
        ["the tag buffers of image x", &(9 * MIB).to_string(), &(136 * MIB).to_string(), "compaction"]
    {
        assert!(msg.contains(figure), "{figure:?} missing from: {msg}");
    }
    let a = store.lend_memory(4 * MIB, "a").unwrap();
    let b = store.lend_memory(3 * MIB, "b").unwrap();
    assert!(store.lend_memory(2 * MIB, "c").is_err(), "4 + 3 + 2 MiB exceed the 8 MiB left");
    drop(a);
    let c = store.lend_memory(2 * MIB, "c").expect("a returned loan is free again");
    drop((b, c));
}

#[test]
fn a_loan_leaves_the_index_only_what_is_left() {
    let (mem, store) = mem_store(opts());
    store.create_image("i", 64 * MIB).unwrap();
    let image = store.open_image("i").unwrap();
    // Everything but 64 KiB of the index's part is lent (its summary
    // takes 96 KiB as soon as it holds anything).
    let index_bytes = store.chunk_stats().index_memory_bytes;
    let loan = store.lend_memory(8 * MIB - (64 << 10) - index_bytes, "buffers").unwrap();
    assert!(store.lend_memory(128 << 10, "more").is_err());
    image.write(0, &payload(1, 0, 32 * 1024), true).unwrap(); // 16 MiB: 4096 new chunks
    store.compact_once(&image).expect("a full budget costs dedup, not writes");
    drop(loan);
    assert!(read_tokens(&image).unwrap()[..32 * 1024].iter().all(|&t| t == 1));
    drop((image, store));
    let store = reopen(&mem, opts()).unwrap();
    assert!(read_tokens(&store.open_image("i").unwrap()).unwrap()[..32 * 1024].iter().all(|&t| t == 1));
}
