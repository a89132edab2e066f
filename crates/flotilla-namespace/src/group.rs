//! Group commit: the bookkeeping that lets many changes share one durable commit.
//!
//! Every change is applied in the shared write transaction (`shared_txn.rs`), then joins
//! the open *batch* and waits. One of the waiting callers becomes the committer: it waits
//! (at most `batch_delay_us_max`) while other changes are still being applied and the batch
//! has room, takes the batch, and commits the shared transaction with
//! `Durability::Immediate`, which makes it and every earlier non-durable commit (of changes
//! that had to commit at once) durable with one `fsync`. Only then is each member of the
//! batch answered. A batch holds at most
//! `batch_ops_max` changes; a change arriving at a full batch waits for it to be taken.
//!
//! Synchronous writers (each waits for its answer before its next change) would otherwise
//! settle into two half batches taking turns: while one half's `fsync` runs the other half
//! applies, and the committer of that half starts the moment the `fsync` ends, before the
//! writers just answered are back. So the committer also *lingers* (at most
//! `batch_linger_us_max`) until its batch holds as many changes as the last batch and the
//! changes that were waiting beside it (the writers seen in flight then), which a lone writer
//! (one change in flight) never waits for.
//!
//! This module is the pure state machine (counts, batches, who commits); `namespace.rs` does
//! the redb work.

use crate::error::NamespaceError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Group commit settings (the metadata service's `commit_batch_ops_max`,
/// `commit_batch_delay_us_max` and `commit_batch_linger_us_max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    /// Most changes one durable commit covers; at least 1.
    pub batch_ops_max: usize,
    /// Longest the committer waits for changes still being applied to join its batch.
    pub batch_delay_us_max: u64,
    /// Longest the committer waits, with nothing being applied, for the writers of the last
    /// batch to come back (0: never).
    pub batch_linger_us_max: u64,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit { batch_ops_max: 1024, batch_delay_us_max: 2000, batch_linger_us_max: 1000 }
    }
}

/// How a batch ended: committed, or the error its durable commit (or a reopen) gave.
#[derive(Clone, Debug)]
enum Outcome {
    Committed,
    NoSpace(String),
    Failed(String),
}

/// The changes one durable commit covers.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    outcome: Mutex<Option<Outcome>>,
}

/// What a waiting member does next.
pub(crate) enum Turn {
    /// Its batch ended with this result.
    Done(Result<(), NamespaceError>),
    /// It is the committer: commit the open batch, then wait again.
    Commit,
}

#[derive(Debug)]
struct State {
    /// The batch new changes join.
    open: Arc<Batch>,
    /// Changes in `open`.
    members: usize,
    /// Changes being applied (they will join `open` when their transaction commits).
    applying: usize,
    /// A committer is at work.
    committing: bool,
    /// Changes in the batch being committed.
    taken: usize,
    /// Changes the next batch is expected to hold: the last batch's and those that waited
    /// beside it (see the module comment).
    expected: usize,
}

/// Counts of the group commit since the namespace was opened (see [`Namespace::commit_stats`](crate::Namespace::commit_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Durable commits made (one `fsync` each).
    pub batches: u64,
    /// Changes those commits covered.
    pub changes: u64,
    /// Time changes spent in their own (non-durable) write transactions, waiting for the
    /// write lock included.
    pub apply_ns: u64,
    /// Of `apply_ns`, the time waiting for the write lock (`begin_write`).
    pub lock_ns: u64,
    /// Time committers waited for changes still being applied before taking a batch.
    pub gather_ns: u64,
    /// Time in the durable commits (their page writes and `fsync`).
    pub commit_ns: u64,
    /// Changes applied again because a later change in their shared transaction failed.
    pub reapplied: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    changes: AtomicU64,
    apply_ns: AtomicU64,
    lock_ns: AtomicU64,
    gather_ns: AtomicU64,
    commit_ns: AtomicU64,
    reapplied: AtomicU64,
}

impl Counters {
    pub(crate) fn add_reapplied(&self) {
        self.reapplied.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_apply(&self, since: Instant) {
        self.apply_ns.fetch_add(elapsed_ns(since), Ordering::Relaxed);
    }

    pub(crate) fn add_lock(&self, since: Instant) {
        self.lock_ns.fetch_add(elapsed_ns(since), Ordering::Relaxed);
    }

    pub(crate) fn add_commit(&self, since: Instant) {
        self.commit_ns.fetch_add(elapsed_ns(since), Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CommitStats {
        CommitStats {
            batches: self.batches.load(Ordering::Relaxed),
            changes: self.changes.load(Ordering::Relaxed),
            apply_ns: self.apply_ns.load(Ordering::Relaxed),
            lock_ns: self.lock_ns.load(Ordering::Relaxed),
            gather_ns: self.gather_ns.load(Ordering::Relaxed),
            commit_ns: self.commit_ns.load(Ordering::Relaxed),
            reapplied: self.reapplied.load(Ordering::Relaxed),
        }
    }
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The shared group commit state of one namespace.
#[derive(Debug)]
pub(crate) struct Group {
    settings: Mutex<GroupCommit>,
    state: Mutex<State>,
    changed: Condvar,
    pub(crate) counters: Counters,
}

/// One change being applied; it either joins the open batch or, dropped, leaves.
pub(crate) struct Applying<'g> {
    group: &'g Group,
    joined: bool,
}

impl Group {
    pub(crate) fn new(settings: GroupCommit) -> Self {
        let state =
            State { open: Arc::default(), members: 0, applying: 0, committing: false, taken: 0, expected: 1 };
        Group {
            settings: Mutex::new(clamp(settings)),
            state: Mutex::new(state),
            changed: Condvar::new(),
            counters: Counters::default(),
        }
    }

    pub(crate) fn set(&self, settings: GroupCommit) {
        *self.settings.lock() = clamp(settings);
        self.changed.notify_all();
    }

    /// Waits until the open batch has room for one more change, then counts it as applying.
    pub(crate) fn begin(&self) -> Applying<'_> {
        let ops_max = self.settings.lock().batch_ops_max;
        let mut state = self.state.lock();
        while state.members + state.applying >= ops_max {
            self.changed.wait(&mut state);
        }
        state.applying += 1;
        Applying { group: self, joined: false }
    }

    /// Changes being applied now (for tests that stage a race).
    #[cfg(test)]
    pub(crate) fn applying(&self) -> usize {
        self.state.lock().applying
    }

    /// The committer: waits for changes still being applied and for the writers expected
    /// back (bounded by the delay, the linger and the batch size), then takes the open batch
    /// (a fresh one opens for later changes).
    pub(crate) fn take(&self) -> Arc<Batch> {
        let settings = *self.settings.lock();
        let started = Instant::now();
        let apply_deadline = started + Duration::from_micros(settings.batch_delay_us_max);
        let linger_deadline = started + Duration::from_micros(settings.batch_linger_us_max);
        let mut state = self.state.lock();
        let target = state.expected.min(settings.batch_ops_max);
        // `begin` keeps members + applying within the batch size, so every change being
        // applied fits: wait for them (they are quick, no disk I/O) up to the delay, and
        // for the expected writers up to the linger.
        loop {
            let deadline = if state.applying > 0 {
                apply_deadline
            } else if state.members < target {
                linger_deadline
            } else {
                break;
            };
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        self.counters.changes.fetch_add(state.members as u64, Ordering::Relaxed);
        self.counters.gather_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
        state.taken = state.members;
        state.members = 0;
        let taken = std::mem::take(&mut state.open);
        self.changed.notify_all();
        taken
    }

    /// The committer is done with `batch`: record its result and wake its members.
    pub(crate) fn finish(&self, batch: &Batch, result: &Result<(), NamespaceError>) {
        let mut state = self.state.lock();
        *batch.outcome.lock() = Some(outcome_of(result));
        state.expected = (state.taken + state.members).max(1);
        state.committing = false;
        self.changed.notify_all();
    }

    /// The database was reopened after a failure: changes in the open batch were committed
    /// to the old database and are lost, so their callers get an error.
    pub(crate) fn fail_open(&self, why: &str) {
        let mut state = self.state.lock();
        state.members = 0;
        let lost = std::mem::take(&mut state.open);
        *lost.outcome.lock() = Some(Outcome::Failed(why.to_string()));
        self.changed.notify_all();
    }

    /// Waits until `batch` has ended or this caller is to commit.
    pub(crate) fn turn(&self, batch: &Batch) -> Turn {
        let mut state = self.state.lock();
        loop {
            if let Some(outcome) = batch.outcome.lock().clone() {
                return Turn::Done(result_of(outcome));
            }
            if !state.committing {
                state.committing = true;
                return Turn::Commit;
            }
            self.changed.wait(&mut state);
        }
    }
}

impl Applying<'_> {
    /// The change committed (not yet durably): it joins the open batch.
    pub(crate) fn join(mut self) -> Arc<Batch> {
        let mut state = self.group.state.lock();
        state.applying -= 1;
        state.members += 1;
        self.joined = true;
        self.group.changed.notify_all();
        Arc::clone(&state.open)
    }
}

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        if !self.joined {
            self.group.state.lock().applying -= 1;
            self.group.changed.notify_all();
        }
    }
}

fn clamp(settings: GroupCommit) -> GroupCommit {
    GroupCommit { batch_ops_max: settings.batch_ops_max.max(1), ..settings }
}

fn outcome_of(result: &Result<(), NamespaceError>) -> Outcome {
    match result {
        Ok(()) => Outcome::Committed,
        Err(NamespaceError::NoSpace { message }) => Outcome::NoSpace(message.clone()),
        Err(other) => Outcome::Failed(other.to_string()),
    }
}

fn result_of(outcome: Outcome) -> Result<(), NamespaceError> {
    match outcome {
        Outcome::Committed => Ok(()),
        Outcome::NoSpace(message) => Err(NamespaceError::NoSpace { message }),
        Outcome::Failed(message) => Err(NamespaceError::Storage(message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_change_commits_its_own_batch() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 4,
            batch_delay_us_max: 1_000_000,
            batch_linger_us_max: 0,
        });
        let batch = group.begin().join();
        assert!(matches!(group.turn(&batch), Turn::Commit));
        let taken = group.take();
        assert!(Arc::ptr_eq(&taken, &batch));
        group.finish(&taken, &Ok(()));
        assert!(matches!(group.turn(&batch), Turn::Done(Ok(()))));
    }

    #[test]
    fn a_failed_commit_fails_every_member() {
        let group = Group::new(GroupCommit::default());
        let first = group.begin().join();
        let second = group.begin().join();
        assert!(Arc::ptr_eq(&first, &second));
        assert!(matches!(group.turn(&first), Turn::Commit));
        let taken = group.take();
        group.finish(&taken, &Err(NamespaceError::NoSpace { message: "full".into() }));
        assert!(matches!(group.turn(&second), Turn::Done(Err(NamespaceError::NoSpace { .. }))));
        assert!(matches!(group.turn(&first), Turn::Done(Err(NamespaceError::NoSpace { .. }))));
    }

    #[test]
    fn a_full_batch_is_taken_and_a_new_one_opens() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 2,
            batch_delay_us_max: 60_000_000,
            batch_linger_us_max: 0,
        });
        let first = group.begin().join();
        let second = group.begin().join();
        let taken = group.take();
        assert!(Arc::ptr_eq(&taken, &first) && Arc::ptr_eq(&taken, &second));
        let next = group.begin().join();
        assert!(!Arc::ptr_eq(&next, &first));
    }

    #[test]
    fn the_committer_waits_for_a_change_being_applied() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 8,
            batch_delay_us_max: 60_000_000,
            batch_linger_us_max: 0,
        });
        let applying = group.begin();
        std::thread::scope(|scope| {
            let joined = scope.spawn(move || applying.join());
            let taken = group.take();
            let joined = joined.join().expect("the joining thread panicked");
            assert!(Arc::ptr_eq(&taken, &joined));
        });
    }

    #[test]
    fn a_change_that_fails_leaves_the_batch_unchanged() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 2,
            batch_delay_us_max: 60_000_000,
            batch_linger_us_max: 0,
        });
        drop(group.begin());
        let batch = group.begin().join();
        drop(group.begin());
        // The failed change left: the committer does not wait the minute for it.
        let taken = group.take();
        assert!(Arc::ptr_eq(&taken, &batch));
    }

    #[test]
    fn the_committer_lingers_for_the_writers_of_the_last_batch() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 8,
            batch_delay_us_max: 0,
            batch_linger_us_max: 60_000_000,
        });
        // Two writers: one in the batch being committed, one waiting beside it.
        let first = group.begin().join();
        let taken = group.take();
        let beside = group.begin().join();
        group.finish(&taken, &Ok(()));
        assert!(matches!(group.turn(&first), Turn::Done(Ok(()))));
        // The first writer comes back while the committer of the next batch lingers.
        std::thread::scope(|scope| {
            let back = scope.spawn(|| group.begin().join());
            let next = group.take();
            let back = back.join().expect("the returning writer panicked");
            assert!(Arc::ptr_eq(&next, &beside) && Arc::ptr_eq(&next, &back));
        });
    }

    #[test]
    fn a_lone_writer_does_not_linger() {
        let group = Group::new(GroupCommit {
            batch_ops_max: 8,
            batch_delay_us_max: 0,
            batch_linger_us_max: 60_000_000,
        });
        for _ in 0..3 {
            let batch = group.begin().join();
            // Would wait the minute if it expected anyone else.
            let taken = group.take();
            assert!(Arc::ptr_eq(&taken, &batch));
            group.finish(&taken, &Ok(()));
        }
    }

    #[test]
    fn a_reopen_fails_the_open_batch() {
        let group = Group::new(GroupCommit::default());
        let batch = group.begin().join();
        group.fail_open("reopened");
        assert!(matches!(group.turn(&batch), Turn::Done(Err(NamespaceError::Storage(_)))));
    }
}
