//! The Raft log and the Raft metadata (vote, committed, purged) in one redb file.
//!
//! Invariants: an append is durable (redb commit with immediate durability, fsync) before its
//! callback fires; every record is checked when read back and a bad one is a typed
//! [`LogStoreError::Corrupt`] naming the table and key; entries are stored under their own
//! index and an entry read under another index is corrupt.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, Vote};
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
}

impl RedbLogStore {
    /// Opens (or creates) the log file at `path`.
    pub fn open(path: &Path, limits: GroupLimits) -> Result<Self, LogStoreError> {
        let database = Database::create(path).map_err(redb_error)?;
        let txn = database.begin_write().map_err(redb_error)?;
        txn.open_table(LOG_TABLE).map_err(redb_error)?;
        txn.open_table(META_TABLE).map_err(redb_error)?;
        txn.commit().map_err(redb_error)?;
        Ok(RedbLogStore { database: Arc::new(database), limits })
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

    /// Reads entries in `range`, at most `log_read_entries_max` of them.
    pub fn read_entries(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, LogStoreError> {
        let txn = self.database.begin_read().map_err(redb_error)?;
        let table = txn.open_table(LOG_TABLE).map_err(redb_error)?;
        let mut entries = Vec::new();
        for item in table.range::<u64>(range).map_err(redb_error)? {
            if entries.len() as u64 >= self.limits.log_read_entries_max {
                break;
            }
            let (key, value) = item.map_err(redb_error)?;
            entries.push(self.decode_entry(key.value(), value.value())?);
        }
        Ok(entries)
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
        let txn = self.database.begin_write().map_err(redb_error)?;
        {
            let mut table = txn.open_table(LOG_TABLE).map_err(redb_error)?;
            for entry in &entries {
                let bytes = record::encode(entry, self.limits.record_bytes_max)
                    .map_err(|cause| LogStoreError::Encode { table: "raft_log", cause })?;
                table.insert(entry.log_id.index, bytes.as_slice()).map_err(redb_error)?;
            }
        }
        txn.commit().map_err(redb_error)
    }

    /// Removes entries with index >= `from_index`.
    pub fn truncate_from(&self, from_index: u64) -> Result<(), LogStoreError> {
        self.remove_range(from_index..)
    }

    /// Records `log_id` as purged and removes entries with index <= it, in one transaction.
    pub fn purge_through(&self, log_id: LogId) -> Result<(), LogStoreError> {
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
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
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
        // an fsync per commit; the next append makes it durable.
        self.write_meta_with(KEY_COMMITTED, &committed, Durability::None)
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
        let result = self.append_entries(entries.into_iter().collect());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(to_storage(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
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
