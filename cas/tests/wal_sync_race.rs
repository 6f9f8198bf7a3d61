//! The fsync race between early writeback and group commit, replayed step
//! by step on the in-memory storage's model of the kernel.
//!
//! Early writeback syncs a closed segment while a group commit may sync the
//! same file. The kernel tells a writeback error once per open file: if the
//! writeback's sync gets EIO, a group-commit sync of the same handle just
//! after returns 0, although the records it should cover were dropped. The
//! segment's handle must remember the failure, so that group commit fails
//! and no FLUSH is acknowledged before the image fails.

use cas::image::durability::Durability;
use cas::storage::{CrashMode, Fault, FaultOp, MemStorage, Storage};
use cas::wal::{Log, RecordHeader, RecordKind, Segment};
use std::path::Path;
use std::sync::Arc;

const SEGMENT_BYTES: u64 = 1 << 20;
const WRITE_BYTES: u64 = 64 << 10;

/// One record of the closed segment: where its payload lies, and its byte.
struct Written {
    payload_at: usize,
    payload_len: usize,
    byte: u8,
}

/// A log on `mem`, and the records written to it until the first segment
/// closed; returns the closed segment too.
fn log_with_a_closed_segment(mem: &MemStorage) -> (Log, Durability, Arc<Segment>, Vec<Written>) {
    let dir = Path::new("/wal");
    mem.create_dir_all(dir).unwrap();
    mem.sync_dir(Path::new("/")).unwrap();
    Log::create(mem, dir, SEGMENT_BYTES, 7).unwrap();
    let (log, _) =
        Log::open(Arc::new(mem.clone()), dir, SEGMENT_BYTES, 7, 0, true, &mut |_, _, _| {}).unwrap();
    let durability = Durability::new("race".into(), 0);
    let mut written = Vec::new();
    loop {
        let slot = log.assign(RecordKind::Write, WRITE_BYTES).unwrap();
        let byte = (slot.seq % 251) as u8 + 1;
        let payload = vec![byte; slot.payload_bytes as usize];
        let header = RecordHeader::write(slot.seq, 0, slot.seq * WRITE_BYTES, payload.len());
        log.write_record(&slot, &header, &payload).unwrap();
        durability.complete(slot.seq);
        if let Some((closed, _)) = slot.closed {
            return (log, durability, closed, written);
        }
        written.push(Written {
            payload_at: slot.payload_position() as usize,
            payload_len: payload.len(),
            byte,
        });
    }
}

/// Replays the race: writeback's sync of the closed segment fails, then a
/// FLUSH's group commit runs before the image is failed. Returns whether the
/// FLUSH was acknowledged, and whether the closed segment's records are
/// durable after a power cut.
fn race(mem: &MemStorage, writeback_fails: bool) -> (bool, bool) {
    let (log, durability, closed, written) = log_with_a_closed_segment(mem);
    assert!(written.len() > 4, "the first segment holds several records");
    if writeback_fails {
        mem.inject(Fault {
            op: FaultOp::Sync,
            path_contains: Some(closed.file.path().to_string_lossy().into_owned()),
            skip: 0,
            errno: libc::EIO,
            sticky: false,
        });
        // The writeback thread: its sync gets the EIO; it has not failed
        // the image yet.
        assert_eq!(log.sync_closed(&closed).unwrap_err().errno(), -libc::EIO);
    } else {
        log.sync_closed(&closed).unwrap();
    }
    // A FLUSH meanwhile: group commit over every completed record.
    let target = durability.max_completed();
    let flushed = durability.make_durable(target, &|upto| log.group_sync(upto)).is_ok();
    let path = closed.file.path().to_path_buf();
    drop((log, closed));
    mem.crash(CrashMode::LoseUnsynced);
    let bytes = mem.durable_bytes(&path).unwrap_or_default();
    let durable = written.iter().all(|w| {
        bytes.get(w.payload_at..w.payload_at + w.payload_len).is_some_and(|p| p.iter().all(|&b| b == w.byte))
    });
    (flushed, durable)
}

#[test]
fn a_flush_after_a_failed_writeback_sync_fails() {
    let mem = MemStorage::new();
    let (flushed, durable) = race(&mem, true);
    assert!(!durable, "the failed writeback dropped the closed segment's records");
    assert!(!flushed, "a FLUSH was acknowledged over records the kernel had dropped");
}

/// The same race on handles without the guard: the FLUSH "succeeds" and its
/// records are gone after the power cut. This is what the guard prevents;
/// if it ever stops happening, the model no longer shows the bug.
#[test]
fn without_the_guard_the_flush_is_acknowledged_and_the_writes_are_lost() {
    let mem = MemStorage::new();
    mem.without_sync_guard();
    let (flushed, durable) = race(&mem, true);
    assert!(flushed && !durable, "flushed {flushed}, durable {durable}");
}

/// The control: with no fault the same steps flush, and every record of
/// the closed segment survives the power cut.
#[test]
fn without_a_fault_the_closed_segment_is_durable() {
    let (flushed, durable) = race(&MemStorage::new(), false);
    assert!(flushed && durable, "flushed {flushed}, durable {durable}");
}
