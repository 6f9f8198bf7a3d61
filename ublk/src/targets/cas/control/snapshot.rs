//! What `casblk stats` shows: each attached image's trace with its engine
//! and scheduler counters, and the store's.

use super::Daemon;

impl Daemon {
    pub(super) fn snapshot(&self) -> trace::Snapshot {
        let mut images = Vec::new();
        for core in self.registry.all() {
            let mut stats = core.tracer.snapshot();
            stats.failure = core.image.failure().unwrap_or_default();
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
        snap
    }
}
