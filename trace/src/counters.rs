//! Named counter snapshots from other crates (sched, cas), kept free of
//! their types.
//!
//! A source (`"sched"`, `"cas"`, `"chunk_cache"`, ...) hands over a flat map
//! `name -> number`. The daemon builds it either directly
//! (`Counters::from([("log_bytes".into(), CounterValue::U64(n))])`) or from
//! any `Serialize` struct with [`counters_from`], which flattens nested
//! structs into dotted names (`compaction.bytes_in`) and refuses anything
//! that is not a number or a bool (bools become 0/1).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};

/// One counter value. Integers stay exact; ratios are floats.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum CounterValue {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl CounterValue {
    /// The value as a float (for display and rates).
    pub fn as_f64(self) -> f64 {
        match self {
            CounterValue::U64(v) => v as f64,
            CounterValue::I64(v) => v as f64,
            CounterValue::F64(v) => v,
        }
    }
}

impl From<u64> for CounterValue {
    fn from(v: u64) -> Self {
        CounterValue::U64(v)
    }
}

impl From<i64> for CounterValue {
    fn from(v: i64) -> Self {
        CounterValue::I64(v)
    }
}

impl From<f64> for CounterValue {
    fn from(v: f64) -> Self {
        CounterValue::F64(v)
    }
}

impl std::fmt::Display for CounterValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CounterValue::U64(v) => write!(f, "{v}"),
            CounterValue::I64(v) => write!(f, "{v}"),
            CounterValue::F64(v) => write!(f, "{v:.3}"),
        }
    }
}

/// A source's counters: name -> value, sorted by name.
pub type Counters = BTreeMap<String, CounterValue>;

/// Builds [`Counters`] from any `Serialize` value that serializes to a JSON
/// object of numbers (nested objects flatten to dotted names).
pub fn counters_from<T: Serialize + ?Sized>(source: &str, value: &T) -> Result<Counters> {
    let value = serde_json::to_value(value)
        .map_err(|e| Error::Counters { source_name: source.into(), reason: e.to_string() })?;
    counters_from_value(source, &value)
}

/// Like [`counters_from`], from an already built JSON value.
pub fn counters_from_value(source: &str, value: &Value) -> Result<Counters> {
    let Value::Object(map) = value else {
        return Err(Error::Counters { source_name: source.into(), reason: "not a JSON object".into() });
    };
    let mut out = Counters::new();
    flatten(source, "", map, &mut out)?;
    Ok(out)
}

/// Nesting limit for flattened counter structs.
const MAX_DEPTH: usize = 8;

fn flatten(
    source: &str,
    prefix: &str,
    map: &serde_json::Map<String, Value>,
    out: &mut Counters,
) -> Result<()> {
    let err = |key: &str, reason: &str| Error::Counters {
        source_name: source.into(),
        reason: format!("{key:?}: {reason}"),
    };
    for (key, value) in map {
        let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        let v = match value {
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => CounterValue::U64(u),
                (None, Some(i), _) => CounterValue::I64(i),
                (None, None, Some(f)) => CounterValue::F64(f),
                _ => return Err(err(&name, "number out of range")),
            },
            Value::Bool(b) => CounterValue::U64(u64::from(*b)),
            Value::Object(inner) => {
                if name.matches('.').count() >= MAX_DEPTH {
                    return Err(err(&name, "nested too deep"));
                }
                flatten(source, &name, inner, out)?;
                continue;
            }
            Value::Null | Value::String(_) | Value::Array(_) => {
                return Err(err(&name, "counters must be numbers or bools"));
            }
        };
        out.insert(name, v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Compaction {
        bytes_in: u64,
        runs: u32,
    }

    #[derive(Serialize)]
    struct CasCounters {
        log_bytes: u64,
        dedup_ratio: f64,
        degraded: bool,
        compaction: Compaction,
    }

    #[test]
    fn struct_flattens_to_dotted_names() {
        let c = counters_from(
            "cas",
            &CasCounters {
                log_bytes: 4096,
                dedup_ratio: 1.5,
                degraded: true,
                compaction: Compaction { bytes_in: 7, runs: 2 },
            },
        )
        .unwrap();
        assert_eq!(c["log_bytes"], CounterValue::U64(4096));
        assert_eq!(c["dedup_ratio"], CounterValue::F64(1.5));
        assert_eq!(c["degraded"], CounterValue::U64(1));
        assert_eq!(c["compaction.bytes_in"], CounterValue::U64(7));
        assert_eq!(c["compaction.runs"], CounterValue::U64(2));
        assert_eq!(c.len(), 5);
    }

    #[test]
    fn non_numbers_are_refused_with_the_key() {
        let e = counters_from_value("sched", &serde_json::json!({"a": 1, "b": "x"})).unwrap_err();
        assert!(e.to_string().contains("\"b\""), "{e}");
        assert!(counters_from_value("sched", &serde_json::json!([1, 2])).is_err());
        assert!(counters_from_value("sched", &serde_json::json!({"a": null})).is_err());
    }

    #[test]
    fn values_round_trip_through_json() {
        let c = counters_from_value("x", &serde_json::json!({"u": 5, "i": -3, "f": 0.25})).unwrap();
        let back: Counters = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(back["i"], CounterValue::I64(-3));
    }
}
