//! Shared helpers for casblk's native benchmark binaries.
#![deny(unsafe_code)]
