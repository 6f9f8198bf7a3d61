//! The text view of a [`Snapshot`] for `casblk stats`: one section per
//! image, then the store's own counters, every figure in human units.
//!
//! ```text
//! casblk stats · 2 images · rates since start · latencies since start
//!
//! vm1
//!   op       count  iops       rate  err     p50     p99   p99.9     max  gate wait
//!   read     2,100  20.6  1.31 MiB/s    0  85.0 µs  1.20 ms  ...
//!   waits of  at gate       requests   in all  at most
//!   write     log_capacity         3  12.5 ms  9.00 ms
//!   slowest read: 7.93 s at byte 20860928 +4.00 KiB (q0 tag 5): admission 7.92 s, ...
//!   sched
//!     admitted       2,100   refused_turns     12
//!   cas · compaction
//!     runs               3
//!
//! store
//!   chunk_store
//!     chunks        81,234   dedup_ratio    1.740
//! ```
//!
//! Counts and rates come from the snapshot's counters (with a previous
//! snapshot, over the interval between the two; otherwise since start).
//! Percentiles are cumulative since the image's `since_ms`. A counter is
//! shown in the unit its name carries (`bytes`, `ns`, `us`, `ms`);
//! nested counters (`compaction.runs`) form a group of their own.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::counters::{CounterValue, Counters};
use crate::schema::{ImageStats, OpStats, SlowRequest, Snapshot};
use crate::units::{human_bytes, human_count, human_ms, human_ns, human_rate, human_us};
use crate::Op;

/// Width a counter grid fills before it starts a new line.
const GRID_WIDTH: usize = 100;

/// The view of one snapshot; rates are averages since tracing began.
pub fn render_table(snapshot: &Snapshot) -> String {
    render(snapshot, None)
}

/// The view of `current`, with rates over the interval since `previous`
/// (for `--watch`). Images reset or added since `previous` use averages
/// since they began.
pub fn render_table_since(previous: &Snapshot, current: &Snapshot) -> String {
    render(current, Some(previous))
}

const HEADER: [&str; 10] = ["op", "count", "iops", "rate", "err", "p50", "p99", "p99.9", "max", "gate wait"];

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
        let _ = writeln!(
            out,
            "\n{} · traced for {}",
            image.name,
            human_ms((snapshot.clock_ms - image.since_ms).max(0.0))
        );
        if !image.failure.is_empty() {
            let _ = writeln!(out, "  NOT WORKING: {}", image.failure);
        }
        let mut rows: Vec<Vec<String>> = vec![HEADER.map(str::to_owned).to_vec()];
        for op in Op::ALL {
            let now = image.ops.get(op);
            if now.count > 0 {
                rows.push(op_row(op, now, base.map(|b| b.ops.get(op)), seconds));
            }
        }
        if rows.len() == 1 {
            out.push_str("  no requests yet\n");
        } else {
            out.push_str(&align(&rows, 1, "  "));
        }
        details(&mut out, image);
        for (source, counters) in &image.counters {
            counter_groups(&mut out, source, counters);
        }
    }
    if !snapshot.counters.is_empty() {
        out.push_str("\nstore\n");
        for (source, counters) in &snapshot.counters {
            counter_groups(&mut out, source, counters);
        }
    }
    out
}

fn op_row(op: Op, now: &OpStats, base: Option<&OpStats>, seconds: f64) -> Vec<String> {
    let delta = |f: fn(&OpStats) -> u64| f(now).saturating_sub(base.map_or(0, f));
    let wait_ms = |s: &OpStats| s.gates.values().map(|g| g.wait_ms_total).sum::<f64>();
    let wait_delta_ms = wait_ms(now) - base.map_or(0.0, wait_ms);
    let l = &now.latency;
    vec![
        op.name().to_owned(),
        human_count(now.count),
        format!("{:.1}", delta(|s| s.count) as f64 / seconds),
        human_rate(delta(|s| s.bytes) as f64 / seconds),
        human_count(delta(|s| s.errors)),
        human_us(l.latency_us_p50),
        human_us(l.latency_us_p99),
        human_us(l.latency_us_p999),
        human_us(l.latency_us_max),
        human_ms(wait_delta_ms.max(0.0)),
    ]
}

fn details(out: &mut String, image: &ImageStats) {
    let mut rows: Vec<Vec<String>> =
        vec![["waits of", "at gate", "requests", "in all", "at most"].map(str::to_owned).to_vec()];
    for op in Op::ALL {
        for (gate, g) in image.ops.get(op).gates.iter().filter(|(_, g)| g.requests > 0) {
            rows.push(vec![
                op.name().to_owned(),
                gate.to_string(),
                human_count(g.requests),
                human_ms(g.wait_ms_total),
                human_ms(g.wait_ms_max),
            ]);
        }
    }
    if rows.len() > 1 {
        out.push_str(&align(&rows, 2, "  "));
    }
    if let Some(slow) = image.slowest_reads.first() {
        let _ = writeln!(out, "  slowest read: {}", describe_slow(slow));
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
    let parts: Vec<String> = phases
        .iter()
        .filter(|(_, ns)| *ns > 0)
        .map(|(name, ns)| format!("{name} {}", human_ns(*ns as f64)))
        .collect();
    let mut line = format!(
        "{} at byte {} +{} (q{} tag {}): {}",
        human_ns(slow.total_ns as f64),
        slow.offset_bytes,
        human_bytes(u64::from(slow.len_bytes)),
        slow.queue,
        slow.tag,
        parts.join(", ")
    );
    if slow.gates.is_empty() {
        line.push_str("; no gate waits");
    } else {
        let gates: Vec<String> =
            slow.gates.iter().map(|g| format!("{} {}", g.gate, human_ns(g.wait_ns as f64))).collect();
        let _ = write!(line, "; waited on {}", gates.join(", "));
    }
    line
}

/// A counter's value in the unit its name carries: a `bytes`, `ns`, `us`
/// or `ms` word in its last part (`log_bytes_written`, `wait_ns_max`).
fn human_counter(name: &str, value: CounterValue) -> String {
    let v = value.as_f64();
    let signed = |s: String| if v < 0.0 { format!("-{s}") } else { s };
    let leaf = name.rsplit('.').next().unwrap_or(name);
    let unit = leaf.split('_').find(|w| matches!(*w, "bytes" | "ns" | "us" | "ms"));
    match (unit, value) {
        (Some("bytes"), _) => signed(human_bytes(v.abs() as u64)),
        (Some("ns"), _) => human_ns(v),
        (Some("us"), _) => human_us(v),
        (Some("ms"), _) => human_ms(v),
        (_, CounterValue::U64(n)) => human_count(n),
        (_, CounterValue::I64(n)) => signed(human_count(n.unsigned_abs())),
        (_, CounterValue::F64(f)) => format!("{f:.3}"),
    }
}

/// A source's counters as aligned grids: its own first, then one group per
/// nested prefix (`compaction.runs` goes to "SOURCE · compaction").
fn counter_groups(out: &mut String, source: &str, counters: &Counters) {
    let mut groups: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for (name, value) in counters {
        let (group, key) = name.split_once('.').unwrap_or(("", name.as_str()));
        groups.entry(group).or_default().push((key, human_counter(name, *value)));
    }
    for (group, pairs) in &groups {
        if group.is_empty() {
            let _ = writeln!(out, "  {source}");
        } else {
            let _ = writeln!(out, "  {source} · {group}");
        }
        grid(out, pairs);
    }
}

/// `key value` pairs in as many columns as fit [`GRID_WIDTH`], keys
/// left-aligned and values right-aligned within each column.
fn grid(out: &mut String, pairs: &[(&str, String)]) {
    const INDENT: &str = "    ";
    let key_w = pairs.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    let val_w = pairs.iter().map(|(_, v)| v.chars().count()).max().unwrap_or(0);
    let cell_w = key_w + 2 + val_w;
    let columns = ((GRID_WIDTH - INDENT.len() + 3) / (cell_w + 3)).max(1);
    for line in pairs.chunks(columns) {
        let cells: Vec<String> = line.iter().map(|(k, v)| format!("{k:<key_w$}  {v:>val_w$}")).collect();
        let _ = writeln!(out, "{INDENT}{}", cells.join("   "));
    }
}

/// Left-aligns the first `left` columns and right-aligns the rest.
fn align(rows: &[Vec<String>], left: usize, indent: &str) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(indent);
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i < left {
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
