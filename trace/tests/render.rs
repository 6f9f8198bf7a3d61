//! The text table for `casblk stats`.

mod common;

use trace::{render_table, render_table_since, Gate, IoSource, Op, RequestTrace, Snapshot, Tracer};

#[test]
fn table_has_a_row_per_active_op_and_the_details() {
    let snapshot = common::populated_snapshot();
    let table = render_table(&snapshot);
    println!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[1].starts_with("IMAGE") && lines[1].contains("P999_US") && lines[1].contains("GATE_WAIT_MS")
    );
    for op in Op::ALL {
        assert!(
            lines.iter().any(|l| l.starts_with("vm1") && l.split_whitespace().nth(1) == Some(op.name())),
            "no row for {}",
            op.name()
        );
    }
    // The idle image has a placeholder row, not op rows.
    assert!(lines.iter().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["vm2", "-", "0"]));
    assert!(table.contains("gates vm1 read: "));
    assert!(table.contains("gates vm1 write: "));
    assert!(table.contains("slowest read vm1: "));
    assert!(table.contains("counters vm1 sched: admitted=2100 refused_turns=12"));
    assert!(table.contains("counters vm1 cas: compaction.runs=3"));
    assert!(table.contains("counters chunk_store: chunks=81234 dedup_ratio=1.740"));
    // Columns line up: every op row has as many fields as the header.
    let header_fields = lines[1].split_whitespace().count();
    for l in lines.iter().filter(|l| l.starts_with("vm1")) {
        assert_eq!(l.split_whitespace().count(), header_fields, "{l}");
    }
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

    let row = |table: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with("vm1")).expect("a vm1 row").to_owned();
        line.split_whitespace().map(str::to_owned).collect()
    };
    // Since start: 150 requests / 102 s; 150 MiB / 102 s; 150 * 2 ms waited.
    let since_start = row(&render_table(&second));
    assert_eq!(since_start[2], "150");
    assert_eq!(since_start[3], format!("{:.1}", 150.0 / 102.0));
    assert_eq!(since_start[4], format!("{:.2}", 150.0 / 102.0));
    assert_eq!(since_start[10], "300.000");
    // Over the interval: 50 requests / 2 s, 50 * 2 ms waited.
    let interval = row(&render_table_since(&first, &second));
    assert_eq!(interval[2], "150", "COUNT stays cumulative");
    assert_eq!(interval[3], "25.0");
    assert_eq!(interval[4], "25.00");
    assert_eq!(interval[10], "100.000");
    assert!(render_table_since(&first, &second).contains("rates over the last 2.000 s"));

    // An image reset in between falls back to since-start rates.
    second.images[0].since_ms = 101_000.0;
    let after_reset = row(&render_table_since(&first, &second));
    assert_eq!(after_reset[3], "150.0");
}
