//! Starting a node of the group from its files, proposing batches, and linearizable reads.
//!
//! A node's directory holds `log.redb` (the log, vote, committed, purged) and whatever file the
//! state machine keeps. Reopening a node from the same directory is a restart: openraft reads
//! the vote and log, the state machine says where it stands, and the node rejoins.

use std::path::Path;
use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, SnapshotPolicy};

use crate::limits::GroupLimits;
use crate::log_store::{LogStoreError, RedbLogStore};
use crate::network::{GroupNetwork, Transport};
use crate::sm_store::StateMachineStore;
use crate::state_machine::{StateMachine, StateMachineError};
use crate::types::{Batch, BatchError, NodeId, Raft, Reply};

/// Timing of the group; every value is a setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupTiming {
    pub heartbeat_ms: u64,
    pub election_timeout_ms_min: u64,
    pub election_timeout_ms_max: u64,
    /// A snapshot is built after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind the last snapshot (for followers a little behind).
    pub log_kept_behind_snapshot_entries: u64,
}

impl Default for GroupTiming {
    fn default() -> Self {
        GroupTiming {
            heartbeat_ms: 100,
            election_timeout_ms_min: 500,
            election_timeout_ms_max: 1_000,
            snapshot_every_entries: 5_000,
            log_kept_behind_snapshot_entries: 1_000,
        }
    }
}

/// Why a node did not start, or a proposal or read did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    #[error("log store: {0}")]
    Log(#[from] LogStoreError),
    #[error("state machine: {0}")]
    StateMachine(#[from] StateMachineError),
    #[error("group configuration: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("batch refused: {0}")]
    Batch(#[from] BatchError),
    #[error("this node is not the leader; the leader is {leader:?} at {address:?}")]
    NotLeader { leader: Option<NodeId>, address: Option<String> },
}

/// Openraft's configuration from the group's timing and limits.
pub fn raft_config(timing: &GroupTiming, limits: &GroupLimits) -> Result<Arc<Config>, GroupError> {
    let config = Config {
        cluster_name: "flotilla-meta".into(),
        heartbeat_interval: timing.heartbeat_ms,
        election_timeout_min: timing.election_timeout_ms_min,
        election_timeout_max: timing.election_timeout_ms_max,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(timing.snapshot_every_entries),
        max_in_snapshot_log_to_keep: timing.log_kept_behind_snapshot_entries,
        snapshot_max_chunk_size: limits.snapshot_chunk_bytes,
        max_payload_entries: limits.log_read_entries_max,
        ..Config::default()
    };
    config.validate().map(Arc::new).map_err(|e| GroupError::Config(e.to_string()))
}

/// A batch the group acknowledged: its log index and the state machine's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub index: u64,
    pub reply: Reply,
}

/// A started node: its Raft handle and its state machine.
pub struct GroupNode<S: StateMachine> {
    pub id: NodeId,
    pub raft: Raft,
    pub state: StateMachineStore<S>,
    limits: GroupLimits,
}

impl<S: StateMachine> GroupNode<S> {
    /// Starts node `id` from `dir`/log.redb and `state`.
    pub async fn start<T: Transport>(
        id: NodeId,
        dir: &Path,
        state: S,
        transport: Arc<T>,
        config: Arc<Config>,
        limits: GroupLimits,
    ) -> Result<Self, GroupError> {
        let timing =
            GroupTiming { election_timeout_ms_max: config.election_timeout_max, ..GroupTiming::default() };
        let log = RedbLogStore::open(&dir.join("log.redb"), limits.clone())?;
        let state = StateMachineStore::new(state, limits.clone())?;
        let network = GroupNetwork::new(transport, id);
        let raft = Raft::new(id, config, network, log, state.clone())
            .await
            .map_err(|e| GroupError::Raft(e.to_string()))?;
        tokio::spawn(Self::keep_electing(raft.clone(), id, timing));
        Ok(GroupNode { id, raft, state, limits })
    }

    /// Proposes a batch; returns its reply once a majority holds it durably and it is applied
    /// here.
    pub async fn propose(&self, batch: Batch) -> Result<Committed, GroupError> {
        batch.check(&self.limits)?;
        match self.raft.client_write(batch).await {
            Ok(response) => Ok(Committed { index: response.log_id.index, reply: response.data }),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(GroupError::NotLeader { leader: f.leader_id, address: f.leader_node.map(|n| n.addr) })
            }
            Err(e) => Err(GroupError::Raft(e.to_string())),
        }
    }

    /// Waits until this node, as the leader confirmed by a quorum (read index), has applied
    /// everything committed before the call; a read of the state after this is linearizable.
    pub async fn read_barrier(&self) -> Result<(), GroupError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(GroupError::NotLeader { leader: f.leader_id, address: f.leader_node.map(|n| n.addr) })
            }
            Err(e) => Err(GroupError::Raft(e.to_string())),
        }
    }

    /// Keeps an election going on a voter that has known no leader for too long (spawn it
    /// once per node).
    ///
    /// Openraft elects on its election tick, but skips the tick while a campaign of its own
    /// is in progress; a campaign whose own vote response was dropped (the vote changed
    /// between saving it and hearing back, as under heavy load) would then never end, and
    /// the node answers `NotLeader` with no leader forever (seen with a group of one, and
    /// with the two survivors of a group of three after its leader was killed). This watch
    /// starts a fresh campaign (a higher term) whenever this voter has known no leader for
    /// twice `election_timeout_ms_max` (once for a group of one, which needs nobody's
    /// vote); openraft ignores the trigger on a node that leads.
    pub async fn keep_electing(raft: Raft, id: NodeId, timing: GroupTiming) {
        let period = std::time::Duration::from_millis(timing.election_timeout_ms_max.max(1));
        let mut not_leading_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(period / 2).await;
            let (alone, voter, leaderless) = {
                let metrics = raft.metrics();
                let metrics = metrics.borrow();
                if metrics.running_state.is_err() || metrics.state == openraft::ServerState::Shutdown {
                    return;
                }
                let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
                let leading = metrics.state.is_leader() && metrics.current_leader == Some(id);
                let leaderless = if voters == [id] { !leading } else { metrics.current_leader.is_none() };
                (voters == [id], voters.contains(&id), leaderless)
            };
            if !voter || !leaderless {
                not_leading_since = None;
                continue;
            }
            let wait = if alone { period } else { period * 2 };
            let since = *not_leading_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= wait {
                tracing::warn!(node = id, "this voter has known no leader for {wait:?}; campaigning again");
                if raft.trigger().elect().await.is_err() {
                    return;
                }
                not_leading_since = None;
            }
        }
    }

    /// Stops the node (its files stay; start again from them to restart it).
    pub async fn stop(self) {
        let _ = self.raft.shutdown().await;
    }
}
