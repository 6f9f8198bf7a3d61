//! The control socket's requests: stats snapshots, and the typed commands
//! of `crate::protocol` (images, GC, import and export, handoff).

use super::{Daemon, HANDOFF_EXIT_SERVICE};
use crate::protocol::Command;
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

impl Daemon {
    pub(super) fn answer(self: &Arc<Self>, req: &trace::stats::Request) -> trace::Result<Value> {
        match req {
            trace::stats::Request::Stats { image } => {
                Ok(self.snapshot().select(image.as_deref())?.to_value())
            }
            trace::stats::Request::Control { action, args, v } => {
                let reply = match Command::decode(action, args, *v) {
                    Ok(cmd) => self.control(cmd),
                    Err(e) => Err(anyhow!(e)),
                };
                Ok(reply.unwrap_or_else(|e| trace::stats::error_reply(format!("{e:#}"))))
            }
            _ => Ok(trace::stats::error_reply("unsupported request")),
        }
    }

    pub(super) fn control(self: &Arc<Self>, cmd: Command) -> Result<Value> {
        match cmd {
            Command::Ping {} => Ok(json!({ "store": self.store_dir.display().to_string() })),
            Command::Add(add) => Ok(json!({ "device": self.attach(&add)?, "limits": add.limits })),
            Command::ImageCreate { name, size_bytes } => {
                self.store.create_image(&name, size_bytes)?;
                Ok(json!({ "created": name }))
            }
            Command::ImageRemove { name } => {
                if self.lock().attached.contains_key(&name) {
                    bail!("image {name} is attached; delete its device first");
                }
                self.store.remove_image(&name)?;
                Ok(json!({ "removed": name }))
            }
            Command::ImageList {} => Ok(self.image_list()?),
            Command::ImageSnapshot { image, snap } => {
                Ok(json!({ "snapshot": self.store.snapshot_image(&image, &snap)? }))
            }
            Command::ImageClone { snapshot, name } => {
                self.store.clone_image(&snapshot, &name)?;
                Ok(json!({ "cloned": name }))
            }
            Command::ImageRollback { image, snap } => {
                if self.lock().attached.contains_key(&image) {
                    bail!("image {image} is attached; delete its device before a rollback");
                }
                self.store.rollback_image(&image, &snap)?;
                Ok(json!({ "rolled_back": image }))
            }
            Command::ImageImport { name, path, size_bytes } => {
                let summary =
                    crate::image_io::import_into(&self.store, &name, Path::new(&path), size_bytes, false)?;
                Ok(json!({ "imported": name, "summary": summary }))
            }
            Command::ImageExport { name, path, format } => {
                if self.lock().attached.contains_key(&name) {
                    bail!("image {name} is attached and changes while it is read; export a snapshot of it");
                }
                crate::image_io::export_from(&self.store, &name, Path::new(&path), &format)?;
                Ok(json!({ "exported": name }))
            }
            Command::ImageInfo { name } => {
                let mut info = serde_json::to_value(self.store.image_info(&name)?)?;
                let device = self.lock().attached.get(&name).and_then(|a| a.path.clone());
                info["device"] = json!(device);
                Ok(info)
            }
            Command::ImageResize { name, size_bytes, shrink: false } => self.resize(&name, size_bytes),
            Command::ImageResize { name, size_bytes, shrink: true } => self.shrink(&name, size_bytes),
            Command::ImageLimits { name, change } => self.limits(&name, change),
            Command::Gc {} => Ok(serde_json::to_value(self.store.gc()?)?),
            Command::Scrub { image, rate_bytes_per_sec, bucket } => {
                self.scrub_start(cas::ScrubOptions { image, rate_bytes_per_sec, bucket })
            }
            Command::ScrubStatus {} => Ok(self.scrub_status()),
            Command::Handoff {} => self.handoff(),
        }
    }

    /// Live upgrade, the old daemon's half: make every image durable (less
    /// log to replay), then exit without stopping the devices, so the driver
    /// quiesces them and holds their IO for the new binary's `recover`. The
    /// reply goes out first. Under a service manager (`casblk daemon`) the
    /// exit status is 75, a failure, so `Restart=on-failure` starts the new
    /// binary, which recovers the devices itself.
    pub(super) fn handoff(self: &Arc<Self>) -> Result<Value> {
        let devices = self.device_ids();
        for core in self.registry.all() {
            if let Err(e) = core.image.flush() {
                bail!("handoff refused: flushing image {} failed: {e}", core.name);
            }
        }
        let service = self.service;
        tracing::info!(?devices, service, "handing the devices over to a new daemon; exiting");
        std::thread::spawn(move || {
            // Let the control socket send the reply, then leave without
            // running destructors: those would delete the devices.
            std::thread::sleep(Duration::from_millis(200));
            std::process::exit(if service { HANDOFF_EXIT_SERVICE } else { 0 });
        });
        Ok(json!({ "devices": devices, "service": service, "pid": std::process::id() }))
    }

    pub(super) fn image_list(&self) -> Result<Value> {
        let table = self.lock();
        let rows: Vec<Value> = self
            .store
            .list_images()?
            .into_iter()
            .map(|i| {
                let device = table.attached.get(&i.name).and_then(|a| a.path.clone());
                json!({
                    "name": i.name,
                    "size_bytes": i.size_bytes,
                    "device": device,
                    "kind": i.kind,
                    "origin": i.origin,
                })
            })
            .collect();
        Ok(Value::Array(rows))
    }
}
