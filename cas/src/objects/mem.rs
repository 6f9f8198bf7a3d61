//! An object store in memory, for the engine's tests: whole-object puts
//! that are visible at once, listings in key order, and failures injected
//! per operation (an unreachable store, refused credentials, a missing
//! bucket, or a fault after N more operations).

use super::{ObjectError, ObjectErrorKind, ObjectInfo, ObjectResult, Objects};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// A failure [`MemObjects`] injects into every operation until cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFault {
    Unreachable,
    Denied,
    NoBucket,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Arc<[u8]>>,
    fault: Option<ObjectFault>,
    /// Operations left before `fault_after`'s fault starts.
    fault_after: Option<(u64, ObjectFault)>,
    ops: u64,
    /// Each operation sleeps this long first (outside the lock).
    latency: std::time::Duration,
    /// Run once before the next GET of a key under the prefix is served.
    before_get: Option<(String, Hook)>,
}

type Hook = Box<dyn FnOnce() + Send>;

/// See the module docs. Clones share the store (two "hosts" on one bucket).
#[derive(Clone, Default)]
pub struct MemObjects {
    state: Arc<Mutex<State>>,
    enforce_put_new: bool,
}

impl MemObjects {
    /// An empty bucket that, like Garage, does not enforce `put_new`.
    pub fn new() -> MemObjects {
        MemObjects::default()
    }

    /// An empty bucket that enforces `put_new` (like S3).
    pub fn enforcing_put_new() -> MemObjects {
        MemObjects { enforce_put_new: true, ..MemObjects::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every operation fails with `fault` until `clear_fault`.
    pub fn set_fault(&self, fault: ObjectFault) {
        self.state().fault = Some(fault);
    }

    /// Operations after the next `ops` fail with `fault`.
    pub fn fault_after(&self, ops: u64, fault: ObjectFault) {
        self.state().fault_after = Some((ops, fault));
    }

    /// Every operation takes at least `latency` (so that concurrent
    /// callers' operations interleave as over a network).
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.state().latency = latency;
    }

    pub fn clear_fault(&self) {
        let mut s = self.state();
        s.fault = None;
        s.fault_after = None;
    }

    /// Runs `hook` once, before the next GET of a key under `prefix` is
    /// served (a test's way to put another store's work between two reads).
    pub fn before_get(&self, prefix: &str, hook: impl FnOnce() + Send + 'static) {
        self.state().before_get = Some((prefix.to_string(), Box::new(hook)));
    }

    /// Operations performed (failed ones included).
    pub fn ops(&self) -> u64 {
        self.state().ops
    }

    /// Every key, in order (for tests' assertions).
    pub fn keys(&self) -> Vec<String> {
        self.state().objects.keys().cloned().collect()
    }

    /// Runs `op` on the objects unless a fault is due.
    fn with<T>(
        &self,
        op: impl FnOnce(&mut BTreeMap<String, Arc<[u8]>>) -> ObjectResult<T>,
    ) -> ObjectResult<T> {
        let latency = self.state().latency;
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let mut s = self.state();
        s.ops += 1;
        if let Some((left, fault)) = s.fault_after {
            if left == 0 {
                s.fault = Some(fault);
                s.fault_after = None;
            } else {
                s.fault_after = Some((left - 1, fault));
            }
        }
        if let Some(fault) = s.fault {
            let (kind, what) = match fault {
                ObjectFault::Unreachable => (ObjectErrorKind::Unreachable, "cannot connect (injected)"),
                ObjectFault::Denied => (ObjectErrorKind::Denied, "access denied (injected)"),
                ObjectFault::NoBucket => (ObjectErrorKind::NoBucket, "the bucket does not exist (injected)"),
            };
            return Err(ObjectError::new(kind, format!("{}: {what}", self.describe())));
        }
        op(&mut s.objects)
    }
}

impl Objects for MemObjects {
    fn describe(&self) -> String {
        "mem://bucket".into()
    }

    fn put(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        self.with(|o| {
            o.insert(key.to_string(), data.into());
            Ok(())
        })
    }

    fn put_new(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        let desc = self.describe();
        let enforce = self.enforce_put_new;
        self.with(|o| {
            if !enforce {
                return Err(ObjectError::new(
                    ObjectErrorKind::Unsupported,
                    format!("{desc}: conditional writes are not enforced"),
                ));
            }
            if o.contains_key(key) {
                return Err(ObjectError::new(
                    ObjectErrorKind::Exists,
                    format!("{desc}/{key} already exists"),
                ));
            }
            o.insert(key.to_string(), data.into());
            Ok(())
        })
    }

    fn enforces_put_new(&self) -> bool {
        self.enforce_put_new
    }

    fn get(&self, key: &str) -> ObjectResult<Vec<u8>> {
        self.get_range(key, 0..u64::MAX)
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> ObjectResult<Vec<u8>> {
        let hook = {
            let mut s = self.state();
            match &s.before_get {
                Some((prefix, _)) if key.starts_with(prefix.as_str()) => s.before_get.take().map(|(_, h)| h),
                _ => None,
            }
        };
        if let Some(hook) = hook {
            hook();
        }
        let desc = self.describe();
        self.with(|o| {
            let v = o.get(key).ok_or_else(|| {
                ObjectError::new(ObjectErrorKind::NotFound, format!("{desc}/{key} not found"))
            })?;
            let len = v.len() as u64;
            let (start, end) = (range.start.min(len), range.end.min(len));
            Ok(v[start as usize..end.max(start) as usize].to_vec())
        })
    }

    fn head(&self, key: &str) -> ObjectResult<Option<u64>> {
        self.with(|o| Ok(o.get(key).map(|v| v.len() as u64)))
    }

    fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> ObjectResult<Vec<ObjectInfo>> {
        self.with(|o| {
            let from = match start_after {
                Some(after) if after >= prefix => std::ops::Bound::Excluded(after.to_string()),
                _ => std::ops::Bound::Included(prefix.to_string()),
            };
            Ok(o.range((from, std::ops::Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .take(limit)
                .map(|(k, v)| ObjectInfo { key: k.clone(), size: v.len() as u64 })
                .collect())
        })
    }

    fn delete(&self, key: &str) -> ObjectResult<()> {
        self.with(|o| {
            o.remove(key);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_reads_ranges_and_listings() {
        let m = MemObjects::new();
        m.put("packs/00000002", b"two").unwrap();
        m.put("packs/00000001", b"one!").unwrap();
        m.put("roots/a", b"r").unwrap();
        assert_eq!(m.get_range("packs/00000001", 1..3).unwrap(), b"ne");
        assert_eq!(m.get_range("packs/00000001", 3..100).unwrap(), b"!");
        assert_eq!(m.head("packs/00000002").unwrap(), Some(3));
        assert_eq!(m.head("nope").unwrap(), None);
        assert_eq!(m.get("nope").unwrap_err().kind, ObjectErrorKind::NotFound);
        let keys = |v: Vec<ObjectInfo>| v.into_iter().map(|i| i.key).collect::<Vec<_>>();
        assert_eq!(keys(m.list("packs/", None, 10).unwrap()), ["packs/00000001", "packs/00000002"]);
        assert_eq!(keys(m.list("packs/", Some("packs/00000001"), 10).unwrap()), ["packs/00000002"]);
        assert_eq!(keys(m.list("packs/", None, 1).unwrap()), ["packs/00000001"]);
        m.delete("packs/00000001").unwrap();
        m.delete("packs/00000001").unwrap();
        assert_eq!(m.keys(), ["packs/00000002", "roots/a"]);
    }

    #[test]
    fn put_new_is_enforced_only_where_the_store_enforces_it() {
        let garage_like = MemObjects::new();
        assert_eq!(garage_like.put_new("k", b"1").unwrap_err().kind, ObjectErrorKind::Unsupported);
        assert_eq!(garage_like.head("k").unwrap(), None, "nothing written");
        let s3_like = MemObjects::enforcing_put_new();
        s3_like.put_new("k", b"1").unwrap();
        assert_eq!(s3_like.put_new("k", b"2").unwrap_err().kind, ObjectErrorKind::Exists);
        assert_eq!(s3_like.get("k").unwrap(), b"1");
    }

    #[test]
    fn injected_faults_name_the_problem_and_clear() {
        let m = MemObjects::new();
        m.fault_after(1, ObjectFault::Denied);
        m.put("a", b"1").unwrap();
        let e = m.put("b", b"2").unwrap_err();
        assert_eq!(e.kind, ObjectErrorKind::Denied);
        assert!(!e.is_transient());
        assert!(e.to_string().contains("access denied"), "{e}");
        m.clear_fault();
        m.set_fault(ObjectFault::Unreachable);
        assert!(m.get("a").unwrap_err().is_transient());
        m.clear_fault();
        assert_eq!(m.get("a").unwrap(), b"1");
    }
}
