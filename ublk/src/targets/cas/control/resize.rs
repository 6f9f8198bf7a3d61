//! `casblk image resize` in the store daemon: the store grows the image
//! (cas::store::resize), then, if the image is attached, the device grows
//! with it (UPDATE_SIZE, Linux 6.16+). On a driver without UPDATE_SIZE an
//! attached image is refused before anything changes; a detached image
//! grows anywhere and its next device has the new size.
//!
//! The table stays locked throughout, so no attach or detach through this
//! daemon slips in between the check and the device's update; a `del`
//! stops a device in the kernel, so UPDATE_SIZE goes out only to a live
//! device this daemon serves. Rerunning the same resize finishes one cut
//! short (a daemon killed after the store grew, an UPDATE_SIZE that
//! failed): it sends UPDATE_SIZE whenever the device shows less than the
//! image. A detached image with a remote is published before the reply,
//! as a detach does.

use super::Daemon;
use crate::device::driver::driver_features;
use crate::device::resize::{grow_served, has_update_size};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::time::Duration;

/// How long a resize of a detached image waits for the bucket.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(120);

impl Daemon {
    pub(super) fn resize(&self, name: &str, size_bytes: u64) -> Result<Value> {
        // Bad input first, whatever the device.
        self.store.check_resize(name, size_bytes)?;
        let table = self.lock();
        let device = match table.attached.get(name) {
            None => None,
            Some(a) => match a.dev_id {
                Some(id) => Some(id),
                None => bail!("image {name} is being attached; retry the resize when its device is up"),
            },
        };
        if let Some(id) = device {
            if !has_update_size(driver_features()?) {
                bail!(
                    "image {name} is attached as /dev/ublkb{id}, and growing an attached image needs Linux 6.16 or \
                     later (ublk UPDATE_SIZE): delete its device (casblk del -n {id}), resize, then add it again"
                );
            }
        }
        let r = self.store.resize_image(name, size_bytes)?;
        if device.is_none() && self.store.publish_stats(name).is_some() {
            self.store.drain_to_bucket(&r.image, PUBLISH_TIMEOUT)?;
        }
        if let Some(id) = device {
            grow_served(id, std::process::id(), r.new_bytes).with_context(|| {
                format!(
                    "image {name} is {} bytes, but /dev/ublkb{id} was not grown: rerun the resize",
                    r.new_bytes
                )
            })?;
            tracing::info!(
                image = name,
                device = id,
                old_bytes = r.old_bytes,
                new_bytes = r.new_bytes,
                "grown online"
            );
        }
        drop(table);
        Ok(json!({
            "resized": name,
            "old_bytes": r.old_bytes,
            "new_bytes": r.new_bytes,
            "device": device.map(|id| format!("/dev/ublkb{id}")),
        }))
    }

    /// `image resize --shrink`: only a detached image (the table stays
    /// locked, so no attach slips in); with a remote, published before
    /// the reply.
    pub(super) fn shrink(&self, name: &str, size_bytes: u64) -> Result<Value> {
        let table = self.lock();
        if let Some(a) = table.attached.get(name) {
            match a.dev_id {
                Some(id) => bail!(
                    "image {name} is attached as /dev/ublkb{id}: shrink a detached image (casblk del -n {id}, \
                     then resize --shrink)"
                ),
                None => bail!("image {name} is being attached: shrink a detached image"),
            }
        }
        let r = self.store.shrink_image(name, size_bytes, None)?;
        if self.store.publish_stats(name).is_some() {
            self.store.drain_to_bucket(&*self.store.open_image(name)?, PUBLISH_TIMEOUT)?;
        }
        drop(table);
        tracing::info!(image = name, old_bytes = r.old_bytes, new_bytes = r.new_bytes, "shrunk");
        Ok(json!({ "resized": name, "old_bytes": r.old_bytes, "new_bytes": r.new_bytes, "device": null }))
    }
}
