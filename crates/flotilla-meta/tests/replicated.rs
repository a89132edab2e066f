//! The namespace as the metadata group's state machine: three nodes in one process over the
//! in-process network, each a `NamespaceMachine` over a real redb file in its own temporary
//! directory. Tests are written as commented phases.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_meta::replicated::{
    Applied, BatchReply, MachineLimits, NamespaceChange, NamespaceMachine, NewOwner, Op, OpenHint, Outcome,
    Place, RenameMode,
};
use flotilla_metagroup::local_network::LocalNetwork;
use flotilla_metagroup::{
    raft_config, AppliedMark, Batch, Change, GroupError, GroupLimits, GroupNode, GroupTiming, NodeId,
    ReplyTable, StateMachine,
};
use flotilla_namespace::NamespaceImage;
use flotilla_types::{Caller, Layout, SetAttr, TargetId};
use openraft::{BasicNode, CommittedLeaderId, Config, LogId};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(20);
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(3);
const TARGETS: [u64; 4] = [11, 12, 13, 14];

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

/// Everything a replica holds: the namespace's rows and the reply table.
#[derive(Debug, PartialEq)]
struct Held {
    namespace: NamespaceImage,
    replies: ReplyTable,
}

fn held(machine: &NamespaceMachine) -> Held {
    Held { namespace: machine.namespace_image().unwrap(), replies: machine.replies().clone() }
}

struct Cluster {
    network: Arc<LocalNetwork>,
    dirs: BTreeMap<NodeId, TempDir>,
    nodes: BTreeMap<NodeId, GroupNode<NamespaceMachine>>,
    config: Arc<Config>,
    limits: GroupLimits,
    /// The highest log index acknowledged to a proposer.
    acknowledged_index: u64,
}

impl Cluster {
    async fn new(ids: &[NodeId], timing: GroupTiming, seed: u64) -> Cluster {
        let limits = GroupLimits { snapshot_chunk_bytes: 4096, ..GroupLimits::default() };
        let config = raft_config(&timing, &limits).unwrap();
        let mut cluster = Cluster {
            network: Arc::new(LocalNetwork::new(seed)),
            dirs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            config,
            limits,
            acknowledged_index: 0,
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
            let error = match NamespaceMachine::open(&dir.join("namespace.redb"), MachineLimits::default()) {
                Ok(machine) => {
                    let started = GroupNode::start(
                        id,
                        &dir,
                        machine,
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

    async fn stop_all(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.kill(id).await;
        }
    }

    async fn initialize(&self, ids: &[NodeId]) {
        let members: BTreeMap<NodeId, BasicNode> = ids.iter().map(|id| (*id, node(*id))).collect();
        self.nodes[&ids[0]].raft.initialize(members).await.unwrap();
    }

    async fn leader(&self) -> NodeId {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(id) = self.any_leader() {
                return id;
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn any_leader(&self) -> Option<NodeId> {
        self.nodes
            .values()
            .find(|n| {
                let metrics = n.raft.metrics().borrow().clone();
                metrics.state.is_leader() && metrics.current_leader == Some(n.id)
            })
            .map(|n| n.id)
    }

    /// Proposes `batch` at the leader until it is acknowledged; returns its outcomes.
    async fn propose(&mut self, batch: Batch) -> Vec<Outcome> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let Some(id) = self.any_leader() else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            match tokio::time::timeout(PROPOSE_TIMEOUT, self.nodes[&id].propose(batch.clone())).await {
                Ok(Ok(committed)) => {
                    self.acknowledged_index = self.acknowledged_index.max(committed.index);
                    return BatchReply::decode(&committed.reply.bytes).unwrap().outcomes;
                }
                Ok(Err(GroupError::NotLeader { .. })) | Ok(Err(GroupError::Raft(_))) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(Err(e)) => panic!("proposal refused: {e}"),
            }
        }
        panic!("batch not acknowledged within {WAIT:?}");
    }

    /// Waits until every node in `ids` applied through the highest index acknowledged.
    async fn converge(&self, ids: &[NodeId]) {
        for id in ids {
            self.nodes[id]
                .raft
                .wait(Some(WAIT))
                .applied_index_at_least(Some(self.acknowledged_index), "converge")
                .await
                .unwrap_or_else(|e| panic!("node {id} did not reach {}: {e}", self.acknowledged_index));
        }
    }

    fn held(&self, id: NodeId) -> Held {
        self.nodes[&id].state.with_state(held)
    }

    /// Every node in `ids` holds exactly what the first does.
    fn assert_alike(&self, ids: &[NodeId]) {
        let first = self.held(ids[0]);
        assert!(first.namespace.rows() > 0);
        for id in &ids[1..] {
            assert!(self.held(*id) == first, "node {id} differs from node {}", ids[0]);
        }
    }

    /// The genesis, the targets, and an exactly-once session; returns the session's id.
    async fn begin(&mut self) -> u64 {
        let genesis = plain(Op::Genesis { id_key: [9; 16] }, 1);
        assert!(ok(&self.propose(Batch::new(1, vec![genesis])).await[0]));
        let setup: Vec<Change> = TARGETS
            .iter()
            .map(|t| plain(target_op(*t), 2))
            .chain([plain(Op::BindTargets { credential: "server-a".into(), targets: ids(&TARGETS) }, 2)])
            .collect();
        self.propose(Batch::new(2, setup)).await;
        match &self.propose(Batch::new(3, vec![plain(Op::OpenSession, 3)])).await[0] {
            Outcome::Applied { result: Ok(Applied::Session(id)), .. } => *id,
            other => panic!("open session: {other:?}"),
        }
    }
}

fn ids(targets: &[u64]) -> Vec<TargetId> {
    targets.iter().map(|t| TargetId(*t)).collect()
}

fn target_op(target: u64) -> Op {
    Op::RecordTarget {
        target: TargetId(target),
        server: "10.0.0.1:7000".into(),
        used_bytes: 0,
        free_bytes: 1 << 40,
    }
}

fn ok(outcome: &Outcome) -> bool {
    matches!(outcome.result(), Some(Ok(_)))
}

/// A change outside any session.
fn plain(op: Op, now_ns: i64) -> Change {
    let body = NamespaceChange::new(Caller::root(), now_ns, op).encode().unwrap();
    Change { session_id: 0, sequence: 0, acknowledged_through: 0, body }
}

/// A change of `session` numbered `sequence`.
fn numbered(session_id: u64, sequence: u64, caller: Caller, now_ns: i64, op: Op) -> Change {
    let body = NamespaceChange::new(caller, now_ns, op).encode().unwrap();
    Change { session_id, sequence, acknowledged_through: sequence.saturating_sub(8), body }
}

const OWNER: NewOwner = NewOwner { mode: 0o755, uid: 0, gid: 0 };

fn path(rng: &mut StdRng) -> String {
    match rng.random_range(0..3) {
        0 => format!("/d{}", rng.random_range(0..3)),
        1 => format!("/d{}/f{}", rng.random_range(0..3), rng.random_range(0..4)),
        _ => format!("/d{}/d{}/f{}", rng.random_range(0..3), rng.random_range(0..2), rng.random_range(0..3)),
    }
}

/// A random change over a small tree, by a random caller (root or a plain user), so
/// refusals (exists, not found, not empty, permission) are as common as successes.
fn random_op(rng: &mut StdRng) -> (Caller, Op) {
    let caller = match rng.random_range(0..4) {
        0 => Caller { uid: 1000, gid: 1000, groups: vec![] },
        _ => Caller::root(),
    };
    let mut ranked = ids(&TARGETS);
    ranked.shuffle(rng);
    let op = match rng.random_range(0..13) {
        0 | 1 => Op::Mkdir { at: Place::Path(path(rng)), owner: OWNER },
        2..=4 => Op::Create {
            at: Place::Path(path(rng)),
            owner: NewOwner { mode: 0o644, uid: caller.uid, gid: caller.gid },
            subfile_count: rng.random_range(0..3),
            targets: None,
            layout: rng.random_bool(0.3).then_some(Layout::Stripe { unit_bytes: 1 << 16, count: 2 }),
            exclusive: rng.random_bool(0.5),
            ranked,
        },
        5 => Op::Symlink { at: Place::Path(path(rng)), target: path(rng), owner: OWNER },
        6 => Op::Link { existing: path(rng), new: path(rng) },
        7 => Op::Unlink { at: Place::Path(path(rng)), expected_id: None, open: OpenHint::Unknown },
        8 => Op::Rmdir { at: Place::Path(path(rng)) },
        9 => Op::Rename {
            from: Place::Path(path(rng)),
            to: Place::Path(path(rng)),
            mode: [
                RenameMode::Replace { open: OpenHint::Unknown },
                RenameMode::NoReplace,
                RenameMode::Exchange,
            ][rng.random_range(0..3)],
        },
        10 => Op::SetAttr {
            id: flotilla_namespace::ROOT_ID,
            change: SetAttr { mode: Some(rng.random_range(0o700..0o777)), ..SetAttr::default() },
        },
        11 => Op::OpenSession,
        _ => Op::AckDeletes {
            target: TargetId(TARGETS[rng.random_range(0..4)]),
            done: vec![(flotilla_types::FileId(rng.random()), flotilla_types::SubfileIndex(0))],
        },
    };
    (caller, op)
}

/// `count` random batches of 1 to 6 changes of `session` (sequences from `first`).
fn random_batches(rng: &mut StdRng, session: u64, first: u64, count: usize) -> Vec<Batch> {
    let mut sequence = first;
    (0..count)
        .map(|b| {
            let changes = (0..rng.random_range(1..=6))
                .map(|_| {
                    let (caller, op) = random_op(rng);
                    let change = numbered(session, sequence, caller, 1_000 + sequence as i64, op);
                    sequence += 1;
                    change
                })
                .collect();
            Batch::new(10 + b as u64, changes)
        })
        .collect()
}

fn mark(index: u64) -> AppliedMark {
    AppliedMark { log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)), ..AppliedMark::default() }
}

/// Without the group: the same batches applied to two fresh machines give the same rows,
/// the same reply table and the same replies; and a machine reopened from its file stands
/// where it stood (its mark), so the group replays nothing it already applied.
#[test]
fn the_same_batches_on_two_fresh_machines_give_identical_namespaces() {
    let seed = 33;
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| NamespaceMachine::open(&dir.path().join(name), MachineLimits::default()).unwrap();
    let (mut a, mut b) = (open("a.redb"), open("b.redb"));
    // Phase: before its genesis a namespace refuses every change, alike on both.
    let early = Batch::new(1, vec![plain(Op::Mkdir { at: Place::Path("/x".into()), owner: OWNER }, 1)]);
    let reply = a.apply(&mark(1), &early).unwrap();
    assert_eq!(reply, b.apply(&mark(1), &early).unwrap());
    assert!(!ok(&BatchReply::decode(&reply.bytes).unwrap().outcomes[0]));
    // Phase: genesis, targets, a session, then random batches.
    let mut batches = vec![
        Batch::new(2, vec![plain(Op::Genesis { id_key: [5; 16] }, 2)]),
        Batch::new(3, TARGETS.iter().map(|t| plain(target_op(*t), 3)).collect()),
        Batch::new(4, vec![plain(Op::OpenSession, 4)]),
    ];
    batches.extend(random_batches(&mut StdRng::seed_from_u64(seed), 1, 1, 150));
    let mut successes = 0;
    for (i, batch) in batches.iter().enumerate() {
        let index = i as u64 + 2;
        let reply = a.apply(&mark(index), batch).unwrap();
        assert_eq!(reply, b.apply(&mark(index), batch).unwrap(), "batch {index} answered differently");
        successes += BatchReply::decode(&reply.bytes).unwrap().outcomes.iter().filter(|o| ok(o)).count();
    }
    assert!(successes > 100, "only {successes} changes succeeded: the random changes test too little");
    assert_eq!(held(&a), held(&b));
    // Phase: reopened, a machine stands at its last mark with the same state.
    let last = batches.len() as u64 + 1;
    let before = held(&a);
    drop(a);
    let a = open("a.redb");
    assert_eq!(a.last_applied().unwrap().map(|m| m.index()), Some(last));
    assert_eq!(held(&a), before);
    // Phase: a snapshot of one installed on a third brings the same state and mark.
    let mut image = Vec::new();
    let covered = a.write_snapshot(&mut image).unwrap();
    let mut c = open("c.redb");
    c.install_snapshot(&covered, &mut image.as_slice()).unwrap();
    assert_eq!(held(&c), before);
    assert_eq!(c.last_applied().unwrap(), Some(covered));
    drop(c);
    assert_eq!(held(&open("c.redb")), before, "the installed state is on disk");
}

/// Runs of committed entries applied in one transaction each (`apply_run`, what a node does
/// with what openraft hands it) give the same replies, rows and reply table as the same
/// entries applied one by one, with entries without a batch (blank, membership) and the
/// genesis among them; reopened, the machine stands at the run's last mark.
#[test]
fn runs_applied_in_one_transaction_answer_as_entries_applied_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| NamespaceMachine::open(&dir.path().join(name), MachineLimits::default()).unwrap();
    let (mut one, mut runs) = (open("one.redb"), open("runs.redb"));
    let mut rng = StdRng::seed_from_u64(3301);
    let mut entries: Vec<Option<Batch>> = vec![
        None,
        Some(Batch::new(2, vec![plain(Op::Genesis { id_key: [7; 16] }, 2)])),
        Some(Batch::new(3, TARGETS.iter().map(|t| plain(target_op(*t), 3)).collect())),
        Some(Batch::new(4, vec![plain(Op::OpenSession, 4)])),
    ];
    for batch in random_batches(&mut rng, 1, 1, 200) {
        entries.push(Some(batch));
        if rng.random_bool(0.05) {
            entries.push(None);
        }
    }
    let marks: Vec<AppliedMark> = (1..=entries.len() as u64).map(mark).collect();
    // Phase: one by one on one machine.
    let mut expected = Vec::new();
    for (entry, mark) in entries.iter().zip(&marks) {
        expected.push(match entry {
            Some(batch) => one.apply(mark, batch).unwrap(),
            None => {
                one.record_mark(mark).unwrap();
                flotilla_metagroup::Reply::default()
            }
        });
    }
    // Phase: in runs of 1 to 40 entries on the other.
    let mut answered = Vec::new();
    let mut at = 0;
    while at < entries.len() {
        let end = (at + rng.random_range(1..=40)).min(entries.len());
        let run: Vec<flotilla_metagroup::RunEntry<'_>> = (at..end)
            .map(|i| flotilla_metagroup::RunEntry { mark: &marks[i], batch: entries[i].as_ref() })
            .collect();
        answered.extend(runs.apply_run(&run).unwrap());
        assert_eq!(runs.last_applied().unwrap().map(|m| m.index()), Some(end as u64), "the run's last mark");
        at = end;
    }
    assert_eq!(answered.len(), expected.len());
    for (i, (a, b)) in expected.iter().zip(&answered).enumerate() {
        assert_eq!(a, b, "entry {} answered differently in a run", i + 1);
    }
    let successes: usize = expected
        .iter()
        .filter(|r| !r.bytes.is_empty())
        .map(|r| BatchReply::decode(&r.bytes).unwrap().outcomes.iter().filter(|o| ok(o)).count())
        .sum();
    assert!(successes > 100, "only {successes} changes succeeded: the runs test too little");
    assert_eq!(held(&one), held(&runs));
    // Phase: reopened (every run's commit made durable first), the state and mark are kept.
    let before = held(&runs);
    runs.namespace().unwrap().sync_batches().unwrap();
    drop(runs);
    let runs = open("runs.redb");
    assert_eq!(runs.last_applied().unwrap().map(|m| m.index()), Some(entries.len() as u64));
    assert_eq!(held(&runs), before);
}

/// A session closed by a change numbered in it is gone (its later requests are refused as
/// of an unknown session) and the machine goes on.
#[test]
fn a_session_closed_by_its_own_change_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut machine = NamespaceMachine::open(&dir.path().join("a.redb"), MachineLimits::default()).unwrap();
    machine.apply(&mark(1), &Batch::new(1, vec![plain(Op::Genesis { id_key: [5; 16] }, 1)])).unwrap();
    machine.apply(&mark(2), &Batch::new(2, vec![plain(Op::OpenSession, 2)])).unwrap();
    let close = numbered(1, 1, Caller::root(), 3, Op::CloseSession { session_id: 1 });
    let mkdir = numbered(1, 2, Caller::root(), 3, Op::Mkdir { at: Place::Path("/a".into()), owner: OWNER });
    let reply = machine.apply(&mark(3), &Batch::new(3, vec![close, mkdir])).unwrap();
    let outcomes = BatchReply::decode(&reply.bytes).unwrap().outcomes;
    assert!(ok(&outcomes[0]), "{outcomes:?}");
    assert!(matches!(outcomes[1], Outcome::Refused(flotilla_metagroup::ReplyError::UnknownSession { .. })));
    assert_eq!(machine.replies().sessions_len(), 0);
    assert!(machine.namespace().unwrap().lookup("/a").is_err());
}

/// A change retried under the same (session, sequence) takes effect once and is answered
/// with its first reply, also through a new leader; a genesis is refused the second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_change_takes_effect_once_and_returns_the_first_reply() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 1).await;
    cluster.initialize(&[1, 2, 3]).await;
    let session = cluster.begin().await;
    let create = |sequence, now| {
        let op = Op::Create {
            at: Place::Path("/f".into()),
            owner: NewOwner { mode: 0o644, uid: 0, gid: 0 },
            subfile_count: 2,
            targets: None,
            layout: None,
            exclusive: true,
            ranked: ids(&TARGETS),
        };
        numbered(session, sequence, Caller::root(), now, op)
    };
    // Phase: the create is applied once.
    let first = cluster.propose(Batch::new(10, vec![create(1, 100)])).await;
    let Outcome::Applied { result: Ok(Applied::Entry(entry)), .. } = &first[0] else { panic!("{first:?}") };
    assert_eq!(entry.file.as_ref().unwrap().1, ids(&TARGETS[..2]), "the ranking's first two targets");
    // Phase: retried (the proposer's clock moved on), it is replayed, not refused as
    // existing: the client gets its file.
    let again = cluster.propose(Batch::new(11, vec![create(1, 200)])).await;
    assert_eq!(again[0], Outcome::Replayed(first[0].result().unwrap().clone()));
    // Phase: the leader dies; the retry at the new leader is replayed too.
    let old = cluster.leader().await;
    cluster.kill(old).await;
    let third = cluster.propose(Batch::new(12, vec![create(1, 300)])).await;
    assert_eq!(third[0], Outcome::Replayed(first[0].result().unwrap().clone()));
    // Phase: a second genesis would wipe the namespace: it is refused.
    let genesis = cluster.propose(Batch::new(13, vec![plain(Op::Genesis { id_key: [1; 16] }, 13)])).await;
    assert!(matches!(genesis[0].result(), Some(Err(_))), "{genesis:?}");
    // Phase: the old leader comes back; all three hold one file /f, with its first times.
    cluster.start(old).await;
    cluster.converge(&[1, 2, 3]).await;
    cluster.assert_alike(&[1, 2, 3]);
    let found = cluster.nodes[&old].state.with_state(|m| m.namespace().unwrap().lookup("/f").unwrap());
    assert_eq!((found.id, found.attrs.ctime_ns), (entry.id, 100));
    cluster.stop_all().await;
}

/// Random batches through the leader; a follower is killed and restarted from its files
/// in the middle. Every node ends with the same rows and reply table (an entry applied
/// twice would show: a session opened twice moves the session counter twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_apply_random_changes_alike_and_a_restarted_node_applies_nothing_twice() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 2).await;
    cluster.initialize(&[1, 2, 3]).await;
    let session = cluster.begin().await;
    let mut rng = StdRng::seed_from_u64(2);
    let batches = random_batches(&mut rng, session, 1, 120);
    let leader = cluster.leader().await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    // Phase: the first half; then the follower dies.
    for batch in &batches[..60] {
        cluster.propose(batch.clone()).await;
    }
    cluster.converge(&[follower]).await;
    let applied_before =
        cluster.nodes[&follower].state.with_state(|m| m.last_applied().unwrap().unwrap().index());
    cluster.kill(follower).await;
    // Phase: the second half without it; then it restarts from its files and catches up.
    for batch in &batches[60..] {
        cluster.propose(batch.clone()).await;
    }
    cluster.start(follower).await;
    let restarted_at =
        cluster.nodes[&follower].state.with_state(|m| m.last_applied().unwrap().unwrap().index());
    assert_eq!(restarted_at, applied_before, "the restarted node stands where it stood");
    cluster.converge(&[1, 2, 3]).await;
    cluster.assert_alike(&[1, 2, 3]);
    // Phase: a reference machine applying the same batches alone holds the same namespace.
    let dir = tempfile::tempdir().unwrap();
    let mut reference = NamespaceMachine::open(&dir.path().join("r.redb"), MachineLimits::default()).unwrap();
    let mut index = 0;
    let mut apply = |batch: Batch| {
        index += 1;
        reference.apply(&mark(index), &batch).unwrap();
    };
    apply(Batch::new(1, vec![plain(Op::Genesis { id_key: [9; 16] }, 1)]));
    let mut setup: Vec<Change> = TARGETS.iter().map(|t| plain(target_op(*t), 2)).collect();
    setup.push(plain(Op::BindTargets { credential: "server-a".into(), targets: ids(&TARGETS) }, 2));
    apply(Batch::new(2, setup));
    apply(Batch::new(3, vec![plain(Op::OpenSession, 3)]));
    for batch in batches {
        apply(batch);
    }
    assert_eq!(reference.namespace_image().unwrap(), cluster.held(1).namespace);
    cluster.stop_all().await;
}

/// A follower wiped after the leader purged its log comes back as a learner and is caught
/// up by a snapshot of the namespace; it then holds what the others hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_caught_up_by_snapshot_has_the_same_namespace() {
    let snapshots =
        GroupTiming { snapshot_every_entries: 10, log_kept_behind_snapshot_entries: 0, ..timing() };
    let mut cluster = Cluster::new(&[1, 2, 3], snapshots, 4).await;
    cluster.initialize(&[1, 2, 3]).await;
    let session = cluster.begin().await;
    let leader = cluster.leader().await;
    let wiped = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    // Phase: enough batches that the leader snapshots and purges its log.
    let mut rng = StdRng::seed_from_u64(4);
    let batches = random_batches(&mut rng, session, 1, 40);
    for batch in &batches {
        cluster.propose(batch.clone()).await;
    }
    let deadline = Instant::now() + WAIT;
    while cluster.nodes[&cluster.leader().await].raft.metrics().borrow().purged.is_none() {
        assert!(Instant::now() < deadline, "the leader never purged its log");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Phase: the follower loses its files; removed, started empty, added as a learner, made
    // a voter again (see the group's own test for why).
    cluster.kill(wiped).await;
    cluster.dirs.remove(&wiped);
    let survivors: BTreeSet<NodeId> = [1, 2, 3].into_iter().filter(|id| *id != wiped).collect();
    cluster.nodes[&cluster.leader().await].raft.change_membership(survivors, false).await.unwrap();
    cluster.start(wiped).await;
    cluster.nodes[&cluster.leader().await].raft.add_learner(wiped, node(wiped), true).await.unwrap();
    let all: BTreeSet<NodeId> = [1, 2, 3].into();
    cluster.nodes[&cluster.leader().await].raft.change_membership(all, false).await.unwrap();
    let more = random_batches(&mut rng, session, 1_000, 3);
    for batch in more {
        cluster.propose(batch).await;
    }
    cluster.converge(&[1, 2, 3]).await;
    assert!(cluster.nodes[&wiped].raft.metrics().borrow().snapshot.is_some(), "caught up without a snapshot");
    assert!(cluster.nodes[&wiped].state.with_state(|m| m.born()), "the genesis came with the snapshot");
    cluster.assert_alike(&[1, 2, 3]);
    cluster.stop_all().await;
}

/// A writer makes directories one at a time, retrying each under its sequence until it is
/// acknowledged; the leader is killed in the middle. Every acknowledged directory is on
/// both survivors, once, and the survivors agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_run_loses_nothing_acknowledged() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), 5).await;
    cluster.initialize(&[1, 2, 3]).await;
    let session = cluster.begin().await;
    let mkdir = |i: u64| {
        let op = Op::Mkdir { at: Place::Path(format!("/m{i}")), owner: OWNER };
        numbered(session, i, Caller::root(), i as i64, op)
    };
    let mut acknowledged = Vec::new();
    let mut killed = None;
    let started = Instant::now();
    for i in 1..=60u64 {
        if i == 25 {
            let leader = cluster.leader().await;
            cluster.kill(leader).await;
            killed = Some(leader);
        }
        let outcomes = cluster.propose(Batch::new(i, vec![mkdir(i)])).await;
        assert!(ok(&outcomes[0]), "mkdir {i}: {outcomes:?}");
        acknowledged.push(i);
        assert!(started.elapsed() < Duration::from_secs(25), "the run took too long");
    }
    let survivors: Vec<NodeId> = cluster.nodes.keys().copied().collect();
    assert_eq!(survivors.len(), 2);
    assert!(!survivors.contains(&killed.unwrap()));
    cluster.converge(&survivors).await;
    cluster.assert_alike(&survivors);
    for id in &survivors {
        let listed = cluster.nodes[id].state.with_state(|m| m.namespace().unwrap().readdir("/").unwrap());
        let names: BTreeSet<String> = listed.iter().map(|e| e.name_lossy()).collect();
        for i in &acknowledged {
            assert!(names.contains(&format!("m{i}")), "node {id} lost /m{i}");
        }
        assert_eq!(listed.len(), acknowledged.len(), "node {id}: {names:?}");
    }
    cluster.stop_all().await;
}

/// The chain table through the log (issue 32 on a group): a membership engine driven by a
/// seeded run of heartbeats, silences, restarts, drains and finished resyncs decides chain
/// changes; each decision becomes one `Op::ChainChanges` in a batch among random namespace
/// changes, and three fresh machines given the same batches hold equal chain tables, equal
/// to the engine's, which a new leader loading them gets back whole.
#[test]
fn three_machines_given_the_same_chain_changes_hold_equal_chain_tables() {
    use flotilla_meta::replicated::{ChainRow, ChainTargetRow};
    use flotilla_replica::{
        ChainTable, Command, Event, FailureGroup, Incarnation, Membership, MembershipConfig,
    };
    let seed: u64 = std::env::var("FLOTILLA_CHAIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(32);
    let rng = &mut StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| NamespaceMachine::open(&dir.path().join(name), MachineLimits::default()).unwrap();
    let mut machines = [open("a.redb"), open("b.redb"), open("c.redb")];
    let config =
        MembershipConfig { lease_ms: 100, clock_margin_ms: 50, fence_after_ms: 200, dead_after_ms: 5_000 };
    let groups: BTreeMap<TargetId, FailureGroup> =
        TARGETS.iter().map(|&t| (TargetId(t), FailureGroup::new(&format!("g{t}")).unwrap())).collect();
    let table = ChainTable::build(groups.clone(), 2, 2).unwrap();
    let mut engine = Membership::new(config, table, 0).unwrap();
    let mut incarnations: BTreeMap<u64, u64> = TARGETS.iter().map(|&t| (t, 1)).collect();
    let target_rows = |incarnations: &BTreeMap<u64, u64>| -> Vec<ChainTargetRow> {
        incarnations
            .iter()
            .map(|(&t, &i)| ChainTargetRow {
                target: TargetId(t),
                group: format!("g{t}"),
                incarnation: Some(i),
                dead: false,
                draining: false,
            })
            .collect()
    };
    let whole = Op::ChainChanges {
        replicas: Some(2),
        chains: engine.table().chains().map(ChainRow::of).collect(),
        targets: target_rows(&incarnations),
    };
    let mut batches = vec![
        Batch::new(1, vec![plain(Op::Genesis { id_key: [7; 16] }, 1)]),
        Batch::new(2, vec![plain(Op::OpenSession, 2), plain(whole, 2)]),
    ];
    let (mut now_ms, mut sequence, mut decided) = (0u64, 1u64, 0usize);
    let mut silent: BTreeSet<u64> = BTreeSet::new();
    for b in 0..200u64 {
        now_ms += rng.random_range(10..120);
        // Phase: what happens to the targets in this step.
        let mut events = Vec::new();
        match rng.random_range(0..10) {
            0 => {
                silent.insert(TARGETS[rng.random_range(0..4)]);
            }
            1 => {
                silent.clear();
            }
            2 => {
                let t = TARGETS[rng.random_range(0..4)];
                *incarnations.get_mut(&t).unwrap() += 1;
            }
            3 => {
                let chain = engine.table().chains().find(|c| c.syncing().is_some()).cloned();
                if let Some(chain) = chain {
                    let target = chain.syncing().unwrap().target;
                    events.push(Event::SyncDone { chain: chain.id(), target, version: chain.version() });
                }
            }
            _ => {}
        }
        for &t in TARGETS.iter().filter(|t| !silent.contains(t)) {
            events.push(Event::Heartbeat {
                target: TargetId(t),
                incarnation: Incarnation(incarnations[&t]),
                at_ms: now_ms,
            });
        }
        events.push(Event::Tick { at_ms: now_ms });
        let mut changed = BTreeSet::new();
        for event in events {
            for command in engine.handle(event) {
                if let Command::ChainChanged { chain, .. } = command {
                    changed.insert(chain);
                }
            }
        }
        let mut changes: Vec<Change> = Vec::new();
        if !changed.is_empty() || rng.random_bool(0.1) {
            decided += changed.len();
            let op = Op::ChainChanges {
                replicas: None,
                chains: changed.iter().filter_map(|id| engine.table().chain(*id)).map(ChainRow::of).collect(),
                targets: target_rows(&incarnations),
            };
            changes.push(plain(op, 1_000 + b as i64));
        }
        for _ in 0..rng.random_range(0..3) {
            let (caller, op) = random_op(rng);
            changes.push(numbered(1, sequence, caller, 1_000 + sequence as i64, op));
            sequence += 1;
        }
        changes.shuffle(rng);
        if !changes.is_empty() {
            batches.push(Batch::new(10 + b, changes));
        }
    }
    assert!(decided > 10, "only {decided} chain changes decided: the run tests too little");
    for (i, batch) in batches.iter().enumerate() {
        let index = i as u64 + 1;
        let replies: Vec<_> = machines.iter_mut().map(|m| m.apply(&mark(index), batch).unwrap()).collect();
        assert!(replies.windows(2).all(|w| w[0] == w[1]), "batch {index} answered differently");
    }
    // Phase: equal tables on the three, equal to the engine's.
    let tables: Vec<_> = machines.iter().map(|m| m.namespace().unwrap().chain_table().unwrap()).collect();
    assert_eq!(tables[0], tables[1]);
    assert_eq!(tables[1], tables[2]);
    let engine_chains: Vec<_> = engine.table().chains().cloned().collect();
    assert_eq!(tables[0].chains, engine_chains, "the replicated table is the engine's");
    assert_eq!(tables[0].replicas, Some(2));
    for (t, record) in &tables[0].targets {
        assert_eq!(record.incarnation, Some(Incarnation(incarnations[&t.0])), "target {t}");
    }
    // Phase: a new leader loads an engine from a replica's rows: the same table, every target
    // with a fresh lease (nobody fenced by the first tick).
    let stored = tables[0].clone();
    let groups = stored.targets.iter().map(|(&t, r)| (t, r.group.clone())).collect();
    let table = ChainTable::from_parts(2, stored.chains.clone(), groups).expect("a whole table");
    let mut reloaded = Membership::new(config, table, now_ms + 10_000).unwrap();
    for (&t, record) in &stored.targets {
        reloaded.remember_incarnation(t, record.incarnation.unwrap());
    }
    reloaded.handle(Event::Tick { at_ms: now_ms + 10_000 + config.fence_after_ms / 2 });
    for t in TARGETS {
        let health = reloaded.health(TargetId(t)).expect("every target is in the loaded table");
        assert!(!health.down, "a new leader fences nobody before fence_after_ms: target {t} {health:?}");
    }
    // Phase: a change whose chain breaks the invariants is refused when decoded.
    let bad = ChainRow {
        id: 0,
        version: 9,
        members: vec![
            flotilla_replica::Member { target: TargetId(11), state: flotilla_replica::MemberState::Serving },
            flotilla_replica::Member { target: TargetId(11), state: flotilla_replica::MemberState::Serving },
        ],
    };
    let bad = NamespaceChange::new(
        Caller::root(),
        0,
        Op::ChainChanges { replicas: None, chains: vec![bad], targets: vec![] },
    );
    assert!(bad.encode().is_err(), "duplicate members refused");
}
