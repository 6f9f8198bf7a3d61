//! Files written and fsynced one at a time, whose contents follow from
//! their number, so that after a reboot the guest can tell on its own
//! whether each file the harness saw acknowledged came back intact.

use std::io::{Read, Write};
use std::path::PathBuf;

/// A 64-bit xorshift* generator: fast, deterministic, good enough to make
/// every block of every file different (so the store cannot deduplicate
/// one against another and hide a lost write).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so nearby seeds start far apart.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

pub struct Files {
    pub dir: PathBuf,
    seed: u64,
    size_bytes: usize,
}

impl Files {
    pub fn new(dir: &str, seed: u64, size_bytes: usize) -> Files {
        Files { dir: PathBuf::from(dir), seed, size_bytes }
    }

    fn path(&self, i: u64) -> PathBuf {
        self.dir.join(format!("f{i:06}"))
    }

    fn contents(&self, i: u64) -> Vec<u8> {
        let mut v = vec![0u8; self.size_bytes];
        Rng::new(self.seed.wrapping_mul(1_000_003).wrapping_add(i)).fill(&mut v);
        v
    }

    /// Writes file `i`, fsyncs it and then its directory: once this
    /// returns, the file and its name are durable.
    pub fn write(&self, i: u64) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
        let p = self.path(i);
        let mut f = std::fs::File::create(&p).map_err(|e| format!("creating {}: {e}", p.display()))?;
        f.write_all(&self.contents(i)).map_err(|e| format!("writing {}: {e}", p.display()))?;
        f.sync_all().map_err(|e| format!("fsync of {}: {e}", p.display()))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("fsync of {}: {e}", self.dir.display()))
    }

    /// Checks file `i`: an error says how it is missing or wrong.
    pub fn check(&self, i: u64) -> Result<(), String> {
        let p = self.path(i);
        let mut got = Vec::new();
        std::fs::File::open(&p)
            .and_then(|mut f| f.read_to_end(&mut got))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if got != self.contents(i) {
            return Err(format!("{}: {} bytes, not the {} written", p.display(), got.len(), self.size_bytes));
        }
        Ok(())
    }

    /// How many files the directory holds (including any written after
    /// the last one the harness saw acknowledged).
    pub fn count(&self) -> usize {
        std::fs::read_dir(&self.dir).map(|d| d.count()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_back_and_a_changed_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path().to_str().unwrap(), 3, 8192);
        files.write(0).unwrap();
        files.write(1).unwrap();
        files.check(0).unwrap();
        files.check(1).unwrap();
        assert_eq!(files.count(), 2);
        assert!(files.check(2).is_err(), "a missing file is an error");
        std::fs::write(files.path(1), files.contents(0)).unwrap();
        assert!(files.check(1).is_err(), "another file's contents are an error");
    }
}
