//! [`NamespaceMachine`]: the namespace as the metadata group's replicated state machine.
//!
//! One log entry (a batch of [`NamespaceChange`]s) is applied in one redb write transaction
//! of the namespace's database (`Namespace::apply_batch`, outside its group commit),
//! together with the applied mark and the reply table's sessions that the batch touched
//! (tables `group_state` and `group_sessions` beside the namespace's), committed with
//! `fsync`. So after a crash the mark says exactly which entries are in the namespace, and
//! none is applied twice.
//!
//! Determinism: a change's effects depend only on the namespace, the reply table and the
//! change (caller, clock, placement ranking and open hints are in it); the reply table's
//! clock is the batch's `proposed_at_ms`. A change that fails after writing (rare: the usual
//! refusals come from checks made before any write) aborts the batch's transaction; the
//! batch is applied again from the state before it, with that change answered by its error,
//! the same on every replica. A storage failure (I/O, full disk, a corrupt record) is not a
//! result: it stops the machine (`StateMachineError`), as a replica never skips an entry.
//!
//! A group's namespace begins with a `Genesis` change (the proposer's id key and clock):
//! until it is applied every namespace change is answered `Unavailable`. A database made
//! before the group is taken over with [`NamespaceMachine::adopt`] (a group of one).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use flotilla_metagroup::reply_table::Session;
use flotilla_metagroup::types::SESSION_NONE;
use flotilla_metagroup::{
    record, AppliedMark, Batch, Change, Lookup, Reply, ReplyError, ReplyLimits, ReplyTable, RunEntry,
    StateMachine, StateMachineError,
};
use flotilla_namespace::{BatchDurability, CreateFile, LayoutOf, Namespace, NamespaceError, NamespaceImage};
use flotilla_proto::{ErrorCode, WireError};
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;

use super::change::{
    Applied, BatchReply, ChangeResult, LayoutOn, NamespaceChange, Op, OpenHint, Outcome, RenameMode,
    TouchedInode,
};
use super::image::{read_image, write_image, MachineImage, ReplyMeta};

/// The machine's records: `applied_mark`, `reply_table` (its counters), `genesis`.
pub(crate) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("group_state");
/// Session id → the session's replies.
pub(crate) const SESSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("group_sessions");
const KEY_MARK: &str = "applied_mark";
const KEY_REPLIES: &str = "reply_table";
const KEY_GENESIS: &str = "genesis";

/// Bounds of the machine; every one is a setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineLimits {
    pub replies: ReplyLimits,
    /// Most bytes of one of the machine's records (a session's replies, the mark).
    pub record_bytes_max: usize,
    /// Most bytes of a snapshot written or installed.
    pub snapshot_bytes_max: usize,
    /// Applied batches committed without `fsync` between two durable ones: the log is the
    /// durable record, so a crash loses at most these, which the replica applies again from
    /// its log (a snapshot, which lets the log be purged, is taken only after a durable
    /// commit). 1 makes every applied batch durable.
    pub apply_sync_batches: u32,
}

/// Default `apply_sync_batches`.
pub const APPLY_SYNC_BATCHES: u32 = 64;

impl Default for MachineLimits {
    fn default() -> Self {
        MachineLimits {
            replies: ReplyLimits::default(),
            record_bytes_max: 8 << 20,
            snapshot_bytes_max: 1 << 30,
            apply_sync_batches: APPLY_SYNC_BATCHES,
        }
    }
}

/// The machine's namespace as the service reads it (the service's handlers on the group):
/// `None` while a snapshot replaces it. Cloning the `Arc` out is a short read lock.
pub type SharedNamespace = std::sync::Arc<parking_lot::RwLock<Option<std::sync::Arc<Namespace>>>>;

/// How long an install waits for the service's readers to let go of the old namespace.
const READERS_WAIT_MS_MAX: u64 = 10_000;

/// The namespace as a replicated state machine.
pub struct NamespaceMachine {
    path: PathBuf,
    /// `None` only after an install failed and the file could not be opened again.
    namespace: Option<std::sync::Arc<Namespace>>,
    /// The same namespace, published for the service's reads.
    shared: SharedNamespace,
    /// The reply table as committed (rebuilt from its records when a batch is undone).
    replies: ReplyTable,
    /// The namespace had its genesis (or was adopted).
    born: bool,
    limits: MachineLimits,
    /// Batches committed lazily since the last durable commit.
    lazy_batches: u32,
}

fn storage(e: impl std::fmt::Display) -> StateMachineError {
    StateMachineError::Storage(e.to_string())
}

fn corrupt(table: &'static str, key: impl ToString, e: impl std::fmt::Display) -> StateMachineError {
    StateMachineError::Corrupt { table, key: key.to_string(), reason: e.to_string() }
}

/// A namespace error that is no change's result but the replica's own trouble.
fn fatal(error: &NamespaceError) -> bool {
    matches!(error, NamespaceError::NoSpace { .. }) || error.errno() == flotilla_namespace::EIO
}

/// Session records to write: an id and its record, or `None` to remove it.
type SessionRecords = Vec<(u64, Option<Vec<u8>>)>;

/// What one run of a batch came to.
enum Tried {
    Committed(Vec<Outcome>),
    /// Change `at` failed after writing: apply the batch again with it answered `result`.
    Undone {
        at: usize,
        result: ChangeResult,
    },
}

/// The body's value: the outcomes and the records to write, or where it was undone.
enum Body {
    Done { outcomes: Vec<Outcome>, sessions: SessionRecords, meta: Vec<u8> },
    Undone { at: usize, result: ChangeResult },
}

/// One change's step inside a batch.
enum Step {
    Done(Outcome),
    Undone(ChangeResult),
}

/// A change's run: its result and touched inodes, or an undone transaction.
enum Ran {
    Result(ChangeResult, Vec<TouchedInode>),
    Undone(ChangeResult),
}

impl NamespaceMachine {
    /// How the next applied batch commits: lazily, except every `apply_sync_batches`-th.
    fn next_durability(&mut self) -> BatchDurability {
        self.lazy_batches += 1;
        if self.lazy_batches >= self.limits.apply_sync_batches.max(1) {
            self.lazy_batches = 0;
            return BatchDurability::Durable;
        }
        BatchDurability::Lazy
    }

    /// Opens (or creates) the machine's namespace at `path`. A new one waits for its
    /// genesis.
    pub fn open(path: &Path, limits: MachineLimits) -> Result<Self, StateMachineError> {
        remove_unfinished_install(path)?;
        let namespace = Namespace::open(path).map_err(storage)?;
        namespace
            .apply_batch(
                || (),
                |txn, _| {
                    txn.open_table(STATE)?;
                    txn.open_table(SESSIONS)?;
                    Ok(())
                },
            )
            .map_err(storage)?;
        let mut machine = NamespaceMachine {
            path: path.to_path_buf(),
            namespace: None,
            shared: SharedNamespace::default(),
            replies: ReplyTable::new(limits.replies.clone()),
            born: false,
            limits,
            lazy_batches: 0,
        };
        machine.set_namespace(Some(namespace));
        machine.load()?;
        Ok(machine)
    }

    /// The namespace as published for the service's reads (kept current across installs).
    pub fn shared_namespace(&self) -> SharedNamespace {
        self.shared.clone()
    }

    fn set_namespace(&mut self, namespace: Option<Namespace>) {
        self.namespace = namespace.map(std::sync::Arc::new);
        *self.shared.write() = self.namespace.clone();
    }

    /// Takes the namespace back from the service's readers (they hold it for one request).
    fn take_namespace(&mut self) -> Result<Namespace, StateMachineError> {
        *self.shared.write() = None;
        let mut namespace =
            self.namespace.take().ok_or_else(|| storage("namespace closed after a failed install"))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(READERS_WAIT_MS_MAX);
        loop {
            match std::sync::Arc::try_unwrap(namespace) {
                Ok(namespace) => return Ok(namespace),
                Err(shared) if std::time::Instant::now() < deadline => {
                    namespace = shared;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(shared) => {
                    self.namespace = Some(shared);
                    *self.shared.write() = self.namespace.clone();
                    return Err(storage("the namespace's readers did not let go of it for an install"));
                }
            }
        }
    }

    /// Opens a namespace made before the group and takes it over as it is (its genesis is
    /// the database itself): for a group of one, whose later members catch up by snapshot.
    pub fn adopt(path: &Path, limits: MachineLimits) -> Result<Self, StateMachineError> {
        let mut machine = Self::open(path, limits)?;
        if !machine.born {
            let genesis = machine.encode(&true)?;
            machine
                .ns()?
                .apply_batch(
                    || (),
                    |txn, _| {
                        txn.open_table(STATE)?.insert(KEY_GENESIS, genesis.as_slice())?;
                        Ok(())
                    },
                )
                .map_err(storage)?;
            machine.born = true;
        }
        Ok(machine)
    }

    /// The namespace, for reads (never write to it outside the machine).
    pub fn namespace(&self) -> Result<&Namespace, StateMachineError> {
        self.ns()
    }

    /// Every table of the namespace, row by row (equal on replicas that applied the same
    /// entries).
    pub fn namespace_image(&self) -> Result<NamespaceImage, StateMachineError> {
        self.ns()?.read_transaction(Namespace::image_in).map_err(storage)
    }

    /// The namespace had its genesis.
    pub fn born(&self) -> bool {
        self.born
    }

    /// The reply table as committed.
    pub fn replies(&self) -> &ReplyTable {
        &self.replies
    }

    fn ns(&self) -> Result<&Namespace, StateMachineError> {
        self.namespace.as_deref().ok_or_else(|| {
            storage(format!("namespace {} is closed after a failed install", self.path.display()))
        })
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, StateMachineError> {
        record::encode(value, self.limits.record_bytes_max).map_err(storage)
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        key: impl ToString,
        bytes: &[u8],
    ) -> Result<T, StateMachineError> {
        record::decode(bytes, self.limits.record_bytes_max).map_err(|e| corrupt(table, key, e))
    }

    /// The machine's records as raw bytes, from one read transaction.
    fn raw_state(&self) -> Result<RawState, StateMachineError> {
        self.ns()?.read_transaction(read_raw).map_err(storage)
    }

    /// Rebuilds the in-memory reply table and the genesis flag from the database.
    fn load(&mut self) -> Result<(), StateMachineError> {
        let raw = self.raw_state()?;
        let state = self.decode_state(raw)?;
        self.born = state.born;
        self.replies = ReplyTable::from_parts(
            self.limits.replies.clone(),
            state.sessions.into_iter().collect(),
            state.replies.next_session_id,
            state.replies.clock_ms,
        );
        Ok(())
    }

    fn decode_state(&self, raw: RawState) -> Result<MachineImage, StateMachineError> {
        let born = match &raw.genesis {
            Some(bytes) => self.decode::<bool>("group_state", KEY_GENESIS, bytes)?,
            None => false,
        };
        let replies = match &raw.replies {
            Some(bytes) => self.decode("group_state", KEY_REPLIES, bytes)?,
            None => ReplyMeta { next_session_id: 1, clock_ms: 0 },
        };
        let mut sessions = Vec::with_capacity(raw.sessions.len());
        for (id, bytes) in &raw.sessions {
            sessions.push((*id, decode_session(bytes, self.limits.record_bytes_max, *id)?));
        }
        Ok(MachineImage { born, replies, sessions, namespace: raw.namespace.unwrap_or_default() })
    }

    /// The records of the sessions in `dirty` (`None`: removed) and the table's counters.
    fn session_records(
        replies: &ReplyTable,
        dirty: &BTreeSet<u64>,
        record_bytes_max: usize,
    ) -> Result<(SessionRecords, Vec<u8>), StateMachineError> {
        let mut records = Vec::with_capacity(dirty.len());
        for id in dirty {
            let bytes = match replies.session(*id) {
                Some(session) => Some(record::encode(session, record_bytes_max).map_err(storage)?),
                None => None,
            };
            records.push((*id, bytes));
        }
        let meta = ReplyMeta { next_session_id: replies.next_session_id(), clock_ms: replies.clock_ms() };
        Ok((records, record::encode(&meta, record_bytes_max).map_err(storage)?))
    }

    /// Applies `batch` once; `forced` answers the changes that failed after writing in an
    /// earlier run.
    fn try_batch(
        &mut self,
        mark: &AppliedMark,
        batch: &Batch,
        forced: &BTreeMap<usize, ChangeResult>,
    ) -> Result<Tried, StateMachineError> {
        let mark_bytes = self.encode(mark)?;
        let record_bytes_max = self.limits.record_bytes_max;
        let durability = self.next_durability();
        let NamespaceMachine { namespace, replies, born, .. } = self;
        let ns = namespace.as_deref().ok_or_else(|| storage("namespace closed after a failed install"))?;
        let born = *born;
        let body = || -> Result<Body, StateMachineError> {
            let mut dirty: BTreeSet<u64> = replies.tick(batch.proposed_at_ms).into_iter().collect();
            let mut outcomes = Vec::with_capacity(batch.changes.len());
            for (at, change) in batch.changes.iter().enumerate() {
                let context = Context { ns, born, now_ms: batch.proposed_at_ms, forced: forced.get(&at) };
                match apply_change(&context, replies, &mut dirty, change)? {
                    Step::Done(outcome) => outcomes.push(outcome),
                    Step::Undone(result) => return Ok(Body::Undone { at, result }),
                }
            }
            let (sessions, meta) = Self::session_records(replies, &dirty, record_bytes_max)?;
            Ok(Body::Done { outcomes, sessions, meta })
        };
        let finish = |txn: &WriteTransaction, body: &Result<Body, StateMachineError>| {
            let Ok(Body::Done { sessions, meta, .. }) = body else {
                return Err(NamespaceError::Storage("the batch did not finish".into()));
            };
            write_records(txn, sessions, meta, &mark_bytes)
        };
        let batched = ns.apply_batch_with(durability, body, finish).map_err(storage)?;
        match (batched.committed, batched.value?) {
            (true, Body::Done { outcomes, .. }) => Ok(Tried::Committed(outcomes)),
            (false, Body::Undone { at, result }) => Ok(Tried::Undone { at, result }),
            (_, _) => Err(storage("a batch was neither committed nor undone at a change")),
        }
    }

    /// Applies a batch holding one `Genesis`: the namespace is replaced by a fresh one with
    /// the change's id key and clock (the reply table and its sessions are kept).
    fn apply_genesis(
        &mut self,
        mark: &AppliedMark,
        change: &NamespaceChange,
    ) -> Result<Outcome, StateMachineError> {
        let Op::Genesis { id_key } = change.op else { return Err(storage("not a genesis")) };
        if self.born {
            self.record_mark(mark)?;
            let error = WireError::new(ErrorCode::AlreadyExists, "the namespace had its genesis already");
            return Ok(Outcome::Applied { result: Err(error), touched: Vec::new() });
        }
        let image = NamespaceImage::fresh(id_key, change.now_ns);
        let state = MachineImage {
            born: true,
            replies: ReplyMeta {
                next_session_id: self.replies.next_session_id(),
                clock_ms: self.replies.clock_ms(),
            },
            sessions: self.replies.sessions().map(|(id, s)| (*id, s.clone())).collect(),
            namespace: NamespaceImage::default(),
        };
        self.replace(&image, mark, &state)?;
        Ok(Outcome::Applied { result: Ok(Applied::Done), touched: Vec::new() })
    }

    /// Replaces the whole database with `image`, the machine's records of `state`, and `mark`.
    fn replace(
        &mut self,
        image: &NamespaceImage,
        mark: &AppliedMark,
        state: &MachineImage,
    ) -> Result<(), StateMachineError> {
        let mark_bytes = self.encode(mark)?;
        let genesis = self.encode(&state.born)?;
        let meta = self.encode(&state.replies)?;
        let mut sessions = Vec::with_capacity(state.sessions.len());
        for (id, session) in &state.sessions {
            sessions.push((*id, Some(self.encode(session)?)));
        }
        let namespace = self.take_namespace()?;
        let replaced = namespace.replace_with_image(image, |txn| {
            txn.open_table(STATE)?.insert(KEY_GENESIS, genesis.as_slice())?;
            write_records(txn, &sessions, &meta, &mark_bytes)
        });
        match replaced {
            Ok(namespace) => self.set_namespace(Some(namespace)),
            Err(error) => {
                // The file holds the old state or the new one, whole: open whichever it is.
                self.set_namespace(Namespace::open(&self.path).ok());
                if self.namespace.is_some() {
                    self.load()?;
                }
                return Err(storage(error));
            }
        }
        self.load()
    }
}

/// Removes the new database file of an install that a crash interrupted before its rename
/// (the namespace file still holds the state before it, whole).
fn remove_unfinished_install(path: &Path) -> Result<(), StateMachineError> {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".installing");
    match std::fs::remove_file(path.with_file_name(name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(storage(format!("remove an unfinished install beside {}: {e}", path.display()))),
    }
}

/// A session's record: as written now, or as written before sessions had owners (then the
/// service's own, usable by no client).
fn decode_session(bytes: &[u8], record_bytes_max: usize, id: u64) -> Result<Session, StateMachineError> {
    match record::decode::<Session>(bytes, record_bytes_max) {
        Ok(session) => Ok(session),
        Err(error) => {
            match record::decode::<flotilla_metagroup::reply_table::SessionV1>(bytes, record_bytes_max) {
                Ok(old) => Ok(old.into()),
                Err(_) => Err(corrupt("group_sessions", id, error)),
            }
        }
    }
}

/// The session `id` as the namespace's database holds it (`None`: no such session), for a
/// leader checking who may use it before proposing (`grouped.rs`).
pub fn stored_session(
    ns: &Namespace,
    id: u64,
    record_bytes_max: usize,
) -> Result<Option<Session>, StateMachineError> {
    let bytes = ns
        .read_transaction(|txn| {
            let table = match txn.open_table(SESSIONS) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(error) => return Err(error.into()),
            };
            Ok(table.get(id)?.map(|value| value.value().to_vec()))
        })
        .map_err(storage)?;
    bytes.map(|bytes| decode_session(&bytes, record_bytes_max, id)).transpose()
}

/// The machine's records as stored, read from one transaction.
struct RawState {
    mark: Option<Vec<u8>>,
    replies: Option<Vec<u8>>,
    genesis: Option<Vec<u8>>,
    sessions: Vec<(u64, Vec<u8>)>,
    namespace: Option<NamespaceImage>,
}

fn write_records(
    txn: &WriteTransaction,
    sessions: &[(u64, Option<Vec<u8>>)],
    meta: &[u8],
    mark: &[u8],
) -> Result<(), NamespaceError> {
    let mut table = txn.open_table(SESSIONS)?;
    for (id, bytes) in sessions {
        match bytes {
            Some(bytes) => table.insert(*id, bytes.as_slice())?,
            None => table.remove(*id)?,
        };
    }
    let mut state = txn.open_table(STATE)?;
    state.insert(KEY_REPLIES, meta)?;
    state.insert(KEY_MARK, mark)?;
    Ok(())
}

/// What a change is applied with.
struct Context<'a> {
    ns: &'a Namespace,
    born: bool,
    now_ms: u64,
    /// The change failed after writing in an earlier run: this is its result.
    forced: Option<&'a ChangeResult>,
}

/// One change: decoded, looked up in the reply table, run, its reply recorded.
fn apply_change(
    context: &Context<'_>,
    replies: &mut ReplyTable,
    dirty: &mut BTreeSet<u64>,
    change: &Change,
) -> Result<Step, StateMachineError> {
    let decoded = match NamespaceChange::decode(&change.body) {
        Ok(decoded) if matches!(decoded.op, Op::Genesis { .. }) => {
            return Ok(Step::Done(Outcome::Invalid("a genesis must be alone in its batch".into())))
        }
        Ok(decoded) => decoded,
        Err(e) => return Ok(Step::Done(Outcome::Invalid(e.to_string()))),
    };
    if change.session_id == SESSION_NONE {
        return Ok(match run(context, replies, dirty, &decoded)? {
            Ran::Result(result, touched) => Step::Done(Outcome::Applied { result, touched }),
            Ran::Undone(result) => Step::Undone(result),
        });
    }
    dirty.insert(change.session_id);
    match replies.check(change.session_id, change.sequence, change.acknowledged_through) {
        Err(e) => Ok(Step::Done(Outcome::Refused(e))),
        Ok(Lookup::Replay(bytes)) => {
            let result: ChangeResult = postcard::from_bytes(&bytes).map_err(|e| {
                corrupt("group_sessions", change.session_id, format!("reply {}: {e}", change.sequence))
            })?;
            Ok(Step::Done(Outcome::Replayed(result)))
        }
        Ok(Lookup::Apply) => {
            let (result, touched) = match run(context, replies, dirty, &decoded)? {
                Ran::Result(result, touched) => (result, touched),
                Ran::Undone(result) => return Ok(Step::Undone(result)),
            };
            record_reply(replies, change, &result)?;
            Ok(Step::Done(Outcome::Applied { result, touched }))
        }
    }
}

/// Records a change's reply; one over the bound is recorded as that error, so a retry is
/// answered (never applied again).
fn record_reply(
    replies: &mut ReplyTable,
    change: &Change,
    result: &ChangeResult,
) -> Result<(), StateMachineError> {
    let bytes = postcard::to_stdvec(result).map_err(storage)?;
    match replies.record(change.session_id, change.sequence, bytes) {
        Err(ReplyError::ReplyTooLarge { bytes, bytes_max }) => {
            let message = format!("the reply of {bytes} bytes was over reply_bytes_max {bytes_max}");
            let stand_in: ChangeResult = Err(WireError::new(ErrorCode::OverLimit, message));
            let bytes = postcard::to_stdvec(&stand_in).map_err(storage)?;
            replies.record(change.session_id, change.sequence, bytes).map_err(storage)
        }
        // The change closed its own session: there is nothing left to record in.
        Err(ReplyError::UnknownSession { .. }) => Ok(()),
        other => other.map_err(storage),
    }
}

/// Runs a change's operation: the reply table's own, or the namespace's.
fn run(
    context: &Context<'_>,
    replies: &mut ReplyTable,
    dirty: &mut BTreeSet<u64>,
    change: &NamespaceChange,
) -> Result<Ran, StateMachineError> {
    if let Some(forced) = context.forced {
        return Ok(Ran::Result(forced.clone(), Vec::new()));
    }
    match &change.op {
        Op::OpenSession | Op::OpenSessionFor { .. } => {
            let owner = match &change.op {
                Op::OpenSessionFor { owner } => Some(owner.clone()),
                _ => None,
            };
            let result = match replies.open_session_for(context.now_ms, owner) {
                Ok(id) => {
                    dirty.insert(id);
                    Ok(Applied::Session(id))
                }
                Err(e) => Err(WireError::new(ErrorCode::OverLimit, e.to_string())),
            };
            return Ok(Ran::Result(result, Vec::new()));
        }
        Op::CloseSession { session_id } => {
            replies.close_session(*session_id);
            dirty.insert(*session_id);
            return Ok(Ran::Result(Ok(Applied::Done), Vec::new()));
        }
        _ => {}
    }
    if !context.born {
        let error =
            WireError::new(ErrorCode::Unavailable, "the metadata group's namespace has no genesis yet");
        return Ok(Ran::Result(Err(error), Vec::new()));
    }
    let (outcome, touched) = flotilla_namespace::recording(|| execute(context.ns, change));
    let touched = touched
        .into_iter()
        .map(|t| match t {
            flotilla_namespace::Touched::Attr(id) => TouchedInode::Attr(id),
            flotilla_namespace::Touched::Names(id) => TouchedInode::Names(id),
        })
        .collect();
    match outcome {
        Ok(applied) => Ok(Ran::Result(Ok(applied), touched)),
        Err(error) if fatal(&error) => Err(storage(error)),
        Err(error) => {
            let undone = context.ns.batch_undone();
            let result = Err(crate::handle::wire(error));
            Ok(if undone { Ran::Undone(result) } else { Ran::Result(result, touched) })
        }
    }
}

/// A removal that may keep the file it unnamed as an orphan (`hint` says which are open).
fn removal(
    hint: OpenHint,
    change: impl FnOnce(
        flotilla_namespace::IsOpen<'_>,
    ) -> Result<Option<flotilla_namespace::FileRecord>, NamespaceError>,
) -> Result<Applied, NamespaceError> {
    let orphaned = std::cell::Cell::new(None);
    let is_open = |id: u64| {
        let open = hint.is_open(id);
        if open {
            orphaned.set(Some(id));
        }
        open
    };
    change(&is_open)?;
    Ok(Applied::Removed { orphaned: orphaned.get() })
}

/// The namespace operation of a change, as the handlers call it.
fn execute(ns: &Namespace, change: &NamespaceChange) -> Result<Applied, NamespaceError> {
    let (who, now) = (&change.caller, change.now_ns);
    let entry = |e: flotilla_namespace::Entry| Applied::Entry(e.into());
    match &change.op {
        Op::Mkdir { at, owner } => ns.mkdir_in(who, at.as_namespace(), (*owner).into(), now).map(entry),
        Op::Create { at, owner, subfile_count, targets, layout, exclusive, ranked } => {
            let spec = CreateFile {
                owner: (*owner).into(),
                subfile_count: *subfile_count,
                targets: targets.clone(),
                layout: *layout,
                exclusive: *exclusive,
            };
            ns.create_file_ranked_in(who, at.as_namespace(), &spec, ranked, now).map(entry)
        }
        Op::Mknod { at, kind, rdev, owner } => {
            ns.mknod_in(who, at.as_namespace(), *kind, *rdev, (*owner).into(), now).map(entry)
        }
        Op::Symlink { at, target, owner } => {
            ns.symlink_in(who, at.as_namespace(), target, (*owner).into(), now).map(entry)
        }
        Op::Link { existing, new } => ns.link_as(who, existing, new, now).map(entry),
        Op::LinkAt { id, at } => ns.link_in(who, *id, at.as_namespace(), now).map(entry),
        Op::Unlink { at, expected_id, open } => {
            removal(*open, |is_open| ns.unlink_in(who, at.as_namespace(), *expected_id, is_open, now))
        }
        Op::Rmdir { at } => ns.rmdir_in(who, at.as_namespace(), now).map(|()| Applied::Done),
        Op::Rename { from, to, mode } => {
            let (from, to) = (from.as_namespace(), to.as_namespace());
            match mode {
                RenameMode::Replace { open } => {
                    removal(*open, |is_open| ns.rename_in(who, from, to, is_open, now))
                }
                RenameMode::NoReplace => ns.rename_no_replace_in(who, from, to, now).map(|_| Applied::Done),
                RenameMode::Exchange => ns.exchange_in(who, from, to, now).map(|_| Applied::Done),
            }
        }
        Op::SetAttr { id, change } => ns.set_attr_as(who, *id, change, now).map(Applied::Attributes),
        Op::GrowSize { id, size_bytes, mtime_ns } => {
            ns.grow_size(*id, *size_bytes, *mtime_ns, now).map(Applied::Attributes)
        }
        Op::SetLayout { on, layout } => {
            let of = match on {
                LayoutOn::Path(path) => LayoutOf::Path(path),
                LayoutOn::Id(id) => LayoutOf::Id(*id),
            };
            ns.set_layout_as(who, of, *layout, now).map(entry)
        }
        Op::TouchAtime { id, atime_ns } => {
            ns.touch_atime_as(who, *id, *atime_ns, now).map(Applied::Attributes)
        }
        Op::SetNoOverlap { id, no_overlap } => ns.set_no_overlap_as(who, *id, *no_overlap, now).map(entry),
        Op::RecordTarget { target, server, used_bytes, free_bytes } => {
            ns.record_target(*target, server, *used_bytes, *free_bytes).map(|()| Applied::Done)
        }
        Op::BindTargets { credential, targets } => {
            ns.bind_targets(credential, targets).map(|()| Applied::Done)
        }
        Op::AckDeletes { target, done } => ns.ack_deletes(*target, done).map(|()| Applied::Done),
        Op::ReleaseOrphan { id } => ns.release_orphan(*id).map(Applied::Released),
        Op::ChainChanges { replicas, chains, targets } => {
            let bad = |what: String| NamespaceError::InvalidArgument { what };
            let chains = chains
                .iter()
                .map(|c| c.chain().ok_or_else(|| bad(format!("chain {} breaks its invariants", c.id))))
                .collect::<Result<Vec<_>, _>>()?;
            let targets = targets
                .iter()
                .map(|t| t.record().map(|r| (t.target, r)).ok_or_else(|| bad(format!("target {}", t.target))))
                .collect::<Result<Vec<_>, _>>()?;
            let chains: Vec<&flotilla_replica::Chain> = chains.iter().collect();
            let targets: Vec<(flotilla_types::TargetId, &flotilla_namespace::ChainTarget)> =
                targets.iter().map(|(t, r)| (*t, r)).collect();
            ns.record_chains(flotilla_namespace::ChainChange {
                replicas: *replicas,
                chains: &chains,
                targets: &targets,
            })
            .map(|()| Applied::Done)
        }
        Op::CreateChained { at, owner, subfile_count, layout, exclusive, replicas, chains } => {
            let spec = CreateFile {
                owner: (*owner).into(),
                subfile_count: *subfile_count,
                targets: None,
                layout: *layout,
                exclusive: *exclusive,
            };
            ns.create_file_chained_in(who, at.as_namespace(), &spec, *replicas, chains, now).map(entry)
        }
        Op::SetLayoutReplicated { on, layout, replicas } => {
            let of = match on {
                LayoutOn::Path(path) => LayoutOf::Path(path),
                LayoutOn::Id(id) => LayoutOf::Id(*id),
            };
            ns.set_layout_replicated_as(who, of, *layout, *replicas, now).map(entry)
        }
        Op::Genesis { .. } | Op::OpenSession | Op::OpenSessionFor { .. } | Op::CloseSession { .. } => {
            Err(NamespaceError::InvalidArgument { what: "not a namespace operation".into() })
        }
    }
}

/// The batch's genesis change, if it is a batch of one `Genesis` (applied alone).
fn genesis_of(batch: &Batch) -> Option<NamespaceChange> {
    match batch.changes.as_slice() {
        [only] => NamespaceChange::decode(&only.body).ok().filter(|c| matches!(c.op, Op::Genesis { .. })),
        _ => None,
    }
}

/// What the body of a run's transaction came to.
enum RunBody {
    /// Each entry's outcomes (`None`: an entry with no batch), and the records to write.
    Done { outcomes: Vec<Option<Vec<Outcome>>>, sessions: SessionRecords, meta: Vec<u8> },
    /// A change failed after writing: nothing of the run stays.
    Undone,
}

impl StateMachine for NamespaceMachine {
    /// A run of entries in one transaction of the namespace (one commit, the run's last mark):
    /// the same outcomes as applying them one by one, as each change sees the ones before it
    /// in the transaction. A genesis is applied alone; a run in which a change fails after
    /// writing is undone whole and applied again entry by entry (`apply`).
    fn apply_run(&mut self, run: &[RunEntry<'_>]) -> Result<Vec<Reply>, StateMachineError> {
        self.reopen_if_closed()?;
        let mut replies = Vec::with_capacity(run.len());
        let mut start = 0;
        while start < run.len() {
            let genesis = |entry: &RunEntry<'_>| entry.batch.is_some_and(|b| genesis_of(b).is_some());
            let end = if genesis(&run[start]) {
                start + 1
            } else {
                (start..run.len()).find(|&i| genesis(&run[i])).unwrap_or(run.len())
            };
            let piece = &run[start..end];
            start = end;
            let together = match piece {
                [_, _, ..] => match self.try_run(piece) {
                    Ok(together) => together,
                    Err(error) => {
                        // The reply table in memory saw changes that were not committed.
                        let _ = self.load();
                        return Err(error);
                    }
                },
                _ => None,
            };
            match together {
                Some(outcomes) => {
                    for outcomes in outcomes {
                        replies.push(match outcomes {
                            Some(outcomes) => {
                                Reply { bytes: BatchReply { outcomes }.encode().map_err(storage)? }
                            }
                            None => Reply::default(),
                        });
                    }
                }
                None => {
                    if piece.len() > 1 {
                        self.load()?;
                    }
                    for entry in piece {
                        replies.push(match entry.batch {
                            Some(batch) => self.apply(entry.mark, batch)?,
                            None => self.record_mark(entry.mark).map(|()| Reply::default())?,
                        });
                    }
                }
            }
        }
        Ok(replies)
    }

    fn apply(&mut self, mark: &AppliedMark, batch: &Batch) -> Result<Reply, StateMachineError> {
        self.reopen_if_closed()?;
        let genesis = genesis_of(batch);
        let outcomes = match genesis {
            Some(change) => vec![self.apply_genesis(mark, &change)?],
            None => self.apply_runs(mark, batch)?,
        };
        let bytes = BatchReply { outcomes }.encode().map_err(storage)?;
        Ok(Reply { bytes })
    }

    fn record_mark(&mut self, mark: &AppliedMark) -> Result<(), StateMachineError> {
        let bytes = self.encode(mark)?;
        let durability = self.next_durability();
        self.ns()?
            .apply_batch_with(
                durability,
                || (),
                |txn, _| {
                    txn.open_table(STATE)?.insert(KEY_MARK, bytes.as_slice())?;
                    Ok(())
                },
            )
            .map_err(storage)
            .map(|_| ())
    }

    fn last_applied(&self) -> Result<Option<AppliedMark>, StateMachineError> {
        match self.raw_state()?.mark {
            Some(bytes) => self.decode("group_state", KEY_MARK, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn write_snapshot(&self, out: &mut dyn Write) -> Result<AppliedMark, StateMachineError> {
        let ns = self.ns()?;
        // The snapshot lets the log be purged up to its mark: the state it shows must be on
        // disk first, lazy batches included.
        ns.sync_batches().map_err(storage)?;
        let (mut raw, namespace) = ns
            .read_transaction(|txn| {
                let namespace = Namespace::image_in(txn)?;
                Ok((read_raw(txn)?, namespace))
            })
            .map_err(storage)?;
        let mark = match raw.mark.take() {
            Some(bytes) => self.decode("group_state", KEY_MARK, &bytes)?,
            None => AppliedMark::default(),
        };
        raw.namespace = Some(namespace);
        let image = self.decode_state(raw)?;
        write_image(out, &image, self.limits.snapshot_bytes_max)?;
        Ok(mark)
    }

    fn install_snapshot(
        &mut self,
        mark: &AppliedMark,
        input: &mut dyn Read,
    ) -> Result<(), StateMachineError> {
        let mut image = read_image(input, self.limits.snapshot_bytes_max)?;
        let namespace = std::mem::take(&mut image.namespace);
        self.replace(&namespace, mark, &image)
    }
}

impl NamespaceMachine {
    /// Opens the namespace again after an install that failed left it closed.
    fn reopen_if_closed(&mut self) -> Result<(), StateMachineError> {
        if self.namespace.is_none() {
            self.set_namespace(Some(Namespace::open(&self.path).map_err(storage)?));
            self.load()?;
        }
        Ok(())
    }

    /// Applies the entries of `piece` (no genesis among them) in one transaction with the
    /// last one's mark; `None` if a change failed after writing (nothing of it stays, and
    /// the reply table in memory must be loaded again).
    fn try_run(
        &mut self,
        piece: &[RunEntry<'_>],
    ) -> Result<Option<Vec<Option<Vec<Outcome>>>>, StateMachineError> {
        let Some(last) = piece.last() else { return Ok(Some(Vec::new())) };
        let mark_bytes = self.encode(last.mark)?;
        let record_bytes_max = self.limits.record_bytes_max;
        let durability = self.next_durability();
        let NamespaceMachine { namespace, replies, born, .. } = self;
        let ns = namespace.as_deref().ok_or_else(|| storage("namespace closed after a failed install"))?;
        let born = *born;
        let body = || -> Result<RunBody, StateMachineError> {
            let mut dirty: BTreeSet<u64> = BTreeSet::new();
            let mut all = Vec::with_capacity(piece.len());
            for entry in piece {
                let Some(batch) = entry.batch else {
                    all.push(None);
                    continue;
                };
                dirty.extend(replies.tick(batch.proposed_at_ms));
                let mut outcomes = Vec::with_capacity(batch.changes.len());
                for change in &batch.changes {
                    let context = Context { ns, born, now_ms: batch.proposed_at_ms, forced: None };
                    match apply_change(&context, replies, &mut dirty, change)? {
                        Step::Done(outcome) => outcomes.push(outcome),
                        Step::Undone(_) => return Ok(RunBody::Undone),
                    }
                }
                all.push(Some(outcomes));
            }
            let (sessions, meta) = Self::session_records(replies, &dirty, record_bytes_max)?;
            Ok(RunBody::Done { outcomes: all, sessions, meta })
        };
        let finish = |txn: &WriteTransaction, body: &Result<RunBody, StateMachineError>| {
            let Ok(RunBody::Done { sessions, meta, .. }) = body else {
                return Err(NamespaceError::Storage("the run did not finish".into()));
            };
            write_records(txn, sessions, meta, &mark_bytes)
        };
        let batched = ns.apply_batch_with(durability, body, finish).map_err(storage)?;
        match (batched.committed, batched.value?) {
            (true, RunBody::Done { outcomes, .. }) => Ok(Some(outcomes)),
            (false, RunBody::Undone) => Ok(None),
            (_, _) => Err(storage("a run was neither committed nor undone at a change")),
        }
    }

    /// Runs a batch until one run commits (each run that was undone at a change answers
    /// that change with its error in the next).
    fn apply_runs(&mut self, mark: &AppliedMark, batch: &Batch) -> Result<Vec<Outcome>, StateMachineError> {
        let mut forced = BTreeMap::new();
        for _ in 0..=batch.changes.len() {
            let tried = self.try_batch(mark, batch, &forced);
            match tried {
                Ok(Tried::Committed(outcomes)) => return Ok(outcomes),
                Ok(Tried::Undone { at, result }) => {
                    forced.insert(at, result);
                    self.load()?;
                }
                Err(error) => {
                    // The reply table in memory saw changes that were not committed.
                    let _ = self.load();
                    return Err(error);
                }
            }
        }
        Err(storage("a batch was undone more times than it has changes"))
    }
}

/// The machine's records in `txn`, raw.
fn read_raw(txn: &redb::ReadTransaction) -> Result<RawState, NamespaceError> {
    let state = txn.open_table(STATE)?;
    let get = |key: &str| -> Result<Option<Vec<u8>>, NamespaceError> {
        Ok(state.get(key)?.map(|v| v.value().to_vec()))
    };
    let mut sessions = Vec::new();
    for item in txn.open_table(SESSIONS)?.iter()? {
        let (key, value) = item?;
        sessions.push((key.value(), value.value().to_vec()));
    }
    Ok(RawState {
        mark: get(KEY_MARK)?,
        replies: get(KEY_REPLIES)?,
        genesis: get(KEY_GENESIS)?,
        sessions,
        namespace: None,
    })
}
