//! Starting a request's disk reads without a thread waiting for them (issue 12,
//! completion-driven execution).
//!
//! `Store::prefetch` plans a read (or a write, whose partly covered blocks must be read
//! first) as one window, pins its blocks without ever waiting (`BlockCache::pin_if_room`),
//! submits its misses to the target's disk scheduler as one batch sharing one `Completion`
//! ticket, and hands back a `PendingLoads`. Its owner asks to be called back when the last
//! load finished (`when_loaded`), on the disk thread that finished it, and then runs the
//! request the ordinary way, which finds the blocks cached. A request that is not one
//! window, has bulk pieces, or finds no room is declined: it runs the blocking way.
//!
//! `Store::read_or_prefetch` is the same for a read, but a read whose blocks are all cached
//! is copied out of the window the prefetch pinned, at once: the request's extents, window
//! and pins are made once, not once to find it cached and again to run it.
//!
//! Invariants: a `PendingLoads` holds a pin on every block of its window until it is
//! dropped, and its drop waits out its own loads before unpinning (as `settle_and_unpin`),
//! so no slot is reassigned under a pending read. Prefetch pins are bounded in total
//! (`PinBudget`: the cache less one request window), so a request waiting for room while
//! prefetched blocks stay pinned always gets it once running requests unpin.

use crate::block_cache::BlockCache;
use crate::completion::Completion;
use crate::error::StoreError;
use crate::extent::Extent;
use crate::fork::Fork;
use crate::request::{self, RequestEngine};
use crate::window::{BlockAction, Cursor, Window};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What `Store::prefetch` did.
#[derive(Debug)]
pub enum Prefetch {
    /// Every block the request needs is cached (or needs no disk read): run it now.
    Ready,
    /// Disk reads were started; the request's blocks stay pinned while the handle lives.
    Pending(PendingLoads),
    /// Nothing was started or pinned; run the request the blocking way.
    Declined(Declined),
}

/// What `Store::read_or_prefetch` did.
#[derive(Debug)]
pub enum ReadOrPrefetch<B> {
    /// Every block was cached: the read ran into the buffer it asked for, here.
    Read(B),
    /// Disk reads were started, as `Prefetch::Pending`; run `Store::read` once they finish.
    Pending(PendingLoads),
    /// Nothing was read, started or pinned; run `Store::read`.
    Declined(Declined),
}

/// Why a prefetch started nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Declined {
    /// The cache has no free or clean room for the misses now (or a bulk request holds
    /// some of them), or prefetches already pin as much of the cache as they may.
    NoRoom,
    /// The request spans more than one window of blocks.
    ManyWindows,
    /// The request has pieces that bypass the cache (`bulk_bytes_min`).
    Bulk,
}

/// The disk reads of one prefetch, and the pins on its blocks.
#[derive(Debug)]
pub struct PendingLoads {
    cache: Arc<BlockCache>,
    /// Boxed: a window is large and the handle travels through callbacks.
    window: Box<Window>,
    ticket: Arc<Completion>,
    _reservation: PinReservation,
    _fork: Arc<Fork>,
}

impl PendingLoads {
    /// Calls `then` with this handle once every load finished (ready or failed): now, on
    /// this thread, if they already have, else on the disk thread that finished the last
    /// one, holding no lock of the cache or the disk scheduler. Keep `then` cheap; dropping
    /// the handle there unpins the blocks (the cache's lock, briefly).
    pub fn when_loaded(self, then: impl FnOnce(PendingLoads) + Send + 'static) {
        let ticket = self.ticket.clone();
        ticket.on_done(Box::new(move || then(self)));
    }

    /// Whether every load finished.
    pub fn is_loaded(&self) -> bool {
        self.ticket.is_done()
    }

    /// Whether a load failed (the request will meet the error again when it runs).
    pub fn failed(&self) -> bool {
        self.ticket.failed()
    }

    /// Blocks this handle keeps pinned.
    pub fn pinned_blocks(&self) -> usize {
        self.window.blocks.len()
    }
}

impl Drop for PendingLoads {
    fn drop(&mut self) {
        let pool = self.cache.pool();
        for entry in self.window.blocks.iter().filter(|entry| entry.action == BlockAction::Read) {
            // Failures are the request's to report when it runs; here we only wait.
            let _ = pool.wait_ready(entry.slot);
        }
        self.cache.unpin_window(&mut self.window);
    }
}

/// Blocks all prefetches together may keep pinned.
#[derive(Debug)]
pub(crate) struct PinBudget {
    pinned_blocks: Arc<AtomicUsize>,
    pinned_blocks_max: usize,
}

impl PinBudget {
    pub(crate) fn new(pinned_blocks_max: usize) -> PinBudget {
        PinBudget { pinned_blocks: Arc::new(AtomicUsize::new(0)), pinned_blocks_max }
    }

    fn reserve(&self, blocks: usize) -> Option<PinReservation> {
        let before = self.pinned_blocks.fetch_add(blocks, Ordering::AcqRel);
        let reservation = PinReservation { pinned_blocks: self.pinned_blocks.clone(), blocks };
        (before + blocks <= self.pinned_blocks_max).then_some(reservation)
    }
}

/// A prefetch's share of the `PinBudget`, given back on drop.
#[derive(Debug)]
struct PinReservation {
    pinned_blocks: Arc<AtomicUsize>,
    blocks: usize,
}

impl Drop for PinReservation {
    fn drop(&mut self) {
        self.pinned_blocks.fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

/// What a prefetch works with.
pub(crate) struct PrefetchContext<'a> {
    pub engine: RequestEngine<'a>,
    pub cache: &'a Arc<BlockCache>,
    pub budget: &'a PinBudget,
}

/// What pinning a request's window and starting its loads came to.
enum Started {
    /// No block to pin: an empty request, or a write covering its blocks whole.
    Nothing,
    /// Every block pinned and none needs a disk read (hits, or zero-filled past the end).
    Cached(PendingLoads),
    /// Disk reads started; the blocks stay pinned while the handle lives.
    Loading(PendingLoads),
    Declined(Declined),
}

/// Pins the request's blocks and starts their loads (see the module). `extents` are
/// validated and move `total_bytes`; the caller holds the fork's shared lock.
pub(crate) fn start(
    context: PrefetchContext<'_>,
    fork: &Arc<Fork>,
    extents: &[Extent],
    total_bytes: usize,
    writing: bool,
) -> Result<Prefetch, StoreError> {
    Ok(match pin_and_load(context, fork, extents, total_bytes, writing)? {
        // Dropping a handle whose loads are done unpins its blocks at once.
        Started::Nothing | Started::Cached(_) => Prefetch::Ready,
        Started::Loading(loads) => Prefetch::Pending(loads),
        Started::Declined(why) => Prefetch::Declined(why),
    })
}

/// A read's prefetch that, finding every block cached, copies the request out of the blocks
/// it pinned then and there, into the buffer `buffer` makes of the extents' total length
/// (asked for only then), instead of unpinning them for the request to plan and pin its
/// window again (`Store::read_or_prefetch`).
pub(crate) fn start_read<B: AsMut<[u8]>>(
    context: PrefetchContext<'_>,
    fork: &Arc<Fork>,
    (extents, total_bytes): (&[Extent], usize),
    buffer: impl FnOnce(usize) -> B,
) -> Result<ReadOrPrefetch<B>, StoreError> {
    let engine = context.engine;
    let pinned = match pin_and_load(context, fork, extents, total_bytes, false)? {
        Started::Nothing => None,
        Started::Cached(loads) => Some(loads),
        Started::Loading(loads) => return Ok(ReadOrPrefetch::Pending(loads)),
        Started::Declined(why) => return Ok(ReadOrPrefetch::Declined(why)),
    };
    let mut out = buffer(total_bytes);
    let length = out.as_mut().len();
    if length != total_bytes {
        return Err(StoreError::BufferLength {
            expected_bytes: total_bytes as u64,
            actual_bytes: length as u64,
        });
    }
    if let Some(mut loads) = pinned {
        // `loads` is dropped after the copy, success or not: that unpins the window.
        request::copy_out(engine, &mut loads.window, extents, out.as_mut())?;
    }
    Ok(ReadOrPrefetch::Read(out))
}

fn pin_and_load(
    context: PrefetchContext<'_>,
    fork: &Arc<Fork>,
    extents: &[Extent],
    total_bytes: usize,
    writing: bool,
) -> Result<Started, StoreError> {
    let engine = context.engine;
    let mut window = Window::new(engine.window_blocks_max, engine.block_shift);
    if !window.plan(extents, Cursor::default()) {
        return Ok(Started::Nothing);
    }
    if window.end.data_offset != total_bytes {
        return Ok(Started::Declined(Declined::ManyWindows));
    }
    if writing {
        // A block the write covers whole is never read; pinning it here would cache zeros.
        window.keep_blocks(|window, position| !window.fully_covered(position));
    }
    if window.blocks.is_empty() {
        return Ok(Started::Nothing);
    }
    let Some(reservation) = context.budget.reserve(window.blocks.len()) else {
        return Ok(Started::Declined(Declined::NoRoom));
    };
    if !engine.cache.pin_if_room(fork, &mut window, false) {
        return Ok(Started::Declined(Declined::NoRoom));
    }
    let reads = window.blocks.iter().filter(|entry| entry.action == BlockAction::Read).count();
    let ticket = Completion::new(reads);
    let loads = PendingLoads {
        cache: context.cache.clone(),
        window: Box::new(window),
        ticket,
        _reservation: reservation,
        _fork: fork.clone(),
    };
    request::start_loads(engine, fork, &loads.window, Some(&loads.ticket))?;
    match reads {
        0 => Ok(Started::Cached(loads)),
        _ => Ok(Started::Loading(loads)),
    }
}
