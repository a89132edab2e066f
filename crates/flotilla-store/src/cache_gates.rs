//! Bulk gates of the buffer cache (`BlockCache::begin_bulk`, issue 12 "one cache, not two").
//!
//! A bulk request moves whole blocks straight between its buffer and the fork file; for its
//! time it holds a gate over its blocks: no request maps a missing block inside a gate (it
//! waits on `opened`), and a gate waits for every overlapping gate unless both only read.
//!
//! The list has its own small mutex. Lock order: a thread holding shard locks may take this
//! one (in `try_pin`, to check its misses), never the other way round; `open` and the
//! `BulkGate` drop take it alone. `open_count` (changed under the mutex) lets a window with
//! misses skip the mutex while no gate is open: `begin_bulk` opens its gate before it locks
//! any shard to look at its blocks, so a `try_pin` that locked a shard after that look sees
//! the count raised (the shard mutex orders the two), and one that locked it before had its
//! block mapped by the time `begin_bulk` looks.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Blocks `first..end` of a fork that a bulk request moves around the cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gate {
    pub id: u64,
    pub fork_serial: u64,
    pub first: u64,
    pub end: u64,
    pub write: bool,
}

impl Gate {
    pub(crate) fn covers(&self, fork_serial: u64, block: u64) -> bool {
        self.fork_serial == fork_serial && (self.first..self.end).contains(&block)
    }

    fn conflicts(&self, other: &Gate) -> bool {
        self.fork_serial == other.fork_serial
            && other.first < self.end
            && self.first < other.end
            && (other.write || self.write)
    }
}

#[derive(Debug, Default)]
pub(crate) struct GateList {
    /// Bulk requests in flight (a handful at most: one per worker thread).
    gates: Vec<Gate>,
    next_id: u64,
}

impl GateList {
    /// Whether some gate covers a block of `blocks` of the fork.
    pub(crate) fn covers_any(&self, fork_serial: u64, mut blocks: impl Iterator<Item = u64>) -> bool {
        blocks.any(|block| self.gates.iter().any(|gate| gate.covers(fork_serial, block)))
    }
}

/// The open gates and the condition variable their closing signals.
#[derive(Debug, Default)]
pub(crate) struct Gates {
    list: Mutex<GateList>,
    opened: Condvar,
    open_count: AtomicUsize,
}

impl Gates {
    /// Whether any gate may be open (exact for a caller holding a shard lock, see the module
    /// doc).
    pub(crate) fn any_open(&self) -> bool {
        self.open_count.load(Ordering::Acquire) > 0
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, GateList> {
        self.list.lock()
    }

    /// Waits (holding no shard lock) until a gate closes.
    pub(crate) fn wait_for_close(&self, list: &mut MutexGuard<'_, GateList>) {
        self.opened.wait(list);
    }

    /// Waits out conflicting gates, then opens a gate over `first..end`; returns its id.
    pub(crate) fn open(&self, fork_serial: u64, first: u64, end: u64, write: bool) -> u64 {
        let mut list = self.list.lock();
        let mut gate = Gate { id: 0, fork_serial, first, end, write };
        while list.gates.iter().any(|open| open.conflicts(&gate)) {
            self.opened.wait(&mut list);
        }
        list.next_id += 1;
        gate.id = list.next_id;
        list.gates.push(gate);
        self.open_count.fetch_add(1, Ordering::AcqRel);
        gate.id
    }

    /// Closes a gate and wakes everyone waiting for one.
    pub(crate) fn close(&self, id: u64) {
        let mut list = self.list.lock();
        let before = list.gates.len();
        list.gates.retain(|gate| gate.id != id);
        if list.gates.len() < before {
            self.open_count.fetch_sub(1, Ordering::AcqRel);
        }
        drop(list);
        self.opened.notify_all();
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let list = self.list.lock();
        assert_eq!(self.open_count.load(Ordering::Acquire), list.gates.len());
    }
}
