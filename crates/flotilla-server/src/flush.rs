//! ENWRICH flush sessions: the server's side of a job's collective, disk-directed flush
//! (docs/architecture.md "ENWRICH", docs/protocol.md "ENWRICH flush").
//!
//! One session per (job, generation, file). Its conductor task waits for every member's
//! directory (bounded by `flush_member_wait_ms`), plans the newest-wins blocks in disk order
//! (`flush_plan`), then for each block sends the members the ranges it needs — as the reply
//! to their pending `FlushPull`/`FlushData` — and writes the assembled block through the
//! store while the next block is pulled (double buffering: at most one block being written
//! and one being pulled). When every block is written it syncs the forks and answers every
//! member `Flushed`; any failure (a member's connection closing, a member not answering, a
//! bad directory, a store error) answers every member the same error, naming the cause.
//! Connection handlers never block a worker thread: they wait for the conductor's orders
//! on the async runtime, each holding one of its connection's queue slots.

use crate::connection::memory_units;
use crate::execute::{store_error, Executor};
use crate::flush_plan::{assemble, check, plan, MemberEntry, PlanBounds, Step};
use bytes::Bytes;
use flotilla_proto::{ErrorCode, FlushEntry, FlushJob, IoReply, IoRequest, PullRange, WireError};
use flotilla_store::{Extent, ForkRef};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

/// The fork a file's linear data lives in (the client's `DEFAULT_FORK`).
const DATA_FORK: &str = "data";
/// Orders queued for one member (one pull and the final answer at most, with room).
const ORDERS_QUEUED_MAX: usize = 4;
/// Events queued for a conductor per member.
const EVENTS_PER_MEMBER: usize = 2;

/// Settings of the flush sessions (from `ServerConfig`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlushConfig {
    pub sessions_max: usize,
    pub members_max: u32,
    pub entries_max: usize,
    pub member_wait: Duration,
    pub block_bytes: u64,
    pub segments_per_step_max: usize,
}

type SessionKey = (String, u64, FileId);

enum Event {
    Directory { member: u32, entries: Vec<FlushEntry>, closed: watch::Receiver<bool>, durable: bool },
    Data { member: u32, ranges: Vec<PullRange>, data: Bytes, _held: flotilla_proto::Reservation },
    Gone { member: u32 },
}

#[derive(Clone)]
enum Order {
    Pull(Vec<PullRange>),
    Done(u64),
    Fail(WireError),
}

struct Session {
    members: u32,
    absent: Vec<u32>,
    inbox: mpsc::Sender<Event>,
    orders: Vec<tokio::sync::Mutex<mpsc::Receiver<Order>>>,
    /// Members that were handed the final answer (`Flushed` or the error), and a signal
    /// for each: the session is forgotten once every expected member has its answer.
    answered: std::sync::atomic::AtomicUsize,
    answer_given: tokio::sync::Notify,
}

/// Forks written by flushes that were not durable, per (job, file): the next durable flush
/// of the job syncs them.
type Unsynced = HashMap<(String, FileId), BTreeSet<(TargetId, SubfileIndex)>>;

/// Jobs whose non-durable flushes a server remembers, per allowed session; past this a
/// flush syncs at once.
const UNSYNCED_JOBS_PER_SESSION: usize = 16;

/// Every flush session of this server.
pub(crate) struct Sessions {
    sessions: Mutex<HashMap<SessionKey, Arc<Session>>>,
    unsynced: Mutex<Unsynced>,
    config: FlushConfig,
    executor: Arc<Executor>,
    memory: Arc<Semaphore>,
    memory_units_max: u32,
    server_name: String,
    /// The chain data path: a subfile on a chain (replicated file) is flushed through it.
    chains: Option<Arc<crate::chain_path::ChainPaths>>,
}

/// Whether `request` belongs to the flush sessions rather than the workers.
pub(crate) fn is_flush(request: &IoRequest) -> bool {
    matches!(
        request,
        IoRequest::FlushDirectory { .. } | IoRequest::FlushPull { .. } | IoRequest::FlushData { .. }
    )
}

fn bad(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

fn unavailable(message: String) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

impl Sessions {
    pub fn new(
        config: FlushConfig,
        executor: Arc<Executor>,
        (memory, memory_units_max): (Arc<Semaphore>, u32),
        server_name: String,
        chains: Option<Arc<crate::chain_path::ChainPaths>>,
    ) -> Sessions {
        Sessions {
            sessions: Mutex::new(HashMap::new()),
            unsynced: Mutex::new(HashMap::new()),
            config,
            executor,
            memory,
            memory_units_max,
            server_name,
            chains,
        }
    }

    /// Answers one flush message (after the connection authorized it). `held` is the
    /// frame's share of the memory budget, kept with pulled data until it is written;
    /// `closed` turns true when the sender's connection ends.
    pub async fn handle(
        self: &Arc<Self>,
        request: IoRequest,
        data: Bytes,
        held: flotilla_proto::Reservation,
        closed: watch::Receiver<bool>,
    ) -> IoReply {
        let outcome = match request {
            IoRequest::FlushDirectory { job, entries } => self.directory(job, entries, closed).await,
            IoRequest::FlushPull { job } => match self.session(&job, false) {
                Ok(session) => Ok(next_order(&session, job.member).await),
                Err(error) => Err(error),
            },
            IoRequest::FlushData { job, ranges } => self.data(job, ranges, data, held).await,
            other => Err(bad(format!("{other:?} is not a flush message"))),
        };
        outcome.unwrap_or_else(IoReply::Error)
    }

    async fn directory(
        self: &Arc<Self>,
        job: FlushJob,
        entries: Vec<FlushEntry>,
        closed: watch::Receiver<bool>,
    ) -> Result<IoReply, WireError> {
        if entries.len() > self.config.entries_max {
            return Err(WireError::new(
                ErrorCode::OverLimit,
                format!(
                    "{} directory entries, over flush_entries_max = {}",
                    entries.len(),
                    self.config.entries_max
                ),
            ));
        }
        for (index, entry) in entries.iter().enumerate() {
            if self.executor.store.target_dir(entry.target).is_err() {
                let message =
                    format!("directory entry {index} names target {}, not on this server", entry.target);
                return Err(WireError::new(ErrorCode::NotFound, message));
            }
        }
        let session = self.session(&job, true)?;
        let event = Event::Directory { member: job.member, entries, closed, durable: job.durable };
        session.inbox.send(event).await.map_err(|_| ended(&job))?;
        Ok(IoReply::Done { bytes: 0 })
    }

    async fn data(
        self: &Arc<Self>,
        job: FlushJob,
        ranges: Vec<PullRange>,
        data: Bytes,
        held: flotilla_proto::Reservation,
    ) -> Result<IoReply, WireError> {
        let session = self.session(&job, false)?;
        let event = Event::Data { member: job.member, ranges, data, _held: held };
        session.inbox.send(event).await.map_err(|_| ended(&job))?;
        Ok(next_order(&session, job.member).await)
    }

    /// The job's session, created (with its conductor) by the first directory.
    fn session(self: &Arc<Self>, job: &FlushJob, create: bool) -> Result<Arc<Session>, WireError> {
        check_job(job, self.config.members_max)?;
        let key = (job.name.clone(), job.epoch, job.file);
        let mut sessions = self.sessions.lock();
        if let Some(session) = sessions.get(&key) {
            if session.members != job.members || session.absent != job.absent {
                return Err(bad(format!(
                    "member {} of job {:?} says {} members, absent {:?}; others said {}, absent {:?}",
                    job.member, job.name, job.members, job.absent, session.members, session.absent
                )));
            }
            return Ok(session.clone());
        }
        if !create {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!(
                    "no flush of generation {} of job {:?} here: send the directory first",
                    job.epoch, job.name
                ),
            ));
        }
        if sessions.len() >= self.config.sessions_max {
            return Err(WireError::new(
                ErrorCode::OverLimit,
                format!("{} flushes in progress, the limit flush_sessions_max", sessions.len()),
            ));
        }
        let (inbox, events) = mpsc::channel(EVENTS_PER_MEMBER * job.members as usize + 1);
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..job.members).map(|_| mpsc::channel(ORDERS_QUEUED_MAX)).unzip();
        let session = Arc::new(Session {
            members: job.members,
            absent: job.absent.clone(),
            inbox,
            orders: receivers.into_iter().map(tokio::sync::Mutex::new).collect(),
            answered: std::sync::atomic::AtomicUsize::new(0),
            answer_given: tokio::sync::Notify::new(),
        });
        sessions.insert(key.clone(), session.clone());
        let conductor =
            Conductor { sessions: self.clone(), key, job: job.clone(), session: session.clone(), senders };
        tokio::spawn(conductor.run(events));
        Ok(session)
    }
}

fn ended(job: &FlushJob) -> WireError {
    unavailable(format!("the flush of generation {} of job {:?} has ended", job.epoch, job.name))
}

/// Checks what a member says about the job: bounded, consistent.
fn check_job(job: &FlushJob, members_max: u32) -> Result<(), WireError> {
    if job.members == 0 || job.members > members_max {
        return Err(bad(format!(
            "job of {} members, outside 1..={members_max} (flush_members_max)",
            job.members
        )));
    }
    if job.member >= job.members {
        return Err(bad(format!("member {} of a job of {} members", job.member, job.members)));
    }
    let ascending = job.absent.windows(2).all(|w| w[0] < w[1]);
    if !ascending || job.absent.iter().any(|m| *m >= job.members || *m == job.member) {
        return Err(bad(format!(
            "absent members {:?} are not ascending, distinct others of the job",
            job.absent
        )));
    }
    Ok(())
}

/// Waits for the conductor's next order for `member` and turns it into the reply.
async fn next_order(session: &Session, member: u32) -> IoReply {
    let Some(orders) = session.orders.get(member as usize) else {
        return IoReply::Error(bad(format!("no member {member} in this job")));
    };
    let order = orders.lock().await.recv().await;
    if matches!(order, Some(Order::Done(_) | Order::Fail(_))) {
        session.answered.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        session.answer_given.notify_one();
    }
    match order {
        Some(Order::Pull(ranges)) => IoReply::Pull { ranges },
        Some(Order::Done(bytes)) => IoReply::Flushed { bytes },
        Some(Order::Fail(error)) => IoReply::Error(error),
        None => IoReply::Error(unavailable("the flush ended".into())),
    }
}

/// The task that runs one session.
struct Conductor {
    sessions: Arc<Sessions>,
    key: SessionKey,
    job: FlushJob,
    session: Arc<Session>,
    senders: Vec<mpsc::Sender<Order>>,
}

impl Conductor {
    async fn run(self, mut events: mpsc::Receiver<Event>) {
        let outcome = self.flush(&mut events).await;
        let last = match outcome {
            Ok(bytes) => Order::Done(bytes),
            Err(error) => {
                tracing::warn!(job = %self.job.name, epoch = self.job.epoch, %error, "ENWRICH flush failed");
                Order::Fail(error)
            }
        };
        for sender in &self.senders {
            let _ = sender.try_send(last.clone());
        }
        // Members still to poll get the queued answer; late events are dropped. The session
        // is forgotten once every expected member has its answer, or after
        // `flush_member_wait_ms` (a member that never polls again).
        let deadline = Instant::now() + self.sessions.config.member_wait;
        let expected = self.expected().len();
        let session = &self.session;
        while session.answered.load(std::sync::atomic::Ordering::Acquire) < expected {
            let waited = tokio::select! {
                event = timeout_at(deadline, events.recv()) => event.is_ok(),
                _ = timeout_at(deadline, session.answer_given.notified()) => Instant::now() < deadline,
            };
            if !waited {
                break;
            }
        }
        self.sessions.sessions.lock().remove(&self.key);
    }

    fn expected(&self) -> Vec<u32> {
        (0..self.session.members).filter(|m| !self.session.absent.contains(m)).collect()
    }

    fn gone(&self, member: u32) -> WireError {
        unavailable(format!(
            "member {member} of job {:?} went away during flush {}: its connection to server {} closed",
            self.job.name, self.job.epoch, self.sessions.server_name
        ))
    }

    async fn flush(&self, events: &mut mpsc::Receiver<Event>) -> Result<u64, WireError> {
        let (directories, durable) = self.directories(events).await?;
        let entries: Vec<MemberEntry> = directories
            .iter()
            .flat_map(|(member, list)| {
                list.iter().enumerate().map(|(index, entry)| MemberEntry {
                    member: *member,
                    index: index as u32,
                    entry: *entry,
                })
            })
            .collect();
        check(&entries).map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let config = &self.sessions.config;
        let bounds = PlanBounds {
            block_bytes: config.block_bytes,
            segments_per_step_max: config.segments_per_step_max,
        };
        let steps = plan(&entries, bounds);
        // Replicated subfiles (issue 32): which are on a chain, as the metadata service says
        // (asked on every flush with data: a server that has not heard of its chains yet
        // must not write a chained subfile alone);
        // their blocks go through the chain (this server must be its head) and are synced
        // on every member before the flush returns.
        let chained = match &self.sessions.chains {
            Some(paths) if !steps.is_empty() => paths.subfile_chains(self.job.file).await?,
            _ => HashMap::new(),
        };
        let mut chained_forks = BTreeMap::new();
        let mut forks = BTreeSet::new();
        let mut writing: Option<tokio::task::JoinHandle<Result<(), WireError>>> = None;
        let mut total = 0;
        for step in steps {
            let (extents, packed, permit) = self.pull(&step, events).await?;
            if let Some(previous) = writing.take() {
                join(previous).await?;
            }
            let chain = chained.get(&step.subfile).copied();
            match chain {
                Some(chain) => {
                    chained_forks.insert((step.target, step.subfile), chain);
                }
                None => {
                    forks.insert((step.target, step.subfile));
                }
            }
            total += step.bytes();
            writing = Some(self.write(&step, chain, extents, packed, permit));
        }
        if let Some(previous) = writing {
            join(previous).await?;
        }
        let unsynced_key = (self.job.name.clone(), self.job.file);
        let to_sync = {
            let config = &self.sessions.config;
            let mut unsynced = self.sessions.unsynced.lock();
            let room = unsynced.contains_key(&unsynced_key)
                || unsynced.len() < config.sessions_max.saturating_mul(UNSYNCED_JOBS_PER_SESSION);
            if durable || !room {
                let mut all = unsynced.remove(&unsynced_key).unwrap_or_default();
                all.extend(forks);
                all
            } else {
                unsynced.entry(unsynced_key).or_default().extend(forks);
                BTreeSet::new()
            }
        };
        self.sync(to_sync).await?;
        self.sync_chained(chained_forks).await?;
        Ok(total)
    }

    /// Every expected member's directory, and whether any member asked for a durable
    /// flush; or an error naming who is missing or gone.
    async fn directories(
        &self,
        events: &mut mpsc::Receiver<Event>,
    ) -> Result<(BTreeMap<u32, Vec<FlushEntry>>, bool), WireError> {
        let expected = self.expected();
        let mut directories = BTreeMap::new();
        let mut durable = false;
        let deadline = Instant::now() + self.sessions.config.member_wait;
        while directories.len() < expected.len() {
            let Ok(event) = timeout_at(deadline, events.recv()).await else {
                let missing: Vec<u32> =
                    expected.iter().filter(|m| !directories.contains_key(*m)).copied().collect();
                return Err(unavailable(format!(
                    "no directory from {} of job {:?} within {} ms (flush_member_wait_ms); server {}",
                    members_named(&missing),
                    self.job.name,
                    self.sessions.config.member_wait.as_millis(),
                    self.sessions.server_name
                )));
            };
            match event {
                Some(Event::Directory { member, entries, closed, durable: asked }) => {
                    durable |= asked;
                    if !expected.contains(&member) || directories.contains_key(&member) {
                        return Err(bad(format!("member {member} sent a directory it may not send")));
                    }
                    self.watch(member, closed);
                    directories.insert(member, entries);
                }
                Some(Event::Gone { member }) => return Err(self.gone(member)),
                Some(Event::Data { member, .. }) => {
                    return Err(bad(format!("member {member} sent data before it was asked")))
                }
                None => return Err(ended(&self.job)),
            }
        }
        Ok((directories, durable))
    }

    /// Reports `member` gone when its connection closes (until the session ends).
    fn watch(&self, member: u32, mut closed: watch::Receiver<bool>) {
        let inbox = self.session.inbox.clone();
        tokio::spawn(async move {
            let gone = tokio::select! {
                _ = async { closed.wait_for(|closed| *closed).await.map(|_| ()) } => true,
                _ = inbox.closed() => false,
            };
            if gone {
                let _ = inbox.send(Event::Gone { member }).await;
            }
        });
    }

    /// Asks the step's members for their ranges, waits for all of them (bounded), and
    /// assembles the block in memory reserved from the server's data budget first.
    async fn pull(
        &self,
        step: &Step,
        events: &mut mpsc::Receiver<Event>,
    ) -> Result<(Vec<Extent>, Vec<u8>, OwnedSemaphorePermit), WireError> {
        let members = step.members();
        for member in &members {
            let sender = &self.senders[*member as usize];
            sender.send(Order::Pull(step.pulls(*member))).await.map_err(|_| ended(&self.job))?;
        }
        // A frame's share of the data budget ends when its bytes arrive here (holding it while
        // waiting for the block's share below could deadlock flushes against each other); the
        // bytes wait here at most one step, for at most `flush_sessions_max` sessions.
        let mut answers: BTreeMap<u32, Bytes> = BTreeMap::new();
        let deadline = Instant::now() + self.sessions.config.member_wait;
        while answers.len() < members.len() {
            let Ok(event) = timeout_at(deadline, events.recv()).await else {
                let silent: Vec<u32> =
                    members.iter().filter(|m| !answers.contains_key(*m)).copied().collect();
                return Err(unavailable(format!(
                    "{} of job {:?} did not answer a pull within {} ms (flush_member_wait_ms)",
                    members_named(&silent),
                    self.job.name,
                    self.sessions.config.member_wait.as_millis()
                )));
            };
            match event {
                Some(Event::Data { member, ranges, data, .. }) => {
                    if !members.contains(&member)
                        || answers.contains_key(&member)
                        || ranges != step.pulls(member)
                    {
                        return Err(bad(format!("member {member} sent data that was not asked for")));
                    }
                    answers.insert(member, data);
                }
                Some(Event::Gone { member }) => return Err(self.gone(member)),
                Some(Event::Directory { member, .. }) => {
                    return Err(bad(format!("member {member} sent its directory twice")))
                }
                None => return Err(ended(&self.job)),
            }
        }
        let units = memory_units(step.bytes(), self.sessions.memory_units_max);
        let permit =
            self.sessions.memory.clone().acquire_many_owned(units).await.map_err(|_| ended(&self.job))?;
        let empty = Bytes::new();
        let (extents, packed) = assemble(step, |m| answers.get(&m).unwrap_or(&empty).as_ref())
            .map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let extents = extents.into_iter().map(|(offset, length)| Extent { offset, length }).collect();
        Ok((extents, packed, permit))
    }

    /// Writes one block through the store on a blocking thread, holding its memory.
    /// A block of a subfile on `chain` goes through the chain instead, one chained write
    /// per extent, each applied by every member of the write path before the next.
    fn write(
        &self,
        step: &Step,
        chain: Option<u32>,
        extents: Vec<Extent>,
        packed: Vec<u8>,
        permit: OwnedSemaphorePermit,
    ) -> tokio::task::JoinHandle<Result<(), WireError>> {
        let executor = self.sessions.executor.clone();
        let (target, file, subfile) = (step.target, self.job.file, step.subfile);
        if let (Some(chain), Some(paths)) = (chain, self.sessions.chains.clone()) {
            let packed = Bytes::from(packed);
            return tokio::spawn(async move {
                let _memory = permit;
                let mut at = 0usize;
                for extent in extents {
                    let end = at.saturating_add(usize::try_from(extent.length).unwrap_or(usize::MAX));
                    let Some(piece) = (end <= packed.len()).then(|| packed.slice(at..end)) else {
                        return Err(bad(format!("flush block of chain {chain}: extents outrun the block")));
                    };
                    at = end;
                    let fork = flotilla_proto::ForkRef { target, file, subfile, fork: DATA_FORK.into() };
                    let shape = flotilla_request::Shape::contiguous(extent.offset, extent.length);
                    paths.flush_change(chain, IoRequest::Write { fork, shape }, piece).await?;
                }
                Ok(())
            });
        }
        tokio::task::spawn_blocking(move || {
            let _memory = permit;
            let fork = ForkRef::new(target, file, subfile, DATA_FORK);
            // Subfiles are created lazily, on their first write.
            crate::execute::again_once_created(
                || executor.store.write(&fork, &extents, &packed),
                |error| matches!(error, flotilla_store::StoreError::UnknownSubfile { .. }),
                || executor.store.create_subfile(target, file, subfile),
            )
            .map_err(store_error)
        })
    }

    /// Syncs every flushed fork of a chain on every member of its write path (a chained
    /// `Sync`), durable flush or not.
    async fn sync_chained(&self, forks: BTreeMap<(TargetId, SubfileIndex), u32>) -> Result<(), WireError> {
        let Some(paths) = &self.sessions.chains else { return Ok(()) };
        for ((target, subfile), chain) in forks {
            let fork =
                flotilla_proto::ForkRef { target, file: self.job.file, subfile, fork: DATA_FORK.into() };
            paths.flush_change(chain, IoRequest::Sync { fork }, Bytes::new()).await?;
        }
        Ok(())
    }

    async fn sync(&self, forks: BTreeSet<(TargetId, SubfileIndex)>) -> Result<(), WireError> {
        let executor = self.sessions.executor.clone();
        let file = self.job.file;
        join(tokio::task::spawn_blocking(move || {
            let refs: Vec<ForkRef> = forks
                .iter()
                .map(|(target, subfile)| ForkRef::new(*target, file, *subfile, DATA_FORK))
                .collect();
            executor.store.sync_many(&refs).map_err(store_error)
        }))
        .await
    }
}

/// "member 2" or "members 1, 3".
fn members_named(members: &[u32]) -> String {
    let list: Vec<String> = members.iter().map(u32::to_string).collect();
    match list.len() {
        1 => format!("member {}", list[0]),
        _ => format!("members {}", list.join(", ")),
    }
}

async fn join(task: tokio::task::JoinHandle<Result<(), WireError>>) -> Result<(), WireError> {
    task.await.map_err(|e| WireError::new(ErrorCode::Io, format!("flush write task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(member: u32, members: u32, absent: Vec<u32>) -> FlushJob {
        FlushJob { name: "j".into(), epoch: 0, member, members, absent, file: FileId(1), durable: false }
    }

    #[test]
    fn what_a_member_says_about_its_job_is_checked() {
        assert!(check_job(&job(0, 4, vec![1, 3]), 8).is_ok());
        assert!(check_job(&job(4, 4, vec![]), 8).unwrap_err().message.contains("member 4 of a job of 4"));
        assert!(check_job(&job(0, 9, vec![]), 8).unwrap_err().message.contains("flush_members_max"));
        assert!(check_job(&job(0, 4, vec![3, 1]), 8).is_err(), "not ascending");
        assert!(check_job(&job(1, 4, vec![1]), 8).is_err(), "a sender is not absent");
    }

    mod sessions {
        use super::super::*;
        use crate::execute::BufferPool;
        use flotilla_store::{Store, StoreConfig};
        use flotilla_types::Limits;

        struct Rig {
            sessions: Arc<Sessions>,
            target: TargetId,
            frames: Arc<Semaphore>,
            _dir: tempfile::TempDir,
        }

        fn rig(wait_ms: u64) -> Rig {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(StoreConfig::new(vec![dir.path().to_path_buf()], true)).unwrap();
            let target = store.target_ids()[0];
            store.create_subfile(target, FileId(1), SubfileIndex(0)).unwrap();
            let executor =
                Arc::new(Executor { store, limits: Limits::default(), pool: BufferPool::new(1, 1 << 20) });
            let config = FlushConfig {
                sessions_max: 4,
                members_max: 8,
                entries_max: 100,
                member_wait: Duration::from_millis(wait_ms),
                block_bytes: 8,
                segments_per_step_max: 4,
            };
            let memory = (Arc::new(Semaphore::new(1 << 10)), 1 << 10);
            let sessions = Arc::new(Sessions::new(config, executor, memory, "server-t".into(), None));
            Rig { sessions, target, frames: Arc::new(Semaphore::new(64)), _dir: dir }
        }

        fn job(member: u32, members: u32) -> FlushJob {
            FlushJob {
                name: "j".into(),
                epoch: 0,
                member,
                members,
                absent: vec![],
                file: FileId(1),
                durable: true,
            }
        }

        fn entry(target: TargetId, offset: u64, length: u64, timestamp: u64) -> FlushEntry {
            FlushEntry { target, subfile: SubfileIndex(0), offset, length, timestamp, cache_offset: 0 }
        }

        impl Rig {
            async fn send(&self, request: IoRequest, data: Bytes, closed: &watch::Receiver<bool>) -> IoReply {
                let mut held = flotilla_proto::FrameBudget::over(self.frames.clone(), 64).empty().unwrap();
                held.merge(self.frames.clone().acquire_owned().await.unwrap());
                self.sessions.handle(request, data, held, closed.clone()).await
            }

            /// One member's whole part: directory, then answering pulls from `cache`.
            async fn member(&self, job: FlushJob, entries: Vec<FlushEntry>, cache: Vec<u8>) -> IoReply {
                let (_open, closed) = watch::channel(false);
                let directory = IoRequest::FlushDirectory { job: job.clone(), entries };
                match self.send(directory, Bytes::new(), &closed).await {
                    IoReply::Done { .. } => {}
                    other => return other,
                }
                let mut reply =
                    self.send(IoRequest::FlushPull { job: job.clone() }, Bytes::new(), &closed).await;
                while let IoReply::Pull { ranges } = reply {
                    let mut data = Vec::new();
                    for r in &ranges {
                        data.extend_from_slice(
                            &cache[r.cache_offset as usize..(r.cache_offset + r.length) as usize],
                        );
                    }
                    let answer = IoRequest::FlushData { job: job.clone(), ranges };
                    reply = self.send(answer, Bytes::from(data), &closed).await;
                }
                reply
            }

            fn read(&self, length: usize) -> Vec<u8> {
                let fork = ForkRef::new(self.target, FileId(1), SubfileIndex(0), DATA_FORK);
                let mut out = vec![0u8; length];
                self.sessions
                    .executor
                    .store
                    .read(&fork, &[Extent { offset: 0, length: length as u64 }], &mut out)
                    .unwrap();
                out
            }
        }

        fn error(reply: IoReply) -> WireError {
            match reply {
                IoReply::Error(error) => error,
                other => panic!("expected an error, got {other:?}"),
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_members_newest_wins_across_blocks() {
            let rig = Arc::new(rig(5000));
            let target = rig.target;
            let (a, b) = (rig.clone(), rig.clone());
            let first =
                tokio::spawn(
                    async move { a.member(job(0, 2), vec![entry(target, 0, 20, 1)], vec![1; 20]).await },
                );
            let second =
                tokio::spawn(
                    async move { b.member(job(1, 2), vec![entry(target, 6, 6, 2)], vec![2; 6]).await },
                );
            assert_eq!(first.await.unwrap(), IoReply::Flushed { bytes: 20 });
            assert_eq!(second.await.unwrap(), IoReply::Flushed { bytes: 20 });
            let mut expected = vec![1u8; 20];
            expected[6..12].fill(2);
            assert_eq!(rig.read(20), expected);
            // Both members have their answer: the session goes long before flush_member_wait_ms.
            for _ in 0..200 {
                if rig.sessions.sessions.lock().is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the finished session is still kept");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_missing_member_is_named() {
            let rig = rig(100);
            let reply = rig.member(job(0, 3), vec![entry(rig.target, 0, 4, 1)], vec![1; 4]).await;
            let error = error(reply);
            assert_eq!(error.code, ErrorCode::Unavailable);
            assert!(error.message.contains("no directory from members 1, 2"), "{}", error.message);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_member_whose_connection_closes_fails_the_flush_naming_it() {
            let rig = Arc::new(rig(5000));
            let (gone, closed) = watch::channel(false);
            let directory =
                IoRequest::FlushDirectory { job: job(1, 2), entries: vec![entry(rig.target, 0, 4, 1)] };
            assert!(matches!(rig.send(directory, Bytes::new(), &closed).await, IoReply::Done { .. }));
            let other = rig.clone();
            let target = rig.target;
            let first = tokio::spawn(async move {
                other.member(job(0, 2), vec![entry(target, 4, 4, 1)], vec![1; 4]).await
            });
            gone.send(true).unwrap();
            let error = error(first.await.unwrap());
            assert!(error.message.contains("member 1 of job \"j\" went away"), "{}", error.message);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_messages_are_refused_with_their_reason() {
            let rig = rig(100);
            let (_open, closed) = watch::channel(false);
            let foreign =
                IoRequest::FlushDirectory { job: job(0, 1), entries: vec![entry(TargetId(999), 0, 4, 1)] };
            let refused = error(rig.send(foreign, Bytes::new(), &closed).await);
            assert_eq!(refused.code, ErrorCode::NotFound);
            assert!(refused.message.contains("not on this server"), "{}", refused.message);
            let early = error(rig.send(IoRequest::FlushPull { job: job(0, 1) }, Bytes::new(), &closed).await);
            assert_eq!(early.code, ErrorCode::NotFound, "no session yet: {}", early.message);
            let overflow = IoRequest::FlushDirectory {
                job: job(0, 1),
                entries: vec![entry(rig.target, u64::MAX, 4, 1)],
            };
            assert!(matches!(rig.send(overflow, Bytes::new(), &closed).await, IoReply::Done { .. }));
            let planned =
                error(rig.send(IoRequest::FlushPull { job: job(0, 1) }, Bytes::new(), &closed).await);
            assert!(planned.message.contains("runs past the largest offset"), "{}", planned.message);
        }
    }

    #[test]
    fn missing_members_are_named() {
        assert_eq!(members_named(&[2]), "member 2");
        assert_eq!(members_named(&[1, 3]), "members 1, 3");
    }
}
