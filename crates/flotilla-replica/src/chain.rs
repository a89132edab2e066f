//! A chain: the ordered members holding one replicated subfile, and its version.
//!
//! Invariants kept here (checked by [`Chain::check`], asserted after every change):
//! - members are distinct targets, at most [`MEMBERS_PER_CHAIN_MAX`];
//! - at most one member is `Syncing` (resyncs of one chain run one at a time, so the copy
//!   source is always the last serving member, which is also the syncing member's
//!   predecessor: copies and new writes reach it through one ordered stream);
//! - the write path is every `Serving` member in list order, then the `Syncing` one.
//!
//! Failure groups are checked by the [`ChainTable`](crate::ChainTable), which knows them.

use crate::ids::{ChainId, ChainVersion};
use crate::member::{Member, MemberState};
use flotilla_types::TargetId;
use serde::{Deserialize, Serialize};

/// Most members one chain may list (replicas, plus one replacement while draining).
pub const MEMBERS_PER_CHAIN_MAX: usize = 8;

/// The members of one chain and its version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    id: ChainId,
    version: ChainVersion,
    members: Vec<Member>,
}

impl Chain {
    /// A new chain at version 1 with every member serving, in the order given.
    pub fn new(id: ChainId, targets: &[TargetId]) -> Chain {
        let members = targets.iter().map(|&target| Member { target, state: MemberState::Serving }).collect();
        let chain = Chain { id, version: ChainVersion::FIRST, members };
        chain.assert_valid();
        chain
    }

    /// A chain as received from the metadata service (or decoded), checked.
    pub fn from_parts(id: ChainId, version: ChainVersion, members: Vec<Member>) -> Option<Chain> {
        let chain = Chain { id, version, members };
        chain.check().then_some(chain)
    }

    pub fn id(&self) -> ChainId {
        self.id
    }

    pub fn version(&self) -> ChainVersion {
        self.version
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// `target`'s state, if it is a member.
    pub fn state_of(&self, target: TargetId) -> Option<MemberState> {
        self.members.iter().find(|m| m.target == target).map(|m| m.state)
    }

    /// Serving members in chain order: where reads may go.
    pub fn serving(&self) -> impl Iterator<Item = TargetId> + '_ {
        self.members.iter().filter(|m| m.state.readable()).map(|m| m.target)
    }

    pub fn serving_count(&self) -> usize {
        self.serving().count()
    }

    /// The member being synced, if any.
    pub fn syncing(&self) -> Option<Member> {
        self.members.iter().copied().find(|m| matches!(m.state, MemberState::Syncing { .. }))
    }

    /// Targets that receive writes, in the order writes travel: serving, then syncing.
    pub fn write_path(&self) -> Vec<TargetId> {
        let mut path: Vec<TargetId> = self.serving().collect();
        path.extend(self.syncing().map(|m| m.target));
        path
    }

    /// Where clients send writes.
    pub fn head(&self) -> Option<TargetId> {
        self.write_path().first().copied()
    }

    /// The member after `target` in the write path.
    pub fn successor(&self, target: TargetId) -> Option<TargetId> {
        let path = self.write_path();
        let at = path.iter().position(|&t| t == target)?;
        path.get(at + 1).copied()
    }

    /// The member before `target` in the write path.
    pub fn predecessor(&self, target: TargetId) -> Option<TargetId> {
        let path = self.write_path();
        let at = path.iter().position(|&t| t == target)?;
        at.checked_sub(1).map(|i| path[i])
    }

    /// Whether the invariants of this module hold.
    pub fn check(&self) -> bool {
        let mut targets: Vec<TargetId> = self.members.iter().map(|m| m.target).collect();
        targets.sort_unstable();
        targets.dedup();
        let distinct = targets.len() == self.members.len();
        let syncing = self.members.iter().filter(|m| matches!(m.state, MemberState::Syncing { .. })).count();
        distinct
            && !self.members.is_empty()
            && self.members.len() <= MEMBERS_PER_CHAIN_MAX
            && syncing <= 1
            && self.version >= ChainVersion::FIRST
    }

    fn assert_valid(&self) {
        assert!(self.check(), "chain invariants broken: {self:?}");
    }

    /// Sets `target`'s state; true if it changed. The caller bumps the version.
    pub(crate) fn set_state(&mut self, target: TargetId, state: MemberState) -> bool {
        let Some(member) = self.members.iter_mut().find(|m| m.target == target) else {
            return false;
        };
        let changed = member.state != state;
        member.state = state;
        changed
    }

    /// Moves `target` to the end of the list (a returning member rejoins at the tail).
    pub(crate) fn move_to_tail(&mut self, target: TargetId) {
        if let Some(at) = self.members.iter().position(|m| m.target == target) {
            let member = self.members.remove(at);
            self.members.push(member);
        }
    }

    /// Appends a new member in `state`.
    pub(crate) fn push(&mut self, member: Member) {
        assert!(self.state_of(member.target).is_none(), "{} is already in {}", member.target, self.id);
        self.members.push(member);
    }

    /// Removes `target` from the list.
    pub(crate) fn remove(&mut self, target: TargetId) {
        self.members.retain(|m| m.target != target);
    }

    /// Bumps the version after a change and checks the invariants.
    pub(crate) fn bump(&mut self) {
        self.version = self.version.next();
        self.assert_valid();
    }
}
