//! A stats snapshot as Prometheus metric families: each family of
//! [`super::families`] filled from the snapshot's fields and counter
//! sources, encoded by the `prometheus` crate's text encoder.

use std::collections::BTreeMap;

use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};
use trace::{image_state, Op, Snapshot};

use super::families::{self, Kind, FAMILIES, IMAGE_COUNTERS, STORE_COUNTERS};

/// The metric families of `snap`, in [`FAMILIES`] order; families with no
/// sample are left out (the text format has no empty family).
pub fn families_of(snap: &Snapshot) -> Vec<MetricFamily> {
    let mut out = Builder::default();
    for image in &snap.images {
        let name = image.name.as_str();
        for op in Op::ALL {
            let stats = image.ops.get(op);
            let labels = [("image", name), ("op", op.name())];
            out.value("casblk_image_requests_total", &labels, stats.count as f64);
            out.value("casblk_image_request_bytes_total", &labels, stats.bytes as f64);
            out.value("casblk_image_request_errors_total", &labels, stats.errors as f64);
            // An older daemon sends no buckets: no histogram rather than a
            // made-up one.
            let bounds = &snap.latency_bucket_bounds_us;
            if !bounds.is_empty() && bounds.len() == stats.latency_buckets.len() {
                let buckets: Vec<(f64, u64)> =
                    bounds.iter().map(|us| us / 1e6).zip(stats.latency_buckets.iter().copied()).collect();
                out.histogram(
                    "casblk_image_request_duration_seconds",
                    &labels,
                    &buckets,
                    stats.latency.count,
                    stats.latency_us_total / 1e6,
                );
            }
            for (gate, g) in &stats.gates {
                let labels = [("image", name), ("op", op.name()), ("gate", gate.as_str())];
                out.value("casblk_image_gate_waits_total", &labels, g.waits as f64);
                out.value("casblk_image_gate_wait_seconds_total", &labels, g.wait_ms_total / 1e3);
            }
        }
        let state = if image.state.is_empty() {
            image_state::of_failure(&image.failure)
        } else {
            image.state.as_str()
        };
        for s in image_state::ALL {
            out.value(
                "casblk_image_state",
                &[("image", name), ("state", s)],
                f64::from(u8::from(s == state)),
            );
        }
        let counter = |source: &str, key: &str| image.counters.get(source).and_then(|c| c.get(key));
        for &(family, source, key, scale) in IMAGE_COUNTERS {
            if let Some(v) = counter(source, key) {
                out.value(family, &[("image", name)], v.as_f64() * scale);
            }
        }
        // Only the limits that are set: no sample means unlimited.
        for class in ["read", "write"] {
            for (family, key) in [
                ("casblk_image_limit_iops", "iops"),
                ("casblk_image_limit_bytes_per_second", "bytes_per_sec"),
            ] {
                if let Some(v) =
                    counter("sched", &format!("limits.{class}_{key}")).filter(|v| v.as_f64() > 0.0)
                {
                    out.value(family, &[("image", name), ("class", class)], v.as_f64());
                }
            }
        }
        if let (Some(next), Some(covered)) = (counter("cas", "next_seq"), counter("cas", "covered_seq")) {
            let backlog = (next.as_f64() - 1.0 - covered.as_f64()).max(0.0);
            out.value("casblk_image_compaction_backlog_records", &[("image", name)], backlog);
        }
    }
    for &(family, source, key, scale) in STORE_COUNTERS {
        match snap.counters.get(source).and_then(|c| c.get(key)) {
            Some(v) => out.value(family, &[], v.as_f64() * scale),
            // Without a bucket the tier's figures are 0, so dashboards and
            // alerts work on every store.
            None if source == "remote" => out.value(family, &[], 0.0),
            None => {}
        }
    }
    out.finish()
}

/// Encodes `families` in the Prometheus text format (0.0.4).
pub fn encode(families: &[MetricFamily]) -> Result<String, String> {
    let mut buf = Vec::new();
    TextEncoder::new().encode(families, &mut buf).map_err(|e| e.to_string())?;
    String::from_utf8(buf).map_err(|e| e.to_string())
}

#[derive(Default)]
struct Builder {
    families: BTreeMap<&'static str, MetricFamily>,
}

impl Builder {
    /// The declaration of a sample named `name` with `labels`, or `None`
    /// (and an error in the log) where the sample does not fit it.
    fn declared(name: &str, labels: &[(&str, &str)]) -> Option<&'static families::Family> {
        let Some(f) = families::find(name) else {
            tracing::error!(name, "metrics: a sample of an undeclared family is left out");
            return None;
        };
        if !labels.iter().map(|(k, _)| *k).eq(f.labels.iter().copied()) {
            tracing::error!(name, "metrics: a sample with other labels than declared is left out");
            return None;
        }
        Some(f)
    }

    /// Adds a sample to family `f`, making the family on its first one
    /// (the text format has no empty family).
    fn push(&mut self, f: &'static families::Family, m: Metric) {
        let mf = self.families.entry(f.name).or_insert_with(|| {
            let mut mf = MetricFamily::default();
            mf.set_name(f.name.to_owned());
            mf.set_help(f.help.to_owned());
            mf.set_field_type(match f.kind {
                Kind::Counter => MetricType::COUNTER,
                Kind::Gauge => MetricType::GAUGE,
                Kind::Histogram => MetricType::HISTOGRAM,
            });
            mf
        });
        mf.mut_metric().push(m);
    }

    /// A counter's or gauge's sample (the family says which).
    fn value(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        let Some(f) = Self::declared(name, labels) else { return };
        let mut m = metric(labels);
        match f.kind {
            Kind::Counter => {
                let mut c = Counter::default();
                c.set_value(v);
                m.set_counter(c);
            }
            Kind::Gauge => {
                let mut g = Gauge::default();
                g.set_value(v);
                m.set_gauge(g);
            }
            Kind::Histogram => {
                tracing::error!(name, "metrics: a histogram needs buckets");
                return;
            }
        }
        self.push(f, m);
    }

    /// A histogram's sample: cumulative `(upper bound, count)` pairs; the
    /// `+Inf` bucket is `count`.
    fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        count: u64,
        sum: f64,
    ) {
        let Some(f) = Self::declared(name, labels) else { return };
        if f.kind != Kind::Histogram {
            tracing::error!(
                name,
                declared = f.kind.name(),
                "metrics: a histogram sample of another type is left out"
            );
            return;
        }
        let mut h = Histogram::default();
        h.set_sample_count(count);
        h.set_sample_sum(sum);
        h.set_bucket(
            buckets
                .iter()
                .map(|&(le, n)| {
                    let mut b = Bucket::default();
                    b.set_upper_bound(le);
                    b.set_cumulative_count(n.min(count));
                    b
                })
                .collect(),
        );
        let mut m = metric(labels);
        m.set_histogram(h);
        self.push(f, m);
    }

    fn finish(mut self) -> Vec<MetricFamily> {
        FAMILIES.iter().filter_map(|f| self.families.remove(f.name)).collect()
    }
}

fn metric(labels: &[(&str, &str)]) -> Metric {
    Metric::from_label(
        labels
            .iter()
            .map(|&(k, v)| {
                let mut l = LabelPair::default();
                l.set_name(k.to_owned());
                l.set_value(v.to_owned());
                l
            })
            .collect(),
    )
}
