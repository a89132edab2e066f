//! The reclaim of this client's locks whenever its metadata connection is replaced (the
//! service may have restarted, or another node may lead): the files first (`KeepOpen`), then
//! the locks (`ReclaimLocks`), while lock calls wait at the record's gate (`locks.rs` has the
//! whole story).

use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::transport::OnMetaReconnect;
use flotilla_proto::{ErrorCode, HeldLock, LockKind, MetaReply, MetaRequest, RECLAIM_LOCKS_MAX};
use std::collections::HashSet;
use std::sync::{Arc, Weak};

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
