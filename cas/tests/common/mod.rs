//! Helpers shared by the integration tests: stores on `MemStorage`, and
//! self-describing sector contents so that every 512-byte sector read back
//! says which write put it there.
#![allow(dead_code)]

use cas::chunk::ChunkHash;
use cas::storage::{MemStorage, Storage};
use cas::{Image, Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SECTOR: usize = 512;

/// Small segments so that tests roll and recover across many of them.
pub fn small_opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 64 << 20,
        background_compaction: false,
        ..StoreOptions::default()
    }
}

/// A small store on `objects` as its bucket (none: without a remote):
/// uploads and publication only when a test asks (no threads), packs
/// deleted locally once uploaded, no lease, superseded roots and page
/// ranges deleted at once.
pub fn remote_opts(objects: Option<Arc<dyn cas::objects::Objects>>) -> StoreOptions {
    use cas::bucket::RemoteOptions;
    use std::time::Duration;
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 16 << 20,
        background_compaction: false,
        compaction_batch_bytes: 1 << 20,
        pack_bytes: 1 << 20,
        chunk_cache_bytes: 0,
        remote: cas::store::StoreRemote(objects.map(|o| RemoteOptions {
            upload_threads: 0,
            claim_bound: Duration::from_millis(1),
            local_keep_bytes: 0,
            cache_bytes: 256 << 10,
            read_retry: Duration::from_millis(20),
            publish_interval: Duration::ZERO,
            lease: None,
            superseded_grace: Duration::ZERO,
            ..RemoteOptions::new(o)
        })),
        ..StoreOptions::default()
    }
}

pub fn store_dir() -> PathBuf {
    PathBuf::from("/store")
}

pub fn mem_store(opts: StoreOptions) -> (MemStorage, Arc<Store>) {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::create(storage, &store_dir(), opts).expect("create store");
    (mem, store)
}

pub fn reopen(mem: &MemStorage, opts: StoreOptions) -> cas::Result<Arc<Store>> {
    Store::open(Arc::new(mem.clone()), &store_dir(), opts)
}

pub fn wal_dir(image: &str) -> PathBuf {
    store_dir().join("images").join(image).join("wal")
}

pub fn segment_path(image: &str, index: u64) -> PathBuf {
    wal_dir(image).join(format!("{index:016x}.wal"))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes write `token` (> 0) puts into image sector `sector`.
pub fn fill_sector(out: &mut [u8], token: u64, sector: u64) {
    assert!(token > 0);
    out[..8].copy_from_slice(&token.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut x = mix(token ^ sector.rotate_left(32));
    for w in out[16..].chunks_mut(8) {
        x = mix(x);
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

/// The payload of write `token` over `sectors` sectors starting at `first`.
pub fn payload(token: u64, first: u64, sectors: u64) -> Vec<u8> {
    let mut v = vec![0u8; sectors as usize * SECTOR];
    for (i, s) in v.chunks_mut(SECTOR).enumerate() {
        fill_sector(s, token, first + i as u64);
    }
    v
}

/// Which write a sector read back at `sector` came from: Ok(0) for zeros,
/// Ok(token), or Err if the bytes are neither (torn, misplaced, garbage).
pub fn decode_sector(buf: &[u8], sector: u64) -> Result<u64, String> {
    if buf.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    let token = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let at = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    if token == 0 || at != sector {
        return Err(format!("sector {sector} holds garbage (token {token}, written for sector {at})"));
    }
    let mut want = [0u8; SECTOR];
    fill_sector(&mut want, token, sector);
    if want[..] != buf[..] {
        return Err(format!("sector {sector} holds a damaged copy of write {token}"));
    }
    Ok(token)
}

/// Reads the whole image and decodes every sector.
pub fn read_tokens(image: &Image) -> Result<Vec<u64>, String> {
    let size = image.size_bytes() as usize;
    let mut buf = vec![0u8; size];
    for (i, chunk) in buf.chunks_mut(1 << 20).enumerate() {
        image.read((i << 20) as u64, chunk).map_err(|e| format!("read failed: {e}"))?;
    }
    buf.chunks(SECTOR).enumerate().map(|(s, b)| decode_sector(b, s as u64)).collect()
}

/// Asserts two token vectors are equal, naming the first sector that differs
/// (without printing megabytes of tokens).
pub fn same_tokens(got: &[u64], want: &[u64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: sector {i} holds write {}, expected {} ({} sectors differ)",
            got[i],
            want[i],
            got.iter().zip(want).filter(|(g, w)| g != w).count()
        );
    }
}

pub fn exists(mem: &MemStorage, p: &Path) -> bool {
    mem.exists(p)
}

/// Called after each read with the file's path and the read's length.
pub type ReadHook = Arc<dyn Fn(&Path, usize) + Send + Sync>;

/// Whether a read of the file at this path that must not wait says it
/// would (as a file not in the page cache does).
pub type DeclineNowait = Arc<dyn Fn(&Path) -> bool + Send + Sync>;

/// Wraps a storage so that every file sync takes at least `delay`, the
/// way a real fdatasync does (group commit only shows with slow syncs),
/// and every read runs `read_hook` (which may sleep: a slow read); every
/// write runs `write_hook` first, with the same arguments (a stalled write).
/// A read that must not wait fails with `WouldBlock` where
/// `decline_nowait` says so.
pub struct SlowSync {
    pub inner: Arc<dyn Storage>,
    pub delay: std::time::Duration,
    pub read_hook: Option<ReadHook>,
    pub write_hook: Option<ReadHook>,
    pub decline_nowait: Option<DeclineNowait>,
}

struct SlowFile {
    inner: Arc<dyn cas::storage::StorageFile>,
    delay: std::time::Duration,
    read_hook: Option<ReadHook>,
    write_hook: Option<ReadHook>,
    decline_nowait: Option<DeclineNowait>,
}

impl cas::storage::StorageFile for SlowFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> cas::Result<usize> {
        let n = self.inner.read_at(buf, offset)?;
        if let Some(hook) = &self.read_hook {
            hook(self.path(), buf.len());
        }
        Ok(n)
    }
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> cas::Result<usize> {
        if self.decline_nowait.as_ref().is_some_and(|d| d(self.path())) {
            return Err(cas::Error::WouldBlock);
        }
        let n = self.inner.read_at_nowait(buf, offset)?;
        if let Some(hook) = &self.read_hook {
            hook(self.path(), buf.len());
        }
        Ok(n)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> cas::Result<()> {
        if let Some(hook) = &self.write_hook {
            hook(self.path(), buf.len());
        }
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> cas::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.sync_data()
    }
    fn len(&self) -> cas::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> cas::Result<()> {
        self.inner.set_len(len)
    }
}

impl Storage for SlowSync {
    fn open(
        &self,
        path: &Path,
        mode: cas::storage::OpenMode,
    ) -> cas::Result<Arc<dyn cas::storage::StorageFile>> {
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(SlowFile {
            inner,
            delay: self.delay,
            read_hook: self.read_hook.clone(),
            write_hook: self.write_hook.clone(),
            decline_nowait: self.decline_nowait.clone(),
        }))
    }
    fn remove_file(&self, path: &Path) -> cas::Result<()> {
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> cas::Result<()> {
        self.inner.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> cas::Result<()> {
        self.inner.hard_link(from, to)
    }
    fn list_dir(&self, dir: &Path) -> cas::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> cas::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn remove_dir_all(&self, dir: &Path) -> cas::Result<()> {
        self.inner.remove_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> cas::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn lock_exclusive(&self, path: &Path) -> cas::Result<cas::storage::StorageLock> {
        self.inner.lock_exclusive(path)
    }
}

/// A compacted-data view for tests: block -> chunk bytes, filled by hand.
#[derive(Default)]
pub struct MapManifest {
    pub blocks: std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>,
}

impl cas::image::ManifestView for MapManifest {
    fn lookup(&self, block: u64, _wait: cas::io::Wait) -> cas::Result<Option<cas::chunk::ChunkRef>> {
        let blocks = self.blocks.lock().unwrap();
        Ok(blocks.get(&block).map(|data| ChunkHash::of(data).into()))
    }
    fn read_chunk(
        &self,
        r: &cas::chunk::ChunkRef,
        out: &mut [u8],
        _cx: cas::io::IoCx<'_>,
    ) -> cas::Result<()> {
        let blocks = self.blocks.lock().unwrap();
        let data = blocks.values().find(|d| ChunkHash::of(d).tag() == r.tag).expect("chunk present");
        out.copy_from_slice(data);
        Ok(())
    }
}

/// Flips one bit of the byte at `offset` of `path` (damage for checks).
pub fn flip(mem: &MemStorage, path: &std::path::Path, offset: u64) {
    use cas::storage::{OpenMode, Storage};
    let f = mem.open(path, OpenMode::Existing).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], offset).unwrap();
}

/// The path of pack `id` in the test store.
pub fn pack(id: u32) -> PathBuf {
    store_dir().join(format!("chunks/pack-{id:08x}.pack"))
}
