//! The fuzz targets' seed corpora (`fuzz/corpus/<target>/`) and kept
//! crashes (`fuzz/regressions/<target>/`), on the stable toolchain.
//!
//! - The committed seeds are what this file generates: valid encodings of
//!   every object each target decodes, from the encoders the store uses. A
//!   format change makes this fail until the seeds are regenerated:
//!   `CASBLK_WRITE_SEEDS=1 cargo test -p casblk-ci --test fuzz_corpus`.
//! - Every seed decodes; every seed and every kept regression input runs
//!   through its target's body without a panic. A crash the fuzzer finds
//!   is kept by copying its input to `fuzz/regressions/<target>/<name>`
//!   (a name saying what it broke), which makes it a test here.

use cas::chunk::{ChunkHash, ChunkLoc, ChunkRef, PackHeader};
use cas::manifest::{fuzz_encode_page, Body, LeafBody, Manifest, ManifestOptions, Page, PAGE_BYTES};
use cas::storage::{MemStorage, OpenMode, Storage};
use cas::wal::{RecordHeader, RecordKind, SegmentHeader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TARGETS: [&str; 9] = [
    "wal_record",
    "manifest_page",
    "pack_header",
    "pack_forward",
    "remote_files",
    "chunk_index",
    "dedup_index",
    "store_files",
    "control_request",
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn wal_seeds() -> Vec<Vec<u8>> {
    let mut segment =
        SegmentHeader { index: 3, segment_bytes: 1 << 20, first_seq: 10, log_id: 0xab }.encode().to_vec();
    let mut records = Vec::new();
    for (seq, h) in [
        (10, RecordHeader::write(10, 9, 4096, 1024)),
        (11, RecordHeader::range(RecordKind::WriteZeroes, 11, 10, 8192, 4096)),
        (12, RecordHeader::range(RecordKind::Discard, 12, 10, 0, 512)),
        (13, RecordHeader::pad(13, 12, 128)),
    ] {
        let payload = vec![seq as u8; h.payload_bytes() as usize];
        let mut r = h.encode(&payload).to_vec();
        r.extend_from_slice(&payload);
        segment.extend_from_slice(&r);
        records.push(r);
    }
    let mut out = vec![segment];
    out.extend(records);
    out
}

fn manifest_seeds() -> Vec<Vec<u8>> {
    let s = MemStorage::new();
    s.create_dir_all(Path::new("/m")).unwrap();
    let m = Manifest::open(Arc::new(s.clone()), Path::new("/m/f"), ManifestOptions::default()).unwrap();
    let mut e = m.begin();
    for b in (0..400u64).step_by(3) {
        let tag = ChunkHash::from_bytes([(b % 251) as u8 + 1; 32]).tag();
        // Every third entry unlocated, as a leaf from before locations reads.
        let at =
            (b % 3 != 0).then_some(ChunkLoc { pack: (b % 7) as u32 + 1, slot: b as u32, crc: !(b as u32) });
        e.set(b, Some(ChunkRef { tag, at }));
    }
    e.commit(1).unwrap();
    let f = s.open(Path::new("/m/f"), OpenMode::Existing).unwrap();
    let mut all = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut all, 0).unwrap();
    let pages: Vec<Vec<u8>> = all.chunks(PAGE_BYTES).map(<[u8]>::to_vec).collect();
    // A root slot, a leaf, and the last page written (the root page).
    let root_slot = pages.iter().take(2).find(|p| p.starts_with(b"CASMROOT")).expect("a root slot").clone();
    // And a leaf as written before locations (version 1: whole hashes).
    let v1 = LeafBody::v1_with(&[(0, ChunkHash::of(b"a")), (125, ChunkHash::of(b"b"))]);
    let v1 = Page { level: 0, first_block: 126, generation: 1, crc: 0, body: Body::Leaf(v1) };
    vec![root_slot, pages[2].clone(), pages.last().unwrap().clone(), fuzz_encode_page(&v1)]
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "wal_record" => wal_seeds(),
        "manifest_page" => manifest_seeds(),
        "pack_header" => vec![PackHeader { store_id: 0x5eed, pack_id: 7, capacity_slots: 16383 }.encode()],
        "pack_forward" => vec![cas::chunk::fuzz_sample_forward()],
        "remote_files" => cas::bucket::fuzz_sample_remote(),
        "chunk_index" => vec![cas::chunk::fuzz_sample_index(1), cas::chunk::fuzz_sample_index(3)],
        "dedup_index" => cas::dedup::fuzz_sample_dedup(),
        "store_files" => cas::store::fuzz_samples(),
        "control_request" => [
            r#"{"cmd":"stats","image":null}"#,
            r#"{"cmd":"stats","image":"vm1"}"#,
            r#"{"cmd":"control","action":"ping","args":{}}"#,
            r#"{"cmd":"control","action":"image_create","args":{"name":"vm","size_bytes":1073741824}}"#,
            r#"{"cmd":"control","action":"gc","args":{},"v":1}"#,
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        other => panic!("no seeds for {other}"),
    }
}

/// Runs `data` through the body of `target`'s fuzz target; true if it
/// decoded as the target's main object.
fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "wal_record" => {
            cas::wal::fuzz_decode(data);
            SegmentHeader::decode(data, Path::new("seed")).is_ok() || cas::wal::record::decode(data).is_ok()
        }
        "manifest_page" => {
            let page = cas::manifest::fuzz_decode_page(data);
            if let Ok(p) = &page {
                assert_eq!(cas::manifest::fuzz_encode_page(p), data, "decode/encode round trip");
            }
            page.is_ok() | cas::manifest::fuzz_decode_root(data).is_ok()
        }
        "pack_header" => cas::chunk::fuzz_decode_pack_header(data).is_ok(),
        "pack_forward" => {
            let table = cas::chunk::fuzz_decode_forward(data);
            if let Ok(t) = &table {
                assert_eq!(t.encode(), data, "decode/encode round trip");
            }
            table.is_ok()
        }
        "remote_files" => {
            let decoded = cas::bucket::fuzz_decode_remote(data);
            if let Ok(encoded) = &decoded {
                assert_eq!(encoded, data, "decode/encode round trip");
            }
            decoded.is_ok()
        }
        "chunk_index" => cas::chunk::fuzz_replay_index(data).is_ok(),
        "dedup_index" => cas::dedup::fuzz_decode_dedup(data).is_ok(),
        "store_files" => {
            let (store, image) = cas::store::fuzz_decode_store_files(data);
            store.is_ok() || image.is_ok()
        }
        "control_request" => match trace::stats::parse_request(data) {
            Ok(req) => {
                let line = serde_json::to_vec(&req).unwrap();
                assert_eq!(trace::stats::parse_request(&line).ok(), Some(req));
                true
            }
            Err(_) => false,
        },
        other => panic!("no target {other}"),
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    v.retain(|p| p.file_name().is_some_and(|n| n != "README.md"));
    v.sort();
    v
}

#[test]
fn committed_seeds_are_current_and_decode() {
    let write = std::env::var_os("CASBLK_WRITE_SEEDS").is_some();
    for t in TARGETS {
        let dir = fuzz_dir().join("corpus").join(t);
        let want = seeds(t);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            for old in files_in(&dir) {
                std::fs::remove_file(old).unwrap();
            }
            for (i, s) in want.iter().enumerate() {
                std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
            }
        }
        let have: Vec<Vec<u8>> = files_in(&dir).iter().map(|p| std::fs::read(p).unwrap()).collect();
        assert!(
            have == want,
            "fuzz/corpus/{t} is not what the encoders make now; regenerate: \
             CASBLK_WRITE_SEEDS=1 cargo test -p casblk-ci --test fuzz_corpus"
        );
        for (i, s) in want.iter().enumerate() {
            assert!(run(t, s), "seed {i} of {t} does not decode");
        }
    }
}

#[test]
fn kept_regressions_run_clean() {
    let mut ran = 0;
    for t in TARGETS {
        for p in files_in(&fuzz_dir().join("regressions").join(t)) {
            let data = std::fs::read(&p).unwrap();
            let _ = run(t, &data);
            ran += 1;
        }
    }
    // Garbage of every size through every target, too (never a panic).
    for t in TARGETS {
        for len in [0usize, 1, 4, 28, 64, 511, 512, 4096] {
            let data: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
            assert!(!run(t, &data), "{t} accepted {len} bytes of garbage");
            ran += 1;
        }
    }
    assert!(ran >= TARGETS.len() * 8);
}
