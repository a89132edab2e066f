//! Replication's data path (issue 32), the I/O part: a chained change taken by the head, a
//! forward taken by a member, each applied through the executor and sent on down the chain
//! before it is answered; reads fenced and served as usual.
//!
//! Pipelined (issue 32): one async lock per chain is held only while an entry is ordered
//! and applied locally (the head gives it the next position; a member applies the next
//! position, holding one that came early at most `chain_gap_wait_ms` until the ones before
//! it are applied), so every member applies the same entries in the same order. The entry
//! is then sent to the successor outside the lock: up to `chain_window_max` entries of a
//! chain are in flight at once (a head with a full window waits for acknowledgements, at
//! most `chain_forward_timeout_ms`). The successor's cumulative acknowledgement, once it
//! covers an entry's position, answers the request. Anything else (no answer, a refusal, a
//! gap, a version change) falls back to sending everything unacknowledged in order under
//! the lock (`drain`): when the successor does not answer (refused or broken connection,
//! `chain_forward_timeout_ms`) or refuses the entry (another version, no lease, not a
//! member, a gap this member cannot fill), the
//! member asks the metadata service for news at once (an early heartbeat) and waits, at
//! most `chain_change_wait_ms`, for its chain's next version, trying the successor again
//! every `chain_retry_ms`; under the new version it sends what the new successor lacks, or,
//! if it is now the tail, answers. If it is no longer in the write path (or no longer the
//! head, for a client's change), the request is refused naming the new version, and the
//! client refetches the chain.
//!
//! Resync: the last serving member copies the syncing member after it what it missed —
//! the ranges its resync record holds (`observe`, `copy_recorded`) or, when no record
//! covers the joiner, every subfile of the chain (listed by the metadata service,
//! `ChainSubfiles`) whole — as `ForwardEntry::Copy` steps, outside the chain's lock while
//! writes go on (it acts as the tail meanwhile; `copy_live`), then, under the lock, what
//! changed meanwhile and `CopyDone` at its position; then it reports `SyncDone`.
//! `resync_pass` runs it on every new view even when no write comes. Every view a record
//! is brought to is read from the held table under the chain's lock (`follow`,
//! `resync_look`): the table only moves forward, so neither does any record's view.

// Read repair and scrub (issue 32) run under this module's per-chain lock.
#[path = "repair.rs"]
mod repair;
pub(crate) use repair::{report_of, RepairCounters};

#[cfg(test)]
#[path = "chain_path_tests.rs"]
mod tests;

use crate::chain_write::{
    copy_tolerates, early, entry_of, fence, fence_chained, forwardable, kind_of, my_member, order,
    record_step, recorded, resync_step, retarget, retarget_entry, sender_may_forward, store_request,
    Admitted, Copied, Early, ForkKey, Lease, MemberLog, Payload, Record, RecordStep, ResyncStep, Role, Sent,
};
use crate::execute::{Executor, Reply};
use crate::membership::HeldChains;
use bytes::Bytes;
use flotilla_proto::{
    ChainForward, ChainInfo, ChainMemberState, ErrorCode, ForkRef, ForwardAck, ForwardEntry,
    ForwardRefusalReason, ForwardRefused, IoReply, IoRequest, MetaReply, MetaRequest, WireError,
    CHAIN_SUBFILES_SCAN_MAX,
};
use flotilla_replica::{
    pieces_within, ByteRange, ChainHead, ChainId, ChainMemberLog, ChainVersion, MissedRecord, RangeSet,
    Receive, Unsettled, RANGES_PER_FORK_MAX, RECORD_RANGE_BYTES,
};
use flotilla_request::Shape;
use flotilla_rpc::{Connection, ConnectionConfig};
use flotilla_types::TargetId;
use flotilla_types::{FileId, SubfileIndex};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The bounds of the chain data path (`ServerConfig::chain_*`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PathConfig {
    /// Longest wait for a successor's answer to one forward.
    pub forward_timeout: Duration,
    /// Longest wait for a new chain version once the successor failed.
    pub change_wait: Duration,
    /// Pause between tries of a failed successor while waiting for news.
    pub retry: Duration,
    /// Entries a head keeps in flight (`forward_window_max`).
    pub window_max: usize,
    /// Longest hold of a forward that arrived ahead of earlier positions.
    pub gap_wait: Duration,
    /// Largest piece of a fork one resync copy step carries.
    pub copy_chunk_bytes: u64,
    /// The rate every resync copy of this server takes together (0: unlimited).
    pub resync_bytes_per_s: u64,
    /// Bound on one chain's resync record (`resync_record_bytes_max`).
    pub record_bytes_max: u64,
}

/// What this server's resync copies did (as copy source), for the metrics.
#[derive(Debug, Default)]
pub(crate) struct ResyncCounters {
    /// Fork bytes sent to syncing members.
    pub bytes_copied: AtomicU64,
    /// Copies made from a resync record (only what the member missed).
    pub recorded_copies: AtomicU64,
    /// Copies of every subfile of the chain (no record covered the member).
    pub full_copies: AtomicU64,
}

/// One chain's state on this server.
struct ChainState {
    log: Option<MemberLog>,
    /// The head role, while this member is the chain's head.
    head: Option<ChainHead<()>>,
    /// The connection to the successor.
    link: Option<(TargetId, String, Arc<Connection>)>,
    /// What each entry not yet acknowledged by the successor carries, by position.
    payloads: BTreeMap<u64, Payload>,
    /// The resync copy this member made, as its copy source (see `resync_step`).
    copied: Option<Copied>,
    /// What this member applied while another member was out (serving members only).
    record: Option<Record>,
    /// The view of the chain the record was last brought to.
    seen: Option<ChainInfo>,
    /// While a resync copy runs outside the lock: what was applied since it started (its
    /// last pass, under the lock, copies these).
    dirty: Option<Record>,
    /// As a syncing member: the copy source's unsettled ranges (`ForwardEntry::Unsettled`),
    /// taken into the log `CopyDone` starts; bounded by `inherited_max`.
    inherited: Unsettled<ForkKey>,
    inherited_count: usize,
    /// More ranges came than `inherited_max`: the rest were dropped.
    inherited_overflowed: bool,
    /// The inherited ranges passed their bound, so this member's unsettled ranges may miss
    /// some another member holds unsynced: a resync record it keeps covers nobody (a
    /// returning member is copied whole) until the next resync copy it takes.
    unsettled_partial: bool,
}

impl ChainState {
    /// Forgets the contents of entries the successor acknowledged (or that no successor
    /// will be sent).
    fn prune(&mut self) {
        if let Some(log) = &self.log {
            let acked = log.ack_up();
            self.payloads.retain(|&position, _| position > acked);
        }
    }
}

/// One chain's state behind its lock, and the news of its progress.
struct ChainSlot {
    state: tokio::sync::Mutex<ChainState>,
    /// Woken when the chain's log moves (an entry applied, an acknowledgement taken): a
    /// head waiting for room in its window, a member holding an early forward.
    moved: tokio::sync::Notify,
}

/// An entry applied here and to be sent to the successor outside the chain's lock.
struct Pipelined {
    version: ChainVersion,
    position: u64,
    successor: TargetId,
    /// The successor's connection, if one was made (none: straight to the in-order path).
    link: Option<Arc<Connection>>,
    payload: Payload,
}

/// Why sending down the chain stopped without every entry acknowledged.
enum Stop {
    /// This member's place changed (refuse the request with this reason, under its version).
    Refused(ForwardRefusalReason),
    /// No acknowledgement and no new version in time.
    Failed(WireError),
}

/// What went wrong with one try of the successor.
enum Trouble {
    /// The chain's version changed meanwhile: look again.
    Changed,
    /// Worth waiting for news: the message says what happened.
    Wait(String),
}

/// Every chain's data path on this server.
pub(crate) struct ChainPaths {
    config: PathConfig,
    executor: Arc<Executor>,
    held: Arc<HeldChains>,
    auth: flotilla_auth::ClientAuth,
    /// This server's targets.
    mine: Vec<TargetId>,
    chains: parking_lot::Mutex<HashMap<u32, Arc<ChainSlot>>>,
    /// Connections to successor servers by address (broken ones are dropped when a new one
    /// is made; at most one per peer address).
    peers: parking_lot::Mutex<HashMap<String, Arc<Connection>>>,
    /// The resync copies' bytes, bounded by `resync_bytes_per_s`.
    copy_rate: crate::rate::ByteRate,
    /// Read repair and scrub counters (`repair.rs`).
    pub(crate) repairs: RepairCounters,
    /// Resync copy counters.
    pub(crate) resyncs: ResyncCounters,
}

impl ChainPaths {
    pub(crate) fn new(
        config: PathConfig,
        executor: Arc<Executor>,
        held: Arc<HeldChains>,
        auth: flotilla_auth::ClientAuth,
    ) -> ChainPaths {
        let mine = executor.store.target_ids();
        ChainPaths {
            config,
            executor,
            held,
            auth,
            mine,
            chains: parking_lot::Mutex::new(HashMap::new()),
            peers: parking_lot::Mutex::new(HashMap::new()),
            // A burst of a tenth of a second's bytes, at least one copy step.
            copy_rate: crate::rate::ByteRate::new(
                config.resync_bytes_per_s,
                (config.resync_bytes_per_s / 10).max(config.copy_chunk_bytes),
            ),
            repairs: RepairCounters::default(),
            resyncs: ResyncCounters::default(),
        }
    }

    /// A connection to another member: this server's credential, connects and calls bounded
    /// by `chain_forward_timeout_ms`.
    pub(crate) fn peer_config(&self) -> ConnectionConfig {
        let mut config = ConnectionConfig::with_auth(self.auth.clone());
        config.connect_timeout_ms =
            u64::try_from(self.config.forward_timeout.as_millis()).unwrap_or(u64::MAX);
        config.call_timeout_ms = config.connect_timeout_ms;
        config
    }

    fn state(&self, chain: u32) -> Arc<ChainSlot> {
        let mut chains = self.chains.lock();
        let state = chains.entry(chain).or_insert_with(|| {
            Arc::new(ChainSlot {
                state: tokio::sync::Mutex::new(ChainState {
                    log: None,
                    head: None,
                    link: None,
                    payloads: BTreeMap::new(),
                    copied: None,
                    record: None,
                    seen: None,
                    dirty: None,
                    inherited: Unsettled::default(),
                    inherited_count: 0,
                    inherited_overflowed: false,
                    unsettled_partial: false,
                }),
                moved: tokio::sync::Notify::new(),
            })
        });
        state.clone()
    }

    fn view(&self) -> (Vec<ChainInfo>, Lease) {
        self.held.fence_view()
    }

    /// Runs `request` on the store (on a blocking thread), making its subfile on demand.
    async fn execute(&self, request_id: u64, request: IoRequest, data: Bytes) -> Reply {
        let executor = self.executor.clone();
        let ran =
            tokio::task::spawn_blocking(move || executor.execute(request_id, &request, &data, true)).await;
        ran.unwrap_or_else(|error| Reply {
            request_id,
            message: IoReply::Error(WireError::new(ErrorCode::Io, format!("the store call failed: {error}"))),
            data: Vec::new(),
            memory: None,
        })
    }

    /// A chained read: fenced now (served only by a `Serving` member under exactly its
    /// version) and returned retargeted to this server's member, to run as any read.
    pub(crate) fn admit_read(
        &self,
        chain: u32,
        version: u64,
        request: &IoRequest,
    ) -> Result<IoRequest, ForwardRefused> {
        let (chains, lease) = self.view();
        let placed = fence_chained((chain, version), request, (&chains, lease), &self.mine)?;
        Ok(retarget(request, placed.me))
    }

    /// A client's chained change at this server: taken only by the head, applied here in
    /// the chain's order (under the chain's lock: position given, applied, kept for the
    /// successor), sent down the chain outside the lock so that up to `chain_window_max`
    /// entries are in flight at once, and answered once every member of the write path
    /// applied it (the cumulative acknowledgement covers its position).
    pub(crate) async fn change(
        &self,
        request_id: u64,
        (chain, version): (u32, u64),
        request: IoRequest,
        data: Bytes,
    ) -> Reply {
        let reply = |message| Reply { request_id, message, data: Vec::new(), memory: None };
        let refuse = |reason| IoReply::ForwardRefused(ForwardRefused { chain, version, reason });
        let placed = match self.fence_change(chain, version, &request).await {
            Ok(placed) => placed,
            Err(refused) => return reply(IoReply::ForwardRefused(refused)),
        };
        let slot = self.state(chain);
        // A full window waits for acknowledgements at most this long.
        let room_until = Instant::now() + self.config.forward_timeout;
        let me = placed.me;
        let (sent, done) = loop {
            let moved = slot.moved.notified();
            let mut guard = slot.state.lock().await;
            let state: &mut ChainState = &mut guard;
            // Under the lock, the view may have moved on: fence again.
            let (chains, lease) = self.view();
            match fence_chained((chain, version), &request, (&chains, lease), &self.mine) {
                Ok(again) if again.me == me => {}
                Ok(_) => return reply(refuse(ForwardRefusalReason::NotMember)),
                Err(refused) => return reply(IoReply::ForwardRefused(refused)),
            };
            let role = match self.follow(state, chain, me) {
                Ok(role) => role,
                Err(stop) => return reply(self.stopped(chain, version, stop)),
            };
            // A syncing successor gets its copy first, and then every entry in order under
            // this lock (the first cut's path); so does anything an earlier failure left.
            let in_order = role.successor_syncing;
            if in_order {
                if let Err(stop) = self.drain(state, chain, me).await {
                    return reply(self.stopped(chain, version, stop));
                }
            }
            let (Some(log), Some(head)) = (state.log.as_ref(), state.head.as_mut()) else {
                return reply(refuse(ForwardRefusalReason::NotHead { head: placed.role.head }));
            };
            // Positions continue from what the log applied (the head applies every position
            // it gives out before releasing the lock; a forward some confused server sent
            // to the head moved the log on, and the next position must follow it).
            *head = ChainHead::new(log, self.config.window_max);
            if log.version() != ChainVersion(version) {
                let current = log.version().0;
                return reply(refuse(ForwardRefusalReason::Stale { current }));
            }
            let in_flight = head.in_flight(log);
            if in_flight >= self.config.window_max {
                drop(guard);
                let until = tokio::time::Instant::from_std(room_until);
                if tokio::time::timeout_at(until, moved).await.is_err() {
                    let message = format!(
                        "chain {chain} v{version}: {in_flight} changes in flight, at chain_window_max = {}, and none acknowledged within chain_forward_timeout_ms = {} ms",
                        self.config.window_max,
                        self.config.forward_timeout.as_millis()
                    );
                    return reply(IoReply::Error(WireError::new(ErrorCode::Unavailable, message)));
                }
                continue;
            }
            let local = retarget(&request, me);
            let done = self.execute(request_id, local, data.clone()).await;
            if matches!(done.message, IoReply::Error(_)) {
                return done;
            }
            note(state, &request);
            let kind = kind_of(&request);
            let payload: Payload =
                Arc::new(Sent { entry: ForwardEntry::Request { request: Box::new(request) }, data });
            let (Some(log), Some(head)) = (state.log.as_mut(), state.head.as_mut()) else {
                return reply(refuse(ForwardRefusalReason::NotHead { head: None }));
            };
            let entry = match head.submit(log, ChainVersion(version), kind, ()) {
                Ok(entry) => entry,
                Err(error) => {
                    return reply(IoReply::Error(WireError::new(ErrorCode::Unavailable, error.to_string())))
                }
            };
            let position = entry.position;
            log.applied_entry(entry);
            state.payloads.insert(position, payload.clone());
            let Some(successor) = role.successor.filter(|_| !in_order) else {
                // The tail itself, or a syncing successor: everything in order, here.
                if let Err(stop) = self.drain(state, chain, me).await {
                    return reply(self.stopped(chain, version, stop));
                }
                let acked = state.log.as_ref().map_or(0, |log| log.ack_up());
                if let Some(head) = state.head.as_mut() {
                    head.answer(acked);
                }
                if acked < position {
                    return reply(IoReply::Error(not_acknowledged(chain, position, acked)));
                }
                return done;
            };
            let link = self.link(state, successor).await.ok();
            let sent = Pipelined { version: ChainVersion(version), position, successor, link, payload };
            break (sent, done);
        };
        match self.pipelined(&slot, chain, me, sent).await {
            Ok(()) => done,
            Err(stop) => reply(self.stopped(chain, version, stop)),
        }
    }

    /// ENWRICH (issue 32): the chain of each replicated subfile of `file`, as the metadata
    /// service says (the flush of a subfile on a chain goes through it; nothing the job's
    /// members say decides it).
    pub(crate) async fn subfile_chains(&self, file: FileId) -> Result<HashMap<SubfileIndex, u32>, WireError> {
        let asked =
            self.held.ask_meta(MetaRequest::GetById { id: file.0 }, self.config.forward_timeout).await;
        let unavailable = |why: String| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("ENWRICH flush of file {file}: its placement: {why}"),
            )
        };
        match asked {
            Ok(MetaReply::Entry(entry)) => Ok(entry
                .subfiles
                .iter()
                .enumerate()
                .filter_map(|(index, place)| {
                    let index = u32::try_from(index).ok()?;
                    place.chain.as_ref().map(|chain| (SubfileIndex(index), chain.chain))
                })
                .collect()),
            Ok(MetaReply::Error(error)) => Err(unavailable(error.to_string())),
            Ok(other) => Err(unavailable(format!("unexpected reply {other:?}"))),
            Err(why) => Err(unavailable(why)),
        }
    }

    /// ENWRICH (issue 32): a flush's change (`Write` or `Sync` of this server's member of
    /// `chain`) taken as the head takes a client's: ordered with the chain's other changes,
    /// applied here and by every member of the write path before it returns; a member's
    /// death meanwhile is handled as for any change (fence, new version, go on). A version
    /// that moved on before the change was taken, or a view or lease not there yet, is
    /// waited for (at most
    /// `chain_change_wait_ms`); a refusal otherwise (this server no longer the head) fails
    /// the flush naming the chain.
    pub(crate) async fn flush_change(
        &self,
        chain: u32,
        request: IoRequest,
        data: Bytes,
    ) -> Result<(), WireError> {
        let until = Instant::now() + self.config.change_wait;
        loop {
            let Some(info) = self.held.chain(chain) else {
                if Instant::now() < until {
                    // Not heard of yet (a server just started): ask for news and look again.
                    self.held.nudge();
                    tokio::time::sleep(self.config.retry).await;
                    continue;
                }
                let message = format!("ENWRICH flush: this server holds no view of chain {chain}");
                return Err(WireError::new(ErrorCode::Unavailable, message));
            };
            let reply = self.change(0, (chain, info.version), request.clone(), data.clone()).await;
            match reply.message {
                IoReply::Error(error) => return Err(error),
                // Another version, no lease, not yet a member as far as this server knows:
                // news may come (at most chain_change_wait_ms). No longer the head: fail.
                IoReply::ForwardRefused(refused)
                    if Instant::now() < until
                        && !matches!(refused.reason, ForwardRefusalReason::NotHead { .. }) =>
                {
                    self.held.nudge();
                    let retry = (Instant::now() + self.config.retry).min(until);
                    self.wait_change(chain, info.version, retry).await;
                }
                IoReply::ForwardRefused(refused) => {
                    let message = format!(
                        "ENWRICH flush through the chain refused ({refused}); the job's data stays in its \
                         caches: flush again"
                    );
                    return Err(WireError::new(ErrorCode::Unavailable, message));
                }
                _ => return Ok(()),
            }
        }
    }

    /// Sends one applied entry to the successor outside the chain's lock and takes its
    /// acknowledgement. Anything but an acknowledgement covering the entry (a refusal, a
    /// gap, no answer, a version change) falls back to [`drain`](Self::drain) under the
    /// lock: everything unacknowledged is sent again in order, following version changes
    /// into the chain-change path. Ok once the chain acknowledged `sent.position`.
    async fn pipelined(
        &self,
        slot: &ChainSlot,
        chain: u32,
        me: TargetId,
        sent: Pipelined,
    ) -> Result<(), Stop> {
        let covered = |state: &ChainState| {
            state
                .log
                .as_ref()
                .is_some_and(|log| log.version() == sent.version && log.ack_up() >= sent.position)
        };
        if let Some(connection) = &sent.link {
            let forward = ChainForward {
                chain,
                version: sent.version.0,
                position: sent.position,
                entry: retarget_entry(&sent.payload.entry, sent.successor),
            };
            let reply =
                self.call(connection, chain, sent.version.0, &forward, sent.payload.data.clone()).await;
            let mut guard = slot.state.lock().await;
            let state: &mut ChainState = &mut guard;
            match reply {
                Ok(IoReply::Forwarded(ack)) if ack.version == sent.version.0 => {
                    if let Some(log) = state.log.as_mut() {
                        if log.successor_acked(sent.version, ack.acknowledged).is_ok() {
                            state.prune();
                        }
                    }
                    slot.moved.notify_waiters();
                    if covered(state) {
                        if let (Some(log), Some(head)) = (state.log.as_ref(), state.head.as_mut()) {
                            head.answer(log.ack_up());
                        }
                        return Ok(());
                    }
                }
                Err(Trouble::Wait(what)) => {
                    tracing::debug!(chain, position = sent.position, %what, "pipelined forward failed; sending in order");
                    if state.link.as_ref().is_some_and(|(_, _, c)| Arc::ptr_eq(c, connection)) {
                        state.link = None;
                    }
                    self.held.address_failed();
                }
                _ => {}
            }
            return self.in_order(slot, state, chain, me, &sent).await;
        }
        let mut guard = slot.state.lock().await;
        self.in_order(slot, &mut guard, chain, me, &sent).await
    }

    /// The fallback of [`pipelined`](Self::pipelined), under the chain's lock.
    async fn in_order(
        &self,
        slot: &ChainSlot,
        state: &mut ChainState,
        chain: u32,
        me: TargetId,
        sent: &Pipelined,
    ) -> Result<(), Stop> {
        let drained = self.drain(state, chain, me).await;
        slot.moved.notify_waiters();
        drained?;
        let acked = state.log.as_ref().map_or(0, |log| log.ack_up());
        if let Some(head) = state.head.as_mut() {
            head.answer(acked);
        }
        if acked < sent.position {
            return Err(Stop::Failed(not_acknowledged(chain, sent.position, acked)));
        }
        Ok(())
    }

    /// Fences a change; a client ahead of this server (it holds a newer version) waits for
    /// this server to hear of it, at most `chain_change_wait_ms`.
    async fn fence_change(
        &self,
        chain: u32,
        version: u64,
        request: &IoRequest,
    ) -> Result<crate::chain_write::Placed, ForwardRefused> {
        let (chains, lease) = self.view();
        match fence_chained((chain, version), request, (&chains, lease), &self.mine) {
            Err(ForwardRefused { reason: ForwardRefusalReason::Stale { current }, .. })
                if current < version =>
            {
                self.held.nudge();
                let until = Instant::now() + self.config.change_wait;
                self.wait_change(chain, current, until).await;
                let (chains, lease) = self.view();
                fence_chained((chain, version), request, (&chains, lease), &self.mine)
            }
            other => other,
        }
    }

    /// A forward from the predecessor: fenced, ordered (one that arrived ahead of earlier
    /// positions is held, at most `chain_gap_wait_ms`, until they are applied), applied,
    /// sent on to this member's successor outside the chain's lock (as the head does), and
    /// answered with the cumulative acknowledgement.
    pub(crate) async fn forward(
        &self,
        request_id: u64,
        forward: ChainForward,
        data: Bytes,
        sender: &str,
    ) -> IoReply {
        if let Err(error) = forwardable(&forward) {
            return IoReply::Error(error);
        }
        let (chain, version) = (forward.chain, forward.version);
        // Only a member's server credential forwards into the chain (the fence below
        // refuses a chain this server does not hold).
        if let Some(info) = self.held.chain(chain) {
            if let Err(error) = sender_may_forward(&info, &self.held.credentials(), sender) {
                // A member just registered may be missing from the list: ask for it again.
                self.held.address_failed();
                tracing::warn!(chain, sender, "forward from a non-member refused");
                return IoReply::Error(error);
            }
        }
        let slot = self.state(chain);
        let hold_until = Instant::now() + self.config.gap_wait;
        let (me, sent) = loop {
            let moved = slot.moved.notified();
            let mut guard = slot.state.lock().await;
            let state: &mut ChainState = &mut guard;
            let (chains, lease) = self.view();
            let admitted = match fence(&forward, &chains, lease) {
                Ok(admitted) => admitted,
                Err(refused) => return IoReply::ForwardRefused(refused),
            };
            let Some(me) = forward.target().filter(|t| self.mine.contains(t)) else {
                let refused = ForwardRefused { chain, version, reason: ForwardRefusalReason::NotMember };
                return IoReply::ForwardRefused(refused);
            };
            let role = match self.follow(state, chain, me) {
                Ok(role) => role,
                Err(stop) => return self.stopped(chain, version, stop),
            };
            if matches!(
                forward.entry,
                ForwardEntry::Copy { .. } | ForwardEntry::CopyDone { .. } | ForwardEntry::Unsettled { .. }
            ) {
                return self.take_copy(request_id, state, admitted, &forward, data).await;
            }
            let log = state.log.get_or_insert_with(|| {
                ChainMemberLog::new(ChainId(chain), admitted.version, 0, admitted.has_successor)
            });
            match order(log, admitted, &forward) {
                Err(ForwardRefused { reason: ForwardRefusalReason::Gap { expected }, .. })
                    if early(
                        expected,
                        forward.position,
                        self.config.window_max,
                        Instant::now() >= hold_until,
                    ) == Early::Hold =>
                {
                    drop(guard);
                    let until = tokio::time::Instant::from_std(hold_until);
                    let _ = tokio::time::timeout_at(until, moved).await;
                    continue;
                }
                Err(refused) => return IoReply::ForwardRefused(refused),
                Ok(Receive::Duplicate { .. }) => break (me, None),
                Ok(Receive::Apply) => {
                    let done = self.execute(request_id, store_request(&forward), data.clone()).await;
                    if let IoReply::Error(error) = done.message {
                        return IoReply::Error(error);
                    }
                    note(state, &store_request(&forward));
                    let Some(log) = state.log.as_mut() else { return IoReply::Error(lost_log(chain)) };
                    log.applied_entry(entry_of(&forward));
                    let payload = Arc::new(Sent { entry: forward.entry.clone(), data });
                    state.payloads.insert(forward.position, payload.clone());
                    slot.moved.notify_waiters();
                    let Some(successor) = role.successor.filter(|_| !role.successor_syncing) else {
                        break (me, None);
                    };
                    let link = self.link(state, successor).await.ok();
                    let position = forward.position;
                    let version = ChainVersion(version);
                    break (me, Some(Pipelined { version, position, successor, link, payload }));
                }
            }
        };
        let sent = match sent {
            Some(sent) => self.pipelined(&slot, chain, me, sent).await,
            // A duplicate, the tail, or a syncing successor: in order, under the lock.
            None => {
                let mut guard = slot.state.lock().await;
                let drained = self.drain(&mut guard, chain, me).await;
                slot.moved.notify_waiters();
                drained
            }
        };
        if let Err(stop) = sent {
            return self.stopped(chain, version, stop);
        }
        let guard = slot.state.lock().await;
        let Some(log) = guard.log.as_ref() else { return IoReply::Error(lost_log(chain)) };
        if log.version() != ChainVersion(version) {
            let reason = ForwardRefusalReason::Stale { current: log.version().0 };
            return IoReply::ForwardRefused(ForwardRefused { chain, version, reason });
        }
        IoReply::Forwarded(ForwardAck { chain, version, applied: log.applied(), acknowledged: log.ack_up() })
    }

    /// A resync copy step or its end, at a `Syncing` member (fenced, its log followed): a
    /// step is applied outside the order; the end makes the log continue from the
    /// position the copy was taken at.
    async fn take_copy(
        &self,
        request_id: u64,
        state: &mut ChainState,
        admitted: Admitted,
        forward: &ChainForward,
        data: Bytes,
    ) -> IoReply {
        let (chain, version, position) = (forward.chain, forward.version, forward.position);
        if admitted.serving {
            let refused = ForwardRefused { chain, version, reason: ForwardRefusalReason::NotMember };
            return IoReply::Error(WireError::new(
                ErrorCode::InvalidArgument,
                format!("{refused}: a serving member takes no resync copy"),
            ));
        }
        let done = ForwardAck { chain, version, applied: position, acknowledged: position };
        match &forward.entry {
            ForwardEntry::Copy { .. } => {
                let request = store_request(forward);
                let reply = self.execute(request_id, request.clone(), data).await;
                match reply.message {
                    IoReply::Error(error) if !copy_tolerates(&request, error.code) => IoReply::Error(error),
                    _ => IoReply::Forwarded(done),
                }
            }
            ForwardEntry::Unsettled { fork, offset, length_bytes } => {
                let Some(range) = ByteRange::new(*offset, *length_bytes).ok().flatten() else {
                    return IoReply::Forwarded(done);
                };
                if state.inherited_count >= self.inherited_max() {
                    state.inherited_overflowed = true;
                    return IoReply::Forwarded(done);
                }
                let key = (fork.target, fork.file.0, fork.subfile.0, fork.fork.clone());
                state.inherited.record(position, key, range);
                state.inherited_count += 1;
                IoReply::Forwarded(done)
            }
            _ => {
                let mut log =
                    ChainMemberLog::new(ChainId(chain), admitted.version, position, admitted.has_successor);
                // The source's unsettled ranges become this member's: another member may
                // hold them unsynced, and a record this member starts must cover them.
                log.copied_to(position, &std::mem::take(&mut state.inherited));
                state.inherited_count = 0;
                state.unsettled_partial = std::mem::take(&mut state.inherited_overflowed);
                state.log = Some(log);
                state.payloads.clear();
                tracing::info!(
                    chain,
                    version,
                    position,
                    "resync copy received; continuing the chain's order"
                );
                IoReply::Forwarded(done)
            }
        }
    }

    /// The copy source's resync of its syncing successor (see `resync_step`), with writes
    /// going on: under the chain's lock, the plan is taken (the resync record if it covers
    /// the joiner, else every subfile the metadata service lists on the chain) and a
    /// `dirty` record started; the plan is copied outside the lock, piece by piece (each
    /// copy step read from the store and sent; changes applied meanwhile are acknowledged by
    /// this member as the tail and land in `dirty`); then, under the lock again, whatever
    /// `dirty` holds is copied (everything, if it overflowed), `CopyDone` is sent at this
    /// member's position, the joiner becomes its successor from there, and the metadata
    /// service is told (`SyncDone`). A byte copied before a change meanwhile is copied
    /// again in the last pass, so the joiner never ends with stale bytes over newer ones.
    async fn copy_live(&self, slot: &ChainSlot, chain: u32, me: TargetId) -> Result<(), Trouble> {
        let started = Instant::now();
        let (joiner, version, plan, mut sender) = {
            let mut guard = slot.state.lock().await;
            let state: &mut ChainState = &mut guard;
            self.follow(state, chain, me).map_err(|_| Trouble::Changed)?;
            let Some(info) = self.held.chain(chain) else { return Err(Trouble::Changed) };
            let ResyncStep::Copy { joiner, version } = resync_step(&info, me, state.copied) else {
                return Ok(());
            };
            let joiner_full = info.members.iter().any(|m| {
                m.target == joiner && !matches!(m.state, ChainMemberState::Syncing { full: false, .. })
            });
            let plan = state.record.as_ref().filter(|r| !joiner_full && r.covers_target(joiner)).cloned();
            if let Some(record) = &plan {
                tracing::debug!(chain, %me, %joiner, version = version.0, members = ?info.members, since = record.since().0, keys = ?record.keys(), "resync plan from the record");
            }
            let covers = [joiner].into_iter().collect();
            state.dirty =
                Some(MissedRecord::new(version, covers, RANGES_PER_FORK_MAX, self.config.record_bytes_max));
            let connection = self.link(state, joiner).await?;
            let position = state.log.as_ref().map_or(0, |log| log.applied());
            let sender = CopySender { paths: self, connection, chain, version, position, joiner, bytes: 0 };
            (joiner, version, plan, sender)
        };
        let mode = if plan.is_some() { "recorded" } else { "full" };
        let mut keys = match &plan {
            Some(record) => self.copy_recorded(&mut sender, me, record).await?,
            None => self.copy_all(&mut sender, chain, me).await?,
        };
        let outside = sender.bytes;
        let mut guard = slot.state.lock().await;
        let state: &mut ChainState = &mut guard;
        let again = self.follow(state, chain, me).ok().and_then(|_| self.held.chain(chain));
        if again.map(|info| resync_step(&info, me, state.copied))
            != Some(ResyncStep::Copy { joiner, version })
        {
            state.dirty = None;
            return Err(Trouble::Changed);
        }
        let dirty = state.dirty.take();
        match dirty {
            Some(dirty) if !dirty.overflowed() => keys += self.copy_recorded(&mut sender, me, &dirty).await?,
            _ => keys += self.copy_all(&mut sender, chain, me).await?,
        }
        let Some(position) = state.log.as_ref().map(|log| log.applied()) else {
            return Err(Trouble::Wait(format!("chain {chain}: no member log to copy from")));
        };
        sender.position = position;
        // What this member has not seen settled, the joiner counts unsettled too: a member
        // may hold it unsynced, and a record the joiner starts later must cover it.
        let unsettled = state.log.as_ref().map(|log| log.unsettled().ranges(RANGES_PER_FORK_MAX));
        for ((_, file, subfile, fork), set) in unsettled.unwrap_or_default() {
            let fork = ForkRef { target: joiner, file: FileId(file), subfile: SubfileIndex(subfile), fork };
            for range in set.iter() {
                let (offset, length_bytes) = (range.offset, range.length_bytes);
                let entry = ForwardEntry::Unsettled { fork: fork.clone(), offset, length_bytes };
                sender.send(entry, Bytes::new()).await?;
            }
        }
        sender.send(ForwardEntry::CopyDone { target: joiner }, Bytes::new()).await?;
        let bytes = sender.bytes;
        let log = state.log.as_mut().ok_or(Trouble::Changed)?;
        if log.version() != version || log.applied() != position {
            return Err(Trouble::Changed);
        }
        log.change_version(version, true, true);
        log.successor_acked(version, position).map_err(|_| Trouble::Changed)?;
        state.copied = Some(Copied { version, joiner, reported: false });
        let counter = match mode {
            "recorded" => &self.resyncs.recorded_copies,
            _ => &self.resyncs.full_copies,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            chain, version = version.0, %joiner, position, keys, bytes, outside_lock_bytes = outside, mode,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "resync copy done"
        );
        self.report(state, chain, joiner, version).await;
        Ok(())
    }

    /// Copies every subfile the metadata service lists on `chain` whole; returns how many.
    async fn copy_all(&self, sender: &mut CopySender<'_>, chain: u32, me: TargetId) -> Result<u64, Trouble> {
        let (mut after, mut subfiles) = (0u64, 0u64);
        loop {
            let ask = MetaRequest::ChainSubfiles { chain, after, scan_max: CHAIN_SUBFILES_SCAN_MAX };
            let page = match self.held.ask_meta(ask, self.config.forward_timeout).await {
                Ok(MetaReply::ChainSubfiles { subfiles, next }) => (subfiles, next),
                Ok(other) => {
                    return Err(Trouble::Wait(format!("listing chain {chain}'s subfiles: {other:?}")))
                }
                Err(error) => {
                    return Err(Trouble::Wait(format!("listing chain {chain}'s subfiles: {error}")))
                }
            };
            for (file, subfile) in page.0 {
                self.copy_subfile(sender, me, (FileId(file), SubfileIndex(subfile))).await?;
                subfiles += 1;
            }
            match page.1 {
                Some(next) => after = next,
                None => return Ok(subfiles),
            }
        }
    }

    /// Tells the metadata service that `joiner` caught up on `chain` at `version`; a
    /// failure is retried by the next resync pass.
    async fn report(&self, state: &mut ChainState, chain: u32, joiner: TargetId, version: ChainVersion) {
        let ask = MetaRequest::SyncDone { chain, target: joiner, version: version.0 };
        match self.held.ask_meta(ask, self.config.forward_timeout).await {
            Ok(MetaReply::Done) => {
                state.copied = Some(Copied { version, joiner, reported: true });
                self.held.nudge();
            }
            Ok(other) => tracing::warn!(chain, %joiner, reply = ?other, "SyncDone not taken; will retry"),
            Err(error) => tracing::warn!(chain, %joiner, %error, "SyncDone not sent; will retry"),
        }
    }

    /// Copies the joiner what `record` holds: subfiles created or removed whole, every
    /// other fork only its recorded ranges (see `copy_ranges`). Returns the keys copied.
    async fn copy_recorded(
        &self,
        sender: &mut CopySender<'_>,
        me: TargetId,
        record: &Record,
    ) -> Result<u64, Trouble> {
        let whole: std::collections::BTreeSet<(u64, u32)> =
            record.keys().keys().filter(|(_, _, fork)| fork.is_none()).map(|&(f, s, _)| (f, s)).collect();
        let mut keys = 0u64;
        for ((file_id, subfile_index, fork), set) in record.keys() {
            let (file_id, subfile_index) = (*file_id, *subfile_index);
            let at = (FileId(file_id), SubfileIndex(subfile_index));
            match fork {
                None => self.copy_subfile(sender, me, at).await?,
                Some(_) if whole.contains(&(file_id, subfile_index)) => continue,
                Some(fork) => self.copy_ranges(sender, me, at, fork, set).await?,
            }
            keys += 1;
        }
        Ok(keys)
    }

    /// Copies the recorded ranges of one fork: clipped to this member's size of it now,
    /// then the joiner's fork truncated to that size and synced; a fork this member no
    /// longer has is removed at the joiner.
    async fn copy_ranges(
        &self,
        sender: &mut CopySender<'_>,
        me: TargetId,
        (file, subfile): (FileId, SubfileIndex),
        fork: &str,
        set: &RangeSet,
    ) -> Result<(), Trouble> {
        let joiner = sender.joiner;
        let mine = ForkRef { target: me, file, subfile, fork: fork.to_string() };
        let theirs = ForkRef { target: joiner, ..mine.clone() };
        let size = match self.local(IoRequest::ForkSize { fork: mine.clone() }).await {
            Ok((IoReply::Size { bytes }, _)) => bytes,
            Err(error) if error.code == ErrorCode::NotFound => {
                return sender.request(IoRequest::RemoveFork { fork: theirs }, Bytes::new()).await;
            }
            Ok((other, _)) => return Err(Trouble::Wait(format!("the size of {file}: {other:?}"))),
            Err(error) => return Err(Trouble::Wait(format!("the size of {file}: {error}"))),
        };
        sender.request(IoRequest::CreateSubfile { target: joiner, file, subfile }, Bytes::new()).await?;
        sender.request(IoRequest::CreateFork { fork: theirs.clone() }, Bytes::new()).await?;
        for piece in pieces_within(set, size, self.config.copy_chunk_bytes) {
            self.copy_rate.take(piece.length_bytes).await;
            let read = IoRequest::Read {
                fork: mine.clone(),
                shape: Shape::contiguous(piece.offset, piece.length_bytes),
            };
            let data = match self.local(read).await {
                Ok((_, data)) => data,
                Err(error) => return Err(Trouble::Wait(format!("reading {file} to copy it: {error}"))),
            };
            if data.is_empty() {
                break;
            }
            let write = IoRequest::Write {
                fork: theirs.clone(),
                shape: Shape::contiguous(piece.offset, data.len() as u64),
            };
            sender.request(write, Bytes::from(data)).await?;
        }
        sender.request(IoRequest::Truncate { fork: theirs.clone(), size_bytes: size }, Bytes::new()).await?;
        sender.request(IoRequest::Sync { fork: theirs }, Bytes::new()).await
    }

    /// Copies one subfile of this member's target to the joiner, whole.
    async fn copy_subfile(
        &self,
        sender: &mut CopySender<'_>,
        me: TargetId,
        (file, subfile): (FileId, SubfileIndex),
    ) -> Result<(), Trouble> {
        let joiner = sender.joiner;
        sender.request(IoRequest::RemoveSubfile { target: joiner, file, subfile }, Bytes::new()).await?;
        let forks = match self.local(IoRequest::ListForks { target: me, file, subfile }).await {
            Ok((IoReply::Forks(forks), _)) => forks,
            // Never written here: the joiner keeps nothing of it either.
            Err(error) if error.code == ErrorCode::NotFound => return Ok(()),
            Ok((other, _)) => return Err(Trouble::Wait(format!("listing the forks of {file}: {other:?}"))),
            Err(error) => return Err(Trouble::Wait(format!("listing the forks of {file}: {error}"))),
        };
        sender.request(IoRequest::CreateSubfile { target: joiner, file, subfile }, Bytes::new()).await?;
        for fork in forks {
            let mine = ForkRef { target: me, file, subfile, fork: fork.name.clone() };
            let theirs = ForkRef { target: joiner, ..mine.clone() };
            sender.request(IoRequest::CreateFork { fork: theirs.clone() }, Bytes::new()).await?;
            let mut offset = 0u64;
            while offset < fork.size_bytes {
                let length = (fork.size_bytes - offset).min(self.config.copy_chunk_bytes.max(1));
                self.copy_rate.take(length).await;
                let read = IoRequest::Read { fork: mine.clone(), shape: Shape::contiguous(offset, length) };
                let data = match self.local(read).await {
                    Ok((_, data)) => data,
                    Err(error) => return Err(Trouble::Wait(format!("reading {file} to copy it: {error}"))),
                };
                let got = data.len() as u64;
                if got == 0 {
                    break;
                }
                let write = IoRequest::Write { fork: theirs.clone(), shape: Shape::contiguous(offset, got) };
                sender.request(write, Bytes::from(data)).await?;
                offset += got;
            }
            let truncate = IoRequest::Truncate { fork: theirs.clone(), size_bytes: fork.size_bytes };
            sender.request(truncate, Bytes::new()).await?;
            sender.request(IoRequest::Sync { fork: theirs }, Bytes::new()).await?;
        }
        Ok(())
    }

    /// Bound on the unsettled ranges a syncing member takes from its copy source (the
    /// `resync_record_bytes_max` a record of as many ranges would reach).
    fn inherited_max(&self) -> usize {
        usize::try_from(self.config.record_bytes_max / RECORD_RANGE_BYTES).unwrap_or(usize::MAX).max(1)
    }

    /// Runs a read of this server's own store (no subfile made on demand).
    async fn local(&self, request: IoRequest) -> Result<(IoReply, Vec<u8>), WireError> {
        let executor = self.executor.clone();
        let ran = tokio::task::spawn_blocking(move || executor.execute(0, &request, &[], false)).await;
        match ran {
            Ok(Reply { message: IoReply::Error(error), .. }) => Err(error),
            Ok(reply) => Ok((reply.message, reply.data)),
            Err(error) => Err(WireError::new(ErrorCode::Io, format!("the store call failed: {error}"))),
        }
    }

    /// One pass over the chains held: where this server is a copy source with a copy to
    /// make or report, it makes it (under the chain's lock, as any change). Run on every
    /// new view and every `period`.
    pub(crate) async fn resync_pass(&self) {
        for chain in self.held.chain_ids() {
            let slot = self.state(chain);
            let me = {
                let mut guard = slot.state.lock().await;
                let state: &mut ChainState = &mut guard;
                match self.resync_look(state, chain) {
                    Some((me, ResyncStep::Copy { .. })) => me,
                    Some((_, ResyncStep::Report { joiner, version })) => {
                        self.report(state, chain, joiner, version).await;
                        continue;
                    }
                    Some((_, ResyncStep::Nothing)) | None => continue,
                }
            };
            if let Err(Trouble::Wait(what)) = self.copy_live(&slot, chain, me).await {
                tracing::warn!(chain, %what, "resync copy did not finish; will retry");
                self.held.nudge();
            }
        }
    }

    /// Under the chain's lock: brings the record to the chain as held *now* and says what
    /// this member owes a syncing successor (none: not a member). Every view reaches the
    /// record, even of a chain nobody writes, so a member seen leaving is covered when it
    /// returns. The chain is read here, under the lock, never before it: the held table only
    /// moves forward (`held_table.rs`) and the lock orders its readers, so no view older than
    /// one `follow` brought the record to is observed (a snapshot taken before the lock was,
    /// and dropped a record a newer view had started).
    fn resync_look(&self, state: &mut ChainState, chain: u32) -> Option<(TargetId, ResyncStep)> {
        let info = self.held.chain(chain)?;
        let me = my_member(&info, &self.mine)?;
        if state.seen.as_ref().map(|seen| seen.version) != Some(info.version) {
            self.observe(state, &info, me);
        }
        Some((me, resync_step(&info, me, state.copied)))
    }

    fn stopped(&self, chain: u32, version: u64, stop: Stop) -> IoReply {
        match stop {
            Stop::Refused(reason) => IoReply::ForwardRefused(ForwardRefused { chain, version, reason }),
            Stop::Failed(error) => IoReply::Error(error),
        }
    }

    /// Brings the chain's log and head role to the version held now; refuses once this
    /// member is out of the write path.
    fn follow(&self, state: &mut ChainState, chain: u32, me: TargetId) -> Result<Role, Stop> {
        let Some(info) = self.held.chain(chain) else {
            state.head = None;
            return Err(Stop::Refused(ForwardRefusalReason::NotMember));
        };
        if my_member(&info, &self.mine) != Some(me) {
            state.head = None;
            return Err(Stop::Refused(ForwardRefusalReason::NotMember));
        }
        let role = Role::of(&info, me);
        if state.seen.as_ref().map(|seen| seen.version) != Some(info.version) {
            self.observe(state, &info, me);
        }
        // While this member owes its syncing successor a copy, it is the tail of the write
        // path: what it applies is acknowledged at once, and reaches the joiner through the
        // copy (`copy_live`), which reattaches it.
        let copying = matches!(resync_step(&info, me, state.copied), ResyncStep::Copy { .. });
        let has_successor = role.successor.is_some() && !copying;
        let log = state
            .log
            .get_or_insert_with(|| ChainMemberLog::new(ChainId(chain), role.version, 0, has_successor));
        if role.version > log.version() {
            log.change_version(role.version, role.serving, has_successor);
            if let Some(head) = state.head.as_mut() {
                // Entries it never applied were never answered: nothing is dropped here
                // (one entry at a time, applied before it is sent).
                let _dropped = head.change_version(log);
            }
        } else if copying && log.has_successor() {
            log.change_version(role.version, role.serving, false);
        }
        if state.link.as_ref().map(|(t, _, _)| *t) != role.successor {
            state.link = None;
        }
        match role.is_head(me) {
            true if state.head.is_none() => state.head = Some(ChainHead::new(log, self.config.window_max)),
            true => {}
            false => state.head = None,
        }
        if !role.in_path || (!role.serving && role.is_head(me)) {
            let current = role.version.0;
            return Err(Stop::Refused(ForwardRefusalReason::Stale { current }));
        }
        Ok(role)
    }

    /// Brings the chain's resync record to the view `info` (before the log follows it, so a
    /// record started now takes the ranges this member applied since the last settled sync:
    /// a member that just left may lack them, or may have lost them unsynced).
    fn observe(&self, state: &mut ChainState, info: &ChainInfo, me: TargetId) {
        let covered = state.record.as_ref().map(|r| r.covers().clone());
        let mut step = record_step(state.seen.as_ref(), info, me, covered.as_ref());
        if state.unsettled_partial {
            // This member's unsettled ranges may miss some: it cannot vouch for anyone.
            if let RecordStep::Start { cover } | RecordStep::Keep { cover } = &mut step {
                cover.clear();
            }
        }
        match step {
            RecordStep::Ignore => return,
            RecordStep::Drop => state.record = None,
            RecordStep::Keep { cover } => {
                if let Some(record) = state.record.as_mut() {
                    let gone: Vec<TargetId> =
                        record.covers().iter().copied().filter(|t| !cover.contains(t)).collect();
                    for target in gone {
                        record.uncover(target);
                    }
                    for target in cover {
                        record.cover(target);
                    }
                }
            }
            RecordStep::Start { cover } => {
                let since = ChainVersion(info.version);
                let mut record =
                    MissedRecord::new(since, cover, RANGES_PER_FORK_MAX, self.config.record_bytes_max);
                if let Some(log) = &state.log {
                    for ((_, file, subfile, fork), set) in log.unsettled().ranges(RANGES_PER_FORK_MAX) {
                        for range in set.iter() {
                            record.record((file, subfile, Some(fork.clone())), range);
                        }
                    }
                }
                tracing::debug!(chain = info.chain, version = info.version, %me, applied = state.log.as_ref().map(|l| l.applied()), members = ?info.members, old = ?state.seen.as_ref().map(|s| (s.version, s.members.clone())), covers = ?record.covers(), seed = ?record.keys(), "resync record started");
                state.record = Some(record);
            }
        }
        state.seen = Some(info.clone());
    }

    /// Sends everything this member applied and its successor has not acknowledged, until
    /// it is acknowledged, following version changes (see the module's comment).
    async fn drain(&self, state: &mut ChainState, chain: u32, me: TargetId) -> Result<(), Stop> {
        let mut deadline: Option<Instant> = None;
        let mut warned = false;
        loop {
            let role = self.follow(state, chain, me)?;
            state.prune();
            // The syncing successor gets its copy (`resync_pass`) before anything else.
            let step = self.held.chain(chain).map(|info| resync_step(&info, me, state.copied));
            let trouble = match step {
                Some(ResyncStep::Copy { .. }) => return Ok(()),
                _ => {
                    let Some(log) = state.log.as_ref() else { return Ok(()) };
                    if log.in_flight() == 0 {
                        return Ok(());
                    }
                    let Some(successor) = role.successor else { return Ok(()) };
                    match self.send(state, chain, successor).await {
                        Ok(()) => continue,
                        Err(trouble) => trouble,
                    }
                }
            };
            let Trouble::Wait(what) = trouble else { continue };
            let successor = role.successor.map_or_else(|| "none".to_string(), |s| s.to_string());
            // The first failure is tried again at once: a cached connection the successor
            // closed while idle is only found broken by using it.
            if deadline.is_none() {
                deadline = Some(Instant::now() + self.config.change_wait);
                self.held.nudge();
                continue;
            }
            let until = deadline.unwrap_or_else(Instant::now);
            match std::mem::replace(&mut warned, true) {
                false => {
                    tracing::warn!(chain, version = role.version.0, successor = %successor, %what, "chain successor did not acknowledge; waiting for the chain's next version")
                }
                true => {
                    tracing::debug!(chain, version = role.version.0, successor = %successor, %what, "chain successor still not acknowledging")
                }
            }
            if Instant::now() >= until {
                let message = format!(
                    "chain {chain} v{}: successor {successor} did not acknowledge ({what}) and no new chain version came within chain_change_wait_ms = {} ms",
                    role.version.0,
                    self.config.change_wait.as_millis()
                );
                return Err(Stop::Failed(WireError::new(ErrorCode::Unavailable, message)));
            }
            self.held.nudge();
            let retry = (Instant::now() + self.config.retry).min(until);
            self.wait_change(chain, role.version.0, retry).await;
        }
    }

    /// One pass over the outbox to `successor`, oldest first.
    async fn send(&self, state: &mut ChainState, chain: u32, successor: TargetId) -> Result<(), Trouble> {
        let connection = self.link(state, successor).await?;
        let Some(log) = state.log.as_ref() else { return Ok(()) };
        let version = log.version();
        let positions: Vec<u64> = log.retransmit(self.config.window_max).map(|e| e.position).collect();
        for position in positions {
            let Some(payload) = state.payloads.get(&position).cloned() else {
                return Err(Trouble::Wait(format!("position {position} is no longer held here")));
            };
            let forward = ChainForward {
                chain,
                version: version.0,
                position,
                entry: retarget_entry(&payload.entry, successor),
            };
            let reply = self.call(&connection, chain, version.0, &forward, payload.data.clone()).await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(trouble) => {
                    if matches!(trouble, Trouble::Wait(_)) {
                        state.link = None;
                        self.held.address_failed();
                    }
                    return Err(trouble);
                }
            };
            match reply {
                IoReply::Forwarded(ack) if ack.version == version.0 => {
                    let Some(log) = state.log.as_mut() else { return Ok(()) };
                    if log.successor_acked(version, ack.acknowledged).is_err() {
                        return Err(Trouble::Changed);
                    }
                    state.prune();
                    if ack.acknowledged < position {
                        return Err(Trouble::Wait(format!(
                            "acknowledged {} of position {}",
                            ack.acknowledged, position
                        )));
                    }
                }
                IoReply::Forwarded(ack) => {
                    return Err(Trouble::Wait(format!("acknowledged under v{}", ack.version)))
                }
                IoReply::ForwardRefused(refused) => return Err(Trouble::Wait(refused.to_string())),
                IoReply::Error(error) => return Err(Trouble::Wait(error.to_string())),
                other => return Err(Trouble::Wait(format!("unexpected reply {other:?}"))),
            }
        }
        Ok(())
    }

    /// The connection to `successor`, made if there is none.
    async fn link(&self, state: &mut ChainState, successor: TargetId) -> Result<Arc<Connection>, Trouble> {
        if let Some((target, _, connection)) = &state.link {
            if *target == successor && !connection.is_broken() {
                return Ok(connection.clone());
            }
        }
        state.link = None;
        let Some(addr) = self.held.address(successor) else {
            self.held.address_failed();
            return Err(Trouble::Wait(format!("no address known for target {successor}")));
        };
        // One connection per peer server, shared by the chains it succeeds this server in.
        let shared = self.peers.lock().get(&addr).filter(|c| !c.is_broken()).cloned();
        if let Some(connection) = shared {
            state.link = Some((successor, addr, connection.clone()));
            return Ok(connection);
        }
        let connection = Connection::connect(&addr, self.peer_config()).await.map_err(|error| {
            // The member may have restarted elsewhere: ask for the addresses again.
            self.held.address_failed();
            Trouble::Wait(error.to_string())
        })?;
        let connection = Arc::new(connection);
        let mut peers = self.peers.lock();
        peers.retain(|_, c| !c.is_broken());
        peers.insert(addr.clone(), connection.clone());
        drop(peers);
        state.link = Some((successor, addr, connection.clone()));
        Ok(connection)
    }

    /// Sends one forward; gives up when the chain's version changes meanwhile or after
    /// `chain_forward_timeout_ms`.
    async fn call(
        &self,
        connection: &Connection,
        chain: u32,
        version: u64,
        forward: &ChainForward,
        data: Bytes,
    ) -> Result<IoReply, Trouble> {
        let request = IoRequest::Forward { forward: forward.clone() };
        let until = Instant::now() + self.config.forward_timeout;
        tokio::select! {
            reply = connection.call::<IoRequest, IoReply>(&request, data) => match reply {
                Ok((reply, _)) => Ok(reply),
                Err(error) => Err(Trouble::Wait(error.to_string())),
            },
            changed = self.wait_change(chain, version, until) => match changed {
                true => Err(Trouble::Changed),
                false => Err(Trouble::Wait(format!(
                    "no answer within chain_forward_timeout_ms = {} ms",
                    self.config.forward_timeout.as_millis()
                ))),
            },
        }
    }

    /// Waits until the chain held is not at `version` (true) or `until` passes (false).
    async fn wait_change(&self, chain: u32, version: u64, until: Instant) -> bool {
        let mut watch = self.held.watch();
        loop {
            watch.borrow_and_update();
            if self.held.chain(chain).map(|c| c.version) != Some(version) {
                return true;
            }
            let deadline = tokio::time::Instant::from_std(until);
            tokio::select! {
                changed = watch.changed() => if changed.is_err() { return false },
                _ = tokio::time::sleep_until(deadline) => return false,
            }
        }
    }
}

/// Sends the steps of one resync copy to the joiner, each answered before the next.
struct CopySender<'p> {
    paths: &'p ChainPaths,
    connection: Arc<Connection>,
    chain: u32,
    version: ChainVersion,
    /// The source's position the copy is taken at.
    position: u64,
    joiner: TargetId,
    /// Fork bytes sent so far.
    bytes: u64,
}

impl CopySender<'_> {
    async fn request(&mut self, request: IoRequest, data: Bytes) -> Result<(), Trouble> {
        let length = data.len() as u64;
        self.send(ForwardEntry::Copy { request: Box::new(request) }, data).await?;
        self.bytes += length;
        self.paths.resyncs.bytes_copied.fetch_add(length, Ordering::Relaxed);
        Ok(())
    }

    async fn send(&mut self, entry: ForwardEntry, data: Bytes) -> Result<(), Trouble> {
        let forward =
            ChainForward { chain: self.chain, version: self.version.0, position: self.position, entry };
        let reply = self.paths.call(&self.connection, self.chain, self.version.0, &forward, data).await?;
        match reply {
            IoReply::Forwarded(ack) if ack.version == self.version.0 => Ok(()),
            other => Err(Trouble::Wait(format!("resync copy to {}: {other:?}", self.joiner))),
        }
    }
}

fn not_acknowledged(chain: u32, position: u64, acked: u64) -> WireError {
    let message = format!("chain {chain}: position {position} not acknowledged (acknowledged {acked})");
    WireError::new(ErrorCode::Unavailable, message)
}

fn lost_log(chain: u32) -> WireError {
    WireError::new(ErrorCode::Io, format!("chain {chain}: the member log vanished"))
}

/// Records an applied change in the chain's resync record, if this member keeps one.
fn note(state: &mut ChainState, request: &IoRequest) {
    let Some((key, range)) = recorded(request) else { return };
    if let Some(record) = state.record.as_mut() {
        record.record(key.clone(), range);
    }
    if let Some(dirty) = state.dirty.as_mut() {
        dirty.record(key, range);
    }
}
