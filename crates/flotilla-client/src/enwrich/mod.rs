//! ENWRICH: compute-node write caching with collective, disk-directed flushes (Purakayastha,
//! Ellis, Kotz; docs/architecture.md "ENWRICH").
//!
//! A file opened write-only in ENWRICH mode ([`Client::open_enwrich`]) logs every write in
//! this process's [`LogCache`]; nothing goes to the I/O servers until the job flushes. The
//! processes writing the file form a *job group* at the metadata service (name and size
//! from the program or the launcher's environment, see [`EnwrichOptions::from_env`]); when
//! any member's data or directory section fills, its cache has held data for
//! `flush_timeout_ms`, or it closes or syncs, it asks the job for a flush, and every member's
//! background watcher takes part: each server receives every member's directory part, plans
//! the newest-wins blocks in disk order and pulls the bytes it needs from the members.
//! Computation that does not write never waits for a flush; a write waits while its own
//! process's cache is being flushed.

mod cache;
mod clock;
mod flush;

pub use cache::{Full, LogCache, LogEntry, DIRECTORY_ENTRY_BYTES};
pub use clock::{now_ms, HybridClock, LOGICAL_BITS};

use crate::client::Client;
use crate::error::{unexpected, ClientError};
use crate::file::File;
use flotilla_proto::{ErrorCode, FlushJob, JobEvent, MetaReply, MetaRequest};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The environment variable naming the job group (`FLOTILLA_JOB_NAME`).
pub const JOB_NAME_ENV: &str = "FLOTILLA_JOB_NAME";
/// The environment variable giving the job's size (`FLOTILLA_JOB_SIZE`).
pub const JOB_SIZE_ENV: &str = "FLOTILLA_JOB_SIZE";

/// How a file is opened in ENWRICH mode.
#[derive(Clone, Debug)]
pub struct EnwrichOptions {
    /// The job group's name: every process of the job passes the same one.
    pub job_name: String,
    /// How many processes the job has (all must join before any of them asks for a flush).
    pub job_size: u32,
    /// The log cache's size (paper: 1 MB per process).
    pub cache_bytes: u64,
    /// The share of the cache that holds the directory (paper: one tenth).
    pub directory_fraction: f64,
    /// A cache holding data this long asks for a flush (0: never on time alone).
    pub flush_timeout_ms: u64,
    /// How long one `JobWait` long-poll lasts (the metadata service bounds it too).
    pub job_wait_ms: u64,
}

impl EnwrichOptions {
    pub fn new(job_name: impl Into<String>, job_size: u32) -> EnwrichOptions {
        EnwrichOptions {
            job_name: job_name.into(),
            job_size,
            cache_bytes: 4 << 20,
            directory_fraction: 0.1,
            flush_timeout_ms: 30_000,
            job_wait_ms: 200,
        }
    }

    /// The job from the environment: `FLOTILLA_JOB_NAME` and `FLOTILLA_JOB_SIZE`; failing
    /// those, SLURM's `SLURM_JOB_ID`.`SLURM_STEP_ID` and `SLURM_NTASKS`, or the size from
    /// MPI launchers' `OMPI_COMM_WORLD_SIZE` (Open MPI) or `PMI_SIZE` (MPICH's Hydra).
    pub fn from_env() -> Option<EnwrichOptions> {
        EnwrichOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// The job as [`EnwrichOptions::from_env`] finds it, from the variables `lookup` returns
    /// (the mount reads another process's environment this way).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Option<EnwrichOptions> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let name = var(JOB_NAME_ENV).or_else(|| {
            let job = var("SLURM_JOB_ID")?;
            Some(format!("slurm-{job}.{}", var("SLURM_STEP_ID").unwrap_or_else(|| "0".into())))
        })?;
        let size = [JOB_SIZE_ENV, "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
            .iter()
            .find_map(|v| var(v).and_then(|s| s.parse::<u32>().ok()))?;
        Some(EnwrichOptions::new(name, size))
    }
}

/// What the writer and the watcher share.
struct Shared {
    file: File,
    /// The job group's name at the metadata service: the job's name and the file's id.
    group: String,
    member: u32,
    size: u32,
    options: EnwrichOptions,
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

struct State {
    cache: LogCache,
    clock: HybridClock,
    /// The next flush generation.
    epoch: u64,
    /// The generation that last failed, and why.
    failed: Option<(u64, String)>,
    /// When the cache got its first entry since the last flush (the timeout trigger).
    first_write: Option<Instant>,
    /// The largest byte written since the last flush, published after it.
    end_bytes: u64,
    /// Flushes this member took part in, and bytes its servers wrote.
    flushes: u64,
    /// The last generation flushed durably (synced on every server).
    durable_done: Option<u64>,
    /// Each server's boot epoch when a flush that was not durable left bytes in its cache:
    /// a server that restarted before the next durable flush may have lost them.
    unsynced: HashMap<String, u64>,
    /// Set once a server restart may have lost flushed bytes: every later sync fails.
    lost: Option<String>,
    /// What this member knows of the job: the highest generations it asked for or learned
    /// were asked, the largest clock, the members that left. Presented in a `JobReclaim`
    /// when the metadata service lost the job (a new leader, a restart).
    known: JobEvent,
}

/// Merges `event` into what a member knows of its job (maxima and unions).
fn merge_known(known: &mut JobEvent, event: &JobEvent) {
    known.flush_asked = known.flush_asked.max(event.flush_asked);
    known.durable_asked = known.durable_asked.max(event.durable_asked);
    known.clock = known.clock.max(event.clock);
    for gone in &event.left {
        if !known.left.iter().any(|(member, _)| *member == gone.0) {
            known.left.push(*gone);
        }
    }
}

/// A file open for writing in ENWRICH mode. Reads go through [`Client::open`], which flushes
/// this process's ENWRICH handles on the file first.
pub struct EnwrichFile {
    shared: Arc<Shared>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

/// This process's ENWRICH handles by (client core, file id), for flush-on-read.
type Registry = Mutex<HashMap<(usize, u64), Weak<Shared>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Client {
    /// Flushes this process's ENWRICH handles on file `id` durably (flush-on-read): `open`
    /// does it; a caller that opens by id (the mount) calls it before opening other than in
    /// ENWRICH mode.
    pub fn flush_enwrich(&self, id: u64) -> Result<(), ClientError> {
        let key = (Arc::as_ptr(&self.core) as usize, id);
        let handle = registry().lock().get(&key).and_then(Weak::upgrade);
        match handle {
            Some(shared) => flush_and_wait(&shared, true),
            None => Ok(()),
        }
    }
}

impl EnwrichFile {
    /// Joins the job group of `options` with `file`, open for writing (`Client::open_enwrich`).
    pub(crate) fn join(file: File, options: EnwrichOptions) -> Result<EnwrichFile, ClientError> {
        // A replicated file (issue 32): each subfile's part goes to its chain's head, which
        // applies the pulled data through the chain (docs/architecture-log.md, "ENWRICH
        // flushes of replicated files").
        let group = format!("{}/{}", options.job_name, file.id());
        let request = MetaRequest::JobJoin { name: group.clone(), size: options.job_size };
        let (member, epoch, event) = match file.client.meta(request)? {
            MetaReply::JobJoined { member, epoch, event } => (member, epoch, event),
            other => return Err(unexpected("job join", &other)),
        };
        let mut clock = HybridClock::default();
        clock.observe(event.clock);
        let state = State {
            cache: LogCache::new(options.cache_bytes, options.directory_fraction),
            clock,
            epoch,
            failed: None,
            first_write: None,
            end_bytes: 0,
            flushes: 0,
            durable_done: None,
            unsynced: HashMap::new(),
            lost: None,
            known: event,
        };
        let size = options.job_size;
        let shared = Arc::new(Shared {
            file,
            group,
            member,
            size,
            options,
            state: Mutex::new(state),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let key = (Arc::as_ptr(&shared.file.client.core) as usize, shared.file.id());
        registry().lock().insert(key, Arc::downgrade(&shared));
        let watching = shared.clone();
        let watcher = std::thread::Builder::new()
            .name("flotilla-enwrich".into())
            .spawn(move || watch(&watching))
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        Ok(EnwrichFile { shared, watcher: Some(watcher) })
    }

    /// This process's index in the job, `0..job_size`.
    pub fn member(&self) -> u32 {
        self.shared.member
    }

    pub fn file(&self) -> &File {
        &self.shared.file
    }

    /// Flushes this member took part in.
    pub fn flushes(&self) -> u64 {
        self.shared.state.lock().flushes
    }

    /// Why the last failed flush this member took part in failed, if one did.
    pub fn last_failure(&self) -> Option<String> {
        self.shared.state.lock().failed.as_ref().map(|(_, message)| message.clone())
    }

    /// Logs `data` at `offset`; returns the hybrid-logical-clock stamp of its (last) entry.
    /// A full cache asks the job for a flush and waits for it.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<u64, ClientError> {
        let shared = &self.shared;
        let id = shared.file.id();
        let (mut at, mut rest, mut stamp) = (offset, data, 0);
        loop {
            let mut state = shared.state.lock();
            stamp = state.clock.stamp(now_ms()).max(stamp);
            let (taken, full) = state.cache.append(id, at, rest, stamp);
            if taken > 0 {
                state.first_write.get_or_insert_with(Instant::now);
                state.end_bytes = state.end_bytes.max(at + taken as u64);
            }
            (at, rest) = (at + taken as u64, &rest[taken..]);
            if full.is_none() {
                return Ok(stamp);
            }
            drop(state);
            flush_and_wait(shared, false)?;
            if rest.is_empty() {
                return Ok(stamp);
            }
        }
    }

    /// Flushes the whole job now and waits until this member's data is durable and the size
    /// published.
    pub fn sync(&self) -> Result<(), ClientError> {
        flush_and_wait(&self.shared, true)
    }

    /// Flushes, leaves the job group and stops the watcher.
    pub fn close(mut self) -> Result<(), ClientError> {
        let outcome = self.leave();
        self.stop();
        outcome
    }

    fn leave(&self) -> Result<(), ClientError> {
        let shared = &self.shared;
        loop {
            // Logged bytes, bytes flushed but not synced, or a size not published: a durable
            // flush first.
            let pending = {
                let state = shared.state.lock();
                !state.cache.is_empty() || !state.unsynced.is_empty() || state.end_bytes > 0
            };
            if pending {
                flush_and_wait(shared, true)?;
            }
            let epoch = shared.state.lock().epoch;
            let request = MetaRequest::JobLeave { name: shared.group.clone(), member: shared.member, epoch };
            match job_call(shared, request) {
                Ok(_) => return Ok(()),
                // A flush of this generation was asked: take part (the watcher does), then leave.
                Err(ClientError::Meta(error)) if error.code == ErrorCode::Unavailable => {
                    wait_flushed(shared, epoch)?;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Stops the watcher without waiting for its long-poll to end: it checks the flag before
    /// taking part in anything, and exits at its next turn (within `job_wait_ms`).
    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        drop(self.watcher.take());
        let key = (Arc::as_ptr(&self.shared.file.client.core) as usize, self.shared.file.id());
        registry().lock().remove(&key);
    }
}

impl Drop for EnwrichFile {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Flushes a `durable` generation asked before it started, at most this many times over.
const DURABLE_ATTEMPTS_MAX: usize = 16;

/// Asks the job to flush the current generation and waits until it is done here; a
/// `durable` flush also waits until a generation flushed as durable (synced) has covered
/// everything this member logged before the call. Nothing to flush anywhere is still a flush:
/// the job's other members may hold data.
fn flush_and_wait(shared: &Shared, durable: bool) -> Result<(), ClientError> {
    for _ in 0..DURABLE_ATTEMPTS_MAX {
        let (epoch, clock) = {
            let state = shared.state.lock();
            if let Some(lost) = &state.lost {
                return Err(ClientError::Enwrich(lost.clone()));
            }
            (state.epoch, state.clock.last())
        };
        ask_flush(shared, (epoch, durable), clock)?;
        wait_flushed(shared, epoch)?;
        let state = shared.state.lock();
        // A generation already under way when this member asked may not be durable: then
        // the next one is (it was asked durable before it started).
        if !durable || state.durable_done.is_some_and(|done| done >= epoch) {
            return Ok(());
        }
    }
    Err(ClientError::Enwrich(format!("no durable flush in {DURABLE_ATTEMPTS_MAX} generations")))
}

fn ask_flush(shared: &Shared, (epoch, durable): (u64, bool), clock: u64) -> Result<(), ClientError> {
    let request =
        MetaRequest::JobFlush { name: shared.group.clone(), member: shared.member, epoch, clock, durable };
    job_call(shared, request)?;
    let mut state = shared.state.lock();
    let asked = JobEvent {
        flush_asked: Some(epoch),
        durable_asked: durable.then_some(epoch),
        clock,
        left: Vec::new(),
    };
    merge_known(&mut state.known, &asked);
    Ok(())
}

/// A job request; when the metadata service does not know the job or this member (a new
/// leader after a failover, a restart: `NotFound`), the member reclaims its place with what
/// it knows (`JobReclaim`) and sends the request once more.
fn job_call(shared: &Shared, request: MetaRequest) -> Result<MetaReply, ClientError> {
    match shared.file.client.meta(request.clone()) {
        Err(ClientError::Meta(error)) if error.code == ErrorCode::NotFound => {
            tracing::info!(job = %shared.group, member = shared.member, %error, "ENWRICH: reclaiming the job");
            reclaim(shared)?;
            shared.file.client.meta(request)
        }
        other => other,
    }
}

/// Presents this member's account of the job to a metadata service that lost it.
fn reclaim(shared: &Shared) -> Result<(), ClientError> {
    let (epoch, known) = {
        let state = shared.state.lock();
        let mut known = state.known.clone();
        known.clock = known.clock.max(state.clock.last());
        (state.epoch, known)
    };
    let request = MetaRequest::JobReclaim {
        name: shared.group.clone(),
        size: shared.size,
        member: shared.member,
        epoch,
        known,
    };
    match shared.file.client.meta(request)? {
        MetaReply::JobJoined { member, event, .. } if member == shared.member => {
            let mut state = shared.state.lock();
            state.clock.observe(event.clock);
            merge_known(&mut state.known, &event);
            Ok(())
        }
        other => Err(unexpected("job reclaim", &other)),
    }
}

/// Waits until generation `epoch` is flushed (or failed) by the watcher.
fn wait_flushed(shared: &Shared, epoch: u64) -> Result<(), ClientError> {
    let mut state = shared.state.lock();
    while state.epoch <= epoch {
        if shared.stop.load(Ordering::Acquire) {
            return Err(ClientError::Enwrich("the ENWRICH handle was closed during a flush".into()));
        }
        shared.changed.wait_for(&mut state, Duration::from_millis(100));
    }
    match &state.failed {
        Some((failed, message)) if *failed == epoch => Err(ClientError::Enwrich(message.clone())),
        _ => Ok(()),
    }
}

/// The watcher: long-polls the job group and takes part in every flush it asks for; asks
/// for one itself when the cache has held data for `flush_timeout_ms`.
fn watch(shared: &Arc<Shared>) {
    let timeout = Duration::from_millis(shared.options.flush_timeout_ms);
    while !shared.stop.load(Ordering::Acquire) {
        let (epoch, clock, due) = {
            let state = shared.state.lock();
            let due = shared.options.flush_timeout_ms > 0
                && state.first_write.is_some_and(|first| first.elapsed() >= timeout);
            (state.epoch, state.clock.last(), due)
        };
        if due {
            if let Err(error) = ask_flush(shared, (epoch, false), clock) {
                tracing::warn!(%error, "ENWRICH: timed flush not asked");
            }
        }
        let request = MetaRequest::JobWait {
            name: shared.group.clone(),
            member: shared.member,
            epoch,
            clock,
            wait_ms: shared.options.job_wait_ms.max(1),
        };
        match job_call(shared, request) {
            Ok(MetaReply::Job(event)) => take_part(shared, epoch, &event),
            Ok(other) => tracing::warn!(reply = ?other, "ENWRICH: unexpected reply to a job wait"),
            Err(error) => {
                tracing::debug!(%error, "ENWRICH: job wait failed; trying again");
                std::thread::sleep(Duration::from_millis(shared.options.job_wait_ms.clamp(1, 1000)));
            }
        }
    }
}

/// Runs generation `epoch`'s flush here if `event` says it was asked.
fn take_part(shared: &Shared, epoch: u64, event: &JobEvent) {
    let mut state = shared.state.lock();
    if shared.stop.load(Ordering::Acquire) {
        return;
    }
    state.clock.observe(event.clock);
    merge_known(&mut state.known, event);
    if event.flush_asked.is_none_or(|asked| asked < epoch) || state.epoch != epoch {
        return;
    }
    let absent: Vec<u32> =
        event.left.iter().filter(|(_, from)| *from <= epoch).map(|(member, _)| *member).collect();
    // This member left before this generation (its watcher not yet stopped): no part in it.
    if absent.contains(&shared.member) {
        return;
    }
    let job = FlushJob {
        name: shared.group.clone(),
        epoch,
        member: shared.member,
        members: shared.size,
        absent,
        file: shared.file.entry().file_id(),
        durable: event.durable_asked.is_some_and(|asked| asked >= epoch),
    };
    let client = &shared.file.client;
    let outcome = client.block_on(flush::flush(
        &client.core.transport,
        client.core.chains(),
        shared.file.entry(),
        &job,
        &state.cache,
    ));
    let outcome = outcome.and_then(|servers| settle(shared, &mut state, &servers, job.durable));
    match outcome {
        Ok(()) => {
            state.cache.clear();
            state.first_write = None;
            state.flushes += 1;
            if job.durable {
                state.durable_done = Some(epoch);
            }
        }
        Err(error) => {
            let message = format!("flush {epoch} of job {:?} failed: {error}", shared.options.job_name);
            tracing::warn!(%message, "ENWRICH");
            state.failed = Some((epoch, message));
            // The timeout trigger tries again one timeout later, not at once.
            if state.first_write.is_some() {
                state.first_write = Some(Instant::now());
            }
        }
    }
    state.epoch = epoch + 1;
    drop(state);
    shared.changed.notify_all();
}

/// After every server answered: a durable flush checks that no server restarted since a
/// flush that was not durable left bytes in its cache (else those bytes may be lost, and
/// every later sync says so), then publishes the size; a flush that was not durable notes
/// each server's boot epoch.
fn settle(
    shared: &Shared,
    state: &mut State,
    servers: &[flush::ServerDone],
    durable: bool,
) -> Result<(), ClientError> {
    for (server, epoch, _) in servers {
        let before = *state.unsynced.entry(server.clone()).or_insert(*epoch);
        if before != *epoch {
            let lost = format!(
                "server {server} restarted after an earlier flush of job {:?} left bytes in its cache \
                 unsynced; they may be lost",
                shared.options.job_name
            );
            state.lost = Some(lost.clone());
            return Err(ClientError::Enwrich(lost));
        }
    }
    if !durable {
        return Ok(());
    }
    state.unsynced.clear();
    if state.end_bytes > 0 {
        let client = &shared.file.client;
        client.core.note_write(shared.file.id(), state.end_bytes, crate::file::now_ns());
    }
    shared.file.flush()?;
    state.end_bytes = 0;
    Ok(())
}
