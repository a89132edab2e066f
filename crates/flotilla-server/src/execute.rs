//! Executing one request on the store: shape to extents, store call, reply.

use flotilla_proto::{
    ErrorCode, ForkInfo, ForkRef, HsmAction, HsmForkState, IoReply, IoRequest, Residency, TargetTierStatus,
    WireError,
};
use flotilla_request::{Shape, ShapeError, ShapeLimits};
use flotilla_store::{Extent, PendingLoads, Prefetch, ReadOrPrefetch, Store, StoreError};
use flotilla_types::Limits;
use parking_lot::Mutex;

/// A reply ready to be written: the message and the data bytes (pooled).
pub(crate) struct Reply {
    pub request_id: u64,
    pub message: IoReply,
    pub data: Vec<u8>,
    /// The request's share of the server's data budget, released once the reply is written.
    pub memory: Option<flotilla_proto::Reservation>,
}

/// What `Executor::read_or_prefetch` came to.
pub(crate) enum Prepared {
    /// The request ran (a read whose blocks were all cached); its reply.
    Done(Reply),
    /// Its disk reads were started; run it once they finished.
    Pending(PendingLoads),
    /// Run it the ordinary way, now.
    Declined,
}

/// Reusable reply buffers: freshly allocated memory is slow on first touch, so buffers are
/// handed back after their reply is written. Bounded in count and in bytes kept.
pub(crate) struct BufferPool {
    buffers: Mutex<Vec<Vec<u8>>>,
    kept_max: usize,
    buffer_bytes_max: usize,
}

impl BufferPool {
    pub fn new(kept_max: usize, buffer_bytes_max: usize) -> BufferPool {
        BufferPool { buffers: Mutex::new(Vec::new()), kept_max, buffer_bytes_max }
    }

    /// A buffer of exactly `bytes` bytes (contents unspecified until written).
    pub fn take(&self, bytes: usize) -> Vec<u8> {
        let mut buffer = self.buffers.lock().pop().unwrap_or_default();
        if buffer.len() < bytes {
            buffer.resize(bytes, 0);
        } else {
            buffer.truncate(bytes);
        }
        buffer
    }

    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > self.buffer_bytes_max {
            return;
        }
        let mut buffers = self.buffers.lock();
        if buffers.len() < self.kept_max {
            buffers.push(buffer);
        }
    }
}

/// What a worker needs to execute requests.
pub(crate) struct Executor {
    pub store: Store,
    pub limits: Limits,
    pub pool: BufferPool,
}

impl Executor {
    /// Executes one request; every failure becomes an error reply naming what was wrong.
    /// `by_capability`: it came under a client's capability, so a missing subfile of the
    /// file it names is made on demand (a bare request of a trusted service makes none).
    pub fn execute(&self, request_id: u64, request: &IoRequest, data: &[u8], by_capability: bool) -> Reply {
        let mut out = Vec::new();
        let outcome = match by_capability {
            true => self.dispatch_on_demand(request, data, &mut out),
            false => self.dispatch(request, data, &mut out),
        };
        let message = match outcome {
            Ok(message) => message,
            Err(error) => {
                self.pool.give(std::mem::take(&mut out));
                IoReply::Error(error)
            }
        };
        Reply { request_id, message, data: out, memory: None }
    }

    /// Lazy subfile creation: a file is created without a round trip to its servers, so a
    /// request (its capability already checked) that finds its subfile missing creates the
    /// subfile's directory and `data` fork, then runs once more. Costs nothing when the
    /// subfile exists: only a `NotFound` answer leads here.
    fn dispatch_on_demand(
        &self,
        request: &IoRequest,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<IoReply, WireError> {
        let Some((target, file, subfile)) = on_demand_subfile(request) else {
            return self.dispatch(request, data, out);
        };
        let run = || {
            out.clear();
            self.dispatch(request, data, out)
        };
        let create = || self.store.create_subfile(target, file, subfile).map_err(store_error);
        again_once_created(run, |error: &WireError| error.code == ErrorCode::NotFound, create)
    }

    fn dispatch(&self, request: &IoRequest, data: &[u8], out: &mut Vec<u8>) -> Result<IoReply, WireError> {
        let store = &self.store;
        match request {
            IoRequest::Read { fork, shape } => self.read(fork, shape, out),
            IoRequest::Write { fork, shape } => self.write(fork, shape, data),
            IoRequest::CreateSubfile { target, file, subfile } => {
                store.create_subfile(*target, *file, *subfile).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::RemoveSubfile { target, file, subfile } => {
                store.remove_subfile(*target, *file, *subfile).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::CreateFork { fork } => {
                store.create_fork(&store_fork(fork)).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::RemoveFork { fork } => {
                store.remove_fork(&store_fork(fork)).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::ListForks { target, file, subfile } => {
                let forks = store.list_forks(*target, *file, *subfile).map_err(store_error)?;
                Ok(IoReply::Forks(
                    forks.into_iter().map(|(name, size_bytes)| ForkInfo { name, size_bytes }).collect(),
                ))
            }
            IoRequest::ForkSize { fork } => {
                let bytes = store.fork_size(&store_fork(fork)).map_err(store_error)?;
                Ok(IoReply::Size { bytes })
            }
            IoRequest::Extend { fork, size_bytes } => {
                store.extend(&store_fork(fork), *size_bytes).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::Truncate { fork, size_bytes } => {
                store.truncate(&store_fork(fork), *size_bytes).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::Sync { fork } => {
                store.sync(&store_fork(fork)).map_err(store_error)?;
                Ok(IoReply::Done { bytes: 0 })
            }
            IoRequest::Hsm { fork, action } => {
                let state = store.hsm(&store_fork(fork), store_hsm_action(*action)).map_err(store_error)?;
                Ok(IoReply::Hsm(wire_hsm_state(state)))
            }
            IoRequest::HsmStatus => Ok(IoReply::HsmStatus(self.tier_status()?)),
            IoRequest::Hello { .. } | IoRequest::Job { .. } | IoRequest::Stats => {
                Err(WireError::new(ErrorCode::BadRequest, "answered by the connection, not a worker"))
            }
            IoRequest::With { .. } => {
                Err(WireError::new(ErrorCode::BadRequest, "capability envelope not unwrapped"))
            }
            IoRequest::FlushDirectory { .. } | IoRequest::FlushPull { .. } | IoRequest::FlushData { .. } => {
                Err(WireError::new(ErrorCode::BadRequest, "flush message not routed to the flush sessions"))
            }
            IoRequest::Forward { .. } => {
                Err(WireError::new(ErrorCode::BadRequest, "chain forward not routed to the chain logs"))
            }
            // A file with one copy: its blocks are checked; nothing can repair them.
            IoRequest::BlockChecksums { fork, offset, length, .. } => {
                let block_bytes = store.checksum_block_bytes(fork.target).map_err(store_error)?;
                let (offset, length) =
                    crate::scrub_plan::scrub_range(*offset, *length, block_bytes, flotilla_proto::SCRUB_BLOCKS_MAX)
                        .map_err(|message| WireError::new(ErrorCode::OverLimit, message))?;
                let check = store.check_blocks(&store_fork(fork), offset, length).map_err(store_error)?;
                let mut notes = Vec::new();
                if !check.bad.is_empty() {
                    notes.push(format!("target {} holds the only copy: bad blocks cannot be repaired", fork.target));
                }
                Ok(IoReply::BlockChecksums(Box::new(crate::chain_path::report_of(fork.target, check, &[], notes))))
            }
            IoRequest::Chained { chain, version, .. } => Err(WireError::new(
                ErrorCode::Unsupported,
                format!("chained request for chain {chain} v{version}: replicated writes are not served by this build"),
            )),
        }
    }

    /// Runs a read or write now if its blocks are all cached, else starts the disk reads it
    /// needs (`Store::read_or_prefetch`, `Store::prefetch`), holding no thread while they run.
    /// A read found cached is `Done` at once, its window planned and pinned once. `Declined`
    /// when the request must run as usual: a write found cached, a request that cannot be
    /// prefetched without waiting (no room, several windows, bulk pieces), or a bad shape or
    /// missing fork, which the ordinary run then reports (or creates, on demand).
    pub fn read_or_prefetch(&self, request_id: u64, request: &IoRequest) -> Prepared {
        let (fork, shape, writing) = match request {
            IoRequest::Read { fork, shape } => (fork, shape, false),
            IoRequest::Write { fork, shape } => (fork, shape, true),
            _ => return Prepared::Declined,
        };
        let Ok((extents, _)) = self.extents(shape) else { return Prepared::Declined };
        if writing {
            return match self.store.prefetch(&store_fork(fork), &extents, true) {
                Ok(Prefetch::Pending(loads)) => Prepared::Pending(loads),
                Ok(Prefetch::Ready | Prefetch::Declined(_)) | Err(_) => Prepared::Declined,
            };
        }
        let buffer = |bytes| self.pool.take(bytes);
        match self.store.read_or_prefetch(&store_fork(fork), &extents, buffer) {
            Ok(ReadOrPrefetch::Read(out)) => {
                Prepared::Done(Reply { request_id, message: IoReply::Data, data: out, memory: None })
            }
            Ok(ReadOrPrefetch::Pending(loads)) => Prepared::Pending(loads),
            Ok(ReadOrPrefetch::Declined(_)) | Err(_) => Prepared::Declined,
        }
    }

    fn tier_status(&self) -> Result<Vec<TargetTierStatus>, WireError> {
        let mut status = Vec::new();
        for target in self.store.target_ids() {
            let Some(stats) = self.store.tier_stats(target).map_err(store_error)? else { continue };
            status.push(TargetTierStatus {
                target,
                archived_forks: stats.archived_forks,
                archived_bytes: stats.archived_bytes,
                recalls: stats.recalls,
                recalled_bytes: stats.recalled_bytes,
                recall_failures: stats.recall_failures,
                released_forks: stats.released_forks,
                superseded_copies: stats.superseded_copies,
                read_throughs: stats.read_throughs,
                reclaimed_blocks: stats.reclaimed_blocks,
                dirty_blocks: stats.dirty_blocks,
                clean_blocks: stats.clean_blocks,
                free_blocks: stats.free_blocks,
                block_bytes: stats.block_bytes,
            });
        }
        Ok(status)
    }

    fn extents(&self, shape: &Shape) -> Result<(Vec<Extent>, u64), WireError> {
        let limits = ShapeLimits {
            pieces_max: self.limits.pieces_per_request_max,
            bytes_max: self.limits.request_bytes_max,
        };
        let summary = shape.validate(&limits).map_err(shape_error)?;
        let mut extents = Vec::with_capacity(summary.piece_count as usize);
        shape
            .for_each_piece(|piece| {
                extents.push(Extent { offset: piece.file_offset, length: piece.length });
                Ok::<(), ShapeError>(())
            })
            .map_err(shape_error)?;
        Ok((extents, summary.total_bytes))
    }

    fn read(&self, fork: &ForkRef, shape: &Shape, out: &mut Vec<u8>) -> Result<IoReply, WireError> {
        let (extents, total_bytes) = self.extents(shape)?;
        *out = self.pool.take(total_bytes as usize);
        self.store.read(&store_fork(fork), &extents, out).map_err(store_error)?;
        Ok(IoReply::Data)
    }

    fn write(&self, fork: &ForkRef, shape: &Shape, data: &[u8]) -> Result<IoReply, WireError> {
        let (extents, total_bytes) = self.extents(shape)?;
        if data.len() as u64 != total_bytes {
            let message =
                format!("write carries {} data bytes but its shape moves {total_bytes}", data.len());
            return Err(WireError::new(ErrorCode::BadRequest, message));
        }
        self.store.write(&store_fork(fork), &extents, data).map_err(store_error)?;
        Ok(IoReply::Done { bytes: total_bytes })
    }
}

fn store_hsm_action(action: HsmAction) -> flotilla_store::HsmAction {
    match action {
        HsmAction::State => flotilla_store::HsmAction::State,
        HsmAction::Archive => flotilla_store::HsmAction::Archive,
        HsmAction::Release => flotilla_store::HsmAction::Release,
        HsmAction::Restore => flotilla_store::HsmAction::Restore,
    }
}

fn wire_hsm_state(state: flotilla_store::HsmState) -> HsmForkState {
    let residency = match state.residency {
        flotilla_store::Residency::Resident => Residency::Resident,
        flotilla_store::Residency::Archived => Residency::Archived,
        flotilla_store::Residency::Released => Residency::Released,
        flotilla_store::Residency::Modified => Residency::Modified,
    };
    HsmForkState {
        residency,
        size_bytes: state.size_bytes,
        resident_bytes: state.resident_bytes,
        archived_bytes: state.archived_bytes,
        archived_at_s: state.archived_at_s,
        object_key: state.object_key,
    }
}

fn store_fork(fork: &ForkRef) -> flotilla_store::ForkRef<'_> {
    flotilla_store::ForkRef::new(fork.target, fork.file, fork.subfile, &fork.fork)
}

/// The wire form of a shape error: limits are `OverLimit`, the rest `InvalidArgument`.
pub(crate) fn shape_error(error: ShapeError) -> WireError {
    let code = match error {
        ShapeError::TooManyPieces { .. }
        | ShapeError::TooManyBytes { .. }
        | ShapeError::TooManySteps { .. } => ErrorCode::OverLimit,
        _ => ErrorCode::InvalidArgument,
    };
    WireError::new(code, error.to_string())
}

/// Runs `op`; when it failed because something it needs does not exist yet (`missing`: a
/// subfile, created on first use), runs `create` and then `op` once more. Shared by request
/// execution and the ENWRICH flush.
pub(crate) fn again_once_created<T, E>(
    mut op: impl FnMut() -> Result<T, E>,
    missing: impl Fn(&E) -> bool,
    create: impl FnOnce() -> Result<(), E>,
) -> Result<T, E> {
    match op() {
        Err(error) if missing(&error) => {
            create()?;
            op()
        }
        other => other,
    }
}

/// The subfile a request may create on demand (requests on a fork or a subfile's forks).
fn on_demand_subfile(
    request: &IoRequest,
) -> Option<(flotilla_types::TargetId, flotilla_types::FileId, flotilla_types::SubfileIndex)> {
    match request {
        IoRequest::Read { fork, .. }
        | IoRequest::Write { fork, .. }
        | IoRequest::CreateFork { fork }
        | IoRequest::ForkSize { fork }
        | IoRequest::Extend { fork, .. }
        | IoRequest::Truncate { fork, .. }
        | IoRequest::Sync { fork } => Some((fork.target, fork.file, fork.subfile)),
        IoRequest::ListForks { target, file, subfile } => Some((*target, *file, *subfile)),
        _ => None,
    }
}

/// The wire form of a store error.
pub(crate) fn store_error(error: StoreError) -> WireError {
    let code = match &error {
        StoreError::UnknownTarget { .. }
        | StoreError::UnknownSubfile { .. }
        | StoreError::UnknownFork { .. } => ErrorCode::NotFound,
        StoreError::ForkExists { .. } => ErrorCode::AlreadyExists,
        StoreError::BadForkName { .. } => ErrorCode::InvalidArgument,
        StoreError::ExtentOverflow { .. } | StoreError::ForkTooLarge { .. } => ErrorCode::InvalidArgument,
        StoreError::TargetFull { .. } => ErrorCode::NoSpace,
        StoreError::ShuttingDown => ErrorCode::Unavailable,
        StoreError::NoTier { .. } | StoreError::HsmRefused { .. } => ErrorCode::InvalidArgument,
        StoreError::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
        _ => ErrorCode::Io,
    };
    if code == ErrorCode::Io {
        tracing::error!(%error, "store operation failed");
    }
    WireError::new(code, error.to_string())
}
