//! A caller's batch of changes in one write transaction, with records of its own, outside
//! the group commit: what a replicated state machine needs to apply one log entry (its
//! changes and its applied mark) atomically.
//!
//! Inside [`Namespace::apply_batch`], every change the body makes on this thread is applied
//! in the batch's transaction and not committed on its own; then `finish` writes the
//! caller's records in the same transaction, which is committed with `fsync`. A refusal that
//! wrote nothing (the usual kind) leaves the batch alone. A change that fails after writing
//! aborts the transaction, as in the group commit: nothing of the batch stays, later changes
//! of the body fail at once, [`Namespace::batch_undone`] says so, and the batch is reported
//! uncommitted; the caller applies it again without that change.
//!
//! Invariant: a namespace running batches has no other writer (a batch refuses to begin
//! while another change's transaction is open).

use crate::error::NamespaceError;
use crate::namespace::Namespace;
use crate::shared_txn::commit_batch;
use crate::tables::WriteTables;
use std::cell::Cell;

thread_local! {
    /// Inside `apply_batch` on this thread.
    static BATCHED: Cell<bool> = const { Cell::new(false) };
}

/// Inside a batch on this thread.
pub(crate) fn batched() -> bool {
    BATCHED.with(Cell::get)
}

/// How [`Namespace::apply_batch_with`] commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchDurability {
    /// With `fsync`: on disk when the call returns.
    Durable,
    /// Without: durable with the next durable commit, lost whole by a crash before it.
    Lazy,
}

/// The result of [`Namespace::apply_batch`]: the body's value, and whether the batch was
/// committed (false: a change failed after writing, and nothing of the batch stays).
#[derive(Debug)]
pub struct Batched<R> {
    pub value: R,
    pub committed: bool,
}

impl Namespace {
    /// Runs `body` with every change it makes on this thread in one write transaction, then
    /// `finish` with that transaction (for the caller's own tables), then commits it durably.
    /// Nothing is visible to readers before the commit.
    pub fn apply_batch<R>(
        &self,
        body: impl FnOnce() -> R,
        finish: impl FnOnce(&redb::WriteTransaction, &R) -> Result<(), NamespaceError>,
    ) -> Result<Batched<R>, NamespaceError> {
        self.apply_batch_with(BatchDurability::Durable, body, finish)
    }

    /// [`Namespace::apply_batch`], committed as `durability` says. A `Lazy` batch is
    /// visible to readers at once and survives a crash only once a later durable commit
    /// (any durable batch, or [`Namespace::sync_batches`]) has been made; after a crash the
    /// database is as of the last durable commit, every lazy batch after it gone whole.
    /// The metadata group uses it: its log is durable, and a replica re-applies from the log
    /// what its state lost (the batch's applied mark is in the same transaction).
    pub fn apply_batch_with<R>(
        &self,
        durability: BatchDurability,
        body: impl FnOnce() -> R,
        finish: impl FnOnce(&redb::WriteTransaction, &R) -> Result<(), NamespaceError>,
    ) -> Result<Batched<R>, NamespaceError> {
        if batched() {
            return Err(NamespaceError::Storage("a batch may not be nested in another".into()));
        }
        self.reopen_if_broken()?;
        {
            let db = self.db.read();
            self.refuse_if_broken()?;
            self.open_txn.lock().begin_batch(&db, &self.ids, &self.group.counters)?;
        }
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                BATCHED.with(|b| b.set(false));
            }
        }
        BATCHED.with(|b| b.set(true));
        let reset = Reset;
        let value = body();
        drop(reset);
        let db = self.db.read();
        let mut open = self.open_txn.lock();
        if !open.is_open() {
            return Ok(Batched { value, committed: false });
        }
        let (txn, _) = open.take_for_commit(&db)?;
        let outcome = finish(&txn, &value).and_then(|()| commit_batch(txn, durability));
        self.note_failure(&outcome);
        outcome.map(|()| Batched { value, committed: true })
    }

    /// Makes every lazy batch committed so far durable (one empty durable commit).
    pub fn sync_batches(&self) -> Result<(), NamespaceError> {
        self.apply_batch(|| (), |_, _| Ok(())).map(|_| ())
    }

    /// The batch running on this thread lost its transaction (a change failed after
    /// writing); `false` outside a batch.
    pub fn batch_undone(&self) -> bool {
        batched() && !self.open_txn.lock().is_open()
    }

    /// A change inside a batch: applied in the batch's transaction, not committed.
    pub(crate) fn write_batched<R>(
        &self,
        change: &mut impl FnMut(&mut WriteTables<'_>) -> Result<R, NamespaceError>,
    ) -> Result<R, NamespaceError> {
        let db = self.db.read();
        self.refuse_if_broken()?;
        let mut open = self.open_txn.lock();
        if !open.is_open() {
            return Err(NamespaceError::Storage("the batch was undone by an earlier change".into()));
        }
        let outcome = open.apply(&db, &self.ids, &self.group.counters, change, false);
        self.note_failure(&outcome);
        outcome.map(|(value, _)| value)
    }

    /// Runs `query` on a read transaction of the namespace's database (for a caller's own
    /// tables kept beside the namespace's, read in the same snapshot).
    pub fn read_transaction<R>(
        &self,
        query: impl FnOnce(&redb::ReadTransaction) -> Result<R, NamespaceError>,
    ) -> Result<R, NamespaceError> {
        self.read_txn(query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Owner;
    use redb::TableDefinition;

    const MARKS: TableDefinition<&str, u64> = TableDefinition::new("test_marks");
    const OWNER: Owner = Owner { mode: 0o755, uid: 0, gid: 0 };

    fn mark(ns: &Namespace) -> Option<u64> {
        ns.read_transaction(|txn| match txn.open_table(MARKS) {
            Ok(table) => Ok(table.get("mark")?.map(|g| g.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(e.into()),
        })
        .unwrap()
    }

    /// Changes and the caller's record commit together; a refusal inside leaves the others.
    #[test]
    fn a_batch_commits_its_changes_and_the_callers_record_together() {
        let ns = Namespace::open_in_memory().unwrap();
        let done = ns
            .apply_batch(
                || {
                    vec![
                        ns.mkdir("/a", OWNER, 1).is_ok(),
                        ns.mkdir("/a", OWNER, 2).is_ok(),
                        ns.mkdir("/b", OWNER, 3).is_ok(),
                    ]
                },
                set_mark_any(7),
            )
            .unwrap();
        assert!(done.committed);
        assert_eq!(done.value, vec![true, false, true], "the refusal wrote nothing");
        assert_eq!(mark(&ns), Some(7));
        assert!(ns.lookup("/a").is_ok() && ns.lookup("/b").is_ok());
    }

    /// A batch whose first change is refused still commits (a batch never undoes itself on
    /// a refusal that wrote nothing), and a failing `finish` leaves nothing.
    #[test]
    fn a_refused_first_change_keeps_the_batch_and_a_failed_finish_keeps_nothing() {
        let ns = Namespace::open_in_memory().unwrap();
        let done = ns
            .apply_batch(
                || vec![ns.rmdir("/none", 1).is_ok(), ns.mkdir("/c", OWNER, 1).is_ok()],
                set_mark_any(1),
            )
            .unwrap();
        assert!(done.committed && !ns.batch_undone());
        assert_eq!(done.value, vec![false, true]);
        let failed = ns.apply_batch(
            || vec![ns.mkdir("/d", OWNER, 1).is_ok()],
            |_, _| Err(NamespaceError::Storage("finish refused".into())),
        );
        assert!(failed.is_err());
        assert!(ns.lookup("/d").is_err(), "nothing of a batch whose finish failed stays");
        assert_eq!(mark(&ns), Some(1));
        // Phase: the namespace still works outside batches.
        ns.mkdir("/e", OWNER, 1).unwrap();
    }

    /// A change that fails after writing undoes the whole batch: nothing of it stays, the
    /// later changes fail at once, and the batch is reported uncommitted.
    #[test]
    fn a_change_failing_after_writing_undoes_the_batch() {
        let ns = Namespace::open_in_memory().unwrap();
        let done = ns
            .apply_batch(
                || {
                    let made = ns.mkdir("/kept", OWNER, 1).is_ok();
                    let failed = ns.write(|tables| {
                        tables.counters.insert("written", 1)?;
                        Err::<(), _>(NamespaceError::NotEmpty { path: "/x".into() })
                    });
                    let undone = ns.batch_undone();
                    let later = ns.mkdir("/later", OWNER, 2).is_ok();
                    (made, failed.is_err(), undone, later)
                },
                set_mark_any(3),
            )
            .unwrap();
        assert!(!done.committed);
        assert_eq!(done.value, (true, true, true, false));
        assert!(ns.lookup("/kept").is_err() && ns.lookup("/later").is_err());
        assert_eq!(mark(&ns), None);
        assert!(!ns.batch_undone(), "outside a batch nothing is undone");
        // Phase: the batch applied again without the failing change commits.
        let again = ns.apply_batch(|| ns.mkdir("/kept", OWNER, 1).is_ok(), set_mark_any(3)).unwrap();
        assert!(again.committed && again.value);
        assert_eq!(mark(&ns), Some(3));
    }

    fn set_mark_any<R>(value: u64) -> impl FnOnce(&redb::WriteTransaction, &R) -> Result<(), NamespaceError> {
        move |txn, _| {
            txn.open_table(MARKS)?.insert("mark", value)?;
            Ok(())
        }
    }
}
