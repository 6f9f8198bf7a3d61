//! What fsck checks of the tier in `chunks/`: the catalog (it decodes,
//! belongs to the store, and every pack it holds as sealed is still
//! here), and which files there are the tier's (chunk::check asks,
//! through [`TierCheck`]).

use super::attach::CACHE_FILE;
use super::catalog::{Catalog, PackPhase, CATALOG_FILE};
use crate::chunk::tier::TierCheck;
use crate::report::{Finding, FsckReport};
use crate::storage::Storage;
use std::path::Path;

/// The tier's side of a check of the chunk directory.
pub const TIER_CHECK: TierCheck = TierCheck { owns_file, packs: check_catalog };

/// True for the catalog (and its temporary) and the extent cache.
fn owns_file(name: &str) -> bool {
    name == CATALOG_FILE || name == CACHE_FILE || name.strip_suffix(".tmp") == Some(CATALOG_FILE)
}

/// The remote catalog, if any: it decodes, belongs to this store, and
/// every pack it holds as sealed (not yet uploaded) is still here.
/// Returns the packs it holds as uploaded, and as foreign, sorted.
pub fn check_catalog(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    pack_files: &[u32],
    report: &mut FsckReport,
) -> (Vec<u32>, Vec<u32>) {
    let path = dir.join(CATALOG_FILE);
    let catalog = match Catalog::read(storage, dir) {
        Ok(Some(c)) => c,
        Ok(None) => return Default::default(),
        Err(e) => {
            report.problem(Finding::from_error("remote-catalog", None, &path, &e));
            return Default::default();
        }
    };
    if catalog.store_id != store_id {
        let detail = format!("belongs to store {:#018x}, not {store_id:#018x}", catalog.store_id);
        report.problem(Finding::new("remote-catalog", None, &path, detail));
        return Default::default();
    }
    for (&id, p) in &catalog.packs {
        if p.phase == PackPhase::Sealed && pack_files.binary_search(&id).is_err() {
            // Deleted by an open for having no live slot (a crash before the
            // catalog was rewritten): the next open drops the entry. Live
            // chunks in it would be reported as lost with the pack.
            let detail = format!(
                "pack {id:#010x} is sealed for upload but its file is gone (dropped by the next open)"
            );
            report.note(Finding::new("remote-catalog", None, &path, detail));
        }
    }
    let of = |phase| catalog.packs.iter().filter(|(_, p)| p.phase == phase).map(|(&id, _)| id).collect();
    (of(PackPhase::Uploaded), of(PackPhase::Foreign))
}
