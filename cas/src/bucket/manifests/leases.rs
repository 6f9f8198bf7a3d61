//! The publisher's leases (see "Ownership" in the module docs): taken
//! when an image is opened or fetched to be written, fenced against a
//! newer holder's roots, renewed by a thread of their own, and released
//! when the image closes or the store stops.

use super::fetch;
use super::root_object::{self, root_key, RootObject};
use super::{Entry, LeaseSlot, Publisher};
use crate::error::{Error, Result};
use crate::manifest::RootRecord;
use crate::objects::lease::Lease;
use crate::sync::lock;
use std::sync::{Arc, Mutex};

/// Where image `name`'s lease claims live.
pub fn lease_prefix(name: &str) -> String {
    format!("{}lease/", root_object::image_prefix(name))
}

impl Entry {
    /// Gives the lease up (the image closed or the store stops).
    pub(super) fn release(&self, name: &str) {
        // After a renewal under way (its PUT would mark the claim held
        // again after the release's).
        let _renewal = lock(&self.renewing);
        let lease = lock(&self.lease).lease.take();
        if let Some(l) = lease {
            release(name, l);
        }
    }
}

/// Gives `lease` up; a failure only makes the next store wait it out.
pub(super) fn release(name: &str, lease: Lease) {
    if let Err(e) = lease.release() {
        tracing::warn!(image = name, error = %e, "releasing the lease failed; the next store waits it out");
    }
}

impl Publisher {
    /// Takes the lease on `name` for writing it (None without leases).
    /// `local` is the root and size of the copy here (None: none yet);
    /// refused if the bucket's newest root of `name` was published by
    /// another store from a different tree or at another size (a grow
    /// republishes its generation's root): this copy is stale.
    pub fn acquire(&self, name: &str, local: Option<(RootRecord, u64)>) -> Result<Option<Lease>> {
        let Some(cfg) = self.lease_cfg else { return Ok(None) };
        if let Some(l) = lock(&self.held).remove(name) {
            if l.is_valid() {
                return Ok(Some(l));
            }
        }
        let what = || format!("image {name} in {}", self.objects.describe());
        let lease = Lease::acquire(self.objects.clone(), &lease_prefix(name), self.store_id, cfg, 3)
            .map_err(|e| Error::Unavailable(what(), format!("its lease is {e}")))?;
        if let Some((local, local_bytes)) = local {
            if let Some((_, newest)) = fetch::newest_root(self.objects.as_ref(), name)? {
                if newest.store_id != self.store_id
                    && (newest.root != local || newest.size_bytes != local_bytes)
                {
                    let _ = lease.release();
                    return Err(Error::Unavailable(
                        what(),
                        format!(
                            "store {:#018x} wrote it since this copy (epoch {}, generation {}): remove it here and fetch it again",
                            newest.store_id, newest.epoch, newest.root.generation
                        ),
                    ));
                }
            }
        }
        Ok(Some(lease))
    }

    /// A take-over's fence: `root` (the newest root, just fetched) again
    /// under this holder's epoch, so that from now on no root of an
    /// earlier holder is the newest, even one whose PUT lands late (a
    /// replica never sees writes the new holder does not have). Its
    /// ranges are the earlier holder's; the first round after the open
    /// publishes a series of this store's and the sweep takes both.
    /// Best effort: without it, the first round's root fences.
    /// Under the lease `acquire_held` keeps for `name`.
    pub fn fence(&self, name: &str, root: &RootObject) {
        let epoch = lock(&self.held).get(name).filter(|l| l.is_valid()).map(Lease::epoch);
        let put = match epoch {
            Some(epoch) => {
                let fence = RootObject { store_id: self.store_id, epoch, ..root.clone() };
                let key = root_key(name, epoch, fence.root.generation);
                self.objects.put(&key, &fence.encode()).map_err(Error::from)
            }
            None => {
                Err(Error::Unavailable(format!("image {name}"), "the lease ran out before the fence".into()))
            }
        };
        if let Err(e) = put {
            tracing::warn!(image = name, error = %e, "publishing the take-over's fence root failed; the first publication fences");
        }
    }

    /// Takes the lease on `name` (see `acquire`, with no local copy) and
    /// keeps it, renewed, until the image is opened or `release_held`;
    /// false without leases.
    pub fn acquire_held(&self, name: &str) -> Result<bool> {
        let Some(lease) = self.acquire(name, None)? else { return Ok(false) };
        lock(&self.held).insert(name.to_string(), lease);
        Ok(true)
    }

    /// True while the lease `acquire_held` keeps for `name` holds (the lease
    /// thread renews it meanwhile).
    pub fn holds(&self, name: &str) -> bool {
        lock(&self.held).get(name).is_some_and(Lease::is_valid)
    }

    /// Gives up the lease `acquire_held` keeps for `name`, if any.
    pub fn release_held(&self, name: &str) {
        let lease = lock(&self.held).remove(name);
        if let Some(l) = lease {
            release(name, l);
        }
    }

    /// Renews every lease due (see `Lease::renewal_due`), failing images
    /// whose lease is lost or ran out, and releases the leases of images
    /// closed since.
    /// An open image's renewal runs its requests with no lock held, so
    /// neither a round nor `stats` waits behind the bucket. A fetched
    /// image's renews under the `held` lock: an open taking the lease
    /// meanwhile waits for it, so the renewal counted is never lost (a
    /// claim rewritten with the same bytes would look dead to a rival).
    pub fn renew_leases(&self) {
        for (name, l) in lock(&self.held).iter_mut() {
            if l.renewal_due() {
                if let Err(e) = l.renew() {
                    tracing::warn!(image = %name, error = %e, "renewing the lease of a fetched image failed");
                }
            }
        }
        let entries: Vec<(String, Arc<Entry>)> =
            lock(&self.images).iter().map(|(n, e)| (n.clone(), e.clone())).collect();
        for (name, e) in entries {
            let Some(image) = e.image.upgrade() else {
                self.forget(&name, &e);
                continue;
            };
            let _renewal = lock(&e.renewing);
            let renewal = match lock(&e.lease).lease.as_ref() {
                Some(l) if l.renewal_due() => l.renewal(),
                _ => continue,
            };
            // Only this thread renews: the slot's lease is this one, or was
            // released meanwhile (the image closed).
            let done = renewal.run();
            let mut slot = lock(&e.lease);
            let Some(l) = slot.lease.as_mut() else { continue };
            let lost = match l.finish(done) {
                Ok(()) => None,
                Err(crate::objects::lease::LeaseError::Store(err)) if l.is_valid() => {
                    tracing::warn!(image = %name, error = %err, "renewing the lease failed; retried");
                    None
                }
                Err(err) => Some(format!("the lease on image {name} is {err}")),
            };
            if let Some(why) = lost {
                slot.lease = None;
                slot.lost = Some(why.clone());
                drop(slot);
                image.fail(why);
            }
        }
    }

    /// Fails unless the image is written under a lease that holds (or
    /// leases are off).
    pub(super) fn check_lease(&self, name: &str, slot: &Mutex<LeaseSlot>) -> Result<()> {
        let slot = lock(slot);
        match (&self.lease_cfg, &slot.lease) {
            (None, _) => Ok(()),
            (Some(_), Some(l)) if l.is_valid() => Ok(()),
            (Some(_), _) => Err(Error::Unavailable(
                format!("publishing image {name}"),
                slot.lost.clone().unwrap_or_else(|| "this store's lease on it ran out".into()),
            )),
        }
    }
}
