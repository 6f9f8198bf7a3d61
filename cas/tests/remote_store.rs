//! A store with a remote (`StoreOptions::remote`): the chunks compaction
//! stores reach the bucket, leave the disk, and are read from the bucket,
//! also after a reopen; the store version says so, and a store opened
//! without its remote refuses with one line.

mod common;

use cas::objects::MemObjects;
use cas::storage::{MemStorage, Storage};
use cas::store::STORE_VERSION;
use cas::{Store, StoreOptions};
use common::*;
use std::sync::Arc;
use std::time::Duration;

fn opts(objects: Option<&MemObjects>) -> StoreOptions {
    remote_opts(objects.map(|o| Arc::new(o.clone()) as Arc<dyn cas::objects::Objects>))
}

fn local_packs(mem: &MemStorage) -> usize {
    mem.list_dir(&store_dir().join("chunks")).unwrap().iter().filter(|n| n.ends_with(".pack")).count()
}

#[test]
fn compacted_chunks_go_to_the_bucket_and_are_read_back_from_it() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts(Some(&objects))).unwrap();
    let version = |mem: &MemStorage| {
        let bytes = mem.durable_bytes(&store_dir().join("STORE")).unwrap();
        u32::from_le_bytes(bytes[8..12].try_into().unwrap())
    };
    assert_eq!(version(&mem), STORE_VERSION, "created with a remote: version 5 from the start");
    store.create_image("vm", 8 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    // 4 MiB of distinct blocks (about four 1 MiB packs), in 128 KiB writes.
    for i in 0..32u64 {
        image.write(i * (128 << 10), &payload(i + 1, i * 256, 256), false).unwrap();
    }
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    store.compact_once(&image).unwrap();
    store.chunks().seal_active().unwrap();
    store.tier().unwrap().upload_sealed().unwrap();
    let st = store.tier().unwrap().stats();
    assert!(st.uploaded_packs >= 4 && st.sealed_packs == 0, "{st:?}");
    assert_eq!(st.evicted_packs, st.uploaded_packs, "{st:?}");
    assert_eq!(local_packs(&mem), 0);
    // The log is kept until the manifest is published (cas::bucket::manifests).
    assert!(image.log_used_bytes() > 0);
    store.publish_wait("vm", Duration::from_secs(5)).unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "read from the bucket");
    assert!(store.tier().unwrap().stats().gets > 0);
    drop((image, store));

    let store = reopen(&mem, opts(Some(&objects))).unwrap();
    let image = store.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "reopened");
    assert_eq!(version(&mem), STORE_VERSION);
    drop((image, store));

    let Err(err) = reopen(&mem, opts(None)) else { panic!("opened without its remote") };
    assert!(err.to_string().contains("only in the bucket"), "{err}");
}
