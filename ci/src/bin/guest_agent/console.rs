//! Reports to the harness: one line per event on the console, prefixed so
//! the harness can tell them from the kernel's messages.

use std::io::Write;

/// The prefix of every report line; `ci/guest/lib.sh` greps for it.
pub const PREFIX: &str = "casblk-guest: ";

/// Prints `PREFIX` + `line` + ` at_s=`(the guest's uptime, for the
/// harness's account of where a boot's time went) and flushes, so the line
/// is on the serial port before the next step starts (a step may hang; its
/// predecessor must show).
pub fn say(line: &str) {
    let at_s = crate::sys::uptime_s();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line} at_s={at_s:.1}");
    let _ = out.flush();
}
