//! Admission and scheduling: descriptor snapshots, read bypass, log-capacity
//! waits and deficit round robin across images.
#![deny(unsafe_code)]
