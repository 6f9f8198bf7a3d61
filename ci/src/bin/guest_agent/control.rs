//! The harness's channel into the guest: a small raw disk (a plain file
//! on the harness's side) whose first block holds one word, the latest
//! thing the harness said. The guest reads it with O_DIRECT, so its own
//! page cache never hides a new word, and waits for a word it expects.
//!
//! The harness only ever moves forward through distinct words (`stop`,
//! `delete`, ...), so the guest needs no acknowledgement beyond the report
//! line it prints once it has seen one.

use crate::sys::{open_direct, Aligned};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Control {
    path: PathBuf,
}

impl Control {
    pub fn new(path: &str) -> Control {
        Control { path: PathBuf::from(path) }
    }

    /// The word the harness wrote last (empty before the first).
    pub fn word(&self) -> Result<String, String> {
        let f = open_direct(&self.path, false, false)?;
        let mut buf = Aligned::new(4096);
        f.read_at(buf.bytes_mut(), 0).map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        let end = buf.bytes().iter().position(|&b| b == b'\n' || b == 0).unwrap_or(0);
        Ok(String::from_utf8_lossy(&buf.bytes()[..end]).trim().to_string())
    }

    /// True once the harness has said `word`.
    pub fn said(&self, word: &str) -> Result<bool, String> {
        Ok(self.word()? == word)
    }

    /// Waits (bounded) until the harness says `word`.
    pub fn wait_for(&self, word: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.said(word)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the harness did not say '{word}' within {} s", limit.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
