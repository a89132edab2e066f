//! The whole namespace as plain rows ([`NamespaceImage`]): read from one read transaction,
//! written into a new database file that then replaces the namespace's. A replicated state
//! machine snapshots and installs the namespace with it; a new group's first state (its
//! *genesis*: the id key and the root, decided by the proposer) is an image too.
//!
//! Values are the tables' records as stored (each keeps its own version and checksum, and is
//! checked when the namespace reads it); the caller frames and checksums the image as a
//! whole. Rows are in key order, so equal namespaces give equal images.
//!
//! Invariant: an image is written only into a new, empty database, with the caller's own
//! records in the same transaction; the file replaces the namespace's by a rename, so a
//! crash leaves either the old namespace or the new one, whole.

use crate::error::NamespaceError;
use crate::ids::{InodeIds, ID_KEY_BYTES, ROOT_SEQ};
use crate::namespace::{new_attrs, Namespace};
use crate::record::{Body, Inode};
use crate::schema::{
    CHAINS, CHAIN_TARGETS, COUNTERS, DIRENTS, DIR_PARENTS, DIR_PARENTS_BY_SEQ, ID_KEY_NAME, INODES,
    INODES_BY_SEQ, INODE_SEQ_KEY, KEYS, NO_OVERLAP, ORPHANS, PENDING_DELETES, SCHEMA_VERSION,
    SCHEMA_VERSION_KEY, TARGETS, TARGET_OWNERS,
};
use flotilla_types::{FileKind, TimeNs};
use redb::{Database, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Every table of the namespace (schema version 3), row by row, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceImage {
    pub inodes_by_seq: Vec<(u64, Vec<u8>)>,
    pub legacy_inodes: Vec<(u64, Vec<u8>)>,
    pub dir_parents_by_seq: Vec<(u64, u64)>,
    pub legacy_dir_parents: Vec<(u64, u64)>,
    pub keys: Vec<(String, Vec<u8>)>,
    pub entries: Vec<((u64, Vec<u8>), u64)>,
    pub pending_deletes: Vec<(u64, u64, u32)>,
    pub targets: Vec<(u64, Vec<u8>)>,
    pub orphans: Vec<u64>,
    pub target_owners: Vec<(u64, Vec<u8>)>,
    pub counters: Vec<(String, u64)>,
    pub no_overlap: Vec<u64>,
    /// The chain table of replication (issue 32), records as stored.
    pub chains: Vec<(u32, Vec<u8>)>,
    pub chain_targets: Vec<(u64, Vec<u8>)>,
}

/// Rows of a `u64 → bytes` table.
fn bytes_rows(
    txn: &ReadTransaction,
    def: TableDefinition<u64, &[u8]>,
) -> Result<Vec<(u64, Vec<u8>)>, NamespaceError> {
    let mut rows = Vec::new();
    for item in txn.open_table(def)?.iter()? {
        let (key, value) = item?;
        rows.push((key.value(), value.value().to_vec()));
    }
    Ok(rows)
}

fn id_rows(txn: &ReadTransaction, def: TableDefinition<u64, u64>) -> Result<Vec<(u64, u64)>, NamespaceError> {
    let mut rows = Vec::new();
    for item in txn.open_table(def)?.iter()? {
        let (key, value) = item?;
        rows.push((key.value(), value.value()));
    }
    Ok(rows)
}

fn set_rows(txn: &ReadTransaction, def: TableDefinition<u64, ()>) -> Result<Vec<u64>, NamespaceError> {
    let mut rows = Vec::new();
    for item in txn.open_table(def)?.iter()? {
        rows.push(item?.0.value());
    }
    Ok(rows)
}

impl NamespaceImage {
    /// Reads every table in `txn` (one consistent snapshot; a namespace's open creates
    /// every table, so none is missing).
    pub fn read(txn: &ReadTransaction) -> Result<Self, NamespaceError> {
        let mut keys = Vec::new();
        for item in txn.open_table(KEYS)?.iter()? {
            let (key, value) = item?;
            keys.push((key.value().to_string(), value.value().to_vec()));
        }
        let mut entries = Vec::new();
        for item in txn.open_table(DIRENTS)?.iter()? {
            let (key, value) = item?;
            let (parent, name) = key.value();
            entries.push(((parent, name.to_vec()), value.value()));
        }
        let mut pending_deletes = Vec::new();
        for item in txn.open_table(PENDING_DELETES)?.iter()? {
            pending_deletes.push(item?.0.value());
        }
        let mut counters = Vec::new();
        for item in txn.open_table(COUNTERS)?.iter()? {
            let (key, value) = item?;
            counters.push((key.value().to_string(), value.value()));
        }
        Ok(NamespaceImage {
            inodes_by_seq: bytes_rows(txn, INODES_BY_SEQ)?,
            legacy_inodes: bytes_rows(txn, INODES)?,
            dir_parents_by_seq: id_rows(txn, DIR_PARENTS_BY_SEQ)?,
            legacy_dir_parents: id_rows(txn, DIR_PARENTS)?,
            keys,
            entries,
            pending_deletes,
            targets: bytes_rows(txn, TARGETS)?,
            orphans: set_rows(txn, ORPHANS)?,
            target_owners: bytes_rows(txn, TARGET_OWNERS)?,
            counters,
            no_overlap: set_rows(txn, NO_OVERLAP)?,
            chains: {
                let mut rows = Vec::new();
                for item in txn.open_table(CHAINS)?.iter()? {
                    let (key, value) = item?;
                    rows.push((key.value(), value.value().to_vec()));
                }
                rows
            },
            chain_targets: bytes_rows(txn, CHAIN_TARGETS)?,
        })
    }

    /// The image of a new namespace: only the root directory (owned by root, mode 0755,
    /// every time `root_time_ns`) and the id key `id_key`. The same arguments give the
    /// same image, so every replica of a group starts alike.
    pub fn fresh(id_key: [u8; ID_KEY_BYTES], root_time_ns: TimeNs) -> Self {
        let owner = crate::Owner { mode: 0o755, uid: 0, gid: 0 };
        let root = Inode {
            attrs: new_attrs(FileKind::Directory, &owner, root_time_ns),
            body: Body::Directory { default_layout: None, default_replicas: 1 },
        };
        NamespaceImage {
            inodes_by_seq: vec![(ROOT_SEQ, root.encode())],
            keys: vec![(ID_KEY_NAME.to_string(), InodeIds::encode_key(&id_key))],
            counters: vec![(INODE_SEQ_KEY.to_string(), 1), (SCHEMA_VERSION_KEY.to_string(), SCHEMA_VERSION)],
            ..NamespaceImage::default()
        }
    }

    /// Rows in all tables.
    pub fn rows(&self) -> usize {
        self.inodes_by_seq.len()
            + self.chains.len()
            + self.chain_targets.len()
            + self.legacy_inodes.len()
            + self.dir_parents_by_seq.len()
            + self.legacy_dir_parents.len()
            + self.keys.len()
            + self.entries.len()
            + self.pending_deletes.len()
            + self.targets.len()
            + self.orphans.len()
            + self.target_owners.len()
            + self.counters.len()
            + self.no_overlap.len()
    }

    /// Refuses an image of another schema version or without its id key.
    fn check(&self) -> Result<(), NamespaceError> {
        let version = self.counters.iter().find(|(k, _)| k == SCHEMA_VERSION_KEY).map(|(_, v)| *v);
        if version != Some(SCHEMA_VERSION) {
            return Err(NamespaceError::UnsupportedFormat {
                found: version.unwrap_or(0),
                supported: SCHEMA_VERSION,
            });
        }
        match self.keys.iter().find(|(k, _)| k == ID_KEY_NAME) {
            Some((_, record)) => InodeIds::decode_key(record).map(|_| ()),
            None => Err(NamespaceError::corrupt("the image has no inode id key")),
        }
    }

    /// Writes every row into `txn`, whose tables must be empty.
    fn write(&self, txn: &WriteTransaction) -> Result<(), NamespaceError> {
        fn put_bytes(
            txn: &WriteTransaction,
            def: TableDefinition<u64, &[u8]>,
            rows: &[(u64, Vec<u8>)],
        ) -> Result<(), NamespaceError> {
            let mut table = txn.open_table(def)?;
            for (key, value) in rows {
                table.insert(*key, value.as_slice())?;
            }
            Ok(())
        }
        fn put_ids(
            txn: &WriteTransaction,
            def: TableDefinition<u64, u64>,
            rows: &[(u64, u64)],
        ) -> Result<(), NamespaceError> {
            let mut table = txn.open_table(def)?;
            for (key, value) in rows {
                table.insert(*key, *value)?;
            }
            Ok(())
        }
        fn put_set(
            txn: &WriteTransaction,
            def: TableDefinition<u64, ()>,
            rows: &[u64],
        ) -> Result<(), NamespaceError> {
            let mut table = txn.open_table(def)?;
            for key in rows {
                table.insert(*key, ())?;
            }
            Ok(())
        }
        put_bytes(txn, INODES_BY_SEQ, &self.inodes_by_seq)?;
        put_bytes(txn, INODES, &self.legacy_inodes)?;
        put_ids(txn, DIR_PARENTS_BY_SEQ, &self.dir_parents_by_seq)?;
        put_ids(txn, DIR_PARENTS, &self.legacy_dir_parents)?;
        {
            let mut table = txn.open_table(KEYS)?;
            for (key, value) in &self.keys {
                table.insert(key.as_str(), value.as_slice())?;
            }
            let mut table = txn.open_table(DIRENTS)?;
            for ((parent, name), child) in &self.entries {
                table.insert((*parent, name.as_slice()), *child)?;
            }
            let mut table = txn.open_table(PENDING_DELETES)?;
            for key in &self.pending_deletes {
                table.insert(*key, ())?;
            }
            let mut table = txn.open_table(COUNTERS)?;
            for (key, value) in &self.counters {
                table.insert(key.as_str(), *value)?;
            }
        }
        put_bytes(txn, TARGETS, &self.targets)?;
        put_set(txn, ORPHANS, &self.orphans)?;
        put_bytes(txn, TARGET_OWNERS, &self.target_owners)?;
        put_bytes(txn, CHAIN_TARGETS, &self.chain_targets)?;
        {
            let mut table = txn.open_table(CHAINS)?;
            for (key, value) in &self.chains {
                table.insert(*key, value.as_slice())?;
            }
        }
        put_set(txn, NO_OVERLAP, &self.no_overlap)
    }
}

impl Namespace {
    /// The image of the namespace as `txn` sees it (from [`Namespace::read_transaction`]).
    pub fn image_in(txn: &ReadTransaction) -> Result<NamespaceImage, NamespaceError> {
        NamespaceImage::read(txn)
    }

    /// Replaces the whole namespace with `image` plus the records `extra` writes, atomically:
    /// a new database file is written beside the namespace's (`<file>.installing`), synced,
    /// renamed over it, and opened. Consumes the namespace (its file must be closed for the
    /// rename); on an error the caller opens the file again, which holds either the old
    /// namespace or the new one, whole. Only for a namespace opened from a path.
    pub fn replace_with_image(
        self,
        image: &NamespaceImage,
        extra: impl FnOnce(&WriteTransaction) -> Result<(), NamespaceError>,
    ) -> Result<Namespace, NamespaceError> {
        image.check()?;
        let Some(path) = self.path.clone() else {
            return Err(NamespaceError::Storage("only a namespace kept in a file can be replaced".into()));
        };
        let installing = installing_path(&path);
        write_image_file(&installing, image, extra)?;
        drop(self);
        std::fs::rename(&installing, &path)
            .map_err(|e| io_error("rename the new namespace into place", &path, e))?;
        sync_parent(&path)?;
        Namespace::open(&path)
    }
}

/// Where a new namespace file is written before it replaces `path`.
fn installing_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".installing");
    path.with_file_name(name)
}

fn write_image_file(
    path: &Path,
    image: &NamespaceImage,
    extra: impl FnOnce(&WriteTransaction) -> Result<(), NamespaceError>,
) -> Result<(), NamespaceError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("remove an unfinished namespace file", path, e)),
    }
    let db = Database::create(path)?;
    let txn = db.begin_write()?;
    image.write(&txn)?;
    extra(&txn)?;
    txn.commit()?;
    drop(db);
    Ok(())
}

fn sync_parent(path: &Path) -> Result<(), NamespaceError> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir =
        std::fs::File::open(parent).map_err(|e| io_error("open the namespace's directory", parent, e))?;
    dir.sync_all().map_err(|e| io_error("sync the namespace's directory", parent, e))
}

fn io_error(what: &str, path: &Path, error: std::io::Error) -> NamespaceError {
    NamespaceError::Storage(format!("{what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Owner;

    const OWNER: Owner = Owner { mode: 0o755, uid: 0, gid: 0 };

    fn image(ns: &Namespace) -> NamespaceImage {
        ns.read_transaction(Namespace::image_in).unwrap()
    }

    /// A namespace replaced by another's image holds the same rows and works: its ids
    /// (the image's key) resolve, and new entries can be made.
    #[test]
    fn an_image_replaces_a_namespace_whole() {
        let dir = tempfile::tempdir().unwrap();
        let source = Namespace::open(&dir.path().join("a.redb")).unwrap();
        let made = source.mkdir("/d", OWNER, 5).unwrap();
        source.symlink("/d/s", "x", OWNER, 6).unwrap();
        let taken = image(&source);
        let target = Namespace::open(&dir.path().join("b.redb")).unwrap();
        target.mkdir("/other", OWNER, 1).unwrap();
        let target = target.replace_with_image(&taken, |_| Ok(())).unwrap();
        assert_eq!(image(&target), taken);
        assert_eq!(target.lookup("/d").unwrap().id, made.id);
        assert!(target.lookup("/other").is_err());
        target.mkdir("/d/e", OWNER, 7).unwrap();
    }

    /// Two fresh images from the same key and time are equal, and their namespaces make
    /// the same ids for the same creates.
    #[test]
    fn fresh_images_from_the_same_genesis_agree() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = NamespaceImage::fresh([3; ID_KEY_BYTES], 42);
        assert_eq!(fresh, NamespaceImage::fresh([3; ID_KEY_BYTES], 42));
        let mut ids = Vec::new();
        for name in ["a.redb", "b.redb"] {
            let ns = Namespace::open(&dir.path().join(name))
                .unwrap()
                .replace_with_image(&fresh, |_| Ok(()))
                .unwrap();
            ids.push(ns.mkdir("/x", OWNER, 9).unwrap().id);
            assert_eq!(ns.lookup("/").unwrap().attrs.atime_ns, 42);
        }
        assert_eq!(ids[0], ids[1]);
    }

    #[test]
    fn an_image_of_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = NamespaceImage::fresh([1; ID_KEY_BYTES], 0);
        bad.counters.retain(|(k, _)| k != SCHEMA_VERSION_KEY);
        let ns = Namespace::open(&dir.path().join("a.redb")).unwrap();
        assert!(matches!(
            ns.replace_with_image(&bad, |_| Ok(())),
            Err(NamespaceError::UnsupportedFormat { .. })
        ));
    }
}
