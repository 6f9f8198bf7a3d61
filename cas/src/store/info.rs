//! `image info`: what one image holds and what it shares.
//!
//! Logical bytes are the blocks its manifest maps (its log not yet
//! compacted is reported apart, when the image is open). Unique bytes are
//! the distinct chunks no other image, snapshot or clone references;
//! shared bytes, the distinct chunks some other one does too. Finding
//! them reads every manifest once, holding this image's distinct chunk
//! names in memory: refused, with the figure, beyond the store's budget.

use super::files::ImageKind;
use super::Store;
use crate::chunk::ChunkTag;
use crate::error::{Error, Result};
use crate::units::BLOCK_BYTES;
use std::collections::HashSet;

/// Bytes one distinct chunk name costs while counting (hash set entry).
const COUNT_ENTRY_BYTES: u64 = 48;

/// The answer of `image info`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageDetail {
    pub name: String,
    pub kind: ImageKind,
    pub size_bytes: u64,
    /// Bytes the manifest maps (compacted data).
    pub logical_bytes: u64,
    /// Distinct chunks only this image references, in bytes.
    pub unique_bytes: u64,
    /// Distinct chunks this image and some other reference, in bytes.
    pub shared_bytes: u64,
    /// Log bytes not yet compacted (open images; 0 otherwise).
    pub log_bytes: u64,
    /// Its snapshots (`IMAGE@SNAP`), by name.
    pub snapshots: Vec<String>,
    /// The image a snapshot was taken of, or the snapshot a clone was made from.
    pub parent: Option<String>,
    /// Clones made from it (snapshots only).
    pub clones: Vec<String>,
}

impl Store {
    /// Sizes, sharing, snapshots and parent of image `name`.
    pub fn image_info(&self, name: &str) -> Result<ImageDetail> {
        let images = self.list_images()?;
        let me =
            images.iter().find(|i| i.name == name).ok_or_else(|| Error::NotFound(format!("image {name}")))?;
        let manifest = self.manifest(name)?;
        let mapped = manifest.stats().mapped_blocks;
        let need = mapped * COUNT_ENTRY_BYTES;
        if need > self.opts.memory_budget_bytes {
            return Err(Error::MemoryBudget(format!(
                "counting the {mapped} mapped blocks of {name} needs {need} bytes, above the store's budget of {}",
                self.opts.memory_budget_bytes
            )));
        }
        let mut mine: HashSet<ChunkTag> = HashSet::with_capacity(mapped as usize);
        for entry in manifest.iter() {
            mine.insert(entry?.1.tag);
        }
        let mut shared: HashSet<ChunkTag> = HashSet::new();
        for other in images.iter().filter(|i| i.name != name) {
            for entry in self.manifest(&other.name)?.iter() {
                let tag = entry?.1.tag;
                if mine.contains(&tag) {
                    shared.insert(tag);
                }
            }
        }
        let open = self.opened(name);
        let log_bytes = open.map_or(0, |i| i.log_used_bytes());
        let distinct = mine.len() as u64;
        let (snapshots, clones) = super::snapshot::dependents(&images, name);
        Ok(ImageDetail {
            name: name.to_string(),
            kind: me.kind,
            size_bytes: me.size_bytes,
            logical_bytes: mapped * BLOCK_BYTES,
            unique_bytes: (distinct - shared.len() as u64) * BLOCK_BYTES,
            shared_bytes: shared.len() as u64 * BLOCK_BYTES,
            log_bytes,
            snapshots,
            parent: me.origin.clone(),
            clones,
        })
    }
}
