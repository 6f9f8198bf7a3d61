//! What `casblk stats` shows: each attached image's trace with its engine
//! and scheduler counters and its state, and the store's counters (space,
//! chunks, settings, the bucket tier's backlog, the daemon's own memory).

use super::Daemon;

use trace::image_state;

impl Daemon {
    pub(super) fn snapshot(&self) -> trace::Snapshot {
        let mut images = Vec::new();
        // Never the device table's lock: `attach` holds it across a
        // recovery's log replay, and a scrape must not wait for that.
        let recovering = self.recovering.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for core in self.registry.all() {
            let mut stats = core.tracer.snapshot();
            stats.failure = core.image.failure().unwrap_or_default();
            stats.state = image_state::of_failure(&stats.failure).into();
            if recovering.contains(&stats.name) {
                stats.state = image_state::RECOVERING.into();
            }
            match trace::counters_from("cas", &self.store.image_stats(&core.image)) {
                Ok(c) => stats.attach("cas", c),
                Err(e) => tracing::warn!("cas counters: {e}"),
            }
            if let Some(sc) = self.sched.counters(core.sched_id) {
                match trace::counters_from("sched", &sc) {
                    Ok(c) => stats.attach("sched", c),
                    Err(e) => tracing::warn!("sched counters: {e}"),
                }
            }
            images.push(stats);
        }
        for name in recovering {
            if !images.iter().any(|i| i.name == name) {
                let mut stats = trace::Tracer::idle_stats(&name);
                stats.state = image_state::RECOVERING.into();
                images.push(stats);
            }
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        let mut snap = trace::Snapshot::new(images);
        match self.store.space_stats() {
            Ok(space) => match trace::counters_from("store", &space) {
                Ok(c) => snap.attach("store", c),
                Err(e) => tracing::warn!("store counters: {e}"),
            },
            Err(e) => tracing::warn!("store space stats: {e}"),
        }
        match trace::counters_from("chunks", &self.store.chunk_stats()) {
            Ok(c) => snap.attach("chunks", c),
            Err(e) => tracing::warn!("chunk counters: {e}"),
        }
        match trace::counters_from("settings", &self.options) {
            Ok(c) => snap.attach("settings", c),
            Err(e) => tracing::warn!("settings: {e}"),
        }
        if let Some(tier) = self.store.tier() {
            // `last_error` is text, which a counter source cannot hold.
            let remote = serde_json::to_value(tier.stats()).map(|mut v| {
                if let Some(map) = v.as_object_mut() {
                    map.remove("last_error");
                }
                v
            });
            match remote
                .map_err(|e| e.to_string())
                .and_then(|v| trace::counters_from_value("remote", &v).map_err(|e| e.to_string()))
            {
                Ok(c) => snap.attach("remote", c),
                Err(e) => tracing::warn!("remote counters: {e}"),
            }
        }
        let space = serde_json::json!({
            "warn_pct": self.space.warn_pct.load(std::sync::atomic::Ordering::Relaxed),
            "used_pct": self.space.used_pct_x100.load(std::sync::atomic::Ordering::Relaxed) as f64 / 100.0,
            "warning": u64::from(self.space.warning.load(std::sync::atomic::Ordering::Relaxed)),
        });
        match trace::counters_from_value("space", &space) {
            Ok(c) => snap.attach("space", c),
            Err(e) => tracing::warn!("space counters: {e}"),
        }
        match trace::counters_from_value("scrub", &self.scrub.counters()) {
            Ok(c) => snap.attach("scrub", c),
            Err(e) => tracing::warn!("scrub counters: {e}"),
        }
        match serve::process_memory::usage() {
            Ok(u) => match trace::counters_from_value(
                "process",
                &serde_json::json!({"resident_bytes": u.resident_bytes, "threads": u.threads}),
            ) {
                Ok(c) => snap.attach("process", c),
                Err(e) => tracing::warn!("process counters: {e}"),
            },
            Err(e) => tracing::warn!("reading /proc/self/status: {e}"),
        }
        snap
    }
}
