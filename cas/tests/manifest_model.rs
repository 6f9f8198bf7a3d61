//! Model-based test of the manifest: random edit batches, commits,
//! rewrites and crashes at every point, against a BTreeMap.
//!
//! After any crash the manifest must equal the model before the
//! interrupted operation or after it, never a mix; the covered position
//! says which. Scale with CAS_TEST_SEEDS / CAS_TEST_SEED.

mod chunk_support;

use cas::chunk::{ChunkHash, ChunkLoc, ChunkRef};
use cas::manifest::{Manifest, ManifestOptions, PageCache};
use cas::storage::{CrashMode, MemStorage, Storage};
use chunk_support::{crashing, seeds, with_seed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

type Model = BTreeMap<u64, ChunkRef>;

const PATH: &str = "/img/manifest";

fn fresh_storage() -> MemStorage {
    let s = MemStorage::new();
    s.create_dir_all(Path::new("/img")).unwrap();
    s.sync_dir(Path::new("/")).unwrap();
    s
}

fn opts() -> ManifestOptions {
    // A small cache and an eager rewrite limit exercise both paths. The
    // cache is shared by every manifest these tests open, as a store's
    // images share one: a manifest reopened after a crash, on the same file
    // names, must never find the pages its previous instance cached.
    static CACHE: OnceLock<Arc<PageCache>> = OnceLock::new();
    ManifestOptions {
        page_cache: CACHE.get_or_init(|| PageCache::new(64 << 10)).clone(),
        rewrite_garbage_fraction: 0.5,
        rewrite_min_garbage_pages: 8,
    }
}

fn open(storage: Arc<dyn Storage>) -> cas::Result<Manifest> {
    Manifest::open(storage, Path::new(PATH), opts())
}

fn contents(m: &Manifest) -> Model {
    m.iter().map(|r| r.unwrap()).collect()
}

/// A random ref: located or not, as leaves hold both.
fn hash(rng: &mut StdRng) -> ChunkRef {
    let mut h = [0u8; ChunkHash::BYTES];
    rng.fill(&mut h[..]);
    let at =
        rng.gen_bool(0.5).then(|| ChunkLoc { pack: rng.gen_range(1..100), slot: rng.gen(), crc: rng.gen() });
    ChunkRef { tag: ChunkHash::from_bytes(h).tag(), at }
}

/// A random batch: mostly a dense region, some far blocks, some holes.
fn batch(rng: &mut StdRng, model: &Model) -> Vec<(u64, Option<ChunkRef>)> {
    let n = match rng.gen_range(0..10) {
        0 => 0,
        1..=6 => rng.gen_range(1..40),
        _ => rng.gen_range(40..600),
    };
    let mut edits = Vec::with_capacity(n);
    let run_start = rng.gen_range(0..4000u64);
    for i in 0..n {
        let block = match rng.gen_range(0..20) {
            0 => rng.gen::<u64>(),
            1 => u64::MAX - rng.gen_range(0..300),
            2 if !model.is_empty() => *model.keys().nth(rng.gen_range(0..model.len())).unwrap(),
            3..=9 => run_start + i as u64,
            _ => rng.gen_range(0..5000),
        };
        let value = if rng.gen_range(0..5) == 0 { None } else { Some(hash(rng)) };
        edits.push((block, value));
    }
    edits
}

fn apply(model: &Model, edits: &[(u64, Option<ChunkRef>)]) -> Model {
    let mut m = model.clone();
    for &(b, v) in edits {
        match v {
            Some(h) => m.insert(b, h),
            None => m.remove(&b),
        };
    }
    m
}

fn check(m: &Manifest, model: &Model, rng: &mut StdRng) {
    assert_eq!(&contents(m), model);
    assert_eq!(m.stats().mapped_blocks, model.len() as u64);
    for _ in 0..20 {
        let b = if rng.gen_bool(0.5) && !model.is_empty() {
            *model.keys().nth(rng.gen_range(0..model.len())).unwrap()
        } else {
            rng.gen_range(0..6000)
        };
        assert_eq!(m.lookup(b).unwrap(), model.get(&b).copied(), "block {b}");
    }
}

/// One random run: `steps` batches, each committed (or the file
/// rewritten), a quarter of them interrupted by a simulated crash after a
/// random number of storage operations.
fn run(seed: u64, steps: usize) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mem = fresh_storage();
    let (storage, mut ctl) = crashing(&mem, u64::MAX);
    let mut m = open(storage).unwrap();
    let mut model = Model::new();
    let mut covered = 0u64;
    let mut crashes = 0;
    for step in 0..steps {
        let edits = batch(&mut rng, &model);
        let next = apply(&model, &edits);
        let compact = rng.gen_range(0..8) == 0;
        if rng.gen_range(0..4) == 0 {
            ctl.arm(rng.gen_range(0..12));
        }
        let result = if compact {
            m.compact().map(|_| ())
        } else {
            let mut e = m.begin();
            for &(b, v) in &edits {
                e.set(b, v);
            }
            e.commit(covered + 1).map(|_| ())
        };
        if ctl.died() {
            crashes += 1;
            drop(m);
            let torn = CrashMode::Torn { seed: seed * 1000 + step as u64 };
            mem.crash(if rng.gen_bool(0.5) { CrashMode::LoseUnsynced } else { torn });
            let (storage, fresh) = crashing(&mem, u64::MAX);
            ctl = fresh;
            m = open(storage).unwrap_or_else(|e| panic!("step {step}: reopen after crash failed: {e}"));
            let got = contents(&m);
            if !compact && m.covered() == covered + 1 {
                assert_eq!(got, next, "step {step}: the new root with other content");
                model = next;
                covered += 1;
            } else {
                assert_eq!(m.covered(), covered, "step {step}: covered is neither old nor new");
                assert_eq!(got, model, "step {step}: the old root with other content");
            }
        } else {
            ctl.disarm();
            result.unwrap_or_else(|e| panic!("step {step}: {e}"));
            if !compact {
                model = next;
                covered += 1;
            }
        }
        check(&m, &model, &mut rng);
    }
    crashes
}

#[test]
fn random_batches_commits_and_crashes_match_the_model() {
    let mut crashes = 0;
    for seed in seeds(24) {
        with_seed(seed, |seed| crashes += run(seed, 60));
    }
    assert!(crashes > 0, "no run crashed");
}

/// A scenario: commits that build a state, then one more operation that
/// is crashed after every possible number of storage operations.
fn crash_every_point(
    name: &str,
    setup: &[Vec<(u64, Option<ChunkRef>)>],
    last: Option<&[(u64, Option<ChunkRef>)]>,
) {
    let mut budget = 0;
    loop {
        for mode in [CrashMode::LoseUnsynced, CrashMode::Torn { seed: budget }] {
            let mem = fresh_storage();
            let (storage, ctl) = crashing(&mem, u64::MAX);
            let m = open(storage).unwrap();
            let mut model = Model::new();
            for (i, edits) in setup.iter().enumerate() {
                let mut e = m.begin();
                for &(b, v) in edits {
                    e.set(b, v);
                }
                e.commit(i as u64 + 1).unwrap();
                model = apply(&model, edits);
            }
            let covered = setup.len() as u64;
            ctl.arm(budget);
            let result = match last {
                Some(edits) => {
                    let mut e = m.begin();
                    for &(b, v) in edits {
                        e.set(b, v);
                    }
                    e.commit(covered + 1).map(|_| ())
                }
                None => m.compact().map(|_| ()),
            };
            if !ctl.died() {
                result.unwrap();
                assert!(budget > 0, "{name}: the operation needs storage operations");
                return;
            }
            drop(m);
            mem.crash(mode);
            let m = open(Arc::new(mem.clone()))
                .unwrap_or_else(|e| panic!("{name}: reopen after crash at op {budget} ({mode:?}): {e}"));
            let got = contents(&m);
            let new = last.map(|edits| apply(&model, edits));
            match (m.covered(), new) {
                (c, Some(new)) if c == covered + 1 => assert_eq!(got, new, "{name}: op {budget} {mode:?}"),
                (c, _) => {
                    assert_eq!(c, covered, "{name}: op {budget} {mode:?}");
                    assert_eq!(got, model, "{name}: op {budget} {mode:?}");
                }
            }
            // The survivor commits again normally.
            let mut e = m.begin();
            let nine: ChunkRef = ChunkHash::from_bytes([9; 32]).into();
            e.set(1, Some(nine));
            e.commit(covered + 2).unwrap();
            assert_eq!(m.lookup(1).unwrap(), Some(nine));
        }
        budget += 1;
        assert!(budget < 100, "{name}: never completed");
    }
}

fn run_of(first: u64, n: u64, tag: u8) -> Vec<(u64, Option<ChunkRef>)> {
    (first..first + n).map(|b| (b, Some(ChunkHash::from_bytes([tag; 32]).into()))).collect()
}

#[test]
fn crash_at_every_point_of_a_first_commit() {
    crash_every_point("first", &[], Some(&run_of(0, 3000, 1)));
}

#[test]
fn crash_at_every_point_of_an_in_place_commit() {
    let mut edits = run_of(100, 2000, 2);
    edits.extend(run_of(u64::MAX - 10, 5, 3));
    crash_every_point("in place", &[run_of(0, 3000, 1)], Some(&edits));
}

#[test]
fn crash_at_every_point_of_a_commit_that_empties_the_tree() {
    let clear: Vec<_> = (0..300).map(|b| (b, None)).collect();
    crash_every_point("emptying", &[run_of(0, 300, 1)], Some(&clear));
}

#[test]
fn crash_at_every_point_of_a_rewrite() {
    crash_every_point("rewrite", &[run_of(0, 3000, 1), run_of(0, 3000, 2), run_of(10, 50, 3)], None);
}
