//! What this client was granted of byte-range locks ([`HeldLocks`], bounded), kept for
//! reclaim after the metadata connection is replaced (see `locks.rs` and `lock_reclaim.rs`),
//! and the gate that keeps lock calls and a reclaim apart. Pure bookkeeping: no I/O.

use flotilla_proto::{HeldLock, LockKind};
use std::collections::HashMap;

/// Lock ranges one client remembers for reclaim; past it, an owner's locks on a file are no
/// longer remembered (and so not reclaimed after a restart of the service; logged).
pub const LOCKS_RECORDED_MAX: usize = 65_536;
/// One remembered range of one owner's lock on one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    write: bool,
    start: u64,
    end: u64,
    pid: u32,
}

/// The locks this client was granted, per (file, owner), as the service keeps them: an
/// owner's new lock replaces its own where they overlap, an unlock splits what sticks out.
/// Pure bookkeeping; at most `max` ranges in all.
#[derive(Debug)]
pub(crate) struct HeldLocks {
    owners: HashMap<(u64, u64), Vec<Range>>,
    count: usize,
    max: usize,
}

impl HeldLocks {
    pub fn new(max: usize) -> HeldLocks {
        HeldLocks { owners: HashMap::new(), count: 0, max }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records a lock (or an unlock) the service did for `owner` on `start..=end` of
    /// `file`. `false`: the record would pass its bound, so the owner's locks on the file
    /// are forgotten (they stay held at the service but are not reclaimed after a restart).
    pub fn set(&mut self, file: u64, owner: u64, kind: LockKind, (start, end): (u64, u64), pid: u32) -> bool {
        let before = self.owners.get(&(file, owner)).map_or(0, Vec::len);
        let mut kept = Vec::with_capacity(before + 2);
        for range in self.owners.remove(&(file, owner)).unwrap_or_default() {
            if range.end < start || end < range.start {
                kept.push(range);
                continue;
            }
            if range.start < start {
                kept.push(Range { end: start - 1, ..range });
            }
            if range.end > end {
                kept.push(Range { start: end + 1, ..range });
            }
        }
        if kind != LockKind::Unlock {
            kept.push(Range { write: kind == LockKind::Write, start, end, pid });
        }
        let grown = self.count - before + kept.len();
        if grown > self.max {
            self.count -= before;
            return false;
        }
        self.count = grown;
        if !kept.is_empty() {
            self.owners.insert((file, owner), kept);
        }
        true
    }

    /// Forgets every lock of `owner` on `file`.
    pub fn release_owner(&mut self, file: u64, owner: u64) {
        if let Some(ranges) = self.owners.remove(&(file, owner)) {
            self.count -= ranges.len();
        }
    }

    /// Forgets the locks on files `open` says are not open here; how many ranges went.
    pub fn retain_files(&mut self, open: impl Fn(u64) -> bool) -> usize {
        let before = self.count;
        self.owners.retain(|(file, _), _| open(*file));
        self.count = self.owners.values().map(Vec::len).sum();
        before - self.count
    }

    /// Every remembered lock, as `ReclaimLocks` presents it.
    pub fn all(&self) -> Vec<HeldLock> {
        let mut all: Vec<HeldLock> = self
            .owners
            .iter()
            .flat_map(|(&(id, owner), ranges)| {
                ranges.iter().map(move |r| HeldLock {
                    id,
                    owner,
                    kind: if r.write { LockKind::Write } else { LockKind::Read },
                    start: r.start,
                    end: r.end,
                    pid: r.pid,
                })
            })
            .collect();
        all.sort_unstable_by_key(|lock| (lock.id, lock.owner, lock.start));
        all
    }
}

/// A client's remembered locks, and the gate that keeps lock calls and a reclaim apart.
pub(crate) struct LockRecord {
    pub(crate) held: parking_lot::Mutex<HeldLocks>,
    /// Lock calls hold it shared; a reclaim holds it alone.
    pub(crate) gate: tokio::sync::RwLock<()>,
}

impl Default for LockRecord {
    fn default() -> Self {
        LockRecord {
            held: parking_lot::Mutex::new(HeldLocks::new(LOCKS_RECORDED_MAX)),
            gate: tokio::sync::RwLock::new(()),
        }
    }
}

impl LockRecord {
    pub(crate) fn note(&self, id: u64, owner: u64, kind: LockKind, range: (u64, u64), pid: u32) {
        if !self.held.lock().set(id, owner, kind, range, pid) {
            tracing::warn!(
                file = id,
                owner,
                locks_max = LOCKS_RECORDED_MAX,
                "too many locks to remember; this owner's locks on the file are not reclaimed after a restart of the metadata service"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(held: &HeldLocks) -> Vec<(u64, u64, LockKind, u64, u64)> {
        held.all().iter().map(|l| (l.id, l.owner, l.kind, l.start, l.end)).collect()
    }

    #[test]
    fn the_record_follows_the_services_rules() {
        let mut held = HeldLocks::new(16);
        assert!(held.set(1, 9, LockKind::Write, (0, 99), 5));
        assert!(held.set(1, 9, LockKind::Unlock, (40, 59), 5));
        assert!(held.set(1, 9, LockKind::Read, (0, 9), 5));
        assert!(held.set(2, 3, LockKind::Read, (0, u64::MAX), 6));
        assert_eq!(
            ranges(&held),
            [
                (1, 9, LockKind::Read, 0, 9),
                (1, 9, LockKind::Write, 10, 39),
                (1, 9, LockKind::Write, 60, 99),
                (2, 3, LockKind::Read, 0, u64::MAX)
            ]
        );
        held.release_owner(1, 9);
        assert_eq!(ranges(&held), [(2, 3, LockKind::Read, 0, u64::MAX)]);
        assert_eq!(held.retain_files(|file| file != 2), 1);
        assert!(held.is_empty());
    }

    #[test]
    fn the_record_is_bounded() {
        let mut held = HeldLocks::new(2);
        assert!(held.set(1, 9, LockKind::Write, (0, 9), 5));
        assert!(held.set(2, 9, LockKind::Write, (0, 9), 5));
        assert!(!held.set(1, 9, LockKind::Unlock, (4, 4), 5), "a split past the bound forgets the owner");
        assert_eq!(ranges(&held), [(2, 9, LockKind::Write, 0, 9)]);
        assert!(held.set(1, 8, LockKind::Read, (0, 0), 5));
        assert!(!held.set(1, 7, LockKind::Read, (0, 0), 5));
        assert_eq!(held.all().len(), 2);
    }
}
