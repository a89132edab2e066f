//! Typed access to the redb tables inside one transaction.
//!
//! [`Source`] is what path resolution and listing need; both a read snapshot
//! ([`ReadTables`]) and a write transaction ([`WriteTables`]) provide it, so the same
//! resolution code serves queries and updates. Every record is decoded (and its checksum
//! checked) right after it is read, and encoded right before it is written.

use crate::entry::FileRecord;
use crate::error::NamespaceError;
use crate::ids::InodeIds;
use crate::record::Inode;
use crate::schema::{
    CHAINS, CHAIN_TARGETS, COUNTERS, DIRENTS, DIR_PARENTS, DIR_PARENTS_BY_SEQ, INODES, INODES_BY_SEQ,
    INODE_SEQ_KEY, NO_OVERLAP, ORPHANS, PENDING_DELETES, ROOT_ID, TARGETS, TARGET_OWNERS,
};
use crate::touched::{note, Touched};
use redb::{
    AccessGuard, Key, ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata, StorageError,
    Table, TableDefinition, Value, WriteTransaction,
};
use std::borrow::Borrow;
use std::ops::{Bound, Deref};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Sequence numbers skipped (reserved ids, ids of legacy inodes) before a create gives up:
/// two sequence numbers in 2^64 have reserved ids, and a legacy id is met with probability
/// (legacy inodes) / 2^64 per number, so one skip is already rare.
const SEQ_SKIPS_MAX: usize = 64;

/// Read access shared by snapshots and write transactions.
pub(crate) trait Source {
    fn inode(&self, id: u64) -> Result<Option<Inode>, NamespaceError>;
    fn child(&self, parent: u64, name: &[u8]) -> Result<Option<u64>, NamespaceError>;
    /// The parent of directory `dir` (`None` for the root).
    fn dir_parent(&self, dir: u64) -> Result<Option<u64>, NamespaceError>;
    /// Up to `max` entries of `parent` in name order, after `after` when given.
    fn children(
        &self,
        parent: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, u64)>, NamespaceError>;

    /// An inode that a directory entry or the root refers to, so it must exist.
    fn load(&self, id: u64) -> Result<Inode, NamespaceError> {
        self.inode(id)?
            .ok_or_else(|| NamespaceError::corrupt(format!("inode {id:016x} is referenced but missing")))
    }
}

/// The row of inode `id` in a table keyed by sequence number (`by_seq`) or, for databases
/// migrated from version 2, in its legacy twin keyed by id. An id that decrypts to a
/// sequence number with no row is simply not found.
fn read_by_id<'t, V: redb::Value + 'static>(
    by_seq: &'t impl ReadableTable<u64, V>,
    legacy: &'t impl ReadableTable<u64, V>,
    ids: &InodeIds,
    id: u64,
) -> Result<Option<redb::AccessGuard<'t, V>>, NamespaceError> {
    if let Some(seq) = ids.seq_of(id) {
        if let Some(guard) = by_seq.get(seq)? {
            return Ok(Some(guard));
        }
    }
    match ids.legacy {
        true => Ok(legacy.get(id)?),
        false => Ok(None),
    }
}

/// The inode with id `id` (`inodes_by_seq`, else the legacy `inodes`).
fn read_inode(
    by_seq: &impl ReadableTable<u64, &'static [u8]>,
    legacy: &impl ReadableTable<u64, &'static [u8]>,
    ids: &InodeIds,
    id: u64,
) -> Result<Option<Inode>, NamespaceError> {
    read_by_id(by_seq, legacy, ids, id)?.map(|guard| Inode::decode(guard.value())).transpose()
}

/// The parent of directory `dir`, looked up the same way as its inode.
fn read_dir_parent(
    by_seq: &impl ReadableTable<u64, u64>,
    legacy: &impl ReadableTable<u64, u64>,
    ids: &InodeIds,
    dir: u64,
) -> Result<Option<u64>, NamespaceError> {
    Ok(read_by_id(by_seq, legacy, ids, dir)?.map(|guard| guard.value()))
}

fn read_child(
    table: &impl ReadableTable<(u64, &'static [u8]), u64>,
    parent: u64,
    name: &[u8],
) -> Result<Option<u64>, NamespaceError> {
    Ok(table.get((parent, name))?.map(|guard| guard.value()))
}

fn read_children(
    table: &impl ReadableTable<(u64, &'static [u8]), u64>,
    parent: u64,
    after: Option<&[u8]>,
    max: usize,
) -> Result<Vec<(Vec<u8>, u64)>, NamespaceError> {
    let start = match after {
        Some(name) => Bound::Excluded((parent, name)),
        None => Bound::Included((parent, &[][..])),
    };
    let mut out = Vec::new();
    for item in table.range::<(u64, &[u8])>((start, Bound::Unbounded))? {
        let (key, value) = item?;
        let (key_parent, name) = key.value();
        if key_parent != parent || out.len() >= max {
            break;
        }
        out.push((name.to_vec(), value.value()));
    }
    Ok(out)
}

/// The tables of a read snapshot.
pub(crate) struct ReadTables<'a> {
    ids: &'a InodeIds,
    pub(crate) inodes: ReadOnlyTable<u64, &'static [u8]>,
    pub(crate) legacy_inodes: ReadOnlyTable<u64, &'static [u8]>,
    pub(crate) dirents: ReadOnlyTable<(u64, &'static [u8]), u64>,
    dir_parents: ReadOnlyTable<u64, u64>,
    legacy_dir_parents: ReadOnlyTable<u64, u64>,
    pub(crate) pending: ReadOnlyTable<(u64, u64, u32), ()>,
    pub(crate) targets: ReadOnlyTable<u64, &'static [u8]>,
}

impl<'a> ReadTables<'a> {
    pub(crate) fn open(txn: &ReadTransaction, ids: &'a InodeIds) -> Result<Self, NamespaceError> {
        Ok(Self {
            ids,
            inodes: txn.open_table(INODES_BY_SEQ)?,
            legacy_inodes: txn.open_table(INODES)?,
            dirents: txn.open_table(DIRENTS)?,
            dir_parents: txn.open_table(DIR_PARENTS_BY_SEQ)?,
            legacy_dir_parents: txn.open_table(DIR_PARENTS)?,
            pending: txn.open_table(PENDING_DELETES)?,
            targets: txn.open_table(TARGETS)?,
        })
    }

    /// How many inodes there are, in both inode tables.
    pub(crate) fn inode_count(&self) -> Result<u64, NamespaceError> {
        Ok(self.inodes.len()? + self.legacy_inodes.len()?)
    }

    /// The public id of the inode stored under sequence number `seq`.
    pub(crate) fn id_of(&self, seq: u64) -> u64 {
        self.ids.id_of(seq)
    }
}

impl Source for ReadTables<'_> {
    fn inode(&self, id: u64) -> Result<Option<Inode>, NamespaceError> {
        read_inode(&self.inodes, &self.legacy_inodes, self.ids, id)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<Option<u64>, NamespaceError> {
        read_child(&self.dirents, parent, name)
    }

    fn dir_parent(&self, dir: u64) -> Result<Option<u64>, NamespaceError> {
        read_dir_parent(&self.dir_parents, &self.legacy_dir_parents, self.ids, dir)
    }

    fn children(
        &self,
        parent: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, u64)>, NamespaceError> {
        read_children(&self.dirents, parent, after, max)
    }
}

/// Where an existing inode's rows are (its record, and its `dir_parents` row if it is a
/// directory other than the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Under this sequence number in `inodes_by_seq` and `dir_parents_by_seq`.
    Seq(u64),
    /// Under its id in the legacy `inodes` and `dir_parents`.
    Legacy(u64),
}

/// A table of a write transaction that records whether anything was written to it, so a
/// change that fails before writing does not undo the changes sharing its transaction
/// (`shared_txn.rs`). Reads go through `Deref`; writes only through its own methods (there
/// is no `DerefMut`), so no write escapes the record.
pub(crate) struct Tracked<'txn, K: Key + 'static, V: Value + 'static> {
    table: Table<'txn, K, V>,
    wrote: Arc<AtomicBool>,
}

impl<'txn, K: Key + 'static, V: Value + 'static> Tracked<'txn, K, V> {
    fn open(
        txn: &'txn WriteTransaction,
        definition: TableDefinition<K, V>,
        wrote: &Arc<AtomicBool>,
    ) -> Result<Self, NamespaceError> {
        Ok(Tracked { table: txn.open_table(definition)?, wrote: Arc::clone(wrote) })
    }

    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        self.wrote.store(true, Ordering::Relaxed);
        self.table.insert(key, value)
    }

    pub(crate) fn remove<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        self.wrote.store(true, Ordering::Relaxed);
        self.table.remove(key)
    }
}

impl<'txn, K: Key + 'static, V: Value + 'static> Deref for Tracked<'txn, K, V> {
    type Target = Table<'txn, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

/// The tables of one write transaction.
pub(crate) struct WriteTables<'txn> {
    ids: &'txn InodeIds,
    wrote: Arc<AtomicBool>,
    pub(crate) inodes: Tracked<'txn, u64, &'static [u8]>,
    pub(crate) legacy_inodes: Tracked<'txn, u64, &'static [u8]>,
    pub(crate) dirents: Tracked<'txn, (u64, &'static [u8]), u64>,
    dir_parents: Tracked<'txn, u64, u64>,
    legacy_dir_parents: Tracked<'txn, u64, u64>,
    pub(crate) pending: Tracked<'txn, (u64, u64, u32), ()>,
    pub(crate) targets: Tracked<'txn, u64, &'static [u8]>,
    pub(crate) counters: Tracked<'txn, &'static str, u64>,
    pub(crate) orphans: Tracked<'txn, u64, ()>,
    pub(crate) owners: Tracked<'txn, u64, &'static [u8]>,
    pub(crate) no_overlap: Tracked<'txn, u64, ()>,
    pub(crate) chains: Tracked<'txn, u32, &'static [u8]>,
    pub(crate) chain_targets: Tracked<'txn, u64, &'static [u8]>,
}

impl<'txn> WriteTables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction, ids: &'txn InodeIds) -> Result<Self, NamespaceError> {
        let wrote = Arc::new(AtomicBool::new(false));
        Ok(Self {
            ids,
            inodes: Tracked::open(txn, INODES_BY_SEQ, &wrote)?,
            legacy_inodes: Tracked::open(txn, INODES, &wrote)?,
            dirents: Tracked::open(txn, DIRENTS, &wrote)?,
            dir_parents: Tracked::open(txn, DIR_PARENTS_BY_SEQ, &wrote)?,
            legacy_dir_parents: Tracked::open(txn, DIR_PARENTS, &wrote)?,
            pending: Tracked::open(txn, PENDING_DELETES, &wrote)?,
            targets: Tracked::open(txn, TARGETS, &wrote)?,
            counters: Tracked::open(txn, COUNTERS, &wrote)?,
            orphans: Tracked::open(txn, ORPHANS, &wrote)?,
            owners: Tracked::open(txn, TARGET_OWNERS, &wrote)?,
            no_overlap: Tracked::open(txn, NO_OVERLAP, &wrote)?,
            chains: Tracked::open(txn, CHAINS, &wrote)?,
            chain_targets: Tracked::open(txn, CHAIN_TARGETS, &wrote)?,
            wrote,
        })
    }

    /// Whether any table was written to since these tables were opened or
    /// [`forget_writes`](Self::forget_writes) was last called.
    pub(crate) fn wrote(&self) -> bool {
        self.wrote.load(Ordering::Relaxed)
    }

    /// Starts a new record of writes: the shared transaction keeps its tables open across
    /// changes and asks, per change, whether that change wrote.
    pub(crate) fn forget_writes(&self) {
        self.wrote.store(false, Ordering::Relaxed);
    }

    /// How many inodes there are, in both inode tables.
    pub(crate) fn inode_count(&self) -> Result<u64, NamespaceError> {
        Ok(self.inodes.len()? + self.legacy_inodes.len()?)
    }

    /// Where the rows of inode `id` are or would be: the legacy tables if its record is in
    /// the legacy table, else under its sequence number.
    fn slot(&self, id: u64) -> Result<Slot, NamespaceError> {
        if self.ids.legacy && self.legacy_inodes.get(id)?.is_some() {
            return Ok(Slot::Legacy(id));
        }
        match self.ids.seq_of(id) {
            Some(seq) => Ok(Slot::Seq(seq)),
            None => {
                Err(NamespaceError::corrupt(format!("inode {id:016x} is written but no inode has that id")))
            }
        }
    }

    pub(crate) fn put(&mut self, id: u64, inode: &Inode) -> Result<(), NamespaceError> {
        let encoded = inode.encode();
        let old = match self.slot(id)? {
            Slot::Seq(seq) => self.inodes.insert(seq, encoded.as_slice())?,
            Slot::Legacy(id) => self.legacy_inodes.insert(id, encoded.as_slice())?,
        };
        if crate::touched::is_recording() {
            note(Touched::Attr(id));
            if inode.is_directory() {
                // A directory's search permission is part of every path through it.
                let before = old.map(|old| Inode::decode(old.value())).transpose()?;
                let same = before.is_some_and(|b| {
                    (b.attrs.mode, b.attrs.uid, b.attrs.gid)
                        == (inode.attrs.mode, inode.attrs.uid, inode.attrs.gid)
                });
                if !same {
                    note(Touched::Names(id));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn remove_inode(&mut self, id: u64) -> Result<(), NamespaceError> {
        assert_ne!(id, ROOT_ID, "the root directory is never removed");
        note(Touched::Attr(id));
        note(Touched::Names(id));
        match self.slot(id)? {
            Slot::Seq(seq) => {
                self.inodes.remove(seq)?;
                self.dir_parents.remove(seq)?;
            }
            Slot::Legacy(id) => {
                self.legacy_inodes.remove(id)?;
                self.legacy_dir_parents.remove(id)?;
            }
        }
        Ok(())
    }

    pub(crate) fn insert_dirent(
        &mut self,
        parent: u64,
        name: &[u8],
        child: u64,
    ) -> Result<(), NamespaceError> {
        if self.dirents.insert((parent, name), child)?.is_some() {
            note(Touched::Names(parent));
        }
        Ok(())
    }

    pub(crate) fn remove_dirent(&mut self, parent: u64, name: &[u8]) -> Result<(), NamespaceError> {
        note(Touched::Names(parent));
        if self.dirents.remove((parent, name))?.is_none() {
            let name = String::from_utf8_lossy(name);
            return Err(NamespaceError::corrupt(format!("entry {name:?} of {parent:016x} vanished")));
        }
        Ok(())
    }

    /// Records that directory `dir` now lives in directory `parent`.
    pub(crate) fn set_dir_parent(&mut self, dir: u64, parent: u64) -> Result<(), NamespaceError> {
        match self.slot(dir)? {
            Slot::Seq(seq) => self.dir_parents.insert(seq, parent)?,
            Slot::Legacy(id) => self.legacy_dir_parents.insert(id, parent)?,
        };
        Ok(())
    }

    pub(crate) fn counter(&self, key: &str) -> Result<Option<u64>, NamespaceError> {
        Ok(self.counters.get(key)?.map(|guard| guard.value()))
    }

    pub(crate) fn set_counter(&mut self, key: &str, value: u64) -> Result<(), NamespaceError> {
        self.counters.insert(key, value)?;
        Ok(())
    }

    /// Queues every subfile of a file that lost its last link for deletion on its target;
    /// a replicated file's on every member its chain has now too (issue 32).
    pub(crate) fn queue_deletes(&mut self, file: &FileRecord) -> Result<(), NamespaceError> {
        for (index, target) in file.targets.iter().enumerate() {
            let subfile =
                u32::try_from(index).map_err(|_| NamespaceError::corrupt("subfile index overflow"))?;
            self.pending.insert((target.0, file.id.0, subfile), ())?;
            let Some(&chain) = file.chains.get(index) else { continue };
            let record = self.chains.get(chain)?.map(|value| value.value().to_vec());
            let Some(record) = record else { continue };
            let members = crate::chain_record::decode_chain(chain, &record)?;
            for member in members.members().iter().filter(|m| m.target != *target) {
                self.pending.insert((member.target.0, file.id.0, subfile), ())?;
            }
        }
        Ok(())
    }

    /// Writes `inode` under the next sequence number (the `inode_seq` counter, advanced in
    /// this transaction) and returns its id, the keyed permutation of the number. Numbers
    /// whose id is reserved (0, the root's) or belongs to an inode of the legacy table are
    /// skipped. The table is keyed by the number, so the insert goes to its last leaf. The
    /// insert reports what it displaced: a number already in use (the counter went back) is
    /// refused with `SequenceInUse` and the record it holds is put back.
    pub(crate) fn put_new(&mut self, inode: &Inode) -> Result<u64, NamespaceError> {
        let encoded = inode.encode();
        let mut seq = self
            .counter(INODE_SEQ_KEY)?
            .ok_or_else(|| NamespaceError::corrupt(format!("the {INODE_SEQ_KEY} counter is missing")))?;
        for _ in 0..SEQ_SKIPS_MAX {
            let id = self.ids.id_of(seq);
            let next = seq
                .checked_add(1)
                .ok_or_else(|| NamespaceError::Storage("inode sequence numbers are used up".into()))?;
            let legacy = self.ids.legacy && self.legacy_inodes.get(id)?.is_some();
            if !self.ids.usable(seq, id) || legacy {
                seq = next;
                continue;
            }
            let displaced = self.inodes.insert(seq, encoded.as_slice())?.map(|old| old.value().to_vec());
            if let Some(old) = displaced {
                self.inodes.insert(seq, old.as_slice())?;
                return Err(NamespaceError::SequenceInUse { seq });
            }
            self.set_counter(INODE_SEQ_KEY, next)?;
            return Ok(id);
        }
        Err(NamespaceError::Storage(format!("no usable inode sequence number in {SEQ_SKIPS_MAX} tries")))
    }
}

impl Source for WriteTables<'_> {
    fn inode(&self, id: u64) -> Result<Option<Inode>, NamespaceError> {
        read_inode(&*self.inodes, &*self.legacy_inodes, self.ids, id)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<Option<u64>, NamespaceError> {
        read_child(&*self.dirents, parent, name)
    }

    fn dir_parent(&self, dir: u64) -> Result<Option<u64>, NamespaceError> {
        read_dir_parent(&*self.dir_parents, &*self.legacy_dir_parents, self.ids, dir)
    }

    fn children(
        &self,
        parent: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, u64)>, NamespaceError> {
        read_children(&*self.dirents, parent, after, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Body;
    use flotilla_types::{Attributes, FileKind};
    use redb::backends::InMemoryBackend;
    use redb::Database;

    fn symlink(target: &str) -> Inode {
        let attrs = Attributes {
            kind: FileKind::Symlink,
            mode: 0o777,
            uid: 0,
            gid: 0,
            size_bytes: target.len() as u64,
            nlink: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            rdev: 0,
        };
        Inode { attrs, body: Body::Symlink { target: target.into() } }
    }

    fn open(db: &Database) -> redb::WriteTransaction {
        let txn = db.begin_write().unwrap();
        txn.open_table(COUNTERS).unwrap().insert(INODE_SEQ_KEY, 1).unwrap();
        txn
    }

    #[test]
    fn a_new_inode_takes_the_next_sequence_number() {
        let db = Database::builder().create_with_backend(InMemoryBackend::new()).unwrap();
        let ids = InodeIds::new(&[3; 16], false);
        let txn = open(&db);
        let mut tables = WriteTables::open(&txn, &ids).unwrap();
        let first = tables.put_new(&symlink("a")).unwrap();
        let second = tables.put_new(&symlink("b")).unwrap();
        assert_eq!((first, second), (ids.id_of(1), ids.id_of(2)));
        assert_eq!(tables.counter(INODE_SEQ_KEY).unwrap(), Some(3));
        assert!(tables.inodes.get(1).unwrap().is_some() && tables.inodes.get(2).unwrap().is_some());
        assert_eq!(tables.load(first).unwrap(), symlink("a"));
        assert_eq!(tables.load(second).unwrap(), symlink("b"));
        // Ids that decrypt to a number with no record, and the id 0, are not found.
        assert_eq!(tables.inode(ids.id_of(3)).unwrap(), None);
        assert_eq!(tables.inode(0).unwrap(), None);
        assert_eq!(tables.inode(ids.encrypt(0)).unwrap(), None);
        assert_eq!(tables.dir_parent(ids.id_of(3)).unwrap(), None);
    }

    #[test]
    fn reserved_ids_and_ids_of_legacy_inodes_are_skipped() {
        let db = Database::builder().create_with_backend(InMemoryBackend::new()).unwrap();
        let ids = InodeIds::new(&[5; 16], true);
        let txn = open(&db);
        let mut tables = WriteTables::open(&txn, &ids).unwrap();
        // The number whose id would be the root's is skipped.
        let reserved = ids.decrypt(ROOT_ID);
        tables.set_counter(INODE_SEQ_KEY, reserved).unwrap();
        let id = tables.put_new(&symlink("new")).unwrap();
        assert_eq!(id, ids.id_of(reserved + 1));
        assert!(tables.inodes.get(reserved).unwrap().is_none());
        // A legacy inode that happens to have the id of the next number keeps it.
        let taken = ids.id_of(7);
        tables.legacy_inodes.insert(taken, symlink("old").encode().as_slice()).unwrap();
        tables.set_counter(INODE_SEQ_KEY, 7).unwrap();
        let id = tables.put_new(&symlink("newer")).unwrap();
        assert_eq!(id, ids.id_of(8));
        assert_eq!(tables.load(taken).unwrap(), symlink("old"));
        // Writes to the legacy inode stay in the legacy table.
        tables.put(taken, &symlink("old2")).unwrap();
        assert!(tables.inodes.get(7).unwrap().is_none());
        assert_eq!(tables.load(taken).unwrap(), symlink("old2"));
        tables.remove_inode(taken).unwrap();
        assert_eq!(tables.inode(taken).unwrap(), None);
        assert_eq!(tables.load(id).unwrap(), symlink("newer"));
    }

    #[test]
    fn a_new_inode_never_displaces_one_in_use() {
        let db = Database::builder().create_with_backend(InMemoryBackend::new()).unwrap();
        let ids = InodeIds::new(&[9; 16], false);
        let txn = open(&db);
        let mut tables = WriteTables::open(&txn, &ids).unwrap();
        let id = tables.put_new(&symlink("old")).unwrap();
        // The counter goes back (a damaged database): the number in use is refused.
        tables.set_counter(INODE_SEQ_KEY, 1).unwrap();
        let refused = tables.put_new(&symlink("x"));
        assert_eq!(refused, Err(NamespaceError::SequenceInUse { seq: 1 }));
        assert_eq!(refused.unwrap_err().errno(), crate::error::EIO);
        assert_eq!(tables.load(id).unwrap(), symlink("old"), "the number in use kept its inode");
        assert_eq!(tables.counter(INODE_SEQ_KEY).unwrap(), Some(1));
    }
}
