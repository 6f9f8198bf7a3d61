//! Store daemon settings from `casblk add`: the few `cas::StoreOptions` a
//! user tunes, given as flags, applied when the daemon starts.

pub use crate::cli::StoreSettings;
use anyhow::{bail, Result};

/// Compaction's share of the memory budget when `--memory-budget` is given:
/// a quarter, up to the default's 128 MiB.
const COMPACTION_SHARE_DIVISOR: u64 = 4;
/// The longest `--gc-auto-interval` (a day), in seconds.
const MAX_GC_AUTO_INTERVAL_S: u64 = 86_400;
/// The automatic GC task looks at the store at least this often, in ms.
const GC_AUTO_CHECK_MAX_MS: u64 = 10_000;

impl StoreSettings {
    /// The store options these settings give, or an error naming the flag.
    pub fn options(&self) -> Result<cas::StoreOptions> {
        let mut o = cas::StoreOptions::default();
        if let Some(v) = self.chunk_cache_bytes {
            o.chunk_cache_bytes = v;
        }
        if let Some(v) = self.manifest_cache_bytes {
            o.manifest_cache_bytes = v;
        }
        if let Some(v) = self.log_quota_bytes {
            if v < 2 * o.log_segment_bytes {
                bail!(
                    "--log-quota {v} is too small: it must hold two log segments ({} bytes)",
                    2 * o.log_segment_bytes
                );
            }
            o.log_quota_bytes = v;
        }
        if let Some(v) = self.space_reserve_bytes {
            o.space_reserve_bytes = Some(v);
        }
        if let Some(v) = self.compaction_threads {
            o.compaction_threads = v;
        }
        if let Some(name) = &self.background_cpu {
            o.background_cpu =
                cas::BackgroundCpu::parse(name).map_err(|e| anyhow::anyhow!("--background-cpu: {e}"))?;
        }
        match self.gc_auto.as_deref() {
            None => {}
            Some("on") => o.gc_auto.enabled = true,
            Some("off") => o.gc_auto.enabled = false,
            // Over the wire the value is not clap-checked.
            Some(other) => bail!("--gc-auto {other}: use on or off"),
        }
        if let Some(s) = self.gc_auto_interval_s {
            if !(1..=MAX_GC_AUTO_INTERVAL_S).contains(&s) {
                bail!("--gc-auto-interval {s}: use 1 to {MAX_GC_AUTO_INTERVAL_S} seconds");
            }
            o.gc_auto.min_interval_ms = s * 1000;
            o.gc_auto.check_interval_ms = (s * 1000 / 4).clamp(1, GC_AUTO_CHECK_MAX_MS);
        }
        if let Some(budget) = self.memory_budget_bytes {
            o.memory_budget_bytes = budget;
            o.compaction_memory_bytes = o.compaction_memory_bytes.min(budget / COMPACTION_SHARE_DIVISOR);
            if o.validate().is_err() {
                // Only the compaction share can be out of range here.
                let min = o.compaction_memory_min();
                let need = (COMPACTION_SHARE_DIVISOR * min).div_ceil(1 << 20);
                bail!(
                    "--memory-budget {budget} is too small: a quarter of it goes to compaction, which needs \
                     {} MiB; use at least {need}M",
                    min.div_ceil(1 << 20)
                );
            }
        }
        o.validate().map_err(|e| anyhow::anyhow!("store settings: {e}"))?;
        Ok(o)
    }

    /// The metrics address asked for, refused (naming the flag) where it
    /// is not loopback and not allowed to be.
    pub fn metrics_address(&self) -> Result<Option<std::net::SocketAddr>> {
        match self.metrics_listen {
            Some(addr) => {
                crate::metrics::check_address(addr, self.metrics_allow_remote).map_err(anyhow::Error::msg)?;
                Ok(Some(addr))
            }
            None => Ok(None),
        }
    }

    /// The `--space-warn` share, in percent.
    pub fn space_warn_pct(&self) -> u64 {
        self.space_warn_pct.unwrap_or(super::control::DEFAULT_SPACE_WARN_PCT)
    }

    /// Why a daemon running with `running` (and serving metrics at
    /// `running_metrics`, warning at `running_space_warn_pct`, scrubbing
    /// every `running_scrub_interval_h` hours) cannot take
    /// these settings: the first one given that differs. `None` when they
    /// agree.
    pub fn conflict(
        &self,
        running: &cas::StoreOptions,
        running_metrics: Option<std::net::SocketAddr>,
        running_space_warn_pct: u64,
        running_scrub_interval_h: Option<u64>,
    ) -> Option<String> {
        if let Some(want) = self.metrics_listen {
            if running_metrics != Some(want) {
                let has = running_metrics
                    .map_or_else(|| "no metrics endpoint".to_owned(), |a| format!("--metrics-listen {a}"));
                return Some(format!(
                    "the store's daemon already runs with {has}, not --metrics-listen {want}: store settings apply \
                     when the daemon starts (delete the store's devices first, or leave the flag out)"
                ));
            }
        }
        let sizes = [
            ("--chunk-cache", self.chunk_cache_bytes, running.chunk_cache_bytes),
            ("--manifest-cache", self.manifest_cache_bytes, running.manifest_cache_bytes),
            ("--log-quota", self.log_quota_bytes, running.log_quota_bytes),
            ("--memory-budget", self.memory_budget_bytes, running.memory_budget_bytes),
            ("--compaction-threads", self.compaction_threads, running.compaction_threads),
            ("--space-warn", self.space_warn_pct, running_space_warn_pct),
        ]
        .map(|(flag, want, has)| (flag, want.map(|w| w.to_string()), has.to_string()));
        let class =
            ("--background-cpu", self.background_cpu.clone(), running.background_cpu.name().to_string());
        let gc = (
            "--gc-auto",
            self.gc_auto.clone(),
            if running.gc_auto.enabled { "on" } else { "off" }.to_string(),
        );
        let interval = (
            "--gc-auto-interval",
            self.gc_auto_interval_s.map(|s| s.to_string()),
            (running.gc_auto.min_interval_ms / 1000).to_string(),
        );
        let reserve = (
            "--space-reserve",
            self.space_reserve_bytes.map(|b| b.to_string()),
            running.space_reserve_bytes.map_or_else(|| "default".to_string(), |b| b.to_string()),
        );
        let scrub = (
            "--scrub-interval",
            self.scrub_interval_h.map(|h| h.to_string()),
            running_scrub_interval_h.map_or_else(|| "off".to_string(), |h| h.to_string()),
        );
        sizes.into_iter().chain([class, gc, interval, reserve, scrub]).find_map(
            |(flag, want, has)| match want {
                Some(w) if w != has => Some(format!(
                    "the store's daemon already runs with {flag} {has}, not {w}: store settings apply when \
                 the daemon starts (delete the store's devices first, or leave the flag out)"
                )),
                _ => None,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_flags_give_the_defaults() {
        assert_eq!(StoreSettings::default().options().unwrap(), cas::StoreOptions::default());
    }

    #[test]
    fn the_options_are_a_counter_source_with_or_without_a_reserve() {
        let default = cas::StoreOptions::default();
        let c = trace::counters_from("settings", &default).unwrap();
        assert!(!format!("{c:?}").contains("space_reserve_bytes"), "no reserve given, none named");
        let given = cas::StoreOptions { space_reserve_bytes: Some(1 << 30), ..default };
        let c = trace::counters_from("settings", &given).unwrap();
        assert!(format!("{c:?}").contains("space_reserve_bytes"), "{c:?}");
    }

    #[test]
    fn flags_land_in_the_options() {
        let s = StoreSettings {
            chunk_cache_bytes: Some(1 << 20),
            manifest_cache_bytes: Some(2 << 20),
            log_quota_bytes: Some(64 << 20),
            memory_budget_bytes: Some(256 << 20),
            compaction_threads: Some(1),
            background_cpu: Some("idle".into()),
            gc_auto: Some("off".into()),
            gc_auto_interval_s: Some(30),
            metrics_listen: None,
            metrics_allow_remote: false,
            space_warn_pct: Some(80),
            space_reserve_bytes: Some(128 << 20),
            scrub_interval_h: None,
        };
        let o = s.options().unwrap();
        assert_eq!(o.space_reserve_bytes, Some(128 << 20));
        assert!(!o.gc_auto.enabled);
        assert_eq!(o.chunk_cache_bytes, 1 << 20);
        assert_eq!(o.manifest_cache_bytes, 2 << 20);
        assert_eq!(o.log_quota_bytes, 64 << 20);
        assert_eq!(o.memory_budget_bytes, 256 << 20);
        assert_eq!(o.compaction_memory_bytes, 64 << 20, "a quarter of the budget");
        assert_eq!(o.compaction_threads, 1);
        assert_eq!(o.background_cpu, cas::BackgroundCpu::Idle);
        assert_eq!(s.conflict(&o, None, 80, None), None);
    }

    #[test]
    fn bad_values_name_their_flag() {
        let small_log = StoreSettings { log_quota_bytes: Some(4 << 20), ..Default::default() };
        let e = small_log.options().unwrap_err().to_string();
        assert!(e.contains("--log-quota") && e.contains("16777216"), "{e}");
        // Over the wire the class name is not clap-checked.
        let class = StoreSettings { background_cpu: Some("fast".into()), ..Default::default() };
        let e = class.options().unwrap_err().to_string();
        assert!(e.contains("--background-cpu") && e.contains("(normal, batch, idle)"), "{e}");
        let small_mem = StoreSettings { memory_budget_bytes: Some(8 << 20), ..Default::default() };
        let e = small_mem.options().unwrap_err().to_string();
        assert!(e.contains("--memory-budget"), "{e}");
        // The suggested minimum is accepted, and just below it is not.
        let need = cas::StoreOptions::default().compaction_memory_min() * COMPACTION_SHARE_DIVISOR;
        let ok =
            StoreSettings { memory_budget_bytes: Some(need.div_ceil(1 << 20) << 20), ..Default::default() };
        ok.options().unwrap();
        let below = StoreSettings {
            memory_budget_bytes: Some(need - COMPACTION_SHARE_DIVISOR),
            ..Default::default()
        };
        assert!(below.options().is_err());
    }

    #[test]
    fn a_running_daemon_refuses_only_differing_flags() {
        let running = cas::StoreOptions::default();
        assert_eq!(StoreSettings::default().conflict(&running, None, 90, None), None);
        let same = StoreSettings { chunk_cache_bytes: Some(running.chunk_cache_bytes), ..Default::default() };
        assert_eq!(same.conflict(&running, None, 90, None), None);
        let other = StoreSettings { compaction_threads: Some(2), ..Default::default() };
        let e = other.conflict(&running, None, 90, None).unwrap();
        assert!(e.contains("--compaction-threads 3, not 2"), "{e}");
        let class = StoreSettings { background_cpu: Some("normal".into()), ..Default::default() };
        let e = class.conflict(&running, None, 90, None).unwrap();
        assert!(e.contains("--background-cpu batch, not normal"), "{e}");
        let same = StoreSettings { background_cpu: Some("batch".into()), ..Default::default() };
        assert_eq!(same.conflict(&running, None, 90, None), None);
        let gc = StoreSettings { gc_auto: Some("off".into()), ..Default::default() };
        assert!(gc.conflict(&running, None, 90, None).unwrap().contains("--gc-auto on, not off"));
        let interval = StoreSettings { gc_auto_interval_s: Some(15), ..Default::default() };
        assert!(interval
            .conflict(&running, None, 90, None)
            .unwrap()
            .contains("--gc-auto-interval 60, not 15"));
        let scrub = StoreSettings { scrub_interval_h: Some(24), ..Default::default() };
        assert!(scrub.conflict(&running, None, 90, None).unwrap().contains("--scrub-interval off, not 24"));
        assert_eq!(scrub.conflict(&running, None, 90, Some(24)), None);
        let reserve = StoreSettings { space_reserve_bytes: Some(1 << 30), ..Default::default() };
        let e = reserve.conflict(&running, None, 90, None).unwrap();
        assert!(e.contains("--space-reserve default, not 1073741824"), "{e}");
        let o = interval.options().unwrap();
        assert_eq!((o.gc_auto.min_interval_ms, o.gc_auto.check_interval_ms), (15_000, 3_750));
        let long = StoreSettings { gc_auto_interval_s: Some(3600), ..Default::default() };
        assert_eq!(long.options().unwrap().gc_auto.check_interval_ms, GC_AUTO_CHECK_MAX_MS);
        let zero = StoreSettings { gc_auto_interval_s: Some(0), ..Default::default() };
        assert!(zero.options().unwrap_err().to_string().contains("--gc-auto-interval 0"));
        let typo = StoreSettings { gc_auto: Some("of".into()), ..Default::default() };
        assert!(typo.options().unwrap_err().to_string().contains("--gc-auto of"));
    }

    #[test]
    fn a_metrics_address_must_match_the_running_daemons() {
        let running = cas::StoreOptions::default();
        let at = |a: &str| StoreSettings { metrics_listen: Some(a.parse().unwrap()), ..Default::default() };
        let here: std::net::SocketAddr = "127.0.0.1:9465".parse().unwrap();
        assert_eq!(at("127.0.0.1:9465").conflict(&running, Some(here), 90, None), None);
        assert_eq!(
            StoreSettings::default().conflict(&running, Some(here), 90, None),
            None,
            "no flag: whatever runs"
        );
        let e = at("127.0.0.1:9466").conflict(&running, Some(here), 90, None).unwrap();
        assert!(e.contains("--metrics-listen 127.0.0.1:9465, not --metrics-listen 127.0.0.1:9466"), "{e}");
        let e = at("127.0.0.1:9466").conflict(&running, None, 90, None).unwrap();
        assert!(e.contains("no metrics endpoint"), "{e}");
        let warn = StoreSettings { space_warn_pct: Some(80), ..Default::default() };
        assert_eq!(warn.conflict(&running, None, 80, None), None);
        assert!(warn.conflict(&running, None, 90, None).unwrap().contains("--space-warn 90, not 80"));
    }

    #[test]
    fn a_metrics_address_other_hosts_reach_needs_allowing() {
        let s = StoreSettings { metrics_listen: Some("0.0.0.0:9465".parse().unwrap()), ..Default::default() };
        let e = s.metrics_address().unwrap_err().to_string();
        assert!(e.contains("--metrics-allow-remote"), "{e}");
        let allowed = StoreSettings { metrics_allow_remote: true, ..s };
        assert_eq!(allowed.metrics_address().unwrap(), Some("0.0.0.0:9465".parse().unwrap()));
        let local =
            StoreSettings { metrics_listen: Some("[::1]:9465".parse().unwrap()), ..Default::default() };
        assert!(local.metrics_address().is_ok());
    }
}
