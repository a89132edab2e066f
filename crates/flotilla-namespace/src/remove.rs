//! The operations that remove names: `unlink`, `rmdir` and `rename` (which may replace an
//! existing entry).

use crate::edit::{adjust_dir, drop_link, refuse_non_empty, Change, IsOpen};
use crate::entry::FileRecord;
use crate::error::NamespaceError;
use crate::guard::may_remove;
use crate::namespace::Namespace;
use crate::tables::{Source, WriteTables};
use crate::walk::{is_within, locate_place, Located, Place};
use flotilla_types::{Caller, TimeNs};
use redb::ReadableTable;

/// Orphans: files whose last name went away while a client had them open.
impl Namespace {
    /// Releases orphan `id` once no client has it open: its inode goes and its subfiles are
    /// queued for deletion, in one transaction. `false` if `id` is not an orphan (already
    /// released, or never was one).
    pub fn release_orphan(&self, id: u64) -> Result<bool, NamespaceError> {
        self.write(|tables| {
            if tables.orphans.remove(id)?.is_none() {
                return Ok(false);
            }
            let inode = tables.load(id)?;
            tables.remove_inode(id)?;
            if let Some(file) = inode.file_record(id) {
                tables.queue_deletes(&file)?;
            }
            Ok(true)
        })
    }

    /// Every orphan's id, at most `max`.
    pub fn orphans(&self, max: usize) -> Result<Vec<u64>, NamespaceError> {
        self.write(|tables| {
            let mut ids = Vec::new();
            for item in tables.orphans.iter()?.take(max) {
                ids.push(item?.0.value());
            }
            Ok(ids)
        })
    }
}

impl Namespace {
    /// Removes the name of a file or symlink. Returns the file record when the file lost its
    /// last link; its subfiles are then queued in `pending_deletes` in the same transaction.
    pub fn unlink(&self, path: &str, now_ns: TimeNs) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(&Caller::root(), Place::Path(path), None, &|_| false, now_ns)
    }

    /// `unlink` for `who` (write and search on the parent; the sticky rule).
    pub fn unlink_as(
        &self,
        who: &Caller,
        path: &str,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(who, Place::Path(path), None, &|_| false, now_ns)
    }

    /// `unlink` that keeps a file some client still has open (`is_open`) as an orphan.
    pub fn unlink_keeping_open(
        &self,
        path: &str,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(&Caller::root(), Place::Path(path), None, is_open, now_ns)
    }

    /// `unlink_keeping_open` for `who`.
    pub fn unlink_keeping_open_as(
        &self,
        who: &Caller,
        path: &str,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(who, Place::Path(path), None, is_open, now_ns)
    }

    /// `unlink_keeping_open_as` at a path or in a directory named by id; with
    /// `expected_id`, only if the name names that entry (`NotFound` otherwise).
    pub fn unlink_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        expected_id: Option<u64>,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(who, at, expected_id, is_open, now_ns)
    }

    /// Removes the name `path` only if it names entry `expected_id` (the undo of a failed
    /// create); `NotFound` if it names something else, so no other file is ever removed.
    pub fn unlink_id(
        &self,
        path: &str,
        expected_id: u64,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_id_as(&Caller::root(), path, expected_id, now_ns)
    }

    /// `unlink_id` for `who`, under the rules of an unlink (write and search on the parent,
    /// the sticky rule).
    pub fn unlink_id_as(
        &self,
        who: &Caller,
        path: &str,
        expected_id: u64,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.unlink_checked(who, Place::Path(path), Some(expected_id), &|_| false, now_ns)
    }

    fn unlink_checked(
        &self,
        who: &Caller,
        at: Place<'_>,
        expected_id: Option<u64>,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        let path = &at.describe();
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
            let id = place.child.ok_or_else(|| not_found(path))?;
            if expected_id.is_some_and(|expected| expected != id) {
                return Err(not_found(path));
            }
            may_remove(tables, &place, id, who, path)?;
            let inode = tables.load(id)?;
            if inode.is_directory() {
                return Err(NamespaceError::IsADirectory { path: path.into() });
            }
            tables.remove_dirent(place.parent, place.name)?;
            adjust_dir(tables, place.parent, Change::Removed, false, now_ns)?;
            drop_link(tables, id, inode, is_open, now_ns)
        })
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str, now_ns: TimeNs) -> Result<(), NamespaceError> {
        self.rmdir_as(&Caller::root(), path, now_ns)
    }

    /// `rmdir` for `who` (write and search on the parent; the sticky rule).
    pub fn rmdir_as(&self, who: &Caller, path: &str, now_ns: TimeNs) -> Result<(), NamespaceError> {
        self.rmdir_in(who, Place::Path(path), now_ns)
    }

    /// `rmdir_as` at a path or in a directory named by id.
    pub fn rmdir_in(&self, who: &Caller, at: Place<'_>, now_ns: TimeNs) -> Result<(), NamespaceError> {
        let path = &at.describe();
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
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
        self.rename_with(
            &Caller::root(),
            Place::Path(from),
            Place::Path(to),
            Replace::Allowed(&|_| false),
            now_ns,
        )
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
        self.rename_with(who, Place::Path(from), Place::Path(to), Replace::Allowed(&|_| false), now_ns)
    }

    /// `rename` that keeps a replaced file some client still has open (`is_open`) as an orphan.
    pub fn rename_keeping_open(
        &self,
        from: &str,
        to: &str,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.rename_with(
            &Caller::root(),
            Place::Path(from),
            Place::Path(to),
            Replace::Allowed(is_open),
            now_ns,
        )
    }

    /// `rename_keeping_open` for `who`.
    pub fn rename_keeping_open_as(
        &self,
        who: &Caller,
        from: &str,
        to: &str,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.rename_with(who, Place::Path(from), Place::Path(to), Replace::Allowed(is_open), now_ns)
    }

    /// `rename` that never replaces: `AlreadyExists` if `to` names anything, decided in the
    /// same transaction as the move (`RENAME_NOREPLACE`).
    pub fn rename_no_replace(&self, from: &str, to: &str, now_ns: TimeNs) -> Result<(), NamespaceError> {
        self.rename_no_replace_as(&Caller::root(), from, to, now_ns)
    }

    /// `rename_no_replace` for `who`.
    pub fn rename_no_replace_as(
        &self,
        who: &Caller,
        from: &str,
        to: &str,
        now_ns: TimeNs,
    ) -> Result<(), NamespaceError> {
        self.rename_with(who, Place::Path(from), Place::Path(to), Replace::Refused, now_ns).map(|_| ())
    }

    /// `rename_keeping_open_as` between places given by path or by directory id.
    pub fn rename_in(
        &self,
        who: &Caller,
        from: Place<'_>,
        to: Place<'_>,
        is_open: IsOpen<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        self.rename_with(who, from, to, Replace::Allowed(is_open), now_ns)
    }

    /// `rename_no_replace_as` between places given by path or by directory id.
    pub fn rename_no_replace_in(
        &self,
        who: &Caller,
        from: Place<'_>,
        to: Place<'_>,
        now_ns: TimeNs,
    ) -> Result<(), NamespaceError> {
        self.rename_with(who, from, to, Replace::Refused, now_ns).map(|_| ())
    }

    /// `RENAME_EXCHANGE`: swaps the entries `first` and `second` name, atomically; both must
    /// exist, and neither may be a directory moved into its own subtree.
    pub fn exchange_in(
        &self,
        who: &Caller,
        first: Place<'_>,
        second: Place<'_>,
        now_ns: TimeNs,
    ) -> Result<(), NamespaceError> {
        let (first_name, second_name) = (first.describe(), second.describe());
        self.write(|tables| {
            let a = locate_place(tables, first, who)?;
            let b = locate_place(tables, second, who)?;
            let a_id = a.child.ok_or_else(|| not_found(&first_name))?;
            let b_id = b.child.ok_or_else(|| not_found(&second_name))?;
            may_remove(tables, &a, a_id, who, &first_name)?;
            may_remove(tables, &b, b_id, who, &second_name)?;
            if a_id == b_id {
                return Ok(());
            }
            exchange(tables, (&a, a_id), (&b, b_id), now_ns)
        })
    }

    fn rename_with(
        &self,
        who: &Caller,
        from_place: Place<'_>,
        to_place: Place<'_>,
        replace_mode: Replace<'_>,
        now_ns: TimeNs,
    ) -> Result<Option<FileRecord>, NamespaceError> {
        let (from, to) = (&from_place.describe(), &to_place.describe());
        self.write(|tables| {
            let source = locate_place(tables, from_place, who)?;
            let moved = source.child.ok_or_else(|| not_found(from))?;
            may_remove(tables, &source, moved, who, from)?;
            let dest = locate_place(tables, to_place, who)?;
            let is_open = match replace_mode {
                Replace::Allowed(is_open) => is_open,
                Replace::Refused if dest.child.is_some() => {
                    return Err(NamespaceError::AlreadyExists { path: to.into() })
                }
                Replace::Refused => &|_| false,
            };
            match dest.child {
                Some(old) => may_remove(tables, &dest, old, who, to)?,
                None => crate::guard::may_add(tables, &dest, who, to)?,
            }
            if dest.child == Some(moved) {
                return Ok(None);
            }
            let mut inode = tables.load(moved)?;
            let is_dir = inode.is_directory();
            if is_dir && is_within(tables, dest.parent, moved)? {
                return Err(NamespaceError::invalid(format!(
                    "cannot move {from} into its own subtree ({to})"
                )));
            }
            let replaced = match dest.child {
                Some(old) => replace(tables, &dest, old, is_dir, to, is_open, now_ns)?,
                None => None,
            };
            tables.remove_dirent(source.parent, source.name)?;
            adjust_dir(tables, source.parent, Change::Removed, is_dir, now_ns)?;
            tables.insert_dirent(dest.parent, dest.name, moved)?;
            adjust_dir(tables, dest.parent, Change::Added, is_dir, now_ns)?;
            if is_dir {
                tables.set_dir_parent(moved, dest.parent)?;
            }
            inode.attrs.ctime_ns = now_ns;
            tables.put(moved, &inode)?;
            Ok(replaced)
        })
    }
}

/// Whether a rename may replace what its destination names.
enum Replace<'a> {
    /// It may; a replaced file still open somewhere becomes an orphan.
    Allowed(IsOpen<'a>),
    /// `RENAME_NOREPLACE`.
    Refused,
}

fn not_found(path: &str) -> NamespaceError {
    NamespaceError::NotFound { path: path.into() }
}

/// Swaps two entries (distinct inodes) between their names.
fn exchange(
    tables: &mut WriteTables<'_>,
    (a, a_id): (&Located<'_>, u64),
    (b, b_id): (&Located<'_>, u64),
    now_ns: TimeNs,
) -> Result<(), NamespaceError> {
    let (mut a_inode, mut b_inode) = (tables.load(a_id)?, tables.load(b_id)?);
    let (a_dir, b_dir) = (a_inode.is_directory(), b_inode.is_directory());
    if (a_dir && is_within(tables, b.parent, a_id)?) || (b_dir && is_within(tables, a.parent, b_id)?) {
        return Err(NamespaceError::invalid("cannot exchange a directory with an entry of its own subtree"));
    }
    tables.insert_dirent(a.parent, a.name, b_id)?;
    tables.insert_dirent(b.parent, b.name, a_id)?;
    if a_dir {
        tables.set_dir_parent(a_id, b.parent)?;
    }
    if b_dir {
        tables.set_dir_parent(b_id, a.parent)?;
    }
    // Each parent loses one entry and gains one: only its subdirectory count may change.
    touch_exchanged(tables, a.parent, a_dir, b_dir, now_ns)?;
    if b.parent != a.parent {
        touch_exchanged(tables, b.parent, b_dir, a_dir, now_ns)?;
    }
    a_inode.attrs.ctime_ns = now_ns;
    b_inode.attrs.ctime_ns = now_ns;
    tables.put(a_id, &a_inode)?;
    tables.put(b_id, &b_inode)
}

/// A directory whose entry `lost` (a subdirectory or not) was swapped for `gained`.
fn touch_exchanged(
    tables: &mut WriteTables<'_>,
    dir: u64,
    lost_subdir: bool,
    gained_subdir: bool,
    now_ns: TimeNs,
) -> Result<(), NamespaceError> {
    let mut inode = tables.load(dir)?;
    let step = i32::from(gained_subdir) - i32::from(lost_subdir);
    inode.attrs.nlink = inode
        .attrs
        .nlink
        .checked_add_signed(step)
        .filter(|nlink| *nlink >= 2)
        .ok_or_else(|| NamespaceError::corrupt(format!("nlink of {dir:016x} out of range")))?;
    inode.attrs.mtime_ns = now_ns;
    inode.attrs.ctime_ns = now_ns;
    tables.put(dir, &inode)
}

/// Removes the entry `old` that a rename is about to overwrite.
fn replace(
    tables: &mut WriteTables<'_>,
    dest: &Located<'_>,
    old: u64,
    moving_dir: bool,
    to: &str,
    is_open: IsOpen<'_>,
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
            drop_link(tables, old, old_inode, is_open, now_ns)
        }
    }
}
