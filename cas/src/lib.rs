//! The content-addressed image store: per-image write-ahead logs, shared
//! blake3 chunks, copy-on-write manifests, compaction, reclamation and GC.
//!
//! Every byte goes through [`storage::Storage`], so tests swap in
//! [`storage::MemStorage`] to crash the store and inject faults.
#![deny(unsafe_code)]

pub mod background;
pub mod chunk;
pub mod compact;
pub mod error;
pub mod format;
pub mod fsck;
pub mod gc;
pub mod heap;
pub mod image;
pub mod manifest;
pub mod objects;
pub mod observe;
pub mod publish;
pub mod storage;
pub mod store;
mod sync;
pub mod tasks;
pub mod thread_time;
pub mod units;
pub mod wal;

pub use background::BackgroundCpu;
pub use compact::{CompactReport, CompactStats};
pub use error::{Error, Result};
pub use gc::GcReport;
pub use image::{Image, ImageStats, LogReservation};
pub use store::{ImageInfo, SpaceStats, Store, StoreOptions};
pub use wal::RecordKind;
