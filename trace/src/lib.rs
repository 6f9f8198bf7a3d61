//! Per-request phases, gate reasons, histograms and slowest examples.
#![deny(unsafe_code)]

mod gate;

pub use gate::Gate;
