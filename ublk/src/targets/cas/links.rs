//! Stable names for attached images: `/dev/casblk/<image>` and
//! `/dev/casblk/by-store/<store id>/<image>`, symlinks to the current
//! `/dev/ublkbN`, so a QEMU command line names the image, not a number
//! that changes between attachments.
//!
//! The daemon makes them once the device is live and removes them when it
//! stops; a recovered device keeps its number, so its links stay right.
//! The store id is the one in the store's control socket name (a hash of
//! its canonical path). `/dev/casblk/<image>` belongs to the first store
//! that attaches an image of that name; another store's image of the same
//! name gets only its by-store link (and a warning).

use std::path::{Path, PathBuf};

/// Where the links live.
pub const LINK_DIR: &str = "/dev/casblk";

/// The store's id in link and socket names.
pub fn store_id(store_dir: &Path) -> String {
    blake3::hash(store_dir.as_os_str().as_encoded_bytes()).to_hex()[..16].to_string()
}

fn links(store_dir: &Path, image: &str) -> [PathBuf; 2] {
    let dir = Path::new(LINK_DIR);
    [dir.join(image), dir.join("by-store").join(store_id(store_dir)).join(image)]
}

/// Points the image's links at `bdev`. Failures are logged, not fatal: the
/// device works without its names.
pub fn make(store_dir: &Path, image: &str, bdev: &str) {
    for link in links(store_dir, image) {
        match std::fs::read_link(&link) {
            Ok(target) if target == Path::new(bdev) => continue,
            Ok(target) if target.exists() && link.parent() == Some(Path::new(LINK_DIR)) => {
                tracing::warn!(link = %link.display(), to = %target.display(), "name taken by another store's image; only the by-store link points here");
                continue;
            }
            _ => {}
        }
        let made = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(link.parent().expect("links have a parent"))?;
            let tmp = link.with_extension("casblk-tmp");
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(bdev, &tmp)?;
            std::fs::rename(&tmp, &link)
        })();
        match made {
            Ok(()) => tracing::info!(link = %link.display(), dev = bdev, "linked"),
            Err(e) => tracing::warn!(link = %link.display(), "making the link failed: {e}"),
        }
    }
}

/// Removes the image's links that still point at `bdev`.
pub fn remove(store_dir: &Path, image: &str, bdev: &str) {
    for link in links(store_dir, image) {
        if std::fs::read_link(&link).is_ok_and(|t| t == Path::new(bdev)) {
            let _ = std::fs::remove_file(&link);
        }
    }
}
