//! The operations that remove names: `unlink`, `rmdir` and `rename` (which may replace an
//! existing entry).

use crate::edit::{adjust_dir, drop_link, refuse_non_empty, Change};
use crate::entry::FileRecord;
use crate::error::NamespaceError;
use crate::guard::may_remove;
use crate::namespace::Namespace;
use crate::tables::{Source, WriteTables};
use crate::walk::{locate, Located};
use flotilla_types::{Caller, TimeNs};

impl Namespace {
    /// Removes the name of a file or symlink. Returns the file record when the file lost its
    /// last link; its subfiles are then queued in `pending_deletes` in the same transaction.
    pub fn unlink(&self, path: &str, now_ns: TimeNs) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_as(&Caller::root(), path, now_ns)
    }

    /// `unlink` for `who` (write and search on the parent; the sticky rule).
    pub fn unlink_as(
        &self,
        who: &Caller,
        path: &str,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.write(|tables| {
            let place = locate(tables, path, who)?;
            let id = place.child.ok_or_else(|| not_found(path))?;
            may_remove(tables, &place, id, who, path)?;
            let inode = tables.load(id)?;
            if inode.is_directory() {
                return Err(NamespaceError::IsADirectory { path: path.into() });
            }
            tables.remove_dirent(place.parent, place.name)?;
            adjust_dir(tables, place.parent, Change::Removed, false, now_ns)?;
            drop_link(tables, id, inode, now_ns)
        })
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str, now_ns: TimeNs) -> Result<(), NamespaceError> {
        self.rmdir_as(&Caller::root(), path, now_ns)
    }

    /// `rmdir` for `who` (write and search on the parent; the sticky rule).
    pub fn rmdir_as(&self, who: &Caller, path: &str, now_ns: TimeNs) -> Result<(), NamespaceError> {
        self.write(|tables| {
            let place = locate(tables, path, who)?;
            let id = place.child.ok_or_else(|| not_found(path))?;
            may_remove(tables, &place, id, who, path)?;
            if !tables.load(id)?.is_directory() {
                return Err(NamespaceError::NotADirectory { path: path.into() });
            }
            refuse_non_empty(tables, id, path)?;
            tables.remove_dirent(place.parent, place.name)?;
            tables.remove_inode(id)?;
            adjust_dir(tables, place.parent, Change::Removed, true, now_ns)
        })
    }

    /// Moves `from` to `to` atomically, replacing what `to` names: a file or symlink by a
    /// file or symlink, an empty directory by a directory. A directory is never moved into
    /// its own subtree. If `from` and `to` already name the same inode nothing changes.
    /// Returns the record of a replaced file that lost its last link.
    pub fn rename(&self, from: &str, to: &str, now_ns: TimeNs) -> Result<Option<FileRecord>, NamespaceError> {
        self.rename_as(&Caller::root(), from, to, now_ns)
    }

    /// `rename` for `who`: removing `from` and, if taken, `to` as `unlink` would, and adding
    /// `to` as a create would.
    pub fn rename_as(
        &self,
        who: &Caller,
        from: &str,
        to: &str,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.write(|tables| {
            let source = locate(tables, from, who)?;
            let moved = source.child.ok_or_else(|| not_found(from))?;
            may_remove(tables, &source, moved, who, from)?;
            let dest = locate(tables, to, who)?;
            match dest.child {
                Some(old) => may_remove(tables, &dest, old, who, to)?,
                None => crate::guard::may_add(tables, &dest, who, to)?,
            }
            if dest.child == Some(moved) {
                return Ok(None);
            }
            let mut inode = tables.load(moved)?;
            let is_dir = inode.is_directory();
            if is_dir && dest.chain.contains(&moved) {
                return Err(NamespaceError::invalid(format!(
                    "cannot move {from} into its own subtree ({to})"
                )));
            }
            let replaced = match dest.child {
                Some(old) => replace(tables, &dest, old, is_dir, to, now_ns)?,
                None => None,
            };
            tables.remove_dirent(source.parent, source.name)?;
            adjust_dir(tables, source.parent, Change::Removed, is_dir, now_ns)?;
            tables.insert_dirent(dest.parent, dest.name, moved)?;
            adjust_dir(tables, dest.parent, Change::Added, is_dir, now_ns)?;
            inode.attrs.ctime_ns = now_ns;
            tables.put(moved, &inode)?;
            Ok(replaced)
        })
    }
}

fn not_found(path: &str) -> NamespaceError {
    NamespaceError::NotFound { path: path.into() }
}

/// Removes the entry `old` that a rename is about to overwrite.
fn replace(
    tables: &mut WriteTables<'_>,
    dest: &Located<'_>,
    old: u64,
    moving_dir: bool,
    to: &str,
    now_ns: TimeNs,
) -> Result<Option<FileRecord>, NamespaceError> {
    let old_inode = tables.load(old)?;
    match (moving_dir, old_inode.is_directory()) {
        (true, false) => Err(NamespaceError::NotADirectory { path: to.into() }),
        (false, true) => Err(NamespaceError::IsADirectory { path: to.into() }),
        (true, true) => {
            refuse_non_empty(tables, old, to)?;
            tables.remove_dirent(dest.parent, dest.name)?;
            tables.remove_inode(old)?;
            adjust_dir(tables, dest.parent, Change::Removed, true, now_ns)?;
            Ok(None)
        }
        (false, false) => {
            tables.remove_dirent(dest.parent, dest.name)?;
            adjust_dir(tables, dest.parent, Change::Removed, false, now_ns)?;
            drop_link(tables, old, old_inode, now_ns)
        }
    }
}
