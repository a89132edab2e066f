//! Every bound of the group in one place; each is a setting.

/// Bounds of the metadata group. Every queue, record and snapshot is bounded by one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLimits {
    /// Most changes in one batch (one log entry).
    pub batch_changes_max: usize,
    /// Most bytes of changes in one batch.
    pub batch_bytes_max: usize,
    /// Most bytes of one encoded record on disk (a log entry, the vote, a state record);
    /// a larger record read back is refused as corrupt.
    pub record_bytes_max: usize,
    /// Most bytes of a snapshot; building or receiving a larger one is an error.
    pub snapshot_bytes_max: usize,
    /// Bytes per snapshot chunk on the network.
    pub snapshot_chunk_bytes: u64,
    /// Most log entries returned by one read of the log.
    pub log_read_entries_max: u64,
    /// Appends waiting for the log's next fsync (the flusher's queue); an append finding it
    /// full waits.
    pub log_flushes_waiting_max: usize,
    /// Most committed entries handed to the state machine at once (`StateMachine::apply_run`:
    /// one transaction for the run).
    pub apply_run_entries_max: usize,
}

impl Default for GroupLimits {
    fn default() -> Self {
        GroupLimits {
            batch_changes_max: 1024,
            batch_bytes_max: 4 << 20,
            record_bytes_max: 8 << 20,
            snapshot_bytes_max: 1 << 30,
            snapshot_chunk_bytes: 1 << 20,
            log_read_entries_max: 4096,
            log_flushes_waiting_max: 4096,
            apply_run_entries_max: 256,
        }
    }
}
