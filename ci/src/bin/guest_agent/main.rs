//! The guest side of the VM tests that run a virtual machine on casblk
//! disks (`ci/guest/`, `ci/e2e/t-guest-*.sh`): PID 1 of a small guest.
//!
//! The guest boots the test VM's own kernel under QEMU, with its root
//! filesystem (ext4) on a casblk image attached as virtio-blk; the
//! initramfs (`ci/guest/initrd-init`) mounts that root and runs this
//! program as `/sbin/init`. It reads what to do from the kernel command
//! line (`casblk.role=...`), reports every step on the console as one line
//! starting with `casblk-guest: ` (the harness reads the console file), and
//! waits for the harness at agreed points on a control disk
//! (`control.rs`). It ends by unmounting, syncing and rebooting, which
//! makes QEMU (started with `-no-reboot`) exit.
//!
//! Roles (`roles.rs`): `main` (mkfs a data disk, write and fsync files and
//! run a verifier while the harness kills, recovers and upgrades the
//! store daemon, freeze the root while the harness snapshots it, then
//! discard), `clone` (boot from a clone of that snapshot and write only
//! its own data; given the first boot's data disk, read back every file
//! fsynced there: that disk's reboot), `demo` (read every
//! file of a data disk, for `ci/demo --guest`).
//!
//! Nothing here runs on a host: it is a tool of the test suite, built by
//! cargo like the benchmarks and copied into the guest's root image.

mod console;
mod control;
mod files;
mod klog;
mod roles;
mod sys;
mod trim;
mod verify;

use console::say;
use std::collections::HashMap;

/// The settings the harness put on the kernel command line as
/// `casblk.KEY=VALUE`.
pub struct Params(HashMap<String, String>);

impl Params {
    fn from_cmdline(cmdline: &str) -> Params {
        Params(
            cmdline
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("casblk."))
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The value of `casblk.KEY`, or an error naming it.
    pub fn get(&self, key: &str) -> Result<&str, String> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("casblk.{key} is not on the kernel command line"))
    }

    /// The value of `casblk.KEY` as a number.
    pub fn number(&self, key: &str) -> Result<u64, String> {
        let v = self.get(key)?;
        v.parse().map_err(|_| format!("casblk.{key}={v} is not a number"))
    }
}

fn main() {
    let rc = match run() {
        Ok(()) => 0,
        Err(e) => {
            say(&format!("FAIL {e}"));
            1
        }
    };
    sys::shut_down(rc);
}

fn run() -> Result<(), String> {
    sys::mount_basics()?;
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("reading /proc/cmdline: {e}"))?;
    let params = Params::from_cmdline(&cmdline);
    say(&format!("up uptime_s={:.1} role={}", sys::uptime_s(), params.get("role")?));
    match params.get("role")? {
        "main" => roles::main(&params),
        "clone" => roles::clone(&params),
        "demo" => roles::demo(&params),
        "idle" => Ok(()),
        other => Err(format!("unknown role {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::Params;

    #[test]
    fn reads_only_its_own_settings() {
        let p =
            Params::from_cmdline("console=ttyS0 casblk.role=main casblk.seed=7 root=/dev/vda casblk.bad\n");
        assert_eq!(p.get("role").unwrap(), "main");
        assert_eq!(p.number("seed").unwrap(), 7);
        assert!(p.get("root").is_err());
        assert!(p.get("bad").is_err());
        assert!(Params::from_cmdline("casblk.seed=x").number("seed").is_err());
    }
}
