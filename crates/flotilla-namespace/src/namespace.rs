//! [`Namespace`]: the metadata service's directory tree, file records, placement cursor,
//! pending subfile deletions and known targets, kept in one redb database.
//!
//! Every mutating call is applied in the write transaction that concurrent changes share
//! (`shared_txn.rs`); a call that fails leaves the database as it was (its transaction is
//! aborted, and the other changes applied in it are applied again). The call then waits for
//! a group commit (`group.rs`): one durable commit of the shared transaction, so a call
//! returns only once its change is on disk, and many concurrent calls share one transaction
//! and one `fsync`. Calls are synchronous and may block on disk, so async callers run them on
//! a blocking thread. Writers are serialized; readers see consistent snapshots and never wait
//! for writers (a reader sees a change once its transaction commits, before its caller is
//! answered).

use crate::entry::{DirEntry, DirEntryPlus, Entry};
use crate::error::NamespaceError;
use crate::group::{Batch, CommitStats, Group, GroupCommit, Turn};
use crate::shared_txn::{self, Attempt, SharedTxn};
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// Inside `with_deferred_ack` on this thread: the batches whose durability is awaited
    /// at its end.
    static DEFERRED: RefCell<Option<Vec<Arc<Batch>>>> = const { RefCell::new(None) };
}
use crate::ids::{InodeIds, ROOT_SEQ};
use crate::record::{Body, Inode};
use crate::schema::{ROOT_ID, SCHEMA_VERSION, SCHEMA_VERSION_KEY};
use crate::tables::{ReadTables, Source, WriteTables};
use crate::walk::resolve;
use flotilla_types::{Attributes, Caller, FileKind, TimeNs};
use parking_lot::{Mutex, RwLock};
use redb::backends::InMemoryBackend;
use redb::{Database, ReadableDatabase, ReadableTableMetadata, StorageBackend};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Most entries one `readdir_page` call returns.
pub const READDIR_PAGE_ENTRIES_MAX: usize = 65_536;

/// The namespace database. `Send + Sync`; share it behind an `Arc`.
///
/// After a failed write (a full disk, an I/O error) redb refuses every later transaction,
/// so a namespace opened from a path reopens its database before the next call: once space
/// is freed the service recovers by itself, without a restart.
#[derive(Debug)]
pub struct Namespace {
    pub(crate) db: RwLock<Database>,
    /// Where the database lives, for reopening; `None` for other backends.
    pub(crate) path: Option<PathBuf>,
    /// A write failed in a way that may have left the database unusable.
    broken: AtomicBool,
    /// This open created the database.
    created: bool,
    /// Changes waiting for their durable commit.
    pub(crate) group: Group,
    /// The write transaction changes are applied in until the next commit.
    pub(crate) open_txn: Mutex<SharedTxn>,
    /// The id permutation's key (read at open; it never changes).
    pub(crate) ids: Arc<InodeIds>,
    /// Placement's memory of recent choices (`placement::Spread`).
    pub(crate) spread: Mutex<crate::placement::Spread>,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let stats = self.commit_stats();
        tracing::debug!(?stats, "namespace closed: group commit counts");
    }
}

impl Namespace {
    /// Opens the database at `path`, creating it and the root directory if it is new.
    /// Every page checksum is verified on open, so a damaged file is refused, not trusted.
    pub fn open(path: &Path) -> Result<Self, NamespaceError> {
        let db = Database::builder().set_check_integrity_on_open(true).create(path)?;
        Self::init(db, Some(path.to_path_buf()))
    }

    /// Opens a namespace kept in memory only (for tests and tools).
    pub fn open_in_memory() -> Result<Self, NamespaceError> {
        Self::open_with_backend(InMemoryBackend::new())
    }

    /// Opens a namespace on any redb storage backend, such as a fault-injecting one.
    pub fn open_with_backend(backend: impl StorageBackend) -> Result<Self, NamespaceError> {
        let db = Database::builder().set_check_integrity_on_open(true).create_with_backend(backend)?;
        Self::init(db, None)
    }

    fn init(db: Database, path: Option<PathBuf>) -> Result<Self, NamespaceError> {
        migrate_from_v1(&db)?;
        migrate_from_v2(&db)?;
        let (ids, created) = open_or_create(&db)?;
        Ok(Self {
            db: RwLock::new(db),
            path,
            broken: AtomicBool::new(false),
            created,
            group: Group::new(GroupCommit::default()),
            open_txn: Mutex::new(SharedTxn::default()),
            ids: Arc::new(ids),
            spread: Mutex::new(Default::default()),
        })
    }

    /// Whether this open created the database (so no client can have a file of it open).
    pub fn created(&self) -> bool {
        self.created
    }

    /// The group commit's counts since this namespace was opened.
    pub fn commit_stats(&self) -> CommitStats {
        self.group.counters.snapshot()
    }

    /// Sets the group commit bounds (batch size, delay); takes effect for the next change.
    pub fn set_group_commit(&self, settings: GroupCommit) {
        self.group.set(settings);
    }

    /// Runs `change` in the shared write transaction (`shared_txn.rs`); a change that fails
    /// is undone. Returns once a durable commit covers the change (inside
    /// [`Namespace::with_deferred_ack`]: once it is applied and visible). `change` may run
    /// more than once: if a later change in the same transaction fails, the transaction is
    /// undone and this change is applied again, alone; only the last run's value counts.
    pub(crate) fn write<R>(
        &self,
        mut change: impl FnMut(&mut WriteTables<'_>) -> Result<R, NamespaceError>,
    ) -> Result<R, NamespaceError> {
        if crate::batch::batched() {
            return self.write_batched(&mut change);
        }
        let deferred = DEFERRED.with(|list| list.borrow().is_some());
        // A deferred change must be visible when this call returns, and a change applied
        // again must not be undone a second time: both commit their transaction at once.
        let mut commit_now = deferred;
        loop {
            let (value, batch, attempt) = self.apply(&mut change, commit_now)?;
            if deferred {
                DEFERRED.with(|list| list.borrow_mut().as_mut().map(|l| l.push(batch.clone())));
                return Ok(value);
            }
            let durable = self.await_batch(&batch);
            if attempt.undone() {
                self.group.counters.add_reapplied();
                commit_now = true;
                continue;
            }
            return durable.map(|()| value);
        }
    }

    /// Applies `change` in the shared transaction and joins the open batch; with
    /// `commit_now`, commits the transaction (without `fsync`) before joining.
    fn apply<R>(
        &self,
        change: &mut impl FnMut(&mut WriteTables<'_>) -> Result<R, NamespaceError>,
        commit_now: bool,
    ) -> Result<(R, Arc<Batch>, Arc<Attempt>), NamespaceError> {
        self.reopen_if_broken()?;
        let applying = self.group.begin();
        let db = self.db.read();
        self.refuse_if_broken()?;
        let started = std::time::Instant::now();
        let outcome = {
            let mut open = self.open_txn.lock();
            open.apply(&db, &self.ids, &self.group.counters, change, commit_now)
        };
        self.group.counters.add_apply(started);
        self.note_failure(&outcome);
        let (value, attempt) = outcome?;
        Ok((value, applying.join(), attempt))
    }

    /// Waits until `batch` is durable (committing it, or a later one, when its turn comes).
    fn await_batch(&self, batch: &Batch) -> Result<(), NamespaceError> {
        loop {
            match self.group.turn(batch) {
                Turn::Done(result) => return result,
                Turn::Commit => self.commit_batch(),
            }
        }
    }

    /// Runs `body`; the changes it makes on this thread return as soon as they are applied
    /// (visible, not yet durable), and this call returns `body`'s value once every one of
    /// them is durable (or the first durability error). For a caller that must hold a lock
    /// of its own across a change (the service's open-file table across an unlink): the lock
    /// is then released before the `fsync`, not held across it, so changes keep batching.
    pub fn with_deferred_ack<R>(&self, body: impl FnOnce() -> R) -> Result<R, NamespaceError> {
        struct Restore(Option<Vec<Arc<Batch>>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                DEFERRED.with(|list| *list.borrow_mut() = self.0.take());
            }
        }
        if DEFERRED.with(|list| list.borrow().is_some()) {
            return Ok(body());
        }
        let restore = Restore(None);
        DEFERRED.with(|list| *list.borrow_mut() = Some(Vec::new()));
        let value = body();
        let batches = DEFERRED.with(|list| list.borrow_mut().take()).unwrap_or_default();
        drop(restore);
        for batch in &batches {
            self.await_batch(batch)?;
        }
        Ok(value)
    }

    /// The committer's work: one durable commit covering the open batch (it commits the
    /// shared transaction, which holds every change of the batch not yet committed).
    fn commit_batch(&self) {
        let db = self.db.read();
        let batch = self.group.take();
        let started = std::time::Instant::now();
        let outcome = match self.refuse_if_broken() {
            Ok(()) => {
                let taken = self.open_txn.lock().take_for_commit(&db);
                taken.and_then(|(txn, attempt)| shared_txn::commit_durably(txn, &attempt))
            }
            Err(error) => Err(error),
        };
        self.group.counters.add_commit(started);
        self.note_failure(&outcome);
        self.group.finish(&batch, &outcome);
    }

    pub(crate) fn note_failure<R>(&self, outcome: &Result<R, NamespaceError>) {
        if self.path.is_some() && outcome.as_ref().is_err_and(NamespaceError::breaks_database) {
            self.broken.store(true, Ordering::Release);
        }
    }

    /// With the database lock held: a database that broke (and may be a placeholder after a
    /// failed reopen) is never used.
    pub(crate) fn refuse_if_broken(&self) -> Result<(), NamespaceError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(NamespaceError::Storage(
                "namespace database is being reopened after a failed write".into(),
            ));
        }
        Ok(())
    }

    /// Reopens the database after a write failed, so a freed disk lets writes work again.
    /// The reopened database is the last committed state (redb's recovery).
    pub(crate) fn reopen_if_broken(&self) -> Result<(), NamespaceError> {
        if !self.broken.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(path) = &self.path else { return Ok(()) };
        let mut db = self.db.write();
        if !self.broken.load(Ordering::Acquire) {
            return Ok(());
        }
        // redb holds a lock on the file: the old handle must be closed before the new
        // open, so a placeholder in memory stands in for the moment between.
        // The shared transaction belongs to the old database: undo it (its changes are
        // applied again on the reopened one).
        self.open_txn.lock().undo();
        let placeholder = Database::builder().create_with_backend(InMemoryBackend::new())?;
        drop(std::mem::replace(&mut *db, placeholder));
        match Database::builder().set_check_integrity_on_open(true).create(path) {
            Ok(reopened) => {
                *db = reopened;
                // Changes committed to the old database but not yet durably are gone.
                self.group.fail_open("the namespace database was reopened before this change was durable");
                self.broken.store(false, Ordering::Release);
                tracing::info!(?path, "namespace database reopened after a failed write");
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Runs `query` on a consistent read snapshot.
    /// Runs `query` on a read transaction of its own (for tables that may not exist yet).
    pub(crate) fn read_txn<R>(
        &self,
        query: impl FnOnce(&redb::ReadTransaction) -> Result<R, NamespaceError>,
    ) -> Result<R, NamespaceError> {
        self.reopen_if_broken()?;
        let db = self.db.read();
        self.refuse_if_broken()?;
        let txn = db.begin_read()?;
        query(&txn)
    }

    pub(crate) fn read<R>(
        &self,
        query: impl FnOnce(&ReadTables<'_>) -> Result<R, NamespaceError>,
    ) -> Result<R, NamespaceError> {
        self.reopen_if_broken()?;
        let db = self.db.read();
        self.refuse_if_broken()?;
        let txn = db.begin_read()?;
        query(&ReadTables::open(&txn, &self.ids)?)
    }

    /// The entry at `path`; a symlink as the last component is returned, not followed.
    pub fn lookup(&self, path: &str) -> Result<Entry, NamespaceError> {
        self.lookup_as(&Caller::root(), path)
    }

    /// `lookup` for `who`, who needs search permission along the path.
    pub fn lookup_as(&self, who: &Caller, path: &str) -> Result<Entry, NamespaceError> {
        self.read(|tables| {
            let found = resolve(tables, path, false, who)?;
            Ok(found.inode.into_entry(found.id))
        })
    }

    /// The entry at `path`, following a symlink in the last component too.
    pub fn lookup_follow(&self, path: &str) -> Result<Entry, NamespaceError> {
        self.read(|tables| {
            let found = resolve(tables, path, true, &Caller::root())?;
            Ok(found.inode.into_entry(found.id))
        })
    }

    /// The entry named `name` in directory `parent` (no symlink followed); `who` needs
    /// search permission on `parent`.
    pub fn lookup_at(&self, who: &Caller, parent: u64, name: &[u8]) -> Result<Entry, NamespaceError> {
        self.read(|tables| {
            let at = crate::walk::Place::At { parent, name };
            let place = crate::walk::locate_place(tables, at, who)?;
            let id = place.child.ok_or_else(|| NamespaceError::NotFound { path: at.describe() })?;
            Ok(tables.load(id)?.into_entry(id))
        })
    }

    /// Whether directory `dir` is the directory at `subtree` or below it (a confined
    /// connection's id-addressed requests are checked with it). `false` for a `dir` that is
    /// not a directory or a `subtree` that does not exist.
    pub fn directory_within(&self, dir: u64, subtree: &str) -> Result<bool, NamespaceError> {
        self.read(|tables| {
            let top = match resolve(tables, subtree, true, &Caller::root()) {
                Ok(found) => found.id,
                Err(NamespaceError::NotFound { .. }) => return Ok(false),
                Err(other) => return Err(other),
            };
            match tables.inode(dir)? {
                Some(inode) if inode.is_directory() => crate::walk::is_within(tables, dir, top),
                _ => Ok(false),
            }
        })
    }

    /// How many inodes there are (directories, files, symlinks, special files, orphans).
    pub fn inode_count(&self) -> Result<u64, NamespaceError> {
        self.read(|tables| tables.inode_count())
    }

    /// The entry with inode id `id`.
    pub fn get(&self, id: u64) -> Result<Entry, NamespaceError> {
        self.read(|tables| {
            let inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            Ok(inode.into_entry(id))
        })
    }

    /// Every entry of the directory at `path` (symlinks followed), in name order.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, NamespaceError> {
        self.readdir_as(&Caller::root(), path)
    }

    /// `readdir` for `who`, who needs search permission along the path and read permission
    /// on the directory.
    pub fn readdir_as(&self, who: &Caller, path: &str) -> Result<Vec<DirEntry>, NamespaceError> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map(|entry: &DirEntry| entry.name.clone());
            let page = self.readdir_page_as(who, path, after.as_deref(), READDIR_PAGE_ENTRIES_MAX)?;
            let done = page.len() < READDIR_PAGE_ENTRIES_MAX;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// Up to `max` (capped at `READDIR_PAGE_ENTRIES_MAX`) entries of the directory at
    /// `path` whose names sort after `after`, in name order.
    pub fn readdir_page(
        &self,
        path: &str,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<DirEntry>, NamespaceError> {
        self.readdir_page_as(&Caller::root(), path, after, max)
    }

    /// `readdir_page` for `who`.
    pub fn readdir_page_as(
        &self,
        who: &Caller,
        path: &str,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<DirEntry>, NamespaceError> {
        self.read(|tables| {
            let dir = resolve(tables, path, true, who)?;
            list_page(tables, who, dir.id, dir.inode, path, after, max)
        })
    }

    /// `readdir_page_as` of the directory with inode id `id`; `who` needs read permission on
    /// it.
    pub fn readdir_page_id(
        &self,
        who: &Caller,
        id: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<DirEntry>, NamespaceError> {
        self.read(|tables| {
            let inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            list_page(tables, who, id, inode, &format!("inode {id:016x}"), after, max)
        })
    }
}

impl Namespace {
    /// `readdir_page_id` with each entry's attributes (readdirplus), from one read snapshot.
    pub fn readdir_plus_page_id(
        &self,
        who: &Caller,
        id: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<DirEntryPlus>, NamespaceError> {
        self.read(|tables| {
            let dir = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            let what = format!("inode {id:016x}");
            list_children(tables, who, (id, dir, &what), after, max, |name, id, attrs| DirEntryPlus {
                name,
                id,
                attrs,
            })
        })
    }
}

fn list_page(
    tables: &ReadTables<'_>,
    who: &Caller,
    id: u64,
    dir: Inode,
    what: &str,
    after: Option<&[u8]>,
    max: usize,
) -> Result<Vec<DirEntry>, NamespaceError> {
    list_children(tables, who, (id, dir, what), after, max, |name, id, attrs| DirEntry {
        name,
        id,
        kind: attrs.kind,
    })
}

/// One page of the directory (`id`, its inode, its name for errors) after the name `after`,
/// each child made into an entry by `entry` from its name, id and attributes; `who` needs
/// read permission on the directory.
fn list_children<T>(
    tables: &ReadTables<'_>,
    who: &Caller,
    (id, dir, what): (u64, Inode, &str),
    after: Option<&[u8]>,
    max: usize,
    entry: impl Fn(Vec<u8>, u64, Attributes) -> T,
) -> Result<Vec<T>, NamespaceError> {
    if !dir.is_directory() {
        return Err(NamespaceError::NotADirectory { path: what.into() });
    }
    crate::access::require(&dir.attrs, who, crate::access::READ, what)?;
    let children = tables.children(id, after, max.min(READDIR_PAGE_ENTRIES_MAX))?;
    children.into_iter().map(|(name, id)| Ok(entry(name, id, tables.load(id)?.attrs))).collect()
}

/// The schema version a write transaction finds (`None`: a new database).
fn schema_version(txn: &redb::WriteTransaction) -> Result<Option<u64>, NamespaceError> {
    use redb::ReadableTable;
    Ok(txn.open_table(crate::schema::COUNTERS)?.get(SCHEMA_VERSION_KEY)?.map(|guard| guard.value()))
}

/// A write transaction for migrating a database of schema version `from`, or `None` (the
/// transaction aborted) when the database has another version.
fn migration_from(db: &Database, from: u64) -> Result<Option<redb::WriteTransaction>, NamespaceError> {
    let txn = db.begin_write()?;
    if schema_version(&txn)? == Some(from) {
        return Ok(Some(txn));
    }
    txn.abort()?;
    Ok(None)
}

/// Schema 1 to 2, in one transaction (a crash during it leaves the version 1 database, which
/// the next open migrates again): the UTF-8 names of `dirents` move to the byte-keyed
/// `entries`, and `dir_parents` is filled from them. Does nothing to other versions.
fn migrate_from_v1(db: &Database) -> Result<(), NamespaceError> {
    use crate::schema::{COUNTERS, DIRENTS, DIRENTS_V1, DIR_PARENTS, INODES};
    use redb::ReadableTable;
    let Some(txn) = migration_from(db, 1)? else { return Ok(()) };
    {
        let old = txn.open_table(DIRENTS_V1)?;
        let mut entries = txn.open_table(DIRENTS)?;
        let mut parents = txn.open_table(DIR_PARENTS)?;
        let inodes = txn.open_table(INODES)?;
        for item in old.iter()? {
            let (key, child) = item?;
            let ((parent, name), child) = (key.value(), child.value());
            entries.insert((parent, name.as_bytes()), child)?;
            let record = inodes.get(child)?.ok_or_else(|| {
                NamespaceError::corrupt(format!("inode {child:016x} is referenced but missing"))
            })?;
            if Inode::decode(record.value())?.is_directory() {
                parents.insert(child, parent)?;
            }
        }
    }
    txn.delete_table(DIRENTS_V1)?;
    txn.open_table(COUNTERS)?.insert(SCHEMA_VERSION_KEY, 2)?;
    txn.commit()?;
    tracing::info!("namespace database migrated from schema version 1 to 2");
    Ok(())
}

/// Schema 2 to 3, in one transaction (a crash during it leaves the version 2 database): a
/// key for the id permutation is drawn and kept in `keys`, the `inode_seq` counter starts at
/// 1, and the root's record moves from the legacy `inodes` table to sequence number 0 of
/// `inodes_by_seq`. Every other inode stays in `inodes` under its random id, and its
/// directory's row in `dir_parents`: every existing id keeps working. Does nothing to other
/// versions.
fn migrate_from_v2(db: &Database) -> Result<(), NamespaceError> {
    use crate::schema::{COUNTERS, ID_KEY_NAME, INODES, INODES_BY_SEQ, INODE_SEQ_KEY, KEYS};
    let Some(txn) = migration_from(db, 2)? else { return Ok(()) };
    {
        let root = txn
            .open_table(INODES)?
            .remove(ROOT_ID)?
            .ok_or_else(|| NamespaceError::corrupt("the root directory is missing"))?
            .value()
            .to_vec();
        Inode::decode(&root)?;
        if txn.open_table(INODES_BY_SEQ)?.insert(ROOT_SEQ, root.as_slice())?.is_some() {
            return Err(NamespaceError::corrupt("a version 2 database has version 3 inodes"));
        }
        let key = InodeIds::draw_key()?;
        txn.open_table(KEYS)?.insert(ID_KEY_NAME, InodeIds::encode_key(&key).as_slice())?;
        let mut counters = txn.open_table(COUNTERS)?;
        counters.insert(INODE_SEQ_KEY, 1)?;
        counters.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
    }
    txn.commit()?;
    tracing::info!("namespace database migrated from schema version 2 to {SCHEMA_VERSION}");
    Ok(())
}

/// Reads the id key of a database of this version (creating any table it lacks), or creates
/// a new database (key, root directory, counters) in one transaction. Returns the ids and
/// whether it created the database.
fn open_or_create(db: &Database) -> Result<(InodeIds, bool), NamespaceError> {
    use crate::schema::{ID_KEY_NAME, INODES, KEYS};
    use redb::ReadableTable;
    let txn = db.begin_write()?;
    match schema_version(&txn)? {
        Some(SCHEMA_VERSION) => {
            let key = match txn.open_table(KEYS)?.get(ID_KEY_NAME)? {
                Some(record) => InodeIds::decode_key(record.value())?,
                None => return Err(NamespaceError::corrupt("the inode id key is missing")),
            };
            let legacy = !txn.open_table(INODES)?.is_empty()?;
            let ids = InodeIds::new(&key, legacy);
            // Creates the tables an older build did not know (read snapshots expect them).
            WriteTables::open(&txn, &ids)?;
            txn.commit()?;
            Ok((ids, false))
        }
        Some(found) => Err(NamespaceError::UnsupportedFormat { found, supported: SCHEMA_VERSION }),
        None => {
            let key = InodeIds::draw_key()?;
            let ids = InodeIds::new(&key, false);
            {
                let mut tables = WriteTables::open(&txn, &ids)?;
                create_root(&mut tables)?;
            }
            txn.open_table(KEYS)?.insert(ID_KEY_NAME, InodeIds::encode_key(&key).as_slice())?;
            txn.commit()?;
            Ok((ids, true))
        }
    }
}

pub(crate) fn not_found_id(id: u64) -> NamespaceError {
    NamespaceError::NotFound { path: format!("inode {id:016x}") }
}

/// Attributes of a new entry: nlink 1 (2 for a directory), size 0, all times `now_ns`.
pub(crate) fn new_attrs(kind: FileKind, owner: &crate::Owner, now_ns: TimeNs) -> Attributes {
    Attributes {
        kind,
        mode: owner.mode,
        uid: owner.uid,
        gid: owner.gid,
        size_bytes: 0,
        nlink: if kind == FileKind::Directory { 2 } else { 1 },
        atime_ns: now_ns,
        mtime_ns: now_ns,
        ctime_ns: now_ns,
        rdev: 0,
    }
}

fn create_root(tables: &mut WriteTables<'_>) -> Result<(), NamespaceError> {
    if tables.inode_count()? != 0 || tables.dirents.len()? != 0 {
        return Err(NamespaceError::corrupt("entries exist but no schema version"));
    }
    let owner = crate::Owner { mode: 0o755, uid: 0, gid: 0 };
    let root = Inode {
        attrs: new_attrs(FileKind::Directory, &owner, wall_clock_ns()),
        body: Body::Directory { default_layout: None, default_replicas: 1 },
    };
    tables.put(ROOT_ID, &root)?;
    tables.set_counter(crate::schema::INODE_SEQ_KEY, 1)?;
    tables.set_counter(SCHEMA_VERSION_KEY, SCHEMA_VERSION)
}

fn wall_clock_ns() -> TimeNs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| TimeNs::try_from(since.as_nanos()).unwrap_or(TimeNs::MAX))
}

#[cfg(test)]
mod shared_txn_tests {
    use super::*;
    use crate::schema::COUNTERS;

    fn counter(namespace: &Namespace, name: &str) -> Option<u64> {
        let db = namespace.db.read();
        let txn = db.begin_read().unwrap();
        txn.open_table(COUNTERS).unwrap().get(name).unwrap().map(|guard| guard.value())
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Outcome {
        Applied,
        RefusedBeforeWriting,
        FailedAfterWriting,
    }

    fn apply(
        namespace: &Namespace,
        name: &'static str,
        outcome: Outcome,
    ) -> Result<Arc<Attempt>, NamespaceError> {
        let db = namespace.db.read();
        let refusal = || NamespaceError::NotEmpty { path: name.to_string() };
        let mut change = |tables: &mut WriteTables<'_>| {
            if outcome == Outcome::RefusedBeforeWriting {
                return Err(refusal());
            }
            tables.counters.insert(name, 7)?;
            if outcome == Outcome::FailedAfterWriting {
                return Err(refusal());
            }
            Ok(())
        };
        let counters = &namespace.group.counters;
        let outcome = namespace.open_txn.lock().apply(&db, &namespace.ids, counters, &mut change, false);
        outcome.map(|((), attempt)| attempt)
    }

    #[test]
    fn changes_share_one_transaction_until_the_durable_commit() {
        let namespace = Namespace::open_in_memory().unwrap();
        let first = apply(&namespace, "first", Outcome::Applied).unwrap();
        assert!(apply(&namespace, "refused", Outcome::RefusedBeforeWriting).is_err());
        let second = apply(&namespace, "second", Outcome::Applied).unwrap();
        assert!(Arc::ptr_eq(&first, &second), "both changes are in one transaction");
        assert_eq!(counter(&namespace, "first"), None, "nothing is visible before the commit");
        let (txn, attempt) = namespace.open_txn.lock().take_for_commit(&namespace.db.read()).unwrap();
        shared_txn::commit_durably(txn, &attempt).unwrap();
        assert_eq!((counter(&namespace, "first"), counter(&namespace, "second")), (Some(7), Some(7)));
        assert!(!first.undone(), "a refusal that wrote nothing leaves its neighbours alone");
    }

    #[test]
    fn a_failing_change_undoes_the_transaction_and_marks_its_changes_for_reapplying() {
        let namespace = Namespace::open_in_memory().unwrap();
        let applied = apply(&namespace, "applied", Outcome::Applied).unwrap();
        assert!(apply(&namespace, "failing", Outcome::FailedAfterWriting).is_err());
        assert!(applied.undone(), "the change before the failure must be applied again");
        let later = apply(&namespace, "later", Outcome::Applied).unwrap();
        assert!(!Arc::ptr_eq(&applied, &later) && !later.undone(), "a fresh transaction");
        let (txn, attempt) = namespace.open_txn.lock().take_for_commit(&namespace.db.read()).unwrap();
        shared_txn::commit_durably(txn, &attempt).unwrap();
        assert_eq!(counter(&namespace, "failing"), None, "a failed change leaves nothing");
        assert_eq!(counter(&namespace, "applied"), None, "the undone change is not committed");
        assert_eq!(counter(&namespace, "later"), Some(7));
    }

    /// The shared transaction's tables stay open across changes: a later change reads what
    /// an earlier one wrote through them, and a failure after writing still undoes every
    /// change, so the next transaction's tables (opened afresh) see none of them.
    #[test]
    fn tables_kept_open_across_changes_still_undo_a_failed_attempt() {
        use redb::ReadableTable;
        let namespace = Namespace::open_in_memory().unwrap();
        let read = |name: &'static str| {
            let db = namespace.db.read();
            let mut change = |tables: &mut WriteTables<'_>| -> Result<Option<u64>, NamespaceError> {
                Ok(tables.counters.get(name)?.map(|guard| guard.value()))
            };
            let counters = &namespace.group.counters;
            namespace.open_txn.lock().apply(&db, &namespace.ids, counters, &mut change, false).unwrap()
        };
        let first = apply(&namespace, "first", Outcome::Applied).unwrap();
        let (seen, attempt) = read("first");
        assert_eq!(seen, Some(7), "the second change sees the first one's write");
        assert!(Arc::ptr_eq(&first, &attempt));
        assert!(apply(&namespace, "refused", Outcome::RefusedBeforeWriting).is_err());
        assert!(!first.undone(), "the refusal wrote nothing in this change");
        assert!(apply(&namespace, "failing", Outcome::FailedAfterWriting).is_err());
        assert!(first.undone());
        let (seen, fresh) = read("first");
        assert_eq!(seen, None, "the undone write is gone from the new transaction's tables");
        assert!(!Arc::ptr_eq(&first, &fresh));
        assert_eq!(read("failing").0, None);
        let (txn, attempt) = namespace.open_txn.lock().take_for_commit(&namespace.db.read()).unwrap();
        shared_txn::commit_durably(txn, &attempt).unwrap();
        assert_eq!((counter(&namespace, "first"), counter(&namespace, "failing")), (None, None));
    }

    #[test]
    fn a_change_undone_by_a_later_failure_is_applied_again_and_kept() {
        let namespace = Namespace::open_in_memory().unwrap();
        namespace.set_group_commit(GroupCommit {
            batch_ops_max: 8,
            batch_delay_us_max: 60_000_000,
            batch_linger_us_max: 0,
        });
        let runs = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let namespace = &namespace;
            let runs = &runs;
            let kept = scope.spawn(move || {
                namespace.write(|tables| {
                    tables.counters.insert("kept", 1)?;
                    // The first run holds the transaction until the failing change has
                    // begun, so the failure lands in the same transaction.
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        while namespace.group.applying() < 2 {
                            std::thread::yield_now();
                        }
                    }
                    Ok(())
                })
            });
            while runs.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            let failed = namespace.write(|tables| {
                tables.counters.insert("failed", 1)?;
                Err::<(), _>(NamespaceError::NotEmpty { path: "failed".into() })
            });
            assert!(failed.is_err());
            kept.join().expect("the kept change's thread").expect("the kept change");
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2, "applied, undone, applied again");
        assert_eq!(namespace.commit_stats().reapplied, 1);
        assert_eq!((counter(&namespace, "kept"), counter(&namespace, "failed")), (Some(1), None));
    }
}
