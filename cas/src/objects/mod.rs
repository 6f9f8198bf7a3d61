//! The object store the chunk store can keep sealed packs and manifest
//! roots in (issue 18): a bucket of immutable, whole-object writes read by
//! byte ranges, as S3 and Garage serve them.
//!
//! `cas` stays free of an async runtime: [`Objects`] is synchronous, and
//! the S3 client (crate `casblk-remote`) blocks its caller on its own
//! runtime. [`MemObjects`] is the in-memory store the engine's model and
//! crash tests use, with injected failures.
//!
//! What the engine relies on, and what a backend must give:
//! - a PUT that returned is whole and visible to every later GET, HEAD and
//!   LIST (Garage: read-after-write at replication factor 3, consistent
//!   mode); a PUT that failed or was cut leaves the old object or none,
//!   never a part;
//! - keys the engine writes once are never written by another host, so
//!   nothing depends on conditional writes unless [`Objects::put_new`]
//!   reports that the store enforces them (Garage 2.5 does not: it ignores
//!   `If-None-Match`).

pub mod lease;
mod mem;

pub use mem::{MemObjects, ObjectFault};

use std::fmt;
use std::ops::Range;

/// Why an object operation failed, as far as the caller acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectErrorKind {
    /// The key does not exist.
    NotFound,
    /// The credentials were refused (bad key, bad secret, no permission).
    Denied,
    /// The bucket does not exist.
    NoBucket,
    /// No endpoint answered (connection refused, timed out).
    Unreachable,
    /// `put_new` found the key taken.
    Exists,
    /// `put_new` on a store that does not enforce it (nothing written).
    Unsupported,
    /// Anything else the store answered (5xx after retries, bad reply).
    Other,
}

/// An object operation's failure: what kind, and a one-line description
/// naming the store and the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    pub kind: ObjectErrorKind,
    pub message: String,
}

impl ObjectError {
    pub fn new(kind: ObjectErrorKind, message: impl Into<String>) -> ObjectError {
        ObjectError { kind, message: message.into() }
    }

    /// True when retrying later may succeed (the store or the network was
    /// down), false when the setup is wrong or the key is missing.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ObjectErrorKind::Unreachable | ObjectErrorKind::Other)
    }
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ObjectError {}

/// What an [`Error::Unavailable`](crate::Error::Unavailable) made of an
/// [`ObjectError`] names.
pub const OBJECT_STORE: &str = "the object store";

impl From<ObjectError> for crate::Error {
    fn from(e: ObjectError) -> crate::Error {
        match e.kind {
            ObjectErrorKind::NotFound => crate::Error::NotFound(e.message),
            ObjectErrorKind::Exists => crate::Error::AlreadyExists(e.message),
            _ => crate::Error::Unavailable(OBJECT_STORE.into(), e.message),
        }
    }
}

pub type ObjectResult<T> = std::result::Result<T, ObjectError>;

/// Every key under `prefix`, in order, LISTed a page of 1000 at a time.
pub fn list_all(objects: &dyn Objects, prefix: &str) -> ObjectResult<Vec<String>> {
    list_after(objects, prefix, None)
}

/// Every key under `prefix` that sorts after `start_after` (all: None),
/// in order, LISTed a page of 1000 at a time.
pub fn list_after(
    objects: &dyn Objects,
    prefix: &str,
    start_after: Option<String>,
) -> ObjectResult<Vec<String>> {
    let mut out = Vec::new();
    let mut after = start_after;
    loop {
        let page = objects.list(prefix, after.as_deref(), 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        out.extend(page.into_iter().map(|i| i.key));
    }
    Ok(out)
}

/// One object a listing found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
}

/// A bucket (and key prefix) of an object store. Keys are relative to the
/// prefix, `/`-separated. Every method may block for network round trips;
/// none blocks for longer than the backend's request bound.
pub trait Objects: Send + Sync {
    /// `s3://bucket/prefix at http://endpoint`: what error messages name.
    fn describe(&self) -> String;

    /// Writes `key` whole (replacing what was there).
    fn put(&self, key: &str, data: &[u8]) -> ObjectResult<()>;

    /// Writes `key` only if it does not exist; `Err(Exists)` when it
    /// does. On a store that does not enforce that (see
    /// [`Objects::enforces_put_new`]) it writes nothing and fails with
    /// `Unsupported`.
    fn put_new(&self, key: &str, data: &[u8]) -> ObjectResult<()>;

    /// Whether the store enforces `put_new` (S3, MinIO; not Garage 2.5).
    fn enforces_put_new(&self) -> bool;

    /// The whole object.
    fn get(&self, key: &str) -> ObjectResult<Vec<u8>>;

    /// Bytes `range` of the object (fewer if it ends first).
    fn get_range(&self, key: &str, range: Range<u64>) -> ObjectResult<Vec<u8>>;

    /// The object's size, or None if it does not exist.
    fn head(&self, key: &str) -> ObjectResult<Option<u64>>;

    /// The objects whose keys start with `prefix` and sort after
    /// `start_after` (if given), in key order, at most `limit`.
    fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> ObjectResult<Vec<ObjectInfo>>;

    /// Deletes `key`; deleting a missing key succeeds.
    fn delete(&self, key: &str) -> ObjectResult<()>;
}
