//! Manifest tree pages: their byte layout, encoder and checked decoder.
//!
//! The tree is a radix tree over block numbers. A leaf (level 0) maps 126
//! consecutive blocks; an interior page at level L has 338 children, each
//! covering `126 * 338^(L-1)` blocks. A page's position is implied by the
//! path to it, and the page repeats it (`level`, `first_block`) so a page
//! read from the wrong place is caught even when its checksum is fine.
//! Parents hold each child's page number *and* crc32c, so a lost or
//! misdirected write of a child is caught on read.
//!
//! ```text
//! every page (4096 bytes, little-endian):
//!  0          8         12     13      14      16            24            32
//!  | magic    | version | kind | level | count | first_block | generation  | body ... | crc32c @ 4092 |
//!  "CASMPAGE"   u32       1|2    u8      u16     u64           u64 (writer)             of bytes 0..4092
//!
//! leaf body (kind 1, level 0):                interior body (kind 2, level 1..=7):
//!  32           48                             32
//!  | present    | 126 x entry [u8; 32]        | 338 x child { page u64, crc32c u32 }  (page 0 = no child)
//!    u128 bitmap  (absent: zero bytes)         ends at 4088
//!  ends at 4080
//!
//! leaf entry, version 2 (a ChunkRef):          version 1 (written before stage 1 of
//!  0            20        24        28    32    the on-disk index):
//!  | tag [u8;20]| pack u32| slot u32| crc |      | blake3 hash [u8; 32] |
//!  unlocated: pack, slot and crc are 0
//! ```
//!
//! Bytes between the end of the body and the crc are zero. `count` is the
//! number of present entries (leaf) or children (interior); `generation`
//! is the commit that wrote the page, never above the root's.
//!
//! Versions: every page is written as version 2. Version 1 pages still
//! decode: a v1 leaf's entries read as unlocated refs (the hash's first 20
//! bytes), and a v1 leaf that a commit edits is written back as v2 (its
//! untouched entries unlocated). Interior pages are the same in both.

use crate::chunk::{ChunkHash, ChunkRef, ChunkTag};
use crate::error::{Error, Result};
use crate::format;
use std::path::Path;

pub const PAGE_BYTES: usize = 4096;
/// Pages 0 and 1 of a manifest file are the root slots (root.rs); tree
/// pages start here.
pub const FIRST_TREE_PAGE: u64 = 2;
pub const PAGE_VERSION: u32 = 2;
/// Leaves written before locations: each entry is a whole blake3 hash.
const VERSION_HASH_LEAVES: u32 = 1;
/// Blocks mapped by one leaf.
pub const LEAF_ENTRIES: usize = 126;
/// Children of one interior page.
pub const FANOUT: usize = 338;
/// Highest level: a level-7 page covers more than 2^64 blocks.
pub const MAX_LEVEL: u8 = 7;

const PAGE_MAGIC: [u8; 8] = *b"CASMPAGE";
const KIND_LEAF: u8 = 1;
const KIND_INTERIOR: u8 = 2;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 8;
const OFF_KIND: usize = OFF_VERSION + 4;
const OFF_LEVEL: usize = OFF_KIND + 1;
const OFF_COUNT: usize = OFF_LEVEL + 1;
const OFF_FIRST_BLOCK: usize = OFF_COUNT + 2;
const OFF_GENERATION: usize = OFF_FIRST_BLOCK + 8;
const OFF_BODY: usize = OFF_GENERATION + 8;
const OFF_PRESENT: usize = OFF_BODY;
const OFF_ENTRIES: usize = OFF_PRESENT + 16;
const ENTRY_BYTES: usize = ChunkRef::BYTES;
const LEAF_END: usize = OFF_ENTRIES + LEAF_ENTRIES * ENTRY_BYTES;
const CHILD_BYTES: usize = 8 + 4;
/// What an absent leaf entry holds: zero bytes.
const ABSENT: [u8; ENTRY_BYTES] = [0; ENTRY_BYTES];
const INTERIOR_END: usize = OFF_BODY + FANOUT * CHILD_BYTES;
const OFF_CRC: usize = PAGE_BYTES - 4;

const _: () = assert!(LEAF_END <= OFF_CRC && INTERIOR_END <= OFF_CRC);
const _: () = assert!(LEAF_ENTRIES <= 128, "the present bitmap is a u128");
const _: () = assert!(ChunkHash::BYTES == ENTRY_BYTES, "v1 and v2 entries have one size");

/// Blocks covered by one page at `level`: 126 * 338^level (u128: level 7
/// exceeds u64).
pub fn span_blocks(level: u8) -> u128 {
    LEAF_ENTRIES as u128 * (FANOUT as u128).pow(u32::from(level))
}

/// Leaves covered by one page at `level`: 338^level.
pub fn span_leaves(level: u8) -> u64 {
    (FANOUT as u64).pow(u32::from(level))
}

/// A pointer to a page: its page number in the manifest file and the
/// crc32c the page must carry. Page 0 (a root slot) means "no page".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildRef {
    pub page: u64,
    pub crc: u32,
}

impl ChildRef {
    pub const NONE: ChildRef = ChildRef { page: 0, crc: 0 };

    pub fn is_none(&self) -> bool {
        self.page == 0
    }
}

/// Entries of a leaf, kept as stored so a page decodes and encodes back to
/// the same bytes whatever its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafBody {
    pub present: u128,
    entries: [[u8; ENTRY_BYTES]; LEAF_ENTRIES],
    version: u32,
}

impl Default for LeafBody {
    fn default() -> Self {
        LeafBody { present: 0, entries: [ABSENT; LEAF_ENTRIES], version: PAGE_VERSION }
    }
}

impl LeafBody {
    pub fn get(&self, i: usize) -> Option<ChunkRef> {
        if self.present >> i & 1 == 0 {
            return None;
        }
        let e = &self.entries[i];
        if self.version == VERSION_HASH_LEAVES {
            let tag = ChunkTag::from_bytes(e[..ChunkTag::BYTES].try_into().expect("20 bytes"));
            return Some(ChunkRef { tag, at: None });
        }
        // Canonical: checked when decoded, and edits refuse pack 0.
        ChunkRef::decode(e)
    }

    pub fn set(&mut self, i: usize, r: Option<ChunkRef>) {
        if self.version == VERSION_HASH_LEAVES {
            // A v1 leaf becomes v2: each hash keeps the tag it starts with.
            for e in self.entries.iter_mut() {
                e[ChunkTag::BYTES..].fill(0);
            }
            self.version = PAGE_VERSION;
        }
        match r {
            Some(r) => {
                self.present |= 1 << i;
                self.entries[i] = r.encode();
            }
            None => {
                self.present &= !(1 << i);
                self.entries[i] = ABSENT;
            }
        }
    }

    pub fn count(&self) -> u32 {
        self.present.count_ones()
    }

    /// The page version the leaf encodes as (1 only for an unedited v1 leaf).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Sets entry `i` of a version 1 leaf to `hash` (tests of the v1 upgrade).
    #[doc(hidden)]
    pub fn v1_with(entries: &[(usize, ChunkHash)]) -> LeafBody {
        let mut l = LeafBody { version: VERSION_HASH_LEAVES, ..LeafBody::default() };
        for &(i, h) in entries {
            l.present |= 1 << i;
            l.entries[i] = *h.as_bytes();
        }
        l
    }
}

/// Children of an interior page (the same in every version; the one it
/// was read as is kept, so it encodes back to the same bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InteriorBody {
    pub children: [ChildRef; FANOUT],
    version: u32,
}

impl Default for InteriorBody {
    fn default() -> Self {
        InteriorBody { children: [ChildRef::NONE; FANOUT], version: PAGE_VERSION }
    }
}

impl InteriorBody {
    pub fn count(&self) -> u32 {
        self.children.iter().filter(|c| !c.is_none()).count() as u32
    }
}

// Pages live behind an Arc in the cache; boxing a variant would add a
// second pointer chase to every lookup for ~1.3 KiB saved on leaves.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Leaf(LeafBody),
    Interior(InteriorBody),
}

/// A decoded page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub level: u8,
    pub first_block: u64,
    pub generation: u64,
    /// The page's own crc32c (what its parent's pointer carries).
    pub crc: u32,
    pub body: Body,
}

/// What the pointer that led to a page says it must be.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub level: u8,
    pub first_block: u64,
    pub crc: u32,
    /// Pages past this are not part of the file's committed tree.
    pub file_pages: u64,
    pub max_generation: u64,
}

/// Encodes a page into `out` (appends exactly 4096 bytes); returns its crc.
pub fn encode(level: u8, first_block: u64, generation: u64, body: &Body, out: &mut Vec<u8>) -> u32 {
    let start = out.len();
    let (kind, count, version) = match body {
        Body::Leaf(l) => (KIND_LEAF, l.count(), l.version),
        Body::Interior(i) => (KIND_INTERIOR, i.count(), i.version),
    };
    out.extend_from_slice(&PAGE_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.push(kind);
    out.push(level);
    out.extend_from_slice(&(count as u16).to_le_bytes());
    out.extend_from_slice(&first_block.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    match body {
        Body::Leaf(l) => {
            out.extend_from_slice(&l.present.to_le_bytes());
            for e in &l.entries {
                out.extend_from_slice(e);
            }
        }
        Body::Interior(i) => {
            for c in &i.children {
                out.extend_from_slice(&c.page.to_le_bytes());
                out.extend_from_slice(&c.crc.to_le_bytes());
            }
        }
    }
    out.resize(start + OFF_CRC, 0);
    let crc = format::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, PAGE_BYTES);
    crc
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Decodes and checks a page. With `expect`, the page must also be the
/// one its pointer names. Never panics on hostile bytes.
pub fn decode(buf: &[u8], expect: Option<Expect>, path: &Path, offset: u64) -> Result<Page> {
    let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset, detail };
    if buf.len() != PAGE_BYTES {
        return Err(corrupt(format!("manifest page is {} bytes, not {PAGE_BYTES}", buf.len())));
    }
    if buf[OFF_MAGIC..OFF_VERSION] != PAGE_MAGIC {
        return Err(corrupt("not a manifest page (bad magic)".into()));
    }
    let crc = le_u32(buf, OFF_CRC);
    let actual = format::crc32c(&buf[..OFF_CRC]);
    if actual != crc {
        return Err(Error::ChecksumMismatch { path: path.to_path_buf(), offset, expected: crc, actual });
    }
    let version = le_u32(buf, OFF_VERSION);
    format::check_version("manifest page", version, PAGE_VERSION)?;
    let kind = buf[OFF_KIND];
    let level = buf[OFF_LEVEL];
    let count = u32::from(u16::from_le_bytes([buf[OFF_COUNT], buf[OFF_COUNT + 1]]));
    let first_block = le_u64(buf, OFF_FIRST_BLOCK);
    let generation = le_u64(buf, OFF_GENERATION);
    if let Some(e) = expect {
        if e.crc != crc {
            return Err(Error::ChecksumMismatch {
                path: path.to_path_buf(),
                offset,
                expected: e.crc,
                actual: crc,
            });
        }
        if e.level != level || e.first_block != first_block {
            return Err(corrupt(format!(
                "page is level {level} at block {first_block}, its parent expects level {} at block {}",
                e.level, e.first_block
            )));
        }
        if generation > e.max_generation {
            return Err(corrupt(format!("page generation {generation} is newer than its root's")));
        }
    }
    if level > MAX_LEVEL || u128::from(first_block) % span_blocks(level) != 0 {
        return Err(corrupt(format!("level {level} page cannot start at block {first_block}")));
    }
    let end = match kind {
        KIND_LEAF if level == 0 => LEAF_END,
        KIND_INTERIOR if level > 0 => INTERIOR_END,
        _ => return Err(corrupt(format!("page kind {kind} at level {level}"))),
    };
    if buf[end..OFF_CRC].iter().any(|&b| b != 0) {
        return Err(corrupt("nonzero bytes after the page body".into()));
    }
    let body = if kind == KIND_LEAF {
        let mut leaf = LeafBody {
            present: u128::from_le_bytes(buf[OFF_PRESENT..OFF_ENTRIES].try_into().expect("16 bytes")),
            version,
            ..LeafBody::default()
        };
        if leaf.present >> LEAF_ENTRIES != 0 {
            return Err(corrupt("leaf present bits beyond its entries".into()));
        }
        for (i, e) in leaf.entries.iter_mut().enumerate() {
            let at = OFF_ENTRIES + i * ENTRY_BYTES;
            *e = buf[at..at + ENTRY_BYTES].try_into().expect("an entry's bytes");
            if leaf.present >> i & 1 == 0 {
                if *e != ABSENT {
                    return Err(corrupt(format!("absent leaf entry {i} is not zeroed")));
                }
            } else if version != VERSION_HASH_LEAVES && ChunkRef::decode(e).is_none() {
                return Err(corrupt(format!("leaf entry {i} has a slot or crc but no pack")));
            }
        }
        Body::Leaf(leaf)
    } else {
        let mut node = InteriorBody { version, ..InteriorBody::default() };
        let child_span = span_blocks(level - 1);
        for (i, c) in node.children.iter_mut().enumerate() {
            let at = OFF_BODY + i * CHILD_BYTES;
            *c = ChildRef { page: le_u64(buf, at), crc: le_u32(buf, at + 8) };
            if c.is_none() {
                if c.crc != 0 {
                    return Err(corrupt(format!("empty child {i} carries a checksum")));
                }
                continue;
            }
            if u128::from(first_block) + i as u128 * child_span > u128::from(u64::MAX) {
                return Err(corrupt(format!("child {i} lies beyond block 2^64")));
            }
            let limit = expect.map_or(u64::MAX, |e| e.file_pages);
            if c.page < FIRST_TREE_PAGE || c.page >= limit {
                return Err(corrupt(format!("child {i} points at page {} outside the tree", c.page)));
            }
        }
        Body::Interior(node)
    };
    let real = match &body {
        Body::Leaf(l) => l.count(),
        Body::Interior(n) => n.count(),
    };
    if real != count || real == 0 {
        return Err(corrupt(format!("page claims {count} entries and holds {real}")));
    }
    Ok(Page { level, first_block, generation, crc, body })
}

/// Decodes hostile bytes as a manifest page (the fuzz entry point).
pub fn fuzz_decode_page(bytes: &[u8]) -> Result<Page> {
    decode(bytes, None, Path::new("<fuzz>"), 0)
}

/// Encodes a decoded page again: pages are canonical, so this gives back
/// exactly the bytes `fuzz_decode_page` accepted.
pub fn fuzz_encode_page(page: &Page) -> Vec<u8> {
    let mut out = Vec::with_capacity(PAGE_BYTES);
    encode(page.level, page.first_block, page.generation, &page.body, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> Page {
        let mut l = LeafBody::default();
        l.set(0, Some(ChunkHash::from_bytes([1; 32]).into()));
        let at = Some(crate::chunk::ChunkLoc { pack: 3, slot: 4, crc: 5 });
        l.set(125, Some(ChunkRef { tag: ChunkHash::from_bytes([2; 32]).tag(), at }));
        Page { level: 0, first_block: 126 * 5, generation: 3, crc: 0, body: Body::Leaf(l) }
    }

    fn roundtrip(p: &Page) -> Page {
        let mut out = Vec::new();
        let crc = encode(p.level, p.first_block, p.generation, &p.body, &mut out);
        let e =
            Expect { level: p.level, first_block: p.first_block, crc, file_pages: 100, max_generation: 3 };
        let got = decode(&out, Some(e), Path::new("m"), 0).unwrap();
        assert_eq!(got.crc, crc);
        got
    }

    #[test]
    fn pages_round_trip() {
        let l = leaf();
        let got = roundtrip(&l);
        assert_eq!(got.body, l.body);
        let mut n = InteriorBody::default();
        n.children[3] = ChildRef { page: 7, crc: 99 };
        let p = Page { level: 2, first_block: 0, generation: 1, crc: 0, body: Body::Interior(n) };
        assert_eq!(roundtrip(&p).body, p.body);
    }

    #[test]
    fn every_bit_flip_is_caught() {
        let l = leaf();
        let mut out = Vec::new();
        encode(l.level, l.first_block, l.generation, &l.body, &mut out);
        for i in (0..PAGE_BYTES).step_by(7) {
            let mut bad = out.clone();
            bad[i] ^= 0x04;
            assert!(decode(&bad, None, Path::new("m"), 0).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn misplaced_pages_are_caught() {
        let l = leaf();
        let mut out = Vec::new();
        let crc = encode(l.level, l.first_block, l.generation, &l.body, &mut out);
        let wrong_block = Expect { level: 0, first_block: 0, crc, file_pages: 100, max_generation: 9 };
        assert!(matches!(decode(&out, Some(wrong_block), Path::new("m"), 0), Err(Error::Corruption { .. })));
        let wrong_crc =
            Expect { level: 0, first_block: 630, crc: crc ^ 1, file_pages: 100, max_generation: 9 };
        assert!(matches!(
            decode(&out, Some(wrong_crc), Path::new("m"), 0),
            Err(Error::ChecksumMismatch { .. })
        ));
        let too_new = Expect { level: 0, first_block: 630, crc, file_pages: 100, max_generation: 2 };
        assert!(decode(&out, Some(too_new), Path::new("m"), 0).is_err());
    }

    #[test]
    fn v1_leaves_read_as_unlocated_refs_and_become_v2_when_edited() {
        let (a, b) = (ChunkHash::of(b"a"), ChunkHash::of(b"b"));
        let v1 = LeafBody::v1_with(&[(0, a), (7, b)]);
        let p = Page { level: 0, first_block: 0, generation: 1, crc: 0, body: Body::Leaf(v1) };
        let mut out = Vec::new();
        encode(p.level, p.first_block, p.generation, &p.body, &mut out);
        assert_eq!(le_u32(&out, OFF_VERSION), 1);
        assert_eq!(&out[OFF_ENTRIES..OFF_ENTRIES + 32], a.as_bytes(), "a v1 entry is the whole hash");
        let got = decode(&out, None, Path::new("m"), 0).unwrap();
        assert_eq!(fuzz_encode_page(&got), out, "a v1 page encodes back to its own bytes");
        let Body::Leaf(mut l) = got.body else { panic!("a leaf") };
        assert_eq!(l.get(7), Some(ChunkRef::unlocated(&b)));
        l.set(1, Some(ChunkRef::unlocated(&b)));
        assert_eq!(l.version(), PAGE_VERSION);
        assert_eq!((l.get(0), l.get(7)), (Some(a.into()), Some(b.into())));
        let mut out = Vec::new();
        encode(0, 0, 1, &Body::Leaf(l.clone()), &mut out);
        assert_eq!(decode(&out, None, Path::new("m"), 0).unwrap().body, Body::Leaf(l));
    }

    #[test]
    fn an_unlocated_entry_with_a_slot_is_refused() {
        let mut l = LeafBody::default();
        l.set(3, Some(ChunkHash::of(b"c").into()));
        let mut out = Vec::new();
        encode(0, 0, 1, &Body::Leaf(l), &mut out);
        out[OFF_ENTRIES + 3 * 32 + 24] = 1;
        let crc = format::crc32c(&out[..OFF_CRC]);
        out[OFF_CRC..].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&out, None, Path::new("m"), 0).unwrap_err();
        assert!(e.to_string().contains("no pack"), "{e}");
    }

    #[test]
    fn spans() {
        assert_eq!(span_blocks(0), 126);
        assert_eq!(span_blocks(1), 126 * 338);
        assert!(span_blocks(MAX_LEVEL) > u128::from(u64::MAX));
        assert!(span_blocks(MAX_LEVEL - 1) < u128::from(u64::MAX));
    }
}
