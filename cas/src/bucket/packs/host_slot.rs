//! Claiming a host slot in a bucket: the top 8 bits of every pack id this
//! store creates once it uploads, so packs of two stores sharing a bucket
//! never have the same id (manifest leaves name packs by id alone).
//!
//! ```text
//! hosts/<slot:02x>-<store:016x>   empty; written once by that store
//! ```
//!
//! A timed claim, as for the lease (objects/lease.rs), since Garage does
//! not enforce conditional writes: (1) LIST `hosts/`; take the lowest slot
//! no key names; (2) PUT our key, and if that took longer than
//! `claim_bound` since the LIST began, delete it and start over; (3) wait
//! `2 * claim_bound`, LIST again: the slot is ours unless a lower store id
//! claims it too (then delete ours and start over). A rival we do not see
//! at (3) finished its PUT later, so its LIST began after ours was
//! written: it saw our key and chose another slot. A slot is taken for
//! good once any key names it (a crashed loser's key only wastes the slot),
//! and a store never reuses a key of its own found in the bucket: only its
//! local catalog says which slot it holds.
//!
//! The claim also names the bucket to the store: a store reopened on a
//! bucket without its claim (another bucket, or one emptied) is refused,
//! since its host slot may be another store's there (attach.rs).

use crate::objects::{ObjectError, ObjectErrorKind, Objects};
use std::time::{Duration, Instant};

const PREFIX: &str = "hosts/";

/// The claim object of `store` on `slot`.
pub fn key(slot: u8, store: u64) -> String {
    format!("{PREFIX}{slot:02x}-{store:016x}")
}

fn parse(key: &str) -> Option<(u8, u64)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (slot, store) = rest.split_once('-')?;
    Some((u8::from_str_radix(slot, 16).ok()?, u64::from_str_radix(store, 16).ok()?))
}

fn claims(objects: &dyn Objects) -> Result<Vec<(u8, u64)>, ObjectError> {
    Ok(crate::objects::list_all(objects, PREFIX)?.iter().filter_map(|k| parse(k)).collect())
}

/// Claims a free host slot for `store` (see the module docs), trying at
/// most `rounds` times.
pub fn claim(
    objects: &dyn Objects,
    store: u64,
    claim_bound: Duration,
    rounds: u32,
) -> Result<u8, ObjectError> {
    for _ in 0..rounds.max(1) {
        let listed = Instant::now();
        let taken = claims(objects)?;
        let Some(slot) = (1..=u8::MAX).find(|s| !taken.iter().any(|c| c.0 == *s)) else {
            return Err(ObjectError::new(
                ObjectErrorKind::Other,
                format!("{}: all 255 host slots are taken", objects.describe()),
            ));
        };
        objects.put(&key(slot, store), &[])?;
        if listed.elapsed() > claim_bound {
            objects.delete(&key(slot, store))?;
            continue;
        }
        std::thread::sleep(2 * claim_bound);
        if claims(objects)?.iter().any(|&(s, other)| s == slot && other < store) {
            objects.delete(&key(slot, store))?;
            std::thread::sleep(claim_bound / 4 * (1 + (store % 4) as u32));
            continue;
        }
        return Ok(slot);
    }
    Err(ObjectError::new(
        ObjectErrorKind::Other,
        format!(
            "{}: could not claim a host slot in {rounds} rounds (contention or slow requests)",
            objects.describe()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::MemObjects;

    #[test]
    fn stores_claiming_at_once_get_distinct_slots() {
        let o = MemObjects::new();
        o.set_latency(Duration::from_millis(2));
        let got: Vec<u8> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6u64)
                .map(|i| {
                    let o = &o;
                    s.spawn(move || claim(o, 0x100 + i, Duration::from_millis(60), 20).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "two stores share a slot: {got:?}");
        assert!(got.iter().all(|&s| s != 0));
    }

    #[test]
    fn a_slot_named_by_any_key_is_never_given_again() {
        let o = MemObjects::new();
        o.put(&key(1, 0x5), &[]).unwrap(); // a crashed loser's key
        assert_eq!(claim(&o, 0x9, Duration::from_millis(20), 3).unwrap(), 2);
        assert_eq!(claim(&o, 0x9, Duration::from_millis(20), 3).unwrap(), 3, "own keys are not reused");
    }
}
