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
use crate::error::Result;
use crate::objects::{list_all, Objects};

/// What was deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Unpublished {
    pub roots: u64,
    pub page_ranges: u64,
}

/// Deletes every root, then every page range, of image `name`.
pub fn delete_published(objects: &dyn Objects, name: &str) -> Result<Unpublished> {
    let mut done = Unpublished::default();
    for key in list_all(objects, &roots_prefix(name))? {
        objects.delete(&key)?;
        done.roots += 1;
    }
    for key in list_all(objects, &pages_prefix(name))? {
        objects.delete(&key)?;
        done.page_ranges += 1;
    }
    Ok(done)
}
