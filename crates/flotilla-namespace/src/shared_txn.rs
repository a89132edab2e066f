//! The write transaction that changes share until the next commit.
//!
//! Every change used to run in a write transaction of its own, committed without `fsync`;
//! each such commit rewrites, copy-on-write, the path from every changed leaf to its
//! root, and those paths grow with the directory. Now changes are applied one after
//! another (under the namespace's `open_txn` mutex, which redb's single writer requires
//! anyway) in one *shared* transaction, and the group committer commits it with `fsync`
//! (`Durability::Immediate`): a batch of changes costs one copy of each page it touches
//! and one commit.
//!
//! Most refusals (the name exists, the directory is not empty, permission denied) come from
//! checks made before a change writes anything; every write goes through
//! [`Tracked`](crate::tables::Tracked), which records it, so such a refusal leaves the shared
//! transaction as it was. But redb has no savepoint inside a transaction that has been
//! written to, so a change that fails *after* writing cannot be undone alone: it aborts the
//! whole shared transaction, and every change applied in it (its [`Attempt`]) is marked
//! undone. Those callers, waiting for their batch, apply their change again, and that
//! second time commit their transaction at once (without `fsync`, then wait for the group
//! commit as before), so nothing is undone twice. A change made inside `with_deferred_ack` also commits at
//! once, because it must be visible when its call returns.
//!
//! Changes in the shared transaction are invisible to readers until it commits, which is
//! before any of their callers is answered.
//!
//! The transaction's tables ([`WriteTables`], 11 redb tables) are opened once, when the
//! transaction begins, and stay open for every change applied in it: opening them per change
//! cost a lookup and a few allocations per table in redb's table tree, about 5–7% of the
//! service's CPU per create. The tables borrow the transaction, so [`TxnTables`] owns both
//! (`self_cell`); each change starts a new record of writes (`forget_writes`), and the
//! tables are dropped (`into_owner`) before the transaction is committed or aborted.
//!
//! Invariants:
//! - a change's writes are either in the transaction the committer commits after the
//!   change joined its batch, or in one committed earlier, or the change's attempt is
//!   marked undone before its batch is answered;
//! - the transaction is used only under the mutex that holds it.

use crate::error::NamespaceError;
use crate::group::Counters;
use crate::ids::InodeIds;
use crate::tables::WriteTables;
use redb::{Database, Durability, WriteTransaction};
use self_cell::self_cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The changes applied in one shared transaction: undone together if it is aborted.
#[derive(Debug, Default)]
pub(crate) struct Attempt {
    undone: AtomicBool,
}

impl Attempt {
    /// The transaction was aborted (or its commit failed): the change must be applied again.
    pub(crate) fn undone(&self) -> bool {
        self.undone.load(Ordering::Acquire)
    }

    fn mark_undone(&self) {
        self.undone.store(true, Ordering::Release);
    }
}

/// The open shared transaction, if any.
#[derive(Default)]
pub(crate) struct SharedTxn {
    open: Option<Open>,
}

/// What the open transaction's tables borrow.
struct Owner {
    txn: WriteTransaction,
    ids: Arc<InodeIds>,
}

self_cell!(
    /// The shared transaction with its tables, open for as long as it is.
    struct TxnTables {
        owner: Owner,
        #[not_covariant]
        dependent: WriteTables,
    }
);

impl TxnTables {
    /// Drops the tables, then hands the transaction back (to commit or abort it).
    fn into_txn(self) -> WriteTransaction {
        self.into_owner().txn
    }
}

struct Open {
    tables: TxnTables,
    attempt: Arc<Attempt>,
    /// Changes applied in it.
    changes: usize,
    /// Opened by `begin_batch`: one caller's batch of changes (`Namespace::apply_batch`),
    /// so a refusal that wrote nothing never undoes it, even as its first change.
    batched: bool,
}

impl std::fmt::Debug for SharedTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTxn").field("open", &self.open.is_some()).finish()
    }
}

impl SharedTxn {
    /// Applies `change` in the open transaction (beginning one if none is open). A failure
    /// aborts the transaction and undoes its attempt. With `commit_now` the transaction is
    /// committed (without `fsync`) after the change.
    pub(crate) fn apply<R>(
        &mut self,
        db: &Database,
        ids: &Arc<InodeIds>,
        counters: &Counters,
        change: &mut impl FnMut(&mut WriteTables<'_>) -> Result<R, NamespaceError>,
        commit_now: bool,
    ) -> Result<(R, Arc<Attempt>), NamespaceError> {
        if self.open.is_none() {
            self.begin(db, ids, counters, false)?;
        }
        let open = self.open.as_mut().expect("a transaction was just opened");
        let attempt = Arc::clone(&open.attempt);
        let (outcome, wrote) = open.tables.with_dependent_mut(|_, tables| {
            tables.forget_writes();
            let outcome = change(tables);
            (outcome, tables.wrote())
        });
        match outcome {
            // A refusal that wrote nothing (the usual kind: checks come before writes)
            // leaves the other changes in place.
            Err(error) if !wrote && (open.changes > 0 || open.batched) && !error.breaks_database() => {
                Err(error)
            }
            Err(error) => {
                self.undo();
                Err(error)
            }
            Ok(value) if commit_now => {
                let open = self.open.take().expect("the transaction is open");
                commit(open.tables.into_txn(), &attempt, Durability::None)?;
                Ok((value, attempt))
            }
            Ok(value) => {
                open.changes += 1;
                Ok((value, attempt))
            }
        }
    }

    /// Begins a transaction (none may be open) and opens its tables.
    fn begin(
        &mut self,
        db: &Database,
        ids: &Arc<InodeIds>,
        counters: &Counters,
        batched: bool,
    ) -> Result<(), NamespaceError> {
        let started = Instant::now();
        let txn = db.begin_write()?;
        counters.add_lock(started);
        // A failure to open the tables drops (aborts) the empty transaction.
        let tables = TxnTables::try_new(Owner { txn, ids: Arc::clone(ids) }, |owner| {
            WriteTables::open(&owner.txn, &owner.ids)
        })?;
        self.open = Some(Open { tables, attempt: Arc::default(), changes: 0, batched });
        Ok(())
    }

    /// Begins the transaction of one caller's batch (`Namespace::apply_batch`); refuses if a
    /// transaction is open already (the namespace has another writer).
    pub(crate) fn begin_batch(
        &mut self,
        db: &Database,
        ids: &Arc<InodeIds>,
        counters: &Counters,
    ) -> Result<(), NamespaceError> {
        if self.open.is_some() {
            return Err(NamespaceError::Storage(
                "a batch needs the namespace to itself, but another change is in progress".into(),
            ));
        }
        self.begin(db, ids, counters, true)
    }

    /// A transaction is open (after a batch began: no change of it was undone).
    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Aborts the open transaction, if any: every change applied in it is undone.
    pub(crate) fn undo(&mut self) {
        if let Some(open) = self.open.take() {
            open.attempt.mark_undone();
            // A failed abort leaves nothing committed either; the next write reports any
            // storage trouble.
            let _ = open.tables.into_txn().abort();
        }
    }

    /// Takes the open transaction out for the committer, or begins an empty one if every
    /// change was committed already. Beginning it here, under the mutex, keeps a change from
    /// opening a transaction in between: the committer would wait for redb's write lock
    /// behind a transaction that only a later commit, which waits for this one, would end.
    pub(crate) fn take_for_commit(
        &mut self,
        db: &Database,
    ) -> Result<(WriteTransaction, Arc<Attempt>), NamespaceError> {
        match self.open.take() {
            Some(open) => Ok((open.tables.into_txn(), open.attempt)),
            None => Ok((db.begin_write()?, Arc::default())),
        }
    }
}

/// Commits a batch's transaction (`Namespace::apply_batch_with`): with `fsync` when durable.
pub(crate) fn commit_batch(
    txn: WriteTransaction,
    durability: crate::batch::BatchDurability,
) -> Result<(), NamespaceError> {
    let durability = match durability {
        crate::batch::BatchDurability::Durable => Durability::Immediate,
        crate::batch::BatchDurability::Lazy => Durability::None,
    };
    commit(txn, &Attempt::default(), durability)
}

/// The group commit: commits the shared transaction with `fsync`, which makes it and
/// every earlier commit durable.
pub(crate) fn commit_durably(txn: WriteTransaction, attempt: &Attempt) -> Result<(), NamespaceError> {
    commit(txn, attempt, Durability::Immediate)
}

/// Commits `txn`; if the commit fails, its changes are lost and their attempt undone.
fn commit(
    mut txn: WriteTransaction,
    attempt: &Attempt,
    durability: Durability,
) -> Result<(), NamespaceError> {
    let committed = txn.set_durability(durability).map_err(NamespaceError::from).and_then(|()| {
        txn.commit()?;
        Ok(())
    });
    if committed.is_err() {
        attempt.mark_undone();
    }
    committed
}
