//! Stable smoke test for the manifest decoders (the cargo-fuzz targets
//! live in fuzz/): hundreds of thousands of seeded random and mutated
//! inputs must decode or fail with an error, never panic. Mutated inputs
//! are mostly re-checksummed so the decoder is exercised past the crc.
//! Scale with CAS_FUZZ_ITERS. With CAS_FUZZ_CORPUS_OUT=DIR it also writes
//! its seed pages there, to seed `cargo fuzz run manifest_page DIR`.

use cas::chunk::{ChunkHash, ChunkLoc, ChunkRef};
use cas::manifest::{
    fuzz_decode_page, fuzz_decode_root, fuzz_encode_page, Manifest, ManifestOptions, PAGE_BYTES,
};
use cas::storage::{MemStorage, OpenMode, Storage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

fn iters(default: u64) -> u64 {
    std::env::var("CAS_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Valid pages and root slots, taken from a real manifest file.
fn corpus() -> Vec<Vec<u8>> {
    let s = MemStorage::new();
    s.create_dir_all(Path::new("/m")).unwrap();
    let m = Manifest::open(Arc::new(s.clone()), Path::new("/m/f"), ManifestOptions::default()).unwrap();
    let mut e = m.begin();
    for b in (0..3000u64).step_by(3) {
        let tag = ChunkHash::from_bytes([(b % 251) as u8 + 1; 32]).tag();
        // Every third entry unlocated, as a leaf from before locations reads.
        let at =
            (b % 3 != 0).then_some(ChunkLoc { pack: (b % 7) as u32 + 1, slot: b as u32, crc: !(b as u32) });
        e.set(b, Some(ChunkRef { tag, at }));
    }
    e.set(u64::MAX, Some(ChunkHash::from_bytes([7; 32]).into()));
    e.commit(1).unwrap();
    let f = s.open(Path::new("/m/f"), OpenMode::Existing).unwrap();
    let len = f.len().unwrap() as usize;
    let mut all = vec![0u8; len];
    f.read_exact_at(&mut all, 0).unwrap();
    all.chunks(PAGE_BYTES).map(|c| c.to_vec()).collect()
}

fn reseal(buf: &mut [u8], crc_at: usize) {
    if buf.len() >= crc_at + 4 {
        let crc = crc32c::crc32c(&buf[..crc_at]);
        buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fn mutate(rng: &mut StdRng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    match rng.gen_range(0..10) {
        0 => b.truncate(rng.gen_range(0..=b.len())),
        1 => b.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>())),
        _ => {
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..b.len().max(1));
                if let Some(x) = b.get_mut(i) {
                    *x = match rng.gen_range(0..3) {
                        0 => rng.gen(),
                        1 => *x ^ (1 << rng.gen_range(0..8)),
                        _ => [0, 0xff, 1, 0x80][rng.gen_range(0..4)],
                    };
                }
            }
        }
    }
    b
}

#[test]
fn page_and_root_decoders_never_panic() {
    let corpus = corpus();
    if let Ok(dir) = std::env::var("CAS_FUZZ_CORPUS_OUT") {
        std::fs::create_dir_all(&dir).unwrap();
        for (i, p) in corpus.iter().enumerate() {
            std::fs::write(Path::new(&dir).join(format!("seed-{i:03}")), p).unwrap();
        }
    }
    assert!(corpus.iter().filter(|p| fuzz_decode_page(p).is_ok()).count() > 10);
    assert!(corpus.iter().filter(|p| fuzz_decode_root(&p[..]).is_ok()).count() == 1);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut accepted = 0u64;
    let n = iters(300_000);
    for i in 0..n {
        let mut input = if i % 8 == 0 {
            let n = if rng.gen_bool(0.5) { PAGE_BYTES } else { rng.gen_range(0..PAGE_BYTES + 16) };
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let pick = rng.gen_range(0..corpus.len());
            mutate(&mut rng, &corpus[pick])
        };
        if rng.gen_range(0..4) != 0 {
            reseal(&mut input, PAGE_BYTES - 4);
            reseal(&mut input, 72);
        }
        if let Ok(page) = fuzz_decode_page(&input) {
            assert_eq!(fuzz_encode_page(&page), input, "pages are canonical");
            accepted += 1;
        }
        accepted += u64::from(fuzz_decode_root(&input).is_ok());
    }
    // Some mutations are harmless (e.g. a hash byte): decoding continues past the crc.
    assert!(accepted > 0 || n < 10_000, "no input decoded: the mutations never pass the checks");
}
