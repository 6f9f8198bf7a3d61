//! `ci/bench images`: snapshot, clone, import and export, native, on the
//! build's filesystem, with the baselines measured in the same run.
//!
//! - `snapshot_ms`, `clone_ms`: the median of 5 snapshots of (and 5 clones
//!   from a snapshot of) a 10 GiB image holding 2 GiB of random data in
//!   64 KiB runs at random places, compacted (`BENCH_IMAGE_GIB`,
//!   `BENCH_DATA_GIB` scale it). Both must not depend on that size.
//! - `import_mib_s`: `Store::import_image` of a 1 GiB raw file
//!   (`BENCH_IMPORT_MIB`) whose blocks are half zeros, half random, into a
//!   store on the same filesystem, durable when it returns; against
//!   `qemu_img_convert_mib_s`: `qemu-img convert -f raw -O raw` of the same
//!   file to a file beside it (qemu flushes it at the end). `import_ratio`
//!   is the first over the second (target >= 1.0).
//! - `export_mib_s`: `Store::export_image` of the imported image to a raw
//!   sparse file, synced.
//! - `blake3_4k_mib_s`: one core hashing 4 KiB blocks, the ceiling import
//!   works under.
//!
//! Writes `target/bench/images.json` and prints it.

use cas::chunk::ChunkHash;
use cas::storage::{FsStorage, Storage};
use cas::{Store, StoreOptions};
use casblk_ci::{filesystem_of, write_results, Scratch, XorShift};
use serde_json::json;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

const BLOCK: usize = 4096;
const RUN_BYTES: u64 = 64 << 10;
const REPEATS: usize = 5;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn fill(x: &mut XorShift, out: &mut [u8]) {
    for w in out.chunks_exact_mut(8) {
        w.copy_from_slice(&x.next_u64().to_le_bytes());
    }
}

/// A source of `size` bytes: random data in the 64 KiB runs `runs` marks,
/// zeros elsewhere.
struct Scattered {
    runs: Vec<bool>,
    pos: u64,
    size: u64,
    rng: XorShift,
}

impl Read for Scattered {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.size {
            return Ok(0);
        }
        let in_run = self.pos % RUN_BYTES;
        let n = (buf.len() as u64).min(RUN_BYTES - in_run).min(self.size - self.pos) as usize;
        if self.runs[(self.pos / RUN_BYTES) as usize] {
            fill(&mut self.rng, &mut buf[..n]);
        } else {
            buf[..n].fill(0);
        }
        self.pos += n as u64;
        Ok(n)
    }
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn opts() -> StoreOptions {
    StoreOptions {
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        ..StoreOptions::default()
    }
}

fn main() -> cas::Result<()> {
    let image_bytes = env_u64("BENCH_IMAGE_GIB", 10) << 30;
    let data_bytes = env_u64("BENCH_DATA_GIB", 2) << 30;
    let import_bytes = env_u64("BENCH_IMPORT_MIB", 1024) << 20;
    let scratch = Scratch::new("images");
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());

    // blake3 over 4 KiB blocks, one core.
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut pool = vec![0u8; 64 << 20];
    fill(&mut rng, &mut pool);
    let t = Instant::now();
    let mut sink = 0u8;
    for b in pool.chunks_exact(BLOCK) {
        sink ^= ChunkHash::of(b).as_bytes()[0];
    }
    let blake3_4k_mib_s = pool.len() as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
    drop(pool);

    // The 10 GiB image with 2 GiB of random data, compacted (imported:
    // the same chunks and manifest a compacted log leaves).
    let store_dir = scratch.0.join("store");
    let store = Store::create(storage.clone(), &store_dir, opts())?;
    let runs_total = (image_bytes / RUN_BYTES) as usize;
    let mut runs = vec![false; runs_total];
    let mut marked = 0u64;
    while marked * RUN_BYTES < data_bytes.min(image_bytes) {
        let i = (rng.next_u64() % runs_total as u64) as usize;
        if !runs[i] {
            runs[i] = true;
            marked += 1;
        }
    }
    let t = Instant::now();
    let mut src = Scattered { runs, pos: 0, size: image_bytes, rng: XorShift(7) };
    let built = store.import_image("big", image_bytes, &mut src, &mut |_| {})?;
    let build_s = t.elapsed().as_secs_f64();
    let image = store.open_image("big")?;
    let mut snapshot_ms = Vec::new();
    for i in 0..REPEATS {
        let t = Instant::now();
        store.snapshot_image("big", &format!("s{i}"))?;
        snapshot_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut clone_ms = Vec::new();
    for i in 0..REPEATS {
        let t = Instant::now();
        store.clone_image("big@s0", &format!("c{i}"))?;
        clone_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // The clones and snapshots read back the image (a sample of blocks).
    let clone = store.open_image("c4")?;
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for i in 0..64u64 {
        let at = (i * 0x9E37_79B9 % (image_bytes >> 20)) << 20;
        image.read(at, &mut a)?;
        clone.read(at, &mut b)?;
        assert!(a == b, "clone c4 differs from its origin at byte {at}");
    }
    drop((clone, image, store));

    // Import against qemu-img convert, on one filesystem.
    let raw = scratch.0.join("half-zero.raw");
    {
        let mut f = std::fs::File::create(&raw).expect("create the raw input");
        let mut block = vec![0u8; 1 << 20];
        let mut x = XorShift(99);
        for _ in 0..import_bytes >> 20 {
            for b in block.chunks_exact_mut(BLOCK) {
                if x.next_u64() & 1 == 0 {
                    fill(&mut x, b);
                } else {
                    b.fill(0);
                }
            }
            f.write_all(&block).expect("write the raw input");
        }
        f.sync_all().expect("sync the raw input");
    }
    let converted = scratch.0.join("converted.raw");
    let t = Instant::now();
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&raw)
        .arg(&converted)
        .output();
    let qemu_s = t.elapsed().as_secs_f64();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("qemu-img convert failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("qemu-img: {e} (ci/setup installs qemu-utils)"),
    }
    let import_dir = scratch.0.join("import-store");
    let store = Store::create(storage, &import_dir, opts())?;
    let mut src = std::fs::File::open(&raw).expect("open the raw input");
    let t = Instant::now();
    let imported = store.import_image("imp", import_bytes, &mut src, &mut |_| {})?;
    let import_s = t.elapsed().as_secs_f64();
    let exported = scratch.0.join("exported.raw");
    let file = std::fs::File::create(&exported).expect("create the export");
    let t = Instant::now();
    store.export_image("imp", &file, &exported, &mut |_| {})?;
    let export_s = t.elapsed().as_secs_f64();
    drop(file);
    let same = std::fs::read(&exported).expect("read export") == std::fs::read(&raw).expect("read input");
    assert!(same, "the exported image differs from the imported file");

    let mib = import_bytes as f64 / (1 << 20) as f64;
    let (import_mib_s, qemu_mib_s) = (mib / import_s, mib / qemu_s);
    let result = json!({
        "snapshot_ms": median_ms(snapshot_ms.clone()),
        "clone_ms": median_ms(clone_ms.clone()),
        "import_mib_s": import_mib_s,
        "qemu_img_convert_mib_s": qemu_mib_s,
        "import_ratio": import_mib_s / qemu_mib_s,
        "export_mib_s": mib / export_s,
        "blake3_4k_mib_s": blake3_4k_mib_s,
        "targets": { "snapshot_ms_max": 50, "clone_ms_max": 50, "import_ratio_min": 1.0 },
        "runs": { "snapshot_ms": snapshot_ms, "clone_ms": clone_ms },
        "setup": {
            "image_bytes": image_bytes,
            "data_bytes": marked * RUN_BYTES,
            "build_by_import_s": build_s,
            "build_report": built,
            "import_bytes": import_bytes,
            "import_report": imported,
            "filesystem": filesystem_of(&scratch.0),
            "hash_sink": sink,
        },
    });
    let path = write_results("images", &result);
    println!("{}", serde_json::to_string_pretty(&result).expect("json"));
    println!(
        "images: snapshot {:.1} ms, clone {:.1} ms (of a {} GiB image with {} GiB of data); import {:.0} MiB/s vs \
         qemu-img convert {:.0} MiB/s (ratio {:.2}); export {:.0} MiB/s; blake3 {:.0} MiB/s -> {}",
        result["snapshot_ms"].as_f64().unwrap_or(0.0),
        result["clone_ms"].as_f64().unwrap_or(0.0),
        image_bytes >> 30,
        (marked * RUN_BYTES) >> 30,
        import_mib_s,
        qemu_mib_s,
        import_mib_s / qemu_mib_s,
        mib / export_s,
        blake3_4k_mib_s,
        path.display()
    );
    Ok(())
}
