//! A group of nodes in one process over the in-process network, each with real redb files in
//! its own temporary directory. Tests are written as commented phases.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_metagroup::kv::{decode_outcomes, encode_op, KvOp, KvOutcome, KvStateMachine};
use flotilla_metagroup::local_network::{Faults, LocalNetwork};
use flotilla_metagroup::{
    raft_config, Batch, Change, GroupError, GroupLimits, GroupNode, GroupTiming, NodeId, ReplyLimits,
};
use openraft::{BasicNode, Config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

const KEY: &[u8] = b"items";
const WAIT: Duration = Duration::from_secs(30);
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(3);

struct Cluster {
    network: Arc<LocalNetwork>,
    dirs: BTreeMap<NodeId, TempDir>,
    nodes: BTreeMap<NodeId, GroupNode<KvStateMachine>>,
    config: Arc<Config>,
    limits: GroupLimits,
    /// The exactly-once session `push_items` uses (0: not opened yet) and its last sequence.
    session_id: AtomicU64,
    sequence: AtomicU64,
    /// The highest log index acknowledged to a proposer.
    acknowledged_index: AtomicU64,
}

fn timing() -> GroupTiming {
    GroupTiming {
        heartbeat_ms: 50,
        election_timeout_ms_min: 300,
        election_timeout_ms_max: 600,
        snapshot_every_entries: 1_000,
        log_kept_behind_snapshot_entries: 100,
    }
}

fn node(id: NodeId) -> BasicNode {
    BasicNode { addr: format!("node-{id}") }
}

impl Cluster {
    async fn new(ids: &[NodeId], timing: GroupTiming, seed: u64) -> Cluster {
        let limits = GroupLimits { snapshot_chunk_bytes: 256, ..GroupLimits::default() };
        let config = raft_config(&timing, &limits).unwrap();
        let mut cluster = Cluster {
            network: Arc::new(LocalNetwork::new(seed)),
            dirs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            config,
            limits,
            session_id: AtomicU64::new(0),
            sequence: AtomicU64::new(0),
            acknowledged_index: AtomicU64::new(0),
        };
        for id in ids {
            cluster.start(*id).await;
        }
        cluster
    }

    fn dir(&mut self, id: NodeId) -> PathBuf {
        self.dirs.entry(id).or_insert_with(|| tempfile::tempdir().unwrap()).path().to_path_buf()
    }

    /// Starts (or restarts) `id` from its files; retries while the last run's files close.
    async fn start(&mut self, id: NodeId) {
        let dir = self.dir(id);
        let deadline = Instant::now() + WAIT;
        let node = loop {
            let error = match KvStateMachine::open(
                &dir.join("state.redb"),
                ReplyLimits::default(),
                self.limits.record_bytes_max,
            ) {
                Ok(state) => {
                    let started = GroupNode::start(
                        id,
                        &dir,
                        state,
                        self.network.clone(),
                        self.config.clone(),
                        self.limits.clone(),
                    )
                    .await;
                    match started {
                        Ok(node) => break node,
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            };
            assert!(Instant::now() < deadline, "node {id} does not start: {error}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.network.attach(id, node.raft.clone());
        self.nodes.insert(id, node);
    }

    /// Stops `id` as a crash would: its Raft is dropped, only its files remain.
    async fn kill(&mut self, id: NodeId) {
        self.network.detach(id);
        if let Some(node) = self.nodes.remove(&id) {
            node.stop().await;
        }
    }

    /// Kills `id` and deletes its files.
    async fn wipe(&mut self, id: NodeId) {
        self.kill(id).await;
        self.dirs.remove(&id);
    }

    async fn initialize(&self, ids: &[NodeId]) {
        let members: BTreeMap<NodeId, BasicNode> = ids.iter().map(|id| (*id, node(*id))).collect();
        self.nodes[&ids[0]].raft.initialize(members).await.unwrap();
    }

    /// The leader as seen by a live node that is itself live and leading.
    async fn leader(&self) -> NodeId {
        let deadline = Instant::now() + WAIT;
        loop {
            for node in self.nodes.values() {
                let metrics = node.raft.metrics().borrow().clone();
                if metrics.current_leader == Some(node.id) && metrics.state.is_leader() {
                    return node.id;
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Proposes `batch` at the leader until it is acknowledged (or `patience` passes).
    async fn propose(&self, batch: Batch, patience: Duration) -> Option<Vec<KvOutcome>> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            let Some(id) = self.any_leader() else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            match tokio::time::timeout(PROPOSE_TIMEOUT, self.nodes[&id].propose(batch.clone())).await {
                Ok(Ok(committed)) => {
                    self.acknowledged_index.fetch_max(committed.index, Ordering::Relaxed);
                    return Some(decode_outcomes(&committed.reply).unwrap());
                }
                Ok(Err(GroupError::NotLeader { .. })) | Ok(Err(GroupError::Raft(_))) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(Err(e)) => panic!("proposal refused: {e}"),
            }
        }
        None
    }

    fn any_leader(&self) -> Option<NodeId> {
        self.nodes.values().find(|n| n.raft.metrics().borrow().state.is_leader()).map(|n| n.id)
    }

    /// Pushes `items` in one batch through an exactly-once session, so retries never double them.
    async fn push_items(&self, items: &[u64]) {
        if self.session_id.load(Ordering::Relaxed) == 0 {
            let open = Batch::new(now_ms(), vec![plain(KvOp::OpenSession)]);
            let outcomes = self.propose(open, WAIT).await.expect("session opened");
            let KvOutcome::Applied(id) = outcomes[0] else { panic!("open session: {outcomes:?}") };
            self.session_id.store(id, Ordering::Relaxed);
        }
        let session_id = self.session_id.load(Ordering::Relaxed);
        let acknowledged_through = self.sequence.load(Ordering::Relaxed);
        let changes = items
            .iter()
            .map(|item| {
                let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
                let body = encode_op(&KvOp::Push { key: KEY.to_vec(), item: *item });
                Change { session_id, sequence, acknowledged_through, body }
            })
            .collect();
        let outcomes = self.propose(Batch::new(now_ms(), changes), WAIT).await.expect("push acknowledged");
        let ok = outcomes.iter().all(|o| matches!(o, KvOutcome::Applied(_) | KvOutcome::Replayed(_)));
        assert!(ok, "{outcomes:?}");
    }

    /// Waits until every node in `ids` has applied through the highest index acknowledged.
    async fn converge(&self, ids: &[NodeId]) {
        let index = self.acknowledged_index.load(Ordering::Relaxed);
        for id in ids {
            self.nodes[id]
                .raft
                .wait(Some(WAIT))
                .applied_index_at_least(Some(index), "converge")
                .await
                .unwrap_or_else(|e| panic!("node {id} did not reach {index}: {e}"));
        }
    }

    fn list(&self, id: NodeId) -> Vec<u64> {
        self.nodes[&id].state.with_state(|s| s.list(KEY)).unwrap()
    }
}

fn plain(op: KvOp) -> Change {
    Change { session_id: 0, sequence: 0, acknowledged_through: 0, body: encode_op(&op) }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_and_replicate_batches() {
    // Phase: three nodes start from empty files and form a group.
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 1).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.leader().await;
    // Phase: batches of several changes each (group commit) are acknowledged.
    let mut expected = Vec::new();
    for batch in 0..10u64 {
        let items: Vec<u64> = (0..5).map(|i| batch * 5 + i).collect();
        cluster.push_items(&items).await;
        expected.extend(items);
    }
    // Phase: every node applied all of them, in the same order.
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), expected, "node {id}");
    }
    for id in [1, 2, 3] {
        cluster.kill(id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_everything_acknowledged_survives() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 2).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[1, 2, 3]).await;
    // Phase: the leader dies; the other two elect a new one and go on.
    let old = cluster.leader().await;
    cluster.kill(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    cluster.push_items(&[4, 5, 6]).await;
    // Phase: the old leader restarts from its files and catches up.
    cluster.start(old).await;
    cluster.push_items(&[7]).await;
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), vec![1, 2, 3, 4, 5, 6, 7], "node {id}");
    }
    for id in [1, 2, 3] {
        cluster.kill(id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_acknowledges_nothing() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 3).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[1]).await;
    // Phase: the leader is cut off from the other two.
    let old = cluster.leader().await;
    cluster.network.partition(&[old], &[1, 2, 3]);
    // Phase: the old leader acknowledges nothing in twice the election timeout.
    let batch = Batch::new(now_ms(), vec![plain(KvOp::Push { key: KEY.to_vec(), item: 99 })]);
    let minority =
        tokio::time::timeout(Duration::from_millis(1_500), cluster.nodes[&old].propose(batch)).await;
    assert!(!matches!(minority, Ok(Ok(_))), "the minority acknowledged a change: {minority:?}");
    // Phase: the majority elects among itself and serves.
    let deadline = Instant::now() + WAIT;
    let new = loop {
        let found =
            cluster.nodes.values().find(|n| n.id != old && n.raft.metrics().borrow().state.is_leader());
        if let Some(n) = found {
            break n.id;
        }
        assert!(Instant::now() < deadline, "majority elected no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let batch = Batch::new(now_ms(), vec![plain(KvOp::Push { key: KEY.to_vec(), item: 2 })]);
    let committed = cluster.nodes[&new].propose(batch).await.unwrap();
    cluster.acknowledged_index.fetch_max(committed.index, Ordering::Relaxed);
    // Phase: the link returns; the old leader follows and holds exactly what was acknowledged.
    cluster.network.heal();
    cluster.push_items(&[3]).await;
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), vec![1, 2, 3], "node {id}");
    }
    for id in [1, 2, 3] {
        cluster.kill(id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_catches_up_by_snapshot() {
    let snapshots =
        GroupTiming { snapshot_every_entries: 10, log_kept_behind_snapshot_entries: 0, ..timing() };
    let mut cluster = Cluster::new(&[1, 2, 3], snapshots, 4).await;
    cluster.initialize(&[1, 2, 3]).await;
    let leader = cluster.leader().await;
    let wiped = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    // Phase: enough batches that the leader snapshots and purges its log.
    let mut expected = Vec::new();
    for i in 0..40u64 {
        cluster.push_items(&[i]).await;
        expected.push(i);
    }
    let deadline = Instant::now() + WAIT;
    while cluster.nodes[&leader].raft.metrics().borrow().purged.is_none() {
        assert!(Instant::now() < deadline, "the leader never purged its log");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Phase: a follower loses its files. It also lost its vote, so it must not rejoin as the
    // voter it was (it could vote twice in a term): it is removed, starts empty, joins as a
    // learner (only a snapshot can bring it back: the log is purged) and becomes a voter again.
    cluster.wipe(wiped).await;
    let survivors: BTreeSet<NodeId> = [1, 2, 3].into_iter().filter(|id| *id != wiped).collect();
    cluster.nodes[&cluster.leader().await].raft.change_membership(survivors, false).await.unwrap();
    cluster.start(wiped).await;
    cluster.nodes[&cluster.leader().await].raft.add_learner(wiped, node(wiped), true).await.unwrap();
    let all: BTreeSet<NodeId> = [1, 2, 3].into();
    cluster.nodes[&cluster.leader().await].raft.change_membership(all, false).await.unwrap();
    cluster.push_items(&[100]).await;
    expected.push(100);
    cluster.converge(&[1, 2, 3]).await;
    assert_eq!(cluster.list(wiped), expected);
    let snapshot = cluster.nodes[&wiped].raft.metrics().borrow().snapshot;
    assert!(snapshot.is_some(), "the wiped node caught up without a snapshot");
    for id in [1, 2, 3] {
        cluster.kill(id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_grows_to_five_and_shrinks_to_three_online() {
    let mut cluster = Cluster::new(&[1, 2, 3, 4, 5], timing(), 5).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[1]).await;
    // Phase: 4 and 5 join as learners, then become voters.
    let leader = cluster.leader().await;
    for id in [4, 5] {
        cluster.nodes[&leader].raft.add_learner(id, node(id), true).await.unwrap();
    }
    let five: BTreeSet<NodeId> = [1, 2, 3, 4, 5].into();
    cluster.nodes[&leader].raft.change_membership(five, false).await.unwrap();
    cluster.push_items(&[2]).await;
    cluster.converge(&[1, 2, 3, 4, 5]).await;
    for id in [1, 2, 3, 4, 5] {
        assert_eq!(cluster.list(id), vec![1, 2], "node {id}");
    }
    // Phase: back to three; the group serves throughout.
    let leader = cluster.leader().await;
    let three: BTreeSet<NodeId> = [1, 2, 3].into();
    cluster.nodes[&leader].raft.change_membership(three.clone(), false).await.unwrap();
    cluster.push_items(&[3]).await;
    cluster.converge(&[1, 2, 3]).await;
    let leader = cluster.leader().await;
    let voters: BTreeSet<NodeId> =
        cluster.nodes[&leader].raft.metrics().borrow().membership_config.membership().voter_ids().collect();
    assert_eq!(voters, three);
    // Phase: with 4 and 5 gone, the three still form a quorum.
    cluster.kill(4).await;
    cluster.kill(5).await;
    cluster.push_items(&[4]).await;
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), vec![1, 2, 3, 4], "node {id}");
    }
    for id in [1, 2, 3] {
        cluster.kill(id).await;
    }
}

/// One client with an exactly-once session, pushing items one at a time and retrying each
/// until it is acknowledged, while the schedule crashes nodes, cuts links and loses messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_faults_keep_every_acknowledged_batch_applied_once_in_order() {
    let seed =
        std::env::var("FLOTILLA_METAGROUP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(now_ms);
    eprintln!("FLOTILLA_METAGROUP_SEED={seed} (set it to repeat this fault schedule)");
    let run_for = Duration::from_secs(
        std::env::var("FLOTILLA_METAGROUP_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12),
    );
    let ids = [1, 2, 3];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = Cluster::new(&ids, GroupTiming { snapshot_every_entries: 20, ..timing() }, seed).await;
    cluster.initialize(&ids).await;
    // Phase: open a session.
    let open = Batch::new(now_ms(), vec![plain(KvOp::OpenSession)]);
    let session_id = match cluster.propose(open, WAIT).await.expect("session opened")[0] {
        KvOutcome::Applied(id) => id,
        ref other => panic!("open session: {other:?}"),
    };
    // Phase: faults and pushes until the time is up.
    cluster.network.set_faults(Faults { loss_per_mille: 50, delay_ms_max: 10 });
    let started = Instant::now();
    let (mut acknowledged, mut sent, mut down, mut cut) = (Vec::new(), 0u64, None::<NodeId>, false);
    let mut replayed = 0usize;
    while started.elapsed() < run_for {
        match rng.random_range(0..10) {
            0 if down.is_none() => {
                let id = ids[rng.random_range(0..3)];
                cluster.kill(id).await;
                down = Some(id);
            }
            1 => {
                if let Some(id) = down.take() {
                    cluster.start(id).await;
                }
            }
            2 if !cut => {
                cluster.network.partition(&[ids[rng.random_range(0..3)]], &ids);
                cut = true;
            }
            3 => {
                cluster.network.heal();
                cut = false;
            }
            _ => {
                sent += 1;
                let change = Change {
                    session_id,
                    sequence: sent,
                    acknowledged_through: sent - 1,
                    body: encode_op(&KvOp::Push { key: KEY.to_vec(), item: sent }),
                };
                match cluster.propose(Batch::new(now_ms(), vec![change]), Duration::from_secs(4)).await {
                    Some(o) if matches!(o[0], KvOutcome::Applied(_) | KvOutcome::Replayed(_)) => {
                        replayed += usize::from(matches!(o[0], KvOutcome::Replayed(_)));
                        acknowledged.push(sent)
                    }
                    Some(o) => panic!("item {sent}: {o:?}"),
                    None => {
                        // Not acknowledged in time: heal everything and retry the same request
                        // until it is, so the next one never skips a sequence.
                        cluster.network.heal();
                        cut = false;
                        if let Some(id) = down.take() {
                            cluster.start(id).await;
                        }
                        let change = Change {
                            session_id,
                            sequence: sent,
                            acknowledged_through: sent - 1,
                            body: encode_op(&KvOp::Push { key: KEY.to_vec(), item: sent }),
                        };
                        let o = cluster
                            .propose(Batch::new(now_ms(), vec![change]), WAIT)
                            .await
                            .expect("retry acknowledged");
                        assert!(matches!(o[0], KvOutcome::Applied(_) | KvOutcome::Replayed(_)), "{o:?}");
                        replayed += usize::from(matches!(o[0], KvOutcome::Replayed(_)));
                        acknowledged.push(sent);
                    }
                }
            }
        }
    }
    // Phase: heal, restart, converge; every node holds every acknowledged item once, in order.
    cluster.network.set_faults(Faults::default());
    cluster.network.heal();
    if let Some(id) = down.take() {
        cluster.start(id).await;
    }
    cluster.push_items(&[u64::MAX]).await;
    acknowledged.push(u64::MAX);
    cluster.converge(&ids).await;
    eprintln!(
        "seed {seed}: {} items acknowledged, {replayed} answered by a replayed reply",
        acknowledged.len()
    );
    for id in ids {
        assert_eq!(cluster.list(id), acknowledged, "node {id} (seed {seed})");
    }
    for id in ids {
        cluster.kill(id).await;
    }
}
