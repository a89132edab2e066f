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
use flotilla_proto::{ErrorCode, LockInfo, LockKind, MetaReply, MetaRequest};
use std::time::{Duration, Instant};

/// The pause before asking again for a lock the service answered `Recovering`.
const RECOVERING_PAUSE_MS: u64 = 100;

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
