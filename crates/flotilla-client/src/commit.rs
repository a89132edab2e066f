//! Making writes durable: commit on close, fsync and sync, resending unstable writes after a
//! server restart, and back-pressure when the unstable log is full.
//!
//! A write is acknowledged from a server's cache, so it is *unstable* until a Sync of its fork
//! succeeds in the boot epoch the write was acknowledged in. The client keeps every unstable
//! write ([`UnstableWrites`]). Committing a fork sends again, oldest first, every write of it
//! the server acknowledged in an earlier epoch (a restart lost them) and every later one
//! (so that no old write lands over newer bytes), then a Sync; only when
//! the Sync succeeds are the writes it covers released. A file's size is published
//! (`GrowSize`) only after every fork the client wrote is committed.
//!
//! This layer sits on the connection layer and is handed it as an argument; the connection
//! layer calls back through [`OnConnect`] when it opens a server connection, so the writes a
//! restart lost go first.

use crate::error::{unexpected, ClientError};
use crate::replicas::{call, connect, destination, route_chain, Access, ChainViews};
use crate::transport::outage::Service;
use crate::transport::{OnConnect, ServerConnection, Transport};
use crate::unstable::{UnstableLog, UnstableWrite};
use bytes::Bytes;
use flotilla_proto::{ErrorCode, ForkRef, IoReply, IoRequest};
use flotilla_types::FileId;
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The writes this client holds until they are durable, and the committing of them.
pub(crate) struct UnstableWrites {
    /// Writes acknowledged from a server's cache and not yet synced (see `unstable.rs`).
    pub log: parking_lot::Mutex<UnstableLog>,
    /// Most bytes of unstable writes kept before new writes wait for a sync.
    pub bytes_max: u64,
    /// Held while the unstable log is being drained, so one drain runs at a time.
    drain: tokio::sync::Mutex<()>,
    /// Whether a background drain is running (see `start_background_drain`).
    draining: AtomicBool,
    /// The views of the chains replicated subfiles are on (`replicas.rs`).
    pub chains: Arc<ChainViews>,
    /// Striped by fork ([`resend_stripe`]): held shared by a chained write from its sending
    /// until it is recorded, and exclusively by a resend through a chain
    /// (`commit_chained_once`): no write of the fork is acknowledged between the resend's
    /// choice of writes and its end, where an older write resent could land over it
    /// unrecorded. Writes of other forks (other byte spaces) go on meanwhile.
    resending: Box<[tokio::sync::RwLock<()>]>,
}

/// Locks the resends of chained writes are striped over (forks sharing one only wait for
/// each other more often).
pub(crate) const RESEND_STRIPES: usize = 64;

/// The resend lock stripe of `fork` among `stripes`: by file, subfile and fork name, not by
/// target (a chained fork's target names the head the client knew, which changes).
pub(crate) fn resend_stripe(fork: &ForkRef, stripes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (fork.file, fork.subfile, &fork.fork).hash(&mut hasher);
    usize::try_from(hasher.finish() % stripes.max(1) as u64).unwrap_or(0)
}

impl OnConnect for UnstableWrites {
    fn connected<'a>(
        &'a self,
        transport: &'a Transport,
        server: &'a ServerConnection,
        addr: &'a str,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(self.resend_stale(transport, server, addr, None))
    }
}

impl UnstableWrites {
    pub fn new(bytes_max: u64) -> UnstableWrites {
        UnstableWrites {
            log: parking_lot::Mutex::new(UnstableLog::default()),
            bytes_max,
            drain: tokio::sync::Mutex::new(()),
            draining: AtomicBool::new(false),
            chains: Arc::default(),
            resending: (0..RESEND_STRIPES).map(|_| tokio::sync::RwLock::new(())).collect(),
        }
    }

    /// The resend lock of `fork` (see `resending`).
    pub fn resend_lock(&self, fork: &ForkRef) -> &tokio::sync::RwLock<()> {
        &self.resending[resend_stripe(fork, self.resending.len())]
    }

    /// Sends again, oldest first, every unstable write to `addr` (of `fork`, or of every
    /// fork) acknowledged in another boot epoch than `server`'s. A write whose fork no longer
    /// exists (the file was removed) is dropped: there is nothing left to keep it for.
    async fn resend_stale(
        &self,
        transport: &Transport,
        server: &ServerConnection,
        addr: &str,
        fork: Option<&ForkRef>,
    ) -> Result<(), ClientError> {
        let epoch = server.epoch;
        // From the first write acknowledged in another epoch on, every one (`to_resend`).
        let stale = self.log.lock().to_resend(epoch, |w| w.addr == addr && fork.is_none_or(|f| w.fork == *f));
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
            match resend_one(transport, server, &write).await {
                Ok(()) => self.log.lock().resent(sequence, epoch),
                Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
                    self.log.lock().remove(sequence);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Makes every write of `fork` durable: resends what a restart lost, then syncs. The fork
    /// is synced even when this client holds no unstable write of it (an explicit `sync`).
    /// While the server cannot be reached (it may be restarting) the commit goes again from
    /// the start on a new connection, for up to the outage wait (`outage.rs`).
    pub async fn commit_fork(
        &self,
        transport: &Transport,
        fork: &ForkRef,
        addr: &str,
    ) -> Result<(), ClientError> {
        transport.outlast(Service::Server, move |_| self.commit_fork_once(transport, fork, addr)).await
    }

    async fn commit_fork_once(
        &self,
        transport: &Transport,
        fork: &ForkRef,
        addr: &str,
    ) -> Result<(), ClientError> {
        if route_chain(addr).is_some() {
            return self.commit_chained_once(transport, fork, addr).await;
        }
        let server = transport.server(addr).await?;
        self.resend_stale(transport, &server, addr, Some(fork)).await?;
        // Every write recorded by now was acknowledged, so executed, before this Sync is sent.
        let recorded = self.log.lock().last_sequence();
        let request = IoRequest::Sync { fork: fork.clone() };
        match transport.io_call(&server, &request, Bytes::new(), 0).await {
            Ok((IoReply::Done { .. }, _)) => {
                self.log.lock().synced(fork, server.epoch, recorded);
                Ok(())
            }
            Ok((other, _)) => Err(unexpected("sync", &other)),
            Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
                self.log.lock().forget_fork(fork);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// A replicated subfile's commit: one Sync, chained to the head, which settles it only
    /// once every member of the write path has synced. A member that restarted alone left
    /// the chain and is resynced by the others (`replicas.rs`); but when the head's boot
    /// epoch is not the one a write was acknowledged in, every member may have restarted
    /// (a power cut) and lost it from its cache, so such writes go again, oldest first,
    /// through the chain before the Sync, each followed by every later write of the fork
    /// (to a head that never lost them they rewrite the same bytes, newest last).
    async fn commit_chained_once(
        &self,
        transport: &Transport,
        fork: &ForkRef,
        route: &str,
    ) -> Result<(), ClientError> {
        let views = &self.chains;
        let destination = destination(transport, views, route, Access::Change).await?;
        let server = connect(transport, views, &destination).await?;
        let epoch = server.epoch;
        // The head may be another server than the one that acknowledged the stale writes (a
        // chain change), with newer writes of the same ranges acknowledged since in its
        // epoch: those go again after them (`to_resend`), so the newest bytes land last.
        let stale = |log: &UnstableLog| log.to_resend(epoch, |w| w.addr == route && w.fork == *fork);
        let any_stale = !stale(&self.log.lock()).is_empty();
        let resending = match any_stale {
            true => Some(self.resend_lock(fork).write().await),
            false => None,
        };
        let stale = stale(&self.log.lock());
        for (sequence, write) in stale {
            let request = IoRequest::Write { fork: write.fork.clone(), shape: write.shape.clone() };
            let bytes = write.data.len() as u64;
            match call(transport, views, &destination, &server, &request, write.data.clone(), bytes).await {
                Ok((IoReply::Done { bytes: written }, _)) if written == bytes => {
                    self.log.lock().resent(sequence, epoch)
                }
                Ok((other, _)) => return Err(unexpected("resend write", &other)),
                Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
                    self.log.lock().remove(sequence);
                }
                Err(error) => return Err(error),
            }
        }
        drop(resending);
        let recorded = self.log.lock().last_sequence();
        let request = IoRequest::Sync { fork: fork.clone() };
        match call(transport, views, &destination, &server, &request, Bytes::new(), 0).await {
            Ok((IoReply::Done { .. }, _)) => {
                self.log.lock().synced(fork, epoch, recorded);
                Ok(())
            }
            Ok((other, _)) => Err(unexpected("sync", &other)),
            Err(ClientError::Server { error, .. }) if error.code == ErrorCode::NotFound => {
                self.log.lock().forget_fork(fork);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Commits the forks this client holds unstable writes of (all of them at once).
    pub async fn commit_forks(
        &self,
        transport: &Transport,
        forks: Vec<(ForkRef, String)>,
    ) -> Result<(), ClientError> {
        let commits = forks.iter().map(|(fork, addr)| self.commit_fork(transport, fork, addr));
        futures::future::try_join_all(commits).await.map(|_| ())
    }

    /// Commits every fork of `file` this client wrote and has not yet made durable.
    pub async fn commit_file(&self, transport: &Transport, file: FileId) -> Result<(), ClientError> {
        let forks = self.log.lock().forks(Some(file));
        self.commit_forks(transport, forks).await
    }

    /// Write-behind for durability: once the unstable log holds (`held_bytes`, as `record`
    /// returned) more than half its bound, one background task commits every fork in it
    /// while writes go on, so the syncs overlap the writes (as a kernel's background
    /// write-back starts before dirty memory is full) and writers rarely wait in
    /// `make_room`. Errors are left to the foreground paths to meet.
    pub fn start_background_drain(self: &Arc<Self>, transport: &Arc<Transport>, held_bytes: u64) {
        if held_bytes <= self.bytes_max / 2 {
            return;
        }
        if self.draining.swap(true, Ordering::AcqRel) {
            return;
        }
        let (writes, transport) = (self.clone(), transport.clone());
        tokio::spawn(async move {
            let drained = {
                let _drain = writes.drain.lock().await;
                let forks = writes.log.lock().forks(None);
                writes.commit_forks(&transport, forks).await
            };
            if let Err(error) = drained {
                tracing::debug!(%error, "background commit of unstable writes failed");
            }
            writes.draining.store(false, Ordering::Release);
        });
    }

    /// Back-pressure: before `bytes` more unstable bytes are taken, if the log would pass
    /// `bytes_max`, every fork with unstable writes is committed (one drain at a time;
    /// writers wait for it). A single write larger than the bound still goes through alone.
    pub async fn make_room(&self, transport: &Transport, bytes: u64) -> Result<(), ClientError> {
        let full = |writes: &UnstableWrites| writes.log.lock().bytes() + bytes > writes.bytes_max;
        if !full(self) {
            return Ok(());
        }
        let _drain = self.drain.lock().await;
        if !full(self) {
            return Ok(());
        }
        let forks = self.log.lock().forks(None);
        self.commit_forks(transport, forks).await
    }
}

async fn resend_one(
    transport: &Transport,
    server: &ServerConnection,
    write: &UnstableWrite,
) -> Result<(), ClientError> {
    let request = IoRequest::Write { fork: write.fork.clone(), shape: write.shape.clone() };
    let bytes = write.data.len() as u64;
    match transport.io_call(server, &request, write.data.clone(), bytes).await? {
        (IoReply::Done { bytes: written }, _) if written == bytes => Ok(()),
        (other, _) => Err(unexpected("resend write", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_types::{FileId, SubfileIndex, TargetId};

    fn fork(target: u64, file: u64, subfile: u32, name: &str) -> ForkRef {
        ForkRef {
            target: TargetId(target),
            file: FileId(file),
            subfile: SubfileIndex(subfile),
            fork: name.into(),
        }
    }

    #[test]
    fn a_fork_keeps_its_resend_stripe_whatever_head_it_names() {
        let stripe = resend_stripe(&fork(1, 5, 0, "data"), RESEND_STRIPES);
        assert_eq!(
            resend_stripe(&fork(2, 5, 0, "data"), RESEND_STRIPES),
            stripe,
            "another head, the same fork"
        );
        assert!(stripe < RESEND_STRIPES);
        let others: std::collections::BTreeSet<usize> =
            (0..64).map(|file| resend_stripe(&fork(1, file, 0, "data"), RESEND_STRIPES)).collect();
        assert!(others.len() > 1, "forks of different files spread over the stripes");
        assert_eq!(resend_stripe(&fork(1, 5, 0, "data"), 0), 0, "no stripes asked: the first");
        let writes = UnstableWrites::new(1 << 20);
        assert!(std::ptr::eq(
            writes.resend_lock(&fork(1, 5, 0, "data")),
            writes.resend_lock(&fork(9, 5, 0, "data"))
        ));
    }
}
