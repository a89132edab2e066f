//! The Raft log and the Raft metadata (vote, committed, purged) in one redb file.
//!
//! Invariants: an append is readable when `append` returns (from memory, `pending`, until the
//! writer thread wrote it) and durable (redb commit with immediate durability, fsync) before
//! its callback fires; the writer thread does every change of the log in the order they were
//! asked (appends, truncations, purges), several appends waiting together in one
//! transaction (one fsync: group commit of the log); every record is checked when read back and a bad one is a typed
//! [`LogStoreError::Corrupt`] naming the table and key; entries are stored under their own
//! index and an entry read under another index is corrupt.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, Vote};
use parking_lot::Mutex;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limits::GroupLimits;
use crate::record::{self, RecordError};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

const LOG_TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "purged";

/// What went wrong in the log store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogStoreError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("corrupt record in table {table} at {key}: {cause}")]
    Corrupt { table: &'static str, key: String, cause: RecordError },
    #[error("log entry stored at index {key} says index {found}")]
    Misplaced { key: u64, found: u64 },
    #[error("encoding a record for table {table}: {cause}")]
    Encode { table: &'static str, cause: RecordError },
    #[error("setting a transaction's durability: {0}")]
    Durability(String),
}

/// A range holding no index (a map's `range` refuses an inverted one).
fn range_is_empty(range: &(Bound<u64>, Bound<u64>)) -> bool {
    let start = match range.0 {
        Bound::Included(i) => i,
        Bound::Excluded(i) => match i.checked_add(1) {
            Some(i) => i,
            None => return true,
        },
        Bound::Unbounded => 0,
    };
    match range.1 {
        Bound::Included(i) => start > i,
        Bound::Excluded(i) => start >= i,
        Bound::Unbounded => false,
    }
}

fn redb_error(e: impl Into<redb::Error>) -> LogStoreError {
    LogStoreError::Redb(e.into())
}

fn to_storage(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: LogStoreError) -> StorageError {
    StorageError::from(openraft::StorageIOError::new(subject, verb, AnyError::new(&e)))
}

/// The log store; cloning shares the database (a clone is the log reader).
#[derive(Clone)]
pub struct RedbLogStore {
    database: Arc<Database>,
    limits: GroupLimits,
    /// Entries appended and not yet written by the writer thread (readable from here).
    pending: Arc<Mutex<BTreeMap<u64, Entry>>>,
    writer: Arc<Writer>,
}

/// Told once an append is durable (openraft's `LogFlushed`, or a test's).
type Flushed = Box<dyn FnOnce(Result<(), std::io::Error>) + Send>;

/// A change of the log for the writer thread.
enum Job {
    Append {
        entries: Vec<Entry>,
        callback: Flushed,
    },
    Truncate {
        from_index: u64,
        done: std::sync::mpsc::SyncSender<Result<(), LogStoreError>>,
    },
    Purge {
        log_id: LogId,
        done: std::sync::mpsc::SyncSender<Result<(), LogStoreError>>,
    },
    /// Openraft's committed id, a hint (written with the next appends, or alone without
    /// durability), so that the core never waits for an fsync to record it.
    Committed(Option<LogId>),
}

/// The writer thread and its queue (bounded by `GroupLimits::log_flushes_waiting_max`; a
/// change finding it full waits).
struct Writer {
    queue: Option<std::sync::mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn send(&self, job: Job) -> Result<(), Job> {
        match &self.queue {
            Some(queue) => queue.send(job).map_err(|std::sync::mpsc::SendError(job)| job),
            None => Err(job),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the jobs still waiting; joining it lets the
        // database file be opened again right after the store is dropped.
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: runs the jobs in order; appends waiting together share a transaction.
/// The committed hint is kept in memory and written with the next appends' transaction (a
/// transaction of its own for every commit cost each node a redb commit per round), and
/// when the thread ends (the store dropped: a clean stop).
fn write_log(store: RedbLogStore, jobs: std::sync::mpsc::Receiver<Job>) {
    let mut held: Option<Job> = None;
    // The latest committed hint not written yet.
    let mut unwritten: Option<Option<LogId>> = None;
    loop {
        let job = match held.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => {
                    if let Some(latest) = unwritten {
                        if let Err(error) =
                            store.write_meta_with(KEY_COMMITTED, &latest, Durability::Immediate)
                        {
                            tracing::warn!(%error, "the metadata group's committed id was not recorded");
                        }
                    }
                    return;
                }
            },
        };
        match job {
            Job::Committed(committed) => unwritten = Some(committed),
            Job::Append { entries, callback } => {
                let mut appends = vec![(entries, callback)];
                let mut committed = unwritten.take();
                loop {
                    match jobs.try_recv() {
                        Ok(Job::Append { entries, callback }) => appends.push((entries, callback)),
                        Ok(Job::Committed(hint)) => committed = Some(hint),
                        Ok(other) => {
                            held = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let outcome = store.append_entries_of(appends.iter().map(|(entries, _)| entries), committed);
                match &outcome {
                    Ok(()) => {
                        // Written: read from the database from now on, unless a truncation
                        // and a new append replaced the entry in the meantime.
                        let mut pending = store.pending.lock();
                        for entry in appends.iter().flat_map(|(entries, _)| entries) {
                            if pending.get(&entry.log_id.index).is_some_and(|p| p.log_id == entry.log_id) {
                                pending.remove(&entry.log_id.index);
                            }
                        }
                    }
                    Err(error) => tracing::error!(%error, "the metadata group's log could not be written"),
                }
                for (_, callback) in appends {
                    let result = match &outcome {
                        Ok(()) => Ok(()),
                        Err(error) => Err(std::io::Error::other(error.to_string())),
                    };
                    callback(result);
                }
            }
            Job::Truncate { from_index, done } => {
                let _ = done.send(store.remove_range(from_index..));
            }
            Job::Purge { log_id, done } => {
                let _ = done.send(store.purge_through_now(log_id));
            }
        }
    }
}

impl RedbLogStore {
    /// Opens (or creates) the log file at `path`.
    pub fn open(path: &Path, limits: GroupLimits) -> Result<Self, LogStoreError> {
        let database = Database::create(path).map_err(redb_error)?;
        let txn = database.begin_write().map_err(redb_error)?;
        txn.open_table(LOG_TABLE).map_err(redb_error)?;
        txn.open_table(META_TABLE).map_err(redb_error)?;
        txn.commit().map_err(redb_error)?;
        let (queue, jobs) = std::sync::mpsc::sync_channel(limits.log_flushes_waiting_max.max(1));
        let mut store = RedbLogStore {
            database: Arc::new(database),
            limits,
            pending: Arc::new(Mutex::new(BTreeMap::new())),
            writer: Arc::new(Writer { queue: None, thread: None }),
        };
        // The thread's own handle has no writer (it must not keep its own queue open).
        let for_thread = store.clone();
        let thread = std::thread::Builder::new()
            .name("group-log-writer".into())
            .spawn(move || write_log(for_thread, jobs))
            .map_err(|e| LogStoreError::Durability(format!("cannot start the log writer thread: {e}")))?;
        store.writer = Arc::new(Writer { queue: Some(queue), thread: Some(thread) });
        Ok(store)
    }

    /// Runs a truncation or purge on the writer thread (after the appends before it) and
    /// waits for it.
    fn run_in_order(
        &self,
        job: impl FnOnce(std::sync::mpsc::SyncSender<Result<(), LogStoreError>>) -> Job,
    ) -> Result<(), LogStoreError> {
        let (done, outcome) = std::sync::mpsc::sync_channel(1);
        if self.writer.send(job(done)).is_err() {
            return Err(LogStoreError::Durability("the log writer thread stopped".into()));
        }
        outcome
            .recv()
            .unwrap_or_else(|_| Err(LogStoreError::Durability("the log writer thread stopped".into())))
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &'static str) -> Result<Option<T>, LogStoreError> {
        let txn = self.database.begin_read().map_err(redb_error)?;
        let table = txn.open_table(META_TABLE).map_err(redb_error)?;
        let Some(value) = table.get(key).map_err(redb_error)? else { return Ok(None) };
        record::decode(value.value(), self.limits.record_bytes_max)
            .map(Some)
            .map_err(|cause| LogStoreError::Corrupt { table: "raft_meta", key: key.into(), cause })
    }

    fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> Result<(), LogStoreError> {
        self.write_meta_with(key, value, Durability::Immediate)
    }

    /// Writes a record under `durability` (`None`: durable with the next durable commit of
    /// the log, which every append is; for hints a crash may lose, as the committed id).
    fn write_meta_with<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        durability: Durability,
    ) -> Result<(), LogStoreError> {
        let bytes = record::encode(value, self.limits.record_bytes_max)
            .map_err(|cause| LogStoreError::Encode { table: "raft_meta", cause })?;
        let mut txn = self.database.begin_write().map_err(redb_error)?;
        txn.set_durability(durability).map_err(|e| LogStoreError::Durability(e.to_string()))?;
        txn.open_table(META_TABLE).map_err(redb_error)?.insert(key, bytes.as_slice()).map_err(redb_error)?;
        txn.commit().map_err(redb_error)
    }

    /// Reads entries in `range`, at most `log_read_entries_max` of them (those not written
    /// yet from memory).
    pub fn read_entries(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, LogStoreError> {
        let max = self.limits.log_read_entries_max;
        if range_is_empty(&range) {
            return Ok(Vec::new());
        }
        // Memory first: an entry the writer removes from it after this is in the database.
        let pending: Vec<Entry> =
            self.pending.lock().range(range).take(max as usize).map(|(_, e)| e.clone()).collect();
        let mut entries = BTreeMap::new();
        {
            let txn = self.database.begin_read().map_err(redb_error)?;
            let table = txn.open_table(LOG_TABLE).map_err(redb_error)?;
            for item in table.range::<u64>(range).map_err(redb_error)? {
                if entries.len() as u64 >= max {
                    break;
                }
                let (key, value) = item.map_err(redb_error)?;
                entries.insert(key.value(), self.decode_entry(key.value(), value.value())?);
            }
        }
        for entry in pending {
            entries.insert(entry.log_id.index, entry);
        }
        Ok(entries.into_values().take(max as usize).collect())
    }

    fn decode_entry(&self, key: u64, bytes: &[u8]) -> Result<Entry, LogStoreError> {
        let entry: Entry = record::decode(bytes, self.limits.record_bytes_max)
            .map_err(|cause| LogStoreError::Corrupt { table: "raft_log", key: key.to_string(), cause })?;
        if entry.log_id.index != key {
            return Err(LogStoreError::Misplaced { key, found: entry.log_id.index });
        }
        Ok(entry)
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, LogStoreError> {
        let txn = self.database.begin_read().map_err(redb_error)?;
        let table = txn.open_table(LOG_TABLE).map_err(redb_error)?;
        let Some((key, value)) = table.last().map_err(redb_error)? else { return Ok(None) };
        Ok(Some(self.decode_entry(key.value(), value.value())?.log_id))
    }

    /// Appends entries in one durable transaction.
    pub fn append_entries(&self, entries: Vec<Entry>) -> Result<(), LogStoreError> {
        self.append_entries_of(std::iter::once(&entries), None)
    }

    /// Appends several runs of entries, and the committed hint if given, in one durable
    /// transaction.
    fn append_entries_of<'a>(
        &self,
        runs: impl Iterator<Item = &'a Vec<Entry>>,
        committed: Option<Option<LogId>>,
    ) -> Result<(), LogStoreError> {
        let txn = self.database.begin_write().map_err(redb_error)?;
        if let Some(committed) = committed {
            let bytes = record::encode(&committed, self.limits.record_bytes_max)
                .map_err(|cause| LogStoreError::Encode { table: "raft_meta", cause })?;
            txn.open_table(META_TABLE)
                .map_err(redb_error)?
                .insert(KEY_COMMITTED, bytes.as_slice())
                .map_err(redb_error)?;
        }
        {
            let mut table = txn.open_table(LOG_TABLE).map_err(redb_error)?;
            for entry in runs.flatten() {
                let bytes = record::encode(entry, self.limits.record_bytes_max)
                    .map_err(|cause| LogStoreError::Encode { table: "raft_log", cause })?;
                table.insert(entry.log_id.index, bytes.as_slice()).map_err(redb_error)?;
            }
        }
        txn.commit().map_err(redb_error)
    }

    /// Appends `entries`: readable from memory when this returns, durable when the writer
    /// thread's next transaction (one fsync for every append waiting) commits, then `done`
    /// is called. Openraft goes on (sends the entries to the followers, takes their answers)
    /// while this node writes.
    fn append_then(&self, entries: Vec<Entry>, done: Flushed) -> Result<(), LogStoreError> {
        {
            let mut pending = self.pending.lock();
            for entry in &entries {
                pending.insert(entry.log_id.index, entry.clone());
            }
        }
        match self.writer.send(Job::Append { entries, callback: done }) {
            Ok(()) => Ok(()),
            Err(job) => {
                let error = LogStoreError::Durability("the log writer thread stopped".into());
                if let Job::Append { callback, .. } = job {
                    callback(Err(std::io::Error::other(error.to_string())));
                }
                Err(error)
            }
        }
    }

    /// Removes entries with index >= `from_index` (after the appends asked before).
    pub fn truncate_from(&self, from_index: u64) -> Result<(), LogStoreError> {
        self.pending.lock().retain(|index, _| *index < from_index);
        self.run_in_order(|done| Job::Truncate { from_index, done })
    }

    /// Records `log_id` as purged and removes entries with index <= it, in one transaction
    /// (after the appends asked before).
    pub fn purge_through(&self, log_id: LogId) -> Result<(), LogStoreError> {
        self.pending.lock().retain(|index, _| *index > log_id.index);
        self.run_in_order(|done| Job::Purge { log_id, done })
    }

    fn purge_through_now(&self, log_id: LogId) -> Result<(), LogStoreError> {
        let bytes = record::encode(&log_id, self.limits.record_bytes_max)
            .map_err(|cause| LogStoreError::Encode { table: "raft_meta", cause })?;
        let txn = self.database.begin_write().map_err(redb_error)?;
        txn.open_table(META_TABLE)
            .map_err(redb_error)?
            .insert(KEY_PURGED, bytes.as_slice())
            .map_err(redb_error)?;
        txn.open_table(LOG_TABLE)
            .map_err(redb_error)?
            .retain_in(..=log_id.index, |_, _| false)
            .map_err(redb_error)?;
        txn.commit().map_err(redb_error)
    }

    fn remove_range(&self, range: impl RangeBounds<u64> + 'static) -> Result<(), LogStoreError> {
        let txn = self.database.begin_write().map_err(redb_error)?;
        txn.open_table(LOG_TABLE).map_err(redb_error)?.retain_in(range, |_, _| false).map_err(redb_error)?;
        txn.commit().map_err(redb_error)
    }

    /// The log's state: last purged and last present ids.
    pub fn log_state(&self) -> Result<LogState<TypeConfig>, LogStoreError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(KEY_PURGED)?;
        let last_pending = self.pending.lock().last_key_value().map(|(_, e)| e.log_id);
        let last_log_id = last_pending.or(self.last_entry_id()?).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }
}

impl RaftLogReader<TypeConfig> for RedbLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        self.read_entries(bounds).map_err(|e| to_storage(ErrorSubject::Logs, ErrorVerb::Read, e))
    }
}

impl RaftLogStorage<TypeConfig> for RedbLogStore {
    type LogReader = RedbLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.log_state().map_err(|e| to_storage(ErrorSubject::Logs, ErrorVerb::Read, e))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(KEY_VOTE, vote).map_err(|e| to_storage(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(KEY_VOTE).map_err(|e| to_storage(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // A hint for re-applying at start (openraft's save_committed may lose it): not worth
        // an fsync per commit, nor a wait for the writer's, nor a transaction of its own; the
        // writer records it with the next appends (a full queue waits, as an append does).
        self.writer
            .send(Job::Committed(committed))
            .map_err(|_| LogStoreError::Durability("the log writer thread stopped".into()))
            .map_err(|e| to_storage(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> =
            self.read_meta(KEY_COMMITTED).map_err(|e| to_storage(ErrorSubject::Store, ErrorVerb::Read, e))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let done: Flushed = Box::new(move |result| callback.log_io_completed(result));
        self.append_then(entries.into_iter().collect(), done)
            .map_err(|e| to_storage(ErrorSubject::Logs, ErrorVerb::Write, e))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.truncate_from(log_id.index).map_err(|e| to_storage(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.purge_through(log_id).map_err(|e| to_storage(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
    }

    #[test]
    fn entries_survive_reopen_truncate_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        let store = RedbLogStore::open(&path, GroupLimits::default()).unwrap();
        store.append_entries((1..=10).map(|i| entry(1, i)).collect()).unwrap();
        store.truncate_from(8).unwrap();
        store.purge_through(entry(1, 3).log_id).unwrap();
        drop(store);
        // Phase: reopen; entries 4..=7 remain, purged is 3.
        let store = RedbLogStore::open(&path, GroupLimits::default()).unwrap();
        let state = store.log_state().unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(7));
        let all = store.read_entries((Bound::Unbounded, Bound::Unbounded)).unwrap();
        assert_eq!(all.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![4, 5, 6, 7]);
    }

    #[test]
    fn appends_are_readable_at_once_durable_when_told_and_truncations_keep_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        let store = RedbLogStore::open(&path, GroupLimits::default()).unwrap();
        let (told, flushed) = std::sync::mpsc::channel();
        for (first, last) in [(1u64, 4u64), (5, 8)] {
            let told = told.clone();
            let done: Flushed = Box::new(move |result| told.send(result.is_ok()).unwrap());
            store.append_then((first..=last).map(|i| entry(1, i)).collect(), done).unwrap();
            // Readable when append returns, written or not.
            let all = store.read_entries((Bound::Unbounded, Bound::Unbounded)).unwrap();
            let indexes: Vec<u64> = all.iter().map(|e| e.log_id.index).collect();
            assert_eq!(indexes, (1..=last).collect::<Vec<_>>());
            assert_eq!(store.log_state().unwrap().last_log_id.map(|l| l.index), Some(last));
        }
        // A truncation asked now runs after both appends: entries 6.. are gone, in memory and on disk.
        store.truncate_from(6).unwrap();
        assert!(flushed.recv().unwrap() && flushed.recv().unwrap(), "both appends told durable");
        let done: Flushed = Box::new(move |result| told.send(result.is_ok()).unwrap());
        store.append_then(vec![entry(2, 6)], done).unwrap();
        assert_eq!(store.log_state().unwrap().last_log_id, Some(entry(2, 6).log_id));
        assert!(flushed.recv().unwrap());
        drop(store);
        // Phase: reopen; what was told durable is there, the truncated entries are not.
        let store = RedbLogStore::open(&path, GroupLimits::default()).unwrap();
        let all = store.read_entries((Bound::Unbounded, Bound::Unbounded)).unwrap();
        let ids: Vec<(u64, u64)> = all.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect();
        assert_eq!(ids, [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 6)]);
    }

    #[test]
    fn a_corrupt_entry_is_a_typed_error_naming_table_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbLogStore::open(&dir.path().join("log.redb"), GroupLimits::default()).unwrap();
        store.append_entries(vec![entry(1, 1)]).unwrap();
        let txn = store.database.begin_write().unwrap();
        txn.open_table(LOG_TABLE).unwrap().insert(2u64, [1u8, 2, 3].as_slice()).unwrap();
        txn.commit().unwrap();
        let err = store.read_entries((Bound::Unbounded, Bound::Unbounded)).unwrap_err();
        assert!(err.to_string().contains("raft_log at 2"), "{err}");
        assert!(matches!(err, LogStoreError::Corrupt { table: "raft_log", .. }));
    }
}
