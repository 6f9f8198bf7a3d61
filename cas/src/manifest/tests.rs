use super::edit::KEEP_LEAVES_CACHE_FRACTION;
use super::*;
use crate::storage::{CrashMode, MemStorage};

/// A located ref (odd `i`) or an unlocated one (even): leaves hold both.
fn h(i: u64) -> ChunkRef {
    let mut x = [0u8; ChunkHash::BYTES];
    x[..8].copy_from_slice(&i.to_le_bytes());
    x[19] = 0xaa;
    let tag = ChunkHash::from_bytes(x).tag();
    let at = (i % 2 == 1).then_some(ChunkLoc { pack: i as u32 | 1, slot: i as u32, crc: !(i as u32) });
    ChunkRef { tag, at }
}

fn open(s: &MemStorage) -> Manifest {
    Manifest::open(Arc::new(s.clone()), Path::new("/img/manifest"), ManifestOptions::default()).unwrap()
}

fn setup() -> MemStorage {
    let s = MemStorage::new();
    s.create_dir_all(Path::new("/img")).unwrap();
    s.sync_dir(Path::new("/")).unwrap();
    s
}

#[test]
fn empty_then_commit_then_reopen() {
    let s = setup();
    let m = open(&s);
    assert_eq!(m.lookup(0).unwrap(), None);
    assert_eq!(m.covered(), 0);
    let mut e = m.begin();
    e.set(0, Some(h(0)));
    e.set(5000, Some(h(5000)));
    e.set(7, Some(h(7)));
    e.set(7, None);
    let st = e.commit(42).unwrap();
    assert_eq!(st.generation, 1);
    assert_eq!(st.leaf_pages_touched, 2);
    assert_eq!(st.syncs, 2, "new file: file sync + directory sync");
    assert_eq!(m.lookup(0).unwrap(), Some(h(0)));
    assert_eq!(m.lookup(5000).unwrap(), Some(h(5000)));
    assert_eq!(m.lookup(7).unwrap(), None);
    assert_eq!(m.lookup(u64::MAX).unwrap(), None);
    s.crash(CrashMode::LoseUnsynced);
    let m = open(&s);
    assert_eq!(m.covered(), 42);
    assert_eq!(m.lookup(5000).unwrap(), Some(h(5000)));
    assert_eq!(m.stats().mapped_blocks, 2);
    let all: Vec<_> = m.iter().collect::<Result<_>>().unwrap();
    assert_eq!(all, vec![(0, h(0)), (5000, h(5000))]);
}

#[test]
fn sequential_commit_writes_each_dirty_page_once() {
    let s = setup();
    let m = open(&s);
    let mut e = m.begin();
    let hashes: Vec<Option<ChunkRef>> = (0..1000).map(|i| Some(h(i))).collect();
    e.set_range(0, &hashes).unwrap();
    // Superseded edits in the same batch are never written.
    for i in 0..1000 {
        e.set(i, Some(h(i + 1)));
    }
    let st = e.commit(1).unwrap();
    // 1000 blocks: leaves 0..=7, one interior root.
    assert_eq!((st.leaf_pages_touched, st.leaf_pages_written, st.pages_written), (8, 8, 9));
    assert_eq!(st.live_pages, 9);
    let mut out = vec![None; 1000];
    m.lookup_range(0, &mut out).unwrap();
    assert!(out.iter().enumerate().all(|(i, o)| *o == Some(h(i as u64 + 1))));
    // A second commit touching one leaf rewrites the leaf and the root only.
    let mut e = m.begin();
    e.set(130, None);
    let st = e.commit(2).unwrap();
    assert_eq!((st.pages_written, st.syncs, st.garbage_pages), (2, 2, 2));
    // Setting a value to what it already is writes nothing but the root.
    let mut e = m.begin();
    e.set(131, Some(h(132)));
    let st = e.commit(3).unwrap();
    assert_eq!((st.leaf_pages_touched, st.pages_written, st.syncs), (1, 0, 1));
}

#[test]
fn height_grows_and_empty_subtrees_vanish() {
    let s = setup();
    let m = open(&s);
    let mut e = m.begin();
    e.set(3, Some(h(3)));
    e.commit(1).unwrap();
    assert_eq!(m.stats().height, 1);
    for far in [126 * 338 + 1, u64::MAX - 1, u64::MAX] {
        let mut e = m.begin();
        e.set(far, Some(h(far)));
        e.commit(2).unwrap();
        assert_eq!(m.lookup(far).unwrap(), Some(h(far)));
        assert_eq!(m.lookup(3).unwrap(), Some(h(3)), "old root kept below the new levels");
    }
    assert_eq!(m.stats().height, 8);
    let mut e = m.begin();
    for b in [3, 126 * 338 + 1, u64::MAX - 1, u64::MAX] {
        e.set(b, None);
    }
    e.commit(3).unwrap();
    let st = m.stats();
    assert_eq!((st.height, st.live_pages, st.mapped_blocks), (0, 0, 0));
    assert_eq!(m.iter().count(), 0);
    let m = open(&s);
    assert_eq!(m.lookup(3).unwrap(), None);
}

#[test]
fn covered_never_goes_back() {
    let s = setup();
    let m = open(&s);
    m.begin().commit(10).unwrap();
    assert_eq!(m.covered(), 10);
    assert!(matches!(m.begin().commit(9), Err(Error::InvalidArgument(_))));
    let st = m.begin().commit(10).unwrap();
    assert_eq!(st.syncs, 0, "an empty batch at the same position is a no-op");
}

#[test]
fn compaction_drops_garbage_and_keeps_content() {
    let s = setup();
    let opts = ManifestOptions { rewrite_min_garbage_pages: 4, ..Default::default() };
    let m = Manifest::open(Arc::new(s.clone()), Path::new("/img/manifest"), opts.clone()).unwrap();
    for round in 0..20u64 {
        let mut e = m.begin();
        for b in (0..2000).step_by(97) {
            e.set(b, Some(h(b * 1000 + round)));
        }
        e.commit(round).unwrap();
    }
    let before = m.stats();
    assert!(before.garbage_pages > before.live_pages);
    let snap_reader = m.iter();
    let r = m.compact_if_needed().unwrap().expect("garbage above the limit");
    assert_eq!(r.pages_after, 2 + before.live_pages);
    let after = m.stats();
    assert_eq!((after.garbage_pages, after.live_pages), (0, before.live_pages));
    assert_eq!(snap_reader.count(), after.mapped_blocks as usize, "old snapshot still readable");
    assert!(m.compact_if_needed().unwrap().is_none());
    s.crash(CrashMode::LoseUnsynced);
    let m = Manifest::open(Arc::new(s.clone()), Path::new("/img/manifest"), opts).unwrap();
    for b in (0..2000).step_by(97) {
        assert_eq!(m.lookup(b).unwrap(), Some(h(b * 1000 + 19)));
    }
    assert_eq!(m.stats().garbage_pages, 0);
}

#[test]
fn lookups_run_during_commits() {
    let s = setup();
    let m = Arc::new(open(&s));
    let mut e = m.begin();
    for b in 0..5000 {
        e.set(b, Some(h(0)));
    }
    e.commit(0).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Every block of one snapshot carries the same round.
                    let mut out = vec![None; 5000];
                    m.lookup_range(0, &mut out).unwrap();
                    assert!(out.iter().all(|o| *o == out[0]), "reader {t} saw a mix of commits");
                    n += 1;
                }
                n
            })
        })
        .collect();
    for round in 1..30u64 {
        let mut e = m.begin();
        for b in 0..5000 {
            e.set(b, Some(h(round)));
        }
        e.commit(round).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn a_damaged_page_is_an_error_not_a_hole() {
    let s = setup();
    let m = open(&s);
    let mut e = m.begin();
    e.set(1, Some(h(1)));
    e.set(500, Some(h(500)));
    e.commit(1).unwrap();
    drop(m);
    // Page 2 is the first leaf written (post-order).
    s.corrupt(Path::new("/img/manifest"), 2 * PAGE_BYTES as u64 + 100, 0x10).unwrap();
    let m = open(&s);
    assert!(matches!(m.lookup(1), Err(Error::ChecksumMismatch { .. })));
    assert_eq!(m.lookup(500).unwrap(), Some(h(500)));
    assert!(m.iter().any(|r| r.is_err()));
}

/// Regression (found by manifest_model): clearing a block under an absent
/// interior subtree hit "only an existing page can be kept".
#[test]
fn clearing_under_an_absent_subtree_changes_nothing() {
    let s = setup();
    let m = open(&s);
    let mut e = m.begin();
    e.set(0, Some(h(0)));
    e.set(126 * 338 * 2, Some(h(1)));
    e.commit(1).unwrap();
    let before = m.stats();
    let mut e = m.begin();
    e.set(126 * 338, None);
    let st = e.commit(2).unwrap();
    assert_eq!(st.pages_written, 0);
    assert_eq!(m.stats().live_pages, before.live_pages);
    assert_eq!(m.iter().count(), 2);
}

#[test]
fn ranges_reach_the_last_block_and_no_further() {
    let s = setup();
    let m = open(&s);
    let mut e = m.begin();
    e.set_range(u64::MAX - 1, &[Some(h(1)), Some(h(2))]).unwrap();
    assert!(e.set_range(u64::MAX, &[Some(h(1)), Some(h(2))]).is_err());
    e.commit(1).unwrap();
    let mut out = [None; 2];
    m.lookup_range(u64::MAX - 1, &mut out).unwrap();
    assert_eq!(out, [Some(h(1)), Some(h(2))]);
    assert!(m.lookup_range(u64::MAX, &mut out).is_err());
}

#[test]
fn an_appended_edit_applies_after_the_first() {
    let s = setup();
    let m = open(&s);
    let mut first = m.begin();
    first.set(1, Some(h(1)));
    first.set(2, Some(h(2)));
    first.set(600, Some(h(600)));
    let mut later = m.begin();
    later.set(2, Some(h(22)));
    later.set(600, None);
    later.set(9000, Some(h(9000)));
    first.append(later);
    assert_eq!(first.len(), 6);
    assert_eq!(first.leaves_touched(), 3);
    first.commit(9).unwrap();
    let all: Vec<_> = m.iter().collect::<Result<_>>().unwrap();
    assert_eq!(all, vec![(1, h(1)), (2, h(22)), (9000, h(9000))]);
    assert_eq!(m.covered(), 9);
}

#[test]
fn a_commit_seeds_the_cache_with_interior_pages_and_a_quarter_of_it_in_leaves() {
    let s = setup();
    let opts = ManifestOptions {
        page_cache: PageCache::new(1024 * PAGE_BYTES as u64),
        ..ManifestOptions::default()
    };
    let m = Manifest::open(Arc::new(s.clone()), Path::new("/img/manifest"), opts).unwrap();
    let keep_leaves = 1024 / KEEP_LEAVES_CACHE_FRACTION;
    let leaf_block = |leaf: u64| leaf * LEAF_ENTRIES as u64;
    // 600 leaves: a root and two interior pages above them.
    let mut e = m.begin();
    for leaf in 0..600 {
        e.set(leaf_block(leaf), Some(h(leaf)));
    }
    e.commit(1).unwrap();
    assert_eq!(m.stats().height, 3);
    let misses = |m: &Manifest| m.stats().cache_misses;
    let before = misses(&m);
    for leaf in 0..keep_leaves as u64 {
        assert_eq!(m.lookup(leaf_block(leaf)).unwrap(), Some(h(leaf)));
    }
    assert_eq!(misses(&m) - before, 0, "the first leaves and every page above them were kept");
    let before = misses(&m);
    assert_eq!(m.lookup(leaf_block(400)).unwrap(), Some(h(400)));
    assert_eq!(misses(&m) - before, 1, "a leaf past the quarter is read again, alone");
}

#[test]
fn manifests_sharing_a_page_cache_never_see_each_others_pages() {
    let s = setup();
    s.create_dir_all(Path::new("/img2")).unwrap();
    s.sync_dir(Path::new("/")).unwrap();
    let paths = [Path::new("/img/manifest"), Path::new("/img2/manifest")];
    // The same blocks in both, mapped differently: the same page numbers
    // in two files hold different refs.
    for (i, path) in paths.iter().enumerate() {
        let m = Manifest::open(Arc::new(s.clone()), path, ManifestOptions::default()).unwrap();
        let mut e = m.begin();
        for b in 0..2000u64 {
            e.set(b, Some(h(b * 2 + i as u64)));
        }
        e.commit(1).unwrap();
    }
    // Reopened from their files onto one cache of 8 pages.
    let cache = PageCache::new(8 * PAGE_BYTES as u64);
    let opts = || ManifestOptions { page_cache: cache.clone(), ..ManifestOptions::default() };
    let ms = paths.map(|p| Manifest::open(Arc::new(s.clone()), p, opts()).unwrap());
    for round in 0..3 {
        for b in (0..2000u64).step_by(97) {
            for (i, m) in ms.iter().enumerate() {
                assert_eq!(
                    m.lookup(b).unwrap(),
                    Some(h(b * 2 + i as u64)),
                    "round {round} block {b} image {i}"
                );
            }
        }
        assert!(cache.len() <= cache.capacity_pages(), "{} pages in a cache of {}", cache.len(), 8);
    }
    // Each manifest counts its own lookups.
    let (a, b) = (ms[0].stats(), ms[1].stats());
    assert!(a.cache_hits + a.cache_misses > 0 && b.cache_hits + b.cache_misses > 0);
    assert_eq!(a.cache_hits + a.cache_misses, b.cache_hits + b.cache_misses, "the same walks");
}
