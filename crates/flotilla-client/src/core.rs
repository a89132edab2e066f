//! What every handle of one client shares, above its connections: the connection layer
//! (`transport/`), the writes not yet durable (`commit.rs`), the sizes this client's writes
//! gave files and not yet published, its open handles per file, and its byte-range and
//! inode tokens.

use crate::attr_leases::AttrLeases;
use crate::commit::UnstableWrites;
use crate::error::{unexpected, ClientError};
use crate::library_tokens::LibraryTokens;
use crate::transport::outage::OutageSettings;
use crate::transport::Transport;
use flotilla_proto::{MetaReply, MetaRequest};
use flotilla_rpc::ConnectionConfig;
use flotilla_types::FileId;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Size and mtime this client's writes gave a file, not yet published.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub size_bytes: u64,
    pub mtime_ns: i64,
}

pub(crate) struct Core {
    /// The connections to the metadata service and the I/O servers.
    pub transport: Arc<Transport>,
    /// Writes acknowledged from a server's cache and not yet synced.
    pub unstable: Arc<UnstableWrites>,
    pending: parking_lot::Mutex<HashMap<u64, Pending>>,
    /// This client's open handles per file (`lease.rs`).
    opens: parking_lot::Mutex<HashMap<u64, u32>>,
    /// The byte-range tokens its file handles take (`library_tokens.rs`).
    pub tokens: LibraryTokens,
    /// The coherent attribute cache `stat` answers from (`attr_leases.rs`).
    pub attrs: AttrLeases,
    /// The metadata service refused `CreateAtOpen` (older than it): `create_at` sends
    /// `CreateAt` and `Opened`.
    pub create_at_open_refused: AtomicBool,
    /// The metadata service refused `OpenPath` (older than it): `open` sends a lookup and
    /// `Opened`.
    pub open_path_refused: AtomicBool,
    /// Reused buffers for the data of write requests (`buffers.rs`).
    pub buffers: Arc<flotilla_proto::buffers::BufferPool>,
    /// The byte-range locks this client was granted, reclaimed after a restart of the
    /// metadata service (`locks.rs`).
    pub locks: crate::lock_record::LockRecord,
}

impl Core {
    /// The views of the chains this client's replicated subfiles are on (`replicas.rs`).
    pub fn chains(&self) -> &crate::replicas::ChainViews {
        &self.unstable.chains
    }

    pub fn new(
        meta: crate::transport::LeaderChase,
        client_name: String,
        connection_config: ConnectionConfig,
        unstable_bytes_max: u64,
        tokens: LibraryTokens,
        attrs: AttrLeases,
        outage: OutageSettings,
    ) -> Core {
        let unstable = Arc::new(UnstableWrites::new(unstable_bytes_max));
        let transport = Transport::new(meta, client_name, connection_config, outage, unstable.clone());
        Core {
            transport: Arc::new(transport),
            unstable,
            pending: parking_lot::Mutex::new(HashMap::new()),
            opens: parking_lot::Mutex::new(HashMap::new()),
            tokens,
            attrs,
            create_at_open_refused: AtomicBool::new(false),
            open_path_refused: AtomicBool::new(false),
            // Half of what the unstable log may hold, what one background commit lets go at
            // once (`commit.rs`): a streaming writer then takes every buffer again.
            buffers: flotilla_proto::buffers::BufferPool::new(
                (unstable_bytes_max / 2).min(usize::MAX as u64) as usize,
            ),
            locks: crate::lock_record::LockRecord::default(),
        }
    }

    /// Makes every later metadata request on behalf of `caller` (`None`: as the connection).
    pub fn set_caller(&self, caller: Option<flotilla_types::Caller>) {
        self.transport.set_caller(caller);
        // What was cached was looked up with the old caller's permissions.
        self.attrs.clear();
    }

    /// Counts one more open handle on file `id`.
    pub fn note_opened(&self, id: u64) {
        *self.opens.lock().entry(id).or_insert(0) += 1;
    }

    /// Counts one handle on file `id` fewer; whether it was the last.
    pub fn note_closed(&self, id: u64) -> bool {
        let mut opens = self.opens.lock();
        let Some(count) = opens.get_mut(&id) else { return false };
        *count -= 1;
        if *count > 0 {
            return false;
        }
        opens.remove(&id);
        true
    }

    /// Every file this client has open.
    pub fn open_files(&self) -> Vec<u64> {
        self.opens.lock().keys().copied().collect()
    }

    /// Records that this client wrote file `id` up to `end_bytes` at `mtime_ns`.
    pub fn note_write(&self, id: u64, end_bytes: u64, mtime_ns: i64) {
        let mut pending = self.pending.lock();
        let entry = pending.entry(id).or_insert(Pending { size_bytes: 0, mtime_ns });
        entry.size_bytes = entry.size_bytes.max(end_bytes);
        entry.mtime_ns = entry.mtime_ns.max(mtime_ns);
    }

    pub fn forget_pending(&self, id: u64) {
        self.pending.lock().remove(&id);
    }

    pub fn pending_size(&self, id: u64) -> Option<u64> {
        self.pending.lock().get(&id).map(|p| p.size_bytes)
    }

    /// Raises attributes by this client's unpublished writes (a client always sees its own).
    pub fn overlay(&self, id: u64, attrs: &mut flotilla_types::Attributes) {
        if let Some(pending) = self.pending.lock().get(&id) {
            attrs.size_bytes = attrs.size_bytes.max(pending.size_bytes);
            attrs.mtime_ns = attrs.mtime_ns.max(pending.mtime_ns);
        }
    }

    /// Makes this client's writes of file `id` durable, then publishes the size and mtime
    /// they gave it. A size is published only once every byte below it is committed: when
    /// the commit fails, nothing is published and the writes stay for a later flush.
    pub async fn flush_file(&self, id: u64) -> Result<(), ClientError> {
        self.unstable.commit_file(&self.transport, FileId(id)).await?;
        self.publish_pending(id).await
    }

    /// Publishes the size and mtime this client's writes gave file `id` (`GrowSize`); the
    /// caller has committed the bytes below it. On failure they stay pending.
    ///
    /// The size stays pending (in `overlay`, and for every other flush of the file) until
    /// the service acknowledged it: taken out before, a second handle's `close` running
    /// meanwhile found nothing to publish and returned while the size covering its writes
    /// was still on its way, and a `stat` in that window answered the old size (issue 34:
    /// a read after four writers closed saw 63 of 64 records). Two flushes at once both
    /// send it (`GrowSize` keeps the larger).
    pub async fn publish_pending(&self, id: u64) -> Result<(), ClientError> {
        let Some(pending) = self.pending_of(id) else { return Ok(()) };
        let request =
            MetaRequest::GrowSize { id, size_bytes: pending.size_bytes, mtime_ns: pending.mtime_ns };
        match self.transport.meta_call(request).await {
            Ok(MetaReply::Attributes(_)) => {
                self.published(id, pending);
                Ok(())
            }
            Ok(other) => Err(unexpected("grow size", &other)),
            Err(error) => Err(error),
        }
    }

    /// What is pending for file `id`: its unpublished size and mtime.
    pub(crate) fn pending_of(&self, id: u64) -> Option<Pending> {
        self.pending.lock().get(&id).copied()
    }

    /// `published` was acknowledged by the service: no longer pending, unless a write since
    /// raised the size or mtime past it.
    fn published(&self, id: u64, published: Pending) {
        let mut pending = self.pending.lock();
        let covered = pending
            .get(&id)
            .is_some_and(|now| now.size_bytes <= published.size_bytes && now.mtime_ns <= published.mtime_ns);
        if covered {
            pending.remove(&id);
        }
    }

    /// `overlay` with what was pending before a request to the metadata service was sent
    /// (`before`) as well as what is pending now: a size acknowledged (and so no longer
    /// pending) while the request was under way may be missing from its answer.
    pub(crate) fn overlay_since(
        &self,
        id: u64,
        before: Option<Pending>,
        attrs: &mut flotilla_types::Attributes,
    ) {
        if let Some(before) = before {
            attrs.size_bytes = attrs.size_bytes.max(before.size_bytes);
            attrs.mtime_ns = attrs.mtime_ns.max(before.mtime_ns);
        }
        self.overlay(id, attrs);
    }

    /// Drops what this client has not made durable of file `id`: its unstable writes and
    /// the size they would have published.
    pub fn discard_unpublished(&self, id: u64) {
        let released = self.unstable.log.lock().forget_file(FileId(id));
        self.forget_pending(id);
        if released > 0 {
            tracing::info!(file = id, bytes = released, "unsynced writes given up");
        }
    }
}
