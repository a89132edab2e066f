//! Replication's data path (issue 32), the pure part: deciding about a chained client
//! request or a forward from the predecessor, kept apart from the I/O (`chain_path.rs` does
//! the store calls and the sending).
//!
//! 1. [`fence`] (forwards) and [`fence_chained`] (client requests):
//!    `flotilla_replica::admit` against the chain view the last heartbeat reply gave this
//!    server — the lease runs, the target is a member of the chain (in its write path for a
//!    change, `Serving` for a read), the version is exactly the server's — and, for a
//!    change, this member is the chain's head ([`Role`]: serving members in chain order,
//!    then the syncing one).
//! 2. the chain's [`ChainMemberLog`] ([`order`]): the next position is applied, a duplicate
//!    is re-acknowledged, a gap is refused naming the position expected (the predecessor
//!    retransmits from there). The log follows the chain's version: on a change, a member
//!    no longer serving drops what nobody acknowledged.
//! 3. [`retarget`]: every member keeps the subfile under its own target, so an entry is
//!    rewritten to the receiver's target before it is sent and applied.
//!
//! 4. [`resync_step`]: whether this member is a copy source with a copy to make (or a
//!    made copy to report) for the chain's syncing member.
//!
//! 5. [`sender_may_forward`]: a forward into a chain is taken only from the server
//!    credential that reported one of the chain's members (as held now).
//!
//! Not yet here: the positions and unsettled ranges kept durably with the data, and
//! checking that the sender is exactly the predecessor (any member's credential may send).

use bytes::Bytes;
use flotilla_proto::{
    ChainForward, ChainInfo, ChainMemberState, ErrorCode, ForkRef, ForwardEntry, ForwardRefusalReason,
    ForwardRefused, IoRequest, WireError,
};
use flotilla_replica::{
    admit, Access, Admission, ByteRange, ChainEntry, ChainMemberLog, ChainVersion, EntryKind, MemberState,
    MemberView, MissedRecord, OrderRefusal, Receive, WHOLE,
};
use flotilla_request::Shape;
use flotilla_types::TargetId;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The subfile fork an entry touches (the unsettled ranges' key; "" for a whole subfile).
pub(crate) type ForkKey = (TargetId, u64, u32, String);

/// What an applied entry keeps until the successor acknowledged it: the entry as it came
/// (retargeted again for each successor) and its bytes.
#[derive(Debug)]
pub(crate) struct Sent {
    pub entry: ForwardEntry,
    pub data: Bytes,
}

pub(crate) type Payload = Arc<Sent>;

/// A member's log; the entries' contents are kept beside it (`chain_path.rs`), by position.
pub(crate) type MemberLog = ChainMemberLog<ForkKey, ()>;

/// What the fencing check found about this member in the forward's chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub version: ChainVersion,
    pub serving: bool,
    pub has_successor: bool,
}

/// The lease as the fencing check sees it: both in ms of one clock of this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub valid_until_ms: u64,
    pub now_ms: u64,
}

fn refused(forward: &ChainForward, reason: ForwardRefusalReason) -> ForwardRefused {
    ForwardRefused { chain: forward.chain, version: forward.version, reason }
}

fn member_state(state: ChainMemberState) -> MemberState {
    match state {
        ChainMemberState::Serving => MemberState::Serving,
        ChainMemberState::Syncing { missed_since, full } => {
            MemberState::Syncing { missed_since: ChainVersion(missed_since), full }
        }
        ChainMemberState::Offline { missed_since, full } => {
            MemberState::Offline { missed_since: ChainVersion(missed_since), full }
        }
        ChainMemberState::Dead => MemberState::Dead,
    }
}

/// Step 1: may `forward` be applied by this server with `chains` (its view) and `lease`?
pub(crate) fn fence(
    forward: &ChainForward,
    chains: &[ChainInfo],
    lease: Lease,
) -> Result<Admitted, ForwardRefused> {
    let Some(chain) = chains.iter().find(|c| c.chain == forward.chain) else {
        if lease.now_ms >= lease.valid_until_ms {
            return Err(refused(forward, ForwardRefusalReason::NoLease));
        }
        return Err(refused(forward, ForwardRefusalReason::NotMember));
    };
    let Some(target) = forward.target() else {
        return Err(refused(forward, ForwardRefusalReason::NotMember));
    };
    let state = chain.members.iter().find(|m| m.target == target).map(|m| member_state(m.state));
    let view = MemberView { version: ChainVersion(chain.version), state };
    let admission =
        admit(ChainVersion(forward.version), view, Access::Write, lease.valid_until_ms, lease.now_ms);
    match admission {
        Admission::Serve => {}
        Admission::Stale { current } => {
            return Err(refused(forward, ForwardRefusalReason::Stale { current: current.0 }))
        }
        Admission::NoLease => return Err(refused(forward, ForwardRefusalReason::NoLease)),
        _ => return Err(refused(forward, ForwardRefusalReason::NotMember)),
    }
    let role = Role::of(chain, target);
    Ok(Admitted { version: view.version, serving: role.serving, has_successor: role.successor.is_some() })
}

/// Serving members in chain order, then the syncing one (as `flotilla_replica::Chain`).
fn write_path(chain: &ChainInfo) -> Vec<TargetId> {
    let serving = chain.members.iter().filter(|m| m.state == ChainMemberState::Serving);
    let syncing = chain.members.iter().filter(|m| matches!(m.state, ChainMemberState::Syncing { .. }));
    serving.chain(syncing).map(|m| m.target).collect()
}

/// A member's place in one version of a chain.
///
/// Entries go down the write path: the serving members in chain order, then the syncing
/// one (at most one per chain). The last serving member is the syncing member's copy
/// source: it sends nothing else to it before the copy is done ([`resync_step`]), so the
/// copy and then every later entry reach it in one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Role {
    pub version: ChainVersion,
    /// The first serving member (the one that takes changes).
    pub head: Option<TargetId>,
    /// In the write path (serving, or syncing at its end).
    pub in_path: bool,
    pub serving: bool,
    /// The next member of the write path after this one.
    pub successor: Option<TargetId>,
    /// Whether the successor is the syncing member (this member is its copy source).
    pub successor_syncing: bool,
}

impl Role {
    pub(crate) fn of(chain: &ChainInfo, me: TargetId) -> Role {
        let serving: Vec<TargetId> =
            chain.members.iter().filter(|m| m.state == ChainMemberState::Serving).map(|m| m.target).collect();
        let path = write_path(chain);
        let at = path.iter().position(|&t| t == me);
        let successor = at.and_then(|i| path.get(i + 1).copied());
        Role {
            version: ChainVersion(chain.version),
            head: serving.first().copied(),
            in_path: at.is_some(),
            serving: serving.contains(&me),
            successor,
            successor_syncing: successor.is_some_and(|s| !serving.contains(&s)),
        }
    }

    pub(crate) fn is_head(&self, me: TargetId) -> bool {
        self.in_path && self.head == Some(me)
    }
}

/// What the copy source of a chain has done for the syncing member at one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Copied {
    pub version: ChainVersion,
    pub joiner: TargetId,
    /// `SyncDone` was accepted by the metadata service.
    pub reported: bool,
}

/// The next resync step of this server's member `me` of `chain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResyncStep {
    /// Not this member's business, or everything is done.
    Nothing,
    /// Copy every subfile of the chain to `joiner` (whole subfiles, first cut), under the
    /// chain's lock at this member's position, then `CopyDone`.
    Copy { joiner: TargetId, version: ChainVersion },
    /// The copy is acknowledged: report `SyncDone` for it.
    Report { joiner: TargetId, version: ChainVersion },
}

/// Decides the resync step: only the last serving member (the syncing member's
/// predecessor) copies; a copy made under another version or to another member does not
/// count (a version change restarts the copy); a copy acknowledged but not yet reported
/// is reported.
pub(crate) fn resync_step(chain: &ChainInfo, me: TargetId, copied: Option<Copied>) -> ResyncStep {
    let role = Role::of(chain, me);
    let Some(joiner) = role.successor.filter(|_| role.serving && role.successor_syncing) else {
        return ResyncStep::Nothing;
    };
    let version = role.version;
    match copied {
        Some(done) if done.version == version && done.joiner == joiner && done.reported => {
            ResyncStep::Nothing
        }
        Some(done) if done.version == version && done.joiner == joiner => {
            ResyncStep::Report { joiner, version }
        }
        _ => ResyncStep::Copy { joiner, version },
    }
}

/// A resync record's key: a subfile's fork, or the whole subfile (`None`: created or
/// removed). Keys drop the target: every member keeps the subfile under its own.
pub(crate) type RecordKey = (u64, u32, Option<String>);

/// A member's resync record of one chain (see `flotilla_replica::MissedRecord`).
pub(crate) type Record = MissedRecord<RecordKey>;

/// What a serving member records of a change it applied while a member was out: its key
/// and range (a truncation: from the new size on; anything but a contiguous write or a
/// truncation: the whole fork or subfile); nothing for a sync.
pub(crate) fn recorded(request: &IoRequest) -> Option<(RecordKey, ByteRange)> {
    let key = |fork: &ForkRef| (fork.file.0, fork.subfile.0, Some(fork.fork.clone()));
    match request {
        IoRequest::Write { fork, shape } => Some((key(fork), extent(shape).unwrap_or(WHOLE))),
        IoRequest::Truncate { fork, size_bytes } => {
            let range = ByteRange::new(*size_bytes, u64::MAX - size_bytes).ok().flatten().unwrap_or(WHOLE);
            Some((key(fork), range))
        }
        IoRequest::Extend { fork, .. } | IoRequest::CreateFork { fork } | IoRequest::RemoveFork { fork } => {
            Some((key(fork), WHOLE))
        }
        IoRequest::CreateSubfile { file, subfile, .. } | IoRequest::RemoveSubfile { file, subfile, .. } => {
            Some(((file.0, subfile.0, None), WHOLE))
        }
        _ => None,
    }
}

/// The file bytes a write's shape touches, from its first to its last (a superset for a
/// strided or batched shape); `None` for a shape that does not walk.
fn extent(shape: &Shape) -> Option<ByteRange> {
    if let Shape::Contiguous { file_offset, length, .. } = shape {
        return ByteRange::new(*file_offset, *length).ok().flatten();
    }
    let (mut start, mut end) = (u64::MAX, 0u64);
    shape
        .for_each_piece(|piece| {
            start = start.min(piece.file_offset);
            end = end.max(piece.file_offset.saturating_add(piece.length));
            Ok::<(), flotilla_request::ShapeError>(())
        })
        .ok()?;
    ByteRange::new(start, end.checked_sub(start)?).ok().flatten()
}

/// What a member does with its resync record of a chain on a new view of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RecordStep {
    /// This member is not serving, or every member serves: no record.
    Drop,
    /// Start a record (none was kept) covering these members.
    Start { cover: BTreeSet<TargetId> },
    /// Keep the record, now covering these members.
    Keep { cover: BTreeSet<TargetId> },
    /// The view is not newer than the one the record was brought to (views of a chain can
    /// arrive out of order): change nothing, and remember the newer view.
    Ignore,
}

/// Decides about `me`'s record on the view `new` (the view before: `old`; the members the
/// record covered: `covered`, none without a record). A member is covered if this member
/// saw it leave while serving itself (it was `Serving` in the view before and is out now),
/// or was covered and is still out (`Offline` or `Syncing`); a member that left unseen
/// (before this member served, or while it kept no record) is not, and gets the whole copy.
pub(crate) fn record_step(
    old: Option<&ChainInfo>,
    new: &ChainInfo,
    me: TargetId,
    covered: Option<&BTreeSet<TargetId>>,
) -> RecordStep {
    if old.is_some_and(|o| o.version >= new.version) {
        // An older view arriving late said every member serves again: dropping the record
        // on it (and starting a fresh one on the newer view after it) lost every range
        // recorded meanwhile that a sync then settled — the crash checker's lost files.
        return RecordStep::Ignore;
    }
    let serving = |chain: &ChainInfo, target: TargetId| {
        chain.members.iter().any(|m| m.target == target && m.state == ChainMemberState::Serving)
    };
    if !serving(new, me) || new.members.iter().all(|m| m.state == ChainMemberState::Serving) {
        return RecordStep::Drop;
    }
    let was_serving = old.is_some_and(|o| serving(o, me));
    let out = new
        .members
        .iter()
        .filter(|m| matches!(m.state, ChainMemberState::Offline { .. } | ChainMemberState::Syncing { .. }))
        .map(|m| m.target);
    let cover = out
        .filter(|&t| {
            let left_seen = was_serving && old.is_some_and(|o| serving(o, t));
            left_seen || covered.is_some_and(|c| c.contains(&t))
        })
        .collect();
    match covered {
        Some(_) => RecordStep::Keep { cover },
        None => RecordStep::Start { cover },
    }
}

/// Whether a failed copy step changes nothing worth stopping for: removing what the
/// joiner does not have, or creating what it already has.
pub(crate) fn copy_tolerates(request: &IoRequest, code: ErrorCode) -> bool {
    match request {
        IoRequest::RemoveSubfile { .. } | IoRequest::RemoveFork { .. } => code == ErrorCode::NotFound,
        IoRequest::CreateSubfile { .. } | IoRequest::CreateFork { .. } => code == ErrorCode::AlreadyExists,
        _ => false,
    }
}

/// This server's member of `chain` (a chain holds at most one target of a failure group,
/// so at most one of a server's targets).
pub(crate) fn my_member(chain: &ChainInfo, mine: &[TargetId]) -> Option<TargetId> {
    chain.members.iter().map(|m| m.target).find(|t| mine.contains(t))
}

/// Whether server credential `sender` may send forwards into `chain` (as held now, the
/// version the fence requires): only the credential that reported one of its members
/// (`credentials`: each target's reporting credential, from the metadata service's
/// `Status`). Refused naming the chain and the sender; a member whose credential is not
/// known yet counts for nobody (the caller asks for the list again).
pub(crate) fn sender_may_forward(
    chain: &ChainInfo,
    credentials: &std::collections::HashMap<TargetId, String>,
    sender: &str,
) -> Result<(), WireError> {
    let ours = chain
        .members
        .iter()
        .any(|m| credentials.get(&m.target).is_some_and(|c| !c.is_empty() && c == sender));
    if ours {
        return Ok(());
    }
    let members: Vec<String> = chain.members.iter().map(|m| m.target.to_string()).collect();
    Err(WireError::new(
        ErrorCode::PermissionDenied,
        format!(
            "chain {} v{}: forward from server credential {sender:?} refused: it serves none of the \
             chain's members ({})",
            chain.chain,
            chain.version,
            members.join(", ")
        ),
    ))
}

/// Whether a chained request reads (served by any serving member) or changes (taken by
/// the head only, then sent down the chain); anything else cannot be chained.
pub(crate) fn access_of(request: &IoRequest) -> Result<Access, WireError> {
    match request {
        IoRequest::Read { .. }
        | IoRequest::ForkSize { .. }
        | IoRequest::ListForks { .. }
        | IoRequest::BlockChecksums { .. }
        | IoRequest::Hsm { action: flotilla_proto::HsmAction::State, .. } => Ok(Access::Read),
        // Archive, release and recall: ordered by the head and applied by every member to
        // its own copy (each member's archive object is its own, keyed by its target).
        IoRequest::Hsm { .. }
        | IoRequest::Write { .. }
        | IoRequest::Truncate { .. }
        | IoRequest::Extend { .. }
        | IoRequest::CreateSubfile { .. }
        | IoRequest::RemoveSubfile { .. }
        | IoRequest::CreateFork { .. }
        | IoRequest::RemoveFork { .. }
        | IoRequest::Sync { .. } => Ok(Access::Write),
        other => Err(WireError::new(
            ErrorCode::BadRequest,
            format!("a {} cannot be chained", flotilla_proto::capability::request_name(other)),
        )),
    }
}

/// Where a chained request is executed on this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// This server's member of the chain.
    pub me: TargetId,
    pub role: Role,
}

/// Step 1 for a client's chained request on `chain` at `version`: admitted under this
/// server's view (lease, member, exact version; a read only while `Serving`, a change only
/// at the head), or the refusal to reply. The request's own target must name a member of
/// the chain (any: the request is applied to this server's member).
pub(crate) fn fence_chained(
    (chain_id, version): (u32, u64),
    request: &IoRequest,
    (chains, lease): (&[ChainInfo], Lease),
    mine: &[TargetId],
) -> Result<Placed, ForwardRefused> {
    let refuse = |reason| ForwardRefused { chain: chain_id, version, reason };
    let access = access_of(request).map_err(|_| refuse(ForwardRefusalReason::NotMember))?;
    let Some(chain) = chains.iter().find(|c| c.chain == chain_id) else {
        if lease.now_ms >= lease.valid_until_ms {
            return Err(refuse(ForwardRefusalReason::NoLease));
        }
        return Err(refuse(ForwardRefusalReason::NotMember));
    };
    let named = request.target();
    let me = my_member(chain, mine);
    let in_chain = named.is_some_and(|t| chain.members.iter().any(|m| m.target == t));
    let state = match (me, in_chain) {
        (Some(me), true) => chain.members.iter().find(|m| m.target == me).map(|m| member_state(m.state)),
        _ => None,
    };
    let view = MemberView { version: ChainVersion(chain.version), state };
    match admit(ChainVersion(version), view, access, lease.valid_until_ms, lease.now_ms) {
        Admission::Serve => {}
        Admission::Stale { current } => {
            return Err(refuse(ForwardRefusalReason::Stale { current: current.0 }))
        }
        Admission::NoLease => return Err(refuse(ForwardRefusalReason::NoLease)),
        Admission::NotMember { state: Some(_) } if access == Access::Read => {
            return Err(refuse(ForwardRefusalReason::NotReadable))
        }
        Admission::NotMember { state: Some(_) } => {
            let head = Role::of(chain, me.unwrap_or(TargetId(0))).head;
            return Err(refuse(ForwardRefusalReason::NotHead { head }));
        }
        _ => return Err(refuse(ForwardRefusalReason::NotMember)),
    }
    let me = me.ok_or_else(|| refuse(ForwardRefusalReason::NotMember))?;
    let role = Role::of(chain, me);
    if access == Access::Write && !role.is_head(me) {
        return Err(refuse(ForwardRefusalReason::NotHead { head: role.head }));
    }
    Ok(Placed { me, role })
}

/// Step 2 on `log` (brought to the admitted version first): apply, re-acknowledge, or refuse.
pub(crate) fn order(
    log: &mut MemberLog,
    admitted: Admitted,
    forward: &ChainForward,
) -> Result<Receive, ForwardRefused> {
    if admitted.version > log.version() {
        log.change_version(admitted.version, admitted.serving, admitted.has_successor);
    }
    match log.receive(ChainVersion(forward.version), forward.position) {
        Ok(decision) => Ok(decision),
        Err(OrderRefusal::Gap { expected, .. }) => {
            Err(refused(forward, ForwardRefusalReason::Gap { expected }))
        }
        Err(OrderRefusal::OtherVersion { mine, .. }) => {
            Err(refused(forward, ForwardRefusalReason::Stale { current: mine.0 }))
        }
        Err(_) => Err(refused(forward, ForwardRefusalReason::NotMember)),
    }
}

/// What a member does with a forward that arrived ahead of the next position it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Early {
    /// Hold it (outside the chain's lock) until the positions before it are applied: the
    /// predecessor pipelines up to a window of forwards, which may arrive out of order.
    Hold,
    /// Refuse it as a gap: the predecessor retransmits in order from `expected`.
    Refuse,
}

/// Step 2's rule for pipelined forwards: a forward at `got` while `expected` is the next
/// position is held only while it lies within one window (`window_max`) of `expected` and
/// the member has not yet held it for the whole of `chain_gap_wait_ms` (`waited_out`);
/// anything further ahead or held too long is refused as a gap. The positions before it
/// are applied first either way, so every member applies in position order.
pub(crate) fn early(expected: u64, got: u64, window_max: usize, waited_out: bool) -> Early {
    let ahead = got.saturating_sub(expected);
    let window = u64::try_from(window_max).unwrap_or(u64::MAX);
    match got > expected && ahead < window && !waited_out {
        true => Early::Hold,
        false => Early::Refuse,
    }
}

fn fork_key(fork: &ForkRef) -> ForkKey {
    (fork.target, fork.file.0, fork.subfile.0, fork.fork.clone())
}

/// Every byte of a fork: the range recorded for a change that is not a plain write (a
/// superset is safe: a resync copies more, never less).
fn whole() -> ByteRange {
    ByteRange { offset: 0, length_bytes: u64::MAX }
}

/// The log's kind of a change (its bytes are in the store once applied).
pub(crate) fn kind_of(request: &IoRequest) -> EntryKind<ForkKey, ()> {
    let write = |fork: ForkKey, range: ByteRange| EntryKind::Write { fork, range, payload: () };
    match request {
        IoRequest::Write { fork, shape: Shape::Contiguous { file_offset, length, .. } } => {
            match ByteRange::new(*file_offset, *length) {
                Ok(Some(range)) => write(fork_key(fork), range),
                _ => write(fork_key(fork), whole()),
            }
        }
        IoRequest::Sync { fork } => EntryKind::SyncFork { fork: fork_key(fork) },
        IoRequest::Write { fork, .. }
        | IoRequest::Truncate { fork, .. }
        | IoRequest::Extend { fork, .. }
        | IoRequest::CreateFork { fork }
        | IoRequest::RemoveFork { fork }
        | IoRequest::Hsm { fork, .. } => write(fork_key(fork), whole()),
        IoRequest::CreateSubfile { target, file, subfile }
        | IoRequest::RemoveSubfile { target, file, subfile } => {
            write((*target, file.0, subfile.0, String::new()), whole())
        }
        _ => write((TargetId(0), 0, 0, String::new()), whole()),
    }
}

/// The entry a forward becomes in the log.
pub(crate) fn entry_of(forward: &ChainForward) -> ChainEntry<ForkKey, ()> {
    ChainEntry { position: forward.position, kind: kind_of(&store_request(forward)) }
}

/// The store request a forward is applied as: the same path as a client's.
pub(crate) fn store_request(forward: &ChainForward) -> IoRequest {
    match &forward.entry {
        ForwardEntry::Write { fork, offset, length_bytes } => {
            IoRequest::Write { fork: fork.clone(), shape: Shape::contiguous(*offset, *length_bytes) }
        }
        ForwardEntry::Sync { fork } => IoRequest::Sync { fork: fork.clone() },
        ForwardEntry::Request { request } | ForwardEntry::Copy { request } => (**request).clone(),
        // Never applied as a store request: `chain_path.rs` takes copies apart before
        // ordering; a lone `Hello` changes nothing if one ever got here.
        ForwardEntry::CopyDone { .. } | ForwardEntry::Unsettled { .. } => {
            IoRequest::Hello { client: "copy done".into() }
        }
    }
}

/// `request` applied to `target` instead of the target it names.
pub(crate) fn retarget(request: &IoRequest, target: TargetId) -> IoRequest {
    let mut request = request.clone();
    match &mut request {
        IoRequest::Read { fork, .. }
        | IoRequest::Write { fork, .. }
        | IoRequest::CreateFork { fork }
        | IoRequest::RemoveFork { fork }
        | IoRequest::ForkSize { fork }
        | IoRequest::Extend { fork, .. }
        | IoRequest::Truncate { fork, .. }
        | IoRequest::Sync { fork }
        | IoRequest::Hsm { fork, .. }
        | IoRequest::BlockChecksums { fork, .. } => fork.target = target,
        IoRequest::CreateSubfile { target: t, .. }
        | IoRequest::RemoveSubfile { target: t, .. }
        | IoRequest::ListForks { target: t, .. } => *t = target,
        _ => {}
    }
    request
}

/// `entry` as sent to the member holding the subfile under `target`.
pub(crate) fn retarget_entry(entry: &ForwardEntry, target: TargetId) -> ForwardEntry {
    let mut entry = entry.clone();
    match &mut entry {
        ForwardEntry::Write { fork, .. }
        | ForwardEntry::Sync { fork }
        | ForwardEntry::Unsettled { fork, .. } => fork.target = target,
        ForwardEntry::Request { request } | ForwardEntry::Copy { request } => {
            **request = retarget(request, target)
        }
        ForwardEntry::CopyDone { target: t } => *t = target,
    }
    entry
}

/// Whether a forwarded request is one a chain carries (a change, never nested).
pub(crate) fn forwardable(forward: &ChainForward) -> Result<(), WireError> {
    match &forward.entry {
        ForwardEntry::Request { request } | ForwardEntry::Copy { request } => match access_of(request)? {
            Access::Write => Ok(()),
            Access::Read => {
                Err(WireError::new(ErrorCode::BadRequest, "a read is not forwarded down a chain"))
            }
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(version: u64, members: &[(u64, ChainMemberState)]) -> ChainInfo {
        let members = members
            .iter()
            .map(|&(t, state)| flotilla_proto::ChainMember { target: TargetId(t), state })
            .collect();
        ChainInfo { chain: 1, version, members }
    }

    #[test]
    fn a_record_covers_only_members_seen_leaving_while_this_member_served() {
        use ChainMemberState::{Serving, Syncing};
        let offline = ChainMemberState::Offline { missed_since: 5, full: false };
        let all = view(4, &[(1, Serving), (2, Serving), (3, Serving)]);
        let two_out = view(5, &[(1, Serving), (2, offline), (3, Serving)]);
        let cover = |ts: &[u64]| ts.iter().map(|&t| TargetId(t)).collect::<BTreeSet<_>>();
        assert_eq!(record_step(None, &all, TargetId(1), None), RecordStep::Drop, "everyone serves");
        assert_eq!(
            record_step(Some(&all), &two_out, TargetId(1), None),
            RecordStep::Start { cover: cover(&[2]) }
        );
        assert_eq!(record_step(Some(&all), &two_out, TargetId(2), None), RecordStep::Drop, "not serving");
        assert_eq!(
            record_step(None, &two_out, TargetId(1), None),
            RecordStep::Start { cover: cover(&[]) },
            "a member that left unseen (this server just started) is not covered"
        );
        let syncing = view(6, &[(1, Serving), (3, Serving), (2, Syncing { missed_since: 5, full: false })]);
        assert_eq!(
            record_step(Some(&two_out), &syncing, TargetId(3), Some(&cover(&[2]))),
            RecordStep::Keep { cover: cover(&[2]) }
        );
        let three_out = view(7, &[(1, Serving), (3, offline), (2, Syncing { missed_since: 5, full: false })]);
        assert_eq!(
            record_step(Some(&syncing), &three_out, TargetId(1), Some(&cover(&[2]))),
            RecordStep::Keep { cover: cover(&[2, 3]) }
        );
        assert_eq!(
            record_step(Some(&three_out), &all, TargetId(1), Some(&cover(&[2, 3]))),
            RecordStep::Ignore,
            "an older view arriving late (all serving at v4) neither drops nor restarts the record"
        );
        assert_eq!(
            record_step(Some(&syncing), &syncing, TargetId(1), Some(&cover(&[2]))),
            RecordStep::Ignore
        );
        let replacement = view(8, &[(1, Serving), (9, Syncing { missed_since: 8, full: true })]);
        assert_eq!(
            record_step(Some(&three_out), &replacement, TargetId(1), Some(&cover(&[2, 3]))),
            RecordStep::Keep { cover: cover(&[]) },
            "a replacement was never seen serving"
        );
    }

    #[test]
    fn a_truncation_records_from_its_new_size_and_a_subfile_change_the_whole_subfile() {
        let fork = ForkRef {
            target: TargetId(3),
            file: flotilla_types::FileId(7),
            subfile: flotilla_types::SubfileIndex(1),
            fork: "data".into(),
        };
        let key = (7, 1, Some("data".to_string()));
        let write = IoRequest::Write { fork: fork.clone(), shape: Shape::contiguous(10, 5) };
        assert_eq!(recorded(&write), Some((key.clone(), ByteRange { offset: 10, length_bytes: 5 })));
        let truncate = IoRequest::Truncate { fork: fork.clone(), size_bytes: 100 };
        assert_eq!(recorded(&truncate), Some((key, ByteRange { offset: 100, length_bytes: u64::MAX - 100 })));
        let remove = IoRequest::RemoveSubfile { target: TargetId(3), file: fork.file, subfile: fork.subfile };
        assert_eq!(recorded(&remove), Some(((7, 1, None), WHOLE)));
        let strided = Shape::Strided {
            file_offset: 100,
            memory_offset: 0,
            record_bytes: 10,
            file_stride: 50,
            memory_stride: 10,
            count: 3,
        };
        let write = IoRequest::Write { fork: fork.clone(), shape: strided };
        let range = recorded(&write).map(|(_, r)| r);
        assert_eq!(range, Some(ByteRange { offset: 100, length_bytes: 110 }), "first to last byte");
        assert_eq!(recorded(&IoRequest::Sync { fork }), None);
    }

    #[test]
    fn only_a_member_servers_credential_forwards_into_a_chain() {
        let member =
            |t: u64| flotilla_proto::ChainMember { target: TargetId(t), state: ChainMemberState::Serving };
        let chain = ChainInfo { chain: 7, version: 3, members: vec![member(1), member(2)] };
        let credentials: std::collections::HashMap<TargetId, String> = [
            (TargetId(1), "io-a".to_string()),
            (TargetId(2), "io-b".to_string()),
            (TargetId(3), "io-c".to_string()),
            (TargetId(4), String::new()),
        ]
        .into_iter()
        .collect();
        assert!(sender_may_forward(&chain, &credentials, "io-a").is_ok());
        assert!(sender_may_forward(&chain, &credentials, "io-b").is_ok());
        let refused = sender_may_forward(&chain, &credentials, "io-c").unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied);
        assert!(refused.message.contains("chain 7 v3"), "{}", refused.message);
        assert!(refused.message.contains("\"io-c\""), "{}", refused.message);
        // A member whose credential is unknown (or empty) vouches for nobody.
        let unknown = ChainInfo { chain: 8, version: 1, members: vec![member(4), member(5)] };
        assert!(sender_may_forward(&unknown, &credentials, "").is_err());
        assert!(sender_may_forward(&unknown, &credentials, "io-a").is_err());
    }

    #[test]
    fn an_early_forward_is_held_only_within_a_window_and_until_its_wait_runs_out() {
        assert_eq!(early(5, 6, 8, false), Early::Hold);
        assert_eq!(early(5, 12, 8, false), Early::Hold, "seven ahead, within a window of eight");
        assert_eq!(early(5, 13, 8, false), Early::Refuse, "a window or more ahead");
        assert_eq!(early(5, 6, 8, true), Early::Refuse, "held for the whole wait");
        assert_eq!(early(5, 5, 8, false), Early::Refuse, "not early at all");
        assert_eq!(early(5, 4, 8, false), Early::Refuse);
        assert_eq!(early(1, u64::MAX, usize::MAX, false), Early::Hold);
    }

    mod pipelined {
        use super::super::*;
        use flotilla_replica::ChainId;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        proptest! {
            /// A predecessor sends every unacknowledged entry of its window at once, in any
            /// order of arrival; the member applies what is next, holds what is early (or
            /// refuses it once its wait ran out), applies held entries as soon as they are
            /// next, and drops what is still early at the end of the round (its wait ran
            /// out: refused as a gap). The predecessor then sends again from the member's
            /// acknowledgement. Every entry is applied exactly once, in position order, and
            /// nothing a window or more ahead is ever held.
            #[test]
            fn out_of_order_arrivals_are_applied_in_position_order(
                entries in 1u64..60,
                window_max in 1usize..10,
                rounds in proptest::collection::vec((any::<u64>(), proptest::collection::vec(any::<bool>(), 10)), 1..80),
            ) {
                let version = ChainVersion(3);
                let mut log: MemberLog = ChainMemberLog::new(ChainId(1), version, 0, false);
                let mut order = Vec::new();
                let mut round = 0usize;
                while log.applied() < entries {
                    prop_assert!(round < 200, "no progress");
                    let (seed, waited) = &rounds[round % rounds.len()];
                    round += 1;
                    let from = log.ack_up() + 1;
                    let to = (from + window_max as u64 - 1).min(entries);
                    let mut sent: Vec<u64> = (from..=to).collect();
                    // A permutation of the window from the seed.
                    let mut x = *seed | 1;
                    for i in (1..sent.len()).rev() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        sent.swap(i, (x % (i as u64 + 1)) as usize);
                    }
                    let mut held = BTreeSet::new();
                    for (k, position) in sent.into_iter().enumerate() {
                        match log.receive(version, position) {
                            Ok(Receive::Apply) => {
                                log.applied_entry(ChainEntry { position, kind: EntryKind::Sync });
                                order.push(position);
                                // Held entries wake and apply while they are next.
                                while held.remove(&(log.applied() + 1)) {
                                    let next = log.applied() + 1;
                                    log.applied_entry(ChainEntry { position: next, kind: EntryKind::Sync });
                                    order.push(next);
                                }
                            }
                            Ok(Receive::Duplicate { .. }) => {}
                            Err(OrderRefusal::Gap { expected, got, .. }) => {
                                let waited_out = waited[k % waited.len()];
                                if early(expected, got, window_max, waited_out) == Early::Hold {
                                    prop_assert!(got - expected < window_max as u64);
                                    held.insert(got);
                                }
                            }
                            Err(other) => prop_assert!(false, "{other}"),
                        }
                    }
                }
                let expected: Vec<u64> = (1..=entries).collect();
                prop_assert_eq!(order, expected);
            }
        }
    }
    use flotilla_proto::ChainMember;
    use flotilla_replica::ChainId;
    use flotilla_types::{FileId, SubfileIndex};

    #[test]
    fn an_hsm_state_is_a_chained_read_and_an_action_a_change_of_its_fork() {
        use flotilla_proto::HsmAction;
        let fork =
            ForkRef { target: TargetId(3), file: FileId(9), subfile: SubfileIndex(1), fork: "data".into() };
        let hsm = |action| IoRequest::Hsm { fork: fork.clone(), action };
        assert_eq!(access_of(&hsm(HsmAction::State)).expect("chained"), Access::Read);
        for action in [HsmAction::Archive, HsmAction::Release, HsmAction::Restore] {
            assert_eq!(access_of(&hsm(action)).expect("chained"), Access::Write, "{action:?}");
            match kind_of(&hsm(action)) {
                EntryKind::Write { fork: key, range, .. } => {
                    assert_eq!(key, fork_key(&fork), "{action:?} orders against its own fork");
                    assert_eq!(range, whole(), "{action:?}");
                }
                other => panic!("{action:?}: {other:?}"),
            }
            let forward = ChainForward {
                chain: 1,
                version: 1,
                position: 1,
                entry: ForwardEntry::Request { request: Box::new(hsm(action)) },
            };
            assert!(forwardable(&forward).is_ok(), "{action:?} travels down the chain");
            let moved = retarget_entry(&forward.entry, TargetId(4));
            let ForwardEntry::Request { request } = moved else { panic!("{moved:?}") };
            assert_eq!(
                *request,
                IoRequest::Hsm { fork: ForkRef { target: TargetId(4), ..fork.clone() }, action }
            );
        }
    }

    fn forward(chain: u32, version: u64, position: u64, target: u64) -> ChainForward {
        let fork = ForkRef {
            target: TargetId(target),
            file: FileId(9),
            subfile: SubfileIndex(0),
            fork: "data".into(),
        };
        ChainForward {
            chain,
            version,
            position,
            entry: ForwardEntry::Write { fork, offset: 0, length_bytes: 4 },
        }
    }

    fn chains() -> Vec<ChainInfo> {
        let member = |t, state| ChainMember { target: TargetId(t), state };
        let members = vec![member(1, ChainMemberState::Serving), member(2, ChainMemberState::Serving)];
        let offline = ChainMemberState::Offline { missed_since: 2, full: false };
        vec![
            ChainInfo { chain: 0, version: 3, members },
            ChainInfo {
                chain: 1,
                version: 2,
                members: vec![member(2, ChainMemberState::Serving), member(1, offline)],
            },
        ]
    }

    const LEASE: Lease = Lease { valid_until_ms: 100, now_ms: 50 };

    fn reason(result: Result<Admitted, ForwardRefused>) -> Option<ForwardRefusalReason> {
        result.err().map(|r| r.reason)
    }

    #[test]
    fn fencing_admits_only_a_member_at_exactly_its_version_under_a_lease() {
        let chains = chains();
        let admitted = fence(&forward(0, 3, 1, 2), &chains, LEASE).unwrap();
        assert_eq!(admitted, Admitted { version: ChainVersion(3), serving: true, has_successor: false });
        assert!(fence(&forward(0, 3, 1, 1), &chains, LEASE).unwrap().has_successor);
        assert_eq!(
            reason(fence(&forward(0, 2, 1, 2), &chains, LEASE)),
            Some(ForwardRefusalReason::Stale { current: 3 })
        );
        assert_eq!(
            reason(fence(&forward(0, 4, 1, 2), &chains, LEASE)),
            Some(ForwardRefusalReason::Stale { current: 3 })
        );
        assert_eq!(
            reason(fence(&forward(7, 1, 1, 2), &chains, LEASE)),
            Some(ForwardRefusalReason::NotMember)
        );
        assert_eq!(
            reason(fence(&forward(0, 3, 1, 5), &chains, LEASE)),
            Some(ForwardRefusalReason::NotMember)
        );
        assert_eq!(
            reason(fence(&forward(1, 2, 1, 1), &chains, LEASE)),
            Some(ForwardRefusalReason::NotMember),
            "an offline member applies nothing"
        );
        let expired = Lease { valid_until_ms: 100, now_ms: 100 };
        assert_eq!(
            reason(fence(&forward(0, 3, 1, 2), &chains, expired)),
            Some(ForwardRefusalReason::NoLease)
        );
    }

    #[test]
    fn ordering_applies_the_next_reacknowledges_a_duplicate_and_names_a_gap() {
        let admitted = Admitted { version: ChainVersion(3), serving: true, has_successor: false };
        let mut log = ChainMemberLog::new(ChainId(0), ChainVersion(3), 0, false);
        assert_eq!(order(&mut log, admitted, &forward(0, 3, 1, 2)), Ok(Receive::Apply));
        log.applied_entry(entry_of(&forward(0, 3, 1, 2)));
        assert_eq!(order(&mut log, admitted, &forward(0, 3, 1, 2)), Ok(Receive::Duplicate { ack: 1 }));
        let gap = order(&mut log, admitted, &forward(0, 3, 3, 2)).unwrap_err();
        assert_eq!(gap.reason, ForwardRefusalReason::Gap { expected: 2 });
        // The chain moved on: the log follows, and the old version is refused.
        let newer = Admitted { version: ChainVersion(4), ..admitted };
        assert_eq!(order(&mut log, newer, &forward(0, 4, 2, 2)), Ok(Receive::Apply));
        assert_eq!(
            order(&mut log, newer, &forward(0, 3, 2, 2)).unwrap_err().reason,
            ForwardRefusalReason::Stale { current: 4 }
        );
    }

    fn chained_write(target: u64) -> IoRequest {
        let fork = ForkRef {
            target: TargetId(target),
            file: FileId(9),
            subfile: SubfileIndex(0),
            fork: "data".into(),
        };
        IoRequest::Write { fork, shape: Shape::contiguous(0, 4) }
    }

    fn chained_read(target: u64) -> IoRequest {
        let fork = ForkRef {
            target: TargetId(target),
            file: FileId(9),
            subfile: SubfileIndex(0),
            fork: "data".into(),
        };
        IoRequest::Read { fork, shape: Shape::contiguous(0, 4) }
    }

    #[test]
    fn roles_follow_the_serving_members_in_chain_order() {
        let member = |t, state| ChainMember { target: TargetId(t), state };
        let syncing = ChainMemberState::Syncing { missed_since: 4, full: false };
        let chain = ChainInfo {
            chain: 0,
            version: 5,
            members: vec![
                member(1, syncing),
                member(2, ChainMemberState::Serving),
                member(3, ChainMemberState::Serving),
            ],
        };
        let head = Role::of(&chain, TargetId(2));
        assert!(head.is_head(TargetId(2)) && head.serving);
        assert_eq!(head.successor, Some(TargetId(3)));
        let last = Role::of(&chain, TargetId(3));
        assert_eq!(
            (last.head, last.successor, last.successor_syncing),
            (Some(TargetId(2)), Some(TargetId(1)), true),
            "the last serving member sends on to the syncing member (its copy source)"
        );
        assert!(!head.successor_syncing);
        let tail = Role::of(&chain, TargetId(1));
        assert!(tail.in_path && !tail.serving && tail.successor.is_none() && !tail.is_head(TargetId(1)));
        assert!(!Role::of(&chain, TargetId(7)).in_path);
    }

    #[test]
    fn only_the_last_serving_member_copies_and_a_new_version_restarts_the_copy() {
        let member = |t, state| ChainMember { target: TargetId(t), state };
        let syncing = ChainMemberState::Syncing { missed_since: 4, full: false };
        let chain = |version| ChainInfo {
            chain: 0,
            version,
            members: vec![
                member(2, ChainMemberState::Serving),
                member(3, ChainMemberState::Serving),
                member(1, syncing),
            ],
        };
        let v5 = ChainVersion(5);
        let copy = ResyncStep::Copy { joiner: TargetId(1), version: v5 };
        assert_eq!(resync_step(&chain(5), TargetId(3), None), copy);
        assert_eq!(resync_step(&chain(5), TargetId(2), None), ResyncStep::Nothing, "not the last serving");
        assert_eq!(
            resync_step(&chain(5), TargetId(1), None),
            ResyncStep::Nothing,
            "the joiner copies nothing"
        );
        let done = Copied { version: v5, joiner: TargetId(1), reported: false };
        assert_eq!(
            resync_step(&chain(5), TargetId(3), Some(done)),
            ResyncStep::Report { joiner: TargetId(1), version: v5 }
        );
        let reported = Copied { reported: true, ..done };
        assert_eq!(resync_step(&chain(5), TargetId(3), Some(reported)), ResyncStep::Nothing);
        assert_eq!(
            resync_step(&chain(6), TargetId(3), Some(reported)),
            ResyncStep::Copy { joiner: TargetId(1), version: ChainVersion(6) },
            "a copy made under another version does not count"
        );
        let other = Copied { joiner: TargetId(9), ..done };
        assert_eq!(resync_step(&chain(5), TargetId(3), Some(other)), copy);
        let mut served = chain(6);
        served.members[2].state = ChainMemberState::Serving;
        assert_eq!(resync_step(&served, TargetId(3), Some(reported)), ResyncStep::Nothing, "nobody syncs");
    }

    #[test]
    fn a_copy_tolerates_only_removing_the_missing_and_creating_the_present() {
        let (target, file, subfile) = (TargetId(1), FileId(9), SubfileIndex(0));
        let remove = IoRequest::RemoveSubfile { target, file, subfile };
        let create = IoRequest::CreateSubfile { target, file, subfile };
        assert!(copy_tolerates(&remove, ErrorCode::NotFound));
        assert!(!copy_tolerates(&remove, ErrorCode::Io));
        assert!(copy_tolerates(&create, ErrorCode::AlreadyExists));
        assert!(!copy_tolerates(&chained_read(1), ErrorCode::NotFound));
    }

    #[test]
    fn chained_changes_go_to_the_head_and_reads_to_serving_members() {
        let chains = chains();
        let view = (chains.as_slice(), LEASE);
        let reason = |r: Result<Placed, ForwardRefused>| r.err().map(|r| r.reason);
        // Chain 0 v3: targets 1 (head) and 2, both serving.
        let placed = fence_chained((0, 3), &chained_write(1), view, &[TargetId(1)]).unwrap();
        assert_eq!(placed.me, TargetId(1));
        assert_eq!(
            reason(fence_chained((0, 3), &chained_write(1), view, &[TargetId(2)])),
            Some(ForwardRefusalReason::NotHead { head: Some(TargetId(1)) }),
            "a change sent to the second member names the head"
        );
        // The request may name any member: it is applied to this server's.
        assert_eq!(fence_chained((0, 3), &chained_read(1), view, &[TargetId(2)]).unwrap().me, TargetId(2));
        assert_eq!(
            reason(fence_chained((0, 2), &chained_read(1), view, &[TargetId(2)])),
            Some(ForwardRefusalReason::Stale { current: 3 })
        );
        assert_eq!(
            reason(fence_chained((0, 3), &chained_read(5), view, &[TargetId(2)])),
            Some(ForwardRefusalReason::NotMember),
            "a target outside the chain"
        );
        // Chain 1 v2: target 2 serving (head), target 1 offline.
        assert_eq!(
            reason(fence_chained((1, 2), &chained_read(1), view, &[TargetId(1)])),
            Some(ForwardRefusalReason::NotReadable)
        );
        assert_eq!(
            reason(fence_chained((1, 2), &chained_write(2), view, &[TargetId(1)])),
            Some(ForwardRefusalReason::NotHead { head: Some(TargetId(2)) })
        );
        assert!(fence_chained((1, 2), &chained_write(2), view, &[TargetId(2)]).is_ok());
        let expired = Lease { valid_until_ms: 100, now_ms: 100 };
        assert_eq!(
            reason(fence_chained((0, 3), &chained_read(1), (chains.as_slice(), expired), &[TargetId(2)])),
            Some(ForwardRefusalReason::NoLease)
        );
        assert!(access_of(&IoRequest::Stats).is_err(), "only data requests are chained");
    }

    #[test]
    fn entries_are_rewritten_to_each_members_target() {
        let request = chained_write(1);
        assert_eq!(retarget(&request, TargetId(7)).target(), Some(TargetId(7)));
        let create =
            IoRequest::CreateSubfile { target: TargetId(1), file: FileId(9), subfile: SubfileIndex(2) };
        assert_eq!(retarget(&create, TargetId(7)).target(), Some(TargetId(7)));
        let entry = ForwardEntry::Request { request: Box::new(request) };
        let forward =
            ChainForward { chain: 0, version: 3, position: 1, entry: retarget_entry(&entry, TargetId(2)) };
        assert_eq!(forward.target(), Some(TargetId(2)));
        assert_eq!(forward.data_bytes(), 4);
        assert!(fence(&forward, &chains(), LEASE).is_ok());
        let read = ForwardEntry::Request { request: Box::new(chained_read(2)) };
        let forward = ChainForward { chain: 0, version: 3, position: 1, entry: read };
        assert!(forwardable(&forward).is_err(), "a read never travels down a chain");
    }
}
