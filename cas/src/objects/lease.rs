//! One writer per image across hosts: an exclusive lease with an expiry
//! and a fencing epoch, kept in the object store (issue 18).
//!
//! Garage enforces no conditional write, so the lease cannot be "create
//! this key if absent". It is a timed claim (Fischer's mutual exclusion)
//! that relies only on what every S3 store gives: a PUT that returned is
//! seen by every later LIST and GET, and a key is written by one host only.
//! It assumes clocks run at about the same *rate* (the margin covers the
//! drift); it never compares wall clocks between hosts.
//!
//! ```text
//! <prefix><epoch:016x>-<store:016x>   a claim, written only by that store:
//!   0 magic "CASLEASE" | 8 version u32 | 12 state u32 (1 held, 2 released)
//!   16 store u64 | 24 epoch u64 | 32 lease_ms u64 | 40 renewals u64 | crc32c
//! ```
//!
//! The holder of epoch E is the lowest store id among E's claims that are
//! not released; a higher epoch's claim fences every lower one. A claim
//! that does not decode counts as held (waited out, never taken as
//! released), and only claims of the newest epochs are read.
//!
//! **Acquire.** (1) LIST the claims: E0 is the newest epoch. Every claim
//! of E0 not released and not ours must stay unchanged (same bytes) for
//! `lease + margin` on our clock before they count as expired (all of
//! them: a late claim with a lower id must not hide the real holder); a
//! change means its store is alive: refused. (2) PUT our claim at E0+1; if more
//! than `claim_bound` passed since the LIST of this round began, mark it
//! released and start over. (3) Wait `2 * claim_bound`, LIST again: we
//! hold E0+1 if no lower store id claims it and no higher epoch exists;
//! otherwise mark ours released and report the contention; a holder
//! waited out that has been rewritten since (a renewal that landed late)
//! also refuses. Two stores
//! cannot both win: a rival whose claim we do not see at (3) finished its
//! PUT later, so its LIST began after ours was written (its PUT is within
//! `claim_bound` of its LIST), so it saw our claim and would have had to
//! wait out our lease at (1).
//!
//! **Renew** (every `lease / 4`, by the holder): LIST; a higher epoch means
//! the lease is lost. Otherwise rewrite our claim with renewals + 1; a
//! rewrite that returns after the current deadline does not count (lost).
//! The lease is valid until `start of the last successful renewal + lease -
//! margin`: a rival starts counting our silence only after seeing that
//! renewal, and waits `lease + margin`; one that began counting from the
//! previous renewal sees this one, which returned before the deadline.
//! Writes made under the lease must also complete before the deadline
//! (stage 5 bounds them), or readers must prefer the highest epoch. Past the deadline the holder must
//! stop writing (its requests fail); its roots carry its epoch and can
//! never be taken for the new holder's.

use super::{ObjectError, ObjectErrorKind, Objects};
use crate::format::{Decoder, Encoder};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: [u8; 8] = *b"CASLEASE";
const VERSION: u32 = 1;
const HELD: u32 = 1;
const RELEASED: u32 = 2;

/// Timing of the lease (defaults: 10 s lease, 2 s claim bound, 1 s margin).
#[derive(Clone, Copy, Debug)]
pub struct LeaseConfig {
    /// How long a holder's silence lasts before its lease counts as expired.
    pub lease: Duration,
    /// The longest a LIST-then-PUT may take for the claim to count.
    pub claim_bound: Duration,
    /// Slack for clock rate drift and request latency.
    pub margin: Duration,
}

impl Default for LeaseConfig {
    fn default() -> LeaseConfig {
        LeaseConfig {
            lease: Duration::from_secs(10),
            claim_bound: Duration::from_secs(2),
            margin: Duration::from_secs(1),
        }
    }
}

/// Why a lease was not had or not kept.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// Another store holds it and renews it.
    Held { store: u64, epoch: u64 },
    /// Another store claimed the same epoch at the same time and won, or
    /// the claim took longer than `claim_bound` too many times.
    Contended { epoch: u64 },
    /// A newer epoch exists: this store must stop writing.
    Lost { by_store: u64, epoch: u64 },
    /// The object store failed.
    Store(ObjectError),
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseError::Held { store, epoch } => {
                write!(f, "held by store {store:#018x} (epoch {epoch}), which is renewing it")
            }
            LeaseError::Contended { epoch } => {
                write!(f, "another store claimed epoch {epoch} at the same time")
            }
            LeaseError::Lost { by_store, epoch } => {
                write!(f, "lost: store {by_store:#018x} holds epoch {epoch}")
            }
            LeaseError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl From<ObjectError> for LeaseError {
    fn from(e: ObjectError) -> LeaseError {
        LeaseError::Store(e)
    }
}

/// One claim as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    store: u64,
    epoch: u64,
    renewals: u64,
    released: bool,
    /// crc32c of the claim's bytes: any rewrite changes it (a renewal, or
    /// a claim this build cannot decode being rewritten).
    stamp: u32,
}

fn encode(c: &Claim, lease: Duration) -> Vec<u8> {
    let mut e = Encoder::with_capacity(64);
    e.bytes(&MAGIC).u32(VERSION).u32(if c.released { RELEASED } else { HELD });
    e.u64(c.store).u64(c.epoch).u64(lease.as_millis() as u64).u64(c.renewals);
    e.seal();
    e.buf
}

/// A claim's bytes, found at key (`epoch`, `store`). Bytes that do not
/// decode (damage, or a newer version of this format during an upgrade)
/// make a claim that is held: it is waited out like a silent holder,
/// never taken as released.
fn decode(buf: &[u8], epoch: u64, store: u64) -> Claim {
    // Not the crc of the whole sealed buffer: that is the same constant
    // for every sealed buffer (the crc of data followed by its crc).
    let stamp = crate::format::crc32c(&buf[..buf.len().saturating_sub(4)]) ^ buf.len() as u32;
    let held = Claim { store, epoch, renewals: 0, released: false, stamp };
    let parse = || -> Option<Claim> {
        if buf.get(..8)? != MAGIC {
            return None;
        }
        let body = crate::format::unseal(buf, std::path::Path::new("lease claim"), 0).ok()?;
        let mut d = Decoder::new(&body[8..]);
        let (version, state) = (d.u32()?, d.u32()?);
        if version != VERSION || !(state == HELD || state == RELEASED) {
            return None;
        }
        let (c_store, c_epoch, _lease_ms, renewals) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
        ((c_store, c_epoch) == (store, epoch)).then_some(Claim {
            store,
            epoch,
            renewals,
            released: state == RELEASED,
            stamp,
        })
    };
    parse().unwrap_or(held)
}

fn key(prefix: &str, epoch: u64, store: u64) -> String {
    format!("{prefix}{epoch:016x}-{store:016x}")
}

/// The (epoch, store) a claim's key names.
fn parse_key(prefix: &str, key: &str) -> Option<(u64, u64)> {
    let (epoch, store) = key.strip_prefix(prefix)?.split_once('-')?;
    let hex = |h: &str| (h.len() == 16).then(|| u64::from_str_radix(h, 16).ok()).flatten();
    Some((hex(epoch)?, hex(store)?))
}

/// The (epoch, store) of every claim under `prefix`, by key only.
fn claim_keys(objects: &dyn Objects, prefix: &str) -> Result<Vec<(u64, u64)>, ObjectError> {
    Ok(super::list_all(objects, prefix)?.iter().filter_map(|k| parse_key(prefix, k)).collect())
}

/// One claim read back; None if it is gone.
fn read_claim(
    objects: &dyn Objects,
    prefix: &str,
    epoch: u64,
    store: u64,
) -> Result<Option<Claim>, ObjectError> {
    match objects.get(&key(prefix, epoch, store)) {
        Ok(bytes) => Ok(Some(decode(&bytes, epoch, store))),
        Err(e) if e.kind == ObjectErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The claims not released at epochs `>= min_epoch` (only those are read:
/// older epochs are fenced and never matter again).
fn live_claims(
    objects: &dyn Objects,
    prefix: &str,
    keys: &[(u64, u64)],
    min_epoch: u64,
) -> Result<Vec<Claim>, ObjectError> {
    let mut out = Vec::new();
    for &(epoch, store) in keys.iter().filter(|(e, _)| *e >= min_epoch) {
        out.extend(read_claim(objects, prefix, epoch, store)?.filter(|c| !c.released));
    }
    Ok(out)
}

/// What watching a holder's claims found.
enum Watch {
    /// Unchanged for a whole `lease + margin`, or released or gone.
    Expired,
    /// Rewritten (renewed): its store is alive.
    Alive(Claim),
    /// A newer epoch was claimed meanwhile: look again.
    Changed,
}

/// A held lease. Dropping it does not release it (a crashed holder does
/// not either); [`Lease::release`] does.
pub struct Lease {
    objects: Arc<dyn Objects>,
    prefix: String,
    cfg: LeaseConfig,
    me: Claim,
    /// The lease holds until then (see the module docs).
    deadline: Instant,
}

/// Listings per acquire round before it gives up as contended (each may
/// wait out a holder once).
const LISTINGS_PER_ROUND: u32 = 4;

impl Lease {
    /// Acquires the lease under `prefix` (a "directory" key ending in `/`)
    /// for `store` (see the module docs), in at most `rounds` rounds when
    /// claims collide or run late. A round waits at most about
    /// `4 * (lease + margin) + 3 * claim_bound` plus request times.
    ///
    /// `store` must be unique per process holding the lease: a claim of
    /// our own id at the newest epoch is taken as left by our own earlier
    /// run (the store's directory lock proves that run is gone).
    pub fn acquire(
        objects: Arc<dyn Objects>,
        prefix: &str,
        store: u64,
        cfg: LeaseConfig,
        rounds: u32,
    ) -> Result<Lease, LeaseError> {
        let handle = objects.clone();
        let objects: &dyn Objects = handle.as_ref();
        let mut contended = 0;
        for round in 0..rounds.max(1) {
            // Holders found silent for a whole lease: if the next listing
            // shows exactly them, unchanged, they have expired.
            let mut expired: Vec<Claim> = Vec::new();
            let mut found = None;
            for _ in 0..LISTINGS_PER_ROUND {
                let listed = Instant::now();
                let keys = claim_keys(objects, prefix)?;
                let e0 = keys.iter().map(|k| k.0).max().unwrap_or(0);
                let others: Vec<Claim> = live_claims(objects, prefix, &keys, e0.max(1))?
                    .into_iter()
                    .filter(|c| c.store != store)
                    .collect();
                if others.is_empty() || others == expired {
                    found = Some((listed, e0));
                    break;
                }
                match Self::watch(objects, prefix, &others, &cfg)? {
                    Watch::Alive(w) => return Err(LeaseError::Held { store: w.store, epoch: w.epoch }),
                    Watch::Expired => expired = others,
                    Watch::Changed => expired.clear(),
                }
            }
            let Some((listed, e0)) = found else {
                contended = contended.max(1);
                continue;
            };
            let epoch = e0 + 1;
            let me = Claim { store, epoch, renewals: 0, released: false, stamp: 0 };
            objects.put(&key(prefix, epoch, store), &encode(&me, cfg.lease))?;
            let put_done = Instant::now();
            if put_done - listed > cfg.claim_bound {
                Self::mark_released(objects, prefix, me, &cfg)?;
                tracing::warn!(
                    round,
                    took_ms = (put_done - listed).as_millis() as u64,
                    "lease claim too slow; retrying"
                );
                contended = epoch;
                continue;
            }
            std::thread::sleep(2 * cfg.claim_bound);
            let keys = claim_keys(objects, prefix)?;
            let live = live_claims(objects, prefix, &keys, epoch)?;
            let rival_lower = live.iter().any(|c| c.epoch == epoch && c.store < store);
            let newer = live.iter().any(|c| c.epoch > epoch);
            // A holder waited out must not have renewed since it was judged
            // expired (a renewal that landed late).
            let mut renewed = None;
            for w in &expired {
                if read_claim(objects, prefix, w.epoch, w.store)?
                    .is_some_and(|c| c.stamp != w.stamp && !c.released)
                {
                    renewed = Some(*w);
                }
            }
            if rival_lower || newer || renewed.is_some() {
                Self::mark_released(objects, prefix, me, &cfg)?;
                if let Some(w) = renewed {
                    return Err(LeaseError::Held { store: w.store, epoch: w.epoch });
                }
                contended = epoch;
                // Back off a little, differently per store, before the next round.
                std::thread::sleep(cfg.claim_bound / 4 * (1 + (store % 4) as u32));
                continue;
            }
            return Ok(Lease {
                objects: handle,
                prefix: prefix.to_string(),
                cfg,
                me,
                deadline: listed + cfg.lease - cfg.margin,
            });
        }
        Err(LeaseError::Contended { epoch: contended })
    }

    /// Watches `holders` (the live claims of one epoch) for `lease +
    /// margin`: alive as soon as one is rewritten, expired if none is.
    fn watch(
        objects: &dyn Objects,
        prefix: &str,
        holders: &[Claim],
        cfg: &LeaseConfig,
    ) -> Result<Watch, ObjectError> {
        let started = Instant::now();
        let epoch = holders.iter().map(|c| c.epoch).max().unwrap_or(0);
        let poll = (cfg.lease / 8).max(Duration::from_millis(1));
        while started.elapsed() < cfg.lease + cfg.margin {
            std::thread::sleep(poll);
            let mut gone = 0;
            for w in holders {
                match read_claim(objects, prefix, w.epoch, w.store)? {
                    Some(c) if c.released => gone += 1,
                    Some(c) if c.stamp != w.stamp => return Ok(Watch::Alive(c)),
                    Some(_) => {}
                    None => gone += 1,
                }
            }
            if gone == holders.len() {
                return Ok(Watch::Expired);
            }
            let keys = claim_keys(objects, prefix)?;
            if keys.iter().any(|k| k.0 > epoch) {
                return Ok(Watch::Changed);
            }
        }
        Ok(Watch::Expired)
    }

    fn mark_released(
        objects: &dyn Objects,
        prefix: &str,
        me: Claim,
        cfg: &LeaseConfig,
    ) -> Result<(), ObjectError> {
        let done = Claim { released: true, ..me };
        objects.put(&key(prefix, me.epoch, me.store), &encode(&done, cfg.lease))
    }

    /// The fencing epoch: every root this holder publishes carries it.
    pub fn epoch(&self) -> u64 {
        self.me.epoch
    }

    /// True while the lease holds (before its deadline).
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// How often to call [`Lease::renew`].
    pub fn renew_every(&self) -> Duration {
        self.cfg.lease / 4
    }

    /// True once a quarter of the lease's validity has passed since it was
    /// taken or last renewed (counted from its deadline, so a lease handed
    /// on after a slow open is renewed at once).
    pub fn renewal_due(&self) -> bool {
        let full = self.cfg.lease.saturating_sub(self.cfg.margin);
        self.deadline.saturating_duration_since(Instant::now()) < full * 3 / 4
    }

    /// Extends the lease, or finds it lost. A store failure leaves the
    /// deadline where it was (the lease runs out unless a later renewal
    /// succeeds in time). A renewal whose PUT returns after the current
    /// deadline does not count (a rival may have begun its wait before it
    /// landed): the lease is lost.
    pub fn renew(&mut self) -> Result<(), LeaseError> {
        let done = self.renewal().run();
        self.finish(done)
    }

    /// A renewal to run without holding the lease's owner locked (its
    /// requests can take the store's request bound): [`Renewal::run`]
    /// then [`Lease::finish`] are [`Lease::renew`]. Meanwhile the lease
    /// holds until its current deadline, as before the renewal.
    pub fn renewal(&self) -> Renewal {
        Renewal {
            objects: self.objects.clone(),
            prefix: self.prefix.clone(),
            cfg: self.cfg,
            me: self.me,
            deadline: self.deadline,
        }
    }

    /// Applies what a renewal of this lease found.
    pub fn finish(&mut self, done: Renewed) -> Result<(), LeaseError> {
        self.me = done.me;
        self.deadline = done.deadline;
        done.result
    }
    /// Gives the lease up: the next store acquires it without waiting.
    pub fn release(self) -> Result<(), LeaseError> {
        Self::mark_released(self.objects.as_ref(), &self.prefix, self.me, &self.cfg)?;
        Ok(())
    }
}

/// The network half of [`Lease::renew`] (see [`Lease::renewal`]).
pub struct Renewal {
    objects: Arc<dyn Objects>,
    prefix: String,
    cfg: LeaseConfig,
    me: Claim,
    deadline: Instant,
}

/// What a [`Renewal`] found, for [`Lease::finish`].
pub struct Renewed {
    me: Claim,
    deadline: Instant,
    result: Result<(), LeaseError>,
}

impl Renewal {
    pub fn run(mut self) -> Renewed {
        let result = self.attempt();
        Renewed { me: self.me, deadline: self.deadline, result }
    }

    fn attempt(&mut self) -> Result<(), LeaseError> {
        let started = Instant::now();
        let valid = |deadline: Instant| Instant::now() < deadline;
        let keys = claim_keys(self.objects.as_ref(), &self.prefix)?;
        if let Some(c) = live_claims(self.objects.as_ref(), &self.prefix, &keys, self.me.epoch + 1)?
            .iter()
            .min_by_key(|c| c.epoch)
        {
            self.deadline = started.min(self.deadline);
            return Err(LeaseError::Lost { by_store: c.store, epoch: c.epoch });
        }
        if !valid(self.deadline) {
            // Expired before this renewal: a rival may be claiming now.
            return Err(LeaseError::Lost { by_store: 0, epoch: self.me.epoch });
        }
        let next = Claim { renewals: self.me.renewals + 1, ..self.me };
        self.objects.put(&key(&self.prefix, next.epoch, next.store), &encode(&next, self.cfg.lease))?;
        self.me = next;
        if !valid(self.deadline) {
            return Err(LeaseError::Lost { by_store: 0, epoch: self.me.epoch });
        }
        self.deadline = started + self.cfg.lease - self.cfg.margin;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
