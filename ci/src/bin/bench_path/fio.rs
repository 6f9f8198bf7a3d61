//! The floor: fio with `io_uring` and `O_DIRECT` on a plain file on the
//! same filesystem as the other arms, each job as the table names it. Its
//! reads come from the device and the other arms' from the page cache, so
//! it is what the kernel and device cost, not a bound on the others'
//! latency.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::jobs::Job;
use crate::Figures;

const FILE: &str = "fio.img";

fn fio(dir: &Path, args: &[String]) -> Result<std::process::Output, String> {
    let out = Command::new("fio")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("running fio: {e} (ci/setup installs it)"))?;
    if !out.status.success() {
        return Err(format!(
            "fio {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// Writes the file of `span_bytes` the jobs run on, synced.
pub fn prepare(dir: &Path, span_bytes: u64) -> Result<(), String> {
    let args = [
        "--name=prefill".to_string(),
        format!("--filename={FILE}"),
        format!("--size={span_bytes}"),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--rw=write".into(),
        "--bs=1M".into(),
        "--end_fsync=1".into(),
    ];
    fio(dir, &args).map(|_| ())
}

/// Runs `job` for `secs` (or, with `smoke`, 2 MiB of IO per thread).
pub fn run(dir: &Path, job: &Job, span_bytes: u64, secs: f64, smoke: bool) -> Result<Figures, String> {
    let rw = match (job.writes(), job.pattern) {
        (false, casblk_ci::frontend::Pattern::Random) => "randread",
        (true, casblk_ci::frontend::Pattern::Random) => "randwrite",
        (false, _) => "read",
        (true, _) => "write",
    };
    let sequential_parts = job.pattern == casblk_ci::frontend::Pattern::Sequential && job.threads > 1;
    let size = if sequential_parts { span_bytes / u64::from(job.threads) } else { span_bytes };
    let mut args = vec![
        format!("--name={}", job.name()),
        format!("--filename={FILE}"),
        format!("--size={size}"),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        format!("--rw={rw}"),
        format!("--bs={}", job.block_bytes),
        format!("--iodepth={}", job.queue_depth),
        format!("--numjobs={}", job.threads),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ];
    if sequential_parts {
        args.push(format!("--offset_increment={size}"));
    }
    if smoke {
        args.push("--io_size=2M".into());
    } else {
        args.extend([
            "--time_based".into(),
            format!("--runtime={}ms", (secs * 1000.0) as u64),
            "--ramp_time=1".into(),
        ]);
    }
    let out = fio(dir, &args)?;
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before its JSON.
    let json = &text[text.find('{').ok_or_else(|| format!("{}: no JSON from fio", job.name()))?..];
    let v: Value = serde_json::from_str(json).map_err(|e| format!("{}: fio's JSON: {e}", job.name()))?;
    figures(&v, job).ok_or_else(|| format!("{}: fio's JSON lacks a figure: {json}", job.name()))
}

fn figures(v: &Value, job: &Job) -> Option<Figures> {
    let j = &v["jobs"][0];
    if j["error"].as_i64()? != 0 {
        return None;
    }
    let side = &j[if job.writes() { "write" } else { "read" }];
    let pct = |p: &str| side["clat_ns"]["percentile"][p].as_f64().map(|ns| ns / 1000.0);
    let ios = side["total_ios"].as_f64()?;
    // usr_cpu and sys_cpu are percentages of the group's summed run time.
    let cpu_us =
        (j["usr_cpu"].as_f64()? + j["sys_cpu"].as_f64()?) / 100.0 * j["job_runtime"].as_f64()? * 1000.0;
    Some(Figures {
        iops: side["iops"].as_f64()?,
        p50_us: pct("50.000000")?,
        p99_us: pct("99.000000")?,
        cpu_us_per_op: cpu_us / ios.max(1.0),
    })
}
