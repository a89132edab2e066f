//! Changing the group's members online (`flotilla meta add|remove`), and what a node knows of
//! them (`flotilla meta status`).
//!
//! Adding a node is two steps on the leader: it becomes a learner (it receives the log, or a
//! snapshot if the entries it needs were compacted away, but does not vote), and once it
//! caught up, at most `catch_up_wait`, the voters are changed to include it (openraft's joint
//! consensus). Removing a node changes the voters to exclude it and drops it from the group.
//! The checks before either step ([`check_add`], [`check_remove`]) are plain logic.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};

use crate::group::GroupNode;
use crate::network::{group_address, member_address, meta_address};
use crate::state_machine::StateMachine;
use crate::types::NodeId;

/// One member as the membership records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// Clients' address (`None`: a member recorded with its group address only).
    pub meta_addr: Option<String>,
    pub group_addr: String,
    pub voter: bool,
    /// The last log index this member is known to hold: the leader's replication progress
    /// for the others, this node's applied index for itself; `None` if unknown here.
    pub log_index: Option<u64>,
}

/// What one node knows of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupView {
    /// The node that answered.
    pub me: NodeId,
    /// Its role: "leader", "follower", "candidate", "learner" or "shutdown".
    pub role: &'static str,
    pub leader: Option<NodeId>,
    pub term: u64,
    /// The index of the last entry applied to its state machine.
    pub applied_index: Option<u64>,
    /// The last entry of its log.
    pub last_log_index: Option<u64>,
    /// The last entry its latest snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Entries up to this index were compacted away from its log.
    pub purged_index: Option<u64>,
    pub members: Vec<Member>,
}

/// Why a membership change was refused or did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    #[error("node ids start at 1; 0 is not a node")]
    ZeroId,
    #[error("node {id} is not a member of the group (members: {members:?})")]
    UnknownNode { id: NodeId, members: Vec<NodeId> },
    #[error("node {id} is the group's last voter; a group cannot remove its last voter")]
    LastVoter { id: NodeId },
    #[error("address {address} is already used by node {by}")]
    AddressInUse { address: String, by: NodeId },
    #[error("node {id} is already a voter at {address}")]
    AlreadyVoter { id: NodeId, address: String },
    #[error("node {id} is a member at {recorded}, not {asked}; remove it first")]
    OtherAddress { id: NodeId, recorded: String, asked: String },
    #[error("node {id} did not catch up within {waited_ms} ms; it stays a learner (run add again)")]
    CatchUpTimeout { id: NodeId, waited_ms: u64 },
    #[error("this node is not the leader; the leader is {leader:?}")]
    NotLeader { leader: Option<NodeId> },
    #[error("the membership change failed: {0}")]
    Raft(String),
}

/// Refuses adding node `id` at (`meta_addr`, `group_addr`) when the group cannot take it:
/// id 0, a voter already, a member under other addresses, or an address another member uses.
/// `Ok(true)`: it is a learner already (the first step is done).
pub fn check_add(
    members: &[Member],
    id: NodeId,
    meta_addr: &str,
    group_addr: &str,
) -> Result<bool, MembershipError> {
    if id == 0 {
        return Err(MembershipError::ZeroId);
    }
    for member in members {
        let addresses = [member.meta_addr.as_deref(), Some(member.group_addr.as_str())];
        if member.id == id {
            let recorded = member_address(member.meta_addr.as_deref().unwrap_or("?"), &member.group_addr);
            if member.group_addr != group_addr || member.meta_addr.as_deref().is_some_and(|m| m != meta_addr)
            {
                let asked = member_address(meta_addr, group_addr);
                return Err(MembershipError::OtherAddress { id, recorded, asked });
            }
            if member.voter {
                return Err(MembershipError::AlreadyVoter { id, address: recorded });
            }
            continue;
        }
        for asked in [meta_addr, group_addr] {
            if addresses.contains(&Some(asked)) {
                return Err(MembershipError::AddressInUse { address: asked.to_string(), by: member.id });
            }
        }
    }
    Ok(members.iter().any(|m| m.id == id))
}

/// Refuses removing node `id` when it is not a member or is the last voter.
pub fn check_remove(members: &[Member], id: NodeId) -> Result<(), MembershipError> {
    let Some(member) = members.iter().find(|m| m.id == id) else {
        return Err(MembershipError::UnknownNode { id, members: members.iter().map(|m| m.id).collect() });
    };
    if member.voter && members.iter().filter(|m| m.voter).count() == 1 {
        return Err(MembershipError::LastVoter { id });
    }
    Ok(())
}

fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

impl<S: StateMachine> GroupNode<S> {
    /// What this node knows of the group (its own view; not confirmed by a quorum).
    pub fn view(&self) -> GroupView {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let progress: BTreeMap<NodeId, Option<u64>> = metrics
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, log)| (*id, log.map(|l| l.index))).collect())
            .unwrap_or_default();
        let applied_index = metrics.last_applied.map(|l| l.index);
        let members = membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                meta_addr: meta_address(&node.addr).map(str::to_string),
                group_addr: group_address(&node.addr).to_string(),
                voter: voters.contains(id),
                log_index: if *id == self.id { applied_index } else { progress.get(id).copied().flatten() },
            })
            .collect();
        GroupView {
            me: self.id,
            role: role(metrics.state),
            leader: metrics.current_leader,
            term: metrics.current_term,
            applied_index,
            last_log_index: metrics.last_log_index,
            snapshot_index: metrics.snapshot.map(|l| l.index),
            purged_index: metrics.purged.map(|l| l.index),
            members,
        }
    }

    /// Adds node `id` (leader only): a learner first, then, once it caught up (at most
    /// `catch_up_wait`), a voter.
    pub async fn add_member(
        &self,
        id: NodeId,
        meta_addr: &str,
        group_addr: &str,
        catch_up_wait: Duration,
    ) -> Result<(), MembershipError> {
        self.require_leader()?;
        let members = self.view().members;
        let learner = check_add(&members, id, meta_addr, group_addr)?;
        let node = BasicNode { addr: member_address(meta_addr, group_addr) };
        let waited_ms = catch_up_wait.as_millis() as u64;
        if !learner {
            tracing::info!(id, meta_addr, group_addr, "adding a learner to the metadata group");
        }
        // Blocking: returns once the leader sees the learner's log up to date (a learner
        // added before is caught up again, no new entry).
        match tokio::time::timeout(catch_up_wait, self.raft.add_learner(id, node, true)).await {
            Ok(result) => result.map_err(write_error)?,
            Err(_) => return Err(MembershipError::CatchUpTimeout { id, waited_ms }),
        };
        tracing::info!(id, "the learner caught up; making it a voter");
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        self.raft.change_membership(change, false).await.map_err(write_error)?;
        Ok(())
    }

    /// Removes node `id` (leader only) from the voters and the group.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.require_leader()?;
        let members = self.view().members;
        check_remove(&members, id)?;
        let member = members.iter().find(|m| m.id == id).is_some_and(|m| m.voter);
        let change = if member {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        tracing::info!(id, "removing a node from the metadata group");
        self.raft.change_membership(change, false).await.map_err(write_error)?;
        Ok(())
    }

    fn require_leader(&self) -> Result<(), MembershipError> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id) {
            return Ok(());
        }
        Err(MembershipError::NotLeader { leader: metrics.current_leader })
    }
}

fn write_error(error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MembershipError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            MembershipError::NotLeader { leader: f.leader_id }
        }
        other => MembershipError::Raft(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: NodeId, voter: bool) -> Member {
        Member {
            id,
            meta_addr: Some(format!("h:{}", 7000 + id * 10)),
            group_addr: format!("h:{}", 7001 + id * 10),
            voter,
            log_index: None,
        }
    }

    #[test]
    fn adding_is_refused_for_used_addresses_and_voters() {
        let members = vec![member(1, true), member(2, true)];
        assert_eq!(check_add(&members, 3, "h:7030", "h:7031"), Ok(false));
        assert_eq!(check_add(&members, 0, "h:1", "h:2"), Err(MembershipError::ZeroId));
        assert!(matches!(
            check_add(&members, 3, "h:7010", "h:9"),
            Err(MembershipError::AddressInUse { by: 1, .. })
        ));
        assert!(matches!(
            check_add(&members, 3, "h:9", "h:7021"),
            Err(MembershipError::AddressInUse { by: 2, .. })
        ));
        assert!(matches!(
            check_add(&members, 2, "h:7020", "h:7021"),
            Err(MembershipError::AlreadyVoter { id: 2, .. })
        ));
        assert!(matches!(
            check_add(&members, 2, "h:1", "h:2"),
            Err(MembershipError::OtherAddress { id: 2, .. })
        ));
        let with_learner = vec![member(1, true), member(3, false)];
        assert_eq!(check_add(&with_learner, 3, "h:7030", "h:7031"), Ok(true));
    }

    #[test]
    fn removing_is_refused_for_strangers_and_the_last_voter() {
        let members = vec![member(1, true), member(2, false)];
        assert!(matches!(check_remove(&members, 5), Err(MembershipError::UnknownNode { id: 5, .. })));
        assert_eq!(check_remove(&members, 1), Err(MembershipError::LastVoter { id: 1 }));
        assert_eq!(check_remove(&members, 2), Ok(()));
        assert_eq!(check_remove(&[member(1, true), member(2, true)], 1), Ok(()));
    }
}
