//! Primitive edits of the tree, shared by the mutating operations, that keep the link
//! invariants:
//! - a directory's `nlink` is 2 plus its number of subdirectories, its `size_bytes` is its
//!   number of entries, and its `mtime`/`ctime` move when an entry is added or removed;
//! - a file's or symlink's `nlink` is the number of directory entries naming it; when it
//!   reaches 0 the inode is removed and, for a file, one `pending_deletes` row per subfile is
//!   written in the same transaction.
//!
//! Counts read from disk are adjusted with checked arithmetic; an underflow means the
//! database is corrupt and is reported as such.

use crate::entry::FileRecord;
use crate::error::NamespaceError;
use crate::record::{Inode, SUBFILE_COUNT_MAX};
use crate::request::{Owner, MODE_MAX};
use crate::tables::{Source, WriteTables};
use crate::walk::Located;
use flotilla_types::{Layout, TimeNs};

/// Most directory entries that may name one file or symlink.
pub const NLINK_MAX: u32 = 65_000;

/// Whether a directory gains or loses an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Added,
    Removed,
}

/// Writes a new inode under a new id and names it at `place` (whose name must be free);
/// returns the id.
pub(crate) fn insert_new(
    tables: &mut WriteTables<'_>,
    place: &Located<'_>,
    inode: &Inode,
    now_ns: TimeNs,
) -> Result<u64, NamespaceError> {
    debug_assert!(place.child.is_none());
    let id = tables.put_new(inode)?;
    tables.insert_dirent(place.parent, place.name, id)?;
    if inode.is_directory() {
        tables.set_dir_parent(id, place.parent)?;
    }
    adjust_dir(tables, place.parent, Change::Added, inode.is_directory(), now_ns)?;
    Ok(id)
}

/// Updates a directory after one of its entries was added or removed.
pub(crate) fn adjust_dir(
    tables: &mut WriteTables<'_>,
    dir: u64,
    change: Change,
    subdirectory: bool,
    now_ns: TimeNs,
) -> Result<(), NamespaceError> {
    let mut inode = tables.load(dir)?;
    if !inode.is_directory() {
        return Err(NamespaceError::corrupt(format!("parent {dir:016x} is not a directory")));
    }
    let step: i32 = if change == Change::Added { 1 } else { -1 };
    let attrs = &mut inode.attrs;
    attrs.size_bytes = attrs
        .size_bytes
        .checked_add_signed(i64::from(step))
        .ok_or_else(|| NamespaceError::corrupt(format!("entry count of {dir:016x} out of range")))?;
    if subdirectory {
        attrs.nlink = attrs
            .nlink
            .checked_add_signed(step)
            .filter(|nlink| *nlink >= 2)
            .ok_or_else(|| NamespaceError::corrupt(format!("nlink of {dir:016x} out of range")))?;
    }
    attrs.mtime_ns = now_ns;
    attrs.ctime_ns = now_ns;
    tables.put(dir, &inode)
}

/// Whether some client still has a file open (asked when its last name goes away).
pub type IsOpen<'a> = &'a dyn Fn(u64) -> bool;

/// Drops one link of a file or symlink; returns the file record if that was the last link.
/// A file that lost its last link while `is_open` says a client has it open becomes an
/// orphan instead: its inode stays (nlink 0) and nothing is deleted until it is released.
pub(crate) fn drop_link(
    tables: &mut WriteTables<'_>,
    id: u64,
    mut inode: Inode,
    is_open: IsOpen<'_>,
    now_ns: TimeNs,
) -> Result<Option<FileRecord>, NamespaceError> {
    debug_assert!(!inode.is_directory());
    let nlink = inode
        .attrs
        .nlink
        .checked_sub(1)
        .ok_or_else(|| NamespaceError::corrupt(format!("nlink of {id:016x} is already 0")))?;
    if nlink > 0 {
        inode.attrs.nlink = nlink;
        inode.attrs.ctime_ns = now_ns;
        tables.put(id, &inode)?;
        return Ok(None);
    }
    if inode.file_record(id).is_some() && is_open(id) {
        inode.attrs.nlink = 0;
        inode.attrs.ctime_ns = now_ns;
        tables.put(id, &inode)?;
        tables.orphans.insert(id, ())?;
        return Ok(None);
    }
    tables.remove_inode(id)?;
    let record = inode.file_record(id);
    if let Some(file) = &record {
        tables.queue_deletes(file)?;
    }
    Ok(record)
}

/// Refuses a name that is already taken.
pub(crate) fn refuse_taken(place: &Located<'_>, path: &str) -> Result<(), NamespaceError> {
    match place.child {
        Some(_) => Err(NamespaceError::AlreadyExists { path: path.into() }),
        None => Ok(()),
    }
}

/// Refuses a directory that still has entries.
pub(crate) fn refuse_non_empty(tables: &impl Source, dir: u64, path: &str) -> Result<(), NamespaceError> {
    if tables.children(dir, None, 1)?.is_empty() {
        Ok(())
    } else {
        Err(NamespaceError::NotEmpty { path: path.into() })
    }
}

pub(crate) fn check_owner(owner: &Owner) -> Result<(), NamespaceError> {
    check_mode(owner.mode)
}

pub(crate) fn check_mode(mode: u32) -> Result<(), NamespaceError> {
    if mode > MODE_MAX {
        return Err(NamespaceError::invalid(format!("mode {mode:#o} is over {MODE_MAX:#o}")));
    }
    Ok(())
}

pub(crate) fn check_layout(layout: &Layout) -> Result<(), NamespaceError> {
    layout.validate().map_err(|e| NamespaceError::invalid(e.to_string()))
}

pub(crate) fn check_subfile_count(count: u32) -> Result<(), NamespaceError> {
    if !(1..=SUBFILE_COUNT_MAX).contains(&count) {
        return Err(NamespaceError::invalid(format!(
            "subfile count {count} is outside 1..={SUBFILE_COUNT_MAX}"
        )));
    }
    Ok(())
}
