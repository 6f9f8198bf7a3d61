//! Reports to the harness: one line per event on the console, prefixed so
//! the harness can tell them from the kernel's messages.

use std::io::Write;

/// The prefix of every report line; `ci/guest/lib.sh` greps for it.
pub const PREFIX: &str = "casblk-guest: ";

/// Prints `PREFIX` + `line` and flushes, so the line is on the serial port
/// before the next step starts (a step may hang; its predecessor must show).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}
