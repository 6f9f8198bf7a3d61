//! The target ratios, measured in alternated pairs: one short segment of
//! the job on `raw`, one on `cas`, in ABBA order (raw cas, cas raw, ...)
//! so that a drift of the machine's speed falls on both arms alike. The
//! figure is the median of the pairs' ratios: on a shared machine a burst
//! from another tenant lands in one segment and moves the median by one
//! pair (single runs of the same job here varied by up to 30%).

use crate::arms::EngineArm;
use crate::jobs::Job;

/// The CPU-per-op ratio `cas / raw` of each pair, and their median.
pub struct Paired {
    pub median: f64,
    pub ratios: Vec<f64>,
}

pub fn cpu_ratio(raw: &EngineArm, cas: &EngineArm, job: &Job, pairs: usize, secs: f64) -> Paired {
    let ratios: Vec<f64> = (0..pairs.max(1))
        .map(|i| {
            let (r, c) = if i % 2 == 0 {
                let r = raw.run(job, secs);
                (r, cas.run(job, secs))
            } else {
                let c = cas.run(job, secs);
                (raw.run(job, secs), c)
            };
            c.cpu_us_per_op / r.cpu_us_per_op
        })
        .collect();
    Paired { median: casblk_ci::median(&ratios), ratios }
}
