//! The index journal: the durable form of the hash -> location index.
//!
//! The journal is the only record of which chunk lives where; pack files
//! hold raw bytes only. On open the journal is replayed into memory (no
//! pack is scanned), and when it has grown to more than twice what the live
//! entries need it is checkpointed: the live entries are written to a new
//! file which atomically replaces the old one (write, sync, rename,
//! directory sync).
//!
//! ```text
//! index
//! +---------------------------+ 0
//! | file header (512 bytes)   |
//! +---------------------------+ 512
//! | batch, padded to 512      |   one batch per ChunkStore::sync
//! | batch, padded to 512      |
//! | ...                       |
//!
//! file header:  0 magic "CASCIDX\0" | 8 version u32 | 12 generation u32 | 16 store_id u64 | 24 crc32c | zero to 512
//!
//! batch:
//!  0            4         8              16                     16 + 45 n
//!  | magic "CIB1"| count u32| batch_seq u64 | n records (45 bytes) | crc32c of all before | zero pad to 512
//!
//! record:
//!  0      1              33         37         41              45
//!  | op u8 | hash [u8;32] | pack u32 | slot u32 | chunk crc32c  |     op 1 = put, 2 = remove (zero fields)
//!                                                                      op 3 = next pack (version 2: only pack)
//!                                                                      op 4 = free slot (version 3: pack, slot)
//! ```
//!
//! Version 2 adds the next-pack record: pack ids below it are never given
//! out again, whether or not their files still exist. Manifest leaves name
//! chunks by pack and slot, so a reused id could send a stale location to
//! another chunk's bytes. Every pack creation queues one (in the sync that
//! makes the pack's first chunks durable), and every checkpoint starts with
//! one. A version 1 journal is replayed as it is and rewritten as version 2
//! when the chunk store opens.
//!
//! Version 3 is the write-ahead log of the on-disk dedup index (dedup/):
//! it holds the puts since the last flush, the slots GC freed (op 4; no
//! removes), and the next-pack records; its header carries the generation
//! of the index root it belongs to (versions 1 and 2: 0, reserved). A
//! journal of an older version is the whole index: the chunk store's open
//! replays it once and writes it out as the first run.
//!
//! Crash rules. A batch is written and synced in one `sync`, only after the
//! pack bytes its puts point at are synced, so a durable put never points
//! at lost data. Batches start on 512-byte boundaries and only the last one
//! can be torn; on replay an invalid batch with no valid batch after it is
//! a torn tail and is cut off, while an invalid batch followed by a valid
//! one is corruption and refuses the open. Batch sequence numbers run 1, 2,
//! 3... in each file, so stale bytes are never replayed.

use super::ChunkHash;
use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::units::SECTOR_BYTES;
use std::path::Path;
use std::sync::Arc;

pub(crate) const INDEX_FILE: &str = "index";
pub(crate) const INDEX_TMP_FILE: &str = "index.tmp";
pub(crate) const INDEX_VERSION: u32 = 3;
const INDEX_MAGIC: [u8; 8] = *b"CASCIDX\0";
const FILE_HEADER_BYTES: u64 = SECTOR_BYTES;
pub(crate) const FILE_HEADER_USED: usize = 8 + 4 + 4 + 8 + 4;

const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"CIB1");
pub(crate) const BATCH_HEADER_BYTES: usize = 4 + 4 + 8;
pub(crate) const RECORD_BYTES: usize = 1 + ChunkHash::BYTES + 4 + 4 + 4;
/// Records per batch when a checkpoint writes the whole index.
const CHECKPOINT_BATCH_RECORDS: usize = 65536;
/// Window used to look for valid batches after an invalid one.
const SCAN_WINDOW_BYTES: usize = 1 << 20;

const OP_PUT: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_NEXT_PACK: u8 = 3;
const OP_FREE: u8 = 4;

/// One change to the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JournalOp {
    /// `hash` now lives in `slot` of `pack`; its bytes have crc32c `crc`.
    Put { hash: ChunkHash, pack: u32, slot: u32, crc: u32 },
    /// `hash` is no longer stored (versions 1 and 2 only).
    Remove { hash: ChunkHash },
    /// Slot `slot` of `pack` no longer holds a live chunk (version 3).
    Free { pack: u32, slot: u32 },
    /// No pack id below `id` is given out again.
    NextPack { id: u32 },
}

/// The open journal file.
pub(crate) struct Journal {
    file: Arc<dyn StorageFile>,
    len_bytes: u64,
    next_batch_seq: u64,
    pub store_id: u64,
    /// The file's format version (1: no next-pack records; 2: the whole
    /// index, no dedup root).
    pub version: u32,
    /// The index root generation this journal belongs to (version 3).
    pub generation: u32,
    /// Time `open` spent reading and checking batches (the rest of the
    /// replay is its callback's).
    pub read_time: std::time::Duration,
}

impl Journal {
    /// Batches in the journal (replayed at open, or appended since).
    pub fn batches(&self) -> u64 {
        self.next_batch_seq - 1
    }
}

fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> Error {
    Error::Corruption { path: path.to_path_buf(), offset, detail: detail.into() }
}

fn padded(len: usize) -> usize {
    len.next_multiple_of(SECTOR_BYTES as usize)
}

fn encode_file_header(store_id: u64, generation: u32) -> Vec<u8> {
    let mut e = Encoder::with_capacity(FILE_HEADER_BYTES as usize);
    e.bytes(&INDEX_MAGIC).u32(INDEX_VERSION).u32(generation).u64(store_id).seal();
    e.buf.resize(FILE_HEADER_BYTES as usize, 0);
    e.buf
}

/// Appends one batch, padded to a sector boundary, to `out`.
fn encode_batch(out: &mut Vec<u8>, seq: u64, ops: &[JournalOp]) {
    let start = out.len();
    out.extend_from_slice(&BATCH_MAGIC.to_le_bytes());
    let count = u32::try_from(ops.len()).expect("a journal batch holds fewer than 2^32 records");
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    for op in ops {
        let (code, hash, pack, slot, crc) = match *op {
            JournalOp::Put { hash, pack, slot, crc } => (OP_PUT, hash, pack, slot, crc),
            JournalOp::Remove { hash } => (OP_REMOVE, hash, 0, 0, 0),
            JournalOp::NextPack { id } => (OP_NEXT_PACK, ChunkHash::from_bytes([0; 32]), id, 0, 0),
            JournalOp::Free { pack, slot } => (OP_FREE, ChunkHash::from_bytes([0; 32]), pack, slot, 0),
        };
        out.push(code);
        out.extend_from_slice(hash.as_bytes());
        out.extend_from_slice(&pack.to_le_bytes());
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
    }
    let crc = format::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    let end = start + padded(out.len() - start);
    out.resize(end, 0);
}

/// What the bytes at a batch position turned out to be.
enum Probe {
    /// A valid batch: its records and its padded length.
    /// The batch's records are in the scratch's `ops`; the next batch
    /// starts this many bytes on.
    Valid(u64),
    Invalid(String),
}

/// Decodes the records of a batch body (everything between header and crc).
fn decode_records(body: &[u8], count: usize, ops: &mut Vec<JournalOp>) -> std::result::Result<(), String> {
    ops.clear();
    ops.reserve(count);
    let mut d = Decoder::new(body);
    for i in 0..count {
        let (Some(code), Some(hash), Some(pack), Some(slot), Some(crc)) =
            (d.u8(), d.array().map(ChunkHash::from_bytes), d.u32(), d.u32(), d.u32())
        else {
            return Err(format!("record {i} is truncated"));
        };
        ops.push(match code {
            OP_PUT => JournalOp::Put { hash, pack, slot, crc },
            OP_REMOVE => JournalOp::Remove { hash },
            OP_NEXT_PACK if hash.as_bytes() == &[0; 32] && slot == 0 && crc == 0 => {
                JournalOp::NextPack { id: pack }
            }
            OP_NEXT_PACK => return Err(format!("next-pack record {i} has a hash, slot or crc")),
            OP_FREE if hash.as_bytes() == &[0; 32] && crc == 0 => JournalOp::Free { pack, slot },
            OP_FREE => return Err(format!("free record {i} has a hash or crc")),
            other => return Err(format!("record {i} has unknown op {other}")),
        });
    }
    Ok(())
}

/// Buffers a replay reuses from batch to batch, so it faults in one
/// batch's worth of memory, not the whole journal's.
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
    ops: Vec<JournalOp>,
}

/// Reads and checks the batch at `offset` of a file of `len` bytes,
/// decoding its records into `scratch.ops`.
fn probe(
    file: &dyn StorageFile,
    scratch: &mut Scratch,
    offset: u64,
    len: u64,
    want_seq: Option<u64>,
) -> Result<Probe> {
    let avail = len - offset;
    if avail < BATCH_HEADER_BYTES as u64 + 4 {
        return Ok(Probe::Invalid(format!("{avail} bytes are too few for a batch")));
    }
    let mut head = [0u8; BATCH_HEADER_BYTES];
    file.read_exact_at(&mut head, offset)?;
    let mut d = Decoder::new(&head);
    let (magic, count, seq) = (d.u32(), d.u32(), d.u64());
    let (Some(magic), Some(count), Some(seq)) = (magic, count, seq) else {
        return Ok(Probe::Invalid("short batch header".into()));
    };
    if magic != BATCH_MAGIC {
        return Ok(Probe::Invalid(format!("bad batch magic {magic:#010x}")));
    }
    let body_len = (count as u64) * RECORD_BYTES as u64;
    let total = BATCH_HEADER_BYTES as u64 + body_len + 4;
    if total > avail {
        return Ok(Probe::Invalid(format!("batch of {count} records runs past the end of the file")));
    }
    let buf = &mut scratch.bytes;
    buf.resize(total as usize, 0);
    file.read_exact_at(buf, offset)?;
    let (covered, tail) = buf.split_at(buf.len() - 4);
    let expected = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    if format::crc32c(covered) != expected {
        return Ok(Probe::Invalid("batch checksum mismatch".into()));
    }
    if let Some(want) = want_seq {
        if seq != want {
            return Ok(Probe::Invalid(format!("batch sequence {seq}, expected {want}")));
        }
    }
    match decode_records(&covered[BATCH_HEADER_BYTES..], count as usize, &mut scratch.ops) {
        Ok(()) => Ok(Probe::Valid((padded(total as usize) as u64).min(avail))),
        Err(e) => Ok(Probe::Invalid(e)),
    }
}

/// True when a checksum-valid batch starts at some sector after `from`.
fn valid_batch_after(file: &dyn StorageFile, from: u64, len: u64) -> Result<Option<u64>> {
    let mut window = vec![0u8; SCAN_WINDOW_BYTES];
    let mut base = from;
    while base < len {
        let n = ((len - base) as usize).min(SCAN_WINDOW_BYTES);
        file.read_exact_at(&mut window[..n], base)?;
        for sector in (0..n).step_by(SECTOR_BYTES as usize) {
            if window.get(sector..sector + 4) == Some(&BATCH_MAGIC.to_le_bytes()[..]) {
                let at = base + sector as u64;
                if let Probe::Valid(..) = probe(file, &mut Scratch::default(), at, len, None)? {
                    return Ok(Some(at));
                }
            }
        }
        base += n as u64;
    }
    Ok(None)
}

impl Journal {
    /// Creates a new, empty journal in `dir` (atomically: tmp, sync, rename).
    pub fn create(storage: &dyn Storage, dir: &Path, store_id: u64, generation: u32) -> Result<Journal> {
        let tmp = dir.join(INDEX_TMP_FILE);
        if storage.exists(&tmp) {
            storage.remove_file(&tmp)?;
        }
        let f = storage.open(&tmp, OpenMode::CreateNew)?;
        f.write_all_at(&encode_file_header(store_id, generation), 0)?;
        f.sync_data()?;
        let path = dir.join(INDEX_FILE);
        storage.rename(&tmp, &path)?;
        storage.sync_dir(dir)?;
        let file = storage.open(&path, OpenMode::Existing)?;
        Ok(Journal {
            file,
            len_bytes: FILE_HEADER_BYTES,
            next_batch_seq: 1,
            store_id,
            version: INDEX_VERSION,
            generation,
            read_time: Default::default(),
        })
    }

    /// Opens the journal in `dir`, replaying every durable batch through
    /// `apply`, and cuts off a torn tail.
    pub fn open(
        storage: &dyn Storage,
        dir: &Path,
        mut apply: impl FnMut(JournalOp) -> Result<()>,
    ) -> Result<Journal> {
        let tmp = dir.join(INDEX_TMP_FILE);
        if storage.exists(&tmp) {
            // A checkpoint that never reached its rename.
            storage.remove_file(&tmp)?;
        }
        let path = dir.join(INDEX_FILE);
        let file = storage.open(&path, OpenMode::Existing)?;
        let len = file.len()?;
        if len < FILE_HEADER_BYTES {
            return Err(corrupt(&path, 0, format!("index file of {len} bytes has no header")));
        }
        let mut head = vec![0u8; FILE_HEADER_USED];
        file.read_exact_at(&mut head, 0)?;
        if head[..8] != INDEX_MAGIC {
            return Err(corrupt(&path, 0, "not a chunk index (bad magic)"));
        }
        let body = format::unseal(&head, &path, 0)?;
        let mut d = Decoder::new(&body[8..]);
        let version = d.u32().unwrap_or(0);
        format::check_version("chunk index", version, INDEX_VERSION)?;
        let generation = d.u32().unwrap_or(0);
        let store_id = d.u64().unwrap_or(0);

        let mut offset = FILE_HEADER_BYTES;
        let mut seq = 1;
        let mut read_time = std::time::Duration::ZERO;
        let mut scratch = Scratch::default();
        while offset < len {
            let reading = std::time::Instant::now();
            let probed = probe(file.as_ref(), &mut scratch, offset, len, Some(seq))?;
            read_time += reading.elapsed();
            match probed {
                Probe::Valid(step) => {
                    for &op in &scratch.ops {
                        apply(op)?;
                    }
                    offset += step;
                    seq += 1;
                }
                Probe::Invalid(why) => {
                    if let Some(at) = valid_batch_after(file.as_ref(), offset + SECTOR_BYTES, len)? {
                        return Err(corrupt(
                            &path,
                            offset,
                            format!("invalid batch ({why}) followed by a valid batch at {at}"),
                        ));
                    }
                    tracing::warn!(path = %path.display(), offset, reason = %why, "cutting torn index tail");
                    file.set_len(offset)?;
                    file.sync_data()?;
                    break;
                }
            }
        }
        let len_bytes = offset.min(len);
        Ok(Journal { file, len_bytes, next_batch_seq: seq, store_id, version, generation, read_time })
    }

    /// Appends `ops` as one batch and syncs it. The caller has already
    /// synced every pack byte the puts point at.
    pub fn append(&mut self, ops: &[JournalOp]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(padded(BATCH_HEADER_BYTES + ops.len() * RECORD_BYTES + 4));
        encode_batch(&mut buf, self.next_batch_seq, ops);
        self.file.write_all_at(&buf, self.len_bytes)?;
        self.file.sync_data()?;
        self.len_bytes += buf.len() as u64;
        self.next_batch_seq += 1;
        Ok(())
    }

    /// Replaces the journal by one holding exactly `ops` (a checkpoint):
    /// writes and syncs `index.tmp`, renames it over `index`, syncs the
    /// directory. A failure says whether the old journal is still the one
    /// in place (then appends may continue on it).
    pub fn rewrite(
        &mut self,
        storage: &dyn Storage,
        dir: &Path,
        ops: &[JournalOp],
        generation: u32,
    ) -> Result<()> {
        let tmp = dir.join(INDEX_TMP_FILE);
        if storage.exists(&tmp) {
            storage.remove_file(&tmp)?;
        }
        let f = storage.open(&tmp, OpenMode::CreateNew)?;
        let mut offset = 0u64;
        let header = encode_file_header(self.store_id, generation);
        f.write_all_at(&header, offset)?;
        offset += header.len() as u64;
        let mut seq = 1;
        let mut buf = Vec::new();
        for part in ops.chunks(CHECKPOINT_BATCH_RECORDS) {
            buf.clear();
            encode_batch(&mut buf, seq, part);
            f.write_all_at(&buf, offset)?;
            offset += buf.len() as u64;
            seq += 1;
        }
        f.sync_data()?;
        let path = dir.join(INDEX_FILE);
        storage.rename(&tmp, &path)?;
        self.file = storage.open(&path, OpenMode::Existing)?;
        self.len_bytes = offset;
        self.next_batch_seq = seq;
        self.version = INDEX_VERSION;
        self.generation = generation;
        storage.sync_dir(dir)
    }

    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// The version and generation in the header of the journal in `dir`
    /// (what an open checks before replaying it).
    pub fn header(storage: &dyn Storage, dir: &Path) -> Result<(u32, u32)> {
        let path = dir.join(INDEX_FILE);
        let file = storage.open(&path, OpenMode::Existing)?;
        let mut head = vec![0u8; FILE_HEADER_USED];
        if file.read_at(&mut head, 0)? < FILE_HEADER_USED || head[..8] != INDEX_MAGIC {
            return Err(corrupt(&path, 0, "not a chunk index journal"));
        }
        let body = format::unseal(&head, &path, 0)?;
        let mut d = Decoder::new(&body[8..]);
        let version = d.u32().unwrap_or(0);
        format::check_version("chunk index", version, INDEX_VERSION)?;
        Ok((version, d.u32().unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashMode, MemStorage};
    use std::path::PathBuf;

    fn put(i: u8) -> JournalOp {
        JournalOp::Put {
            hash: ChunkHash::from_bytes([i; 32]),
            pack: u32::from(i),
            slot: u32::from(i) * 2,
            crc: 7,
        }
    }

    fn setup() -> (MemStorage, PathBuf) {
        let s = MemStorage::new();
        let dir = PathBuf::from("/c");
        s.create_dir_all(&dir).unwrap();
        s.sync_dir(Path::new("/")).unwrap();
        (s, dir)
    }

    fn replay(s: &MemStorage, dir: &Path) -> Result<Vec<JournalOp>> {
        let mut ops = Vec::new();
        Journal::open(s, dir, |op| {
            ops.push(op);
            Ok(())
        })?;
        Ok(ops)
    }

    #[test]
    fn batches_replay_in_order() {
        let (s, dir) = setup();
        let mut j = Journal::create(&s, &dir, 9, 0).unwrap();
        j.append(&[put(1), put(2)]).unwrap();
        j.append(&[JournalOp::Remove { hash: ChunkHash::from_bytes([1; 32]) }]).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert_eq!(
            replay(&s, &dir).unwrap(),
            vec![put(1), put(2), JournalOp::Remove { hash: ChunkHash::from_bytes([1; 32]) }]
        );
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        for seed in 0..40 {
            let (s, dir) = setup();
            let mut j = Journal::create(&s, &dir, 9, 0).unwrap();
            j.append(&[put(1)]).unwrap();
            let ops: Vec<_> = (2..60).map(put).collect();
            // Write the second batch without its sync, then crash.
            let mut buf = Vec::new();
            encode_batch(&mut buf, 2, &ops);
            j.file.write_all_at(&buf, j.len_bytes).unwrap();
            s.crash(CrashMode::Torn { seed });
            let got = replay(&s, &dir).unwrap();
            assert!(got == vec![put(1)] || got.len() == 59, "seed {seed}: {} ops", got.len());
            let mut j = Journal::open(&s, &dir, |_| Ok(())).unwrap();
            j.append(&[put(99)]).unwrap();
            s.crash(CrashMode::LoseUnsynced);
            assert_eq!(replay(&s, &dir).unwrap().last(), Some(&put(99)), "seed {seed}");
        }
    }

    #[test]
    fn damage_before_a_valid_batch_is_corruption() {
        let (s, dir) = setup();
        let mut j = Journal::create(&s, &dir, 9, 0).unwrap();
        j.append(&[put(1)]).unwrap();
        j.append(&[put(2)]).unwrap();
        s.corrupt(&dir.join(INDEX_FILE), FILE_HEADER_BYTES + 20, 0xff).unwrap();
        assert!(matches!(replay(&s, &dir), Err(Error::Corruption { .. })));
    }

    #[test]
    fn checkpoint_replaces_the_journal() {
        let (s, dir) = setup();
        let mut j = Journal::create(&s, &dir, 9, 0).unwrap();
        j.append(&[put(1), put(2), put(3)]).unwrap();
        j.rewrite(&s, &dir, &[put(3)], 0).unwrap();
        j.append(&[put(4)]).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert_eq!(replay(&s, &dir).unwrap(), vec![put(3), put(4)]);
    }
}
