//! Typed access to the redb tables inside one transaction.
//!
//! [`Source`] is what path resolution and listing need; both a read snapshot
//! ([`ReadTables`]) and a write transaction ([`WriteTables`]) provide it, so the same
//! resolution code serves queries and updates. Every record is decoded (and its checksum
//! checked) right after it is read, and encoded right before it is written.

use crate::entry::FileRecord;
use crate::error::NamespaceError;
use crate::record::Inode;
use crate::schema::{
    COUNTERS, DIRENTS, DIR_PARENTS, INODES, NO_OVERLAP, ORPHANS, PENDING_DELETES, ROOT_ID, TARGETS,
    TARGET_OWNERS,
};
use crate::touched::{note, Touched};
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, Table, WriteTransaction};
use std::ops::Bound;

/// Attempts to draw an unused random inode id before giving up.
const ID_DRAWS_MAX: usize = 16;

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

fn read_inode(
    table: &impl ReadableTable<u64, &'static [u8]>,
    id: u64,
) -> Result<Option<Inode>, NamespaceError> {
    match table.get(id)? {
        None => Ok(None),
        Some(guard) => Inode::decode(guard.value()).map(Some),
    }
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
pub(crate) struct ReadTables {
    pub(crate) inodes: ReadOnlyTable<u64, &'static [u8]>,
    pub(crate) dirents: ReadOnlyTable<(u64, &'static [u8]), u64>,
    pub(crate) dir_parents: ReadOnlyTable<u64, u64>,
    pub(crate) pending: ReadOnlyTable<(u64, u64, u32), ()>,
    pub(crate) targets: ReadOnlyTable<u64, &'static [u8]>,
}

impl ReadTables {
    pub(crate) fn open(txn: &ReadTransaction) -> Result<Self, NamespaceError> {
        Ok(Self {
            inodes: txn.open_table(INODES)?,
            dirents: txn.open_table(DIRENTS)?,
            dir_parents: txn.open_table(DIR_PARENTS)?,
            pending: txn.open_table(PENDING_DELETES)?,
            targets: txn.open_table(TARGETS)?,
        })
    }
}

impl Source for ReadTables {
    fn inode(&self, id: u64) -> Result<Option<Inode>, NamespaceError> {
        read_inode(&self.inodes, id)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<Option<u64>, NamespaceError> {
        read_child(&self.dirents, parent, name)
    }

    fn dir_parent(&self, dir: u64) -> Result<Option<u64>, NamespaceError> {
        Ok(self.dir_parents.get(dir)?.map(|guard| guard.value()))
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

/// The tables of one write transaction.
pub(crate) struct WriteTables<'txn> {
    pub(crate) inodes: Table<'txn, u64, &'static [u8]>,
    pub(crate) dirents: Table<'txn, (u64, &'static [u8]), u64>,
    pub(crate) dir_parents: Table<'txn, u64, u64>,
    pub(crate) pending: Table<'txn, (u64, u64, u32), ()>,
    pub(crate) targets: Table<'txn, u64, &'static [u8]>,
    pub(crate) counters: Table<'txn, &'static str, u64>,
    pub(crate) orphans: Table<'txn, u64, ()>,
    pub(crate) owners: Table<'txn, u64, &'static [u8]>,
    pub(crate) no_overlap: Table<'txn, u64, ()>,
}

impl<'txn> WriteTables<'txn> {
    pub(crate) fn open(txn: &'txn WriteTransaction) -> Result<Self, NamespaceError> {
        Ok(Self {
            inodes: txn.open_table(INODES)?,
            dirents: txn.open_table(DIRENTS)?,
            dir_parents: txn.open_table(DIR_PARENTS)?,
            pending: txn.open_table(PENDING_DELETES)?,
            targets: txn.open_table(TARGETS)?,
            counters: txn.open_table(COUNTERS)?,
            orphans: txn.open_table(ORPHANS)?,
            owners: txn.open_table(TARGET_OWNERS)?,
            no_overlap: txn.open_table(NO_OVERLAP)?,
        })
    }

    pub(crate) fn put(&mut self, id: u64, inode: &Inode) -> Result<(), NamespaceError> {
        let old = self.inodes.insert(id, inode.encode().as_slice())?;
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
        self.inodes.remove(id)?;
        self.dir_parents.remove(id)?;
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
        self.dir_parents.insert(dir, parent)?;
        Ok(())
    }

    pub(crate) fn counter(&self, key: &str) -> Result<Option<u64>, NamespaceError> {
        Ok(self.counters.get(key)?.map(|guard| guard.value()))
    }

    pub(crate) fn set_counter(&mut self, key: &str, value: u64) -> Result<(), NamespaceError> {
        self.counters.insert(key, value)?;
        Ok(())
    }

    /// Queues every subfile of a file that lost its last link for deletion on its target.
    pub(crate) fn queue_deletes(&mut self, file: &FileRecord) -> Result<(), NamespaceError> {
        for (index, target) in file.targets.iter().enumerate() {
            let index =
                u32::try_from(index).map_err(|_| NamespaceError::corrupt("subfile index overflow"))?;
            self.pending.insert((target.0, file.id.0, index), ())?;
        }
        Ok(())
    }

    /// Writes `inode` under a random id that is nonzero, not the root's and not in use, and
    /// returns the id. One B-tree walk per draw: the insert itself finds whether the id was
    /// taken (then the record it displaced is put back and another id drawn), so a create
    /// does not walk to a random leaf twice.
    pub(crate) fn put_new(&mut self, inode: &Inode) -> Result<u64, NamespaceError> {
        self.put_new_drawn(inode, rand::random)
    }

    fn put_new_drawn(&mut self, inode: &Inode, mut draw: impl FnMut() -> u64) -> Result<u64, NamespaceError> {
        let encoded = inode.encode();
        for _ in 0..ID_DRAWS_MAX {
            let id = draw();
            if id <= ROOT_ID {
                continue;
            }
            let displaced = self.inodes.insert(id, encoded.as_slice())?.map(|old| old.value().to_vec());
            match displaced {
                None => return Ok(id),
                Some(old) => {
                    self.inodes.insert(id, old.as_slice())?;
                }
            }
        }
        Err(NamespaceError::Storage(format!("no unused inode id in {ID_DRAWS_MAX} random draws")))
    }
}

impl Source for WriteTables<'_> {
    fn inode(&self, id: u64) -> Result<Option<Inode>, NamespaceError> {
        read_inode(&self.inodes, id)
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<Option<u64>, NamespaceError> {
        read_child(&self.dirents, parent, name)
    }

    fn dir_parent(&self, dir: u64) -> Result<Option<u64>, NamespaceError> {
        Ok(self.dir_parents.get(dir)?.map(|guard| guard.value()))
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

    #[test]
    fn a_new_inode_never_displaces_one_in_use() {
        let db = Database::builder().create_with_backend(InMemoryBackend::new()).unwrap();
        let txn = db.begin_write().unwrap();
        let mut tables = WriteTables::open(&txn).unwrap();
        tables.put(5, &symlink("old")).unwrap();
        // The draws: the root's id, an id in use, then a free one.
        let mut draws = [ROOT_ID, 5, 9].into_iter();
        let id = tables.put_new_drawn(&symlink("new"), || draws.next().unwrap_or(0)).unwrap();
        assert_eq!(id, 9);
        assert_eq!(tables.load(5).unwrap(), symlink("old"), "the id in use kept its inode");
        assert_eq!(tables.load(9).unwrap(), symlink("new"));
        let mut taken = std::iter::repeat(5);
        let refused = tables.put_new_drawn(&symlink("x"), || taken.next().unwrap_or(5));
        assert!(matches!(refused, Err(NamespaceError::Storage(_))), "{refused:?}");
        assert_eq!(tables.load(5).unwrap(), symlink("old"));
    }
}
