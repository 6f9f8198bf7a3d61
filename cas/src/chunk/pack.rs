//! Pack files: append-only containers of 4 KiB chunks, and their header.
//!
//! A pack holds raw chunk bytes in 4 KiB slots behind a one-block header,
//! so every chunk read is one aligned 4 KiB pread. A chunk's hash and
//! checksum live in the index entry that points at its slot (a pointer
//! carries the checksum of what it points to), never in the pack.
//!
//! ```text
//! pack-0000002a.pack
//! +------------------------+ 0
//! | header (4096 bytes)    |
//! +------------------------+ 4096 = slot 0
//! | slot 0: chunk (4 KiB)  |
//! | slot 1: chunk (4 KiB)  |
//! | ...                    |
//! +------------------------+ 4096 + capacity_slots * 4096 at most
//!
//! header (little-endian; bytes 44..4096 are zero):
//!  0        8         12             16         24        28           32               36         40       44
//!  | magic  | version | header_bytes | store_id | pack_id | chunk_bytes | capacity_slots | reserved | crc32c |
//!  "CASPACK\0"  u32      u32 (4096)     u64        u32       u32 (4096)    u32              u32 (0)   of 0..40
//! ```
//!
//! Slots past the last one the index references may hold garbage after a
//! crash (written, never synced); they count as dead space until the pack
//! is repacked by GC.

use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::units::BLOCK_BYTES;
use std::path::Path;
use std::sync::Arc;

/// Bytes of one chunk (and one pack slot).
pub const CHUNK_BYTES: usize = BLOCK_BYTES as usize;
/// Bytes of a pack header, one block; slot 0 starts here, so slots stay
/// block aligned.
pub const PACK_HEADER_BYTES: u64 = BLOCK_BYTES;
/// Format version written by this build.
pub const PACK_VERSION: u32 = 1;
const PACK_MAGIC: [u8; 8] = *b"CASPACK\0";

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 8;
const OFF_HEADER_BYTES: usize = OFF_VERSION + 4;
const OFF_STORE_ID: usize = OFF_HEADER_BYTES + 4;
const OFF_PACK_ID: usize = OFF_STORE_ID + 8;
const OFF_CHUNK_BYTES: usize = OFF_PACK_ID + 4;
const OFF_CAPACITY: usize = OFF_CHUNK_BYTES + 4;
const OFF_RESERVED: usize = OFF_CAPACITY + 4;
const OFF_CRC: usize = OFF_RESERVED + 4;
/// Bytes of the header that carry fields (the rest of the block is zero).
const HEADER_USED_BYTES: usize = OFF_CRC + 4;

/// The decoded header of a pack file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackHeader {
    pub store_id: u64,
    pub pack_id: u32,
    pub capacity_slots: u32,
}

impl PackHeader {
    /// The full 4096-byte header block.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(PACK_HEADER_BYTES as usize);
        e.bytes(&PACK_MAGIC)
            .u32(PACK_VERSION)
            .u32(PACK_HEADER_BYTES as u32)
            .u64(self.store_id)
            .u32(self.pack_id)
            .u32(CHUNK_BYTES as u32)
            .u32(self.capacity_slots)
            .u32(0);
        debug_assert_eq!(e.len(), OFF_CRC);
        e.seal();
        debug_assert_eq!(e.len(), HEADER_USED_BYTES);
        e.buf.resize(PACK_HEADER_BYTES as usize, 0);
        e.buf
    }

    /// Decodes and checks a header block; never panics on hostile input.
    pub fn decode(buf: &[u8], path: &Path) -> Result<PackHeader> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        if buf.len() < HEADER_USED_BYTES {
            return Err(corrupt(format!("pack header is {} bytes, need {HEADER_USED_BYTES}", buf.len())));
        }
        if buf[OFF_MAGIC..OFF_VERSION] != PACK_MAGIC {
            return Err(corrupt("not a pack file (bad magic)".into()));
        }
        let body = format::unseal(&buf[..HEADER_USED_BYTES], path, 0)?;
        let mut d = Decoder::new(&body[OFF_VERSION..]);
        let version = d.u32().unwrap_or(0);
        format::check_version("pack file", version, PACK_VERSION)?;
        let header_bytes = d.u32().unwrap_or(0);
        let store_id = d.u64().unwrap_or(0);
        let pack_id = d.u32().unwrap_or(0);
        let chunk_bytes = d.u32().unwrap_or(0);
        let capacity_slots = d.u32().unwrap_or(0);
        if u64::from(header_bytes) != PACK_HEADER_BYTES || chunk_bytes as usize != CHUNK_BYTES {
            return Err(corrupt(format!(
                "pack geometry {header_bytes}/{chunk_bytes} differs from {PACK_HEADER_BYTES}/{CHUNK_BYTES}"
            )));
        }
        if capacity_slots == 0 {
            return Err(corrupt("pack capacity of 0 slots".into()));
        }
        Ok(PackHeader { store_id, pack_id, capacity_slots })
    }
}

/// Byte offset of `slot` in a pack.
pub fn slot_offset(slot: u32) -> u64 {
    PACK_HEADER_BYTES + u64::from(slot) * CHUNK_BYTES as u64
}

/// Number of slots a pack of `len_bytes` spans (a partial slot counts).
pub fn slots_spanned(len_bytes: u64) -> u64 {
    len_bytes.saturating_sub(PACK_HEADER_BYTES).div_ceil(CHUNK_BYTES as u64)
}

/// Opens pack `id` at `path` and checks it against what the index says of
/// it: the header decodes and names this store and this pack, and the file
/// spans `max_slot`, the highest slot an entry references. Returns the file,
/// its header and the slots its length spans.
pub(crate) fn open_checked(
    storage: &dyn Storage,
    path: &Path,
    store_id: u64,
    id: u32,
    max_slot: u32,
) -> Result<(Arc<dyn StorageFile>, PackHeader, u32)> {
    let corrupt = |offset, detail| Error::Corruption { path: path.to_path_buf(), offset, detail };
    let file = storage.open(path, OpenMode::Existing)?;
    let len = file.len()?;
    let mut head = vec![0u8; PACK_HEADER_BYTES as usize];
    let n = file.read_at(&mut head, 0)?;
    let header = PackHeader::decode(&head[..n], path)?;
    if header.store_id != store_id || header.pack_id != id {
        return Err(corrupt(
            0,
            format!(
                "pack header names store {:#x} pack {}, expected store {store_id:#x} pack {id}",
                header.store_id, header.pack_id
            ),
        ));
    }
    let spanned = slots_spanned(len);
    if u64::from(max_slot) >= spanned || spanned > u64::from(header.capacity_slots) {
        return Err(corrupt(
            slot_offset(max_slot),
            format!(
                "pack spans {spanned} of {} slots but the index references slot {max_slot}",
                header.capacity_slots
            ),
        ));
    }
    Ok((file, header, spanned as u32))
}

/// Largest pack the store accepts (its options are refused past it).
pub const MAX_PACK_BYTES: u64 = 64 << 30;

/// The name of pack `id`'s file ending in `ext`: `pack-<8 hex digits><ext>`
/// (the pack itself, `.pack`; its forward table, `.fwd`).
pub(crate) fn pack_id_file_name(id: u32, ext: &str) -> String {
    format!("pack-{id:08x}{ext}")
}

/// The pack id in a file name `pack_id_file_name` made with `ext`.
pub(crate) fn parse_pack_id_file_name(name: &str, ext: &str) -> Option<u32> {
    let hex = name.strip_prefix("pack-")?.strip_suffix(ext)?;
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// The file name of pack `id`.
pub fn pack_file_name(id: u32) -> String {
    pack_id_file_name(id, ".pack")
}

/// The pack id named by a file name, if it is a pack file name.
pub fn parse_pack_file_name(name: &str) -> Option<u32> {
    parse_pack_id_file_name(name, ".pack")
}

/// Decodes hostile bytes as a pack header (the fuzz entry point).
pub fn fuzz_decode_pack_header(bytes: &[u8]) -> Result<PackHeader> {
    PackHeader::decode(bytes, Path::new("<fuzz>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = PackHeader { store_id: 0xdead_beef, pack_id: 42, capacity_slots: 16384 };
        let buf = h.encode();
        assert_eq!(buf.len(), PACK_HEADER_BYTES as usize);
        assert_eq!(PackHeader::decode(&buf, Path::new("p")).unwrap(), h);
        for i in 0..HEADER_USED_BYTES {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(PackHeader::decode(&bad, Path::new("p")).is_err(), "flip at byte {i} accepted");
        }
        assert!(PackHeader::decode(&buf[..20], Path::new("p")).is_err());
    }

    #[test]
    fn newer_version_is_refused() {
        let mut e = Encoder::default();
        e.bytes(&PACK_MAGIC).u32(PACK_VERSION + 1).u32(4096).u64(1).u32(1).u32(4096).u32(8).u32(0).seal();
        assert!(matches!(
            PackHeader::decode(&e.buf, Path::new("p")),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
    }

    #[test]
    fn file_names() {
        assert_eq!(pack_file_name(0x2a), "pack-0000002a.pack");
        assert_eq!(parse_pack_file_name("pack-0000002a.pack"), Some(0x2a));
        assert_eq!(parse_pack_file_name("pack-2a.pack"), None);
        assert_eq!(parse_pack_file_name("pack-0000002g.pack"), None);
        assert_eq!(parse_pack_file_name("index"), None);
        assert_eq!(slot_offset(0), 4096);
        assert_eq!(slots_spanned(4096), 0);
        assert_eq!(slots_spanned(4097), 1);
        assert_eq!(slots_spanned(4096 * 3), 2);
    }
}
