//! One sorted run of the on-disk dedup index: index entries (chunk hash ->
//! pack, slot, crc32c) in hash order, written once and never changed.
//!
//! ```text
//! index-run-<16 hex>
//! +-------------------------------+ 0
//! | header (4096 bytes)           |
//! +-------------------------------+ 4096
//! | record page 0 (4096 bytes)    |   92 records of 44 bytes each, the
//! | record page 1                 |   last page possibly fewer
//! | ...                           |
//! +-------------------------------+ 4096 (1 + pages)
//! | fences: u64 per page | crc32c |   first 8 hash bytes of each page's first
//! +-------------------------------+   record, big-endian (so they sort as bytes)
//! | keys: 5 bytes per entry | crc |   hash bytes 0..5 of every entry, in order:
//! +-------------------------------+   what the in-memory summary is built from
//!
//! header:  0 magic "CASIRUN\0" | 8 version u32 | 12 level u32 | 16 store_id u64
//!          | 24 run_id u64 | 32 entries u64 | 40 crc32c of bytes 0..40 | zero to 4096
//! page:    0 count u32 | 4 count x record | zero | 4092 crc32c of bytes 0..4092
//! record:  0 hash [u8;32] | 32 pack u32 | 36 slot u32 | 40 chunk crc32c u32
//! ```
//!
//! Hashes are strictly ascending across the whole run. A run is written
//! to a fresh file name and synced before the index root names it, so a
//! crash leaves either a whole run the root names or a file it does not
//! (which the next open deletes).
//!
//! In memory a run keeps its open file and its fences (8 bytes per 92
//! entries); a lookup binary-searches the fences and reads one page.

use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::io::Wait;
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::units::{ChunkHash, ChunkLoc, ChunkTag};
use std::path::Path;
use std::sync::Arc;

pub(crate) const RUN_VERSION: u32 = 1;
const RUN_MAGIC: [u8; 8] = *b"CASIRUN\0";
pub(crate) const PAGE_BYTES: usize = 4096;
const HEADER_BYTES: usize = PAGE_BYTES;
const HEADER_USED: usize = 40;
pub(crate) const RECORD_BYTES: usize = ChunkHash::BYTES + 12;
/// Records per page: what fits before the page's crc after its count.
pub(crate) const PAGE_RECORDS: usize = (PAGE_BYTES - 8) / RECORD_BYTES;
/// Summary key bytes per entry (hash bytes 0..5).
pub(crate) const KEY_BYTES: usize = 5;
/// Pages written per pwrite, and read per pread when a run is streamed.
const IO_PAGES: usize = 64;
/// Largest run accepted: 2^32 entries.
const MAX_ENTRIES: u64 = 1 << 32;

/// One index entry: a chunk's full hash and where it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub hash: ChunkHash,
    pub at: ChunkLoc,
}

/// The file name of run `id`.
pub(crate) fn run_file_name(id: u64) -> String {
    super::file_name("index-run-", id)
}

/// The run id a file name names.
pub(crate) fn parse_run_file_name(name: &str) -> Option<u64> {
    super::parse_file_name(name, "index-run-")
}

/// The first 8 bytes of a hash (or tag) as a big-endian number: sorts as
/// the bytes do.
pub(crate) fn prefix_of(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().expect("at least 8 bytes"))
}

/// The order of runs: by the hash's bytes (decided by the 8-byte prefix
/// almost always, without a byte-wise compare).
pub(crate) fn hash_order(a: &ChunkHash, b: &ChunkHash) -> std::cmp::Ordering {
    let (pa, pb) = (prefix_of(a.as_bytes()), prefix_of(b.as_bytes()));
    pa.cmp(&pb).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

fn pages_for(entries: u64) -> u64 {
    entries.div_ceil(PAGE_RECORDS as u64)
}

fn fences_offset(pages: u64) -> u64 {
    HEADER_BYTES as u64 + pages * PAGE_BYTES as u64
}

fn keys_offset(pages: u64) -> u64 {
    fences_offset(pages) + pages * 8 + 4
}

/// Bytes of a run file of `entries` entries.
pub(crate) fn run_file_bytes(entries: u64) -> u64 {
    keys_offset(pages_for(entries)) + entries * KEY_BYTES as u64 + 4
}

fn encode_header(level: u32, store_id: u64, run_id: u64, entries: u64) -> Vec<u8> {
    let mut e = Encoder::with_capacity(HEADER_BYTES);
    e.bytes(&RUN_MAGIC).u32(RUN_VERSION).u32(level).u64(store_id).u64(run_id).u64(entries).seal();
    e.buf.resize(HEADER_BYTES, 0);
    e.buf
}

fn encode_record(out: &mut Vec<u8>, e: &Entry) {
    out.extend_from_slice(e.hash.as_bytes());
    out.extend_from_slice(&e.at.pack.to_le_bytes());
    out.extend_from_slice(&e.at.slot.to_le_bytes());
    out.extend_from_slice(&e.at.crc.to_le_bytes());
}

/// The file a writer spills run `id`'s keys to (deleted when the run is
/// finished; a crash leaves it for the next open to delete).
pub(crate) fn keys_spill_name(id: u64) -> String {
    format!("{}.keys", run_file_name(id))
}

/// True for a spill file name (any run).
pub(crate) fn is_keys_spill_name(name: &str) -> bool {
    name.strip_suffix(".keys").and_then(parse_run_file_name).is_some()
}

/// Keys buffered before a spill write, and read per pread when streamed.
const KEY_BUFFER_BYTES: usize = 1 << 20;

/// Writes a run: entries pushed in strictly ascending hash order, then
/// [`RunWriter::finish`]. Memory: one batch of pages, 1 MiB of keys (the
/// rest spilled to `<run>.keys`), and the fences (8 bytes per 92 entries).
pub(crate) struct RunWriter<'s> {
    storage: &'s dyn Storage,
    dir: std::path::PathBuf,
    file: Arc<dyn StorageFile>,
    id: u64,
    level: u32,
    store_id: u64,
    entries: u64,
    /// Pages not yet written, the current one last (unsealed).
    pages: Vec<u8>,
    in_page: usize,
    written_pages: u64,
    fences: Vec<u64>,
    keys: Vec<u8>,
    /// Keys past the buffer, and their bytes.
    spill: Option<Arc<dyn StorageFile>>,
    spilled: u64,
    last: Option<ChunkHash>,
}

impl<'s> RunWriter<'s> {
    /// Creates `dir/index-run-<id>` (it must not exist).
    pub fn create(
        storage: &'s dyn Storage,
        dir: &Path,
        id: u64,
        level: u32,
        store_id: u64,
    ) -> Result<RunWriter<'s>> {
        let file = storage.open(&dir.join(run_file_name(id)), OpenMode::CreateNew)?;
        Ok(RunWriter {
            storage,
            dir: dir.to_path_buf(),
            file,
            id,
            level,
            store_id,
            entries: 0,
            pages: Vec::with_capacity(IO_PAGES * PAGE_BYTES),
            in_page: 0,
            written_pages: 0,
            fences: Vec::new(),
            keys: Vec::with_capacity(KEY_BUFFER_BYTES),
            spill: None,
            spilled: 0,
            last: None,
        })
    }

    /// Appends `e`, whose hash must sort after every hash pushed before.
    pub fn push(&mut self, e: &Entry) -> Result<()> {
        if let Some(last) = &self.last {
            assert!(hash_order(last, &e.hash).is_lt(), "run entries out of order");
        }
        if self.entries >= MAX_ENTRIES {
            return Err(Error::InvalidArgument(format!("an index run holds at most {MAX_ENTRIES} entries")));
        }
        self.last = Some(e.hash);
        if self.in_page == 0 {
            self.fences.push(prefix_of(e.hash.as_bytes()));
            self.pages.extend_from_slice(&[0; 4]);
        }
        encode_record(&mut self.pages, e);
        self.keys.extend_from_slice(&e.hash.as_bytes()[..KEY_BYTES]);
        if self.keys.len() >= KEY_BUFFER_BYTES {
            self.spill_keys()?;
        }
        self.in_page += 1;
        self.entries += 1;
        if self.in_page == PAGE_RECORDS {
            self.seal_page();
            if self.pages.len() >= IO_PAGES * PAGE_BYTES {
                self.write_pages()?;
            }
        }
        Ok(())
    }

    fn spill_keys(&mut self) -> Result<()> {
        if self.spill.is_none() {
            let path = self.dir.join(keys_spill_name(self.id));
            self.spill = Some(self.storage.open(&path, OpenMode::Create)?);
        }
        self.spill.as_ref().expect("opened").write_all_at(&self.keys, self.spilled)?;
        self.spilled += self.keys.len() as u64;
        self.keys.clear();
        Ok(())
    }

    fn seal_page(&mut self) {
        let start = self.pages.len() - 4 - self.in_page * RECORD_BYTES;
        self.pages[start..start + 4].copy_from_slice(&(self.in_page as u32).to_le_bytes());
        self.pages.resize(start + PAGE_BYTES - 4, 0);
        let crc = format::crc32c(&self.pages[start..]);
        self.pages.extend_from_slice(&crc.to_le_bytes());
        self.in_page = 0;
    }

    fn write_pages(&mut self) -> Result<()> {
        let offset = HEADER_BYTES as u64 + self.written_pages * PAGE_BYTES as u64;
        self.file.write_all_at(&self.pages, offset)?;
        self.written_pages += (self.pages.len() / PAGE_BYTES) as u64;
        self.pages.clear();
        Ok(())
    }

    /// Writes the last page, the fences, the keys (copied from the spill
    /// file) and the header, syncs the file and deletes the spill file.
    pub fn finish(mut self) -> Result<Run> {
        if self.in_page > 0 {
            self.seal_page();
        }
        self.write_pages()?;
        let pages = self.written_pages;
        let mut tail = Encoder::with_capacity(self.fences.len() * 8 + 4);
        for f in &self.fences {
            tail.bytes(&f.to_le_bytes());
        }
        tail.seal();
        self.file.write_all_at(&tail.buf, fences_offset(pages))?;
        // The keys: spilled ones first, then the buffer, then their crc.
        let mut at = keys_offset(pages);
        let mut crc = 0u32;
        if let Some(spill) = self.spill.take() {
            let mut buf = vec![0u8; KEY_BUFFER_BYTES];
            let mut done = 0;
            while done < self.spilled {
                let n = (self.spilled - done).min(KEY_BUFFER_BYTES as u64) as usize;
                spill.read_exact_at(&mut buf[..n], done)?;
                crc = format::crc32c_append(crc, &buf[..n]);
                self.file.write_all_at(&buf[..n], at)?;
                (done, at) = (done + n as u64, at + n as u64);
            }
            drop(spill);
            self.storage.remove_file(&self.dir.join(keys_spill_name(self.id)))?;
        }
        crc = format::crc32c_append(crc, &self.keys);
        self.keys.extend_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&self.keys, at)?;
        self.file.write_all_at(&encode_header(self.level, self.store_id, self.id, self.entries), 0)?;
        self.file.sync_data()?;
        Ok(Run {
            id: self.id,
            level: self.level,
            entries: self.entries,
            file: self.file,
            fences: self.fences.into_boxed_slice(),
        })
    }
}

/// An open run.
pub(crate) struct Run {
    pub id: u64,
    /// How many merges made it (flushes write level 0; merging runs of
    /// level L writes level L + 1).
    pub level: u32,
    pub entries: u64,
    file: Arc<dyn StorageFile>,
    fences: Box<[u64]>,
}

fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> Error {
    Error::Corruption { path: path.to_path_buf(), offset, detail: detail.into() }
}

impl Run {
    /// Opens run `id` in `dir`, checking its header, length and fences
    /// (the keys are checked as they are streamed, [`Run::keys`]).
    pub fn open(storage: &dyn Storage, dir: &Path, id: u64, store_id: u64) -> Result<Run> {
        let path = dir.join(run_file_name(id));
        let file = storage.open(&path, OpenMode::Existing)?;
        let mut head = vec![0u8; HEADER_USED + 4];
        file.read_exact_at(&mut head, 0)?;
        let (level, entries) = decode_header(&head, &path, id, store_id)?;
        let pages = pages_for(entries);
        let len = file.len()?;
        if len != run_file_bytes(entries) {
            return Err(corrupt(
                &path,
                0,
                format!("run of {entries} entries is {len} bytes, not {}", run_file_bytes(entries)),
            ));
        }
        let mut tail = vec![0u8; pages as usize * 8 + 4];
        file.read_exact_at(&mut tail, fences_offset(pages))?;
        let fences = decode_fences(&tail, &path, pages)?;
        Ok(Run { id, level, entries, file, fences })
    }

    /// The run's summary keys in order, read `KEY_BUFFER_BYTES` at a time,
    /// each page's first key checked against its fence and the section's
    /// crc32c at its end.
    pub fn keys(self: &Arc<Self>) -> KeyStream {
        KeyStream { run: self.clone(), buf: Vec::new(), at: 0, read: 0, crc: 0, index: 0 }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn pages(&self) -> u64 {
        self.fences.len() as u64
    }

    /// Heap bytes this run keeps in memory.
    pub fn memory_bytes(&self) -> u64 {
        (self.fences.len() * 8 + std::mem::size_of::<Run>()) as u64
    }

    /// The entry whose hash starts with `tag`, if this run has one: one
    /// page read (two when a page boundary falls inside equal 8-byte
    /// prefixes), as `wait` allows.
    pub fn find(&self, tag: &ChunkTag, wait: Wait) -> Result<Option<Entry>> {
        let key = prefix_of(tag.as_bytes());
        let first_ge = self.fences.partition_point(|&f| f < key);
        let first_gt = self.fences.partition_point(|&f| f <= key);
        if first_gt == 0 {
            return Ok(None);
        }
        let mut page = vec![0u8; PAGE_BYTES];
        let mut entries = Vec::with_capacity(PAGE_RECORDS);
        for p in first_ge.saturating_sub(1)..first_gt {
            self.read_pages(p as u64, &mut page, wait)?;
            entries.clear();
            decode_pages(&page, self.file.path(), self.page_offset(p as u64), &mut entries)?;
            let found =
                entries.binary_search_by(|e| e.hash.as_bytes()[..ChunkTag::BYTES].cmp(tag.as_bytes()));
            if let Ok(i) = found {
                return Ok(Some(entries[i]));
            }
        }
        Ok(None)
    }

    fn page_offset(&self, page: u64) -> u64 {
        HEADER_BYTES as u64 + page * PAGE_BYTES as u64
    }

    fn read_pages(&self, first: u64, buf: &mut [u8], wait: Wait) -> Result<()> {
        self.file.read_exact_at_in(buf, self.page_offset(first), wait)
    }

    /// Every entry in order, read `IO_PAGES` pages at a time (a merge's or
    /// a check's input).
    pub fn stream(self: &Arc<Self>) -> RunStream {
        RunStream { run: self.clone(), next_page: 0, buf: Vec::new(), at: 0, last: None }
    }
}

/// Decodes a run header: (level, entries).
fn decode_header(head: &[u8], path: &Path, id: u64, store_id: u64) -> Result<(u32, u64)> {
    let body = format::unseal(head, path, 0)?;
    let mut d = Decoder::new(body);
    let short = || corrupt(path, 0, "short run header");
    if d.array::<8>().ok_or_else(short)? != RUN_MAGIC {
        return Err(corrupt(path, 0, "not an index run (bad magic)"));
    }
    format::check_version("index run", d.u32().ok_or_else(short)?, RUN_VERSION)?;
    let level = d.u32().ok_or_else(short)?;
    let (file_store, file_id, entries) =
        (d.u64().ok_or_else(short)?, d.u64().ok_or_else(short)?, d.u64().ok_or_else(short)?);
    if file_store != store_id || file_id != id {
        return Err(corrupt(
            path,
            0,
            format!(
                "run header names store {file_store:#x} run {file_id}, expected store {store_id:#x} run {id}"
            ),
        ));
    }
    if entries == 0 || entries > MAX_ENTRIES || level > 64 {
        return Err(corrupt(path, 0, format!("run header says {entries} entries at level {level}")));
    }
    Ok((level, entries))
}

/// Decodes the fences section after the pages; checks that they ascend.
fn decode_fences(tail: &[u8], path: &Path, pages: u64) -> Result<Box<[u64]>> {
    let at = fences_offset(pages);
    let fences_bytes = format::unseal(tail, path, at)?;
    let fences: Box<[u64]> =
        fences_bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    for (p, w) in fences.windows(2).enumerate() {
        if w[0] > w[1] {
            return Err(corrupt(path, at, format!("fence of page {} is below page {p}'s", p + 1)));
        }
    }
    Ok(fences)
}

/// A run's summary keys, streamed (see [`Run::keys`]).
pub(crate) struct KeyStream {
    run: Arc<Run>,
    buf: Vec<u8>,
    at: usize,
    /// Key bytes read so far, and their crc32c.
    read: u64,
    crc: u32,
    /// Keys handed out.
    index: u64,
}

impl KeyStream {
    /// The next key (hash bytes 0..5), or None after the last one (whose
    /// read checked the section's crc32c).
    pub fn next_key(&mut self) -> Result<Option<[u8; KEY_BYTES]>> {
        let total = self.run.entries * KEY_BYTES as u64;
        let path = self.run.file.path();
        let base = keys_offset(self.run.pages());
        if self.at == self.buf.len() {
            if self.read == total {
                return Ok(None);
            }
            // Whole keys per read.
            let n = (total - self.read).min((KEY_BUFFER_BYTES / KEY_BYTES * KEY_BYTES) as u64) as usize;
            self.buf.resize(n, 0);
            self.run.file.read_exact_at(&mut self.buf, base + self.read)?;
            self.crc = format::crc32c_append(self.crc, &self.buf);
            self.read += n as u64;
            self.at = 0;
            if self.read == total {
                let mut stored = [0u8; 4];
                self.run.file.read_exact_at(&mut stored, base + total)?;
                let stored = u32::from_le_bytes(stored);
                if stored != self.crc {
                    return Err(Error::ChecksumMismatch {
                        path: path.to_path_buf(),
                        offset: base,
                        expected: stored,
                        actual: self.crc,
                    });
                }
            }
        }
        let key: [u8; KEY_BYTES] = self.buf[self.at..self.at + KEY_BYTES].try_into().expect("5 bytes");
        if self.index.is_multiple_of(PAGE_RECORDS as u64) {
            let p = (self.index / PAGE_RECORDS as u64) as usize;
            if (self.run.fences[p] >> 24).to_be_bytes()[3..] != key {
                return Err(corrupt(path, base, format!("fence of page {p} disagrees with its first key")));
            }
        }
        self.at += KEY_BYTES;
        self.index += 1;
        Ok(Some(key))
    }
}

/// Decodes whole pages from `buf` into `out`; `offset` is the first
/// page's place in the file (for messages).
fn decode_pages(buf: &[u8], path: &Path, offset: u64, out: &mut Vec<Entry>) -> Result<()> {
    for (i, page) in buf.chunks_exact(PAGE_BYTES).enumerate() {
        let at = offset + (i * PAGE_BYTES) as u64;
        let body = format::unseal(page, path, at)?;
        let count = u32::from_le_bytes(body[..4].try_into().expect("4 bytes")) as usize;
        if count == 0 || count > PAGE_RECORDS {
            return Err(corrupt(path, at, format!("index page holds {count} records")));
        }
        for r in body[4..4 + count * RECORD_BYTES].chunks_exact(RECORD_BYTES) {
            let word = |i: usize| u32::from_le_bytes(r[32 + 4 * i..36 + 4 * i].try_into().expect("4 bytes"));
            let hash = ChunkHash::from_bytes(r[..32].try_into().expect("32 bytes"));
            out.push(Entry { hash, at: ChunkLoc { pack: word(0), slot: word(1), crc: word(2) } });
        }
    }
    Ok(())
}

/// A run's entries in order (see [`Run::stream`]); checks each page and
/// that hashes ascend.
pub(crate) struct RunStream {
    run: Arc<Run>,
    next_page: u64,
    buf: Vec<Entry>,
    at: usize,
    last: Option<ChunkHash>,
}

impl RunStream {
    /// The next entry, or None at the end.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.at == self.buf.len() {
            let pages = self.run.pages();
            if self.next_page == pages {
                return Ok(None);
            }
            let n = (pages - self.next_page).min(IO_PAGES as u64);
            let mut bytes = vec![0u8; n as usize * PAGE_BYTES];
            self.run.read_pages(self.next_page, &mut bytes, Wait::Block)?;
            self.buf.clear();
            self.at = 0;
            let offset = self.run.page_offset(self.next_page);
            decode_pages(&bytes, self.run.path(), offset, &mut self.buf)?;
            let full = (n as usize - 1) * PAGE_RECORDS;
            let expected = if self.next_page + n == pages {
                (self.run.entries - self.next_page * PAGE_RECORDS as u64) as usize
            } else {
                n as usize * PAGE_RECORDS
            };
            if self.buf.len() != expected || self.buf.len() <= full {
                return Err(corrupt(self.run.path(), offset, "index pages hold the wrong number of records"));
            }
            self.next_page += n;
        }
        let e = self.buf[self.at];
        if self.last.is_some_and(|l| hash_order(&l, &e.hash).is_ge()) {
            return Err(corrupt(self.run.path(), 0, format!("index run out of order at hash {}", e.hash)));
        }
        self.last = Some(e.hash);
        self.at += 1;
        Ok(Some(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    pub(crate) fn hash(i: u64) -> ChunkHash {
        ChunkHash::of(&i.to_le_bytes())
    }

    fn entries(n: u64) -> Vec<Entry> {
        let mut v: Vec<Entry> = (0..n)
            .map(|i| Entry { hash: hash(i), at: ChunkLoc { pack: 1, slot: i as u32, crc: 7 } })
            .collect();
        v.sort_by(|a, b| a.hash.as_bytes().cmp(b.hash.as_bytes()));
        v
    }

    #[test]
    fn a_run_round_trips_and_finds_every_entry() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        for n in [1u64, 91, 92, 93, 1000] {
            let id = n;
            let mut w = RunWriter::create(&s, dir, id, 0, 9).unwrap();
            let es = entries(n);
            for e in &es {
                w.push(e).unwrap();
            }
            let run = w.finish().unwrap();
            let run2 = Arc::new(Run::open(&s, dir, id, 9).unwrap());
            assert_eq!(run2.entries, n);
            let mut ks = run2.keys();
            let mut keys = Vec::new();
            while let Some(k) = ks.next_key().unwrap() {
                keys.push(k);
            }
            let want: Vec<[u8; KEY_BYTES]> =
                es.iter().map(|e| e.hash.as_bytes()[..KEY_BYTES].try_into().unwrap()).collect();
            assert_eq!(keys, want);
            for e in &es {
                assert_eq!(run.find(&e.hash.tag(), Wait::Block).unwrap(), Some(*e));
            }
            assert_eq!(run.find(&hash(n + 1).tag(), Wait::Block).unwrap(), None);
            let mut st = run2.stream();
            let mut got = Vec::new();
            while let Some(e) = st.next_entry().unwrap() {
                got.push(e);
            }
            assert_eq!(got, es);
            assert!(Run::open(&s, dir, id, 8).is_err(), "another store's run");
        }
    }

    /// Past 1 MiB of keys a writer spills them and copies them back.
    #[test]
    fn keys_spill_and_come_back() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        let n = (KEY_BUFFER_BYTES / KEY_BYTES) as u64 * 2 + 77;
        let mut w = RunWriter::create(&s, dir, 3, 0, 9).unwrap();
        let es = entries(n);
        for e in &es {
            w.push(e).unwrap();
        }
        assert!(s.exists(&dir.join(keys_spill_name(3))));
        w.finish().unwrap();
        assert!(!s.exists(&dir.join(keys_spill_name(3))));
        let run = Arc::new(Run::open(&s, dir, 3, 9).unwrap());
        let mut ks = run.keys();
        for e in &es {
            assert_eq!(ks.next_key().unwrap().unwrap()[..], e.hash.as_bytes()[..KEY_BYTES]);
        }
        assert_eq!(ks.next_key().unwrap(), None);
        assert!(is_keys_spill_name(&keys_spill_name(3)) && !is_keys_spill_name(&run_file_name(3)));
    }

    #[test]
    fn damage_anywhere_is_caught_at_open_or_read() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        let mut w = RunWriter::create(&s, dir, 1, 0, 9).unwrap();
        let es = entries(200);
        for e in &es {
            w.push(e).unwrap();
        }
        w.finish().unwrap();
        assert!(!s.exists(&dir.join(keys_spill_name(1))));
        let path = dir.join(run_file_name(1));
        let f = s.open(&path, OpenMode::Existing).unwrap();
        let len = f.len().unwrap();
        let mut good = vec![0u8; len as usize];
        f.read_exact_at(&mut good, 0).unwrap();
        for at in (0..len as usize).step_by(97).chain([4096, 4096 + 3, len as usize - 1]) {
            if (HEADER_USED + 4..HEADER_BYTES).contains(&at) {
                continue; // header padding
            }
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            f.write_all_at(&bad, 0).unwrap();
            let caught = match Run::open(&s, dir, 1, 9) {
                Err(_) => true,
                Ok(run) => {
                    let run = Arc::new(run);
                    let (mut st, mut ks) = (run.stream(), run.keys());
                    let keys_bad = loop {
                        match ks.next_key() {
                            Err(_) => break true,
                            Ok(None) => break false,
                            Ok(Some(_)) => {}
                        }
                    };
                    keys_bad
                        || loop {
                            match st.next_entry() {
                                Err(_) => break true,
                                Ok(None) => break false,
                                Ok(Some(_)) => {}
                            }
                        }
                }
            };
            assert!(caught, "a flipped byte at {at} went unnoticed");
        }
        assert_eq!(parse_run_file_name(&run_file_name(0xabc)), Some(0xabc));
        assert_eq!(parse_run_file_name("index-run-xyz"), None);
    }
}
