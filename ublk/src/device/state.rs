//! What a device needs to be served again after its daemon died: one file
//! per device, `/run/casblk/dev-<id>.json`, written atomically before
//! START_DEV and removed when the device is deleted.
//!
//! ```text
//!  { "version": 1, "crc32c": <of the device object's JSON bytes>,
//!    "device": { "id": 0, "queues": 1, "depth": 128, "io_buf_bytes": 524288,
//!                "poll_us": 0, "recovery": true,
//!                "target": { "cas": { "store": "/var/lib/casblk", "image": "vm1",
//!                                     "settings": { ... } } }
//!                       or { "raw": { "backing": "/srv/disk.img" } } } }
//! ```
//!
//! `/run` is a tmpfs: the files live as long as the kernel that holds the
//! devices, which is exactly as long as recovery is possible. A file from a
//! newer casblk (higher version) or with a bad checksum is refused with a
//! message, never guessed at.

use super::Shape;
use crate::targets::cas::StoreSettings;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The state file layout this casblk writes and reads.
pub const STATE_VERSION: u32 = 1;
/// Where the state files live (beside the daemons' sockets and log).
pub const STATE_DIR: &str = "/run/casblk";

/// How a device is served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// An image of a store, served by the store's daemon.
    /// (The settings are boxed: they are most of the variant.)
    Cas {
        store: PathBuf,
        image: String,
        settings: Box<StoreSettings>,
        /// The device's IO limits, as last set (crate::limits).
        #[serde(default, skip_serializing_if = "sched::Limits::is_unlimited")]
        limits: sched::Limits,
    },
    /// Raw passthrough of a file or block device.
    Raw { backing: PathBuf },
}

/// One device's serving parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    pub id: u32,
    /// Stored as its four fields beside `id` (the layout of version 1).
    #[serde(flatten)]
    pub shape: Shape,
    /// The device was added with user recovery: its IO waits for a new
    /// daemon when the old one dies.
    pub recovery: bool,
    pub target: Target,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    crc32c: u32,
    device: serde_json::Value,
}

/// The state file of device `id`.
pub fn path(id: u32) -> PathBuf {
    Path::new(STATE_DIR).join(format!("dev-{id}.json"))
}

impl DeviceState {
    /// Writes the state atomically: a temporary file, synced, renamed over.
    pub fn save(&self) -> Result<()> {
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("creating {STATE_DIR}"))?;
        let device = serde_json::to_value(self)?;
        let body = serde_json::to_vec(&device)?;
        let file = StateFile { version: STATE_VERSION, crc32c: cas::format::crc32c(&body), device };
        let final_path = path(self.id);
        let tmp = final_path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&file)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &final_path)?;
            std::fs::File::open(STATE_DIR)?.sync_all()
        };
        write().with_context(|| format!("writing device state {}", final_path.display()))
    }

    /// Reads device `id`'s state, or says why it cannot.
    pub fn load(id: u32) -> Result<DeviceState> {
        let p = path(id);
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("no state for ublk device {id} ({} is missing): it was not added by casblk, or was deleted", p.display())
            }
            Err(e) => return Err(anyhow!("reading {}: {e}", p.display())),
        };
        Self::decode(&bytes).with_context(|| format!("device state {}", p.display()))
    }

    fn decode(bytes: &[u8]) -> Result<DeviceState> {
        let file: StateFile =
            serde_json::from_slice(bytes).map_err(|e| anyhow!("not a casblk state file: {e}"))?;
        if file.version > STATE_VERSION {
            bail!("written by a newer casblk (state version {}, this one reads {STATE_VERSION}): upgrade casblk", file.version);
        }
        let body = serde_json::to_vec(&file.device)?;
        if cas::format::crc32c(&body) != file.crc32c {
            bail!("checksum mismatch: the file is damaged");
        }
        serde_json::from_value(file.device).map_err(|e| anyhow!("bad device entry: {e}"))
    }

    /// Removes device `id`'s state (a missing file is fine).
    pub fn remove(id: u32) -> Result<()> {
        match std::fs::remove_file(path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(anyhow!("removing {}: {e}", path(id).display()))
            }
            _ => Ok(()),
        }
    }

    /// The ids of every device with a state file, sorted.
    pub fn ids() -> Vec<u32> {
        let mut ids: Vec<u32> = std::fs::read_dir(STATE_DIR)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        name.strip_prefix("dev-")?.strip_suffix(".json")?.parse().ok()
                    })
                    .collect()
            })
            .unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// The ids of every device that has a state file and still exists.
    /// A state file whose device the driver no longer has (deleted by a
    /// path that could not remove the file) describes nothing a command
    /// can act on: it is removed, so that `upgrade -a` does not try to
    /// hand over a device that is gone.
    pub fn existing_ids() -> Vec<u32> {
        Self::ids()
            .into_iter()
            .filter(|&id| {
                let exists = std::path::Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists();
                if !exists {
                    tracing::warn!(dev = id, "removing the state file of a device that no longer exists");
                    let _ = Self::remove(id);
                }
                exists
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DeviceState {
        DeviceState {
            id: 3,
            shape: Shape { queues: 2, depth: 64, io_buf_bytes: 1 << 20, poll_us: 0 },
            recovery: true,
            target: Target::Cas {
                store: "/var/lib/casblk".into(),
                image: "vm1".into(),
                settings: Box::new(StoreSettings {
                    log_quota_bytes: Some(64 << 20),
                    ..StoreSettings::default()
                }),
                limits: sched::Limits {
                    write_iops: Some(sched::RateLimit::new(300)),
                    ..sched::Limits::default()
                },
            },
        }
    }

    fn encode(s: &DeviceState, version: u32, corrupt: bool) -> Vec<u8> {
        let device = serde_json::to_value(s).unwrap();
        let crc = cas::format::crc32c(&serde_json::to_vec(&device).unwrap()) ^ u32::from(corrupt);
        serde_json::to_vec(&StateFile { version, crc32c: crc, device }).unwrap()
    }

    #[test]
    fn round_trips_and_refuses_what_it_cannot_trust() {
        let s = sample();
        assert_eq!(DeviceState::decode(&encode(&s, STATE_VERSION, false)).unwrap(), s);
        let raw = DeviceState { target: Target::Raw { backing: "/srv/d.img".into() }, ..sample() };
        assert_eq!(DeviceState::decode(&encode(&raw, STATE_VERSION, false)).unwrap(), raw);
        let e = DeviceState::decode(&encode(&s, STATE_VERSION + 1, false)).unwrap_err().to_string();
        assert!(e.contains("newer casblk") && e.contains("upgrade"), "{e}");
        let e = DeviceState::decode(&encode(&s, STATE_VERSION, true)).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        assert!(DeviceState::decode(b"{").is_err());
    }

    #[test]
    fn reads_the_version_1_layout() {
        // As a casblk from before `Shape` wrote it; `upgrade` meets such files.
        let device = serde_json::json!({
            "id": 3, "queues": 2, "depth": 64, "io_buf_bytes": 1048576, "poll_us": 0, "recovery": true,
            "target": { "raw": { "backing": "/srv/d.img" } }
        });
        let crc = cas::format::crc32c(&serde_json::to_vec(&device).unwrap());
        let bytes = serde_json::to_vec(&StateFile { version: 1, crc32c: crc, device }).unwrap();
        let want = DeviceState { target: Target::Raw { backing: "/srv/d.img".into() }, ..sample() };
        assert_eq!(DeviceState::decode(&bytes).unwrap(), want);
    }
}
