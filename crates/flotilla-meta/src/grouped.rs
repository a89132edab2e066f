//! The metadata service as a node of a metadata group (issue 33), opted into with `node_id`
//! and `peers`: its namespace is a [`NamespaceMachine`] on a Raft group
//! (`flotilla-metagroup`), so every namespace change is a proposal acknowledged once a
//! majority holds it durably.
//!
//! - A node that is not the leader answers every request `NotServed::NotLeader` with the
//!   leader's client-facing metadata address (from `peers`).
//! - On the leader, a namespace-changing request becomes its change
//!   (`replicated::propose::change_for`), goes through the proposal queue (concurrent
//!   changes batched into one log entry, bounded by the batch limits), and its
//!   `ChangeResult` is answered as the direct path answers it (`State::on_group`).
//! - A read waits for a read barrier (read index) first. Neither waits past
//!   `quorum_wait_ms`: a leader cut off from the majority answers `NotServed::NoQuorum`.
//! - Each client connection gets a group session at its first change and numbers its
//!   changes, so a change is applied at most once per (session, sequence).
//! - A node that becomes leader starts its term before serving anything (`State::lead`):
//!   it forgets the locks, tokens and opens it may hold from an earlier term and starts the
//!   grace periods in which clients reclaim what they hold under the previous leader.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_auth::{Credential, Role};
use flotilla_metagroup::types::SESSION_NONE;
use flotilla_metagroup::{
    member_address, raft_config, Batch, Change, GroupError, GroupIdentity, GroupLimits, GroupListener,
    GroupNode, GroupTiming, MembershipError, NodeId, ReplyError, TcpConfig, TcpTransport,
};
use flotilla_proto::{ErrorCode, NotServed, WireError};
use flotilla_types::Caller;

use crate::config::MetaConfig;
use crate::replicated::{
    Applied, BatchReply, MachineLimits, NamespaceChange, NamespaceMachine, Op, Outcome, SharedNamespace,
};

/// Name of the group's log inside the data directory (beside `namespace.redb`).
pub const LOG_FILE: &str = "log.redb";

/// One member of the group as configured: its clients' address and its peers' address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub id: NodeId,
    /// Where clients, servers and mounts reach it (its `listen`); the `NotLeader` hint.
    pub meta_addr: String,
    /// Where the other members reach its Raft (its group listener).
    pub group_addr: String,
}

/// Parses `peers`: `ID=META_ADDR[/GROUP_ADDR],…`; a group address left out is the metadata
/// address with its port plus one.
pub fn parse_peers(text: &str) -> Result<Vec<Peer>, String> {
    let mut peers: Vec<Peer> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addrs) = item.split_once('=').ok_or_else(|| format!("peer {item:?} is not ID=ADDR"))?;
        let id: NodeId = id.trim().parse().map_err(|_| format!("peer {item:?}: {id:?} is not a node id"))?;
        if id == 0 {
            return Err(format!("peer {item:?}: node ids start at 1"));
        }
        let (meta_addr, group_addr) = match addrs.split_once('/') {
            Some((meta, group)) => (meta.to_string(), group.to_string()),
            None => (addrs.to_string(), port_plus_one(addrs)?),
        };
        if peers.iter().any(|p| p.id == id) {
            return Err(format!("node {id} is named twice in peers"));
        }
        peers.push(Peer { id, meta_addr, group_addr });
    }
    if peers.is_empty() {
        return Err("peers names no node".into());
    }
    Ok(peers)
}

fn port_plus_one(addr: &str) -> Result<String, String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{addr:?} has no :PORT"))?;
    let port: u16 = port.parse().map_err(|_| format!("{addr:?}: bad port"))?;
    let group = port.checked_add(1).ok_or_else(|| format!("{addr:?}: no port after it for the group"))?;
    Ok(format!("{host}:{group}"))
}

/// Proposes the handlers' batches of changes on this node (`proposals.rs` batches them).
struct Proposer {
    node: Arc<GroupNode<NamespaceMachine>>,
}

type Proposal = crate::proposals::Proposal<Proposer>;

impl crate::proposals::Propose for Proposer {
    type Change = Change;
    type Outcome = Result<Outcome, NotServed>;

    fn bytes(change: &Change) -> usize {
        change_bytes(change)
    }

    fn propose(&self, batch: Vec<Proposal>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let node = self.node.clone();
        async move { propose_batch(&node, batch).await }
    }
}

/// A started group node as the handlers use it.
pub(crate) struct Group {
    node: Arc<GroupNode<NamespaceMachine>>,
    me: NodeId,
    meta_addrs: BTreeMap<NodeId, String>,
    proposals: Arc<crate::proposals::Proposals<Proposer>>,
    quorum_wait: Duration,
    runtime: tokio::runtime::Handle,
    /// Rotates the placement ranking's start (the proposer keeps no spread memory yet).
    pub(crate) cursor: AtomicU64,
    barriers: Barriers,
    /// The term this node last started as leader (`State::lead`), 0 for none.
    led_term: parking_lot::Mutex<u64>,
    /// The namespace was seen born (`Group::born`).
    born: AtomicBool,
    grace: Grace,
    /// `flotilla meta add` waits this long for a new node to catch up (`group_catch_up_wait_ms`).
    catch_up_wait: Duration,
    _listener: GroupListener,
}

/// The grace periods a new leader starts (`lock_reclaim_ms`, `token_recovery_ms`,
/// `open_reclaim_ms`).
#[derive(Clone, Copy, Debug)]
struct Grace {
    locks: Duration,
    tokens: Duration,
    opens: Duration,
}

impl Grace {
    fn of(config: &MetaConfig) -> Grace {
        Grace {
            locks: Duration::from_millis(config.lock_reclaim_ms),
            tokens: Duration::from_millis(config.token_recovery_ms),
            opens: Duration::from_millis(config.open_reclaim_ms),
        }
    }
}

/// The read barrier's rounds: a read waits for the first round started after it arrived,
/// and one round serves every read waiting for it.
#[derive(Default)]
struct Barriers {
    rounds: parking_lot::Mutex<Rounds>,
    done: parking_lot::Condvar,
}

#[derive(Default)]
struct Rounds {
    started: u64,
    finished: u64,
    /// A thread is running rounds.
    running: bool,
    /// A read arrived during the running round: run one more.
    wanted: bool,
    /// The result of round `finished`.
    last: Option<Result<(), NotServed>>,
}

/// What [`start`] hands the service: the group, and the namespace the handlers read.
pub(crate) struct Started {
    pub group: Arc<Group>,
    pub namespace: SharedNamespace,
}

/// The group's settings from the service's.
fn timing(config: &MetaConfig) -> GroupTiming {
    GroupTiming {
        heartbeat_ms: config.group_heartbeat_ms,
        election_timeout_ms_min: config.group_election_timeout_ms_min,
        election_timeout_ms_max: config.group_election_timeout_ms_max,
        snapshot_every_entries: config.group_snapshot_every_entries.max(1),
        log_kept_behind_snapshot_entries: config.group_log_kept_behind_snapshot_entries,
    }
}

fn limits(config: &MetaConfig) -> GroupLimits {
    GroupLimits {
        batch_changes_max: config.group_batch_changes_max.max(1),
        batch_bytes_max: config.group_batch_bytes_max.max(1),
        snapshot_bytes_max: config.group_snapshot_bytes_max.max(1),
        apply_run_entries_max: config.group_apply_run_entries_max.max(1),
        ..GroupLimits::default()
    }
}

/// Opens the machine (adopting a namespace made before the group), starts the node and its
/// listener; node 1 of a brand-new group initializes the membership and proposes `Genesis`.
pub(crate) async fn start(config: &MetaConfig, path: &Path) -> anyhow::Result<Started> {
    let peers = parse_peers(&config.peers).map_err(|e| anyhow::anyhow!("[meta] peers: {e}"))?;
    let me = config.node_id;
    let mine = peers
        .iter()
        .find(|p| p.id == me)
        .with_context(|| format!("[meta] node_id {me} is not among peers {:?}", config.peers))?;
    let credential = group_credential(config)?;
    let machine = open_machine(path, peers.len(), config.join).await?;
    let namespace = machine.shared_namespace();
    let (timing, limits) = (timing(config), limits(config));
    let tcp = TcpConfig::default();
    tcp.check(&limits).context("group transport settings")?;
    let dir = config.data.clone();
    let identity = Arc::new(GroupIdentity::open(&dir).context("the metadata group's id")?);
    let transport = Arc::new(
        TcpTransport::new(credential.clone(), tcp.clone())
            .context("group transport")?
            .with_identity(identity.clone()),
    );
    let raft = raft_config(&timing, &limits).context("group timing")?;
    let node = GroupNode::start(me, &dir, machine, transport, raft, limits.clone())
        .await
        .context("start the group node")?;
    let listener = tokio::net::TcpListener::bind(&mine.group_addr)
        .await
        .with_context(|| format!("group listener on {}", mine.group_addr))?;
    let listener =
        GroupListener::start_in_group(listener, me, node.raft.clone(), credential, &tcp, identity.clone())
            .context("serve the group")?;
    let node = Arc::new(node);
    // A joining node never forms a group: it waits, empty, for the leader to add it.
    if me == 1 && !config.join {
        initialize(&node, &peers, &identity).await?;
    }
    let proposals = crate::proposals::Proposals::new(
        Proposer { node: node.clone() },
        crate::proposals::ProposalLimits {
            batch_changes_max: limits.batch_changes_max,
            batch_bytes_max: limits.batch_bytes_max,
            in_flight_max: config.group_proposals_in_flight_max.max(1),
            waiting_max: limits.batch_changes_max * 4,
        },
    );
    let group = Arc::new(Group {
        node,
        me,
        proposals,
        meta_addrs: peers.iter().map(|p| (p.id, p.meta_addr.clone())).collect(),
        quorum_wait: Duration::from_millis(config.quorum_wait_ms.max(1)),
        runtime: tokio::runtime::Handle::current(),
        cursor: AtomicU64::new(0),
        barriers: Barriers::default(),
        led_term: parking_lot::Mutex::new(0),
        born: AtomicBool::new(false),
        grace: Grace::of(config),
        catch_up_wait: Duration::from_millis(config.group_catch_up_wait_ms.max(1)),
        _listener: listener,
    });
    if me == 1 && !config.join {
        tokio::spawn(genesis(group.clone()));
    }
    tracing::info!(node = me, group = %mine.group_addr, "metadata group node started");
    Ok(Started { group, namespace })
}

fn group_credential(config: &MetaConfig) -> anyhow::Result<Arc<Credential>> {
    let key = config.group_key.as_deref().context(
        "a metadata group node needs a meta credential: set [meta] group_key or --group-key \
         (flotilla keygen issue --role meta)",
    )?;
    let credential = flotilla_auth::load_credential(Some(key), "the metadata group", Role::Meta)?;
    Ok(credential)
}

/// Opens the namespace as the group's state machine; a namespace made before the group is
/// adopted by a group of one. A larger group starts from its genesis, which would replace
/// such a namespace: refused (its other members could not catch up from the log).
async fn open_machine(path: &Path, members: usize, join: bool) -> anyhow::Result<NamespaceMachine> {
    let path = path.to_path_buf();
    let existed = path.exists();
    let opened = tokio::task::spawn_blocking(move || -> anyhow::Result<NamespaceMachine> {
        let machine = NamespaceMachine::open(&path, MachineLimits::default())?;
        if !existed || machine.born() {
            return Ok(machine);
        }
        if members == 1 && !join {
            drop(machine);
            tracing::info!(path = %path.display(), "adopting a namespace made before the group");
            return Ok(NamespaceMachine::adopt(&path, MachineLimits::default())?);
        }
        let inodes = machine.namespace()?.inode_count().map_err(|e| anyhow::anyhow!("count inodes: {e}"))?;
        anyhow::ensure!(
            inodes <= 1,
            "{} holds a namespace made before the group ({inodes} inodes); a group of {members} would \
             start from an empty one{}. Take it over with a group of one (--peers naming this node \
             alone), then grow that group with `flotilla meta add`",
            path.display(),
            if join { " (a joining node starts empty and catches up from the group)" } else { "" }
        );
        Ok(machine)
    });
    opened.await?.context("open the namespace as the group's state machine")
}

/// Node 1 of a brand-new group names its members (nothing if the group has a log already).
/// The group's id (`group.id`, carried in every Raft request) is made first; the other
/// members take it from the first request they receive.
async fn initialize(
    node: &GroupNode<NamespaceMachine>,
    peers: &[Peer],
    identity: &GroupIdentity,
) -> anyhow::Result<()> {
    if node.raft.is_initialized().await.map_err(|e| anyhow::anyhow!("read the group's state: {e}"))? {
        return Ok(());
    }
    let id = identity.create().context("make the group's id")?;
    tracing::info!(group = %format!("{id:016x}"), "made the metadata group's id");
    let members: BTreeMap<NodeId, openraft::BasicNode> = peers
        .iter()
        .map(|p| (p.id, openraft::BasicNode { addr: member_address(&p.meta_addr, &p.group_addr) }))
        .collect();
    node.raft.initialize(members).await.map_err(|e| anyhow::anyhow!("initialize the group: {e}"))?;
    tracing::info!(members = peers.len(), "initialized a new metadata group");
    Ok(())
}

/// Proposes the namespace's `Genesis` until it is applied (node 1, while it leads).
async fn genesis(group: Arc<Group>) {
    loop {
        let born = group.node.state.with_state(|m| m.born());
        if born {
            return;
        }
        if group.is_leader() {
            let change = NamespaceChange::new(Caller::root(), now_ns(), Op::Genesis { id_key: id_key() });
            match change.encode() {
                Ok(body) => {
                    let change =
                        Change { session_id: SESSION_NONE, sequence: 0, acknowledged_through: 0, body };
                    let batch = Batch::new(now_ms(), vec![change]);
                    if let Err(error) = group.node.propose(batch).await {
                        tracing::debug!(%error, "genesis not proposed yet");
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "cannot encode the genesis");
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn id_key() -> [u8; flotilla_namespace::ID_KEY_BYTES] {
    use rand::TryRngCore;
    let mut key = [0u8; flotilla_namespace::ID_KEY_BYTES];
    if rand::rngs::OsRng.try_fill_bytes(&mut key).is_err() {
        // No OS randomness: the clock still gives each group its own key.
        key[..8].copy_from_slice(&now_ns().to_le_bytes());
        key[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    }
    key
}

fn change_bytes(change: &Change) -> usize {
    flotilla_metagroup::types::CHANGE_HEADER_BYTES + change.body.len()
}

async fn propose_batch(node: &GroupNode<NamespaceMachine>, proposals: Vec<Proposal>) {
    let (changes, replies): (Vec<Change>, Vec<_>) =
        proposals.into_iter().map(|p| (p.change, p.reply)).unzip();
    let outcomes = match node.propose(Batch::new(now_ms(), changes)).await {
        Ok(committed) => match BatchReply::decode(&committed.reply.bytes) {
            Ok(reply) if reply.outcomes.len() == replies.len() => Ok(reply.outcomes),
            Ok(reply) => Err(format!("{} outcomes for {} changes", reply.outcomes.len(), replies.len())),
            Err(error) => Err(error.to_string()),
        },
        // A proposal refused as "not the leader" may have been appended before this node
        // stepped down, and may still commit under the next leader: its outcome is unknown,
        // which is `NoQuorum` (protocol.md), never `NotLeader` (safe to send anywhere).
        Err(error) => {
            tracing::warn!(%error, "a proposal failed");
            for reply in replies {
                let _ = reply.send(Err(NotServed::NoQuorum));
            }
            return;
        }
    };
    match outcomes {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            tracing::error!(%error, "a batch's reply does not decode");
            for reply in replies {
                let _ = reply.send(Ok(Outcome::Invalid(error.clone())));
            }
        }
    }
}

impl Group {
    /// This node leads (as far as it knows).
    pub(crate) fn is_leader(&self) -> bool {
        let metrics = self.node.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state.is_leader() && metrics.current_leader == Some(self.me)
    }

    /// The term this node leads in; else the `NotLeader` answer with the leader's metadata
    /// address.
    fn leading_term(&self) -> Result<u64, NotServed> {
        let metrics = self.node.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.state.is_leader() && metrics.current_leader == Some(self.me) {
            return Ok(metrics.current_term);
        }
        // A node that believes it leads but does not (yet) names no leader, so a client
        // does not come straight back to it.
        let leader = metrics.current_leader.filter(|id| *id != self.me);
        drop(metrics);
        Err(NotServed::NotLeader { leader: leader.and_then(|id| self.meta_addr_of(id)) })
    }

    /// Node `id`'s clients' address: as the membership records it (members added online),
    /// else as `peers` names it.
    fn meta_addr_of(&self, id: NodeId) -> Option<String> {
        let recorded = {
            let metrics = self.node.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            membership
                .get_node(&id)
                .and_then(|n| flotilla_metagroup::meta_address(&n.addr).map(str::to_string))
        };
        recorded.or_else(|| self.meta_addrs.get(&id).cloned())
    }

    /// This node leads in a term it has not started yet.
    fn term_to_start(&self) -> bool {
        self.leading_term().is_ok_and(|term| term != *self.led_term.lock())
    }

    /// This node leads and has applied every entry of its log (so no change it proposed is
    /// still on its way).
    pub(crate) fn all_applied(&self) -> bool {
        let metrics = self.node.raft.metrics();
        let metrics = metrics.borrow();
        let applied = metrics.last_applied.map(|id| id.index);
        metrics.state.is_leader()
            && metrics.current_leader == Some(self.me)
            && applied >= metrics.last_log_index
    }

    /// The namespace had its genesis (or was adopted). Once true it stays true (a genesis is
    /// applied once, and every snapshot after it is of a born namespace), so it is latched:
    /// every request asks, and the state machine's lock is held while a run of entries is
    /// applied.
    pub(crate) fn born(&self) -> bool {
        if self.born.load(Ordering::Acquire) {
            return true;
        }
        let born = self.node.state.with_state(|machine| machine.born());
        if born {
            self.born.store(true, Ordering::Release);
        }
        born
    }

    /// The leader's answer if `error` says this node is not it.
    fn not_leader(&self, error: &GroupError) -> NotServed {
        match error {
            GroupError::NotLeader { leader, .. } => {
                NotServed::NotLeader { leader: leader.and_then(|id| self.meta_addr_of(id)) }
            }
            _ => NotServed::NoQuorum,
        }
    }

    /// Proposes one change and waits (at most `quorum_wait_ms`) for its outcome; called from
    /// the handlers' blocking threads, which propose the batches themselves
    /// (`proposals.rs`). A change refused because too many wait was never proposed; either
    /// way the caller hears `NoQuorum` (outcome unknown, resent by its class).
    pub(crate) fn propose_blocking(&self, change: Change) -> Result<Outcome, NotServed> {
        match self.runtime.block_on(self.proposals.propose(change, self.quorum_wait)) {
            Ok(result) => result,
            Err(_) => Err(NotServed::NoQuorum),
        }
    }

    /// Waits until a read on this node is linearizable (read index): for the first round
    /// of the barrier that started after the call; reads arriving together share one round.
    /// A round waits at most `quorum_wait_ms`.
    pub(crate) fn read_barrier_blocking(&self) -> Result<(), NotServed> {
        let mut rounds = self.barriers.rounds.lock();
        if rounds.running {
            rounds.wanted = true;
            let mine = rounds.started + 1;
            while rounds.finished < mine {
                self.barriers.done.wait(&mut rounds);
            }
            return rounds.last.clone().unwrap_or(Err(NotServed::NoQuorum));
        }
        rounds.running = true;
        rounds.started += 1;
        drop(rounds);
        let mut mine = None;
        loop {
            let result = self.barrier_round();
            let mut rounds = self.barriers.rounds.lock();
            rounds.finished = rounds.started;
            rounds.last = Some(result.clone());
            self.barriers.done.notify_all();
            mine.get_or_insert(result);
            if !rounds.wanted {
                rounds.running = false;
                return mine.unwrap_or(Err(NotServed::NoQuorum));
            }
            rounds.wanted = false;
            rounds.started += 1;
        }
    }

    /// One read-index round, bounded by `quorum_wait_ms`.
    fn barrier_round(&self) -> Result<(), NotServed> {
        self.runtime.block_on(async {
            match tokio::time::timeout(self.quorum_wait, self.node.read_barrier()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(self.not_leader(&error)),
                Err(_) => Err(NotServed::NoQuorum),
            }
        })
    }

    /// Proposes `op` outside any session (orphan release, target records); its result.
    pub(crate) fn write_blocking(&self, op: Op) -> Result<Applied, WireError> {
        let body = NamespaceChange::new(Caller::root(), now_ns(), op).encode().map_err(invalid)?;
        let change = Change { session_id: SESSION_NONE, sequence: 0, acknowledged_through: 0, body };
        match self.propose_blocking(change).map_err(not_served)? {
            Outcome::Applied { result, .. } | Outcome::Replayed(result) => result,
            Outcome::Refused(error) => Err(refused(&error)),
            Outcome::Invalid(reason) => Err(WireError::new(ErrorCode::Io, reason)),
        }
    }

    /// Stops the node (its files stay).
    pub(crate) fn stop(&self) {
        let raft = self.node.raft.clone();
        self.runtime.spawn(async move {
            let _ = raft.shutdown().await;
        });
    }
}

impl Group {
    /// `MetaRequest::GroupMembership` (the caller was checked to be an admin): the status
    /// from this node's view; an add or remove on the leader, waiting for it to commit.
    pub(crate) fn membership(
        &self,
        request: flotilla_proto::GroupMembershipRequest,
    ) -> Result<flotilla_proto::MetaReply, WireError> {
        use flotilla_proto::{GroupMembershipRequest as R, MetaReply, GROUP_ADDRESS_BYTES_MAX};
        let outcome = match request {
            R::Status => return Ok(MetaReply::GroupStatus(self.status())),
            R::Add { node_id, meta_addr, group_addr } => {
                for (what, addr) in [("meta_addr", &meta_addr), ("group_addr", &group_addr)] {
                    if addr.len() > GROUP_ADDRESS_BYTES_MAX
                        || addr.rsplit_once(':').is_none()
                        || addr.contains('/')
                    {
                        return Err(invalid(format!(
                            "add node {node_id}: {what} {addr:?} is not HOST:PORT of at most \
                             {GROUP_ADDRESS_BYTES_MAX} bytes"
                        )));
                    }
                }
                self.runtime.block_on(self.node.add_member(
                    node_id,
                    &meta_addr,
                    &group_addr,
                    self.catch_up_wait,
                ))
            }
            R::Remove { node_id } => self.runtime.block_on(self.node.remove_member(node_id)),
        };
        match outcome {
            Ok(()) => Ok(MetaReply::GroupStatus(self.status())),
            Err(MembershipError::NotLeader { leader }) => Ok(MetaReply::NotServed(NotServed::NotLeader {
                leader: leader.filter(|id| *id != self.me).and_then(|id| self.meta_addr_of(id)),
            })),
            Err(error @ (MembershipError::CatchUpTimeout { .. } | MembershipError::Raft(_))) => {
                Err(WireError::new(ErrorCode::Unavailable, error.to_string()))
            }
            Err(error @ MembershipError::UnknownNode { .. }) => {
                Err(WireError::new(ErrorCode::NotFound, error.to_string()))
            }
            Err(error) => Err(invalid(error)),
        }
    }

    /// This node's view of the group.
    fn status(&self) -> flotilla_proto::GroupStatus {
        let view = self.node.view();
        flotilla_proto::GroupStatus {
            node_id: view.me,
            role: view.role.to_string(),
            leader: view.leader,
            term: view.term,
            applied_index: view.applied_index,
            last_log_index: view.last_log_index,
            snapshot_index: view.snapshot_index,
            purged_index: view.purged_index,
            members: view
                .members
                .into_iter()
                .map(|m| flotilla_proto::GroupMemberInfo {
                    node_id: m.id,
                    meta_addr: m.meta_addr.or_else(|| self.meta_addrs.get(&m.id).cloned()),
                    group_addr: m.group_addr,
                    voter: m.voter,
                    log_index: m.log_index,
                })
                .collect(),
        }
    }
}

/// A change's identity in the client's own group session (`MetaRequest::Sequenced`): the
/// leader proposes it under this identity, so a resend to any node after a failover gets
/// the first reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sequenced {
    pub session: u64,
    pub sequence: u64,
    pub acknowledged_through: u64,
}

impl Group {
    /// Opens a session in the group's reply table: a client's own (`OpenGroupSession`,
    /// owned by its credential `owner`), or a connection's (`None`: the service's own).
    fn open_session(&self, owner: Option<&str>) -> Result<u64, NotServed> {
        let op = match owner {
            Some(owner) => Op::OpenSessionFor { owner: owner.to_string() },
            None => Op::OpenSession,
        };
        let body =
            NamespaceChange::new(Caller::root(), now_ns(), op).encode().map_err(|_| NotServed::NoQuorum)?;
        let change = Change { session_id: SESSION_NONE, sequence: 0, acknowledged_through: 0, body };
        match self.propose_blocking(change)? {
            Outcome::Applied { result: Ok(Applied::Session(opened)), .. } => Ok(opened),
            other => {
                tracing::warn!(?other, "a client's group session was not opened");
                Err(NotServed::NoQuorum)
            }
        }
    }

    /// Proposes `change` under the client's own (session, sequence).
    fn propose_sequenced(&self, change: &NamespaceChange, id: Sequenced) -> Result<Outcome, NotServed> {
        let body = change.encode().map_err(|_| NotServed::NoQuorum)?;
        let change = Change {
            session_id: id.session,
            sequence: id.sequence,
            acknowledged_through: id.acknowledged_through,
            body,
        };
        self.propose_blocking(change)
    }
}

/// Test hook, compiled into debug builds only: a node whose environment names
/// `FLOTILLA_TEST_KILL_AFTER_COMMIT=TEXT` kills itself (SIGKILL) right after a change whose
/// request's debug form contains `TEXT` was applied, before answering it, so a test can
/// lose the reply of a committed change (`meta_exactly_once.rs`). Release builds have no
/// such hook.
#[cfg(debug_assertions)]
fn kill_after_commit_hook(request: &flotilla_proto::MetaRequest) {
    let Ok(text) = std::env::var("FLOTILLA_TEST_KILL_AFTER_COMMIT") else { return };
    if text.is_empty() || !format!("{request:?}").contains(&text) {
        return;
    }
    tracing::warn!(?request, "test hook: killed after the change committed, before the reply");
    // SAFETY: kill(2) with this process's own id and a valid signal has no memory effects.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}

#[cfg(not(debug_assertions))]
fn kill_after_commit_hook(_request: &flotilla_proto::MetaRequest) {}

/// A client connection's group session: opened at its first change, numbering its changes.
#[derive(Default)]
pub(crate) struct ClientSession {
    id: parking_lot::Mutex<Option<u64>>,
    sequence: AtomicU64,
}

impl ClientSession {
    /// The session's id, opening it first if needed.
    fn id(&self, group: &Group) -> Result<u64, NotServed> {
        let mut id = self.id.lock();
        if let Some(id) = *id {
            return Ok(id);
        }
        let opened = group.open_session(None)?;
        *id = Some(opened);
        self.sequence.store(0, Ordering::Relaxed);
        Ok(opened)
    }

    /// Forgets the session (it expired in the group): the next change opens another.
    fn reset(&self) {
        *self.id.lock() = None;
    }

    /// The session to close when the connection ends.
    pub(crate) fn opened(&self) -> Option<u64> {
        // Not waiting for a session being opened: an unclosed session expires anyway.
        self.id.try_lock().and_then(|id| *id)
    }

    /// Proposes `change` in this session; a session the group forgot is opened again once.
    pub(crate) fn propose(&self, group: &Group, change: &NamespaceChange) -> Result<Outcome, NotServed> {
        let body = change.encode().map_err(|_| NotServed::NoQuorum)?;
        for _ in 0..2 {
            let session_id = self.id(group)?;
            let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
            let change = Change { session_id, sequence, acknowledged_through: 0, body: body.clone() };
            match group.propose_blocking(change)? {
                Outcome::Refused(ReplyError::UnknownSession { .. }) => self.reset(),
                outcome => return Ok(outcome),
            }
        }
        Err(NotServed::NoQuorum)
    }
}

/// Closes a connection's session in the group (best effort: it expires anyway).
pub(crate) fn close_session(group: Arc<Group>, session_id: u64) {
    tokio::task::spawn_blocking(move || {
        if group.is_leader() {
            let _ = group.write_blocking(Op::CloseSession { session_id });
        }
    });
}

/// Requests that read no replicated state and change only the leader's own table of opens
/// (`Closed`, `KeepOpen`): served once `State::lead` found this node leading in a started
/// term, without a read barrier (a quorum round each; every file a client closes sends
/// one). A deposed leader serving one changes only a table no other leader uses (the next
/// one rebuilds its own from the clients' reclaims), and an orphan it would release goes
/// through the group as a proposal, which needs a quorum.
fn leader_local(request: &flotilla_proto::MetaRequest) -> bool {
    matches!(
        request,
        flotilla_proto::MetaRequest::Closed { .. } | flotilla_proto::MetaRequest::KeepOpen { .. }
    )
}

/// Why a sequenced change is not proposed.
enum SessionRefusal {
    NotServed(NotServed),
    Refused(WireError),
}

pub(crate) fn not_served(reason: NotServed) -> WireError {
    WireError::new(ErrorCode::Unavailable, reason.to_string())
}

pub(crate) fn refused(error: &ReplyError) -> WireError {
    WireError::new(ErrorCode::Unavailable, format!("the metadata group refused the change: {error}"))
}

fn invalid(error: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::BadRequest, error.to_string())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The chain table of a group node: the leader's engine proposes its changes
/// (`Op::ChainChanges`) and they are told to anyone only once applied here.
pub(crate) struct GroupChains<'a> {
    pub(crate) group: &'a Group,
    pub(crate) state: &'a crate::handle::State,
}

impl crate::chains::ChainStore for GroupChains<'_> {
    fn stored(&self) -> Result<flotilla_namespace::StoredChains, WireError> {
        self.state.ns()?.chain_table().map_err(crate::handle::wire)
    }

    fn record(&self, change: flotilla_namespace::ChainChange<'_>) -> Result<(), WireError> {
        use crate::replicated::{ChainRow, ChainTargetRow};
        let op = Op::ChainChanges {
            replicas: change.replicas,
            chains: change.chains.iter().map(|c| ChainRow::of(c)).collect(),
            targets: change
                .targets
                .iter()
                .map(|(target, record)| ChainTargetRow {
                    target: *target,
                    group: record.group.to_string(),
                    incarnation: record.incarnation.map(|i| i.0),
                    dead: record.dead,
                    draining: record.draining,
                })
                .collect(),
        };
        self.group.write_blocking(op).map(|_| ())
    }

    fn settled(&self) -> bool {
        self.group.all_applied()
    }
}

/// What a proposing leader knows that replicas must not decide themselves.
impl crate::replicated::propose::ProposerView for crate::handle::State {
    fn ranked_targets(&self) -> Vec<flotilla_types::TargetId> {
        let cursor = self.group.as_ref().map_or(0, |g| g.cursor.fetch_add(1, Ordering::Relaxed));
        let live = self.membership.live();
        flotilla_namespace::rank_targets(&live, cursor, &flotilla_namespace::Spread::default())
            .unwrap_or_default()
    }

    fn open_hint(&self, at: &crate::replicated::Place) -> crate::replicated::OpenHint {
        use crate::replicated::{OpenHint, Place};
        let Ok(ns) = self.ns() else { return OpenHint::Unknown };
        let root = Caller::root();
        let found = match at {
            Place::Path(path) => ns.lookup_as(&root, path),
            Place::At { parent, name } => ns.lookup_at(&root, *parent, name),
        };
        match found {
            Ok(entry) => {
                let open = self.opens.lock().may_be_open(entry.id, std::time::Instant::now());
                OpenHint::Found { id: entry.id, open }
            }
            Err(_) => OpenHint::Unknown,
        }
    }
}

/// Starts each term this node leads as soon as it is elected (requests start it too, if
/// they come first: [`State::lead`](crate::handle::State::lead)).
pub(crate) async fn watch_leadership(state: Arc<crate::handle::State>, group: Arc<Group>) {
    let mut metrics = group.node.raft.metrics();
    loop {
        if group.term_to_start() {
            let state = state.clone();
            let group = group.clone();
            let _ = tokio::task::spawn_blocking(move || state.lead(&group)).await;
        }
        if metrics.changed().await.is_err() {
            // The node stopped: nothing to lead.
            return std::future::pending().await;
        }
    }
}

impl crate::handle::State {
    /// `Ok` if this node leads, once its term has started: the first call in a new term
    /// forgets the locks, tokens and opens of any earlier term (a deposed leader's, or
    /// nothing on a follower) and starts the grace periods — only reclaimed locks granted
    /// for `lock_reclaim_ms`, no token for `token_recovery_ms` (holders polling are told
    /// their tokens are lost), no orphan released for `open_reclaim_ms`, and the orphans
    /// read again from the namespace. A namespace not born yet had no clients: no grace.
    /// Every request and the orphan sweep pass here, so nothing is served in a term before
    /// it started.
    pub(crate) fn lead(&self, group: &Group) -> Result<(), NotServed> {
        let term = group.leading_term()?;
        let mut led = group.led_term.lock();
        if *led == term {
            return Ok(());
        }
        // Everything committed under earlier terms applied here first (read index), so the
        // chain table this term starts from is the last leader's, whole.
        group.read_barrier_blocking()?;
        if let Err(error) = self.chains.reload(&GroupChains { group, state: self }) {
            tracing::error!(%error, "a new leader cannot load the chain table");
            return Err(NotServed::NoQuorum);
        }
        let now = std::time::Instant::now();
        let grace = if group.born() {
            group.grace
        } else {
            Grace { locks: Duration::ZERO, tokens: Duration::ZERO, opens: Duration::ZERO }
        };
        // The I/O servers heartbeat to the leader only: until they found this one, creates
        // wait for the targets the namespace remembers, as after a restart.
        *self.recovery_until.lock() = now + self.recovery_window;
        self.locks.begin_grace(now + grace.locks);
        self.tokens.begin_grace(now + grace.tokens);
        // Jobs are reclaimed by their members for as long as opens are.
        self.jobs.begin_grace(now + grace.opens);
        if group.born() {
            // Inode tokens are outlived, not reclaimed: no change acknowledged until every
            // cache an earlier leader covered went stale (inode_tokens.rs).
            self.inode_tokens.begin_term(now, term);
        }
        let orphans = self.ns().ok().map(|ns| ns.orphans(crate::service::ORPHANS_LOADED_MAX));
        let mut opens = self.opens.lock();
        opens.begin_grace(now + grace.opens);
        match orphans {
            Some(Ok(orphans)) => opens.replace_orphans(orphans),
            Some(Err(error)) => {
                tracing::warn!(%error, "a new leader cannot list the orphans; keeps those it knew")
            }
            None => tracing::warn!("a new leader has no namespace to list the orphans of"),
        }
        drop(opens);
        tracing::info!(term, ?grace, "leading a new term: locks, tokens, opens and jobs are reclaimed");
        *led = term;
        Ok(())
    }

    /// A request on a group node: `NotLeader` off the leader; on it, a change is proposed
    /// and its result answered as the direct path answers it, anything else is served after
    /// a read barrier.
    pub(crate) fn on_group(
        &self,
        group: &Group,
        request: flotilla_proto::MetaRequest,
        asker: &crate::handle::Asker,
        (session, sequenced): (&ClientSession, Option<Sequenced>),
    ) -> Result<flotilla_proto::MetaReply, WireError> {
        use flotilla_proto::MetaReply;
        if let Err(reason) = self.lead(group) {
            return Ok(MetaReply::NotServed(reason));
        }
        if !group.born() {
            // A brand-new group whose genesis is not applied yet is still forming: nothing is
            // proposed, so the caller may go anywhere, and it waits (within its outage wait)
            // as during an election rather than failing.
            return Ok(MetaReply::NotServed(NotServed::NotLeader { leader: None }));
        }
        if matches!(request, flotilla_proto::MetaRequest::OpenGroupSession) {
            return Ok(match group.open_session(Some(asker.holder)) {
                Ok(session) => MetaReply::GroupSession { session },
                Err(reason) => MetaReply::NotServed(reason),
            });
        }
        self.check_before_proposing(&request, asker)?;
        let change = match self.chained_create(&request, asker.who)? {
            Some(op) => Some(NamespaceChange::new(asker.who.clone(), now_ns(), op)),
            None => crate::replicated::propose::change_for(&request, asker.who, now_ns(), self)?,
        };
        let Some(change) = change else {
            if !leader_local(&request) {
                if let Err(reason) = group.read_barrier_blocking() {
                    return Ok(MetaReply::NotServed(reason));
                }
            }
            return self.dispatch(request, asker);
        };
        if let Some(id) = sequenced {
            match self.session_usable(group, id.session, asker.holder) {
                Ok(()) => {}
                Err(SessionRefusal::NotServed(reason)) => return Ok(MetaReply::NotServed(reason)),
                Err(SessionRefusal::Refused(error)) => return Err(error),
            }
        }
        let proposed = match sequenced {
            Some(id) => group.propose_sequenced(&change, id),
            None => session.propose(group, &change),
        };
        let outcome = match proposed {
            Ok(outcome) => outcome,
            Err(reason) => return Ok(MetaReply::NotServed(reason)),
        };
        let result = match outcome {
            Outcome::Applied { result, touched } => {
                kill_after_commit_hook(&request);
                self.revoke_inodes(&touched);
                result
            }
            Outcome::Replayed(result) => {
                if let Some(id) = sequenced {
                    tracing::info!(
                        session = id.session,
                        sequence = id.sequence,
                        "a resent change answered with its first reply (applied once)"
                    );
                }
                result
            }
            Outcome::Refused(error @ (ReplyError::UnknownSession { .. } | ReplyError::Forgotten { .. }))
                if sequenced.is_some() =>
            {
                return Err(WireError::new(
                    ErrorCode::SessionExpired,
                    format!("the metadata group forgot this change's session or reply: {error}"),
                ))
            }
            Outcome::Refused(error) => return Err(refused(&error)),
            Outcome::Invalid(reason) => return Err(WireError::new(ErrorCode::Io, reason)),
        };
        self.answer(request, result?, asker)
    }

    /// Whether the client with credential `who` may send changes in group session `session`
    /// (issue 33: a session is bound to the credential that opened it). Checked on the
    /// leader before proposing, against its applied state; a session not found there is
    /// looked for again after a read barrier (the leader has then applied everything
    /// committed when the request came, so every session any leader handed out before is
    /// known), and answered `SessionExpired` if still unknown — never proposed, so a guessed
    /// id of a session opened later cannot be used either. Ids are never reused and an
    /// owner never changes, so the check cannot go stale before the change is applied.
    fn session_usable(&self, group: &Group, session: u64, who: &str) -> Result<(), SessionRefusal> {
        use flotilla_metagroup::reply_table::Usable;
        let record_bytes_max = MachineLimits::default().record_bytes_max;
        let look = || -> Result<Option<Usable>, SessionRefusal> {
            let ns = self.ns().map_err(SessionRefusal::Refused)?;
            let stored = crate::replicated::stored_session(&ns, session, record_bytes_max)
                .map_err(|e| SessionRefusal::Refused(WireError::new(ErrorCode::Io, e.to_string())))?;
            Ok(stored.map(|s| s.usable_by(who)))
        };
        let usable = match look()? {
            Some(usable) => usable,
            None => {
                group.read_barrier_blocking().map_err(SessionRefusal::NotServed)?;
                look()?.unwrap_or(Usable::Unknown)
            }
        };
        match usable {
            Usable::Yes => Ok(()),
            Usable::Unknown => Err(SessionRefusal::Refused(WireError::new(
                ErrorCode::SessionExpired,
                format!("group session {session} is unknown or expired: open a new one"),
            ))),
            Usable::Unowned => Err(SessionRefusal::Refused(WireError::new(
                ErrorCode::SessionExpired,
                format!("group session {session} is not a client's session (none opened it with OpenGroupSession): open your own"),
            ))),
            Usable::OtherOwner(_) => {
                tracing::warn!(session, who, "a change in another credential's group session refused");
                Err(SessionRefusal::Refused(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "group session {session} was opened by another client's credential, not by {who:?}: \
                         a session is usable only by the credential that opened it; open your own (OpenGroupSession)"
                    ),
                )))
            }
        }
    }

    /// The checks the direct path makes before executing a change (layout bounds, a
    /// create's wait for remembered targets, a grower's write right).
    fn check_before_proposing(
        &self,
        request: &flotilla_proto::MetaRequest,
        asker: &crate::handle::Asker,
    ) -> Result<(), WireError> {
        use flotilla_proto::MetaRequest as R;
        match request {
            R::Create { spec, .. }
            | R::CreateOpen { spec, .. }
            | R::CreateOpenCached { spec, .. }
            | R::CreateAt { spec, .. }
            | R::CreateAtOpen { spec, .. }
            | R::CreateReplicated { spec, .. } => self.prepare_create(asker.who, spec.clone()).map(|_| ()),
            R::SetLayout { layout, .. } | R::SetLayoutId { layout, .. } => self.check_layout(layout.as_ref()),
            R::GrowSize { id, .. } => self.require_writer(*id, asker),
            _ => Ok(()),
        }
    }

    /// A create whose file gets more than one replica (`CreateReplicated`, or any create in
    /// a directory whose default is replicated): the proposer checks it as the direct path
    /// does and places it on chains of its table (the leader's, which every node holds the
    /// same through the log), carried in the change as a plain file's ranking is.
    fn chained_create(
        &self,
        request: &flotilla_proto::MetaRequest,
        who: &Caller,
    ) -> Result<Option<Op>, WireError> {
        use crate::replicated::Place;
        use flotilla_proto::MetaRequest as R;
        let (at, spec, asked) = match request {
            R::CreateReplicated { path, spec, replicas } => {
                (Place::Path(path.clone()), spec, Some(*replicas))
            }
            R::Create { path, spec }
            | R::CreateOpen { path, spec, .. }
            | R::CreateOpenCached { path, spec, .. } => (Place::Path(path.clone()), spec, None),
            R::CreateAt { parent, name, spec } | R::CreateAtOpen { parent, name, spec, .. } => {
                (Place::At { parent: *parent, name: crate::handle_at::name(name)?.to_vec() }, spec, None)
            }
            _ => return Ok(None),
        };
        let ns = self.ns()?;
        let parent = match &at {
            Place::Path(path) => {
                let parent = match path.trim_end_matches('/').rsplit_once('/') {
                    Some(("", _)) | None => "/",
                    Some((parent, _)) => parent,
                };
                ns.lookup_follow(parent).ok()
            }
            Place::At { parent, .. } => ns.get(*parent).ok(),
        };
        let (default_layout, default_replicas) =
            parent.map(|p| (p.default_layout, p.default_replicas)).unwrap_or((None, 1));
        let replicas = asked.unwrap_or(default_replicas);
        if replicas <= 1 {
            return Ok(None);
        }
        let (create, live) = self.prepare_create(who, spec.clone())?;
        self.check_replicas(spec.layout.or(default_layout), replicas, &live)?;
        let chains = self.place_with_default(&create, default_layout, replicas)?;
        let replicas = u8::try_from(replicas)
            .map_err(|_| WireError::new(ErrorCode::InvalidArgument, format!("{replicas} replicas")))?;
        Ok(Some(Op::CreateChained {
            at,
            owner: create.owner.into(),
            subfile_count: create.subfile_count,
            layout: create.layout,
            exclusive: create.exclusive,
            replicas,
            chains,
        }))
    }

    fn revoke_inodes(&self, touched: &[crate::replicated::TouchedInode]) {
        use crate::replicated::TouchedInode;
        let touched: Vec<flotilla_namespace::Touched> = touched
            .iter()
            .map(|t| match t {
                TouchedInode::Attr(id) => flotilla_namespace::Touched::Attr(*id),
                TouchedInode::Names(id) => flotilla_namespace::Touched::Names(*id),
            })
            .collect();
        self.revoke_touched(&touched);
    }

    /// The reply the direct path gives for `request`, from the change's applied value.
    fn answer(
        &self,
        request: flotilla_proto::MetaRequest,
        applied: Applied,
        asker: &crate::handle::Asker,
    ) -> Result<flotilla_proto::MetaReply, WireError> {
        use flotilla_proto::{MetaReply, MetaRequest as R};
        let entry = match applied {
            Applied::Entry(entry) => {
                let entry = entry.into_entry();
                // The reply carries no chains and no default replica count: a replicated
                // file or a directory with a default is read back (applied here already).
                let replicated =
                    entry.file.as_ref().map_or(entry.default_layout.is_some(), |f| f.replicas > 1);
                match replicated {
                    true => self.ns()?.get(entry.id).unwrap_or(entry),
                    false => entry,
                }
            }
            Applied::Attributes(attrs) => return Ok(MetaReply::Attributes(attrs)),
            Applied::Removed { orphaned } => {
                if let Some(id) = orphaned {
                    self.opens.lock().add_orphan(id);
                }
                return Ok(MetaReply::Done);
            }
            Applied::Done | Applied::Released(_) | Applied::Session(_) => return Ok(MetaReply::Done),
        };
        let reply = match request {
            R::Mkdir { .. }
            | R::MkdirAt { .. }
            | R::MknodAt { .. }
            | R::Symlink { .. }
            | R::SymlinkAt { .. } => MetaReply::Entry(self.info(entry)),
            R::CreateOpen { session, .. } | R::CreateAtOpen { session, .. } => {
                MetaReply::Entry(self.granted(self.opened(session, entry.id)?, asker))
            }
            R::CreateOpenCached { path, session, .. } => {
                let id = self.opened(session, entry.id)?.id;
                return self.lookup_cached(&path, session, asker, Some(id));
            }
            R::SetNoOverlapId { id, no_overlap } => {
                self.tokens.set_no_overlap(id, no_overlap);
                MetaReply::Entry(self.granted(entry, asker))
            }
            _ => MetaReply::Entry(self.granted(entry, asker)),
        };
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_with_and_without_a_group_address() {
        let peers = parse_peers("1=10.0.0.1:7770, 2=10.0.0.2:7770/10.0.0.2:9000").unwrap();
        assert_eq!(peers[0].group_addr, "10.0.0.1:7771");
        assert_eq!(peers[1].meta_addr, "10.0.0.2:7770");
        assert_eq!(peers[1].group_addr, "10.0.0.2:9000");
        for bad in ["", "1", "0=a:1", "x=a:1", "1=a:1,1=b:1", "1=nohost"] {
            assert!(parse_peers(bad).is_err(), "{bad:?} parsed");
        }
    }
}
