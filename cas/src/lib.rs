//! The content-addressed image store: per-image write-ahead logs, shared
//! blake3 chunks, copy-on-write manifests, compaction, reclamation and GC.
//!
//! Every byte goes through [`storage::Storage`], so tests swap in
//! [`storage::MemStorage`] to crash the store and inject faults.
//!
//! # Layers
//!
//! Every module of this crate is in one layer. A module imports only from
//! its own layer or below; a lower layer that needs something from above
//! defines a trait (`chunk::tier`, `image::ManifestView`) or takes a
//! closure (`gc::auto`'s pass, the compactor's wait for upload room).
//! `cas/tests/layers.rs` reads the block below and checks every import
//! against it; docs/design.md ("Layers of cas") carries the same block.
//!
//! ```text
//! layer     modules (a module imports only from its own row or rows below)
//! tools     fsck
//! facade    store
//! services  bucket compact gc
//! trees     manifest
//! data      chunk image
//! records   dedup objects wal
//! base      background cache error format heap io observe report space storage sync tasks thread_time units
//! ```
#![deny(unsafe_code)]

pub mod background;
pub mod bucket;
pub(crate) mod cache;
pub mod chunk;
pub mod compact;
pub mod dedup;
pub mod error;
pub mod format;
pub mod fsck;
pub mod gc;
pub mod heap;
pub mod image;
pub mod io;
pub mod manifest;
pub mod objects;
pub mod observe;
pub mod report;
pub mod space;
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
pub use store::{
    DamagedBlock, ImageInfo, ScrubFinding, ScrubOptions, ScrubProgress, ScrubReport, SpaceStats, Store,
    StoreOptions,
};
pub use wal::RecordKind;
