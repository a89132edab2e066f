//! The group's type configuration and the application request: a versioned, bounded batch of
//! opaque namespace changes (group commit: many changes per log entry).
//!
//! Invariant: a batch that reaches the log passed [`Batch::check`] against the group's limits;
//! a batch read back from disk is checked again before it is applied.

use serde::{Deserialize, Serialize};

use crate::limits::GroupLimits;

/// A node's id in the group (1, 2, 3 …). 0 is never a node.
pub type NodeId = u64;

/// The only batch format this build writes and reads.
pub const BATCH_VERSION: u16 = 1;

/// Bytes counted for a change's fixed fields when bounding a batch.
pub const CHANGE_HEADER_BYTES: usize = 24;

/// Session 0: a change outside exactly-once (heartbeats, internal changes).
pub const SESSION_NONE: u64 = 0;

/// One namespace change as the metadata service encodes it; opaque to the group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The client's session (0: not exactly-once).
    pub session_id: u64,
    /// The request's sequence in its session, from 1, increasing.
    pub sequence: u64,
    /// The client has seen every reply of this session up to this sequence (they may be dropped).
    pub acknowledged_through: u64,
    /// The change itself, encoded by the metadata service.
    pub body: Vec<u8>,
}

/// The application request of the log: a versioned batch of changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// [`BATCH_VERSION`].
    pub version: u16,
    /// The leader's clock when it proposed the batch; the only clock the state machine sees
    /// (session expiry is decided by it, so every replica decides the same).
    pub proposed_at_ms: u64,
    /// The changes, applied in order.
    pub changes: Vec<Change>,
}

/// The state machine's reply to one batch: opaque bytes for the metadata service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub bytes: Vec<u8>,
}

/// Why a batch is refused before it enters the log, or after it is read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    #[error("batch version {found} is not supported (this build reads {BATCH_VERSION})")]
    Version { found: u16 },
    #[error("batch holds {changes} changes, more than batch_changes_max {changes_max}")]
    TooManyChanges { changes: usize, changes_max: usize },
    #[error("batch holds {bytes} bytes, more than batch_bytes_max {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
    #[error("batch is empty")]
    Empty,
}

impl Batch {
    /// A batch of the current version.
    pub fn new(proposed_at_ms: u64, changes: Vec<Change>) -> Self {
        Batch { version: BATCH_VERSION, proposed_at_ms, changes }
    }

    /// Bytes the batch counts against `batch_bytes_max`.
    pub fn size_bytes(&self) -> usize {
        self.changes.iter().map(|c| CHANGE_HEADER_BYTES + c.body.len()).sum()
    }

    /// Checks version and bounds.
    pub fn check(&self, limits: &GroupLimits) -> Result<(), BatchError> {
        if self.version != BATCH_VERSION {
            return Err(BatchError::Version { found: self.version });
        }
        if self.changes.is_empty() {
            return Err(BatchError::Empty);
        }
        if self.changes.len() > limits.batch_changes_max {
            return Err(BatchError::TooManyChanges {
                changes: self.changes.len(),
                changes_max: limits.batch_changes_max,
            });
        }
        let bytes = self.size_bytes();
        if bytes > limits.batch_bytes_max {
            return Err(BatchError::TooLarge { bytes, bytes_max: limits.batch_bytes_max });
        }
        Ok(())
    }
}

openraft::declare_raft_types!(
    /// The metadata group's Raft types: u64 node ids, nodes named by address, batches in, bytes out.
    pub TypeConfig:
        D = Batch,
        R = Reply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::snapshot_buffer::SnapshotBuffer,
);

/// A log entry of the group.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id of the group.
pub type LogId = openraft::LogId<NodeId>;
/// Openraft's storage error for the group.
pub type StorageError = openraft::StorageError<NodeId>;
/// The group's Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// The membership recorded with the last applied entry.
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
