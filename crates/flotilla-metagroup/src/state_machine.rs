//! The state machine the metadata service implements, and its bounded snapshot stream.
//!
//! Invariants every implementation keeps:
//! - `apply` records `mark` in the same transaction as the batch's effects, so after a crash
//!   `last_applied` is exactly the last entry whose effects are on disk (never applied twice);
//! - `apply` is deterministic: its result depends only on the state and the batch (time comes
//!   from [`crate::Batch::proposed_at_ms`]);
//! - `write_snapshot` writes one consistent view and returns the mark of that view;
//! - `install_snapshot` replaces the whole state and the mark atomically.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::types::{Batch, LogId, Reply, StoredMembership};

/// Where the state machine stands: the last applied log id and the membership in force then.
/// Stored by the state machine as an opaque record, written with the changes it marks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedMark {
    pub log_id: Option<LogId>,
    pub membership: StoredMembership,
}

impl AppliedMark {
    /// The applied index (0: nothing applied).
    pub fn index(&self) -> u64 {
        self.log_id.map_or(0, |l| l.index)
    }
}

/// A state machine failure; the group stops applying (a replica never skips an entry).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateMachineError {
    #[error("state machine storage: {0}")]
    Storage(String),
    #[error("corrupt state record in table {table} at {key}: {reason}")]
    Corrupt { table: &'static str, key: String, reason: String },
    #[error("snapshot is over snapshot_bytes_max {bytes_max}")]
    SnapshotTooLarge { bytes_max: usize },
    #[error("snapshot does not decode: {reason}")]
    BadSnapshot { reason: String },
    #[error("snapshot stream: {0}")]
    Io(#[from] std::io::Error),
}

/// One committed entry of a run handed to [`StateMachine::apply_run`]: the mark to record
/// with it and its batch (`None`: a blank or membership entry, only the mark).
#[derive(Clone, Copy, Debug)]
pub struct RunEntry<'a> {
    pub mark: &'a AppliedMark,
    pub batch: Option<&'a Batch>,
}

/// The replicated state: the metadata service implements this over its namespace.
pub trait StateMachine: Send + Sync + 'static {
    /// Applies one batch and records `mark` atomically with it; returns the reply.
    fn apply(&mut self, mark: &AppliedMark, batch: &Batch) -> Result<Reply, StateMachineError>;
    /// Records `mark` for an entry with no batch (a blank or membership entry).
    fn record_mark(&mut self, mark: &AppliedMark) -> Result<(), StateMachineError>;
    /// Applies a run of consecutive committed entries, in order; one reply per entry (the
    /// default for an entry with no batch). The effects of every entry and the last mark
    /// may be recorded in one transaction, as long as the replies and the state are those
    /// of applying the entries one by one, and a crash keeps a prefix of the run whose
    /// last entry is the recorded mark. The default applies them one by one.
    fn apply_run(&mut self, run: &[RunEntry<'_>]) -> Result<Vec<Reply>, StateMachineError> {
        run.iter()
            .map(|entry| match entry.batch {
                Some(batch) => self.apply(entry.mark, batch),
                None => self.record_mark(entry.mark).map(|()| Reply::default()),
            })
            .collect()
    }
    /// The last recorded mark (`None` on a new state).
    fn last_applied(&self) -> Result<Option<AppliedMark>, StateMachineError>;
    /// Writes a consistent snapshot of the whole state to `out`; returns the mark it covers.
    fn write_snapshot(&self, out: &mut dyn Write) -> Result<AppliedMark, StateMachineError>;
    /// Replaces the whole state with the snapshot read from `input`, and the mark with `mark`.
    fn install_snapshot(&mut self, mark: &AppliedMark, input: &mut dyn Read)
        -> Result<(), StateMachineError>;
}

/// A writer into memory that refuses to grow past `bytes_max` (a snapshot never allocates
/// more than its bound).
pub struct BoundedWriter {
    bytes: Vec<u8>,
    bytes_max: usize,
}

impl BoundedWriter {
    pub fn new(bytes_max: usize) -> Self {
        BoundedWriter { bytes: Vec::new(), bytes_max }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

impl Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.bytes_max {
            return Err(std::io::Error::other(format!(
                "snapshot is over snapshot_bytes_max {}",
                self.bytes_max
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
