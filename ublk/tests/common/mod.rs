//! What the command-line tests share: running the built `casblk`.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `casblk --store STORE ARGS...`, waited for.
pub fn casblk(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_casblk"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("casblk runs")
}
