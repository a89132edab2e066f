//! A small redb key/value [`StateMachine`]: the state machine the group's tests run, and the
//! shape the metadata service's will take (effects, reply table and mark in one transaction).
//!
//! Changes are [`KvOp`]s; `Push` appends an item to a list, so an entry applied twice or out
//! of order shows in the list. The reply of a batch is the postcard encoding of one
//! [`KvOutcome`] per change. The reply table is kept whole in one record (fine at test sizes;
//! the metadata service keeps one record per session).

use std::io::{Read, Write};
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::record;
use crate::reply_table::{Lookup, ReplyError, ReplyLimits, ReplyTable};
use crate::state_machine::{AppliedMark, StateMachine, StateMachineError};
use crate::types::{Batch, Change, Reply, SESSION_NONE};

const LISTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv_lists");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("kv_meta");
const KEY_MARK: &str = "applied_mark";
const KEY_REPLIES: &str = "reply_table";

/// A change to the key/value state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOp {
    /// Opens an exactly-once session; the reply is its id.
    OpenSession,
    /// Appends `item` to the list at `key`; the reply is the list's new length.
    Push { key: Vec<u8>, item: u64 },
}

/// What happened to one change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOutcome {
    Applied(u64),
    Replayed(u64),
    Refused(ReplyError),
    Invalid(String),
}

/// The whole state in a snapshot.
#[derive(Serialize, Deserialize)]
struct KvImage {
    replies: ReplyTable,
    lists: Vec<(Vec<u8>, Vec<u64>)>,
}

/// The key/value state machine.
pub struct KvStateMachine {
    database: Database,
    reply_limits: ReplyLimits,
    record_bytes_max: usize,
}

fn storage(e: impl std::fmt::Display) -> StateMachineError {
    StateMachineError::Storage(e.to_string())
}

impl KvStateMachine {
    /// Opens (or creates) the state at `path`.
    pub fn open(
        path: &Path,
        reply_limits: ReplyLimits,
        record_bytes_max: usize,
    ) -> Result<Self, StateMachineError> {
        let database = Database::create(path).map_err(storage)?;
        let txn = database.begin_write().map_err(storage)?;
        txn.open_table(LISTS).map_err(storage)?;
        txn.open_table(META).map_err(storage)?;
        txn.commit().map_err(storage)?;
        Ok(KvStateMachine { database, reply_limits, record_bytes_max })
    }

    /// The list at `key` (empty if none).
    pub fn list(&self, key: &[u8]) -> Result<Vec<u64>, StateMachineError> {
        let txn = self.database.begin_read().map_err(storage)?;
        let table = txn.open_table(LISTS).map_err(storage)?;
        let Some(value) = table.get(key).map_err(storage)? else { return Ok(Vec::new()) };
        self.decode("kv_lists", &String::from_utf8_lossy(key), value.value())
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        key: &str,
        bytes: &[u8],
    ) -> Result<T, StateMachineError> {
        record::decode(bytes, self.record_bytes_max).map_err(|e| StateMachineError::Corrupt {
            table,
            key: key.to_string(),
            reason: e.to_string(),
        })
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, StateMachineError> {
        record::encode(value, self.record_bytes_max).map_err(storage)
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        table: &impl ReadableTable<&'static str, &'static [u8]>,
        key: &'static str,
    ) -> Result<Option<T>, StateMachineError> {
        let Some(value) = table.get(key).map_err(storage)? else { return Ok(None) };
        self.decode("kv_meta", key, value.value()).map(Some)
    }

    fn execute(
        &self,
        lists: &mut redb::Table<&[u8], &[u8]>,
        replies: &mut ReplyTable,
        now_ms: u64,
        op: KvOp,
    ) -> Result<Result<u64, ReplyError>, StateMachineError> {
        match op {
            KvOp::OpenSession => Ok(replies.open_session(now_ms)),
            KvOp::Push { key, item } => {
                let mut list: Vec<u64> = match lists.get(key.as_slice()).map_err(storage)? {
                    Some(v) => self.decode("kv_lists", &String::from_utf8_lossy(&key), v.value())?,
                    None => Vec::new(),
                };
                list.push(item);
                let bytes = self.encode(&list)?;
                lists.insert(key.as_slice(), bytes.as_slice()).map_err(storage)?;
                Ok(Ok(list.len() as u64))
            }
        }
    }

    fn apply_change(
        &self,
        lists: &mut redb::Table<&[u8], &[u8]>,
        replies: &mut ReplyTable,
        now_ms: u64,
        change: &Change,
    ) -> Result<KvOutcome, StateMachineError> {
        let op: KvOp = match postcard::from_bytes(&change.body) {
            Ok(op) => op,
            Err(e) => return Ok(KvOutcome::Invalid(e.to_string())),
        };
        if change.session_id == SESSION_NONE {
            return Ok(match self.execute(lists, replies, now_ms, op)? {
                Ok(v) => KvOutcome::Applied(v),
                Err(e) => KvOutcome::Refused(e),
            });
        }
        match replies.check(change.session_id, change.sequence, change.acknowledged_through) {
            Err(e) => Ok(KvOutcome::Refused(e)),
            Ok(Lookup::Replay(bytes)) => Ok(KvOutcome::Replayed(reply_value(&bytes))),
            Ok(Lookup::Apply) => {
                let value = match self.execute(lists, replies, now_ms, op)? {
                    Ok(v) => v,
                    Err(e) => return Ok(KvOutcome::Refused(e)),
                };
                if let Err(e) =
                    replies.record(change.session_id, change.sequence, value.to_le_bytes().to_vec())
                {
                    return Ok(KvOutcome::Refused(e));
                }
                Ok(KvOutcome::Applied(value))
            }
        }
    }
}

fn reply_value(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let n = bytes.len().min(8);
    word[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(word)
}

impl StateMachine for KvStateMachine {
    fn apply(&mut self, mark: &AppliedMark, batch: &Batch) -> Result<Reply, StateMachineError> {
        let txn = self.database.begin_write().map_err(storage)?;
        let outcomes = {
            let mut meta = txn.open_table(META).map_err(storage)?;
            let mut lists = txn.open_table(LISTS).map_err(storage)?;
            let mut replies: ReplyTable = self
                .read_meta(&meta, KEY_REPLIES)?
                .unwrap_or_else(|| ReplyTable::new(self.reply_limits.clone()));
            replies.tick(batch.proposed_at_ms);
            let mut outcomes = Vec::with_capacity(batch.changes.len());
            for change in &batch.changes {
                outcomes.push(self.apply_change(&mut lists, &mut replies, batch.proposed_at_ms, change)?);
            }
            meta.insert(KEY_REPLIES, self.encode(&replies)?.as_slice()).map_err(storage)?;
            meta.insert(KEY_MARK, self.encode(mark)?.as_slice()).map_err(storage)?;
            outcomes
        };
        txn.commit().map_err(storage)?;
        Ok(Reply { bytes: postcard::to_stdvec(&outcomes).map_err(storage)? })
    }

    fn record_mark(&mut self, mark: &AppliedMark) -> Result<(), StateMachineError> {
        let txn = self.database.begin_write().map_err(storage)?;
        txn.open_table(META)
            .map_err(storage)?
            .insert(KEY_MARK, self.encode(mark)?.as_slice())
            .map_err(storage)?;
        txn.commit().map_err(storage)
    }

    fn last_applied(&self) -> Result<Option<AppliedMark>, StateMachineError> {
        let txn = self.database.begin_read().map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        self.read_meta(&meta, KEY_MARK)
    }

    fn write_snapshot(&self, out: &mut dyn Write) -> Result<AppliedMark, StateMachineError> {
        let txn = self.database.begin_read().map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        let mark: AppliedMark = self.read_meta(&meta, KEY_MARK)?.unwrap_or_default();
        let replies =
            self.read_meta(&meta, KEY_REPLIES)?.unwrap_or_else(|| ReplyTable::new(self.reply_limits.clone()));
        let table = txn.open_table(LISTS).map_err(storage)?;
        let mut lists = Vec::new();
        for item in table.iter().map_err(storage)? {
            let (key, value) = item.map_err(storage)?;
            let key = key.value().to_vec();
            let list = self.decode("kv_lists", &String::from_utf8_lossy(&key), value.value())?;
            lists.push((key, list));
        }
        let image = record::encode(&KvImage { replies, lists }, usize::MAX).map_err(storage)?;
        out.write_all(&image)?;
        Ok(mark)
    }

    fn install_snapshot(
        &mut self,
        mark: &AppliedMark,
        input: &mut dyn Read,
    ) -> Result<(), StateMachineError> {
        let mut bytes = Vec::new();
        input.read_to_end(&mut bytes)?;
        let image: KvImage = record::decode(&bytes, usize::MAX)
            .map_err(|e| StateMachineError::BadSnapshot { reason: e.to_string() })?;
        let txn = self.database.begin_write().map_err(storage)?;
        {
            let mut lists = txn.open_table(LISTS).map_err(storage)?;
            lists.retain(|_, _| false).map_err(storage)?;
            for (key, list) in &image.lists {
                lists.insert(key.as_slice(), self.encode(list)?.as_slice()).map_err(storage)?;
            }
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert(KEY_REPLIES, self.encode(&image.replies)?.as_slice()).map_err(storage)?;
            meta.insert(KEY_MARK, self.encode(mark)?.as_slice()).map_err(storage)?;
        }
        txn.commit().map_err(storage)
    }
}

/// Encodes an op as a change body.
pub fn encode_op(op: &KvOp) -> Vec<u8> {
    postcard::to_stdvec(op).unwrap_or_default()
}

/// Decodes a batch reply into its outcomes.
pub fn decode_outcomes(reply: &Reply) -> Result<Vec<KvOutcome>, postcard::Error> {
    postcard::from_bytes(&reply.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId};

    fn mark(index: u64) -> AppliedMark {
        AppliedMark {
            log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            ..AppliedMark::default()
        }
    }

    fn push(session_id: u64, sequence: u64, item: u64) -> Change {
        let body = encode_op(&KvOp::Push { key: b"k".to_vec(), item });
        Change { session_id, sequence, acknowledged_through: 0, body }
    }

    #[test]
    fn the_mark_reopens_with_the_effects_and_a_retry_replays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let mut state = KvStateMachine::open(&path, ReplyLimits::default(), 1 << 20).unwrap();
        let open = Change {
            session_id: 0,
            sequence: 0,
            acknowledged_through: 0,
            body: encode_op(&KvOp::OpenSession),
        };
        state.apply(&mark(1), &Batch::new(0, vec![open])).unwrap();
        state.apply(&mark(2), &Batch::new(0, vec![push(1, 1, 7), push(1, 2, 8)])).unwrap();
        drop(state);
        // Phase: reopened, the mark and the effects agree; the same requests replay.
        let mut state = KvStateMachine::open(&path, ReplyLimits::default(), 1 << 20).unwrap();
        assert_eq!(state.last_applied().unwrap().map(|m| m.index()), Some(2));
        let reply = state.apply(&mark(3), &Batch::new(0, vec![push(1, 2, 8)])).unwrap();
        assert_eq!(decode_outcomes(&reply).unwrap(), vec![KvOutcome::Replayed(2)]);
        assert_eq!(state.list(b"k").unwrap(), vec![7, 8]);
        // Phase: a snapshot installed into a fresh state brings the mark, lists and replies.
        let mut image = Vec::new();
        let covered = state.write_snapshot(&mut image).unwrap();
        let mut fresh =
            KvStateMachine::open(&dir.path().join("fresh.redb"), ReplyLimits::default(), 1 << 20).unwrap();
        fresh.install_snapshot(&covered, &mut image.as_slice()).unwrap();
        assert_eq!(fresh.last_applied().unwrap(), Some(covered));
        assert_eq!(fresh.list(b"k").unwrap(), vec![7, 8]);
        let reply = fresh.apply(&mark(4), &Batch::new(0, vec![push(1, 1, 7)])).unwrap();
        assert_eq!(decode_outcomes(&reply).unwrap(), vec![KvOutcome::Replayed(1)]);
    }
}
