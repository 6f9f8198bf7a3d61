//! Per-image IO limits as the user gives and sees them: the flags of `add`
//! and `image limits` ([`LimitArgs`]), the change they make on the wire
//! ([`LimitChange`]), and the one-line summary. The scheduler enforces the
//! limits (`sched::Limits`, a gate named `rate_limit`).
//!
//! Limits belong to a device, as QEMU's throttling belongs to a drive and
//! libvirt's `<iotune>` to a disk of a domain: `add` sets them, `image
//! limits` changes them online, and the device's state file keeps them, so
//! `recover`, `upgrade` and a restarted `casblk daemon` serve the device
//! with the limits it had. A `del` ends them with the device.

use anyhow::{bail, Result};
use clap::Args;
use sched::{Limits, RateLimit};
use serde::{Deserialize, Serialize};

/// What a change does to one limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    #[default]
    Keep,
    Remove,
    /// A new rate; without a burst, the default for the rate.
    Set {
        per_sec: u64,
        burst: Option<u64>,
    },
}

impl Setting {
    fn is_keep(&self) -> bool {
        *self == Setting::Keep
    }

    fn apply(self, old: Option<RateLimit>) -> Option<RateLimit> {
        match self {
            Setting::Keep => old,
            Setting::Remove => None,
            Setting::Set { per_sec, burst: None } => Some(RateLimit::new(per_sec)),
            Setting::Set { per_sec, burst: Some(burst) } => Some(RateLimit { per_sec, burst }),
        }
    }
}

/// A change to an image's limits, as `image limits` sends it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitChange {
    /// Remove every limit first.
    #[serde(default)]
    pub clear: bool,
    #[serde(default, skip_serializing_if = "Setting::is_keep")]
    pub read_iops: Setting,
    #[serde(default, skip_serializing_if = "Setting::is_keep")]
    pub read_bytes_per_sec: Setting,
    #[serde(default, skip_serializing_if = "Setting::is_keep")]
    pub write_iops: Setting,
    #[serde(default, skip_serializing_if = "Setting::is_keep")]
    pub write_bytes_per_sec: Setting,
}

impl LimitChange {
    pub fn apply(&self, old: Limits) -> Limits {
        let old = if self.clear { Limits::default() } else { old };
        Limits {
            read_iops: self.read_iops.apply(old.read_iops),
            read_bytes_per_sec: self.read_bytes_per_sec.apply(old.read_bytes_per_sec),
            write_iops: self.write_iops.apply(old.write_iops),
            write_bytes_per_sec: self.write_bytes_per_sec.apply(old.write_bytes_per_sec),
        }
    }
}

/// A rate flag's value: a number, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    None,
    PerSec(u64),
}

/// A number of one or more; a negative one gets the same line as 0.
fn positive(s: &str, what: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err("a limit must be at least 1 (none removes it)".into());
    }
    let n: u64 = s.parse().map_err(|_| format!("{s:?} is not {what}"))?;
    at_least_one(n)
}

fn at_least_one(n: u64) -> Result<u64, String> {
    if n == 0 {
        return Err("a limit must be at least 1 (none removes it)".into());
    }
    Ok(n)
}

fn parse_iops(s: &str) -> Result<Rate, String> {
    if s == "none" {
        return Ok(Rate::None);
    }
    positive(s, "a number of requests a second, nor none").map(Rate::PerSec)
}

fn parse_bps(s: &str) -> Result<Rate, String> {
    if s == "none" {
        return Ok(Rate::None);
    }
    if s.starts_with('-') {
        return Err("a limit must be at least 1 (none removes it)".into());
    }
    at_least_one(crate::cli::parse_size(s)?).map(Rate::PerSec)
}

fn parse_count(s: &str) -> Result<u64, String> {
    positive(s, "a number")
}

fn parse_burst_size(s: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err("a burst must be at least 1".into());
    }
    at_least_one(crate::cli::parse_size(s)?)
}

/// The limit flags of `add --image` and `image limits`.
#[derive(Args, Debug, Default, Clone, PartialEq, Eq)]
#[command(
    next_help_heading = "IO limits of the image's device (`none` removes one; bursts default to 0.1 s of the rate)"
)]
pub struct LimitArgs {
    /// Cap reads at N requests a second.
    #[arg(long, value_name = "N|none", value_parser = parse_iops, allow_hyphen_values = true)]
    pub read_iops: Option<Rate>,
    /// Reads that may go at once after idle.
    #[arg(long, value_name = "N", value_parser = parse_count, allow_hyphen_values = true, requires = "read_iops")]
    pub read_iops_burst: Option<u64>,
    /// Cap reads at SIZE bytes a second (20M; at least 1M).
    #[arg(long, value_name = "SIZE|none", value_parser = parse_bps, allow_hyphen_values = true)]
    pub read_bps: Option<Rate>,
    /// Bytes of reads that may go at once after idle.
    #[arg(long, value_name = "SIZE", value_parser = parse_burst_size, allow_hyphen_values = true, requires = "read_bps")]
    pub read_bps_burst: Option<u64>,
    /// Cap writes, write zeroes and discards at N requests a second.
    #[arg(long, value_name = "N|none", value_parser = parse_iops, allow_hyphen_values = true)]
    pub write_iops: Option<Rate>,
    /// Writes that may go at once after idle.
    #[arg(long, value_name = "N", value_parser = parse_count, allow_hyphen_values = true, requires = "write_iops")]
    pub write_iops_burst: Option<u64>,
    /// Cap writes at SIZE bytes a second (a discard or write zeroes counts
    /// 4 KiB, the log record it writes).
    #[arg(long, value_name = "SIZE|none", value_parser = parse_bps, allow_hyphen_values = true)]
    pub write_bps: Option<Rate>,
    /// Bytes of writes that may go at once after idle.
    #[arg(long, value_name = "SIZE", value_parser = parse_burst_size, allow_hyphen_values = true, requires = "write_bps")]
    pub write_bps_burst: Option<u64>,
}

impl LimitArgs {
    /// The change the flags ask for; `clear` first removes every limit.
    pub fn change(&self, clear: bool) -> Result<LimitChange> {
        let one = |flag: &str, rate: Option<Rate>, burst: Option<u64>| -> Result<Setting> {
            Ok(match (rate, burst) {
                (None, _) => Setting::Keep,
                (Some(Rate::None), Some(_)) => bail!("--{flag}-burst needs a rate, not none"),
                (Some(Rate::None), None) => Setting::Remove,
                (Some(Rate::PerSec(per_sec)), burst) => Setting::Set { per_sec, burst },
            })
        };
        let change = LimitChange {
            clear,
            read_iops: one("read-iops", self.read_iops, self.read_iops_burst)?,
            read_bytes_per_sec: one("read-bps", self.read_bps, self.read_bps_burst)?,
            write_iops: one("write-iops", self.write_iops, self.write_iops_burst)?,
            write_bytes_per_sec: one("write-bps", self.write_bps, self.write_bps_burst)?,
        };
        // Bad values fail here, before a daemon is reached, naming the flag.
        if let Err(sched::Error::InvalidLimit { limit, reason }) = change.apply(Limits::default()).validate()
        {
            bail!("--{} {reason}", flag_of(limit));
        }
        Ok(change)
    }
}

/// The flag that sets limit `name` (a `sched::Limits` field).
fn flag_of(name: &str) -> String {
    name.replace("_bytes_per_sec", "_bps").replace('_', "-")
}

fn size(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// `read 500 IOPS (burst 50), write 20 MiB/s (burst 2 MiB)`, or `none`.
pub fn summary(l: &Limits) -> String {
    let mut parts = Vec::new();
    for (class, iops, bytes) in
        [("read", l.read_iops, l.read_bytes_per_sec), ("write", l.write_iops, l.write_bytes_per_sec)]
    {
        let mut caps = Vec::new();
        if let Some(r) = iops {
            caps.push(format!("{} IOPS (burst {})", r.per_sec, r.burst));
        }
        if let Some(r) = bytes {
            caps.push(format!("{}/s (burst {})", size(r.per_sec), size(r.burst)));
        }
        if !caps.is_empty() {
            parts.push(format!("{class} {}", caps.join(" and ")));
        }
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Prints an `image limits` reply: `vm1 on /dev/ublkb0: read 500 IOPS
/// (burst 50)`, or the reply as JSON.
pub fn print(reply: &serde_json::Value, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(reply)?);
        return Ok(());
    }
    let limits: Limits = serde_json::from_value(reply["limits"].clone())
        .map_err(|e| anyhow::anyhow!("malformed reply ({e}): {reply}"))?;
    let (image, device) = (reply["image"].as_str().unwrap_or("?"), reply["device"].as_str().unwrap_or("?"));
    println!("{image} on {device}: {}", summary(&limits));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_keeps_what_it_does_not_name() {
        let old = Limits { read_iops: Some(RateLimit::new(500)), ..Limits::default() };
        let c = LimitChange {
            write_bytes_per_sec: Setting::Set { per_sec: 20 << 20, burst: Some(1 << 20) },
            ..LimitChange::default()
        };
        let new = c.apply(old);
        assert_eq!(new.read_iops, old.read_iops);
        assert_eq!(new.write_bytes_per_sec, Some(RateLimit { per_sec: 20 << 20, burst: 1 << 20 }));
        assert_eq!(summary(&new), "read 500 IOPS (burst 50), write 20 MiB/s (burst 1 MiB)");
        let removed = LimitChange { read_iops: Setting::Remove, ..LimitChange::default() }.apply(new);
        assert_eq!(removed.read_iops, None);
        assert!(LimitChange { clear: true, ..LimitChange::default() }.apply(new).is_unlimited());
        assert_eq!(summary(&Limits::default()), "none");
    }

    #[test]
    fn the_wire_form_names_only_what_changes() {
        let c = LimitChange { read_iops: Setting::Set { per_sec: 5, burst: None }, ..LimitChange::default() };
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"clear": false, "read_iops": {"set": {"per_sec": 5, "burst": null}}})
        );
        assert_eq!(serde_json::from_value::<LimitChange>(v).unwrap(), c);
        assert_eq!(
            serde_json::from_value::<LimitChange>(serde_json::json!({})).unwrap(),
            LimitChange::default()
        );
    }

    #[test]
    fn bad_values_are_refused_with_one_line() {
        assert_eq!(parse_iops("0").unwrap_err(), "a limit must be at least 1 (none removes it)");
        assert_eq!(parse_iops("-5").unwrap_err(), "a limit must be at least 1 (none removes it)");
        assert!(parse_iops("fast").unwrap_err().contains("not a number"));
        assert_eq!(parse_bps("-5").unwrap_err(), "a limit must be at least 1 (none removes it)");
        assert_eq!(parse_bps("none").unwrap(), Rate::None);
        assert_eq!(parse_bps("20M").unwrap(), Rate::PerSec(20 << 20));
        let low = LimitArgs { read_bps: Some(Rate::PerSec(100)), ..LimitArgs::default() };
        let e = low.change(false).unwrap_err().to_string();
        assert_eq!(e, "--read-bps must be at least 1 MiB a second");
        let burst =
            LimitArgs { read_iops: Some(Rate::None), read_iops_burst: Some(5), ..LimitArgs::default() };
        assert!(burst.change(false).unwrap_err().to_string().contains("needs a rate"));
    }
}
