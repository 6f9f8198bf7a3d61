//! Reading a qcow2 image's guest-visible bytes in order, natively, for
//! `casblk image import`: only allocated clusters are read from the file;
//! unallocated and zero clusters read as zeros (which import then skips).
//!
//! ```text
//! header (big-endian)           L1 table                L2 table (one cluster)
//!  0 magic "QFI\xfb"            u64 per 2^(2c-3) bytes  u64 per cluster:
//!  4 version 2|3                 bits 9..56 L2 offset    bit 0     reads as zeros (v3)
//!  8 backing_file_offset u64     0: unallocated          bits 9..56 host offset (0: unallocated)
//! 20 cluster_bits u32 (c)                                bit 62    compressed
//! 24 size u64 (guest bytes)
//! 32 crypt_method u32
//! 36 l1_size u32, 40 l1_table_offset u64
//! 72 incompatible_features u64 (v3)
//! ```
//!
//! What it refuses, with a one-line reason naming `qemu-img convert` as the
//! way in: backing files, encryption, compressed clusters, external data
//! files, extended L2 entries, an image marked corrupt.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: [u8; 4] = [b'Q', b'F', b'I', 0xfb];
const HEADER_BYTES_V2: usize = 72;
const HEADER_BYTES_V3: usize = 104;
/// Host offsets in L1 and L2 entries: bits 9..56.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const L2_COMPRESSED: u64 = 1 << 62;
const L2_ZERO: u64 = 1;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_EXTERNAL_DATA: u64 = 1 << 2;
const INCOMPAT_EXTENDED_L2: u64 = 1 << 4;
/// Clusters from 512 B to 2 MiB, as qemu allows.
const CLUSTER_BITS: std::ops::RangeInclusive<u32> = 9..=21;
/// Bound on the L1 table read into memory (32 MiB: 4M entries).
const L1_BYTES_MAX: u64 = 32 << 20;

/// True when `file` starts with the qcow2 magic.
pub fn is_qcow2(file: &File) -> Result<bool> {
    let mut magic = [0u8; 4];
    match file.read_exact_at(&mut magic, 0) {
        Ok(()) => Ok(magic == MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// A qcow2 file read front to back as the guest sees it.
pub struct Qcow2Reader {
    file: File,
    path: PathBuf,
    cluster_bits: u32,
    size: u64,
    l1: Vec<u64>,
    /// The L2 table last used, by its host offset.
    l2: Option<(u64, Vec<u64>)>,
    pos: u64,
}

impl Qcow2Reader {
    pub fn open(path: &Path) -> Result<Qcow2Reader> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let what = path.display();
        let refuse = |why: &str| -> Result<Qcow2Reader> {
            bail!("{what}: {why}; convert it first: qemu-img convert -O raw {what} {what}.raw")
        };
        let mut h = vec![0u8; HEADER_BYTES_V3];
        let n = file.read_at(&mut h, 0).with_context(|| format!("reading {what}"))?;
        if n < HEADER_BYTES_V2 || h[..4] != MAGIC {
            bail!("{what} is not a qcow2 image (no qcow2 header)");
        }
        let version = be32(&h, 4);
        if version != 2 && version != 3 {
            return refuse(&format!("qcow2 version {version} is not read natively"));
        }
        if version == 3 && n < HEADER_BYTES_V3 {
            bail!("{what}: qcow2 v3 header is truncated");
        }
        if be64(&h, 8) != 0 {
            return refuse("it has a backing file");
        }
        let cluster_bits = be32(&h, 20);
        if !CLUSTER_BITS.contains(&cluster_bits) {
            bail!("{what}: qcow2 cluster_bits {cluster_bits} is out of range");
        }
        if be32(&h, 32) != 0 {
            return refuse("it is encrypted");
        }
        if version == 3 {
            let incompat = be64(&h, 72);
            if incompat & INCOMPAT_CORRUPT != 0 {
                return refuse("it is marked corrupt");
            }
            if incompat & INCOMPAT_EXTERNAL_DATA != 0 {
                return refuse("its data is in an external file");
            }
            if incompat & INCOMPAT_EXTENDED_L2 != 0 {
                return refuse("it uses extended L2 entries (subclusters)");
            }
        }
        let size = be64(&h, 24);
        let l1_size = u64::from(be32(&h, 36));
        let l1_offset = be64(&h, 40);
        let l2_entries_bits = cluster_bits - 3;
        let covered = u128::from(l1_size) << (cluster_bits + l2_entries_bits);
        if covered < u128::from(size) {
            bail!("{what}: its L1 table of {l1_size} entries does not cover its {size} bytes");
        }
        if l1_size * 8 > L1_BYTES_MAX {
            bail!("{what}: an L1 table of {l1_size} entries is beyond {L1_BYTES_MAX} bytes");
        }
        let mut raw = vec![0u8; (l1_size * 8) as usize];
        file.read_exact_at(&mut raw, l1_offset).with_context(|| format!("reading the L1 table of {what}"))?;
        let l1 = raw.chunks(8).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes"))).collect();
        Ok(Qcow2Reader { file, path: path.to_path_buf(), cluster_bits, size, l1, l2: None, pos: 0 })
    }

    /// Guest-visible bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn cluster_bytes(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// The host offset of the cluster holding guest byte `at` (None: zeros).
    fn host_cluster(&mut self, at: u64) -> std::io::Result<Option<u64>> {
        let l2_bits = self.cluster_bits - 3;
        let l1_index = (at >> (self.cluster_bits + l2_bits)) as usize;
        let l2_index = ((at >> self.cluster_bits) & ((1 << l2_bits) - 1)) as usize;
        let l2_offset = self.l1.get(l1_index).copied().unwrap_or(0) & OFFSET_MASK;
        if l2_offset == 0 {
            return Ok(None);
        }
        if self.l2.as_ref().map(|(o, _)| *o) != Some(l2_offset) {
            let mut raw = vec![0u8; self.cluster_bytes() as usize];
            self.file.read_exact_at(&mut raw, l2_offset)?;
            let table = raw.chunks(8).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes"))).collect();
            self.l2 = Some((l2_offset, table));
        }
        let entry = self.l2.as_ref().expect("just loaded").1[l2_index];
        if entry & L2_COMPRESSED != 0 {
            return Err(std::io::Error::other(format!(
                "{} has compressed clusters, which are not read natively; convert it first: \
                 qemu-img convert -O raw {0} {0}.raw",
                self.path.display()
            )));
        }
        let host = entry & OFFSET_MASK;
        Ok(if entry & L2_ZERO != 0 || host == 0 { None } else { Some(host) })
    }
}

impl Read for Qcow2Reader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let in_cluster = self.pos & (self.cluster_bytes() - 1);
        let n = (buf.len() as u64).min(self.cluster_bytes() - in_cluster).min(self.size - self.pos) as usize;
        match self.host_cluster(self.pos)? {
            Some(host) => self.file.read_exact_at(&mut buf[..n], host + in_cluster)?,
            None => buf[..n].fill(0),
        }
        self.pos += n as u64;
        Ok(n)
    }
}
