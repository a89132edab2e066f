//! Read repair and scrub (issue 32), the I/O part (the rules are in `scrub_plan`).
//!
//! **The ordering rule.** A member rewrites its own blocks only while it holds its chain's
//! lock (the lock under which it applies every entry of the chain's order, `ChainPaths::
//! state`) and only when nothing it applied is waiting for its successor's acknowledgement.
//! Then no entry is applied here meanwhile; every member after it in the chain holds every
//! entry it holds (acknowledgements are cumulative from the tail); every member before it
//! holds those and possibly entries queued behind this lock, which are applied here after
//! the repair and are idempotent (a write or truncate applied over bytes that already show
//! it leaves the same bytes). So the bytes read from any serving member are this member's
//! bytes, or the same entries' result a moment early: the replicas cannot diverge.
//!
//! A repair reads the bad range from another serving member with a bare `Chained` read
//! under the server credential at the chain's current version (fenced there as any read;
//! the source's store checks its own checksums on the way, so a block bad there fails
//! and the next source is tried), rewrites data and entries here and syncs them.
//! Reads from a server credential never trigger a repair themselves.

use super::ChainPaths;
use crate::scrub_plan::{compare, repair_runs, repair_sources, scrub_range, serving};
use bytes::Bytes;
use flotilla_proto::{
    ErrorCode, ForkRef, IoReply, IoRequest, ScrubBlock, ScrubReport, WireError, SCRUB_BLOCKS_MAX,
};
use flotilla_request::{Shape, ShapeLimits};
use flotilla_rpc::Connection;
use flotilla_types::TargetId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What read repair and scrub counted since the server started (metrics).
#[derive(Debug, Default)]
pub(crate) struct RepairCounters {
    /// Checksum blocks rewritten from another member.
    pub repaired_blocks: AtomicU64,
    /// Bad blocks no member could supply.
    pub unrepaired_blocks: AtomicU64,
    /// Bytes the background scrub checked.
    pub scrubbed_bytes: AtomicU64,
    /// Bad blocks found by checks (scrub, repair, `BlockChecksums`).
    pub bad_blocks: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// What one repair of a member's range found and did.
pub(crate) struct RangeRepair {
    pub check: flotilla_store::BlockCheck,
    pub repaired: Vec<u64>,
    pub notes: Vec<String>,
}

impl ChainPaths {
    /// This server's targets.
    pub(crate) fn targets(&self) -> Vec<TargetId> {
        self.mine.clone()
    }

    /// This server's store.
    pub(crate) fn store(&self) -> &flotilla_store::Store {
        &self.executor.store
    }

    /// A client's chained read on this member failed a checksum: repairs the blocks the
    /// read covers from another serving member (see the module comment). `request` is the
    /// read as run here. Returns the blocks rewritten.
    pub(crate) async fn repair_read(&self, chain: u32, request: &IoRequest) -> Result<usize, WireError> {
        let IoRequest::Read { fork, shape } = request else {
            return Err(WireError::new(ErrorCode::BadRequest, "only a read is repaired"));
        };
        let limits = ShapeLimits {
            pieces_max: self.executor.limits.pieces_per_request_max,
            bytes_max: self.executor.limits.request_bytes_max,
        };
        let summary =
            shape.validate(&limits).map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let length = summary.file_end.saturating_sub(summary.file_start);
        let repair = self.repair_range(chain, fork, summary.file_start, length).await?;
        if let Some(bad) = repair.check.bad.iter().find(|offset| !repair.repaired.contains(offset)) {
            let message = format!(
                "checksum mismatch in fork {:?} of {}:{} on target {} at offset {bad}, and no other replica could supply the block: {}",
                fork.fork,
                fork.file,
                fork.subfile,
                fork.target,
                repair.notes.join("; ")
            );
            return Err(WireError::new(ErrorCode::ChecksumMismatch, message));
        }
        Ok(repair.repaired.len())
    }

    /// Checks this member's blocks of `offset..offset + length` of `fork` (on this server's
    /// target) and rewrites the bad ones from another serving member, under the chain's
    /// lock with nothing in flight (the module's rule).
    pub(crate) async fn repair_range(
        &self,
        chain: u32,
        fork: &ForkRef,
        offset: u64,
        length: u64,
    ) -> Result<RangeRepair, WireError> {
        let state = self.state(chain);
        let guard = state.state.lock().await;
        let unavailable =
            |why: String| WireError::new(ErrorCode::Unavailable, format!("chain {chain}: {why}"));
        let Some(info) = self.held.chain(chain) else {
            return Err(unavailable("not held by this server".into()));
        };
        if !serving(&info, fork.target) || !self.mine.contains(&fork.target) {
            return Err(unavailable(format!("target {} is not a serving member here", fork.target)));
        }
        if guard.log.as_ref().is_some_and(|log| log.in_flight() > 0) {
            return Err(unavailable("entries wait for the successor's acknowledgement; repair later".into()));
        }
        let check = self.check(fork, offset, length).await?;
        let mut repair = RangeRepair { check, repaired: Vec::new(), notes: Vec::new() };
        if repair.check.bad.is_empty() {
            return Ok(repair);
        }
        bump(&self.repairs.bad_blocks, repair.check.bad.len() as u64);
        let block_bytes = repair.check.block_bytes;
        let sources = repair_sources(&info, fork.target);
        if sources.is_empty() {
            repair.notes.push(format!("chain {chain} has no other serving member"));
        }
        for (start, end) in repair_runs(&repair.check.bad, block_bytes, repair.check.size_bytes) {
            let mut done = false;
            for &source in &sources {
                match self.fetch(chain, info.version, source, fork, start, end - start).await {
                    Ok(bytes) => {
                        let store = self.executor.clone();
                        let (owned, data) = (fork.clone(), bytes);
                        let rewritten = tokio::task::spawn_blocking(move || {
                            let at = flotilla_store::ForkRef::new(
                                owned.target,
                                owned.file,
                                owned.subfile,
                                &owned.fork,
                            );
                            store.store.rewrite_blocks(&at, start, &data)
                        })
                        .await;
                        match rewritten {
                            Ok(Ok(())) => {
                                let blocks: Vec<u64> = (start..end).step_by(block_bytes as usize).collect();
                                bump(&self.repairs.repaired_blocks, blocks.len() as u64);
                                tracing::warn!(
                                    chain, target = %fork.target, file = %fork.file, subfile = fork.subfile.0,
                                    fork = %fork.fork, start, end, %source,
                                    "repaired blocks that failed their checksum from another replica"
                                );
                                repair.repaired.extend(blocks);
                                done = true;
                                break;
                            }
                            Ok(Err(error)) => {
                                repair.notes.push(format!("rewrite of {start}..{end}: {error}"))
                            }
                            Err(error) => repair.notes.push(format!("rewrite of {start}..{end}: {error}")),
                        }
                    }
                    Err(error) => repair.notes.push(format!("from target {source}: {error}")),
                }
            }
            if !done {
                let blocks = (end - start).div_ceil(block_bytes);
                bump(&self.repairs.unrepaired_blocks, blocks);
                tracing::error!(
                    chain, target = %fork.target, file = %fork.file, subfile = fork.subfile.0, fork = %fork.fork,
                    start, end, notes = %repair.notes.join("; "),
                    "blocks failed their checksum and no other replica could supply them"
                );
            }
        }
        drop(guard);
        Ok(repair)
    }

    /// This member's check of its blocks (`Store::check_blocks`), on a blocking thread.
    async fn check(
        &self,
        fork: &ForkRef,
        offset: u64,
        length: u64,
    ) -> Result<flotilla_store::BlockCheck, WireError> {
        let executor = self.executor.clone();
        let fork = fork.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let at = flotilla_store::ForkRef::new(fork.target, fork.file, fork.subfile, &fork.fork);
            executor.store.check_blocks(&at, offset, length)
        })
        .await;
        match checked {
            Ok(result) => result.map_err(crate::execute::store_error),
            Err(error) => Err(WireError::new(ErrorCode::Io, format!("the store call failed: {error}"))),
        }
    }

    /// Reads `length` bytes at `offset` of the fork's copy on member `source` (a bare
    /// chained read under this server's credential, fenced there at `version`).
    async fn fetch(
        &self,
        chain: u32,
        version: u64,
        source: TargetId,
        fork: &ForkRef,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, WireError> {
        let mut theirs = fork.clone();
        theirs.target = source;
        let read = IoRequest::Read { fork: theirs, shape: Shape::contiguous(offset, length) };
        let request = IoRequest::Chained { chain, version, request: Box::new(read) };
        match self.ask_peer(source, &request).await? {
            (IoReply::Data, data) if data.len() as u64 == length => Ok(data),
            (IoReply::Data, data) => {
                Err(WireError::new(ErrorCode::Io, format!("asked {length} bytes, got {}", data.len())))
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Sends `request` to the server of member `target` and waits at most
    /// `chain_forward_timeout_ms` for the answer.
    async fn ask_peer(&self, target: TargetId, request: &IoRequest) -> Result<(IoReply, Vec<u8>), WireError> {
        let unavailable =
            |why: String| WireError::new(ErrorCode::Unavailable, format!("target {target}: {why}"));
        let Some(addr) = self.held.address(target) else {
            self.held.address_failed();
            return Err(unavailable("no address known".into()));
        };
        let shared = self.peers.lock().get(&addr).filter(|c| !c.is_broken()).cloned();
        let connection = match shared {
            Some(connection) => connection,
            None => {
                let connection = Connection::connect(&addr, self.peer_config()).await.map_err(|error| {
                    self.held.address_failed();
                    unavailable(error.to_string())
                })?;
                let connection = Arc::new(connection);
                let mut peers = self.peers.lock();
                peers.retain(|_, c| !c.is_broken());
                peers.insert(addr.clone(), connection.clone());
                connection
            }
        };
        let call = connection.call::<IoRequest, IoReply>(request, Bytes::new());
        match tokio::time::timeout(self.config.forward_timeout, call).await {
            Ok(Ok((IoReply::Error(error), _))) => Err(error),
            Ok(Ok((IoReply::ForwardRefused(refused), _))) => Err(unavailable(refused.to_string())),
            Ok(Ok((reply, data))) => Ok((reply, data.to_vec())),
            Ok(Err(error)) => Err(unavailable(error.to_string())),
            Err(_) => Err(unavailable(format!(
                "no answer within chain_forward_timeout_ms = {} ms",
                self.config.forward_timeout.as_millis()
            ))),
        }
    }

    /// `BlockChecksums` on this server's member of `chain` (fenced as a read by the
    /// caller): this member's check (and repair), then, with `compare`, every other serving
    /// member's, compared.
    pub(crate) async fn block_checksums(&self, chain: u32, version: u64, request: &IoRequest) -> IoReply {
        let IoRequest::BlockChecksums { fork, offset, length, repair, compare: compare_members } = request
        else {
            return IoReply::Error(WireError::new(ErrorCode::BadRequest, "not a BlockChecksums request"));
        };
        let block_bytes = match self.executor.store.checksum_block_bytes(fork.target) {
            Ok(bytes) => bytes,
            Err(error) => return IoReply::Error(crate::execute::store_error(error)),
        };
        let (offset, length) = match scrub_range(*offset, *length, block_bytes, SCRUB_BLOCKS_MAX) {
            Ok(range) => range,
            Err(message) => return IoReply::Error(WireError::new(ErrorCode::OverLimit, message)),
        };
        let (check, repaired, notes) = if *repair {
            match self.repair_range(chain, fork, offset, length).await {
                Ok(done) => (done.check, done.repaired, done.notes),
                Err(error) => return IoReply::Error(error),
            }
        } else {
            match self.check(fork, offset, length).await {
                Ok(check) => (check, Vec::new(), Vec::new()),
                Err(error) => return IoReply::Error(error),
            }
        };
        let mut check = check;
        if !repaired.is_empty() {
            // The entries the comparison needs are the rewritten blocks' new ones.
            if let Ok(again) = self.check(fork, offset, length).await {
                check.entries = again.entries;
            }
        }
        let mut report = report_of(fork.target, check, &repaired, notes);
        if !*compare_members {
            return IoReply::BlockChecksums(Box::new(report));
        }
        let Some(info) = self.held.chain(chain) else {
            report.notes.push(format!("chain {chain} is no longer held here"));
            return IoReply::BlockChecksums(Box::new(report));
        };
        let mut theirs = Vec::new();
        for source in repair_sources(&info, fork.target) {
            let mut at = fork.clone();
            at.target = source;
            let ask = IoRequest::BlockChecksums { fork: at, offset, length, repair: *repair, compare: false };
            let request = IoRequest::Chained { chain, version, request: Box::new(ask) };
            match self.ask_peer(source, &request).await {
                Ok((IoReply::BlockChecksums(other), _)) => theirs.push(*other),
                Ok((other, _)) => report.notes.push(format!("target {source}: {}", unexpected(other))),
                Err(error) => report.notes.push(format!("target {source} not compared: {error}")),
            }
        }
        let comparison = compare(&report, &theirs);
        report.members = 1 + theirs.len() as u32;
        for other in theirs {
            report.bad.extend(other.bad);
            report.repaired.extend(other.repaired);
            report.notes.extend(other.notes);
        }
        report.differing = comparison.differing;
        report.notes.extend(comparison.notes);
        IoReply::BlockChecksums(Box::new(report))
    }
}

/// A member's report of its own check.
pub(crate) fn report_of(
    target: TargetId,
    check: flotilla_store::BlockCheck,
    repaired: &[u64],
    notes: Vec<String>,
) -> ScrubReport {
    let mut report = ScrubReport::new(target, check.offset, check.block_bytes, check.size_bytes);
    report.bad = check.bad.iter().map(|offset| ScrubBlock { target, offset: *offset }).collect();
    report.repaired = repaired.iter().map(|offset| ScrubBlock { target, offset: *offset }).collect();
    report.entries = check.entries;
    report.notes = notes;
    report
}

fn unexpected(reply: IoReply) -> WireError {
    WireError::new(ErrorCode::Io, format!("unexpected reply {reply:?}"))
}
