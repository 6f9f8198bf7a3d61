//! The store's memory budget as others borrow it: a daemon's devices lend
//! their request buffers from it, so that everything the daemon holds for
//! the store (chunk index, compaction buffers, tag buffers) stays under the
//! one `--memory-budget`.
//!
//! ```text
//!  memory_budget_bytes = compaction_memory_bytes + index budget
//!                                                  |
//!                                 index in use  +  lent (MemoryLoan) + free
//! ```
//!
//! A loan comes out of the index's part: what the index does not use today
//! can be lent; the index then grows only into what is left (a later new
//! chunk may be refused with `MemoryBudget`, as at any full budget). A
//! request that does not fit is refused, naming every figure.

use crate::chunk::ChunkStore;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Bytes lent from a store's memory budget; returned when dropped.
pub struct MemoryLoan {
    chunks: Arc<ChunkStore>,
    bytes: u64,
}

impl MemoryLoan {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl std::fmt::Debug for MemoryLoan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLoan").field("bytes", &self.bytes).finish()
    }
}

impl Drop for MemoryLoan {
    fn drop(&mut self) {
        self.chunks.return_memory(self.bytes);
    }
}

/// Lends `bytes` for `what` from `chunks`' part of a budget of
/// `budget_bytes` whose compaction part is `compaction_bytes`.
pub(crate) fn lend(
    chunks: &Arc<ChunkStore>,
    bytes: u64,
    what: &str,
    budget_bytes: u64,
    compaction_bytes: u64,
) -> Result<MemoryLoan> {
    chunks.lend_memory(bytes).map_err(|(index_bytes, lent_bytes)| {
        let free = (budget_bytes - compaction_bytes).saturating_sub(index_bytes + lent_bytes);
        Error::MemoryBudget(format!(
            "{what} need {bytes} bytes, but the store's memory budget of {budget_bytes} bytes has {free} left \
             (compaction {compaction_bytes}, chunk index {index_bytes}, buffers of other devices {lent_bytes})"
        ))
    })?;
    Ok(MemoryLoan { chunks: chunks.clone(), bytes })
}
