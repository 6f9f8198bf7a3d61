//! What a new device asks the driver for beyond its shape, and the ADD_DEV
//! flags that follow from it on the driver at hand: what happens to IO
//! while no daemon serves the device (`--on-daemon-loss`), whether the
//! host scans the device for partitions (`--partitions`), and user copy
//! where the target wants it.
//!
//! ```text
//!  on-daemon-loss queue  USER_RECOVERY | USER_RECOVERY_REISSUE (6.1/6.2+): IO waits
//!                        for the next daemon, in-flight requests are reissued
//!  on-daemon-loss fail   USER_RECOVERY | USER_RECOVERY_FAIL_IO (6.13+): IO fails at
//!                        once (EIO) until a daemon takes the device over again
//!  partitions off        NO_AUTO_PART_SCAN (7.0+): a guest's partition table, LVM or
//!                        RAID signature is not activated on the host
//! ```

use anyhow::{bail, Result};
use libublk::sys;
use serde::{Deserialize, Serialize};

/// What happens to a device's IO while no daemon serves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DaemonLoss {
    /// IO waits (bounded by nothing but the next daemon) and in-flight
    /// requests are reissued to it: a crash or an upgrade is a pause.
    #[default]
    Queue,
    /// IO fails at once with an error until a daemon serves the device
    /// again, for users who prefer fast errors to held IO.
    Fail,
}

/// A new device's options, as `add` takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub on_daemon_loss: DaemonLoss,
    /// The host scans the device for partitions (as 6.12's driver always
    /// does); off by default where the driver can turn the scan off.
    #[serde(default)]
    pub partitions: bool,
}

const RECOVERY: u64 = sys::UBLK_F_USER_RECOVERY as u64;
const REISSUE: u64 = sys::UBLK_F_USER_RECOVERY_REISSUE as u64;
const FAIL_IO: u64 = sys::UBLK_F_USER_RECOVERY_FAIL_IO as u64;
const NO_PART_SCAN: u64 = sys::UBLK_F_NO_AUTO_PART_SCAN as u64;
const USER_COPY: u64 = sys::UBLK_F_USER_COPY as u64;

impl Policy {
    pub fn is_default(&self) -> bool {
        *self == Policy::default()
    }

    /// The ADD_DEV flags for a new device on a driver offering `features`
    /// (None: a driver too old to answer GET_FEATURES). Refuses, in one
    /// line naming the kernel needed, an option the driver cannot honour;
    /// a driver without user recovery gets a device whose IO fails when
    /// its daemon dies, said once, as before.
    pub fn add_flags(&self, features: Option<u64>, user_copy: bool) -> Result<u64> {
        let offered = features.unwrap_or(0);
        let has = |f: u64| offered & f == f;
        let mut flags = match self.on_daemon_loss {
            DaemonLoss::Queue if has(RECOVERY | REISSUE) => RECOVERY | REISSUE,
            DaemonLoss::Queue => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        "this ublk driver has no user recovery with reissue: if the daemon dies, its devices' IO fails"
                    )
                });
                0
            }
            DaemonLoss::Fail if has(RECOVERY | FAIL_IO) => RECOVERY | FAIL_IO,
            DaemonLoss::Fail => bail!(
                "--on-daemon-loss fail needs the ublk driver's USER_RECOVERY_FAIL_IO (Linux 6.13 or newer); \
                 this driver does not offer it (features {offered:#x})"
            ),
        };
        if user_copy && has(USER_COPY) {
            flags |= USER_COPY;
        }
        if !self.partitions && has(NO_PART_SCAN) {
            flags |= NO_PART_SCAN;
        }
        Ok(flags)
    }
}

impl Policy {
    /// Whether a device with driver flags `flags`, added on a driver
    /// offering `features`, has what this policy asks for (a store daemon
    /// from before the policy existed ignores it).
    pub fn applied(&self, features: Option<u64>, flags: u64) -> bool {
        let mask = FAIL_IO | NO_PART_SCAN;
        self.add_flags(features, false).is_ok_and(|want| want & mask == flags & mask)
    }
}

/// Whether a device with driver flags `flags` fails IO while no daemon
/// serves it (added with `--on-daemon-loss fail`).
pub fn fails_io_without_daemon(flags: u64) -> bool {
    flags & FAIL_IO != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_73: u64 = RECOVERY | REISSUE | FAIL_IO | NO_PART_SCAN | USER_COPY;
    const ALL_612: u64 = RECOVERY | REISSUE | USER_COPY;

    #[test]
    fn defaults_queue_io_and_keep_the_host_from_scanning_where_it_can() {
        let p = Policy::default();
        assert_eq!(p.add_flags(Some(ALL_73), true).unwrap(), RECOVERY | REISSUE | USER_COPY | NO_PART_SCAN);
        assert_eq!(p.add_flags(Some(ALL_612), false).unwrap(), RECOVERY | REISSUE);
        assert_eq!(p.add_flags(None, true).unwrap(), 0);
    }

    #[test]
    fn fail_never_carries_reissue_and_is_refused_without_the_flag() {
        let p = Policy { on_daemon_loss: DaemonLoss::Fail, partitions: true };
        let flags = p.add_flags(Some(ALL_73), false).unwrap();
        assert_eq!(flags, RECOVERY | FAIL_IO);
        assert!(fails_io_without_daemon(flags));
        let e = p.add_flags(Some(ALL_612), false).unwrap_err().to_string();
        assert!(e.contains("6.13") && !e.contains('\n'), "{e}");
        assert!(p.applied(Some(ALL_73), RECOVERY | FAIL_IO | USER_COPY));
        assert!(!p.applied(Some(ALL_73), RECOVERY | REISSUE | NO_PART_SCAN), "an older daemon's device");
    }

    #[test]
    fn the_policy_travels_as_json_and_defaults_when_absent() {
        let p: Policy = serde_json::from_str("{}").unwrap();
        assert!(p.is_default());
        let p: Policy = serde_json::from_str(r#"{"on_daemon_loss":"fail","partitions":true}"#).unwrap();
        assert_eq!(p, Policy { on_daemon_loss: DaemonLoss::Fail, partitions: true });
    }
}
