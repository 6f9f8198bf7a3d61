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
//! not released; a higher epoch's claim fences every lower one.
//!
//! **Acquire.** (1) LIST the claims: E0 is the newest epoch, W its holder.
//! If W is another store, its claim must stay unchanged (same renewal
//! count) for `lease + margin` on our clock before it counts as expired; a
//! change means W is alive: refused. (2) PUT our claim at E0+1; if more
//! than `claim_bound` passed since the LIST of this round began, mark it
//! released and start over. (3) Wait `2 * claim_bound`, LIST again: we
//! hold E0+1 if no lower store id claims it and no higher epoch exists;
//! otherwise mark ours released and report the contention. Two stores
//! cannot both win: a rival whose claim we do not see at (3) finished its
//! PUT later, so its LIST began after ours was written (its PUT is within
//! `claim_bound` of its LIST), so it saw our claim and would have had to
//! wait out our lease at (1).
//!
//! **Renew** (every `lease / 4`, by the holder): LIST; a higher epoch means
//! the lease is lost. Otherwise rewrite our claim with renewals + 1. The
//! lease is valid until `start of the last successful renewal + lease -
//! margin`: a rival starts counting our silence only after seeing that
//! renewal, and waits `lease + margin`. Past the deadline the holder must
//! stop writing (its requests fail); its roots carry its epoch and can
//! never be taken for the new holder's.

use super::{ObjectError, ObjectErrorKind, Objects};
use crate::format::{Decoder, Encoder};
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
}

fn encode(c: &Claim, lease: Duration) -> Vec<u8> {
    let mut e = Encoder::with_capacity(64);
    e.bytes(&MAGIC).u32(VERSION).u32(if c.released { RELEASED } else { HELD });
    e.u64(c.store).u64(c.epoch).u64(lease.as_millis() as u64).u64(c.renewals);
    e.seal();
    e.buf
}

/// A claim's bytes; None if they are not a claim this build reads (a
/// damaged claim counts as absent: it cannot hold the lease, and its
/// store's next renewal rewrites it).
fn decode(buf: &[u8]) -> Option<Claim> {
    if buf.get(..8)? != MAGIC {
        return None;
    }
    let body = crate::format::unseal(buf, std::path::Path::new("lease claim"), 0).ok()?;
    let mut d = Decoder::new(&body[8..]);
    let (version, state) = (d.u32()?, d.u32()?);
    if version != VERSION || !(state == HELD || state == RELEASED) {
        return None;
    }
    let (store, epoch, _lease_ms, renewals) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
    Some(Claim { store, epoch, renewals, released: state == RELEASED })
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

/// The claims under `prefix`. A claim whose bytes do not decode (or
/// disagree with its key) counts as released: its epoch is taken, but it
/// cannot hold the lease (its store's next renewal rewrites it).
fn claims(objects: &dyn Objects, prefix: &str) -> Result<Vec<Claim>, ObjectError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = objects.list(prefix, after.as_deref(), 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        for info in &page {
            let Some((epoch, store)) = parse_key(prefix, &info.key) else { continue };
            let damaged = Claim { store, epoch, renewals: 0, released: true };
            match objects.get(&info.key) {
                Ok(bytes) => out
                    .push(decode(&bytes).filter(|c| (c.epoch, c.store) == (epoch, store)).unwrap_or(damaged)),
                Err(e) if e.kind == ObjectErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

/// The newest epoch and its holder (lowest store id not released), if any.
fn newest(claims: &[Claim]) -> Option<(u64, Option<Claim>)> {
    let epoch = claims.iter().map(|c| c.epoch).max()?;
    let holder = claims.iter().filter(|c| c.epoch == epoch && !c.released).min_by_key(|c| c.store).copied();
    Some((epoch, holder))
}

/// A held lease. Dropping it does not release it (a crashed holder does
/// not either); [`Lease::release`] does.
pub struct Lease<'o> {
    objects: &'o dyn Objects,
    prefix: String,
    cfg: LeaseConfig,
    me: Claim,
    /// The lease holds until then (see the module docs).
    deadline: Instant,
}

impl<'o> Lease<'o> {
    /// Acquires the lease under `prefix` (a "directory" key ending in `/`)
    /// for `store` (see the module docs). Waits at most about `lease +
    /// margin + 3 * claim_bound` per round, and tries `rounds` rounds
    /// when claims collide or run late.
    pub fn acquire(
        objects: &'o dyn Objects,
        prefix: &str,
        store: u64,
        cfg: LeaseConfig,
        rounds: u32,
    ) -> Result<Lease<'o>, LeaseError> {
        let mut contended = 0;
        for round in 0..rounds.max(1) {
            // A holder found silent for a whole lease (its claim unchanged):
            // if the next listing still shows it so, it has expired.
            let mut expired: Option<Claim> = None;
            let (listed, e0) = loop {
                let listed = Instant::now();
                let all = claims(objects, prefix)?;
                let (e0, holder) = newest(&all).unwrap_or((0, None));
                match holder.filter(|w| w.store != store) {
                    Some(w) if expired != Some(w) => {
                        if !Self::silent(objects, prefix, w, &cfg)? {
                            return Err(LeaseError::Held { store: w.store, epoch: w.epoch });
                        }
                        expired = Some(w);
                    }
                    _ => break (listed, e0),
                }
            };
            let epoch = e0 + 1;
            let me = Claim { store, epoch, renewals: 0, released: false };
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
            let all = claims(objects, prefix)?;
            let rival_lower = all.iter().any(|c| c.epoch == epoch && !c.released && c.store < store);
            let newer =
                all.iter().filter(|c| c.epoch > epoch && !c.released).min_by_key(|c| (c.epoch, c.store));
            if rival_lower || newer.is_some() {
                Self::mark_released(objects, prefix, me, &cfg)?;
                contended = epoch;
                // Back off a little, differently per store, before the next round.
                std::thread::sleep(cfg.claim_bound / 4 * (1 + (store % 4) as u32));
                continue;
            }
            return Ok(Lease {
                objects,
                prefix: prefix.to_string(),
                cfg,
                me,
                deadline: listed + cfg.lease - cfg.margin,
            });
        }
        Err(LeaseError::Contended { epoch: contended })
    }

    /// True once `w`'s claim has stayed unchanged for `lease + margin`;
    /// false as soon as it changes (its store renews it).
    fn silent(objects: &dyn Objects, prefix: &str, w: Claim, cfg: &LeaseConfig) -> Result<bool, ObjectError> {
        let started = Instant::now();
        let k = key(prefix, w.epoch, w.store);
        let poll = (cfg.lease / 8).max(Duration::from_millis(1));
        while started.elapsed() < cfg.lease + cfg.margin {
            std::thread::sleep(poll);
            match objects.get(&k) {
                Ok(bytes) => match decode(&bytes) {
                    Some(c) if c.released => return Ok(true),
                    Some(c) if c.renewals != w.renewals => return Ok(false),
                    _ => {}
                },
                Err(e) if e.kind == ObjectErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(e),
            }
            // A newer epoch appeared: someone else is acquiring; look again.
            let all = claims(objects, prefix)?;
            if all.iter().any(|c| c.epoch > w.epoch && !c.released) {
                return Ok(false);
            }
        }
        Ok(true)
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

    /// Extends the lease, or finds it lost. A store failure leaves the
    /// deadline where it was (the lease runs out unless a later renewal
    /// succeeds in time).
    pub fn renew(&mut self) -> Result<(), LeaseError> {
        let started = Instant::now();
        let all = claims(self.objects, &self.prefix)?;
        if let Some(c) = all.iter().filter(|c| c.epoch > self.me.epoch && !c.released).min_by_key(|c| c.epoch)
        {
            self.deadline = started.min(self.deadline);
            return Err(LeaseError::Lost { by_store: c.store, epoch: c.epoch });
        }
        if !self.is_valid() {
            // Expired before this renewal: a rival may be claiming now.
            return Err(LeaseError::Lost { by_store: 0, epoch: self.me.epoch });
        }
        let next = Claim { renewals: self.me.renewals + 1, ..self.me };
        self.objects.put(&key(&self.prefix, next.epoch, next.store), &encode(&next, self.cfg.lease))?;
        self.me = next;
        self.deadline = started + self.cfg.lease - self.cfg.margin;
        Ok(())
    }

    /// Gives the lease up: the next store acquires it without waiting.
    pub fn release(self) -> Result<(), LeaseError> {
        Self::mark_released(self.objects, &self.prefix, self.me, &self.cfg)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
