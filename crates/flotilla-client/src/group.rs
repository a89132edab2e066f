//! GFS-GROUP (Khanna & Kotz, PCS-TR97-312 §3): split-phase grouped reads and writes for
//! loops that make many small requests. Requests accumulate into one `List` shape per fork or
//! file and travel as one packed request (split only where the server's limits demand); when
//! they are submitted is decided by [`Planner`] (see `group_plan.rs`).
//!
//! Buffers: `group_write` copies the caller's bytes into the pending list at once (the copy a
//! packed request needs anyway), so the caller may reuse its buffer as soon as the call
//! returns. `group_read` borrows the caller's buffer for the group's lifetime `'b`; replies
//! land in the group's own memory and are copied into the caller's buffers only inside
//! `testio`/`waitio` (on the caller's thread), so no background task ever touches caller
//! memory. [`Group::group_read_raw`] lends unmanaged memory (C, numpy) under a promise instead.

use crate::error::ClientError;
use crate::file::File;
use crate::fork::Fork;
use crate::group_plan::{Direction, GroupConfig, Planner};
use crate::handle::Handle;
use crate::raw::RawBuffer;
use flotilla_request::{Piece, Shape};
use std::collections::VecDeque;

/// Where one group request goes: a fork (the paper's model) or a linear file (any layout).
#[derive(Clone, Copy, Debug)]
pub enum GroupTarget<'t> {
    Fork(&'t Fork),
    File(&'t File),
}

impl<'t> From<&'t Fork> for GroupTarget<'t> {
    fn from(fork: &'t Fork) -> Self {
        GroupTarget::Fork(fork)
    }
}

impl<'t> From<&'t File> for GroupTarget<'t> {
    fn from(file: &'t File) -> Self {
        GroupTarget::File(file)
    }
}

/// A target the group has seen, kept so lists can be sent after the caller's reference ends.
enum Target {
    Fork(Fork),
    File(File),
}

impl Target {
    fn is(&self, other: GroupTarget<'_>) -> bool {
        match (self, other) {
            (Target::Fork(a), GroupTarget::Fork(b)) => a.fork == b.fork && a.server == b.server,
            (Target::File(a), GroupTarget::File(b)) => a.id() == b.id(),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Target::Fork(fork) => format!(
                "fork {:?} of subfile {} of file {} on {}",
                fork.fork.fork, fork.fork.subfile.0, fork.fork.file.0, fork.server
            ),
            Target::File(file) => format!("file {}", file.path()),
        }
    }
}

/// One request as the caller made it, for error reports.
#[derive(Clone, Copy, Debug)]
struct Request {
    index: u64,
    offset: u64,
    size_bytes: u64,
}

/// Requests to one target not yet submitted: one `List` piece per request, memory offsets
/// packed from 0 in request order.
struct PendingList<'b> {
    target: usize,
    direction: Direction,
    pieces: Vec<Piece>,
    requests: Vec<Request>,
    bytes: u64,
    /// Write data, packed.
    data: Vec<u8>,
    /// Read destinations, one per piece.
    destinations: Vec<&'b mut [u8]>,
}

enum Call {
    Read(Handle<Vec<u8>>),
    Write(Handle<u64>),
}

/// A list in flight.
struct Submitted<'b> {
    target: usize,
    call: Call,
    pieces: Vec<Piece>,
    requests: Vec<Request>,
    bytes: u64,
    destinations: Vec<&'b mut [u8]>,
}

/// One failed group request, as `testio`/`waitio` report it.
#[derive(Debug, Clone)]
pub struct RequestFailure {
    /// The request's number: 0 for the group's first `group_read`/`group_write`, counting on.
    pub index: u64,
    pub target: String,
    pub offset: u64,
    pub size_bytes: u64,
    /// Requests that travelled in the same list (and failed with it).
    pub list_requests: usize,
    pub error: ClientError,
}

/// What a group call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    #[error(
        "request {index} ({wanted} of {size_bytes} bytes at offset {offset} of {target}) refused: \
         this group {current}s until doneio; reads and writes may not be mixed in one group"
    )]
    Mixed { index: u64, wanted: Direction, current: Direction, target: String, offset: u64, size_bytes: u64 },
    #[error("request {index}: offset {offset} + size {size_bytes} bytes is past the largest file offset")]
    OutOfRange { index: u64, offset: u64, size_bytes: u64 },
    #[error(
        "request {} ({} bytes at offset {} of {}) failed, with {} request(s) in its list{}: {}",
        .first.index, .first.size_bytes, .first.offset, .first.target, .first.list_requests,
        if *.more_failed_lists > 0 { format!(" and {} more failed list(s)", .more_failed_lists) } else { String::new() },
        .first.error
    )]
    Failed { first: Box<RequestFailure>, more_failed_lists: usize },
}

impl GroupError {
    /// The Linux errno that best describes the failure.
    pub fn errno(&self) -> i32 {
        match self {
            GroupError::Mixed { .. } | GroupError::OutOfRange { .. } => 22,
            GroupError::Failed { first, .. } => first.error.errno(),
        }
    }
}

/// What a group has done so far (for tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub requests: u64,
    /// Submissions: each sends every pending list at once.
    pub submissions: u64,
    /// Lists sent (one per fork or file per submission).
    pub lists: u64,
}

/// A split-phase group of reads or writes (see the module docs and `docs/architecture.md`).
pub struct Group<'b> {
    config: GroupConfig,
    planner: Planner,
    targets: Vec<Target>,
    pending: Vec<PendingList<'b>>,
    outstanding: VecDeque<Submitted<'b>>,
    outstanding_bytes: u64,
    failures: Vec<RequestFailure>,
    stats: GroupStats,
}

impl<'b> Group<'b> {
    pub fn new(config: GroupConfig) -> Group<'b> {
        Group {
            config,
            planner: Planner::default(),
            targets: Vec::new(),
            pending: Vec::new(),
            outstanding: VecDeque::new(),
            outstanding_bytes: 0,
            failures: Vec::new(),
            stats: GroupStats::default(),
        }
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// Changes the settings (mode, thresholds) for the calls that follow.
    pub fn set_config(&mut self, config: GroupConfig) {
        self.config = config;
    }

    pub fn stats(&self) -> GroupStats {
        self.stats
    }

    /// Queues a read of `buffer.len()` bytes at `offset` of `target` into `buffer`, which
    /// holds the bytes once `waitio` (or a `testio` that returned true) has returned.
    pub fn group_read<'t>(
        &mut self,
        target: impl Into<GroupTarget<'t>>,
        offset: u64,
        buffer: &'b mut [u8],
    ) -> Result<(), GroupError> {
        let size_bytes = buffer.len() as u64;
        let (list, submit_after) = self.admit(target.into(), Direction::Read, offset, size_bytes)?;
        if let Some(list) = list {
            self.pending[list].destinations.push(buffer);
        }
        self.after_admit(submit_after)
    }

    /// `group_read` into memory the group does not borrow.
    ///
    /// # Safety
    /// The buffer's memory must stay valid, and be neither read nor written by anyone else,
    /// until `waitio` returned, a `testio` returned true, or the group was dropped.
    pub unsafe fn group_read_raw<'t>(
        &mut self,
        target: impl Into<GroupTarget<'t>>,
        offset: u64,
        buffer: RawBuffer,
    ) -> Result<(), GroupError> {
        // SAFETY: the caller's promise above covers the group's use of the memory for 'b.
        let slice = unsafe { buffer.into_slice::<'b>() };
        self.group_read(target, offset, slice)
    }

    /// Queues a write of `data` at `offset` of `target`; `data` is copied before this returns.
    pub fn group_write<'t>(
        &mut self,
        target: impl Into<GroupTarget<'t>>,
        offset: u64,
        data: &[u8],
    ) -> Result<(), GroupError> {
        let (list, submit_after) = self.admit(target.into(), Direction::Write, offset, data.len() as u64)?;
        if let Some(list) = list {
            self.pending[list].data.extend_from_slice(data);
        }
        self.after_admit(submit_after)
    }

    /// Ends one group of requests: everything pending is submitted, and the next request may
    /// go the other way. Does not wait.
    pub fn doneio(&mut self) -> Result<(), GroupError> {
        self.planner.done();
        self.submit_pending()
    }

    /// Whether everything submitted so far has finished (reads are then in their buffers).
    /// Submits pending requests only when nothing submitted is still outstanding. A failure
    /// of any finished request is returned once.
    pub fn testio(&mut self) -> Result<bool, GroupError> {
        self.collect_finished();
        if self.planner.testio_submits(!self.outstanding.is_empty()) {
            self.submit_pending()?;
            self.collect_finished();
        }
        self.take_failures()?;
        Ok(self.outstanding.is_empty() && self.pending.is_empty())
    }

    /// Submits everything pending and waits for every submitted request (finishing in any
    /// order); reads are then in their buffers. Reports the first failed request.
    pub fn waitio(&mut self) -> Result<(), GroupError> {
        self.planner.submitted();
        self.submit_pending()?;
        while let Some(list) = self.outstanding.pop_front() {
            self.complete(list);
        }
        self.take_failures()
    }

    /// Ends the group: `doneio` and `waitio`, then the borrowed read buffers are the caller's
    /// again. (After `waitio` a group holds nothing but its settings, its direction and its
    /// statistics, so a loop that needs its buffers back goes on with `Group::new`.)
    pub fn finish(mut self) -> Result<GroupStats, GroupError> {
        self.doneio()?;
        self.waitio()?;
        Ok(self.stats)
    }

    /// Whether the group reads or writes until the next `doneio` (`None`: not decided yet).
    pub fn direction(&self) -> Option<Direction> {
        self.planner.direction()
    }

    /// Asks the planner about one request and adds it to its target's pending list; returns
    /// the list's position (`None` for a request of 0 bytes) and whether everything must be
    /// submitted now.
    fn admit(
        &mut self,
        target: GroupTarget<'_>,
        direction: Direction,
        offset: u64,
        size_bytes: u64,
    ) -> Result<(Option<usize>, bool), GroupError> {
        let index = self.stats.requests;
        if offset.checked_add(size_bytes).is_none_or(|end| end > i64::MAX as u64) {
            return Err(GroupError::OutOfRange { index, offset, size_bytes });
        }
        let target_index = self.target_index(target);
        let outstanding = self.any_outstanding();
        let admission = self
            .planner
            .admit(&self.config, target_index, direction, size_bytes, outstanding)
            .map_err(|mixed| GroupError::Mixed {
                index,
                wanted: direction,
                current: mixed.current,
                target: self.targets[target_index].describe(),
                offset,
                size_bytes,
            })?;
        if admission.submit_before {
            self.submit_pending()?;
        }
        self.stats.requests += 1;
        if size_bytes == 0 {
            // Nothing to move: the request counts (index, thresholds) but travels in no list.
            return Ok((None, admission.submit_after));
        }
        let position = self.pending_list(target_index, direction);
        let list = &mut self.pending[position];
        list.pieces.push(Piece { file_offset: offset, memory_offset: list.bytes, length: size_bytes });
        list.requests.push(Request { index, offset, size_bytes });
        list.bytes += size_bytes;
        Ok((Some(position), admission.submit_after))
    }

    fn after_admit(&mut self, submit_after: bool) -> Result<(), GroupError> {
        if submit_after {
            self.submit_pending()?;
        }
        Ok(())
    }

    /// The position of `target` among the targets seen (the last one is checked first).
    fn target_index(&mut self, target: GroupTarget<'_>) -> usize {
        if let Some(i) = self.targets.iter().rposition(|t| t.is(target)) {
            return i;
        }
        self.targets.push(match target {
            GroupTarget::Fork(fork) => Target::Fork(fork.clone()),
            GroupTarget::File(file) => Target::File(file.clone()),
        });
        self.targets.len() - 1
    }

    /// The position of the pending list for `target`, made if there is none.
    fn pending_list(&mut self, target: usize, direction: Direction) -> usize {
        if let Some(i) = self.pending.iter().rposition(|l| l.target == target) {
            return i;
        }
        self.pending.push(PendingList {
            target,
            direction,
            pieces: Vec::new(),
            requests: Vec::new(),
            bytes: 0,
            data: Vec::new(),
            destinations: Vec::new(),
        });
        self.pending.len() - 1
    }

    /// Whether a submitted list is unfinished (finished ones are collected on the way).
    fn any_outstanding(&mut self) -> bool {
        self.collect_finished();
        !self.outstanding.is_empty()
    }

    /// Sends every pending list at once, first waiting for the oldest lists in flight while
    /// the new ones would put more than `submitted_bytes_max` in flight.
    fn submit_pending(&mut self) -> Result<(), GroupError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bytes: u64 = self.pending.iter().map(|l| l.bytes).sum();
        while self.outstanding_bytes.saturating_add(bytes) > self.config.submitted_bytes_max {
            let Some(oldest) = self.outstanding.pop_front() else { break };
            self.complete(oldest);
        }
        self.stats.submissions += 1;
        for list in std::mem::take(&mut self.pending) {
            self.send(list);
        }
        Ok(())
    }

    fn send(&mut self, list: PendingList<'b>) {
        self.stats.lists += 1;
        let shape = Shape::List { pieces: list.pieces.clone() };
        let reading = list.direction == Direction::Read;
        let call = match (&self.targets[list.target], reading) {
            (Target::Fork(fork), true) => Call::Read(fork.read_nb(shape, vec![0; list.bytes as usize])),
            (Target::Fork(fork), false) => Call::Write(fork.write_nb(shape, list.data)),
            (Target::File(file), true) => Call::Read(file.read_shape_nb(shape, vec![0; list.bytes as usize])),
            (Target::File(file), false) => Call::Write(file.write_shape_nb(shape, list.data)),
        };
        self.outstanding_bytes += list.bytes;
        self.outstanding.push_back(Submitted {
            target: list.target,
            call,
            pieces: list.pieces,
            requests: list.requests,
            bytes: list.bytes,
            destinations: list.destinations,
        });
    }

    /// Finishes every list that has finished, in any order, without waiting.
    fn collect_finished(&mut self) {
        let mut still = VecDeque::with_capacity(self.outstanding.len());
        while let Some(mut list) = self.outstanding.pop_front() {
            let done = match &mut list.call {
                Call::Read(handle) => handle.test(),
                Call::Write(handle) => handle.test(),
            };
            if done {
                self.complete(list);
            } else {
                still.push_back(list);
            }
        }
        self.outstanding = still;
    }

    /// Waits for one list, copies read data into the caller's buffers, records a failure.
    fn complete(&mut self, list: Submitted<'b>) {
        self.outstanding_bytes -= list.bytes;
        let outcome = match list.call {
            Call::Read(handle) => {
                handle.wait().and_then(|data| scatter(&list.pieces, &data, list.destinations))
            }
            Call::Write(handle) => handle.wait().and_then(|written| check_written(written, list.bytes)),
        };
        if let Err(error) = outcome {
            let first =
                list.requests.first().copied().unwrap_or(Request { index: 0, offset: 0, size_bytes: 0 });
            self.failures.push(RequestFailure {
                index: first.index,
                target: self.targets[list.target].describe(),
                offset: first.offset,
                size_bytes: first.size_bytes,
                list_requests: list.requests.len(),
                error,
            });
        }
    }

    fn take_failures(&mut self) -> Result<(), GroupError> {
        let mut failures = std::mem::take(&mut self.failures);
        if failures.is_empty() {
            return Ok(());
        }
        failures.sort_by_key(|f| f.index);
        let more_failed_lists = failures.len() - 1;
        let first = Box::new(failures.swap_remove(0));
        Err(GroupError::Failed { first, more_failed_lists })
    }
}

/// Copies packed read data into each request's buffer.
fn scatter(pieces: &[Piece], data: &[u8], destinations: Vec<&mut [u8]>) -> Result<(), ClientError> {
    for (piece, destination) in pieces.iter().zip(destinations) {
        let start = piece.memory_offset as usize;
        let Some(source) = data.get(start..start + destination.len()) else {
            return Err(ClientError::UnexpectedReply {
                request: "group read",
                reply: format!("{} bytes where {} were asked for", data.len(), start + destination.len()),
            });
        };
        destination.copy_from_slice(source);
    }
    Ok(())
}

fn check_written(written: u64, bytes: u64) -> Result<(), ClientError> {
    if written == bytes {
        return Ok(());
    }
    Err(ClientError::UnexpectedReply {
        request: "group write",
        reply: format!("{written} of {bytes} bytes written"),
    })
}
