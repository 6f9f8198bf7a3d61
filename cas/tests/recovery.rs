//! WAL recovery: torn tails are discarded, damage in the middle of the log
//! is refused with its segment and offset, newer formats are refused.

mod common;

use cas::format::{crc32c, crc32c_append};
use cas::storage::{CrashMode, MemStorage, OpenMode, Storage};
use cas::Error;
use common::*;

/// Record layout facts the tests rely on (see cas::wal::record).
const SEG_HEADER: u64 = 512;
const REC_HEADER: u64 = 64;

fn rec_bytes(payload: u64) -> u64 {
    REC_HEADER + payload
}

fn patch(mem: &MemStorage, path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let f = mem.open(path, OpenMode::Existing).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_data().unwrap();
}

fn read_at(mem: &MemStorage, path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    let f = mem.open(path, OpenMode::Existing).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// Three 512-byte writes (seq 1, 2, 3) at sectors 0, 1, 2; `flush_after`
/// says after which of them a FLUSH runs.
fn three_writes(flush_after: &[u64]) -> (MemStorage, std::sync::Arc<cas::Store>) {
    let (mem, store) = mem_store(small_opts());
    store.create_image("r", 1 << 20).unwrap();
    let image = store.open_image("r").unwrap();
    for token in 1..=3u64 {
        image.write((token - 1) * 512, &payload(token, token - 1, 1), false).unwrap();
        if flush_after.contains(&token) {
            image.flush().unwrap();
        }
    }
    drop(image);
    (mem, store)
}

fn record_pos(seq: u64) -> u64 {
    SEG_HEADER + (seq - 1) * rec_bytes(512)
}

#[test]
fn torn_tail_is_discarded_and_cut_off() {
    // Seq 2 and 3 were never synced; damage seq 2 as a torn write would.
    let (mem, store) = three_writes(&[1]);
    drop(store);
    let seg = segment_path("r", 1);
    mem.corrupt(&seg, record_pos(2) + REC_HEADER + 100, 0xff).unwrap();
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("r").unwrap();
    let st = image.stats();
    assert_eq!(st.recovery.records, 1, "{st:?}");
    assert_eq!(st.recovery.torn_tail_bytes, 2 * rec_bytes(512));
    assert_eq!(read_tokens(&image).unwrap()[..3], [1, 0, 0]);
    // The tail was truncated: new records go where seq 2 was, and the old
    // seq 3 can never resurface behind them.
    assert_eq!(mem.durable_bytes(&seg).unwrap().len() as u64, record_pos(2));
    image.write(4096, &payload(9, 8, 8), false).unwrap();
    image.flush().unwrap();
    drop(image);
    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("r").unwrap();
    let t = read_tokens(&image).unwrap();
    assert_eq!(t[..3], [1, 0, 0]);
    assert_eq!(t[8..16], [9; 8]);
    assert_eq!(image.stats().recovery.torn_tail_bytes, 0);
}

#[test]
fn damage_in_the_middle_is_refused_with_segment_and_offset() {
    // Seq 2 was flushed, and seq 3 (written after) says so: a bad seq 2 is
    // media corruption, not a torn tail.
    let (mem, store) = three_writes(&[2]);
    drop(store);
    let seg = segment_path("r", 1);
    mem.corrupt(&seg, record_pos(2) + REC_HEADER + 7, 0x01).unwrap();
    let store = reopen(&mem, small_opts()).unwrap();
    let e = store.open_image("r").unwrap_err();
    match &e {
        Error::Corruption { path, offset, detail } => {
            assert_eq!(path, &seg);
            assert_eq!(*offset, record_pos(2));
            assert!(detail.contains("segment 1") && detail.contains("middle"), "{detail}");
        }
        other => panic!("expected corruption, got {other}"),
    }
    // Refused every time, never silently truncated.
    assert!(store.open_image("r").is_err());
    assert_eq!(mem.open(&seg, OpenMode::Existing).unwrap().len().unwrap(), record_pos(4));
}

#[test]
fn damage_proven_by_a_record_in_a_later_segment_is_refused() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("r", 4 << 20).unwrap();
    let image = store.open_image("r").unwrap();
    // Fill segment 1 to within 576 bytes of its end (too little for
    // another WRITE record), flush, then write into segment 2.
    image.write(0, &payload(1, 0, 2046), false).unwrap();
    image.flush().unwrap();
    image.write(2 << 20, &payload(2, 4096, 400), false).unwrap();
    assert_eq!(image.stats().log_segments, 2);
    drop(image);
    drop(store);
    mem.corrupt(&segment_path("r", 1), SEG_HEADER + REC_HEADER + 5, 0x80).unwrap();
    let e = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap_err();
    assert!(
        matches!(&e, Error::Corruption { offset, .. } if *offset == SEG_HEADER),
        "expected corruption at the first record, got {e}"
    );
    assert!(e.to_string().contains("0000000000000002.wal"), "{e}");
}

#[test]
fn a_missing_segment_is_refused() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("r", 8 << 20).unwrap();
    let image = store.open_image("r").unwrap();
    for i in 0..3u64 {
        image.write(i << 20, &payload(i + 1, i * 2048, 2048), false).unwrap();
    }
    assert!(image.stats().log_segments >= 3);
    drop(image);
    drop(store);
    mem.remove_file(&segment_path("r", 2)).unwrap();
    let e = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

fn reseal_record(mem: &MemStorage, seq: u64, version: u32) {
    let seg = segment_path("r", 1);
    let pos = record_pos(seq);
    let mut rec = read_at(mem, &seg, pos, rec_bytes(512) as usize);
    rec[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c_append(crc32c_append(crc32c(&rec[..12]), &rec[16..64]), &rec[64..]);
    rec[12..16].copy_from_slice(&crc.to_le_bytes());
    patch(mem, &seg, pos, &rec);
}

#[test]
fn a_newer_record_version_is_refused_with_a_message() {
    let (mem, store) = three_writes(&[3]);
    drop(store);
    reseal_record(&mem, 2, 2);
    let e = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap_err();
    assert!(matches!(e, Error::UnsupportedVersion { found: 2, supported: 1, .. }), "{e}");
    assert!(e.to_string().contains("upgrade casblk"), "{e}");
    // Back at version 1 with a valid checksum, the image opens again.
    reseal_record(&mem, 2, 1);
    assert!(reopen(&mem, small_opts()).unwrap().open_image("r").is_ok());
}

#[test]
fn a_newer_segment_version_is_refused() {
    let (mem, store) = three_writes(&[]);
    drop(store);
    let seg = segment_path("r", 1);
    let mut h = read_at(&mem, &seg, 0, 512);
    h[8..12].copy_from_slice(&7u32.to_le_bytes());
    let crc = crc32c_append(crc32c(&h[..12]), &h[16..]);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    patch(&mem, &seg, 0, &h);
    let e = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap_err();
    assert!(matches!(e, Error::UnsupportedVersion { found: 7, .. }), "{e}");
}

#[test]
fn torn_crashes_never_lose_flushed_writes() {
    // Many torn crashes of a log with flushed and unflushed records in
    // several segments: flushed data always survives, and the image opens.
    let mut torn_seen = 0;
    for seed in 0..40u64 {
        let (mem, store) = mem_store(small_opts());
        store.create_image("r", 4 << 20).unwrap();
        let image = store.open_image("r").unwrap();
        image.write(0, &payload(1, 0, 1500), false).unwrap();
        image.flush().unwrap();
        for t in 2..8u64 {
            image.write((1 << 20) + t * 65536, &payload(t, 2048 + t * 128, 100), false).unwrap();
        }
        drop(image);
        drop(store);
        mem.crash(CrashMode::Torn { seed });
        let image = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap();
        let tokens = read_tokens(&image).unwrap();
        let bad: Vec<(usize, u64)> =
            tokens[..1500].iter().copied().enumerate().filter(|&(_, t)| t != 1).take(5).collect();
        assert!(bad.is_empty(), "seed {seed}: flushed write damaged: {bad:?} {:?}", image.stats());
        torn_seen += u64::from(image.stats().recovery.torn_tail_bytes > 0);
    }
    assert!(torn_seen > 0, "no seed tore the tail: the test proves nothing");
}

/// Writes segment 1 full (flushed), then one record into segment 2;
/// `flush_twice` flushes it and writes another record that proves it.
fn rolled_log(flush_twice: bool) -> MemStorage {
    let (mem, store) = mem_store(small_opts());
    store.create_image("r", 4 << 20).unwrap();
    let image = store.open_image("r").unwrap();
    image.write(0, &payload(1, 0, 2046), false).unwrap();
    image.flush().unwrap();
    image.write(2 << 20, &payload(2, 4096, 8), false).unwrap();
    if flush_twice {
        image.flush().unwrap();
        image.write(3 << 20, &payload(3, 6144, 8), false).unwrap();
    }
    assert_eq!(image.stats().log_segments, 2);
    drop((image, store));
    mem
}

#[test]
fn a_torn_header_of_a_rolled_segment_is_a_torn_tail() {
    // A segment rolled to is made durable by the next sync only, so its
    // header may be torn: without proof, it goes with the tail.
    let mem = rolled_log(false);
    mem.corrupt(&segment_path("r", 2), 30, 0x40).unwrap();
    let image = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap();
    let st = image.stats();
    assert_eq!((st.recovery.deleted_segments, st.log_segments), (1, 1), "{st:?}");
    let t = read_tokens(&image).unwrap();
    assert_eq!(t[..2046], [1; 2046]);
    assert_eq!(t[4096], 0, "the unflushed write in the torn segment is gone");
    // The log goes on: the next roll recreates segment 2.
    image.write(2 << 20, &payload(4, 4096, 8), true).unwrap();
    assert_eq!(image.stats().log_segments, 2);
}

#[test]
fn a_damaged_header_of_a_durable_segment_is_refused() {
    let mem = rolled_log(true);
    mem.corrupt(&segment_path("r", 2), 30, 0x40).unwrap();
    let e = reopen(&mem, small_opts()).unwrap().open_image("r").unwrap_err();
    assert!(matches!(&e, Error::Corruption { .. }) && e.to_string().contains("middle"), "{e}");
}
