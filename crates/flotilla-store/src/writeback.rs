//! Writing dirty blocks back: hand pinned dirty blocks to their targets' disk schedulers,
//! wait for all of them, then unpin them (marking them dirty again if the disk failed).
//!
//! Used by request windows under memory pressure, by `sync`, `flush_aged` and `flush_all`.
//! The caller holds no pins of its own while it waits here.

use crate::block_cache::{BlockCache, Placement, WritebackItem};
use crate::completion::Completion;
use crate::disk_manager::{DiskOp, DiskOpKind};
use crate::error::StoreError;
use std::sync::Arc;

/// Writes the items back and waits; returns how many blocks were written.
pub(crate) fn write_back(
    cache: &BlockCache,
    mut items: Vec<WritebackItem>,
    placement: Placement,
) -> Result<usize, StoreError> {
    if items.is_empty() {
        return Ok(0);
    }
    items.sort_unstable_by_key(|item| {
        (Arc::as_ptr(item.fork.disk()) as usize, item.fork.serial(), item.block)
    });
    let ticket = Completion::new(items.len());
    submit_grouped(&items, &ticket);
    let result = ticket.wait();
    let count = items.len();
    cache.finish_writeback(items, result.is_ok(), placement);
    result.map(|()| count)
}

/// Submits one batch per disk scheduler (items are sorted by scheduler).
fn submit_grouped(items: &[WritebackItem], ticket: &Arc<Completion>) {
    for group in items.chunk_by(|a, b| Arc::ptr_eq(a.fork.disk(), b.fork.disk())) {
        let ops: Vec<DiskOp> = group
            .iter()
            .map(|item| {
                // Counted as started when it was taken (`BlockCache::take_for_writeback`).
                DiskOp {
                    fork: item.fork.clone(),
                    block: item.block,
                    slot: item.slot,
                    kind: DiskOpKind::Write(ticket.clone()),
                }
            })
            .collect();
        let disk = group[0].fork.disk();
        if let Err(rejected) = disk.submit(ops) {
            for op in rejected {
                op.fork.writeback_finished();
                ticket.complete(Err(StoreError::ShuttingDown));
            }
        }
    }
}
