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
//!
//! **Reclaim.** The table lives in memory. After a restart on an existing database (and,
//! with the metadata group, after an election) the service starts a **grace period**
//! (`lock_reclaim_ms`): clients re-present the locks they held (`ReclaimLocks`) and get them
//! back; a request for a new lock that conflicts with nothing reclaimed yet is answered
//! `Recovering` (the client asks again) — never granted, since a lock not reclaimed yet may
//! be in its way. Unlocks and conflicts are answered as always. When the period ends, what
//! was not reclaimed is gone: a reclaim then succeeds only for locks still held (a
//! reconnect without a restart), else it is refused (`LockLost`). So no lock is held by two
//! owners across a restart, provided every live client reclaims within the period.

use flotilla_proto::{ErrorCode, HeldLock, LockInfo, LockKind, WireError};
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

    /// A lock request in the current phase (`recovering`: inside the grace period): an
    /// unlock, or a lock conflicting with nobody outside the grace period, is done.
    pub fn request(
        &mut self,
        file: u64,
        owner: Owner,
        kind: LockKind,
        range: (u64, u64),
        pid: u32,
        recovering: bool,
    ) -> Verdict {
        if recovering && kind != LockKind::Unlock {
            let write = kind == LockKind::Write;
            return match self.conflict(file, owner, write, range.0, range.1) {
                Some(holder) => Verdict::Conflict(holder),
                None => Verdict::Recovering,
            };
        }
        match self.set(file, owner, kind, range, pid) {
            Ok(()) => Verdict::Done,
            Err(holder) => Verdict::Conflict(holder),
        }
    }

    /// Whether `owner`'s locks of kind `write` on `file` cover all of `start..=end`.
    pub fn holds(&self, file: u64, owner: Owner, write: bool, start: u64, end: u64) -> bool {
        let mut pieces: Vec<(u64, u64)> = self
            .files
            .get(&file)
            .map(|held| {
                held.iter()
                    .filter(|l| l.owner == owner && l.write == write && l.overlaps(start, end))
                    .map(|l| (l.start, l.end))
                    .collect()
            })
            .unwrap_or_default();
        pieces.sort_unstable();
        let mut next = start;
        for (piece_start, piece_end) in pieces {
            if piece_start > next {
                return false;
            }
            if piece_end >= end {
                return true;
            }
            next = next.max(piece_end + 1);
        }
        false
    }

    /// `ReclaimLocks` of `session`, all or nothing. Inside the grace period (`recovering`)
    /// the locks are installed unless one conflicts with another owner's lock (in the table
    /// or earlier in `locks`); outside it each must be held already. `Err`: `LockLost`
    /// naming the first lock refused (nothing changed).
    pub fn reclaim(&mut self, session: u64, locks: &[HeldLock], recovering: bool) -> Result<(), WireError> {
        for (i, lock) in locks.iter().enumerate() {
            check_range((lock.start, lock.end))?;
            let write = match lock.kind {
                LockKind::Read => false,
                LockKind::Write => true,
                LockKind::Unlock => return Err(lost(session, lock, "an unlock is no lock to reclaim")),
            };
            let owner = (session, lock.owner);
            if !recovering {
                if !self.holds(lock.id, owner, write, lock.start, lock.end) {
                    return Err(lost(session, lock, "not held, and the lock grace period is over"));
                }
                continue;
            }
            if let Some(holder) = self.conflict(lock.id, owner, write, lock.start, lock.end) {
                let why =
                    format!("conflicts with a {:?} lock on {}..={}", holder.kind, holder.start, holder.end);
                return Err(lost(session, lock, &why));
            }
            let clash = locks[..i].iter().find(|other| {
                other.id == lock.id
                    && other.owner != lock.owner
                    && other.start <= lock.end
                    && lock.start <= other.end
                    && (write || other.kind == LockKind::Write)
            });
            if clash.is_some() {
                return Err(lost(session, lock, "conflicts with another lock of the same reclaim"));
            }
        }
        if recovering {
            for lock in locks {
                let range = (lock.start, lock.end);
                // Checked above: nothing of another owner is in the way.
                let _ = self.set(lock.id, (session, lock.owner), lock.kind, range, lock.pid);
            }
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

    /// Forgets every lock (a new term of a metadata group's leader: the holders reclaim).
    pub fn clear(&mut self) {
        self.files.clear();
        self.count = 0;
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

/// What a lock request got ([`LockTable::request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Done,
    /// Another owner's lock is in the way.
    Conflict(LockInfo),
    /// Inside the grace period and in nobody's way yet: ask again after it.
    Recovering,
}

fn lost(session: u64, lock: &HeldLock, why: &str) -> WireError {
    WireError::new(
        ErrorCode::LockLost,
        format!(
            "cannot reclaim the {:?} lock of owner {:#x} (session {session:#x}) on bytes {}..={} of file {}: {why}",
            lock.kind, lock.owner, lock.start, lock.end, lock.id
        ),
    )
}

fn recovering_error(until: Instant) -> WireError {
    let left_ms = until.saturating_duration_since(Instant::now()).as_millis();
    WireError::new(
        ErrorCode::Recovering,
        format!(
            "the lock grace period after a restart or an election of the metadata service ends in \
             {left_ms} ms; ask again"
        ),
    )
}

/// Bounds of the lock service.
#[derive(Clone, Copy, Debug)]
pub struct LockBounds {
    pub locks_max: usize,
    /// Longest one `SetLock` waits before answering with the conflicting lock.
    pub wait_ms_max: u64,
    /// `SetLock` requests waiting at once; more are answered at once.
    pub waiters_max: usize,
    /// The grace period from start (0: none, a new database), in which only reclaims
    /// are granted (`lock_reclaim_ms`).
    pub reclaim_ms: u64,
}

/// The lock table shared by request handlers, with waiting for conflicts to go.
pub struct Locks {
    table: parking_lot::Mutex<LockTable>,
    changed: parking_lot::Condvar,
    waiters: std::sync::atomic::AtomicUsize,
    bounds: LockBounds,
    /// The end of the grace period (reclaims only until then; a new leader of the metadata
    /// group sets it again: [`Locks::begin_grace`]).
    grace_until: parking_lot::Mutex<Instant>,
}

impl Locks {
    pub fn new(bounds: LockBounds) -> Locks {
        Locks {
            table: parking_lot::Mutex::new(LockTable::new()),
            changed: parking_lot::Condvar::new(),
            waiters: std::sync::atomic::AtomicUsize::new(0),
            bounds,
            grace_until: parking_lot::Mutex::new(Instant::now() + Duration::from_millis(bounds.reclaim_ms)),
        }
    }

    /// The end of the grace period, if it has not passed.
    fn grace(&self) -> Option<Instant> {
        let until = *self.grace_until.lock();
        (Instant::now() < until).then_some(until)
    }

    /// A new grace period until `until`, starting from an empty table: this node just became
    /// the metadata group's leader, and the locks granted under the previous leader live
    /// only in their holders, who reclaim them (`ReclaimLocks`) before anything new is granted.
    pub fn begin_grace(&self, until: Instant) {
        self.table.lock().clear();
        *self.grace_until.lock() = until;
        // Waiting requests look again: their conflicts are gone, the grace period is back.
        self.changed.notify_all();
    }

    /// `ReclaimLocks` (checked by the caller against the session's open files).
    pub fn reclaim(&self, session: u64, locks: &[HeldLock]) -> Result<(), WireError> {
        let mut table = self.table.lock();
        if table.len() + 2 * locks.len() > self.bounds.locks_max {
            return Err(WireError::new(
                ErrorCode::OverLimit,
                format!(
                    "{} byte-range locks are held and {} reclaimed, the limit locks_max = {}",
                    table.len(),
                    locks.len(),
                    self.bounds.locks_max
                ),
            ));
        }
        table.reclaim(session, locks, self.grace().is_some())?;
        drop(table);
        // A request waiting out the grace period may now find its conflict.
        self.changed.notify_all();
        Ok(())
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
            let grace = self.grace();
            let (answer, wake) = match table.request(file, owner, kind, range, pid, grace.is_some()) {
                Verdict::Done => break Ok(None),
                Verdict::Conflict(holder) => (Ok(Some(holder)), deadline),
                Verdict::Recovering => {
                    let until = grace.unwrap_or(deadline);
                    (Err(recovering_error(until)), until.min(deadline))
                }
            };
            if Instant::now() >= deadline {
                break answer;
            }
            if !waiting {
                let now_waiting = self.waiters.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                waiting = true;
                if now_waiting > self.bounds.waiters_max {
                    break answer;
                }
            }
            self.changed.wait_until(&mut table, wake);
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
        let holder = self.table.lock().conflict(file, owner, kind == LockKind::Write, range.0, range.1);
        match (holder, self.grace()) {
            // A lock not reclaimed yet may be in the way.
            (None, Some(until)) => Err(recovering_error(until)),
            (holder, _) => Ok(holder),
        }
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
            reclaim_ms: 0,
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
        let locks = Locks::new(LockBounds { locks_max: 3, wait_ms_max: 0, waiters_max: 1, reclaim_ms: 0 });
        locks.set(1, A, LockKind::Read, (0, 0), 1, 0).unwrap();
        locks.set(1, A, LockKind::Read, (2, 2), 1, 0).unwrap();
        let error = locks.set(1, A, LockKind::Read, (4, 4), 1, 0).unwrap_err();
        assert_eq!(error.code, ErrorCode::OverLimit);
        assert!(error.message.contains("locks_max"), "{}", error.message);
    }

    fn held_lock(owner: u64, kind: LockKind, (start, end): (u64, u64)) -> HeldLock {
        HeldLock { id: 1, owner, kind, start, end, pid: 7 }
    }

    #[test]
    fn a_reclaim_in_the_grace_period_comes_back_and_new_locks_wait() {
        let mut table = LockTable::new();
        let write = held_lock(A.1, LockKind::Write, (0, 9));
        table.reclaim(A.0, &[write], true).unwrap();
        // B's conflicting request is told who holds it; a free range is not granted yet.
        assert!(matches!(table.request(1, B, LockKind::Write, (5, 5), 2, true), Verdict::Conflict(_)));
        assert_eq!(table.request(1, B, LockKind::Write, (20, 29), 2, true), Verdict::Recovering);
        assert_eq!(table.request(1, A, LockKind::Unlock, (0, 4), 1, true), Verdict::Done, "unlocks go on");
        assert!(table.holds(1, A, true, 5, 9) && !table.holds(1, A, true, 0, 9));
        // After the period: granted as usual; a reclaim must be held already.
        assert_eq!(table.request(1, B, LockKind::Write, (20, 29), 2, false), Verdict::Done);
        table.reclaim(A.0, &[held_lock(A.1, LockKind::Write, (5, 9))], false).unwrap();
        let late = table.reclaim(A.0, &[write], false).unwrap_err();
        assert_eq!(late.code, ErrorCode::LockLost);
        assert!(late.message.contains("grace period is over"), "{}", late.message);
    }

    #[test]
    fn conflicting_reclaims_are_refused_whole() {
        let mut table = LockTable::new();
        table.reclaim(A.0, &[held_lock(A.1, LockKind::Read, (0, 9))], true).unwrap();
        let both = [held_lock(B.1, LockKind::Read, (20, 29)), held_lock(B.1, LockKind::Write, (5, 5))];
        let refused = table.reclaim(B.0, &both, true).unwrap_err();
        assert_eq!(refused.code, ErrorCode::LockLost);
        assert!(refused.message.contains("conflicts"), "{}", refused.message);
        assert_eq!(table.len(), 1, "nothing of a refused reclaim is installed");
        let clash = [held_lock(30, LockKind::Write, (50, 59)), held_lock(31, LockKind::Read, (55, 55))];
        assert_eq!(table.reclaim(9, &clash, true).unwrap_err().code, ErrorCode::LockLost);
        let unlock = [held_lock(B.1, LockKind::Unlock, (0, 0))];
        assert_eq!(table.reclaim(B.0, &unlock, true).unwrap_err().code, ErrorCode::LockLost);
    }

    #[test]
    fn the_service_answers_recovering_until_the_grace_period_ends() {
        let locks =
            Locks::new(LockBounds { locks_max: 10, wait_ms_max: 5_000, waiters_max: 4, reclaim_ms: 300 });
        let started = Instant::now();
        let error = locks.set(1, B, LockKind::Write, (0, 0), 2, 0).unwrap_err();
        assert_eq!(error.code, ErrorCode::Recovering, "{}", error.message);
        assert_eq!(locks.get(1, B, LockKind::Write, (0, 0)).unwrap_err().code, ErrorCode::Recovering);
        locks.reclaim(A.0, &[held_lock(A.1, LockKind::Write, (0, 0))]).unwrap();
        assert!(
            locks.set(1, B, LockKind::Write, (0, 0), 2, 0).unwrap().is_some(),
            "the reclaimed lock holds"
        );
        // A waiting request for a free range is granted once the period is over.
        assert_eq!(locks.set(1, B, LockKind::Write, (1, 1), 2, 5_000).unwrap(), None);
        assert!(started.elapsed() >= Duration::from_millis(300));
        let late = locks.reclaim(B.0, &[held_lock(B.1, LockKind::Write, (2, 2))]).unwrap_err();
        assert_eq!(late.code, ErrorCode::LockLost);
    }

    #[test]
    fn an_election_forgets_the_table_and_grants_only_reclaims_until_the_grace_ends() {
        let locks =
            Locks::new(LockBounds { locks_max: 10, wait_ms_max: 5_000, waiters_max: 4, reclaim_ms: 0 });
        assert_eq!(locks.set(1, A, LockKind::Write, (0, 9), 1, 0).unwrap(), None);
        assert_eq!(locks.set(1, B, LockKind::Write, (20, 29), 2, 0).unwrap(), None);
        locks.begin_grace(Instant::now() + Duration::from_millis(300));
        // B's lock (held under the old term) is not reclaimed: nothing new is granted over it
        // nor anywhere else during the period.
        let error = locks.set(1, A, LockKind::Write, (20, 29), 1, 0).unwrap_err();
        assert_eq!(error.code, ErrorCode::Recovering, "{}", error.message);
        locks.reclaim(A.0, &[held_lock(A.1, LockKind::Write, (0, 9))]).unwrap();
        let holder = locks.set(1, B, LockKind::Write, (5, 5), 2, 0).unwrap().expect("A's reclaimed lock");
        assert_eq!((holder.start, holder.end, holder.pid), (0, 9, 7));
        // After the period the unreclaimed range is free; the reclaimed one still is not.
        assert_eq!(locks.set(1, B, LockKind::Write, (20, 29), 2, 5_000).unwrap(), None);
        assert!(locks.set(1, B, LockKind::Write, (0, 0), 2, 0).unwrap().is_some());
    }

    /// One step after a restart, in the property test below.
    #[derive(Clone, Debug)]
    enum Step {
        /// Live client `who` reclaims what it holds (once).
        Reclaim(u64),
        /// Client `who` asks for a lock (owners 4 and 5 held nothing before the restart).
        Request(u64, usize, u64, u64),
        /// The grace period ends (every live client reclaimed within it).
        EndGrace,
        /// A dead client's lock holder comes back after the period and reclaims.
        LateReclaim(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u64..4).prop_map(Step::Reclaim),
            (0u64..6, 0usize..3, 0u64..40, 0u64..10).prop_map(|(w, k, s, l)| Step::Request(w, k, s, l)),
            Just(Step::EndGrace),
            (0u64..4).prop_map(Step::LateReclaim),
        ]
    }

    fn owner_of(who: u64) -> Owner {
        (who + 1, who * 10)
    }

    const KINDS: [LockKind; 3] = [LockKind::Read, LockKind::Write, LockKind::Unlock];

    /// What `who` believes it holds, as `ReclaimLocks` presents it.
    fn presented(belief: &LockTable, who: u64) -> Vec<HeldLock> {
        belief.held(1).iter().map(|(_, l)| held_lock(owner_of(who).1, l.kind, (l.start, l.end))).collect()
    }

    proptest! {
        /// Across a restart, whatever the order of reclaims, new requests and the end of the
        /// grace period: the locks live clients believe they hold never conflict, each
        /// reclaimed belief is held in the new table, and a dead holder's late reclaim fails.
        #[test]
        fn no_two_owners_hold_conflicting_locks_across_a_restart(
            before in proptest::collection::vec((0u64..4, 0usize..3, 0u64..40, 0u64..10), 0..40),
            alive in proptest::collection::vec(any::<bool>(), 4),
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            let mut old = LockTable::new();
            let mut beliefs: Vec<LockTable> = (0..6).map(|_| LockTable::new()).collect();
            for (who, kind, start, length) in before {
                let range = (start, start + length);
                if old.set(1, owner_of(who), KINDS[kind], range, 7).is_ok() {
                    let _ = beliefs[who as usize].set(1, owner_of(who), KINDS[kind], range, 7);
                }
            }
            let live = |who: u64| who >= 4 || alive[who as usize];
            let mut table = LockTable::new();
            let mut recovering = true;
            let mut reclaimed = [false; 6];
            for step in steps {
                let reclaims: Vec<u64> = match step {
                    Step::Reclaim(who) if live(who) && recovering && !reclaimed[who as usize] => vec![who],
                    Step::EndGrace if recovering => (0..4).filter(|w| live(*w) && !reclaimed[*w as usize]).collect(),
                    _ => Vec::new(),
                };
                for who in reclaims {
                    let locks = presented(&beliefs[who as usize], who);
                    prop_assert!(table.reclaim(owner_of(who).0, &locks, true).is_ok(), "a consistent reclaim refused");
                    reclaimed[who as usize] = true;
                }
                match step {
                    Step::EndGrace => recovering = false,
                    Step::Request(who, kind, start, length) if live(who) => {
                        let range = (start, start + length);
                        let verdict = table.request(1, owner_of(who), KINDS[kind], range, 7, recovering);
                        prop_assert!(!(recovering && KINDS[kind] != LockKind::Unlock && verdict == Verdict::Done));
                        if verdict == Verdict::Done {
                            let _ = beliefs[who as usize].set(1, owner_of(who), KINDS[kind], range, 7);
                        }
                    }
                    Step::LateReclaim(who) if !live(who) && !recovering => {
                        let locks = presented(&beliefs[who as usize], who);
                        let outcome = table.reclaim(owner_of(who).0, &locks, false);
                        prop_assert!(locks.is_empty() || outcome.is_err(), "a dead holder's lock came back");
                    }
                    _ => {}
                }
                let believed: Vec<(u64, LockInfo)> = (0..6u64)
                    .filter(|w| live(*w))
                    .flat_map(|w| beliefs[w as usize].held(1).into_iter().map(move |(_, l)| (w, l)))
                    .collect();
                for (i, (a, la)) in believed.iter().enumerate() {
                    for (b, lb) in &believed[i + 1..] {
                        let overlap = la.start <= lb.end && lb.start <= la.end;
                        let exclusive = la.kind == LockKind::Write || lb.kind == LockKind::Write;
                        prop_assert!(a == b || !overlap || !exclusive, "{:?} of {} and {:?} of {}", la, a, lb, b);
                    }
                }
                for (who, lock) in &believed {
                    if *who >= 4 || reclaimed[*who as usize] {
                        let write = lock.kind == LockKind::Write;
                        prop_assert!(table.holds(1, owner_of(*who), write, lock.start, lock.end));
                    }
                }
            }
        }
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
