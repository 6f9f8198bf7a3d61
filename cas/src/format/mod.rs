//! Shared pieces of every on-disk format: little-endian encoding, the
//! crc32c checksum, and version checks.
//!
//! Conventions every object follows (see docs/design.md):
//! - it starts with an 8-byte magic naming its kind, then a u32 format
//!   version;
//! - integers are explicit little-endian, never `usize`;
//! - its bytes are covered by a crc32c stored in the object (a trailer, or
//!   a header field computed with that field zeroed);
//! - a version newer than this build reads is refused with
//!   [`Error::UnsupportedVersion`], never guessed at.

use crate::error::{Error, Result};
use std::path::Path;

/// crc32c (Castagnoli, "CRC-32/ISCSI") of `bytes`, by the `crc-fast`
/// crate (carry-less multiply folding, chosen by the CPU's features at run
/// time).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// Continues a crc32c over more bytes: `crc32c_append(crc32c(a), b)` is
/// `crc32c(a ++ b)`.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The register before the final inversion (CRC-32C's xorout is all
    // ones) is where the computation left off.
    let mut digest =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(bytes);
    digest.finalize() as u32
}

/// Refuses versions above `supported` (and version 0, which is never written).
pub fn check_version(what: &str, found: u32, supported: u32) -> Result<()> {
    if found == 0 || found > supported {
        return Err(Error::UnsupportedVersion { what: what.to_string(), found, supported });
    }
    Ok(())
}

/// Appends little-endian fields to a buffer.
#[derive(Default, Debug)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    pub fn with_capacity(n: usize) -> Encoder {
        Encoder { buf: Vec::with_capacity(n) }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// Appends the crc32c of everything written so far.
    pub fn seal(&mut self) -> &mut Self {
        let crc = crc32c(&self.buf);
        self.u32(crc)
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Reads little-endian fields; every getter returns None past the end, so
/// a decoder never panics on short or hostile input.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf, pos: 0 }
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N).map(|b| b.try_into().expect("length checked"))
    }
    pub fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
}

/// Opens a sealed object or file: its 8-byte `magic`, its crc32c
/// ([`unseal`]), then the u32 version after the magic, which must be
/// between 1 and `newest`. `what` names the format in errors. Returns the
/// version and a decoder after it.
pub fn open_sealed<'a>(
    buf: &'a [u8],
    magic: &[u8; 8],
    what: &str,
    newest: u32,
    path: &Path,
) -> Result<(u32, Decoder<'a>)> {
    let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
    if buf.len() < 8 || buf[..8] != magic[..] {
        return Err(corrupt(format!("not a {what} (bad magic)")));
    }
    let body = unseal(buf, path, 0)?;
    let mut d = Decoder::new(&body[8..]);
    let version = d.u32().ok_or_else(|| corrupt(format!("{what} is cut short")))?;
    check_version(what, version, newest)?;
    Ok((version, d))
}

/// Verifies a buffer whose last 4 bytes are the crc32c of the rest, and
/// returns the covered bytes.
pub fn unseal<'a>(buf: &'a [u8], path: &Path, offset: u64) -> Result<&'a [u8]> {
    if buf.len() < 4 {
        return Err(Error::Corruption {
            path: path.to_path_buf(),
            offset,
            detail: format!("{} bytes is too short for a checksummed object", buf.len()),
        });
    }
    let (body, tail) = buf.split_at(buf.len() - 4);
    let expected = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    let actual = crc32c(body);
    if expected != actual {
        return Err(Error::ChecksumMismatch { path: path.to_path_buf(), offset, expected, actual });
    }
    Ok(body)
}

/// Checks a decoder of a sealed format (magic, u32 version at byte 8,
/// trailing crc32c) on damaged copies of `buf`, a valid encoding: every
/// flipped byte and every cut is refused, and a newer version (re-sealed)
/// is refused as such.
#[cfg(test)]
pub(crate) fn assert_refuses_damage<T: std::fmt::Debug>(
    buf: &[u8],
    decode: impl Fn(&[u8]) -> crate::Result<T>,
) {
    for i in 0..buf.len() {
        let mut bad = buf.to_vec();
        bad[i] ^= 0x04;
        assert!(decode(&bad).is_err(), "flip at {i} accepted");
    }
    for cut in 0..buf.len() {
        assert!(decode(&buf[..cut]).is_err(), "cut at {cut} accepted");
    }
    let mut newer = buf.to_vec();
    let version = u32::from_le_bytes(newer[8..12].try_into().expect("4 bytes"));
    newer[8..12].copy_from_slice(&(version + 1).to_le_bytes());
    let n = newer.len();
    let crc = crc32c(&newer[..n - 4]);
    newer[n - 4..].copy_from_slice(&crc.to_le_bytes());
    let r = decode(&newer);
    assert!(matches!(r, Err(crate::Error::UnsupportedVersion { .. })), "{r:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard check value of CRC-32C (iSCSI), whole and continued.
    #[test]
    fn crc32c_is_castagnoli() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283, "0 is the crc of nothing");
    }

    /// crc-fast picks a folding path by length and CPU: every length up to
    /// two pages and past, at odd offsets, agrees with the `crc32c` crate
    /// (the SSE4.2 instruction), whole and continued at any split.
    #[test]
    fn crc32c_agrees_with_the_crc32c_crate() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xc3c);
        let mut bytes = vec![0u8; 3 * 4096 + 17];
        rng.fill(&mut bytes[..]);
        for len in (0..=600).chain([1023, 1024, 4095, 4096, 4097, 8192, 3 * 4096]) {
            let start = rng.gen_range(0..=16);
            let b = &bytes[start..start + len];
            assert_eq!(crc32c(b), ::crc32c::crc32c(b), "{len} bytes at offset {start}");
            let split = rng.gen_range(0..=len);
            assert_eq!(
                crc32c_append(crc32c(&b[..split]), &b[split..]),
                ::crc32c::crc32c(b),
                "{len} split at {split}"
            );
        }
    }

    #[test]
    fn seal_and_unseal_round_trip() {
        let mut e = Encoder::default();
        e.bytes(b"CASBLKXX").u32(1).u64(42).seal();
        let body = unseal(&e.buf, Path::new("/x"), 0).unwrap();
        let mut d = Decoder::new(body);
        assert_eq!(d.bytes(8).unwrap(), b"CASBLKXX");
        assert_eq!(d.u32(), Some(1));
        assert_eq!(d.u64(), Some(42));
        assert_eq!(d.u8(), None);
        let mut bad = e.buf.clone();
        bad[9] ^= 1;
        assert!(matches!(unseal(&bad, Path::new("/x"), 7), Err(Error::ChecksumMismatch { offset: 7, .. })));
        assert!(unseal(&[1, 2], Path::new("/x"), 0).is_err());
    }

    #[test]
    fn versions_newer_than_supported_are_refused() {
        assert!(check_version("wal", 1, 1).is_ok());
        assert!(matches!(check_version("wal", 2, 1), Err(Error::UnsupportedVersion { found: 2, .. })));
        assert!(check_version("wal", 0, 1).is_err());
    }
}
