//! The adapter from openraft's `RaftStateMachine` to a [`StateMachine`].
//!
//! Invariants: entries are handed to the state machine in log order, in runs of consecutive
//! committed entries (at most `apply_run_entries_max` each), each entry with the mark (log id
//! and membership) it must record atomically with its effects; snapshots are built from one
//! consistent view, bounded by `snapshot_bytes_max`, and sent in chunks of
//! `snapshot_chunk_bytes` by openraft; a snapshot received over the bound is refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};
use parking_lot::Mutex;

use crate::limits::GroupLimits;
use crate::snapshot_buffer::SnapshotBuffer;
use crate::state_machine::{AppliedMark, BoundedWriter, RunEntry, StateMachine, StateMachineError};
use crate::types::{Entry, LogId, NodeId, Reply, StorageError, StoredMembership, TypeConfig};

type Meta = SnapshotMeta<NodeId, openraft::BasicNode>;
/// The last snapshot built or installed: its meta and bytes.
type KeptSnapshot = (Meta, Vec<u8>);

fn to_storage(verb: ErrorVerb, e: StateMachineError) -> StorageError {
    StorageError::from(openraft::StorageIOError::new(ErrorSubject::StateMachine, verb, AnyError::new(&e)))
}

/// Owns the state machine for openraft; clones share it (a clone is the snapshot builder).
pub struct StateMachineStore<S: StateMachine> {
    state: Arc<Mutex<S>>,
    membership: Arc<Mutex<StoredMembership>>,
    current: Arc<Mutex<Option<KeptSnapshot>>>,
    snapshots_built: Arc<AtomicU64>,
    limits: GroupLimits,
}

impl<S: StateMachine> Clone for StateMachineStore<S> {
    fn clone(&self) -> Self {
        StateMachineStore {
            state: self.state.clone(),
            membership: self.membership.clone(),
            current: self.current.clone(),
            snapshots_built: self.snapshots_built.clone(),
            limits: self.limits.clone(),
        }
    }
}

impl<S: StateMachine> StateMachineStore<S> {
    /// Wraps `state`, reading its last mark.
    pub fn new(state: S, limits: GroupLimits) -> Result<Self, StateMachineError> {
        let membership = state.last_applied()?.map(|m| m.membership).unwrap_or_default();
        Ok(StateMachineStore {
            state: Arc::new(Mutex::new(state)),
            membership: Arc::new(Mutex::new(membership)),
            current: Arc::new(Mutex::new(None)),
            snapshots_built: Arc::new(AtomicU64::new(0)),
            limits,
        })
    }

    /// Runs `f` on the state machine (for reads by the service and by tests).
    pub fn with_state<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.state.lock())
    }

    /// Applies `entries` (consecutive, committed) in runs of at most
    /// `GroupLimits::apply_run_entries_max`, each run handed to the state machine at once.
    /// An error names the first entry of the run that failed.
    fn apply_entries(&self, entries: Vec<Entry>) -> Result<Vec<Reply>, (LogId, StateMachineError)> {
        let run_max = self.limits.apply_run_entries_max.max(1);
        let mut replies = Vec::with_capacity(entries.len());
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            let run: Vec<Entry> = entries.by_ref().take(run_max).collect();
            let marks: Vec<AppliedMark> = {
                let mut membership = self.membership.lock();
                run.iter()
                    .map(|entry| {
                        let log_id = Some(entry.log_id);
                        if let EntryPayload::Membership(m) = &entry.payload {
                            *membership = StoredMembership::new(log_id, m.clone());
                        }
                        AppliedMark { log_id, membership: membership.clone() }
                    })
                    .collect()
            };
            let items: Vec<RunEntry<'_>> = run
                .iter()
                .zip(&marks)
                .map(|(entry, mark)| RunEntry {
                    mark,
                    batch: match &entry.payload {
                        EntryPayload::Normal(batch) => Some(batch),
                        EntryPayload::Blank | EntryPayload::Membership(_) => None,
                    },
                })
                .collect();
            let applied = self.state.lock().apply_run(&items).and_then(|applied| {
                if applied.len() == items.len() {
                    Ok(applied)
                } else {
                    Err(StateMachineError::Storage(format!(
                        "the state machine answered {} replies for a run of {} entries",
                        applied.len(),
                        items.len()
                    )))
                }
            });
            match applied {
                Ok(applied) => replies.extend(applied),
                Err(e) => {
                    // The membership kept in memory may be ahead of what was applied: take
                    // it back from the state machine's own mark.
                    if let Ok(mark) = self.state.lock().last_applied() {
                        *self.membership.lock() = mark.map(|m| m.membership).unwrap_or_default();
                    }
                    return Err((run[0].log_id, e));
                }
            }
        }
        Ok(replies)
    }

    fn build(&self) -> Result<Snapshot<TypeConfig>, StateMachineError> {
        let mut out = BoundedWriter::new(self.limits.snapshot_bytes_max);
        let mark = self.state.lock().write_snapshot(&mut out)?;
        let bytes = out.into_bytes();
        let built = self.snapshots_built.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match mark.log_id {
            Some(l) => format!("{}-{}-{built}", l.leader_id.term, l.index),
            None => format!("0-0-{built}"),
        };
        let meta = Meta { last_log_id: mark.log_id, last_membership: mark.membership, snapshot_id };
        *self.current.lock() = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(SnapshotBuffer::from_bytes(bytes, self.limits.snapshot_bytes_max)),
        })
    }
}

impl<S: StateMachine> RaftSnapshotBuilder<TypeConfig> for StateMachineStore<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        self.build().map_err(|e| to_storage(ErrorVerb::Write, e))
    }
}

impl<S: StateMachine> RaftStateMachine<TypeConfig> for StateMachineStore<S> {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let mark = self.state.lock().last_applied().map_err(|e| to_storage(ErrorVerb::Read, e))?;
        let mark = mark.unwrap_or_default();
        Ok((mark.log_id, mark.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries.into_iter().collect()).map_err(|(log_id, e)| {
            StorageError::from(openraft::StorageIOError::apply(log_id, AnyError::new(&e)))
        })
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotBuffer>, StorageError> {
        Ok(Box::new(SnapshotBuffer::new(self.limits.snapshot_bytes_max)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<SnapshotBuffer>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_bytes();
        if bytes.len() > self.limits.snapshot_bytes_max {
            let e = StateMachineError::SnapshotTooLarge { bytes_max: self.limits.snapshot_bytes_max };
            return Err(to_storage(ErrorVerb::Write, e));
        }
        let mark = AppliedMark { log_id: meta.last_log_id, membership: meta.last_membership.clone() };
        self.state
            .lock()
            .install_snapshot(&mark, &mut bytes.as_slice())
            .map_err(|e| to_storage(ErrorVerb::Write, e))?;
        *self.membership.lock() = mark.membership;
        *self.current.lock() = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        if let Some((meta, bytes)) = self.current.lock().clone() {
            let snapshot = Box::new(SnapshotBuffer::from_bytes(bytes, self.limits.snapshot_bytes_max));
            return Ok(Some(Snapshot { meta, snapshot }));
        }
        // No snapshot kept since start: build one from the state (it covers all that was purged).
        self.build().map(Some).map_err(|e| to_storage(ErrorVerb::Read, e))
    }
}
