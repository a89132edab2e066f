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
        let codes = [crate::ErrorCode::Unsupported, crate::ErrorCode::Recovering, crate::ErrorCode::LockLost];
        let indexes: Vec<u8> = codes.iter().map(|c| encode_body(c).unwrap()[0]).collect();
        assert_eq!(indexes, [16, 17, 18]);
    }
}
