//! Byte-range locks across clients (fcntl record locks; the mount forwards flock the same
//! way), kept by the metadata service for this client's session. A lock needs the file open
//! through this client: the service drops the locks of a session whose lease ran out.
//!
//! **Reclaim.** The service keeps its lock table in memory only, so this client remembers
//! what it was granted ([`HeldLocks`], bounded) and, whenever its metadata connection is
//! replaced (the service may have restarted, or another node may lead), presents it again:
//! first the files the locks are on (`KeepOpen`, so the session has them open again), then
//! the locks (`ReclaimLocks`). During the service's grace period they are installed again;
//! after a mere reconnect they are still held and the reclaim only confirms them; a lock the
//! service refuses (`LockLost`: the grace period was over) is dropped from the record and
//! logged as an error — the program holding it has lost it. New lock requests answered
//! `Recovering` (the grace period) are asked again every `RECOVERING_PAUSE_MS`, for up to
//! the outage wait. Lock calls and a reclaim exclude each other (`LockRecord::gate`), so a
//! reclaim presents exactly what the service granted.

use crate::client::Client;
use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::transport::OnMetaReconnect;
use flotilla_proto::{ErrorCode, HeldLock, LockInfo, LockKind, MetaReply, MetaRequest, RECLAIM_LOCKS_MAX};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Lock ranges one client remembers for reclaim; past it, an owner's locks on a file are no
/// longer remembered (and so not reclaimed after a restart of the service; logged).
pub const LOCKS_RECORDED_MAX: usize = 65_536;
/// The pause before asking again for a lock the service answered `Recovering`.
const RECOVERING_PAUSE_MS: u64 = 100;

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
    held: parking_lot::Mutex<HeldLocks>,
    /// Lock calls hold it shared; a reclaim holds it alone.
    gate: tokio::sync::RwLock<()>,
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
    fn note(&self, id: u64, owner: u64, kind: LockKind, range: (u64, u64), pid: u32) {
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

impl Client {
    /// Takes (`Read`, `Write`) or drops (`Unlock`) lock `owner`'s lock on bytes
    /// `start..=end` of file `id`, waiting up to `wait_ms` for conflicting locks of other
    /// owners to go. `Ok(None)`: done; `Ok(Some(holder))`: a conflicting lock is still held.
    /// During the service's grace period after a restart, asks again until it is over.
    pub fn set_lock(
        &self,
        id: u64,
        owner: u64,
        kind: LockKind,
        range: (u64, u64),
        pid: u32,
        wait_ms: u64,
    ) -> Result<Option<LockInfo>, ClientError> {
        self.recovering_retried(|| {
            self.block_on(set_recorded(&self.core, id, owner, kind, range, pid, wait_ms))
        })
    }

    /// The first lock of another owner that would conflict with `kind` on `start..=end`.
    pub fn get_lock(
        &self,
        id: u64,
        owner: u64,
        kind: LockKind,
        (start, end): (u64, u64),
    ) -> Result<Option<LockInfo>, ClientError> {
        let session = self.core.transport.session();
        let request = MetaRequest::GetLock { session, id, owner, kind, start, end };
        self.recovering_retried(|| lock_reply(self.meta(request.clone())?, "test a lock"))
    }

    /// Drops every lock `owner` holds on file `id`.
    pub fn release_locks(&self, id: u64, owner: u64) -> Result<(), ClientError> {
        let session = self.core.transport.session();
        let core = &self.core;
        self.block_on(async {
            let _shared = core.locks.gate.read().await;
            core.locks.held.lock().release_owner(id, owner);
            match core.transport.meta_call(MetaRequest::ReleaseLocks { session, id, owner }).await? {
                MetaReply::Done => Ok(()),
                other => Err(unexpected("release locks", &other)),
            }
        })
    }

    /// Runs `call` again while the service answers `Recovering`, for up to the outage wait.
    fn recovering_retried<T>(&self, call: impl Fn() -> Result<T, ClientError>) -> Result<T, ClientError> {
        let started = Instant::now();
        let limit = Duration::from_millis(self.core.transport.outage.wait_ms);
        loop {
            match call() {
                Err(ClientError::Meta(error))
                    if error.code == ErrorCode::Recovering && started.elapsed() < limit =>
                {
                    tracing::debug!(%error, "lock request during the grace period; asking again");
                    std::thread::sleep(Duration::from_millis(RECOVERING_PAUSE_MS));
                }
                other => return other,
            }
        }
    }
}

/// One `SetLock`, recorded when granted (an unlock is recorded whatever the answer: a lock
/// is never reclaimed after its owner let it go).
async fn set_recorded(
    core: &Core,
    id: u64,
    owner: u64,
    kind: LockKind,
    (start, end): (u64, u64),
    pid: u32,
    wait_ms: u64,
) -> Result<Option<LockInfo>, ClientError> {
    let _shared = core.locks.gate.read().await;
    let session = core.transport.session();
    if kind == LockKind::Unlock {
        core.locks.note(id, owner, kind, (start, end), pid);
    }
    let request = MetaRequest::SetLock { session, id, owner, kind, start, end, pid, wait_ms };
    let holder = lock_reply(core.transport.meta_call(request).await?, "set a lock")?;
    if holder.is_none() && kind != LockKind::Unlock {
        core.locks.note(id, owner, kind, (start, end), pid);
    }
    Ok(holder)
}

fn lock_reply(reply: MetaReply, what: &'static str) -> Result<Option<LockInfo>, ClientError> {
    match reply {
        MetaReply::Lock(holder) => Ok(holder),
        other => Err(unexpected(what, &other)),
    }
}

/// Starts a reclaim of this client's locks on every replaced metadata connection.
pub(crate) struct LockReclaimer {
    core: Weak<Core>,
    runtime: tokio::runtime::Handle,
}

impl LockReclaimer {
    pub fn new(core: &Arc<Core>, runtime: tokio::runtime::Handle) -> LockReclaimer {
        LockReclaimer { core: Arc::downgrade(core), runtime }
    }
}

impl OnMetaReconnect for LockReclaimer {
    fn meta_reconnected(&self) {
        let Some(core) = self.core.upgrade() else { return };
        if core.locks.held.lock().is_empty() {
            return;
        }
        drop(self.runtime.spawn(reclaim(core)));
    }
}

/// Presents every remembered lock to the service again: their files' opens first, then the
/// locks, `RECLAIM_LOCKS_MAX` at a time; a refused batch is retried lock by lock, and each
/// lock refused alone is forgotten.
async fn reclaim(core: Arc<Core>) {
    let _alone = core.locks.gate.write().await;
    let open: HashSet<u64> = core.open_files().into_iter().collect();
    let locks = {
        let mut held = core.locks.held.lock();
        let closed = held.retain_files(|file| open.contains(&file));
        if closed > 0 {
            tracing::info!(locks = closed, "not reclaiming locks on files no longer open here");
        }
        held.all()
    };
    if locks.is_empty() {
        return;
    }
    let session = core.transport.session();
    let mut files: Vec<u64> = locks.iter().map(|lock| lock.id).collect();
    files.dedup();
    if let Err(error) = core.transport.meta_call(MetaRequest::KeepOpen { session, files }).await {
        tracing::warn!(%error, "cannot re-announce the open files of held locks; not reclaiming them now");
        return;
    }
    let mut failed = 0;
    for batch in locks.chunks(RECLAIM_LOCKS_MAX) {
        match reclaim_batch(&core, session, batch).await {
            Ok(()) => {}
            Err(ClientError::Meta(error)) if error.code == ErrorCode::LockLost && batch.len() > 1 => {
                for lock in batch {
                    if let Err(error) = reclaim_batch(&core, session, std::slice::from_ref(lock)).await {
                        forget_lost(&core, lock, &error);
                        failed += 1;
                    }
                }
            }
            Err(error) => {
                failed += batch.len();
                if let [lock] = batch {
                    forget_lost(&core, lock, &error);
                } else {
                    tracing::warn!(%error, locks = batch.len(), "cannot reclaim locks now");
                }
            }
        }
    }
    tracing::info!(
        locks = locks.len() - failed,
        failed,
        "reclaimed the locks held here after a new metadata connection"
    );
}

async fn reclaim_batch(core: &Core, session: u64, batch: &[HeldLock]) -> Result<(), ClientError> {
    let request = MetaRequest::ReclaimLocks { session, locks: batch.to_vec() };
    match core.transport.meta_call(request).await? {
        MetaReply::Done => Ok(()),
        other => Err(unexpected("reclaim locks", &other)),
    }
}

/// A lock the service refused to give back: its holder has lost it.
fn forget_lost(core: &Core, lock: &HeldLock, error: &ClientError) {
    let refused = matches!(error, ClientError::Meta(e) if e.code == ErrorCode::LockLost);
    if !refused {
        tracing::warn!(%error, file = lock.id, "cannot reclaim a lock now");
        return;
    }
    tracing::error!(
        %error,
        file = lock.id,
        owner = lock.owner,
        start = lock.start,
        end = lock.end,
        "a lock held here was lost with a restart of the metadata service"
    );
    core.locks.held.lock().set(lock.id, lock.owner, LockKind::Unlock, (lock.start, lock.end), lock.pid);
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
