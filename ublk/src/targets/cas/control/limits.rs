//! `casblk image limits` in the store daemon: reads or changes the IO limits
//! of an attached image's device (crate::limits). A change is written to the
//! device's state file first, then applied to the scheduler, so a daemon
//! that dies in between recovers the device with the new limits, never with
//! limits older than the ones in force. The table stays locked throughout,
//! so no detach slips in between.

use super::Daemon;
use crate::device::state::{DeviceState, Target};
use crate::limits::LimitChange;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

impl Daemon {
    pub(super) fn limits(&self, name: &str, change: LimitChange) -> Result<Value> {
        let table = self.lock();
        let Some(attached) = table.attached.get(name) else {
            // A missing image says so; an image without a device is told
            // where its limits go.
            self.store.image_info(name)?;
            bail!(
                "image {name} is not attached: IO limits belong to its device; give them to \
                 casblk add --image {name} (e.g. --read-iops 500)"
            );
        };
        let Some(dev_id) = attached.dev_id else {
            bail!("image {name} is being attached; retry when its device is up");
        };
        let sched_id = attached.sched_id;
        let old =
            self.path.sched.limits(sched_id).ok_or_else(|| anyhow!("image {name} left the scheduler"))?;
        let new = change.apply(old);
        if new != old {
            new.validate()?;
            let mut state =
                DeviceState::load(dev_id).with_context(|| format!("the state of /dev/ublkb{dev_id}"))?;
            if let Target::Cas { limits, .. } = &mut state.target {
                *limits = new;
            }
            state.save().with_context(|| format!("saving the state of /dev/ublkb{dev_id}"))?;
            self.path.sched.set_limits(sched_id, new)?;
            tracing::info!(image = name, device = dev_id, limits = %crate::limits::summary(&new), "IO limits changed");
        }
        drop(table);
        Ok(json!({ "image": name, "limits": new, "device": format!("/dev/ublkb{dev_id}") }))
    }
}
