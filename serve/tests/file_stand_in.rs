//! A device whose engine is stood in for by a plain file
//! (`DeviceCore::file_stand_in`, the baseline of `ci/bench path`): every
//! data request and FLUSH goes through the request path to the file, and
//! none reaches the image.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cas::storage::{FsStorage, MemStorage, OpenMode, Storage};
use cas::{Store, StoreOptions};
use sched::{ImageId, Op};
use serve::{DeviceCore, FileStandIn, HeapBuffers, Request, Server, Submitted, TagBuffers};

const DEPTH: u16 = 4;
const IO_BUF_BYTES: u32 = 64 << 10;
const IMAGE_BYTES: u64 = 4 << 20;

/// Serves one request on `core` and waits (bounded) for its result; also
/// says whether it completed in place.
fn serve_one(server: &Server<HeapBuffers>, core: &DeviceCore<HeapBuffers>, r: Request) -> (i32, bool) {
    match serve::submit(&server.sched, core, r) {
        Submitted::Completed(result) => (result, true),
        Submitted::Pending => {
            let waited = Instant::now();
            loop {
                if let Some(d) = core.queues[0].completions.drain().into_iter().next() {
                    return (serve::finish(core, &d), false);
                }
                assert!(waited.elapsed() < Duration::from_secs(30), "the request never completed");
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

fn request(op: Op, tag: u16, offset_bytes: u64, len_bytes: u64, fua: bool) -> Request {
    Request { qid: 0, tag, op, offset_bytes, len_bytes, fua, seen_ns: 0 }
}

#[test]
fn a_file_stand_in_serves_every_request_and_the_image_sees_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.img");
    let file = FsStorage::new().open(&path, OpenMode::Create).unwrap();
    file.set_len(IMAGE_BYTES).unwrap();

    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let store = Store::create(storage, std::path::Path::new("/store"), StoreOptions::default()).unwrap();
    store.create_image("raw", IMAGE_BYTES).unwrap();
    let image = store.open_image("raw").unwrap();
    let log_before = image.log_used_bytes();
    let loan = store.lend_memory(serve::tag_buffer_bytes(1, DEPTH, IO_BUF_BYTES), "test").unwrap();
    let bufs = vec![HeapBuffers::new(usize::from(DEPTH), IO_BUF_BYTES as usize)];
    let mut core =
        DeviceCore::new(ImageId(7), "raw", image.clone(), false, bufs, DEPTH, IO_BUF_BYTES, loan).unwrap();
    core.file_stand_in = Some(FileStandIn::new(file));
    let core = Arc::new(core);
    let server = Server::<HeapBuffers>::start(sched::Config::default(), 2, 1).unwrap();
    server.attach(core.clone()).unwrap();
    let bufs = &core.queues[0].bufs;

    // A write, a FUA write and a FLUSH.
    // SAFETY: tag 0 is free between requests.
    unsafe { bufs.request_bytes(0, 64 << 10) }.fill(0x5A);
    assert_eq!(serve_one(&server, &core, request(Op::Write, 0, 1 << 20, 64 << 10, false)).0, 64 << 10);
    // SAFETY: as above, tag 1.
    unsafe { bufs.request_bytes(1, 4096) }.fill(0x11);
    assert_eq!(serve_one(&server, &core, request(Op::Write, 1, 0, 4096, true)).0, 4096);
    assert_eq!(serve_one(&server, &core, request(Op::Flush, 2, 0, 0, false)).0, 0);

    // Reads come back through the path (in place or on a worker).
    for (offset, len, byte) in [(1u64 << 20, 64u64 << 10, 0x5Au8), (0, 4096, 0x11), (2 << 20, 4096, 0)] {
        // SAFETY: as above, tag 3.
        unsafe { bufs.request_bytes(3, len as usize) }.fill(0xEE);
        let (result, _in_place) = serve_one(&server, &core, request(Op::Read, 3, offset, len, false));
        assert_eq!(result, len as i32);
        // SAFETY: as above.
        let read = unsafe { bufs.request_bytes(3, len as usize) };
        assert!(read.iter().all(|&b| b == byte), "read at {offset} did not return the file's bytes");
    }
    // A request the stand-in does not serve fails rather than touch the image.
    assert_eq!(serve_one(&server, &core, request(Op::Discard, 0, 0, 4096, false)).0, -libc::EOPNOTSUPP);
    assert!(server.detach(&core).unwrap().is_empty());
    server.shutdown();

    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes[..4096].iter().all(|&b| b == 0x11));
    assert!(bytes[1 << 20..(1 << 20) + (64 << 10)].iter().all(|&b| b == 0x5A));
    let stats = store.image_stats(&image);
    assert_eq!((stats.payload_bytes_written, stats.read_bytes), (0, 0), "the image served a request");
    assert_eq!(image.log_used_bytes(), log_before, "the image's log grew");
}
