//! The snapshot JSON matches `docs/stats-schema.md` field for field.

mod common;

use std::collections::BTreeMap;

use serde_json::Value;
use trace::{Gate, Op, Phase, Snapshot, SCHEMA_VERSION};

/// `path -> type` rows of the Fields table in docs/stats-schema.md.
fn documented_fields() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/stats-schema.md"))
        .expect("docs/stats-schema.md is readable");
    let mut fields = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `path` | type | unit | meaning |
        if cells.len() == 6 && cells[1].starts_with('`') && cells[1].ends_with('`') {
            let path = cells[1].trim_matches('`').to_owned();
            let previous = fields.insert(path.clone(), cells[2].to_owned());
            assert!(previous.is_none(), "{path} documented twice");
        }
    }
    assert!(fields.len() > 40, "schema table not found in the doc");
    fields
}

/// Replaces map keys by the doc's placeholders.
fn placeholder(parent: &str, key: &str) -> String {
    let is_counters = parent == "counters" || parent == "images[].counters";
    if is_counters {
        "<source>".into()
    } else if parent.ends_with(".<source>") {
        "<counter>".into()
    } else if parent == "images[].ops" {
        assert!(Op::ALL.iter().any(|o| o.name() == key), "unknown op key {key}");
        "<op>".into()
    } else if parent == "images[].ops.<op>.phases" {
        assert!(Phase::ALL.iter().any(|p| p.name() == key), "unknown phase key {key}");
        "<phase>".into()
    } else if parent == "images[].ops.<op>.gates" {
        assert!(Gate::ALL.iter().any(|g| g.name() == key), "unknown gate key {key}");
        "<gate>".into()
    } else {
        key.into()
    }
}

fn type_ok(ty: &str, v: &Value) -> bool {
    let int_in = |lo: i64, hi: u64| {
        v.as_u64().is_some_and(|u| u <= hi) || v.as_i64().is_some_and(|i| i >= lo && i <= hi as i64)
    };
    match ty {
        "u64" => v.is_u64(),
        "u32" => int_in(0, u32::MAX.into()),
        "u16" => int_in(0, u16::MAX.into()),
        "i32" => int_in(i32::MIN.into(), i32::MAX as u64),
        "f64" | "number" => v.is_number(),
        "string" => v.is_string(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        other => panic!("unknown type {other} in the doc"),
    }
}

/// Walks `v`, recording every normalized path and checking its type.
fn walk(path: &str, v: &Value, doc: &BTreeMap<String, String>, seen: &mut BTreeMap<String, usize>) {
    if !path.is_empty() && !path.ends_with("[]") {
        let ty = doc.get(path).unwrap_or_else(|| panic!("JSON field {path} is not in docs/stats-schema.md"));
        assert!(type_ok(ty, v), "{path}: documented as {ty}, JSON has {v}");
        *seen.entry(path.to_owned()).or_default() += 1;
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let key = placeholder(path, k);
                let child_path = if path.is_empty() { key } else { format!("{path}.{key}") };
                walk(&child_path, child, doc, seen);
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(&format!("{path}[]"), item, doc, seen);
            }
        }
        _ => {}
    }
}

#[test]
fn json_matches_the_documented_schema() {
    let snapshot = common::populated_snapshot();
    let text = serde_json::to_string_pretty(&snapshot).unwrap();
    let json: Value = serde_json::from_str(&text).expect("snapshot JSON parses");
    let doc = documented_fields();
    let mut seen = BTreeMap::new();
    walk("", &json, &doc, &mut seen);
    let missing: Vec<_> = doc.keys().filter(|k| !seen.contains_key(*k)).collect();
    assert!(missing.is_empty(), "documented but absent from the JSON: {missing:?}");

    assert_eq!(json["schema_version"], SCHEMA_VERSION);
    // Every op, phase and gate key is always present, even for an idle image.
    for image in json["images"].as_array().unwrap() {
        for op in Op::ALL {
            let o = &image["ops"][op.name()];
            for phase in Phase::ALL {
                assert!(o["phases"][phase.name()].is_object(), "{} {}", op.name(), phase.name());
            }
            for gate in Gate::ALL {
                assert!(o["gates"][gate.name()].is_object(), "{} {}", op.name(), gate.name());
            }
        }
    }
}

#[test]
fn json_round_trips_into_a_snapshot() {
    let snapshot = common::populated_snapshot();
    let value = snapshot.to_value();
    let back = Snapshot::from_value(value.clone()).unwrap();
    assert_eq!(back, snapshot);
    // Unknown fields from a newer daemon of the same version are ignored.
    let mut extended = value;
    extended["future_field"] = Value::from(1);
    extended["images"][0]["ops"]["read"]["future"] = Value::from("x");
    assert_eq!(Snapshot::from_value(extended).unwrap(), snapshot);
}

#[test]
fn the_example_in_the_doc_is_valid_json() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/stats-schema.md")).unwrap();
    let start = doc.find("```json\n").expect("an example") + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let example: Value = serde_json::from_str(&doc[start..end]).expect("the doc's example parses");
    let slow = &example["images"][0]["slowest_reads"][0];
    let sum: u64 = slow["phases"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(sum, slow["total_ns"].as_u64().unwrap(), "the example's phases add up");
}
