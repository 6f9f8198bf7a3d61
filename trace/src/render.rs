//! The iostat-like text view of a [`Snapshot`] for `casblk stats`.
//!
//! ```text
//! casblk stats · 2 images · rates over the last 1.000 s · latencies since start
//! IMAGE   OP      COUNT   IOPS  MiB/s  ERR  P50_US  P99_US  P999_US  MAX_US  GATE_WAIT_MS
//! vm1     read    ...
//!   gates vm1 write: log_capacity 3 req 12.500 ms (max 9.000 ms)
//!   slowest read vm1: 7926.004 ms at 20860928+4096 (q0 tag 5): admission 7923.379 ms, ...
//!   counters vm1 sched: refused_turns=12 ...
//! ```
//!
//! Counts and rates come from the snapshot's counters (with a previous
//! snapshot, over the interval between the two; otherwise since start).
//! Percentiles are cumulative since the image's `since_ms`.

use std::fmt::Write;

use crate::schema::{ImageStats, OpStats, SlowRequest, Snapshot};
use crate::Op;

/// The table for one snapshot; rates are averages since tracing began.
pub fn render_table(snapshot: &Snapshot) -> String {
    render(snapshot, None)
}

/// The table for `current`, with rates over the interval since `previous`
/// (for `--watch`). Images reset or added since `previous` use averages
/// since they began.
pub fn render_table_since(previous: &Snapshot, current: &Snapshot) -> String {
    render(current, Some(previous))
}

const HEADER: [&str; 11] =
    ["IMAGE", "OP", "COUNT", "IOPS", "MiB/s", "ERR", "P50_US", "P99_US", "P999_US", "MAX_US", "GATE_WAIT_MS"];

fn render(snapshot: &Snapshot, previous: Option<&Snapshot>) -> String {
    let mut out = String::new();
    let interval = match previous {
        Some(p) => format!("rates over the last {:.3} s", (snapshot.clock_ms - p.clock_ms) / 1_000.0),
        None => "rates since start".into(),
    };
    let _ = writeln!(
        out,
        "casblk stats · {} image{} · {interval} · latencies since start",
        snapshot.images.len(),
        if snapshot.images.len() == 1 { "" } else { "s" }
    );
    let mut rows: Vec<[String; 11]> = vec![HEADER.map(str::to_owned)];
    for image in &snapshot.images {
        // The interval base: the previous snapshot of the same image, unless
        // the image was reset (or is new) since, or the clocks are odd.
        let base = previous
            .filter(|p| p.clock_ms < snapshot.clock_ms)
            .and_then(|p| Some((p.clock_ms, p.image(&image.name)?)))
            .filter(|(_, b)| b.since_ms == image.since_ms);
        let base_clock_ms = base.map_or(image.since_ms, |(clock_ms, _)| clock_ms);
        let base = base.map(|(_, b)| b);
        let seconds = ((snapshot.clock_ms - base_clock_ms) / 1_000.0).max(1e-9);
        let mut any = false;
        for op in Op::ALL {
            let now = image.ops.get(op);
            if now.count == 0 {
                continue;
            }
            any = true;
            rows.push(op_row(&image.name, op, now, base.map(|b| b.ops.get(op)), seconds));
        }
        if !any {
            let mut row: [String; 11] = Default::default();
            row[0] = image.name.clone();
            row[1] = "-".into();
            row[2] = "0".into();
            rows.push(row);
        }
    }
    out.push_str(&align(&rows));
    for image in &snapshot.images {
        details(&mut out, image);
    }
    for (source, counters) in &snapshot.counters {
        let _ = writeln!(out, "  counters {source}: {}", join_counters(counters));
    }
    out
}

fn op_row(image: &str, op: Op, now: &OpStats, base: Option<&OpStats>, seconds: f64) -> [String; 11] {
    let delta = |f: fn(&OpStats) -> u64| f(now).saturating_sub(base.map_or(0, f));
    let wait_ms = |s: &OpStats| s.gates.values().map(|g| g.wait_ms_total).sum::<f64>();
    let wait_delta_ms = wait_ms(now) - base.map_or(0.0, wait_ms);
    let l = &now.latency;
    [
        image.to_owned(),
        op.name().to_owned(),
        now.count.to_string(),
        format!("{:.1}", delta(|s| s.count) as f64 / seconds),
        format!("{:.2}", delta(|s| s.bytes) as f64 / seconds / (1u64 << 20) as f64),
        delta(|s| s.errors).to_string(),
        format!("{:.1}", l.latency_us_p50),
        format!("{:.1}", l.latency_us_p99),
        format!("{:.1}", l.latency_us_p999),
        format!("{:.1}", l.latency_us_max),
        format!("{:.3}", wait_delta_ms.max(0.0)),
    ]
}

fn details(out: &mut String, image: &ImageStats) {
    for op in Op::ALL {
        let gates: Vec<String> = image
            .ops
            .get(op)
            .gates
            .iter()
            .filter(|(_, g)| g.requests > 0)
            .map(|(gate, g)| {
                format!("{gate} {} req {:.3} ms (max {:.3} ms)", g.requests, g.wait_ms_total, g.wait_ms_max)
            })
            .collect();
        if !gates.is_empty() {
            let _ = writeln!(out, "  gates {} {}: {}", image.name, op.name(), gates.join(" · "));
        }
    }
    if let Some(slow) = image.slowest_reads.first() {
        let _ = writeln!(out, "  slowest read {}: {}", image.name, describe_slow(slow));
    }
    for (source, counters) in &image.counters {
        let _ = writeln!(out, "  counters {} {source}: {}", image.name, join_counters(counters));
    }
}

/// One line: total, the phases that took time (largest first), gates.
pub(crate) fn describe_slow(slow: &SlowRequest) -> String {
    let p = &slow.phases;
    let mut phases = [
        ("admission", p.admission_ns),
        ("dispatch", p.dispatch_ns),
        ("io_cache", p.io_cache_ns),
        ("io_log", p.io_log_ns),
        ("io_manifest", p.io_manifest_ns),
        ("io_chunk", p.io_chunk_ns),
        ("execute", p.execute_ns),
        ("complete", p.complete_ns),
    ];
    phases.sort_by_key(|&(_, ns)| std::cmp::Reverse(ns));
    let ms = |ns: u64| ns as f64 / 1e6;
    let parts: Vec<String> = phases
        .iter()
        .filter(|(_, ns)| *ns > 0)
        .map(|(name, ns)| format!("{name} {:.3} ms", ms(*ns)))
        .collect();
    let mut line = format!(
        "{:.3} ms at {}+{} (q{} tag {}): {}",
        ms(slow.total_ns),
        slow.offset_bytes,
        slow.len_bytes,
        slow.queue,
        slow.tag,
        parts.join(", ")
    );
    if slow.gates.is_empty() {
        line.push_str("; no gate waits");
    } else {
        let gates: Vec<String> =
            slow.gates.iter().map(|g| format!("{} {:.3} ms", g.gate, ms(g.wait_ns))).collect();
        let _ = write!(line, "; waited on {}", gates.join(", "));
    }
    line
}

fn join_counters(counters: &crate::Counters) -> String {
    counters.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// Left-aligns the first two columns and right-aligns the rest.
fn align(rows: &[[String; 11]]) -> String {
    let mut widths = [0usize; 11];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i < 2 {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "{cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
