//! Binding, accepting, worker threads, background flushing, and clean shutdown.

use crate::config::ServerConfig;
use crate::connection::{self, Job, Shared};
use crate::execute::{BufferPool, Executor, Prepared, Reply};
use crate::membership::heartbeat_loop;
use crate::metrics::ServerMetrics;
use crate::scheduler::{ConnectionId, Scheduler};
use anyhow::Context;
use flotilla_auth::{Acceptor, AuthBounds, ClientAuth, Role};
use flotilla_proto::{IoReply, IoRequest};
use flotilla_store::{Store, StoreConfig};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A bound I/O server, ready to serve.
pub struct Server {
    config: ServerConfig,
    /// The metadata service's addresses (`meta`, `a,b,c` for a group).
    meta: flotilla_client::LeaderChase,
    listener: TcpListener,
    local_addr: SocketAddr,
    advertise: String,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// Binds and serves until `shutdown` completes.
pub async fn run(config: ServerConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    Server::bind(config).await?.serve(shutdown).await
}

impl Server {
    /// Opens the targets, binds the listener and starts the worker threads.
    pub async fn bind(config: ServerConfig) -> anyhow::Result<Server> {
        config.limits.validate().context("check limits")?;
        config.validate()?;
        let meta = flotilla_client::LeaderChase::parse(&config.meta).context("[server] meta")?;
        let credential =
            flotilla_auth::load_credential(config.key.as_deref(), "the I/O server", Role::Server)?;
        let secret = credential.capability_key().context(
            "the I/O server's credential carries no capability key (issue it with the server role)",
        )?;
        let capabilities = flotilla_auth::CapabilityKey::new(secret);
        let store = open_store(&config).await?;
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("listen on {}", config.listen))?;
        let local_addr = listener.local_addr().context("read the bound address")?;
        let advertise = config.advertise.clone().unwrap_or_else(|| local_addr.to_string());
        let pool = BufferPool::new(4, (config.limits.request_bytes_max as usize).min(4 << 20));
        let executor_targets = store.target_ids();
        let executor = Arc::new(Executor { store, limits: config.limits, pool });
        let memory_units_max =
            u32::try_from((config.data_bytes_in_memory_max / 1024).max(1)).unwrap_or(u32::MAX >> 4);
        let memory = Arc::new(Semaphore::new(memory_units_max as usize));
        let held = Arc::new(crate::membership::HeldChains::new(member_info(&config)?));
        let meta_auth = ClientAuth { credential: credential.clone(), bounds: auth_bounds(&config) };
        let chain_paths = Arc::new(crate::chain_path::ChainPaths::new(
            chain_path_config(&config),
            executor.clone(),
            held.clone(),
            meta_auth.clone(),
        ));
        let flush = Arc::new(crate::flush::Sessions::new(
            flush_config(&config),
            executor.clone(),
            (memory.clone(), memory_units_max),
            advertise.clone(),
            Some(chain_paths.clone()),
        ));
        let shared = Arc::new(Shared {
            executor,
            flush,
            scheduler: Arc::new(Scheduler::with_parking(config.parked_requests_max)),
            limits: config.limits,
            server_name: advertise.clone(),
            boot_epoch: rand::random::<u64>().max(1),
            connection_queue_max: config.connection_queue_max.max(1),
            reply_queue_max: config.reply_queue_max.max(1),
            budget: frame_budget(&config, memory.clone(), memory_units_max),
            memory,
            memory_units_max,
            connection_units_max: u32::try_from((config.connection_data_bytes_max / 1024).max(1))
                .unwrap_or(u32::MAX >> 4)
                .min(memory_units_max),
            frame_pool: flotilla_proto::buffers::BufferPool::new(
                (config.data_bytes_in_memory_max as usize).min(crate::connection::FRAME_POOL_KEPT_BYTES_MAX),
            ),
            read_bounds: flotilla_proto::ReadBounds {
                frame_bytes_max: config.limits.frame_bytes_max,
                idle_timeout: Duration::from_millis(config.idle_timeout_ms.max(1)),
                frame_timeout: Duration::from_millis(config.frame_read_timeout_ms.max(1)),
                progress: progress_rule(&config),
            },
            reply_stall: Duration::from_millis(config.reply_stall_ms_max.max(1)),
            progress: progress_rule(&config),
            acceptor: Acceptor::new(
                credential.clone(),
                vec![Role::Client, Role::Server],
                auth_bounds(&config),
            ),
            meta_auth,
            capabilities,
            chains: held,
            chain_paths,
            runtime: tokio::runtime::Handle::current(),
            metrics: config.metrics.then(|| {
                ServerMetrics::new(executor_targets, config.jobs_max.max(1), config.jobs_listed_max)
            }),
        });
        let workers = (0..config.workers.max(1))
            .map(|i| start_worker(i, shared.clone()))
            .collect::<std::io::Result<Vec<_>>>()
            .context("start worker threads")?;
        Ok(Server { config, meta, listener, local_addr, advertise, shared, workers })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Handshakes refused since start.
    pub fn handshake_failures(&self) -> u64 {
        self.shared.acceptor.failures()
    }

    /// Writes this server's metrics at scrape time (register it with a metrics registry).
    pub fn metrics_collector(&self) -> Box<dyn prometheus_client::collector::Collector> {
        Box::new(crate::metrics::collector(&self.shared))
    }

    /// The chains of this server's targets and the lease, as the last heartbeat reply gave
    /// them (replication, issue 32; the chain data path fences every chained request with them).
    pub fn chains(&self) -> crate::membership::ChainsSnapshot {
        self.shared.chains.snapshot()
    }

    /// The address registered with the metadata service.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// Accepts connections until `shutdown`, then stops the workers and writes back every
    /// dirty block.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let period = Duration::from_millis(self.config.heartbeat_ms.max(10));
        let executor = self.shared.executor.clone();
        let meta = (self.meta.clone(), self.shared.meta_auth.clone());
        let held = self.shared.chains.clone();
        let heartbeat = tokio::spawn(heartbeat_loop(meta, (self.advertise.clone(), held), executor, period));
        let resync_period = Duration::from_millis(self.config.chain_resync_period_ms.max(1));
        let resync = tokio::spawn(resync_loop(
            self.shared.chain_paths.clone(),
            self.shared.chains.clone(),
            resync_period,
        ));
        let scrub = tokio::spawn(crate::scrub::scrub_loop(
            self.shared.chain_paths.clone(),
            self.shared.chains.clone(),
            self.config.scrub_bytes_per_s,
            self.config.scrub_step_bytes,
        ));
        let flusher = tokio::spawn(flush_loop(self.shared.executor.clone(), self.config.dirty_age_max_ms));
        let migration = self.config.archive.as_ref().map(|archive| {
            tokio::spawn(migration_loop(self.shared.executor.clone(), archive.scan_interval_ms))
        });
        tokio::select! {
            _ = shutdown => {}
            _ = accept_loop(&self.listener, &self.shared, &self.config) => {}
        }
        heartbeat.abort();
        flusher.abort();
        resync.abort();
        scrub.abort();
        if let Some(migration) = migration {
            migration.abort();
        }
        self.shared.scheduler.stop();
        for worker in self.workers {
            let _ = worker.join();
        }
        let executor = self.shared.executor.clone();
        tokio::task::spawn_blocking(move || executor.store.flush_all())
            .await?
            .context("write back dirty blocks")?;
        tracing::info!(addr = %self.local_addr, "server stopped cleanly");
        Ok(())
    }
}

/// How slowly a peer may send a frame or take a reply.
fn progress_rule(config: &ServerConfig) -> flotilla_proto::ProgressRule {
    flotilla_proto::ProgressRule {
        interval: Duration::from_millis(config.progress_interval_ms.max(1)),
        bytes_min: config.progress_bytes_min,
    }
}

/// The data budget as frames see it, with its overdraft lane.
fn frame_budget(
    config: &ServerConfig,
    memory: Arc<Semaphore>,
    units_max: u32,
) -> flotilla_proto::FrameBudget {
    let mut budget = flotilla_proto::FrameBudget::over(memory, units_max);
    budget.overdraft_wait = Duration::from_millis(config.overdraft_wait_ms);
    budget
}

/// Makes the resync copies this server owes as a copy source (`ChainPaths::resync_pass`)
/// on every new chain view and every `period`.
async fn resync_loop(
    paths: Arc<crate::chain_path::ChainPaths>,
    held: Arc<crate::membership::HeldChains>,
    period: Duration,
) {
    let mut watch = held.watch();
    loop {
        tokio::select! {
            changed = watch.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(period) => {}
        }
        paths.resync_pass().await;
    }
}

/// The chain data path's bounds.
fn chain_path_config(config: &ServerConfig) -> crate::chain_path::PathConfig {
    crate::chain_path::PathConfig {
        forward_timeout: Duration::from_millis(config.chain_forward_timeout_ms.max(1)),
        change_wait: Duration::from_millis(config.chain_change_wait_ms.max(1)),
        retry: Duration::from_millis(config.chain_retry_ms.max(1)),
        window_max: config.chain_window_max.max(1),
        gap_wait: Duration::from_millis(config.chain_gap_wait_ms),
        copy_chunk_bytes: config.chain_copy_chunk_bytes.max(1),
        resync_bytes_per_s: config.resync_bytes_per_s,
        record_bytes_max: config.resync_record_bytes_max,
    }
}

/// The handshake and tag bounds of the server's connections.
fn flush_config(config: &ServerConfig) -> crate::flush::FlushConfig {
    crate::flush::FlushConfig {
        sessions_max: config.flush_sessions_max.max(1),
        members_max: config.flush_members_max.max(1),
        entries_max: config.flush_entries_max.max(1),
        member_wait: Duration::from_millis(config.flush_member_wait_ms.max(1)),
        block_bytes: config.flush_block_bytes.max(1),
        segments_per_step_max: config.flush_segments_per_step_max.max(1),
    }
}

fn auth_bounds(config: &ServerConfig) -> AuthBounds {
    AuthBounds {
        integrity: config.integrity,
        handshake_timeout: Duration::from_millis(config.handshake_timeout_ms.max(1)),
        // The 32-byte tag follows its frame at once: a peer holding it back holds the
        // frame's memory, so it gets one progress window.
        tag_timeout: Duration::from_millis(
            config.frame_read_timeout_ms.min(config.progress_interval_ms).max(1),
        ),
    }
}

async fn open_store(config: &ServerConfig) -> anyhow::Result<Store> {
    let mut store_config = StoreConfig::new(config.targets.clone(), true);
    store_config.block_bytes = config.block_bytes;
    store_config.cache_capacity_bytes = config.cache_capacity_bytes;
    store_config.disk_queue_max = config.disk_queue_max;
    store_config.disk_threads_per_target = config.disk_threads_per_target;
    store_config.cache_shards = config.cache_shards;
    store_config.fd_cache_max = config.fd_cache_max;
    store_config.write_full = config.write_full;
    store_config.cache_huge_pages = config.cache_huge_pages;
    store_config.bulk_bytes_min = config.bulk_bytes_min;
    if let Some(archive) = &config.archive {
        let settings = archive.clone();
        let tier = tokio::task::spawn_blocking(move || settings.open()).await?;
        store_config.tier = Some(tier.context("open the archive")?);
    }
    let store = tokio::task::spawn_blocking(move || Store::open(store_config)).await?;
    store.context("open storage targets")
}

async fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, config: &ServerConfig) {
    let next_id = AtomicU64::new(1);
    let limits = flotilla_rpc::AcceptLimits {
        connections_max: config.connections_max,
        connections_per_peer_max: config.connections_per_peer_max,
        keepalive_idle: Duration::from_millis(config.keepalive_idle_ms.max(1000)),
        handshakes: flotilla_rpc::HandshakeLimits {
            handshakes_max: config.handshakes_max.max(1),
            per_peer_per_second: config.handshakes_per_peer_per_second_max,
            burst_per_peer: config.handshake_burst_per_peer_max.max(1),
        },
    };
    let handshake = |stream| connection::handshake(stream, shared.clone());
    let serving = shared.clone();
    flotilla_rpc::accept_loop_limited(listener, limits, handshake, move |(stream, secured)| {
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        connection::serve(stream, secured, id, serving.clone())
    })
    .await
}

fn start_worker(index: usize, shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("flotilla-worker-{index}")).spawn(move || work(shared))
}

fn work(shared: Arc<Shared>) {
    while let Some((connection, job)) = shared.scheduler.next() {
        if let Some(job) = park(&shared, connection, job) {
            execute(&shared, job);
        }
    }
}

/// Parks a read or write whose blocks are not all cached, if a place is free: its disk
/// reads are started (`Executor::read_or_prefetch`) and the worker goes on to the next job;
/// the disk thread that finishes the last read unpins the blocks and hands the job back to
/// the scheduler's ready queue, and a worker then runs it, finding its blocks cached. The job
/// keeps its queue slot, credit and memory meanwhile. A read found cached runs at once, from
/// the blocks the check pinned. Returns the job when it must run now (parked once already,
/// no place, a write found cached, or the prefetch declined).
fn park(shared: &Arc<Shared>, connection: ConnectionId, mut job: Job) -> Option<Job> {
    if job.parked_once || !matches!(job.request, IoRequest::Read { .. } | IoRequest::Write { .. }) {
        return Some(job);
    }
    if !shared.scheduler.try_park() {
        return Some(job);
    }
    let loads = match shared.executor.read_or_prefetch(job.request_id, &job.request) {
        Prepared::Pending(loads) => loads,
        Prepared::Done(reply) => {
            shared.scheduler.cancel_park();
            deliver(shared, job, reply);
            return None;
        }
        Prepared::Declined => {
            shared.scheduler.cancel_park();
            return Some(job);
        }
    };
    if let Some(metrics) = &shared.metrics {
        metrics.parked(1);
    }
    job.parked_once = true;
    let back = shared.clone();
    loads.when_loaded(move |loads| {
        // On the disk thread (or here, if the loads are already done): cheap and lock-free
        // but for the cache's lock to unpin and the scheduler's to queue the job.
        drop(loads);
        if let Some(metrics) = &back.metrics {
            metrics.parked(-1);
        }
        back.scheduler.unpark(connection, job);
    });
    None
}

/// Executes a job and queues its reply.
fn execute(shared: &Arc<Shared>, job: Job) {
    let reply = shared.executor.execute(job.request_id, &job.request, &job.data, job.by_capability);
    deliver(shared, job, reply);
}

/// Read repair (issue 32): a client's read of a replicated subfile that failed a checksum
/// here is handed to a repair task (`chain_path::repair`), which rewrites the bad blocks
/// from another serving member and runs the read again; its reply is delivered then.
fn repair_first(shared: &Arc<Shared>, mut job: Job, reply: Reply) -> Option<(Job, Reply)> {
    let failed =
        matches!(&reply.message, IoReply::Error(e) if e.code == flotilla_proto::ErrorCode::ChecksumMismatch);
    let Some(chain) = job.repair_chain.take().filter(|_| failed) else { return Some((job, reply)) };
    let back = shared.clone();
    shared.runtime.spawn(async move {
        let repaired = back.chain_paths.repair_read(chain, &job.request).await;
        let executor = back.executor.clone();
        let reply = match repaired {
            Ok(_) => {
                let (request_id, request) = (job.request_id, job.request.clone());
                let ran =
                    tokio::task::spawn_blocking(move || executor.execute(request_id, &request, &[], false))
                        .await;
                ran.unwrap_or(reply)
            }
            Err(error) => {
                tracing::warn!(chain, %error, "read repair failed; the read fails");
                Reply {
                    request_id: job.request_id,
                    message: IoReply::Error(error),
                    data: Vec::new(),
                    memory: None,
                }
            }
        };
        tokio::task::spawn_blocking(move || deliver(&back, job, reply));
    });
    None
}

/// Queues the reply of a job that ran, counting it, and releases the job's credit and data.
fn deliver(shared: &Arc<Shared>, job: Job, reply: Reply) {
    let Some((job, mut reply)) = repair_first(shared, job, reply) else { return };
    let Job {
        request_id: _,
        request,
        data,
        replies,
        _slot,
        credit,
        memory,
        started,
        job,
        by_capability: _,
        parked_once: _,
        repair_chain: _,
    } = job;
    if let Some(metrics) = &shared.metrics {
        metrics.queued(-1);
        metrics.executed(&request, &reply.message, job.as_deref(), started.elapsed());
    }
    reply.memory = Some(memory);
    drop(credit);
    drop(data);
    let _ = replies.blocking_send(reply);
}

/// The migration managers (RAMA §4.2.3): every scan interval, one pass per lines target with
/// a tier — archive forks old enough, reclaim clean blocks below the low watermark.
async fn migration_loop(executor: Arc<Executor>, scan_interval_ms: u64) {
    let interval = Duration::from_millis(scan_interval_ms.max(10));
    loop {
        tokio::time::sleep(interval).await;
        let executor = executor.clone();
        let passes = tokio::task::spawn_blocking(move || {
            let store = &executor.store;
            store.target_ids().into_iter().map(|target| (target, store.tier_pass(target))).collect::<Vec<_>>()
        })
        .await;
        for (target, pass) in passes.unwrap_or_default() {
            match pass {
                Ok(Some(pass)) if pass.archived_forks + pass.reclaimed_blocks + pass.failures > 0 => {
                    tracing::info!(%target, archived = pass.archived_forks, reclaimed_blocks = pass.reclaimed_blocks,
                        failures = pass.failures, "migration manager pass");
                }
                Ok(_) => {}
                Err(error) => tracing::error!(%target, %error, "migration manager pass failed"),
            }
        }
    }
}

async fn flush_loop(executor: Arc<Executor>, dirty_age_max_ms: u64) {
    let age = Duration::from_millis(dirty_age_max_ms.max(10));
    loop {
        tokio::time::sleep(age / 2).await;
        let executor = executor.clone();
        let flushed = tokio::task::spawn_blocking(move || executor.store.flush_aged(age)).await;
        if let Ok(Err(error)) = flushed {
            tracing::error!(%error, "background write-back failed");
        }
    }
}

/// This server's failure group (`failure_group`, else the host name) and incarnation (its
/// start time in ms since the Unix epoch: a restart gives a higher one).
fn member_info(config: &ServerConfig) -> anyhow::Result<flotilla_proto::MemberInfo> {
    let failure_group = config.failure_group.clone().unwrap_or_else(host_name);
    let bytes = failure_group.len();
    anyhow::ensure!(
        (1..=flotilla_proto::FAILURE_GROUP_BYTES_MAX).contains(&bytes),
        "failure group {failure_group:?} has {bytes} bytes; it must have 1 to {}",
        flotilla_proto::FAILURE_GROUP_BYTES_MAX
    );
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(1)
        .max(1);
    Ok(flotilla_proto::MemberInfo { failure_group, incarnation })
}

/// The host name (Linux), else `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|name| !name.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
}
