//! What a check of the store found (fsck, and the checks it drives:
//! `chunk::check`): problems (exit 1), notes (expected after a crash, or
//! outside what fsck owns), the changes `--repair` may make, and counts.
//!
//! The lists are bounded: after [`LISTED_MAX`] findings of a class the rest
//! are only counted, so a store damaged everywhere cannot make fsck use
//! memory in proportion to its damage.

use crate::error::Error;
use crate::storage::Change;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Findings of one class listed before the rest are only counted.
pub const LISTED_MAX: usize = 1000;

/// One thing fsck found, named by image, file and offset.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// A stable, greppable name of what is wrong (e.g. `chunk-checksum`).
    pub kind: &'static str,
    /// The image it belongs to, if it belongs to one.
    pub image: Option<String>,
    pub path: PathBuf,
    /// Byte offset in `path`, when the finding has one.
    pub offset: Option<u64>,
    pub detail: String,
    /// What `--repair` would do about it (nothing if absent).
    #[serde(serialize_with = "describe_change")]
    pub repair: Option<Change>,
}

fn describe_change<S: serde::Serializer>(c: &Option<Change>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        None => s.serialize_none(),
        Some(c) => s.serialize_some(&describe(c)),
    }
}

/// One line saying what a change does.
pub fn describe(c: &Change) -> String {
    match c {
        Change::Truncate { path, len_bytes, was_bytes } => {
            format!("cut {} from {was_bytes} to {len_bytes} bytes", path.display())
        }
        Change::Remove { path } => format!("remove {}", path.display()),
        Change::RemoveDir { path } => format!("remove directory {}", path.display()),
        Change::Other { path, what } => format!("{what} of {}", path.display()),
    }
}

impl Finding {
    pub fn new(kind: &'static str, image: Option<&str>, path: &Path, detail: impl Into<String>) -> Finding {
        Finding {
            kind,
            image: image.map(str::to_string),
            path: path.to_path_buf(),
            offset: None,
            detail: detail.into(),
            repair: None,
        }
    }

    pub fn at(mut self, offset: u64) -> Finding {
        self.offset = Some(offset);
        self
    }

    pub fn repair(mut self, change: Change) -> Finding {
        self.repair = Some(change);
        self
    }

    /// A finding for an error an open would have failed with: the file and
    /// offset the error names, else `path`.
    pub fn from_error(kind: &'static str, image: Option<&str>, path: &Path, e: &Error) -> Finding {
        let (p, offset) = match e {
            Error::Corruption { path, offset, .. } | Error::ChecksumMismatch { path, offset, .. } => {
                (path.as_path(), Some(*offset))
            }
            Error::Io { path, .. } => (path.as_path(), None),
            _ => (path, None),
        };
        let mut f = Finding::new(kind, image, p, e.to_string());
        f.offset = offset;
        f
    }

    /// `kind: image NAME: PATH at offset N: detail`, one line.
    pub fn line(&self) -> String {
        let mut s = format!("{}: ", self.kind);
        if let Some(i) = &self.image {
            s += &format!("image {i}: ");
        }
        s += &self.path.display().to_string();
        if let Some(o) = self.offset {
            s += &format!(" at offset {o}");
        }
        s += &format!(": {}", self.detail);
        if let Some(c) = &self.repair {
            s += &format!(" (--repair: {})", describe(c));
        }
        s
    }
}

/// Counts of what was checked.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FsckCounts {
    pub images: u64,
    pub packs: u64,
    /// Entries of the chunk index.
    pub chunks: u64,
    /// Chunks whose bytes were read and matched their crc32c and hash.
    pub chunks_verified: u64,
    pub bytes_verified: u64,
    /// Mapped blocks over all manifests checked (each a chunk reference).
    pub references: u64,
    /// Distinct chunks those references name.
    pub referenced_chunks: u64,
    /// References to chunks in other stores' packs (fetched images,
    /// cross-host dedup): in the bucket, their bytes not read.
    pub foreign_references: u64,
    /// Chunks no manifest references (garbage until the next GC sweeps it).
    pub unreferenced_chunks: u64,
    /// The most references to one chunk.
    pub max_references: u64,
    pub manifest_pages: u64,
    pub log_segments: u64,
    pub log_records: u64,
    /// Bytes an open would cut off as torn tails (index journal and logs).
    pub torn_tail_bytes: u64,
}

/// The result of one fsck run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FsckReport {
    pub store: PathBuf,
    /// Only this image was checked (its chunks, manifest and log).
    pub image: Option<String>,
    pub problems: Vec<Finding>,
    pub notes: Vec<Finding>,
    /// Problems and notes past [`LISTED_MAX`], counted only.
    pub problems_unlisted: u64,
    pub notes_unlisted: u64,
    /// What `--repair` did, one line per change, before the check that
    /// produced this report.
    pub repaired: Vec<String>,
    pub counts: FsckCounts,
}

impl FsckReport {
    /// No problems (notes are allowed).
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.problems_unlisted == 0
    }

    pub fn problem(&mut self, f: Finding) {
        if self.problems.len() < LISTED_MAX {
            self.problems.push(f);
        } else {
            self.problems_unlisted += 1;
        }
    }

    pub fn note(&mut self, f: Finding) {
        if self.notes.len() < LISTED_MAX {
            self.notes.push(f);
        } else {
            self.notes_unlisted += 1;
        }
    }

    /// Problems and notes of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Finding> {
        self.problems.iter().chain(&self.notes).filter(|f| f.kind == kind).collect()
    }
}
