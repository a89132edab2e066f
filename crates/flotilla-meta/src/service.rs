//! The metadata service's network side: accept, read frames, execute on blocking threads,
//! write replies. A bad frame ends only its own connection.

use crate::admission::admit;
use crate::config::MetaConfig;
use crate::grouped::ClientSession;
use crate::handle::{Issuer, State};
use crate::membership::Membership;
use crate::metrics::MetaMetrics;
use crate::opens::OpenTable;
use flotilla_auth::{Acceptor, AuthBounds, Opener, Peer, Role, Sealer, Secured};

/// Orphans loaded at start (more are found by later restarts as these are released).
pub(crate) const ORPHANS_LOADED_MAX: usize = 1 << 20;
use anyhow::Context;
use bytes::BytesMut;
use flotilla_namespace::{GroupCommit, Namespace};
use flotilla_proto::{
    decode_body, encode_body, read_frame_bounded_opened, with_progress, Counted, ErrorCode, FrameBudget,
    FrameError, MetaReply, MetaRequest, ProgressRule, ReadBounds, Reservation, WireError,
};
use flotilla_types::CallerPolicy;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Name of the namespace database inside the data directory.
pub const NAMESPACE_FILE: &str = "namespace.redb";

/// A bound metadata service.
pub struct MetaService {
    config: MetaConfig,
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Arc<State>,
    acceptor: Arc<Acceptor>,
    metrics: Arc<MetaMetrics>,
}

/// Binds and serves until `shutdown` completes.
pub async fn run(config: MetaConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    MetaService::bind(config).await?.serve(shutdown).await
}

impl MetaService {
    /// Opens (or creates) the namespace and binds the listener.
    pub async fn bind(config: MetaConfig) -> anyhow::Result<MetaService> {
        let credential =
            flotilla_auth::load_credential(config.key.as_deref(), "the metadata service", Role::Server)?;
        std::fs::create_dir_all(&config.data)
            .with_context(|| format!("create data directory {:?}", config.data))?;
        let path = config.data.join(NAMESPACE_FILE);
        let (namespace, group) = match config.node_id {
            0 => (direct_namespace(&config, path).await?, None),
            _ => {
                let started = crate::grouped::start(&config, &path).await?;
                (started.namespace, Some(started.group))
            }
        };
        let Some(opened) = namespace.read().clone() else { anyhow::bail!("the namespace did not open") };
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("listen on {}", config.listen))?;
        let local_addr = listener.local_addr().context("read the bound address")?;
        let owners = opened.target_owners().context("load target bindings")?;
        let membership = Membership::new(Duration::from_millis(config.down_after_ms), owners);
        let secret = credential.capability_key().context(
            "the metadata service's credential carries no capability key (issue it with the server role)",
        )?;
        let issuer = Issuer {
            key: flotilla_auth::CapabilityKey::new(secret),
            lifetime_ms: config.capability_lifetime_ms.max(1),
        };
        let state = Arc::new(new_state(&config, (namespace, group), membership, issuer)?);
        let acceptor =
            Arc::new(Acceptor::new(credential, vec![Role::Client, Role::Server], auth_bounds(&config)));
        let metrics = Arc::new(MetaMetrics::default());
        Ok(MetaService { config, listener, local_addr, state, acceptor, metrics })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// On a metadata group node: it leads and its namespace had its genesis (ready for
    /// changes). `false` on the direct path.
    pub fn group_ready(&self) -> bool {
        self.state.group.as_ref().is_some_and(|group| group.is_leader() && group.born())
    }

    /// Handshakes refused since start.
    pub fn handshake_failures(&self) -> u64 {
        self.acceptor.failures()
    }

    /// Writes this service's metrics at scrape time (register it with a metrics registry).
    pub fn metrics_collector(&self) -> Box<dyn prometheus_client::collector::Collector> {
        Box::new(crate::metrics::collector(
            &self.metrics,
            &self.acceptor,
            &self.state.chains.gauges,
            &self.state.inode_tokens.counts,
        ))
    }

    /// Serves until `shutdown`; every acknowledged change is already committed.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        tokio::select! {
            _ = shutdown => {}
            _ = accept_loop(&self.listener, (&self.state, &self.acceptor, &self.metrics), &self.config) => {}
            _ = sweep_opens(self.state.clone(), sweep_period(&self.config)) => {}
            _ = tick_chains(self.state.clone(), tick_period(&self.config)) => {}
            _ = lead_terms(self.state.clone()) => {}
        }
        if let Some(group) = &self.state.group {
            group.stop();
        }
        tracing::info!(addr = %self.local_addr, "metadata service stopped cleanly");
        Ok(())
    }
}

/// What every connection of the service shares: its limits and its frame memory budget.
struct ConnectionLimits {
    requests_max: usize,
    read_bounds: ReadBounds,
    budget: FrameBudget,
    reply_stall: Duration,
    /// How slowly a peer may take its replies.
    progress: ProgressRule,
    /// The service's default caller policy; each connection's is this narrowed by the limits
    /// of its peer's credential.
    policy: Arc<CallerPolicy>,
}

impl ConnectionLimits {
    fn new(config: &MetaConfig) -> ConnectionLimits {
        ConnectionLimits {
            requests_max: config.connection_requests_max.max(1),
            read_bounds: ReadBounds {
                frame_bytes_max: config.frame_bytes_max,
                idle_timeout: Duration::from_millis(config.idle_timeout_ms.max(1)),
                frame_timeout: Duration::from_millis(config.frame_read_timeout_ms.max(1)),
                progress: progress_rule(config),
            },
            budget: FrameBudget {
                overdraft_wait: Duration::from_millis(config.overdraft_wait_ms),
                ..FrameBudget::new(config.frame_bytes_in_memory_max)
            },
            reply_stall: Duration::from_millis(config.reply_stall_ms_max.max(1)),
            progress: progress_rule(config),
            policy: Arc::new(config.default_policy.clone()),
        }
    }
}

/// How slowly a peer may send a frame or take a reply.
fn progress_rule(config: &MetaConfig) -> ProgressRule {
    ProgressRule {
        interval: Duration::from_millis(config.progress_interval_ms.max(1)),
        bytes_min: config.progress_bytes_min,
    }
}

async fn accept_loop(
    listener: &TcpListener,
    (state, acceptor, metrics): (&Arc<State>, &Arc<Acceptor>, &Arc<MetaMetrics>),
    config: &MetaConfig,
) {
    let limits = Arc::new(ConnectionLimits::new(config));
    let accept = flotilla_rpc::AcceptLimits {
        connections_max: config.connections_max,
        connections_per_peer_max: config.connections_per_peer_max,
        keepalive_idle: Duration::from_millis(config.keepalive_idle_ms.max(1000)),
        handshakes: flotilla_rpc::HandshakeLimits {
            handshakes_max: config.handshakes_max.max(1),
            per_peer_per_second: config.handshakes_per_peer_per_second_max,
            burst_per_peer: config.handshake_burst_per_peer_max.max(1),
        },
    };
    let handshake = |mut stream: TcpStream| {
        let acceptor = acceptor.clone();
        async move {
            let peer_addr = stream.peer_addr().ok();
            let secured = acceptor.accept(&mut stream, peer_addr).await?;
            Some((stream, secured))
        }
    };
    let (state, metrics) = (state.clone(), metrics.clone());
    flotilla_rpc::accept_loop_limited(listener, accept, handshake, move |(stream, secured)| {
        let (state, limits, metrics) = (state.clone(), limits.clone(), metrics.clone());
        async move {
            metrics.connection(1);
            serve_connection(stream, (state, metrics.clone()), secured, limits).await;
            metrics.connection(-1);
        }
    })
    .await
}

/// The handshake and tag bounds of the service's connections.
fn auth_bounds(config: &MetaConfig) -> AuthBounds {
    AuthBounds {
        integrity: config.integrity,
        handshake_timeout: Duration::from_millis(config.handshake_timeout_ms.max(1)),
        tag_timeout: Duration::from_millis(
            config.tag_read_timeout_ms.min(config.progress_interval_ms).max(1),
        ),
    }
}

/// A reply with the frame memory its request held, released once the reply is written.
type Outgoing = (u64, MetaReply, Option<Reservation>);

async fn serve_connection(
    stream: TcpStream,
    (state, metrics): (Arc<State>, Arc<MetaMetrics>),
    secured: Secured,
    limits: Arc<ConnectionLimits>,
) {
    let _ = stream.set_nodelay(true);
    let Secured { peer, sealer, opener } = secured;
    let (read_half, write_half) = stream.into_split();
    let (replies, queue) = mpsc::channel::<Outgoing>(limits.requests_max);
    let pace = (limits.reply_stall, limits.progress);
    let mut writer = tokio::spawn(write_replies((write_half, sealer), queue, pace));
    let peer = Arc::new(peer);
    // A writer that gives up (peer not reading) ends the reader too, releasing its memory.
    tokio::select! {
        _ = read_requests((read_half, opener, peer), (state, metrics), replies, &limits) => { let _ = writer.await; }
        _ = &mut writer => {}
    }
}

async fn read_requests(
    (mut read_half, mut opener, peer): (OwnedReadHalf, Opener, Arc<Peer>),
    (state, metrics): (Arc<State>, Arc<MetaMetrics>),
    replies: mpsc::Sender<Outgoing>,
    limits: &ConnectionLimits,
) {
    let in_progress = Arc::new(Semaphore::new(limits.requests_max));
    let (counted, requests_max) = (in_progress.clone(), limits.requests_max);
    let busy = move || counted.available_permits() < requests_max;
    let policy = Arc::new(crate::policy::for_peer(&limits.policy, &peer.limits));
    let session = Arc::new(ClientSession::default());
    let _closing = CloseOnDrop { state: state.clone(), session: session.clone() };
    let mut buffer = BytesMut::new();
    loop {
        let (bounds, budget) = (limits.read_bounds, &limits.budget);
        let read =
            read_frame_bounded_opened(&mut read_half, &mut buffer, bounds, budget, &busy, Some(&mut opener));
        let read = match read.await {
            Ok((frame, memory)) => opener.check(&mut read_half, &frame).await.map(|()| (frame, memory)),
            Err(error) => Err(error),
        };
        let (frame, memory) = match read {
            Ok(read) => read,
            Err(FrameError::Closed) => return,
            Err(FrameError::IdleTimeout { ms }) => {
                tracing::debug!(ms, "closing an idle metadata connection");
                return;
            }
            Err(error) => {
                let request_id = match &error {
                    FrameError::PayloadChecksum { request_id, .. } => *request_id,
                    _ => 0,
                };
                tracing::warn!(%error, "bad or late frame on a metadata connection");
                let reply = MetaReply::Error(WireError::new(ErrorCode::Protocol, error.to_string()));
                let _ = replies.send((request_id, reply, None)).await;
                // Even a bad payload breaks the stream here: the tag after it was not read.
                return;
            }
        };
        let request = match decode_body::<MetaRequest>(&frame.body, "metadata request") {
            Ok(request) => request,
            Err(error) => {
                metrics.refused(ErrorCode::BadRequest);
                let reply = MetaReply::Error(WireError::new(ErrorCode::BadRequest, error.to_string()));
                let _ = replies.send((frame.request_id, reply, Some(memory))).await;
                continue;
            }
        };
        let Ok(permit) = in_progress.clone().acquire_owned().await else { return };
        let (state, replies, policy) = (state.clone(), replies.clone(), policy.clone());
        let (peer, metrics, session) = (peer.clone(), metrics.clone(), session.clone());
        // A change carried with its changer's session (issue 34) counts as that change.
        let (changer, request) = crate::handle::changed_by(request);
        let variant_at = usize::from(changer.is_some());
        let (started, variant) =
            (std::time::Instant::now(), frame.body.get(variant_at).copied().unwrap_or(0));
        tokio::spawn(async move {
            let reply = tokio::task::spawn_blocking(move || {
                metrics.name_kind(variant, &request);
                // A membership request answers for itself on any node (status: its own view;
                // a change off the leader: `NotLeader`).
                let leading = match (&state.group, &request) {
                    (Some(_), MetaRequest::GroupMembership(_)) | (None, _) => Ok(()),
                    (Some(group), _) => state.lead(group),
                };
                let reply = match leading.map(|()| admit(&state, &peer, &request)) {
                    Err(not_served) => MetaReply::NotServed(not_served),
                    Ok(Ok(())) => state.handle_by(changer, request, (&policy, &peer.name), &session),
                    Ok(Err(refused)) => MetaReply::Error(refused),
                };
                metrics.handled(variant, &reply, started.elapsed());
                reply
            })
            .await;
            let reply =
                reply.unwrap_or_else(|e| MetaReply::Error(WireError::new(ErrorCode::Io, e.to_string())));
            let _ = replies.send((frame.request_id, reply, Some(memory))).await;
            drop(permit);
        });
    }
}

/// Closes a connection's group session when the connection ends.
struct CloseOnDrop {
    state: Arc<State>,
    session: Arc<ClientSession>,
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let (Some(group), Some(id)) = (&self.state.group, self.session.opened()) {
            crate::grouped::close_session(group.clone(), id);
        }
    }
}

/// Opens the namespace of the direct path (no group) with its group commit.
async fn direct_namespace(
    config: &MetaConfig,
    path: std::path::PathBuf,
) -> anyhow::Result<crate::replicated::SharedNamespace> {
    let namespace =
        tokio::task::spawn_blocking(move || Namespace::open(&path)).await?.context("open namespace")?;
    namespace.set_group_commit(GroupCommit {
        batch_ops_max: config.commit_batch_ops_max,
        batch_delay_us_max: config.commit_batch_delay_us_max,
        batch_linger_us_max: config.commit_batch_linger_us_max,
    });
    Ok(Arc::new(parking_lot::RwLock::new(Some(Arc::new(namespace)))))
}

/// Writes replies until the queue closes, a write fails, or the peer stops taking them
/// (`reply_stall_ms_max` for a batch, `progress_bytes_min` per `progress_interval_ms`).
async fn write_replies(
    (write_half, mut sealer): (OwnedWriteHalf, Sealer),
    mut queue: mpsc::Receiver<Outgoing>,
    (reply_stall, progress): (Duration, ProgressRule),
) {
    let write_half = Counted::new(write_half);
    let moved = write_half.moved();
    let mut writer = BufWriter::new(write_half);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some((request_id, reply, _memory)) = next.take() {
            let written = match encode_body(&reply) {
                Ok(body) => {
                    let write = sealer.write_frame(&mut writer, request_id, &body, &[]);
                    with_progress(progress, &moved, tokio::time::timeout(reply_stall, write))
                        .await
                        .unwrap_or_else(|stalled| Ok(Err(stalled)))
                }
                Err(error) => Ok(Err(error)),
            };
            if !matches!(written, Ok(Ok(()))) {
                tracing::warn!(
                    ?reply_stall,
                    "dropping metadata connection: reply not written in time or failed"
                );
                return;
            }
            next = queue.try_recv().ok();
        }
        let flushed =
            with_progress(progress, &moved, tokio::time::timeout(reply_stall, writer.flush())).await;
        match flushed {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => {
                // The client went away (closed, reset) with replies still to send: normal
                // when a process exits in the middle of a long poll.
                tracing::debug!(%error, "metadata connection closed by the client before its replies");
                return;
            }
            Ok(Err(_)) => {
                tracing::warn!(?reply_stall, "dropping metadata connection: replies not flushed in time");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "dropping metadata connection: the peer does not take its replies");
                return;
            }
        }
    }
    let _ = writer.shutdown().await;
}

/// The shared state of a starting service: the orphans the namespace keeps are loaded into
/// the open table (released one lease after start unless a client re-announces them).
fn new_state(
    config: &MetaConfig,
    (shared, group): (crate::replicated::SharedNamespace, Option<Arc<crate::grouped::Group>>),
    membership: Membership,
    issuer: Issuer,
) -> anyhow::Result<State> {
    let Some(namespace) = shared.read().clone() else { anyhow::bail!("the namespace did not open") };
    let now = std::time::Instant::now();
    let lease = Duration::from_millis(config.open_lease_ms);
    let mut opens = OpenTable::new(lease, now, config.open_files_per_session_max, config.open_sessions_max);
    // A new database has no files anyone could have open; a restarted one gives its clients
    // `open_reclaim_ms` to re-announce their opens before unlinks delete and orphans go.
    let reclaim =
        if namespace.created() { Duration::ZERO } else { Duration::from_millis(config.open_reclaim_ms) };
    opens.set_reclaim_until(now + reclaim);
    for id in namespace.orphans(ORPHANS_LOADED_MAX).context("list orphans")? {
        opens.add_orphan(id);
    }
    let (membership_config, replicas, chains_per_target) = config.membership()?;
    let settings =
        crate::chains::ChainSettings { membership: membership_config, replicas, chains_per_target };
    let chains = crate::chains::Chains::load(&*namespace, settings)
        .map_err(|e| anyhow::anyhow!("load the chain table: {e}"))?;
    let namespace_created = namespace.created();
    let no_overlap = namespace.no_overlap_files().context("load no-overlap hints")?;
    Ok(State {
        chains,
        namespace: shared,
        group,
        membership,
        heartbeat_ms: config.heartbeat_ms,
        opens: parking_lot::Mutex::new(opens),
        recovery_until: parking_lot::Mutex::new(now + Duration::from_millis(config.recovery_window_ms)),
        recovery_window: Duration::from_millis(config.recovery_window_ms),
        targets_per_server_max: config.targets_per_server_max,
        layout_bounds: config.layout_bounds()?,
        issuer,
        jobs: {
            let jobs = crate::jobs::Jobs::new(crate::jobs::JobBounds {
                jobs_max: config.jobs_max,
                members_max: config.job_members_max,
                wait_ms_max: config.job_wait_ms_max,
                lease: Duration::from_millis(config.job_member_lease_ms),
                name_bytes_max: 255,
            });
            // A restart lost the jobs: their members reclaim them for as long as locks.
            if !namespace_created {
                jobs.begin_grace(std::time::Instant::now() + Duration::from_millis(config.lock_reclaim_ms));
            }
            jobs
        },
        locks: crate::locks::Locks::new(crate::locks::LockBounds {
            locks_max: config.locks_max,
            wait_ms_max: config.lock_wait_ms_max,
            waiters_max: config.lock_waiters_max,
            // A new database has no clients whose locks were lost.
            reclaim_ms: if namespace_created { 0 } else { config.lock_reclaim_ms },
        }),
        tokens: crate::tokens::Tokens::new(token_bounds(config, namespace_created), no_overlap),
        inode_tokens: crate::inode_tokens::InodeTokens::new(
            crate::inode_tokens::InodeBounds {
                per_session_max: config.attr_tokens_per_session_max,
                total_max: config.attr_tokens_max,
                wait_ms_max: config.token_wait_ms_max,
                // Half as many as byte-token polls: both kinds hold blocking threads.
                pollers_max: (config.token_pollers_max / 2).max(1),
            },
            !namespace_created,
        ),
    })
}

/// The token service's bounds; a new database has no clients whose tokens were lost.
fn token_bounds(config: &MetaConfig, namespace_created: bool) -> crate::tokens::TokenBounds {
    crate::tokens::TokenBounds {
        tokens_max: config.tokens_max,
        wait_ms_max: config.token_wait_ms_max,
        waiters_max: config.token_waiters_max,
        pollers_max: config.token_pollers_max,
        recovery_ms: if namespace_created { 0 } else { config.token_recovery_ms },
    }
}

/// Ends expired client sessions and releases unused orphans, every `period`.
async fn sweep_opens(state: Arc<State>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || state.sweep_opens()).await;
    }
}

/// On a group node: starts each term it leads when elected (never returns); else nothing.
async fn lead_terms(state: Arc<State>) {
    match state.group.clone() {
        Some(group) => crate::grouped::watch_leadership(state, group).await,
        None => std::future::pending().await,
    }
}

/// Drives the chain membership engine's clock every `period` (fencing, dead targets).
async fn tick_chains(state: Arc<State>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let state = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            // On a group, only the leader's engine judges silences (heartbeats go to it).
            if let Some(group) = &state.group {
                if !group.is_leader() || state.lead(group).is_err() {
                    return;
                }
            }
            let Ok(store) = state.chain_store() else { return };
            if let Err(error) = state.chains.tick(&*store) {
                tracing::warn!(%error, "chain tick failed; will retry");
            }
        })
        .await;
    }
}

/// A quarter of `fence_after_ms`, so a silent member is fenced at most a quarter late.
fn tick_period(config: &MetaConfig) -> Duration {
    Duration::from_millis((config.fence_after_ms / 4).clamp(10, 1000))
}

fn sweep_period(config: &MetaConfig) -> Duration {
    Duration::from_millis((config.open_lease_ms / 4).clamp(10, 1000))
}
