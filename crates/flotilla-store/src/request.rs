//! Executing one read or write request against the cache (Galley's CP thread).
//!
//! For each window (see `window`): pin every block it touches (all-or-nothing), hand all its
//! misses to the disk scheduler at once, zero-fill the blocks that need no disk read, then
//! copy in extent order, waiting for each block only when the copy reaches it. A block's
//! lock is held while consecutive pieces fall in it and released before waiting for another.
//!
//! Invariants: a request never holds a block's lock while it waits for anything; before it
//! unpins a window it waits until none of the disk reads it started is still running, so a
//! slot is never reassigned under a pending read; a writer raises the fork's size before its
//! blocks become dirty (in `unpin_window`).

use crate::block_cache::{BlockCache, PinOutcome, Placement};
use crate::completion::Completion;
use crate::disk_manager::{DiskOp, DiskOpKind};
use crate::error::StoreError;
use crate::extent::Extent;
use crate::fork::Fork;
use crate::slot_pool::SlotFailure;
use crate::window::{BlockAction, Cursor, Window};
use crate::writeback::write_back;
use std::io;
use std::sync::Arc;

/// What a request needs from the store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestEngine<'a> {
    pub cache: &'a BlockCache,
    pub window_blocks_max: usize,
    pub block_shift: u32,
}

/// Reads the extents into `out`, packed in extent order.
pub(crate) fn read(
    engine: RequestEngine<'_>,
    fork: &Arc<Fork>,
    extents: &[Extent],
    out: &mut [u8],
) -> Result<(), StoreError> {
    let mut window = Window::new(engine.window_blocks_max, engine.block_shift);
    let mut cursor = Cursor::default();
    while window.plan(extents, cursor) {
        pin_window(engine, fork, &mut window, false)?;
        let result = start_loads(engine, fork, &window, None)
            .and_then(|()| copy_out(engine, &mut window, extents, out));
        settle_and_unpin(engine, &mut window);
        result?;
        cursor = window.end;
    }
    Ok(())
}

/// Writes `data`, packed in extent order, to the extents; later extents win on overlap.
pub(crate) fn write(
    engine: RequestEngine<'_>,
    fork: &Arc<Fork>,
    extents: &[Extent],
    data: &[u8],
) -> Result<(), StoreError> {
    let mut window = Window::new(engine.window_blocks_max, engine.block_shift);
    let mut cursor = Cursor::default();
    while window.plan(extents, cursor) {
        pin_window(engine, fork, &mut window, true)?;
        let result = match start_loads(engine, fork, &window, None) {
            Ok(()) => copy_in(engine, &mut window, extents, data),
            Err(error) => Err((0, error)),
        };
        let (Ok(end_bytes) | Err((end_bytes, _))) = &result;
        fork.grow_size(*end_bytes);
        settle_and_unpin(engine, &mut window);
        result.map_err(|(_, error)| error)?;
        cursor = window.end;
    }
    Ok(())
}

/// Pins the window, writing back dirty blocks or waiting as the cache asks. On error nothing
/// is pinned.
fn pin_window(
    engine: RequestEngine<'_>,
    fork: &Arc<Fork>,
    window: &mut Window,
    writing: bool,
) -> Result<(), StoreError> {
    loop {
        match engine.cache.try_pin(fork, window, writing) {
            PinOutcome::Pinned => return Ok(()),
            PinOutcome::WriteBack(items) => {
                write_back(engine.cache, items, Placement::Cold)?;
            }
            PinOutcome::Retry => {}
        }
    }
}

/// Submits every disk read of the window at once and zero-fills the blocks needing none.
/// Each read reports to `ticket`, if given, once its slot is ready or failed (a read the
/// scheduler refused reports at once).
pub(crate) fn start_loads(
    engine: RequestEngine<'_>,
    fork: &Arc<Fork>,
    window: &Window,
    ticket: Option<&Arc<Completion>>,
) -> Result<(), StoreError> {
    let pool = engine.cache.pool();
    let reads: Vec<DiskOp> = window
        .blocks
        .iter()
        .filter(|entry| entry.action == BlockAction::Read)
        .map(|entry| DiskOp {
            fork: fork.clone(),
            block: entry.block,
            slot: entry.slot,
            kind: DiskOpKind::Read(ticket.cloned()),
        })
        .collect();
    let submitted = match reads.is_empty() {
        true => Ok(()),
        false => fork.disk().submit(reads),
    };
    for entry in window.blocks.iter().filter(|entry| entry.action == BlockAction::Zero) {
        pool.zero_fill(entry.slot);
    }
    let Err(rejected) = submitted else {
        return Ok(());
    };
    let error = io::Error::other("the store is shutting down");
    for op in rejected {
        let action = format!("read block {} of {fork}", op.block);
        pool.mark_failed(op.slot, SlotFailure::new(action, &error));
        if let DiskOpKind::Read(Some(ticket)) = op.kind {
            ticket.complete(Err(StoreError::ShuttingDown));
        }
    }
    Err(StoreError::ShuttingDown)
}

/// Copies the window's pieces out of the cache (the window pinned).
pub(crate) fn copy_out(
    engine: RequestEngine<'_>,
    window: &mut Window,
    extents: &[Extent],
    out: &mut [u8],
) -> Result<(), StoreError> {
    let pool = engine.cache.pool();
    let mut current = None;
    for piece in window.pieces(extents) {
        if current.as_ref().map(|(block, _)| *block) != Some(piece.block) {
            // Release the previous block before waiting for the next one.
            drop(current.take());
            let slot = slot_of(window, piece.block)?;
            pool.wait_ready(slot)?;
            current = Some((piece.block, pool.read(slot)));
        }
        if let Some((_, bytes)) = &current {
            out[piece.data_offset..][..piece.length]
                .copy_from_slice(&bytes[piece.offset_in_block..][..piece.length]);
        }
    }
    Ok(())
}

/// Copies the window's pieces into the cache; returns the largest end written, also when it
/// fails part way (the bytes copied so far are in the cache and must count for the size).
fn copy_in(
    engine: RequestEngine<'_>,
    window: &mut Window,
    extents: &[Extent],
    data: &[u8],
) -> Result<u64, (u64, StoreError)> {
    let pool = engine.cache.pool();
    let mut end_bytes_max = 0u64;
    let mut current = None;
    for piece in window.pieces(extents) {
        if current.as_ref().map(|(block, _)| *block) != Some(piece.block) {
            // Release the previous block before waiting for the next one.
            drop(current.take());
            let position =
                window.position(piece.block).ok_or_else(|| (end_bytes_max, unplanned(piece.block)))?;
            let slot = window.blocks[position].slot;
            pool.wait_ready(slot).map_err(|error| (end_bytes_max, error))?;
            window.blocks[position].touched = true;
            current = Some((piece.block, pool.write(slot)));
        }
        if let Some((_, bytes)) = &mut current {
            bytes[piece.offset_in_block..][..piece.length]
                .copy_from_slice(&data[piece.data_offset..][..piece.length]);
        }
        let piece_end = (piece.block << engine.block_shift) + (piece.offset_in_block + piece.length) as u64;
        end_bytes_max = end_bytes_max.max(piece_end);
    }
    Ok(end_bytes_max)
}

fn slot_of(window: &mut Window, block: u64) -> Result<u32, StoreError> {
    let position = window.position(block).ok_or_else(|| unplanned(block))?;
    Ok(window.blocks[position].slot)
}

fn unplanned(block: u64) -> StoreError {
    StoreError::io(
        format!("find block {block} in its request window"),
        io::Error::other("internal error: block was not planned"),
    )
}

/// Waits out the window's own disk reads, then unpins it.
fn settle_and_unpin(engine: RequestEngine<'_>, window: &mut Window) {
    let pool = engine.cache.pool();
    for entry in window.blocks.iter().filter(|entry| entry.action == BlockAction::Read) {
        // Failures were reported to whoever needed the block; here we only wait.
        let _ = pool.wait_ready(entry.slot);
    }
    engine.cache.unpin_window(window);
}
