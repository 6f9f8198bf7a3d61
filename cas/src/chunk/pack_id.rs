//! Pack ids, and where a pack is in its life beyond the local disk.
//!
//! A pack id is `host_slot << SEQ_BITS | seq`. A store without a tier
//! (crate::chunk::tier) gives out ids of host slot 0; a store whose packs
//! go to a bucket gives out ids of the host slot it claimed there, so the
//! ids of the stores sharing a bucket never meet. Packs of slot 0 (from
//! before the store had a tier) are never uploaded.

/// Bits of a pack id below the host slot.
pub const SEQ_BITS: u32 = 24;

/// The first pack id of `host_slot`'s range.
pub fn first_pack_id(host_slot: u8) -> u32 {
    u32::from(host_slot) << SEQ_BITS | 1
}

/// True when pack `id` is in `host_slot`'s range.
pub fn owns(host_slot: u8, id: u32) -> bool {
    id >> SEQ_BITS == u32::from(host_slot)
}

/// True for a pack from before the store had a tier (host slot 0).
pub fn before_tier(id: u32) -> bool {
    id >> SEQ_BITS == 0
}

/// Where a pack is in its upload (what the tier lists of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackPhase {
    /// Frozen and durable locally; its upload may not have begun.
    Sealed,
    /// The object store holds it whole, with its slot index.
    Uploaded,
    /// Another store's uploaded pack that a manifest here names (an image
    /// fetched from the bucket): read from the bucket, never written.
    Foreign,
}
