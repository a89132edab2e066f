//! Replication's data path on a member (issue 32): forwards from the predecessor, fenced and
//! ordered before they touch the store.
//!
//! A forward is decided in two pure steps, kept apart from the I/O:
//! 1. [`fence`]: `flotilla_replica::admit` against the chain view the last heartbeat reply
//!    gave this server — the lease runs, the forward's target is a member of the chain in its
//!    write path, and the forward's version is exactly the server's;
//! 2. the chain's [`ChainMemberLog`]: the next position is applied, a duplicate is
//!    re-acknowledged, a gap is refused naming the position expected (the predecessor
//!    retransmits from there). The log follows the chain's version: on a change, a member no
//!    longer serving drops what nobody acknowledged.
//!
//! Then [`ChainLogs::apply`] runs the write (or sync) through the executor, as a client's,
//! with the chain's log locked, so one chain's entries reach the store in order; a failed
//! write records nothing and the entry is retransmitted.
//!
//! Not yet here: forwarding on to this member's successor and the head's side (the client
//! write path sends nothing down chains yet; replicated creates are refused), the positions
//! and unsettled ranges kept durably with the data, and checking that the sender is the
//! predecessor (a forward is accepted from any server credential).

use crate::execute::{Executor, Reply};
use flotilla_proto::{
    ChainForward, ChainInfo, ChainMemberState, ForkRef, ForwardAck, ForwardEntry, ForwardRefusalReason,
    ForwardRefused, IoReply, IoRequest,
};
use flotilla_replica::{
    admit, Access, Admission, ByteRange, ChainEntry, ChainId, ChainMemberLog, ChainVersion, EntryKind,
    MemberState, MemberView, OrderRefusal, Receive,
};
use flotilla_request::Shape;
use flotilla_types::TargetId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The subfile fork an entry touches (the unsettled ranges' key).
type ForkKey = (TargetId, u64, u32, String);

type MemberLog = ChainMemberLog<ForkKey, ()>;

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
    let target = forward.fork().target;
    let Some(chain) = chains.iter().find(|c| c.chain == forward.chain) else {
        if lease.now_ms >= lease.valid_until_ms {
            return Err(refused(forward, ForwardRefusalReason::NoLease));
        }
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
    let path: Vec<TargetId> = write_path(chain);
    let at = path.iter().position(|&t| t == target);
    Ok(Admitted {
        version: view.version,
        serving: state == Some(MemberState::Serving),
        has_successor: at.is_some_and(|i| i + 1 < path.len()),
    })
}

/// Serving members in chain order, then the syncing one (as `flotilla_replica::Chain`).
fn write_path(chain: &ChainInfo) -> Vec<TargetId> {
    let serving = chain.members.iter().filter(|m| m.state == ChainMemberState::Serving);
    let syncing = chain.members.iter().filter(|m| matches!(m.state, ChainMemberState::Syncing { .. }));
    serving.chain(syncing).map(|m| m.target).collect()
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

fn fork_key(fork: &ForkRef) -> ForkKey {
    (fork.target, fork.file.0, fork.subfile.0, fork.fork.clone())
}

/// The entry a forward becomes in the log (its bytes are in the store once applied).
fn entry_of(forward: &ChainForward) -> ChainEntry<ForkKey, ()> {
    let kind = match &forward.entry {
        ForwardEntry::Write { fork, offset, length_bytes } => match ByteRange::new(*offset, *length_bytes) {
            Ok(Some(range)) => EntryKind::Write { fork: fork_key(fork), range, payload: () },
            // An empty or overflowing write orders like a sync: it changes no bytes (an
            // overflowing one is refused by the store).
            _ => EntryKind::Sync,
        },
        ForwardEntry::Sync { .. } => EntryKind::Sync,
    };
    ChainEntry { position: forward.position, kind }
}

/// The store request a forward is applied as: the same path as a client's.
fn store_request(forward: &ChainForward) -> IoRequest {
    match &forward.entry {
        ForwardEntry::Write { fork, offset, length_bytes } => {
            IoRequest::Write { fork: fork.clone(), shape: Shape::contiguous(*offset, *length_bytes) }
        }
        ForwardEntry::Sync { fork } => IoRequest::Sync { fork: fork.clone() },
    }
}

/// Every chain's member log on this server.
#[derive(Default)]
pub(crate) struct ChainLogs {
    logs: Mutex<HashMap<u32, Arc<Mutex<MemberLog>>>>,
}

impl ChainLogs {
    fn log(&self, chain: u32, admitted: Admitted) -> Arc<Mutex<MemberLog>> {
        let mut logs = self.logs.lock();
        let log = logs.entry(chain).or_insert_with(|| {
            let log = ChainMemberLog::new(ChainId(chain), admitted.version, 0, admitted.has_successor);
            Arc::new(Mutex::new(log))
        });
        log.clone()
    }

    /// Fences, orders and applies `forward` (blocking: run it off the async threads).
    pub(crate) fn apply(
        &self,
        executor: &Executor,
        (chains, lease): (&[ChainInfo], Lease),
        request_id: u64,
        forward: &ChainForward,
        data: &[u8],
    ) -> Reply {
        let message = match self.apply_message(executor, (chains, lease), request_id, forward, data) {
            Ok(message) => message,
            Err(refusal) => IoReply::ForwardRefused(refusal),
        };
        Reply { request_id, message, data: Vec::new(), memory: None }
    }

    fn apply_message(
        &self,
        executor: &Executor,
        (chains, lease): (&[ChainInfo], Lease),
        request_id: u64,
        forward: &ChainForward,
        data: &[u8],
    ) -> Result<IoReply, ForwardRefused> {
        let admitted = fence(forward, chains, lease)?;
        let log = self.log(forward.chain, admitted);
        let mut log = log.lock();
        let ack = |log: &MemberLog| {
            let (chain, version) = (forward.chain, forward.version);
            IoReply::Forwarded(ForwardAck {
                chain,
                version,
                applied: log.applied(),
                acknowledged: log.ack_up(),
            })
        };
        if let Receive::Duplicate { .. } = order(&mut log, admitted, forward)? {
            return Ok(ack(&log));
        }
        let done = executor.execute(request_id, &store_request(forward), data, true);
        if let IoReply::Error(error) = done.message {
            return Ok(IoReply::Error(error));
        }
        log.applied_entry(entry_of(forward));
        Ok(ack(&log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::ChainMember;
    use flotilla_types::{FileId, SubfileIndex};

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
}
