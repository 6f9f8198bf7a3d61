//! The store's bucket: everything of the object-store tier, in one room
//! above the chunk store. "Remote" names the bucket and its settings
//! ([`RemoteOptions`], `casblk --remote`); "publish" names putting an
//! image's manifest there.
//!
//! ```text
//! bucket/
//!   options.rs   RemoteOptions: how a store uses its bucket (the store
//!                assembles it, StoreOptions::remote, and hands it down)
//!   packs/       the chunk store's sealed packs: catalog, host slot,
//!                uploads, reads of packs only in the bucket, other
//!                stores' packs adopted (cross-host dedup); the chunk
//!                core sees it only through crate::chunk::tier
//!   manifests/   publication of open images' manifests, their leases,
//!                superseded objects, and images fetched from the bucket
//!   fuzz.rs      the fuzz entry for this tier's formats (each owner
//!                decodes its own)
//! ```
//!
//! Objects in the bucket: `hostslot/`, `packs/`, `packidx/` (packs/),
//! `images/<name>/` (manifests/); the object store itself is
//! `crate::objects` (a port the `casblk-remote` crate implements over S3).

mod fuzz;
pub mod manifests;
mod options;
pub mod packs;

pub use fuzz::{fuzz_decode_remote, fuzz_sample_remote};
pub use options::RemoteOptions;
