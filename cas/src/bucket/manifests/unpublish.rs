//! Removing an image from the bucket (`Store::unpublish_image`): its roots
//! first, so that from the first DELETE on no store finds an image to
//! fetch (a fetch under way fails when its ranges go), then its page
//! ranges. The lease claims stay (marked released): a later image of the
//! same name continues their epochs, so a holder of the old one that
//! wakes up can never publish into it.
//!
//! A crash part way leaves ranges without a root: invisible, and the
//! first publication of a new image of the name sweeps them
//! (superseded.rs). Packs are not deleted (see design.md, remote GC).

use super::root_object::{pages_prefix, roots_prefix};
use crate::error::{Error, Result};
use crate::objects::{list_all, Objects};

/// What was deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Unpublished {
    pub roots: u64,
    pub page_ranges: u64,
}

/// Deletes every root, then every page range, of image `name`, checking
/// before each DELETE that the lease still holds (`held`): once it ran
/// out, another store may publish ranges of its own, and this stops.
pub fn delete_published(objects: &dyn Objects, name: &str, held: &dyn Fn() -> bool) -> Result<Unpublished> {
    let mut done = Unpublished::default();
    let check = || {
        if held() {
            Ok(())
        } else {
            Err(Error::Unavailable(
                format!("removing image {name} from the bucket"),
                "its lease ran out".into(),
            ))
        }
    };
    for key in list_all(objects, &roots_prefix(name))? {
        check()?;
        objects.delete(&key)?;
        done.roots += 1;
    }
    for key in list_all(objects, &pages_prefix(name))? {
        check()?;
        objects.delete(&key)?;
        done.page_ranges += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::MemObjects;
    use std::cell::Cell;

    #[test]
    fn deletes_roots_then_ranges_and_stops_once_the_lease_runs_out() {
        let o = MemObjects::new();
        for k in [
            "images/vm/roots/a",
            "images/vm/roots/b",
            "images/vm/pages/s/1",
            "images/vm/lease/x",
            "images/vmx/roots/a",
        ] {
            o.put(k, b"x").unwrap();
        }
        let checks = Cell::new(0);
        let held = || {
            checks.set(checks.get() + 1);
            checks.get() <= 2
        };
        let e = delete_published(&o, "vm", &held).unwrap_err();
        assert!(e.to_string().contains("lease ran out"), "{e}");
        assert_eq!(o.keys(), ["images/vm/lease/x", "images/vm/pages/s/1", "images/vmx/roots/a"]);
        let done = delete_published(&o, "vm", &|| true).unwrap();
        assert_eq!(done, Unpublished { roots: 0, page_ranges: 1 });
        assert_eq!(
            o.keys(),
            ["images/vm/lease/x", "images/vmx/roots/a"],
            "the lease claims and other images stay"
        );
    }
}
