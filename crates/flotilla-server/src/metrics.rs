//! What an I/O server counts for its metrics endpoint and for `IoRequest::Stats`: relaxed
//! atomics bumped by the readers and workers, read by a `prometheus_client` collector at
//! scrape time. A connection finds its job's counters once; no lock is taken per request.

use crate::connection::Shared;
use flotilla_metrics::write::{self, Labels};
use flotilla_metrics::{ErrorCounts, JobCounters, JobTable, LatencyHistogram};
use flotilla_proto::{ErrorCode, IoReply, IoRequest, JobStats, ServerStats};
use flotilla_types::TargetId;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Request kinds, as labels, in the order of [`kind_index`].
const KINDS: [&str; 22] = [
    "hello",
    "read",
    "write",
    "create_subfile",
    "remove_subfile",
    "create_fork",
    "remove_fork",
    "list_forks",
    "fork_size",
    "extend",
    "truncate",
    "sync",
    "job",
    "stats",
    "flush_directory",
    "flush_pull",
    "flush_data",
    "hsm",
    "hsm_status",
    "forward",
    "chained",
    "block_checksums",
];

/// Most jobs a `Stats` reply or a scrape lists, whatever `jobs_listed_max` says.
const JOBS_LISTED_CAP: usize = 1000;

/// Kinds the reader (or an ENWRICH flush session) answers without a worker: never timed.
const INLINE_KINDS: [&str; 7] =
    ["hello", "job", "stats", "flush_directory", "flush_pull", "flush_data", "forward"];

/// The label index of a request's kind (`With` is never executed: it is unwrapped first).
fn kind_index(request: &IoRequest) -> usize {
    match request {
        IoRequest::Hello { .. } | IoRequest::With { .. } => 0,
        IoRequest::Read { .. } => 1,
        IoRequest::Write { .. } => 2,
        IoRequest::CreateSubfile { .. } => 3,
        IoRequest::RemoveSubfile { .. } => 4,
        IoRequest::CreateFork { .. } => 5,
        IoRequest::RemoveFork { .. } => 6,
        IoRequest::ListForks { .. } => 7,
        IoRequest::ForkSize { .. } => 8,
        IoRequest::Extend { .. } => 9,
        IoRequest::Truncate { .. } => 10,
        IoRequest::Sync { .. } => 11,
        IoRequest::Job { .. } => 12,
        IoRequest::Stats => 13,
        IoRequest::FlushDirectory { .. } => 14,
        IoRequest::FlushPull { .. } => 15,
        IoRequest::FlushData { .. } => 16,
        IoRequest::Hsm { .. } => 17,
        IoRequest::HsmStatus => 18,
        IoRequest::Forward { .. } => 19,
        IoRequest::Chained { .. } => 20,
        IoRequest::BlockChecksums { .. } => 21,
    }
}

/// Bytes and operations of one storage target.
#[derive(Debug, Default)]
struct TargetCounters {
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_ops: AtomicU64,
    write_ops: AtomicU64,
}

/// The server's live counters.
#[derive(Debug)]
pub struct ServerMetrics {
    started: Instant,
    total: JobCounters,
    latency: [LatencyHistogram; KINDS.len()],
    targets: Vec<(TargetId, TargetCounters)>,
    errors: ErrorCounts,
    connections: AtomicI64,
    connections_total: AtomicU64,
    queued: AtomicI64,
    /// Requests parked while their blocks load (gauge) and ever parked.
    parked: AtomicI64,
    parked_total: AtomicU64,
    memory_waits: AtomicU64,
    pub jobs: JobTable,
    jobs_listed_max: usize,
}

impl ServerMetrics {
    pub fn new(targets: Vec<TargetId>, jobs_max: usize, jobs_listed_max: usize) -> ServerMetrics {
        ServerMetrics {
            started: Instant::now(),
            total: JobCounters::default(),
            latency: Default::default(),
            targets: targets.into_iter().map(|t| (t, TargetCounters::default())).collect(),
            errors: Default::default(),
            connections: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
            queued: AtomicI64::new(0),
            parked: AtomicI64::new(0),
            parked_total: AtomicU64::new(0),
            memory_waits: AtomicU64::new(0),
            jobs: JobTable::new(jobs_max),
            // Keeps a `Stats` reply far below any frame size limit.
            jobs_listed_max: jobs_listed_max.min(JOBS_LISTED_CAP),
        }
    }

    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn queued(&self, delta: i64) {
        self.queued.fetch_add(delta, Ordering::Relaxed);
    }

    /// A request was parked (`delta` 1) while its blocks load, or came back (-1).
    pub fn parked(&self, delta: i64) {
        self.parked.fetch_add(delta, Ordering::Relaxed);
        if delta > 0 {
            self.parked_total.fetch_add(delta as u64, Ordering::Relaxed);
        }
    }

    /// A request waited for the server-wide data budget.
    pub fn memory_wait(&self) {
        self.memory_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// A request refused before it was queued.
    pub fn refused(&self, code: ErrorCode) {
        self.errors.add(code);
    }

    /// Counts one executed request: its kind's latency, its target's and job's bytes.
    pub fn executed(
        &self,
        request: &IoRequest,
        reply: &IoReply,
        job: Option<&JobCounters>,
        elapsed: Duration,
    ) {
        self.latency[kind_index(request)].observe(elapsed);
        let (kind, bytes, target) = match (request, reply) {
            (_, IoReply::Error(error)) => {
                self.refused(error.code);
                (flotilla_metrics::OpKind::Other, 0, None)
            }
            (IoRequest::Read { fork, .. }, IoReply::Data) => {
                (flotilla_metrics::OpKind::Read, request.data_bytes().unwrap_or(0), Some(fork.target))
            }
            (IoRequest::Write { fork, .. }, _) => {
                (flotilla_metrics::OpKind::Write, request.data_bytes().unwrap_or(0), Some(fork.target))
            }
            _ => (flotilla_metrics::OpKind::Other, 0, None),
        };
        self.total.add(kind, bytes, elapsed);
        if let Some(job) = job {
            job.add(kind, bytes, elapsed);
        }
        if let Some(counters) = target.and_then(|t| self.targets.iter().find(|(id, _)| *id == t)) {
            let (moved, ops) = match kind {
                flotilla_metrics::OpKind::Read => (&counters.1.read_bytes, &counters.1.read_ops),
                _ => (&counters.1.write_bytes, &counters.1.write_ops),
            };
            moved.fetch_add(bytes, Ordering::Relaxed);
            ops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The answer to `IoRequest::Stats`.
    pub fn stats(&self, server: &str) -> ServerStats {
        ServerStats {
            server: server.to_string(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            total: self.total.snapshot(""),
            jobs: self.jobs.top(self.jobs_listed_max),
        }
    }
}

/// Writes a server's metrics at scrape time (holds the server weakly: a stopped server's
/// metrics simply vanish).
#[derive(Debug)]
pub(crate) struct ServerCollector {
    pub shared: Weak<Shared>,
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(shared) = self.shared.upgrade() else { return Ok(()) };
        let Some(metrics) = shared.metrics.as_ref() else { return Ok(()) };
        encode_targets(&mut encoder, metrics)?;
        encode_requests(&mut encoder, metrics)?;
        encode_jobs(&mut encoder, &metrics.jobs.top(metrics.jobs_listed_max))?;
        encode_store(&mut encoder, &shared.executor.store.stats())?;
        encode_tier(&mut encoder, &shared.executor.store)?;
        let failures = shared.acceptor.failures();
        write::counter(&mut encoder, "server_auth_failures", "Handshakes refused.", None, failures)?;
        let repairs = &shared.chain_paths.repairs;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let repair_counters = [
            (
                "server_repaired_blocks",
                "Checksum blocks rewritten from another replica (read repair, scrub).",
                load(&repairs.repaired_blocks),
            ),
            (
                "server_unrepaired_blocks",
                "Blocks that failed their checksum and no other replica could supply.",
                load(&repairs.unrepaired_blocks),
            ),
            (
                "server_checksum_bad_blocks",
                "Blocks found failing their checksum by repair and scrub checks.",
                load(&repairs.bad_blocks),
            ),
            ("server_scrubbed_bytes", "Bytes the background scrub checked.", load(&repairs.scrubbed_bytes)),
            (
                "server_resync_copied_bytes",
                "Fork bytes this server sent to syncing members as their copy source.",
                load(&shared.chain_paths.resyncs.bytes_copied),
            ),
            (
                "server_resync_recorded_copies",
                "Resync copies made from a record of what the member missed.",
                load(&shared.chain_paths.resyncs.recorded_copies),
            ),
            (
                "server_resync_full_copies",
                "Resync copies of every subfile of a chain (no record covered the member).",
                load(&shared.chain_paths.resyncs.full_copies),
            ),
        ];
        for (name, help, value) in repair_counters {
            write::counter(&mut encoder, name, help, None, value)?;
        }
        let chains = shared.chains.snapshot();
        let held = i64::try_from(chains.chains.len()).unwrap_or(i64::MAX);
        write::gauge(
            &mut encoder,
            "server_chains",
            "Chains of this server's targets, as the last heartbeat reply gave them.",
            None,
            held,
        )?;
        let lease = i64::from(chains.lease_valid);
        write::gauge(
            &mut encoder,
            "server_chain_lease_valid",
            "1 while the lease of the last heartbeat runs.",
            None,
            lease,
        )
    }
}

fn target_labels(target: TargetId) -> Labels {
    vec![("target", target.0.to_string())]
}

fn encode_targets(encoder: &mut DescriptorEncoder, metrics: &ServerMetrics) -> std::fmt::Result {
    type Pick = fn(&TargetCounters) -> &AtomicU64;
    let families: [(&str, &str, Option<Unit>, Pick); 4] = [
        ("server_target_read", "Bytes read from the target by clients.", Some(Unit::Bytes), |c| {
            &c.read_bytes
        }),
        ("server_target_written", "Bytes written to the target by clients.", Some(Unit::Bytes), |c| {
            &c.write_bytes
        }),
        ("server_target_reads", "Read requests served by the target.", None, |c| &c.read_ops),
        ("server_target_writes", "Write requests served by the target.", None, |c| &c.write_ops),
    ];
    for (name, help, unit, pick) in families {
        let samples: Vec<(Labels, u64)> = metrics
            .targets
            .iter()
            .map(|(id, counters)| (target_labels(*id), pick(counters).load(Ordering::Relaxed)))
            .collect();
        write::counters(encoder, (name, help, unit), &samples)?;
    }
    Ok(())
}

fn encode_requests(encoder: &mut DescriptorEncoder, metrics: &ServerMetrics) -> std::fmt::Result {
    // Hello, job, stats and flush messages are answered without a worker, never timed.
    let latency: Vec<(Labels, &LatencyHistogram)> = KINDS
        .iter()
        .zip(&metrics.latency)
        .filter(|(kind, _)| !INLINE_KINDS.contains(kind))
        .map(|(kind, h)| (vec![("kind", kind.to_string())], h))
        .collect();
    write::histograms(
        encoder,
        ("server_request_duration", "Time from a request's arrival to its reply, by kind."),
        &latency,
    )?;
    let errors = metrics.errors.samples();
    write::counters(encoder, ("server_errors", "Requests answered with an error, by code.", None), &errors)?;
    let load = |gauge: &AtomicI64| gauge.load(Ordering::Relaxed);
    write::gauge(
        encoder,
        "server_connections",
        "Client connections open.",
        None,
        load(&metrics.connections),
    )?;
    let opened = metrics.connections_total.load(Ordering::Relaxed);
    write::counter(encoder, "server_connections_opened", "Connections authenticated.", None, opened)?;
    write::gauge(
        encoder,
        "server_queue_depth",
        "Requests queued or executing.",
        None,
        load(&metrics.queued),
    )?;
    write::gauge(
        encoder,
        "server_requests_parked_now",
        "Requests parked while their blocks load from disk, holding no worker thread.",
        None,
        load(&metrics.parked),
    )?;
    let parked = metrics.parked_total.load(Ordering::Relaxed);
    write::counter(
        encoder,
        "server_requests_parked",
        "Requests parked while their blocks loaded, holding no worker thread (parked_requests_max).",
        None,
        parked,
    )?;
    let waits = metrics.memory_waits.load(Ordering::Relaxed);
    write::counter(
        encoder,
        "server_memory_waits",
        "Requests that waited for the server-wide data budget (data_bytes_in_memory_max).",
        None,
        waits,
    )
}

fn encode_jobs(encoder: &mut DescriptorEncoder, jobs: &[JobStats]) -> std::fmt::Result {
    type Pick = fn(&JobStats) -> u64;
    let families: [(&str, &str, Option<Unit>, Pick); 5] = [
        ("server_job_read", "Bytes read by the job's connections.", Some(Unit::Bytes), |j| j.read_bytes),
        ("server_job_written", "Bytes written by the job's connections.", Some(Unit::Bytes), |j| {
            j.write_bytes
        }),
        ("server_job_reads", "Read requests of the job.", None, |j| j.read_ops),
        ("server_job_writes", "Write requests of the job.", None, |j| j.write_ops),
        ("server_job_other_requests", "Requests of the job that move no data.", None, |j| j.other_ops),
    ];
    for (name, help, unit, pick) in families {
        let samples: Vec<(Labels, u64)> =
            jobs.iter().map(|job| (vec![("job_id", job.job.clone())], pick(job))).collect();
        write::counters(encoder, (name, help, unit), &samples)?;
    }
    Ok(())
}

fn encode_store(encoder: &mut DescriptorEncoder, stats: &flotilla_store::StoreStats) -> std::fmt::Result {
    let counters: [(&str, &str, Option<Unit>, u64); 12] = [
        ("server_cache_hits", "Blocks requests found in the buffer cache.", None, stats.cache_hits),
        (
            "server_cache_misses",
            "Blocks requests did not find in the buffer cache.",
            None,
            stats.cache_misses,
        ),
        (
            "server_cache_evictions",
            "Clean blocks dropped from the cache to make room.",
            None,
            stats.evictions,
        ),
        ("server_disk_read", "Bytes read from disk.", Some(Unit::Bytes), stats.disk_read_bytes),
        ("server_disk_written", "Bytes written to disk.", Some(Unit::Bytes), stats.disk_write_bytes),
        ("server_disk_reads", "Read system calls.", None, stats.disk_reads),
        ("server_disk_writes", "Write system calls.", None, stats.disk_writes),
        ("server_disk_syncs", "fdatasync calls.", None, stats.disk_syncs),
        (
            "server_disk_runs_overlapped",
            "Disk transfers begun while another of the same target was in flight (disk_threads_per_target > 1).",
            None,
            stats.disk_runs_overlapped,
        ),
        (
            "server_bulk_read",
            "Bytes read straight from fork files past the cache (bulk_bytes_min; in server_disk_read too).",
            Some(Unit::Bytes),
            stats.bulk_read_bytes,
        ),
        (
            "server_bulk_written",
            "Bytes written straight to fork files past the cache (bulk_bytes_min; in server_disk_written too).",
            Some(Unit::Bytes),
            stats.bulk_write_bytes,
        ),
        ("server_checksum_errors", "Blocks read whose CRC32C did not match.", None, stats.checksum_errors),
    ];
    for (name, help, unit, value) in counters {
        write::counter(encoder, name, help, unit, value)?;
    }
    let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    write::gauge(
        encoder,
        "server_cache_dirty",
        "Dirty bytes in the cache.",
        Some(Unit::Bytes),
        gauge(stats.dirty_bytes),
    )?;
    write::gauge(
        encoder,
        "server_cache_cached",
        "Bytes of data in the cache.",
        Some(Unit::Bytes),
        gauge(stats.cached_bytes),
    )
}

/// The tertiary tier of every target that has one (nothing when none has).
fn encode_tier(encoder: &mut DescriptorEncoder, store: &flotilla_store::Store) -> std::fmt::Result {
    let tiers: Vec<(TargetId, flotilla_store::TierStats)> = store
        .target_ids()
        .into_iter()
        .filter_map(|target| store.tier_stats(target).ok().flatten().map(|stats| (target, stats)))
        .collect();
    if tiers.is_empty() {
        return Ok(());
    }
    type Pick = fn(&flotilla_store::TierStats) -> u64;
    let counters: [(&str, &str, Option<Unit>, Pick); 7] = [
        ("server_tier_archived_forks", "Forks copied to the archive.", None, |t| t.archived_forks),
        ("server_tier_archived", "Bytes copied to the archive.", Some(Unit::Bytes), |t| t.archived_bytes),
        ("server_tier_recalls", "Recalls from the archive (reads that waited).", None, |t| t.recalls),
        (
            "server_tier_recalled",
            "Bytes recalled or read through from the archive.",
            Some(Unit::Bytes),
            |t| t.recalled_bytes,
        ),
        (
            "server_tier_recall_failures",
            "Recalls that failed (archive unreachable, object missing).",
            None,
            |t| t.recall_failures,
        ),
        ("server_tier_read_throughs", "Reads served from the archive without keeping the data.", None, |t| {
            t.read_throughs
        }),
        ("server_tier_reclaimed_blocks", "Clean blocks reclaimed for new data.", None, |t| {
            t.reclaimed_blocks
        }),
    ];
    for (name, help, unit, pick) in counters {
        let samples: Vec<(Labels, u64)> =
            tiers.iter().map(|(id, stats)| (target_labels(*id), pick(stats))).collect();
        write::counters(encoder, (name, help, unit), &samples)?;
    }
    let gauges: [(&str, &str, Pick); 3] = [
        ("server_tier_dirty", "Bytes on disk with no archive copy.", |t| t.dirty_blocks * t.block_bytes),
        ("server_tier_clean", "Bytes on disk that the archive also holds.", |t| {
            t.clean_blocks * t.block_bytes
        }),
        ("server_tier_free", "Bytes of free slots.", |t| t.free_blocks * t.block_bytes),
    ];
    for (name, help, pick) in gauges {
        let samples: Vec<(Labels, i64)> = tiers
            .iter()
            .map(|(id, stats)| (target_labels(*id), i64::try_from(pick(stats)).unwrap_or(i64::MAX)))
            .collect();
        write::gauges(encoder, (name, help, Some(Unit::Bytes)), &samples)?;
    }
    Ok(())
}

/// The collector of a server's metrics.
pub(crate) fn collector(shared: &Arc<Shared>) -> ServerCollector {
    ServerCollector { shared: Arc::downgrade(shared) }
}
