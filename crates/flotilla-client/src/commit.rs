//! Making writes durable: commit on close, fsync and sync, resending unstable writes after a
//! server restart, and back-pressure when the unstable log is full.
//!
//! A write is acknowledged from a server's cache, so it is *unstable* until a Sync of its fork
//! succeeds in the boot epoch the write was acknowledged in. The client keeps every unstable
//! write (`Core::unstable`). Committing a fork sends again, oldest first, every write of it the
//! server acknowledged in an earlier epoch (a restart lost them), then a Sync; only when the
//! Sync succeeds are the writes it covers released. A file's size is published (`GrowSize`)
//! only after every fork the client wrote is committed.

use crate::core::{unexpected, Core, ServerConnection};
use crate::error::ClientError;
use crate::outage::Service;
use crate::unstable::UnstableWrite;
use bytes::Bytes;
use flotilla_proto::{ErrorCode, ForkRef, IoReply, IoRequest};
use flotilla_types::FileId;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Sends again, oldest first, every unstable write to `addr` (of `fork`, or of every fork)
/// acknowledged in another boot epoch than `server`'s. A write whose fork no longer exists
/// (the file was removed) is dropped: there is nothing left to keep it for.
pub(crate) async fn resend_stale(
    core: &Core,
    server: &ServerConnection,
    addr: &str,
    fork: Option<&ForkRef>,
) -> Result<(), ClientError> {
    let epoch = server.epoch;
    let stale = core
        .unstable
        .lock()
        .select(|w| w.addr == addr && w.epoch != epoch && fork.is_none_or(|f| w.fork == *f));
    if !stale.is_empty() {
        let bytes: usize = stale.iter().map(|(_, w)| w.data.len()).sum();
        // Ordinary recovery: what the restart lost goes again, nothing is lost.
        tracing::info!(
            server = addr,
            epoch,
            writes = stale.len(),
            bytes,
            "server restarted: resending unsynced writes"
        );
    }
    for (sequence, write) in stale {
        match resend_one(core, server, &write).await {
            Ok(()) => core.unstable.lock().resent(sequence, epoch),
            Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
                core.unstable.lock().remove(sequence);
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

async fn resend_one(
    core: &Core,
    server: &ServerConnection,
    write: &UnstableWrite,
) -> Result<(), ClientError> {
    let request = IoRequest::Write { fork: write.fork.clone(), shape: write.shape.clone() };
    let bytes = write.data.len() as u64;
    match core.io_call(server, &request, write.data.clone(), bytes).await? {
        (IoReply::Done { bytes: written }, _) if written == bytes => Ok(()),
        (other, _) => Err(unexpected("resend write", &other)),
    }
}

/// Makes every write of `fork` durable: resends what a restart lost, then syncs. The fork is
/// synced even when this client holds no unstable write of it (an explicit `sync`). While
/// the server cannot be reached (it may be restarting) the commit goes again from the start
/// on a new connection, for up to the outage wait (`outage.rs`).
pub(crate) async fn commit_fork(core: &Core, fork: &ForkRef, addr: &str) -> Result<(), ClientError> {
    core.outlast(Service::Server, move |_| commit_fork_once(core, fork, addr)).await
}

async fn commit_fork_once(core: &Core, fork: &ForkRef, addr: &str) -> Result<(), ClientError> {
    let server = core.server(addr).await?;
    resend_stale(core, &server, addr, Some(fork)).await?;
    // Every write recorded by now was acknowledged, so executed, before this Sync is sent.
    let recorded = core.unstable.lock().last_sequence();
    let request = IoRequest::Sync { fork: fork.clone() };
    match core.io_call(&server, &request, Bytes::new(), 0).await {
        Ok((IoReply::Done { .. }, _)) => {
            core.unstable.lock().synced(fork, server.epoch, recorded);
            Ok(())
        }
        Ok((other, _)) => Err(unexpected("sync", &other)),
        Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
            core.unstable.lock().forget_fork(fork);
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// Commits the forks this client holds unstable writes of (all of them at once).
pub(crate) async fn commit_forks(core: &Core, forks: Vec<(ForkRef, String)>) -> Result<(), ClientError> {
    let commits = forks.iter().map(|(fork, addr)| commit_fork(core, fork, addr));
    futures::future::try_join_all(commits).await.map(|_| ())
}

/// Commits every fork of `file` this client wrote and has not yet made durable.
pub(crate) async fn commit_file(core: &Core, file: FileId) -> Result<(), ClientError> {
    let forks = core.unstable.lock().forks(Some(file));
    commit_forks(core, forks).await
}

/// Write-behind for durability: once the unstable log holds (`held_bytes`, as `record`
/// returned) more than half its bound, one
/// background task commits every fork in it while writes go on, so the syncs overlap the
/// writes (as a kernel's background write-back starts before dirty memory is full) and
/// writers rarely wait in `make_room`. Errors are left to the foreground paths to meet.
pub(crate) fn start_background_drain(core: &Arc<Core>, held_bytes: u64) {
    if held_bytes <= core.unstable_bytes_max / 2 {
        return;
    }
    if core.draining.swap(true, Ordering::AcqRel) {
        return;
    }
    let core = core.clone();
    tokio::spawn(async move {
        let drained = {
            let _drain = core.drain.lock().await;
            let forks = core.unstable.lock().forks(None);
            commit_forks(&core, forks).await
        };
        if let Err(error) = drained {
            tracing::debug!(%error, "background commit of unstable writes failed");
        }
        core.draining.store(false, Ordering::Release);
    });
}

/// Back-pressure: before `bytes` more unstable bytes are taken, if the log would pass
/// `unstable_bytes_max`, every fork with unstable writes is committed (one drain at a time;
/// writers wait for it). A single write larger than the bound still goes through alone.
pub(crate) async fn make_room(core: &Core, bytes: u64) -> Result<(), ClientError> {
    let full = |core: &Core| core.unstable.lock().bytes() + bytes > core.unstable_bytes_max;
    if !full(core) {
        return Ok(());
    }
    let _drain = core.drain.lock().await;
    if !full(core) {
        return Ok(());
    }
    let forks = core.unstable.lock().forks(None);
    commit_forks(core, forks).await
}
