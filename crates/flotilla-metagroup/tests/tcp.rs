//! A group of nodes in one process talking over real TCP on loopback (ports picked by the
//! kernel) with flotilla-auth's handshake and meta credentials, each node with real redb
//! files in its own temporary directory. The same phases as `group.rs`, over the wire.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_auth::{Acceptor, AuthBounds, ClientAuth, ClusterCa, Credential, IssueRequest, Limits, Role};
use flotilla_metagroup::kv::{decode_outcomes, encode_op, KvOp, KvOutcome, KvStateMachine};
use flotilla_metagroup::{
    raft_config, Batch, Change, GroupError, GroupIdentity, GroupLimits, GroupListener, GroupNode,
    GroupTiming, NodeId, RaftRpc, ReplyLimits, TcpConfig, TcpError, TcpTransport, Transport, TransportError,
};
use flotilla_proto::{decode_body, ErrorCode, GroupReply};
use openraft::raft::VoteRequest;
use openraft::{BasicNode, Config, Vote};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &[u8] = b"items";
const WAIT: Duration = Duration::from_secs(20);
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(3);

fn timing() -> GroupTiming {
    GroupTiming {
        heartbeat_ms: 50,
        election_timeout_ms_min: 300,
        election_timeout_ms_max: 600,
        snapshot_every_entries: 1_000,
        log_kept_behind_snapshot_entries: 100,
    }
}

fn tcp() -> TcpConfig {
    TcpConfig { call_timeout_ms: 2_000, connect_timeout_ms: 1_000, ..TcpConfig::default() }
}

fn issue(ca: &ClusterCa, role: Role, name: &str) -> Arc<Credential> {
    let request =
        IssueRequest { role, name: name.into(), limits: Limits::default(), expires_unix_secs: None };
    Arc::new(ca.issue(request).unwrap())
}

struct Cluster {
    ca: ClusterCa,
    tcp: TcpConfig,
    dirs: BTreeMap<NodeId, TempDir>,
    addrs: BTreeMap<NodeId, SocketAddr>,
    nodes: BTreeMap<NodeId, GroupNode<KvStateMachine>>,
    listeners: BTreeMap<NodeId, GroupListener>,
    /// Each node's group id, kept in its directory.
    identities: BTreeMap<NodeId, Arc<GroupIdentity>>,
    config: Arc<Config>,
    limits: GroupLimits,
    session_id: AtomicU64,
    sequence: AtomicU64,
    acknowledged_index: AtomicU64,
}

impl Cluster {
    async fn new(ids: &[NodeId], timing: GroupTiming, limits: GroupLimits, tcp: TcpConfig) -> Cluster {
        let config = raft_config(&timing, &limits).unwrap();
        tcp.check(&limits).unwrap();
        let mut cluster = Cluster {
            ca: ClusterCa::generate(),
            tcp,
            dirs: BTreeMap::new(),
            addrs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            listeners: BTreeMap::new(),
            identities: BTreeMap::new(),
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

    /// Binds `id`'s listener: a port the kernel picks the first time, the same one after.
    async fn bind(&self, id: NodeId) -> TcpListener {
        let addr = self.addrs.get(&id).copied().unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
        let deadline = Instant::now() + WAIT;
        loop {
            match TcpListener::bind(addr).await {
                Ok(listener) => return listener,
                Err(e) => assert!(Instant::now() < deadline, "node {id} cannot bind {addr}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts (or restarts) `id` from its files with its listener on its address.
    async fn start(&mut self, id: NodeId) {
        let dir = self.dir(id);
        let listener = self.bind(id).await;
        self.addrs.insert(id, listener.local_addr().unwrap());
        let credential = issue(&self.ca, Role::Meta, &format!("meta-{id}"));
        let identity = Arc::new(GroupIdentity::open(&dir).unwrap());
        self.identities.insert(id, identity.clone());
        let transport = Arc::new(
            TcpTransport::new(credential.clone(), self.tcp.clone()).unwrap().with_identity(identity.clone()),
        );
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
                        transport.clone(),
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
        let served =
            GroupListener::start_in_group(listener, id, node.raft.clone(), credential, &self.tcp, identity)
                .unwrap();
        self.listeners.insert(id, served);
        self.nodes.insert(id, node);
    }

    /// Stops `id` as a crash would: its listener and every connection it served close, its
    /// Raft stops; only its files remain.
    async fn kill(&mut self, id: NodeId) {
        if let Some(listener) = self.listeners.remove(&id) {
            listener.shutdown().await;
        }
        if let Some(node) = self.nodes.remove(&id) {
            node.stop().await;
        }
    }

    async fn wipe(&mut self, id: NodeId) {
        self.kill(id).await;
        self.dirs.remove(&id);
    }

    fn member(&self, id: NodeId) -> BasicNode {
        BasicNode { addr: self.addrs[&id].to_string() }
    }

    /// The first of `ids` makes the group's id and names the members.
    async fn initialize(&self, ids: &[NodeId]) {
        self.identities[&ids[0]].create().unwrap();
        let members: BTreeMap<NodeId, BasicNode> = ids.iter().map(|id| (*id, self.member(*id))).collect();
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
        self.nodes.values().find(|n| n.raft.metrics().borrow().state.is_leader()).map(|n| n.id)
    }

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

    /// Pushes `items` in one batch through an exactly-once session (retries never double).
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

    async fn stop_all(mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            self.kill(id).await;
        }
    }
}

fn plain(op: KvOp) -> Change {
    Change { session_id: 0, sequence: 0, acknowledged_through: 0, body: encode_op(&op) }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Reads until the peer closes the stream (or resets it); panics if it stays open.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(limit, stream.read_to_end(&mut seen)).await;
    assert!(read.is_ok(), "the node kept the connection open for {limit:?}");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_tcp_replicate_and_replace_a_killed_leader() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), GroupLimits::default(), tcp()).await;
    // Phase: the three elect a leader over TCP and replicate batches.
    cluster.initialize(&[1, 2, 3]).await;
    let mut expected = Vec::new();
    for batch in 0..10u64 {
        let items: Vec<u64> = (0..5).map(|i| batch * 5 + i).collect();
        cluster.push_items(&items).await;
        expected.extend(items);
    }
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), expected, "node {id}");
    }
    // Phase: the leader dies (its listener and connections with it); the other two elect a
    // new leader, which accepts changes.
    let old = cluster.leader().await;
    cluster.kill(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    cluster.push_items(&[100, 101]).await;
    expected.extend([100, 101]);
    let survivors: Vec<NodeId> = [1, 2, 3].into_iter().filter(|id| *id != old).collect();
    cluster.converge(&survivors).await;
    for id in &survivors {
        assert_eq!(cluster.list(*id), expected, "node {id}: something acknowledged was lost");
    }
    // Phase: the old leader restarts on its port from its files and catches up.
    cluster.start(old).await;
    cluster.push_items(&[102]).await;
    expected.push(102);
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), expected, "node {id}");
    }
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_without_a_meta_certificate_or_sending_garbage_are_refused_and_the_group_goes_on() {
    let cluster = Cluster::new(&[1, 2, 3], timing(), GroupLimits::default(), tcp()).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[1]).await;
    let target = cluster.leader().await;
    let addr = cluster.addrs[&target];
    let failures_before = cluster.listeners[&target].handshake_failures();

    // Phase: garbage instead of a handshake: the connection is closed, nothing answered.
    let mut garbage = TcpStream::connect(addr).await.unwrap();
    garbage.write_all(&[0x5a; 300]).await.unwrap();
    let answered = closed_within(&mut garbage, Duration::from_secs(5)).await;
    assert!(answered.len() < 300, "a garbage peer got {} bytes back", answered.len());

    // Phase: a server credential of the same cluster: the node's answer shows a meta
    // certificate, which a server-role initiator refuses ...
    let server = issue(&cluster.ca, Role::Server, "io-0");
    let auth = ClientAuth { credential: server.clone(), bounds: Default::default() };
    let config = flotilla_rpc::ConnectionConfig::with_auth(auth);
    let refused = flotilla_rpc::Connection::connect(&addr.to_string(), config).await;
    let error = refused.err().expect("a server credential connected to a meta node");
    assert!(error.to_string().contains("role meta"), "{error}");
    // ... and one that accepts a meta responder is refused by the node itself.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let timeout = Duration::from_secs(3);
    let integrity = flotilla_auth::Integrity::Mac;
    let _ = flotilla_auth::initiate_expecting(&mut stream, &server, integrity, timeout, &[Role::Meta]).await;
    closed_within(&mut stream, Duration::from_secs(5)).await;
    // A client credential, and a meta credential of another cluster, likewise.
    for credential in
        [issue(&cluster.ca, Role::Client, "alice"), issue(&ClusterCa::generate(), Role::Meta, "meta-9")]
    {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let _ =
            flotilla_auth::initiate_expecting(&mut stream, &credential, integrity, timeout, &[Role::Meta])
                .await;
        closed_within(&mut stream, Duration::from_secs(5)).await;
    }
    let failures = cluster.listeners[&target].handshake_failures() - failures_before;
    assert!(failures >= 4, "only {failures} refused handshakes counted");

    // Phase: a meta peer whose request does not decode gets BadRequest and keeps its
    // connection; then bad frame bytes get a Protocol error and the connection closes.
    let meta = issue(&cluster.ca, Role::Meta, "meta-7");
    let auth = ClientAuth { credential: meta.clone(), bounds: Default::default() };
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut secured = auth.connect(&mut stream).await.expect("a meta peer is admitted");
    secured.sealer.write_frame(&mut stream, 7, &[0, 1, target as u8], b"not an rpc").await.unwrap();
    let mut buffer = bytes::BytesMut::new();
    let frame = flotilla_proto::read_frame(&mut stream, &mut buffer, 1 << 20).await.unwrap();
    secured.opener.check(&mut stream, &frame).await.unwrap();
    let reply = decode_body::<GroupReply>(&frame.body, "group reply").unwrap();
    assert_eq!(frame.request_id, 7);
    assert!(matches!(reply, GroupReply::Error(ref e) if e.code == ErrorCode::BadRequest), "{reply:?}");
    stream.write_all(b"FLOT but not a frame header at all....").await.unwrap();
    let frame = flotilla_proto::read_frame(&mut stream, &mut buffer, 1 << 20).await.unwrap();
    secured.opener.check(&mut stream, &frame).await.unwrap();
    let reply = decode_body::<GroupReply>(&frame.body, "group reply").unwrap();
    assert!(matches!(reply, GroupReply::Error(ref e) if e.code == ErrorCode::Protocol), "{reply:?}");
    closed_within(&mut stream, Duration::from_secs(5)).await;
    assert!(cluster.listeners[&target].frames_refused() >= 2);

    // Phase: a node cannot be started with anything but a meta credential.
    let wrong = TcpTransport::new(server.clone(), TcpConfig::default());
    assert!(matches!(wrong, Err(TcpError::CredentialRole { role: Role::Server, .. })));

    // Phase: through all of this the group served; it still does, on every node.
    cluster.push_items(&[2, 3]).await;
    cluster.converge(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(cluster.list(id), vec![1, 2, 3], "node {id}");
    }
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_catches_up_by_snapshot_over_tcp() {
    let snapshots =
        GroupTiming { snapshot_every_entries: 10, log_kept_behind_snapshot_entries: 0, ..timing() };
    // Small chunks: the snapshot crosses the wire in several frames.
    let limits = GroupLimits { snapshot_chunk_bytes: 256, ..GroupLimits::default() };
    let mut cluster = Cluster::new(&[1, 2, 3], snapshots, limits, tcp()).await;
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
    // Phase: a follower loses its files; it is removed, starts empty on its port, joins as
    // a learner (only a snapshot can bring it back) and becomes a voter again.
    cluster.wipe(wiped).await;
    let survivors: BTreeSet<NodeId> = [1, 2, 3].into_iter().filter(|id| *id != wiped).collect();
    cluster.nodes[&cluster.leader().await].raft.change_membership(survivors, false).await.unwrap();
    cluster.start(wiped).await;
    let member = cluster.member(wiped);
    cluster.nodes[&cluster.leader().await].raft.add_learner(wiped, member, true).await.unwrap();
    let all: BTreeSet<NodeId> = [1, 2, 3].into();
    cluster.nodes[&cluster.leader().await].raft.change_membership(all, false).await.unwrap();
    cluster.push_items(&[100]).await;
    expected.push(100);
    cluster.converge(&[1, 2, 3]).await;
    assert_eq!(cluster.list(wiped), expected);
    let snapshot = cluster.nodes[&wiped].raft.metrics().borrow().snapshot;
    assert!(snapshot.is_some(), "the wiped node caught up without a snapshot");
    cluster.stop_all().await;
}

/// A follower far behind gets entries that do not fit in one frame: the append is split
/// (openraft's PayloadTooLarge hint) instead of failing for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_too_large_for_one_frame_are_split() {
    let limits = GroupLimits {
        record_bytes_max: 16 << 10,
        batch_bytes_max: 8 << 10,
        snapshot_chunk_bytes: 16 << 10,
        ..GroupLimits::default()
    };
    let small = TcpConfig { frame_bytes_max: 32 << 10, ..tcp() };
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), limits, small).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[0]).await;
    // Phase: a follower is down while 30 batches of ~6 KiB go by (180 KiB: many frames).
    let leader = cluster.leader().await;
    let behind = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(behind).await;
    let big_key = vec![b'b'; 1000];
    for batch in 0..30u64 {
        let changes =
            (0..6).map(|i| plain(KvOp::Push { key: big_key.clone(), item: batch * 6 + i })).collect();
        cluster.propose(Batch::new(now_ms(), changes), WAIT).await.expect("batch acknowledged");
    }
    // Phase: it comes back and catches up through frames of at most 32 KiB.
    cluster.start(behind).await;
    cluster.push_items(&[1]).await;
    cluster.converge(&[1, 2, 3]).await;
    let expected: Vec<u64> = (0..180).collect();
    let caught_up = cluster.nodes[&behind].state.with_state(|s| s.list(&big_key)).unwrap();
    assert_eq!(caught_up, expected);
    assert_eq!(cluster.list(behind), vec![0, 1]);
    cluster.stop_all().await;
}

/// A node of another group (same cluster, same kind of credential) is refused by every node
/// of this one with an error naming both groups, and this group goes on; the members that
/// did not make the id took it from the first request they received and keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_group_is_refused_by_its_group_id() {
    let mut cluster = Cluster::new(&[1, 2, 3], timing(), GroupLimits::default(), tcp()).await;
    cluster.initialize(&[1, 2, 3]).await;
    cluster.push_items(&[1]).await;
    cluster.converge(&[1, 2, 3]).await;
    let ours = cluster.identities[&1].id();
    assert_ne!(ours, 0);
    for id in [2, 3] {
        assert_eq!(cluster.identities[&id].id(), ours, "node {id} took the group's id");
    }
    // Phase: a vote from a node of another group (a higher term: it would depose the leader).
    let stranger = TcpTransport::new(issue(&cluster.ca, Role::Meta, "meta-9"), tcp())
        .unwrap()
        .with_identity(Arc::new(GroupIdentity::in_memory(ours ^ 0x5a5a)));
    let term_before = cluster.nodes[&1].raft.metrics().borrow().current_term;
    for target in [1, 2, 3] {
        let vote = RaftRpc::Vote(VoteRequest::new(Vote::new(term_before + 100, 9), None));
        let addr = cluster.addrs[&target].to_string();
        let error = stranger.call(9, target, &addr, vote).await.unwrap_err();
        assert!(matches!(error, TransportError::Refused { .. }), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("from node 9 of group") && text.contains("belongs to group"), "{text}");
        assert!(text.contains(&format!("{ours:016x}")), "{text}");
    }
    let term_after = cluster.nodes[&1].raft.metrics().borrow().current_term;
    assert!(term_after < term_before + 100, "the stranger's term reached the group");
    // Phase: the group still serves; after a restart a node still knows its group.
    cluster.push_items(&[2]).await;
    cluster.kill(3).await;
    cluster.start(3).await;
    assert_eq!(cluster.identities[&3].id(), ours);
    cluster.push_items(&[3]).await;
    cluster.converge(&[1, 2, 3]).await;
    assert_eq!(cluster.list(3), vec![1, 2, 3]);
    cluster.stop_all().await;
}

/// A peer that completes the handshake and then never answers (a stopped process): calls
/// fail within `call_timeout_ms`, and once a call went unanswered for that long the link
/// connects again instead of reusing the dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_is_connected_to_again() {
    let ca = ClusterCa::generate();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicU64::new(0));
    let acceptor =
        Arc::new(Acceptor::new(issue(&ca, Role::Meta, "meta-2"), vec![Role::Meta], AuthBounds::default()));
    let silent = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::Relaxed);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if acceptor.accept(&mut stream, None).await.is_some() {
                        let _ = stream.read_to_end(&mut Vec::new()).await;
                    }
                });
            }
        }
    });
    let config = TcpConfig { call_timeout_ms: 300, ..tcp() };
    let transport = TcpTransport::new(issue(&ca, Role::Meta, "meta-1"), config).unwrap();
    let vote = || RaftRpc::Vote(VoteRequest::new(Vote::new(1, 1), None));
    // Phase: calls cut short (as openraft's heartbeat deadline does) share one connection.
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::from_millis(50), transport.call(1, 2, &addr, vote())).await;
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 1, "the connection was not reused");
    // Phase: a whole call fails naming the timeout ...
    let error = transport.call(1, 2, &addr, vote()).await.unwrap_err();
    assert!(error.to_string().contains("call_timeout_ms"), "{error}");
    // ... and by then the first unanswered call is older than the timeout: a new connection.
    let _ = tokio::time::timeout(Duration::from_millis(50), transport.call(1, 2, &addr, vote())).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while accepted.load(Ordering::Relaxed) < 2 {
        assert!(Instant::now() < deadline, "the dead connection is still used");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    silent.abort();
}
