//! `ci/bench path` in its smoke mode (8 MiB images, 0.2 s jobs): it runs
//! to the end and writes the JSON the issue names, every arm with every
//! job and every figure. Figures are not judged here (the benchmark
//! prints its targets); the shape is the contract.

use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn the_path_benchmark_writes_its_contract() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-path-smoke");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench_path"))
        .env("PATH_BENCH_SMOKE", "1")
        .env("CASBLK_BENCH_DIR", &dir)
        .env_remove("PATH_BENCH_ONLY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench_path failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.join("path.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    assert_eq!(
        keys(&v),
        ["cas", "fio_file", "ratio_pairs", "ratios", "raw"].map(String::from).into(),
        "{text}"
    );
    let jobs = keys(&v["cas"]);
    assert_eq!(jobs.len(), 10, "{text}");
    for job in ["randread_4k_qd8_t1", "randwrite_4k_qd1_t2", "seqwrite_1m_qd8_t2"] {
        assert!(jobs.contains(job), "no job {job}: {text}");
    }
    for arm in ["fio_file", "raw", "cas"] {
        assert_eq!(keys(&v[arm]), jobs, "{arm}: {text}");
        for job in &jobs {
            let f = &v[arm][job];
            assert_eq!(keys(f), ["cpu_us_per_op", "iops", "p50_us", "p99_us"].map(String::from).into());
            for key in ["cpu_us_per_op", "p50_us", "p99_us"] {
                let x = f[key].as_f64().unwrap_or(f64::NAN);
                assert!(x.is_finite() && x >= 0.0, "{arm} {job} {key}: {x}");
            }
            assert!(f["iops"].as_f64().is_some_and(|x| x > 0.0), "{arm} {job}: no IOPS");
        }
    }
    for ratio in ["randread_cpu_cas_over_raw", "randwrite_cpu_cas_over_raw"] {
        let x = v["ratios"][ratio].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x > 0.0, "{ratio}: {x}");
        assert_eq!(
            v["ratio_pairs"][ratio].as_array().map(Vec::len),
            Some(1),
            "{ratio}: one pair in smoke mode"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
