//! Byte-range locks across clients (fcntl record locks, and flock as mounts forward it):
//! the table is pure bookkeeping, no I/O and no time; [`Locks`] adds the waiting.
//!
//! A lock belongs to an owner — a client session and the owner the client names (the
//! kernel's lock owner of a process, or of an open file for flock) — and covers bytes
//! `start..=end` of one file (`end = u64::MAX`: to the end of any file). Read locks of
//! different owners coexist; a write lock excludes every lock of another owner that
//! overlaps it. An owner's new lock replaces its own locks where they overlap (so a read
//! lock inside a write lock splits it, as POSIX says); an unlock drops the owner's locks
//! in a range, splitting those that stick out.
//!
//! Invariants: an owner's locks on a file never overlap one another; two owners' locks on a
//! file overlap only if both are read locks; at most `locks_max` locks exist in all (a
//! request that could pass it is refused).
//!
//! flock and fcntl locks share one table (the mount cannot tell them apart: FUSE hands both
//! over as SETLK), so on Flotilla they exclude each other, as on NFS.

use flotilla_proto::{ErrorCode, LockInfo, LockKind, WireError};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A lock owner: (client session, the owner the client names).
pub type Owner = (u64, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    owner: Owner,
    write: bool,
    start: u64,
    end: u64,
    pid: u32,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn info(&self) -> LockInfo {
        let kind = if self.write { LockKind::Write } else { LockKind::Read };
        LockInfo { kind, start: self.start, end: self.end, pid: self.pid }
    }
}

/// Every lock on every file.
#[derive(Debug, Default)]
pub struct LockTable {
    files: HashMap<u64, Vec<Held>>,
    count: usize,
}

impl LockTable {
    pub fn new() -> LockTable {
        LockTable { files: HashMap::new(), count: 0 }
    }

    /// Locks held in all.
    pub fn len(&self) -> usize {
        self.count
    }

    /// The first lock of another owner that a `write` (or read) lock of `owner` on
    /// `start..=end` of `file` would conflict with.
    pub fn conflict(&self, file: u64, owner: Owner, write: bool, start: u64, end: u64) -> Option<LockInfo> {
        self.files
            .get(&file)?
            .iter()
            .find(|held| held.owner != owner && held.overlaps(start, end) && (write || held.write))
            .map(Held::info)
    }

    /// Takes (`Read`/`Write`) or drops (`Unlock`) `owner`'s lock on `start..=end` of `file`;
    /// `Err(holder)`: a conflicting lock of another owner. One call adds at most two locks
    /// (a split and the new one); the caller keeps the table within its bound.
    pub fn set(
        &mut self,
        file: u64,
        owner: Owner,
        kind: LockKind,
        (start, end): (u64, u64),
        pid: u32,
    ) -> Result<(), LockInfo> {
        let write = kind == LockKind::Write;
        if kind != LockKind::Unlock {
            if let Some(holder) = self.conflict(file, owner, write, start, end) {
                return Err(holder);
            }
        }
        let held = self.files.entry(file).or_default();
        let before = held.len();
        let mut kept = Vec::with_capacity(before + 2);
        for lock in held.drain(..) {
            if lock.owner != owner || !lock.overlaps(start, end) {
                kept.push(lock);
                continue;
            }
            // The owner's lock sticks out before and/or after the range: keep those parts.
            if lock.start < start {
                kept.push(Held { end: start - 1, ..lock });
            }
            if lock.end > end {
                kept.push(Held { start: end + 1, ..lock });
            }
        }
        if kind != LockKind::Unlock {
            kept.push(Held { owner, write, start, end, pid });
        }
        let grown = self.count - before + kept.len();
        *held = kept;
        self.count = grown;
        if held.is_empty() {
            self.files.remove(&file);
        }
        Ok(())
    }

    /// Drops every lock of `owner` on `file`.
    pub fn release_owner(&mut self, file: u64, owner: Owner) {
        if let Some(held) = self.files.get_mut(&file) {
            let before = held.len();
            held.retain(|lock| lock.owner != owner);
            self.count -= before - held.len();
            if held.is_empty() {
                self.files.remove(&file);
            }
        }
    }

    /// Drops every lock of the sessions `alive` says are gone.
    pub fn retain_sessions(&mut self, alive: impl Fn(u64) -> bool) {
        let mut count = 0;
        self.files.retain(|_, held| {
            held.retain(|lock| alive(lock.owner.0));
            count += held.len();
            !held.is_empty()
        });
        self.count = count;
    }

    /// Every lock on `file`, as (owner, info).
    #[cfg(test)]
    pub fn held(&self, file: u64) -> Vec<(Owner, LockInfo)> {
        self.files
            .get(&file)
            .map(|held| held.iter().map(|l| (l.owner, l.info())).collect())
            .unwrap_or_default()
    }
}

/// Bounds of the lock service.
#[derive(Clone, Copy, Debug)]
pub struct LockBounds {
    pub locks_max: usize,
    /// Longest one `SetLock` waits before answering with the conflicting lock.
    pub wait_ms_max: u64,
    /// `SetLock` requests waiting at once; more are answered at once.
    pub waiters_max: usize,
}

/// The lock table shared by request handlers, with waiting for conflicts to go.
pub struct Locks {
    table: parking_lot::Mutex<LockTable>,
    changed: parking_lot::Condvar,
    waiters: std::sync::atomic::AtomicUsize,
    bounds: LockBounds,
}

impl Locks {
    pub fn new(bounds: LockBounds) -> Locks {
        Locks {
            table: parking_lot::Mutex::new(LockTable::new()),
            changed: parking_lot::Condvar::new(),
            waiters: std::sync::atomic::AtomicUsize::new(0),
            bounds,
        }
    }

    /// `SetLock`: takes or drops the lock, waiting up to `wait_ms` (bounded) for conflicting
    /// locks to go. `Ok(None)`: done; `Ok(Some(holder))`: still conflicting.
    pub fn set(
        &self,
        file: u64,
        owner: Owner,
        kind: LockKind,
        range: (u64, u64),
        pid: u32,
        wait_ms: u64,
    ) -> Result<Option<LockInfo>, WireError> {
        check_range(range)?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms.min(self.bounds.wait_ms_max));
        let mut table = self.table.lock();
        let mut waiting = false;
        let outcome = loop {
            if table.len() + 2 > self.bounds.locks_max && kind != LockKind::Unlock {
                break Err(WireError::new(
                    ErrorCode::OverLimit,
                    format!(
                        "{} byte-range locks are held, the limit locks_max = {}",
                        table.len(),
                        self.bounds.locks_max
                    ),
                ));
            }
            match table.set(file, owner, kind, range, pid) {
                Ok(()) => break Ok(None),
                Err(holder) => {
                    if Instant::now() >= deadline {
                        break Ok(Some(holder));
                    }
                    if !waiting {
                        let now_waiting = self.waiters.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        waiting = true;
                        if now_waiting > self.bounds.waiters_max {
                            break Ok(Some(holder));
                        }
                    }
                    self.changed.wait_until(&mut table, deadline);
                }
            }
        };
        if waiting {
            self.waiters.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        if kind == LockKind::Unlock || matches!(outcome, Ok(None)) {
            self.changed.notify_all();
        }
        outcome
    }

    /// `GetLock`: the first conflicting lock of another owner.
    pub fn get(
        &self,
        file: u64,
        owner: Owner,
        kind: LockKind,
        range: (u64, u64),
    ) -> Result<Option<LockInfo>, WireError> {
        check_range(range)?;
        if kind == LockKind::Unlock {
            return Ok(None);
        }
        Ok(self.table.lock().conflict(file, owner, kind == LockKind::Write, range.0, range.1))
    }

    /// `ReleaseLocks`: drops every lock of `owner` on `file`.
    pub fn release_owner(&self, file: u64, owner: Owner) {
        self.table.lock().release_owner(file, owner);
        self.changed.notify_all();
    }

    /// Drops the locks of sessions that ended (their lease ran out).
    pub fn retain_sessions(&self, alive: impl Fn(u64) -> bool) {
        let mut table = self.table.lock();
        let before = table.len();
        table.retain_sessions(alive);
        if table.len() != before {
            self.changed.notify_all();
        }
    }
}

fn check_range((start, end): (u64, u64)) -> Result<(), WireError> {
    if start > end {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("lock range {start}..={end} is empty"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Owner = (1, 10);
    const B: Owner = (2, 20);

    #[test]
    fn read_locks_share_and_write_locks_exclude() {
        let mut table = LockTable::new();
        table.set(7, A, LockKind::Read, (0, 99), 1).unwrap();
        table.set(7, B, LockKind::Read, (50, 149), 2).unwrap();
        let holder = table.set(7, B, LockKind::Write, (0, 9), 2).unwrap_err();
        assert_eq!((holder.kind, holder.start, holder.end, holder.pid), (LockKind::Read, 0, 99, 1));
        // Another file is independent; B's own read lock does not stop B's write lock.
        table.set(8, B, LockKind::Write, (0, u64::MAX), 2).unwrap();
        table.set(7, B, LockKind::Write, (100, 149), 2).unwrap();
    }

    #[test]
    fn an_unlock_in_the_middle_splits_a_lock() {
        let mut table = LockTable::new();
        table.set(1, A, LockKind::Write, (0, 99), 1).unwrap();
        table.set(1, A, LockKind::Unlock, (40, 59), 1).unwrap();
        let mut held: Vec<(u64, u64)> = table.held(1).iter().map(|(_, i)| (i.start, i.end)).collect();
        held.sort();
        assert_eq!(held, [(0, 39), (60, 99)]);
        assert!(table.set(1, B, LockKind::Write, (40, 59), 2).is_ok());
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn ended_sessions_lose_their_locks() {
        let mut table = LockTable::new();
        table.set(1, A, LockKind::Write, (0, 9), 1).unwrap();
        table.set(2, B, LockKind::Write, (0, 9), 2).unwrap();
        table.retain_sessions(|session| session != A.0);
        assert_eq!(table.len(), 1);
        assert!(table.set(1, B, LockKind::Write, (0, 9), 2).is_ok());
    }

    #[test]
    fn a_waiter_gets_the_lock_when_the_holder_unlocks() {
        let locks = std::sync::Arc::new(Locks::new(LockBounds {
            locks_max: 10,
            wait_ms_max: 10_000,
            waiters_max: 4,
        }));
        assert_eq!(locks.set(1, A, LockKind::Write, (0, 0), 1, 0).unwrap(), None);
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || locks.set(1, B, LockKind::Write, (0, 0), 2, 10_000))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(locks.set(1, B, LockKind::Write, (0, 0), 2, 0).unwrap().is_some(), "A still holds it");
        locks.release_owner(1, A);
        assert_eq!(waiter.join().unwrap().unwrap(), None, "the waiter got the lock");
        assert!(locks.get(1, A, LockKind::Read, (0, 0)).unwrap().is_some(), "B holds it now");
    }

    #[test]
    fn the_table_is_bounded() {
        let locks = Locks::new(LockBounds { locks_max: 3, wait_ms_max: 0, waiters_max: 1 });
        locks.set(1, A, LockKind::Read, (0, 0), 1, 0).unwrap();
        locks.set(1, A, LockKind::Read, (2, 2), 1, 0).unwrap();
        let error = locks.set(1, A, LockKind::Read, (4, 4), 1, 0).unwrap_err();
        assert_eq!(error.code, ErrorCode::OverLimit);
        assert!(error.message.contains("locks_max"), "{}", error.message);
    }

    proptest! {
        /// After any sequence of operations: an owner's locks never overlap each other, two
        /// owners' locks overlap only if both read, and every byte an owner last locked (and
        /// did not unlock since) is covered by its lock of that kind.
        #[test]
        fn the_invariants_hold(ops in proptest::collection::vec((0u64..3, 0u64..3, 0u64..40, 0u64..10), 1..60)) {
            let mut table = LockTable::new();
            let mut model: HashMap<(Owner, u64), LockKind> = HashMap::new();
            for (who, kind, start, length) in ops {
                let owner = (who, who * 10);
                let kind = [LockKind::Read, LockKind::Write, LockKind::Unlock][kind as usize];
                let end = start + length;
                if table.set(1, owner, kind, (start, end), who as u32).is_ok() {
                    for byte in start..=end {
                        match kind {
                            LockKind::Unlock => { model.remove(&(owner, byte)); }
                            other => { model.insert((owner, byte), other); }
                        }
                    }
                }
            }
            let held = table.held(1);
            for (i, (owner_a, a)) in held.iter().enumerate() {
                for (owner_b, b) in &held[i + 1..] {
                    let overlap = a.start <= b.end && b.start <= a.end;
                    if overlap {
                        prop_assert!(owner_a != owner_b, "one owner's locks overlap");
                        prop_assert!(a.kind == LockKind::Read && b.kind == LockKind::Read);
                    }
                }
            }
            for ((owner, byte), kind) in &model {
                let covered = held.iter().any(|(o, l)| o == owner && l.start <= *byte && *byte <= l.end && l.kind == *kind);
                prop_assert!(covered, "byte {} of {:?} not locked {:?}", byte, owner, kind);
            }
            prop_assert_eq!(table.len(), held.len());
        }
    }
}
