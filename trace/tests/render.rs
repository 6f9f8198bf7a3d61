//! The text view of `casblk stats`.

mod common;

use trace::{render_table, render_table_since, Gate, IoSource, Op, RequestTrace, Snapshot, Tracer};

/// The op row of `op` in image `image`'s section, split into its columns
/// (cells are separated by two or more spaces; a cell such as "1.2 ms"
/// keeps its one inner space).
fn op_row(table: &str, image: &str, op: &str) -> Vec<String> {
    let section = table
        .split("\n\n")
        .find(|s| s.starts_with(&format!("{image} ")))
        .unwrap_or_else(|| panic!("no section for {image}:\n{table}"));
    let line = section
        .lines()
        .find(|l| l.split_whitespace().next() == Some(op) && l.starts_with("  ") && !l.starts_with("   "))
        .unwrap_or_else(|| panic!("no {op} row in {image}:\n{section}"));
    line.trim().split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect()
}

#[test]
fn view_has_a_section_per_image_with_rows_details_and_counter_groups() {
    let snapshot = common::populated_snapshot();
    let table = render_table(&snapshot);
    println!("{table}");
    let header = op_row(&table, "vm1", "op");
    assert_eq!(header, ["op", "count", "iops", "rate", "err", "p50", "p99", "p99.9", "max", "gate wait"]);
    for op in Op::ALL {
        let row = op_row(&table, "vm1", op.name());
        assert_eq!(row.len(), header.len(), "{row:?}");
        assert!(row[3].ends_with("/s") && row[3].contains("B"), "rate in a byte unit: {row:?}");
        for cell in &row[5..] {
            assert!(
                cell.ends_with(" ns")
                    || cell.ends_with(" µs")
                    || cell.ends_with(" ms")
                    || cell.ends_with(" s")
            );
        }
    }
    // The idle image says so instead of showing op rows.
    assert!(table.contains("\nvm2 · traced for "), "{table}");
    assert!(table.split("\n\n").any(|s| s.starts_with("vm2 ") && s.contains("  no requests yet")));
    let waits = op_row(&table, "vm1", "waits");
    assert_eq!(waits, ["waits of", "at gate", "requests", "in all", "at most"]);
    let gate_rows = |op: &str| {
        let names: Vec<String> = Gate::ALL.iter().map(|g| g.name().to_owned()).collect();
        table
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(op))
            .filter(|l| l.split_whitespace().nth(1).is_some_and(|g| names.iter().any(|n| n == g)))
            .count()
    };
    assert_eq!(gate_rows("read"), Gate::COUNT, "{table}");
    assert!(gate_rows("write") >= 1, "{table}");
    assert!(table.contains("  slowest read: "));
    // Counters: one group per source and nested prefix, values in the unit
    // their names carry, counts with separators.
    assert!(table.contains("\n  sched\n    admitted       2,100   refused_turns     12\n"), "{table}");
    assert!(table.contains("\n  cas\n    log_bytes  1.00 GiB\n"), "{table}");
    assert!(table.contains("\n  cas · compaction\n    runs  3\n"), "{table}");
    assert!(
        table.contains("\nstore\n  chunk_store\n    chunks       81,234   dedup_ratio   1.740\n"),
        "{table}"
    );
    assert!(!table.contains('='), "no key=value runs");
    assert!(!table.contains("NOT WORKING"), "every image works");
}

#[test]
fn a_failed_image_says_so_under_its_name() {
    let mut snapshot = common::populated_snapshot();
    snapshot.images[1].failure = "failed: a log sync failed: EIO".into();
    let table = render_table(&snapshot);
    let section = table.split("\n\n").find(|s| s.starts_with("vm2 ")).unwrap();
    assert_eq!(section.lines().nth(1), Some("  NOT WORKING: failed: a log sync failed: EIO"), "{section}");
    let vm1 = table.split("\n\n").find(|s| s.starts_with("vm1 ")).unwrap();
    assert!(!vm1.contains("NOT WORKING"));
}

#[test]
fn wide_counter_sources_wrap_into_aligned_columns() {
    let mut snapshot = common::populated_snapshot();
    let many: serde_json::Map<String, serde_json::Value> =
        (0..60).map(|i| (format!("counter_{i:02}_ns"), serde_json::json!(i * 1_500_000))).collect();
    snapshot.attach("wide", trace::counters_from_value("wide", &serde_json::Value::Object(many)).unwrap());
    let table = render_table(&snapshot);
    let grid: Vec<&str> =
        table.split("  wide\n").nth(1).unwrap().lines().take_while(|l| l.starts_with("    ")).collect();
    assert!(grid.len() > 10 && grid.len() < 60, "60 counters in {} lines", grid.len());
    assert!(grid.iter().all(|l| l.chars().count() <= 100), "{grid:#?}");
    assert!(
        grid[1].contains("1.50 ms")
            || grid.iter().any(|l| l.contains("counter_01_ns") && l.contains("1.50 ms"))
    );
    // Columns line up: every full line puts its cells at the same places.
    let starts = |l: &str| l.match_indices("counter_").map(|(i, _)| i).collect::<Vec<_>>();
    assert!(grid.windows(2).take(grid.len() - 2).all(|w| starts(w[0]) == starts(w[1])), "{grid:#?}");
}

#[test]
fn watch_rates_cover_the_interval_only() {
    let tracer = Tracer::new("vm1");
    let record = |n: u64| {
        for _ in 0..n {
            let mut t = RequestTrace::new(Op::Read, 0);
            t.set_location(0, 0, 0, 1 << 20);
            t.wait_begin(Gate::ReadCredits, 0);
            t.admitted(2_000_000);
            t.io_span(IoSource::Chunk, 2_000_000, 3_000_000);
            tracer.finish(&t, 3_000_000, 0);
        }
    };
    record(100);
    let mut first = Snapshot::new(vec![tracer.snapshot()]);
    record(50);
    let mut second = Snapshot::new(vec![tracer.snapshot()]);
    // Pin the clocks: 100 s of history, then a 2 s interval.
    first.images[0].since_ms = 0.0;
    second.images[0].since_ms = 0.0;
    first.clock_ms = 100_000.0;
    second.clock_ms = 102_000.0;

    // Since start: 150 requests / 102 s; 150 MiB / 102 s; 150 * 2 ms waited.
    let since_start = op_row(&render_table(&second), "vm1", "read");
    assert_eq!(since_start[1], "150");
    assert_eq!(since_start[2], format!("{:.1}", 150.0 / 102.0));
    assert_eq!(since_start[3], "1.47 MiB/s");
    assert_eq!(since_start[9], "300 ms");
    // Over the interval: 50 requests / 2 s, 50 * 2 ms waited.
    let interval = op_row(&render_table_since(&first, &second), "vm1", "read");
    assert_eq!(interval[1], "150", "count stays cumulative");
    assert_eq!(interval[2], "25.0");
    assert_eq!(interval[3], "25.0 MiB/s");
    assert_eq!(interval[9], "100 ms");
    assert!(render_table_since(&first, &second).contains("rates over the last 2.000 s"));

    // An image reset in between falls back to since-start rates.
    second.images[0].since_ms = 101_000.0;
    let after_reset = op_row(&render_table_since(&first, &second), "vm1", "read");
    assert_eq!(after_reset[2], "150.0");
}
