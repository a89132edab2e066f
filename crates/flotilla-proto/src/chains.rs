//! Replication's control messages (issue 32): what a server says about itself when it
//! registers and heartbeats (its failure group and incarnation), the chains a heartbeat
//! reply hands back, and the chain report `flotilla status` shows.
//!
//! Decoding is bounded as every message is: by the frame (`frame_bytes_max`), so no list
//! can claim more elements than the frame has bytes. The metadata service checks the
//! failure group's length ([`FAILURE_GROUP_BYTES_MAX`]) before using it.

use flotilla_types::TargetId;
use serde::{Deserialize, Serialize};

/// Longest failure group name, in bytes (as `flotilla_replica::FAILURE_GROUP_BYTES_MAX`).
pub const FAILURE_GROUP_BYTES_MAX: usize = 255;

/// What a server declares about itself with every registration and heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// What fails together with this server (default: its host name); no chain holds two
    /// targets of one group.
    pub failure_group: String,
    /// Grows every time the server starts (its start time in ms since the Unix epoch): a
    /// higher one tells the metadata service the server restarted and lost unsynced state.
    pub incarnation: u64,
}

/// A member's state in one chain (as `flotilla_replica::MemberState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainMemberState {
    Serving,
    Syncing { missed_since: u64, full: bool },
    Offline { missed_since: u64, full: bool },
    Dead,
}

/// One member of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainMember {
    pub target: TargetId,
    pub state: ChainMemberState,
}

/// One chain: its id, version and members in chain order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainInfo {
    pub chain: u32,
    pub version: u64,
    pub members: Vec<ChainMember>,
}

/// What a heartbeat reply tells a server of its chains: every chain one of its targets is
/// in, and the lease its heartbeat earned (valid for `lease_ms` from when the server sent
/// the heartbeat, by the server's own clock).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainView {
    pub lease_ms: u64,
    pub chains: Vec<ChainInfo>,
}

/// A target's health as the membership engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberHealth {
    /// Heard within `fence_after_ms`.
    Up,
    /// Silent past `fence_after_ms`: offline in its chains.
    Down,
    /// Silent past `dead_after_ms` (or removed): replaced in its chains.
    Dead,
    /// Being moved off by the operator.
    Draining,
    /// Not in the chain table (no table yet: fewer failure groups than `chain_replicas`).
    Unplaced,
}

/// One target's line of the chain report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetChains {
    pub target: TargetId,
    pub failure_group: String,
    pub health: MemberHealth,
    /// The highest incarnation heard (0: none).
    pub incarnation: u64,
    /// Chains listing the target, in any state.
    pub chains: u32,
    /// Of those, chains with fewer serving members than the table's replica count.
    pub degraded: u32,
}

/// Answers `ChainStatus`: the chain table as `flotilla status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainReport {
    /// The chain table's replica count (0: no table yet).
    pub replicas: u32,
    /// Distinct failure groups among the known targets.
    pub failure_groups: u32,
    pub chains_total: u32,
    /// Chains with fewer serving members than `replicas`.
    pub chains_degraded: u32,
    /// Chains with no serving member left reachable (their last serving member is down).
    pub chains_unavailable: u32,
    pub targets: Vec<TargetChains>,
    /// Every chain, when asked for (`ChainStatus { chains: true }`).
    pub chains: Vec<ChainInfo>,
    /// Chains with a member being copied (`Syncing`): a returning, replacement or drain
    /// target's resync is under way or waiting.
    pub chains_rebuilding: u32,
    /// The metadata service's estimate of the bytes still to copy: the sizes of the files
    /// on the rebuilding chains, each divided evenly over its subfiles (a chain's copy is
    /// whole, so its bytes count until its `SyncDone`).
    pub rebuild_bytes_left: u64,
}

/// What `TargetAdmin` does to a target (online, through the membership engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetAction {
    /// Move every chain off the target: each gets a replacement member in another failure
    /// group, copied whole; the target leaves a chain once the replacement serves.
    Drain,
    /// Declare the target dead now: it leaves every chain at once and each gets a
    /// replacement. Refused where the target holds a chain's last serving copy.
    Remove,
}

impl std::fmt::Display for TargetAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TargetAction::Drain => "drain",
            TargetAction::Remove => "remove",
        })
    }
}

/// Replication's data path (issue 32): one entry of a chain's order, sent by a member to
/// its successor (`IoRequest::Forward`, server credentials only). A write's bytes
/// (`length_bytes` of them) travel in the frame's data section, so the request is bounded by
/// `request_bytes_max` and the connection's credit like a client write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainForward {
    pub chain: u32,
    /// The sender's chain version: the receiver applies only under exactly its own.
    pub version: u64,
    /// The entry's place in the chain's one order (given by the head, from 1).
    pub position: u64,
    pub entry: ForwardEntry,
}

/// What a forwarded entry does on the receiving member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForwardEntry {
    /// Writes the data section at `offset` of `fork` (created on demand, as a client write).
    Write { fork: crate::ForkRef, offset: u64, length_bytes: u64 },
    /// Makes everything applied before it durable (`fork` names the subfile synced).
    Sync { fork: crate::ForkRef },
    /// Any change a chained client request makes (`IoRequest::Chained`'s inner request: a
    /// write of any shape, truncate, extend, sync, subfile or fork creation and removal),
    /// with the target rewritten to the receiver's member of the chain (each member keeps
    /// the subfile under its own target). A write's bytes are in the data section.
    Request { request: Box<crate::IoRequest> },
    /// Resync (issue 32): one step of the copy the last serving member makes to the syncing
    /// member after it (a change request, retargeted to the receiver), applied outside the
    /// order: `ChainForward::position` is the source's position the copy is taken at. Only
    /// a `Syncing` member takes it.
    Copy { request: Box<crate::IoRequest> },
    /// Resync: the copy taken at `ChainForward::position` is complete; the receiver (its
    /// member `target`, `Syncing`) continues the order from that position. Every copied
    /// fork was synced by a `Copy` of a `Sync` before it.
    CopyDone { target: flotilla_types::TargetId },
    /// Resync: `[offset, offset + length_bytes)` of `fork` (the receiver's member) is a range
    /// the copy source applied and has not seen settled by a sync every member made; the
    /// syncing receiver counts it unsettled in the log `CopyDone` starts, as if it had
    /// applied it itself, so that a resync record it later starts covers what another
    /// member may have lost unsynced. Sent before `CopyDone`; changes no byte.
    Unsettled { fork: crate::ForkRef, offset: u64, length_bytes: u64 },
}

impl ChainForward {
    /// Data bytes the request carries.
    pub fn data_bytes(&self) -> u64 {
        match &self.entry {
            ForwardEntry::Write { length_bytes, .. } => *length_bytes,
            ForwardEntry::Sync { .. } => 0,
            // An invalid shape carries nothing here; the receiver refuses the request.
            ForwardEntry::Request { request } | ForwardEntry::Copy { request } => {
                request.data_bytes().unwrap_or(0)
            }
            ForwardEntry::CopyDone { .. } | ForwardEntry::Unsettled { .. } => 0,
        }
    }

    /// The target (the receiver's member of the chain) the entry is applied to, if the
    /// entry names one (a request that names no target is refused by the receiver).
    pub fn target(&self) -> Option<flotilla_types::TargetId> {
        match &self.entry {
            ForwardEntry::Write { fork, .. }
            | ForwardEntry::Sync { fork }
            | ForwardEntry::Unsettled { fork, .. } => Some(fork.target),
            ForwardEntry::Request { request } | ForwardEntry::Copy { request } => request.target(),
            ForwardEntry::CopyDone { target } => Some(*target),
        }
    }
}

/// The answer to an applied (or duplicate) forward: the receiver's last applied position
/// and its cumulative acknowledgement (every member from it to the tail applied every
/// position up to `acknowledged`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardAck {
    pub chain: u32,
    pub version: u64,
    pub applied: u64,
    pub acknowledged: u64,
}

/// Why a member refused a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForwardRefusalReason {
    /// The receiver's lease ran out: it serves nothing until a heartbeat reply renews it.
    NoLease,
    /// The receiver is not a member of the chain (or not in its write path), as far as its
    /// chain view goes.
    NotMember,
    /// The forward's version is not the receiver's `current` (older: the sender refetches;
    /// newer: the receiver has not heard of it yet).
    Stale { current: u64 },
    /// The position is beyond the next one (`expected`): dropped, retransmit from `expected`.
    Gap { expected: u64 },
    /// A chained change reached a member that is not the chain's head (`head`, when the
    /// receiver's view names one): the client refetches the chain and sends it there.
    NotHead { head: Option<TargetId> },
    /// A chained read reached a member that is not serving (syncing, offline or dead in the
    /// receiver's view): nothing it holds is read before it has caught up.
    NotReadable,
}

/// A typed refusal of a forward, naming the chain and version it came with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardRefused {
    pub chain: u32,
    pub version: u64,
    pub reason: ForwardRefusalReason,
}

impl std::fmt::Display for ForwardRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (chain, version) = (self.chain, self.version);
        match self.reason {
            ForwardRefusalReason::NoLease => {
                write!(f, "forward for chain {chain} v{version} refused: this server's lease ran out")
            }
            ForwardRefusalReason::NotMember => write!(
                f,
                "forward for chain {chain} v{version} refused: this target is not in that chain's write path"
            ),
            ForwardRefusalReason::Stale { current } => write!(
                f,
                "forward for chain {chain} v{version} refused: this server holds chain {chain} at v{current}"
            ),
            ForwardRefusalReason::Gap { expected } => write!(
                f,
                "forward for chain {chain} v{version} refused: a gap, position {expected} is the next to apply"
            ),
            ForwardRefusalReason::NotHead { head: Some(head) } => write!(
                f,
                "request for chain {chain} v{version} refused: this target is not the chain's head ({head} is)"
            ),
            ForwardRefusalReason::NotHead { head: None } => write!(
                f,
                "request for chain {chain} v{version} refused: this target is not the chain's head"
            ),
            ForwardRefusalReason::NotReadable => write!(
                f,
                "read for chain {chain} v{version} refused: this replica is not serving (it has not caught up)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{encode_body, MetaReply, MetaRequest};

    /// The variant indexes `docs/protocol.md` gives.
    #[test]
    fn variant_indexes_are_the_documented_ones() {
        let member = super::MemberInfo { failure_group: "a".into(), incarnation: 1 };
        let register = MetaRequest::RegisterMember { server: String::new(), targets: Vec::new(), member };
        assert_eq!(encode_body(&register).unwrap()[0], 54);
        assert_eq!(encode_body(&MetaRequest::ChainStatus { chains: true }).unwrap()[0], 56);
        let chains = MetaReply::Chains(super::ChainReport::default());
        assert_eq!(encode_body(&chains).unwrap()[0], 20);
        assert_eq!(crate::ErrorCode::Unsupported.errno(), 95);
        let reclaim = MetaRequest::ReclaimLocks { session: 1, locks: Vec::new() };
        assert_eq!(encode_body(&reclaim).unwrap()[0], 58);
        assert_eq!(encode_body(&MetaRequest::GetChains { chains: vec![3] }).unwrap()[0], 61);
        assert_eq!(encode_body(&MetaReply::SubfileChains(Vec::new())).unwrap()[0], 23);
        let codes = [crate::ErrorCode::Unsupported, crate::ErrorCode::Recovering, crate::ErrorCode::LockLost];
        let indexes: Vec<u8> = codes.iter().map(|c| encode_body(c).unwrap()[0]).collect();
        assert_eq!(indexes, [16, 17, 18]);
        assert_eq!(encode_body(&MetaRequest::OpenGroupSession).unwrap()[0], 59);
        let sequenced = MetaRequest::Sequenced {
            session: 7,
            sequence: 2,
            acknowledged_through: 1,
            request: Box::new(MetaRequest::Status),
        };
        assert_eq!(encode_body(&sequenced).unwrap(), [60, 7, 2, 1, 10]);
        assert_eq!(encode_body(&MetaReply::GroupSession { session: 7 }).unwrap(), [22, 7]);
        assert_eq!(encode_body(&crate::ErrorCode::SessionExpired).unwrap()[0], 19);
    }

    /// `Forward` is I/O request 20; `Forwarded` and `ForwardRefused` are I/O replies 11, 12.
    #[test]
    fn forward_indexes_are_the_documented_ones() {
        use super::*;
        use crate::{ForkRef, IoReply, IoRequest};
        use flotilla_types::{FileId, SubfileIndex};
        let fork =
            ForkRef { target: TargetId(1), file: FileId(2), subfile: SubfileIndex(0), fork: "data".into() };
        let forward = ChainForward { chain: 1, version: 2, position: 3, entry: ForwardEntry::Sync { fork } };
        assert_eq!(encode_body(&IoRequest::Forward { forward }).unwrap()[0], 20);
        let ack = ForwardAck { chain: 1, version: 2, applied: 3, acknowledged: 3 };
        assert_eq!(encode_body(&IoReply::Forwarded(ack)).unwrap()[0], 11);
        let refused =
            ForwardRefused { chain: 1, version: 2, reason: ForwardRefusalReason::Stale { current: 3 } };
        assert_eq!(encode_body(&IoReply::ForwardRefused(refused)).unwrap()[0], 12);
        assert_eq!(refused.to_string(), "forward for chain 1 v2 refused: this server holds chain 1 at v3");
        let fork =
            ForkRef { target: TargetId(1), file: FileId(2), subfile: SubfileIndex(0), fork: "data".into() };
        let request = Box::new(IoRequest::Sync { fork });
        let entry = ForwardEntry::Request { request };
        assert_eq!(encode_body(&entry).unwrap()[0], 2);
        let chained = IoRequest::Chained { chain: 1, version: 2, request: Box::new(IoRequest::Stats) };
        assert_eq!(encode_body(&chained).unwrap()[0], 21);
        let not_head = ForwardRefusalReason::NotHead { head: None };
        assert_eq!(encode_body(&not_head).unwrap()[0], 4);
        assert_eq!(encode_body(&ForwardRefusalReason::NotReadable).unwrap()[0], 5);
        let copy = ForwardEntry::Copy { request: Box::new(IoRequest::Stats) };
        assert_eq!(encode_body(&copy).unwrap()[0], 3);
        assert_eq!(encode_body(&ForwardEntry::CopyDone { target: TargetId(1) }).unwrap()[0], 4);
        let fork =
            ForkRef { target: TargetId(1), file: FileId(2), subfile: SubfileIndex(0), fork: "data".into() };
        let unsettled = ForwardEntry::Unsettled { fork, offset: 0, length_bytes: 1 };
        assert_eq!(encode_body(&unsettled).unwrap()[0], 5);
    }

    /// Resync: `ChainSubfiles` and `SyncDone` are metadata requests 62, 63; the
    /// `ChainSubfiles` reply is metadata reply 24.
    #[test]
    fn resync_indexes_are_the_documented_ones() {
        let list = MetaRequest::ChainSubfiles { chain: 1, after: 0, scan_max: 10 };
        assert_eq!(encode_body(&list).unwrap()[0], 62);
        let done = MetaRequest::SyncDone { chain: 1, target: flotilla_types::TargetId(2), version: 3 };
        assert_eq!(encode_body(&done).unwrap()[0], 63);
        let page = MetaReply::ChainSubfiles { subfiles: vec![(1, 0)], next: None };
        assert_eq!(encode_body(&page).unwrap()[0], 24);
    }

    /// Drain and remove: `TargetAdmin` is metadata request 64 (answered `Done`).
    #[test]
    fn target_admin_index_is_the_documented_one() {
        let target = flotilla_types::TargetId(2);
        let drain = MetaRequest::TargetAdmin { target, action: super::TargetAction::Drain };
        assert_eq!(encode_body(&drain).unwrap()[..2], [64, 2]);
        let remove = MetaRequest::TargetAdmin { target, action: super::TargetAction::Remove };
        assert_eq!(encode_body(&remove).unwrap().last(), Some(&1));
    }

    /// ENWRICH job reclaim (issue 33): request 66. Its fields in order.
    #[test]
    fn job_reclaim_index_is_the_documented_one() {
        let known =
            crate::JobEvent { flush_asked: Some(2), durable_asked: None, clock: 9, left: vec![(1, 3)] };
        let reclaim = MetaRequest::JobReclaim { name: "j".into(), size: 2, member: 1, epoch: 3, known };
        let body = encode_body(&reclaim).unwrap();
        assert_eq!(body[0], 66, "JobReclaim encodes as {}", body[0]);
        assert_eq!(body[1..], [1, b'j', 2, 1, 3, 1, 2, 0, 9, 1, 1, 3]);
    }

    /// Metadata under inode tokens through the mount (issue 34): requests 67 and 68,
    /// reply 26; a `ChangedBy` body's second byte is the carried request's variant (the
    /// service counts it as that kind).
    #[test]
    fn inode_cached_and_changed_by_indexes_are_the_documented_ones() {
        let ask = crate::InodeAsk::Lookup { parent: 1, name: b"a".to_vec() };
        let cached = MetaRequest::InodeCached { session: 5, ask };
        assert_eq!(encode_body(&cached).unwrap(), [67, 5, 0, 1, 1, b'a']);
        let attr = MetaRequest::InodeCached { session: 5, ask: crate::InodeAsk::Attr { id: 2 } };
        assert_eq!(encode_body(&attr).unwrap(), [67, 5, 1, 2]);
        let unlink = MetaRequest::UnlinkAt { parent: 1, name: b"a".to_vec(), id: None };
        let changed = MetaRequest::ChangedBy { request: Box::new(unlink), session: 7 };
        let body = encode_body(&changed).unwrap();
        assert_eq!((body[0], body[1], body.last()), (68, 28, Some(&7)));
        let none = MetaReply::NoEntry { grants: Vec::new() };
        assert_eq!(encode_body(&none).unwrap(), [26, 0]);
    }

    /// The metadata group's membership (issue 33): request 65, reply 25.
    #[test]
    fn group_membership_indexes_are_the_documented_ones() {
        use crate::{GroupMembershipRequest, GroupStatus};
        let add = MetaRequest::GroupMembership(GroupMembershipRequest::Remove { node_id: 4 });
        assert_eq!(encode_body(&add).unwrap()[0], 65);
        let status = GroupStatus {
            node_id: 1,
            role: "leader".into(),
            leader: Some(1),
            term: 2,
            applied_index: Some(3),
            last_log_index: Some(3),
            snapshot_index: None,
            purged_index: None,
            members: Vec::new(),
        };
        assert_eq!(encode_body(&MetaReply::GroupStatus(status)).unwrap()[0], 25);
    }
}
