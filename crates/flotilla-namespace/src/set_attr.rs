//! `set_attr`: chmod, chown, truncate and utimes on one inode.

use crate::edit::check_mode;
use crate::entry::Entry;
use crate::error::NamespaceError;
use crate::namespace::{not_found_id, Namespace};
use crate::record::{Body, Inode};
use crate::request::SetAttr;
use crate::tables::Source;
use flotilla_types::{Attributes, Caller, FileKind, TimeNs};

impl Namespace {
    /// Applies `change` to inode `id` and sets its `ctime` to `now_ns` (and its `mtime`
    /// too when the size changes and no `mtime` is given). Returns the new attributes.
    pub fn set_attr(&self, id: u64, change: &SetAttr, now_ns: TimeNs) -> Result<Attributes, NamespaceError> {
        self.set_attr_as(&Caller::root(), id, change, now_ns)
    }

    /// `set_attr` for `who`, under the POSIX rules of [`crate::access::checked_set_attr`]
    /// (which may also clear setuid/setgid).
    pub fn set_attr_as(
        &self,
        who: &Caller,
        id: u64,
        change: &SetAttr,
        now_ns: TimeNs,
    ) -> Result<Attributes, NamespaceError> {
        if let Some(mode) = change.mode {
            check_mode(mode)?;
        }
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            let change = crate::access::checked_set_attr(&inode.attrs, who, change, now_ns)?;
            apply(&mut inode, id, &change, now_ns)?;
            tables.put(id, &inode)?;
            Ok(inode.attrs)
        })
    }
}

impl Namespace {
    /// Sets the atime of inode `id` as a read does: nothing else changes (not the ctime).
    pub fn touch_atime(&self, id: u64, atime_ns: TimeNs) -> Result<Attributes, NamespaceError> {
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            inode.attrs.atime_ns = atime_ns;
            tables.put(id, &inode)?;
            Ok(inode.attrs)
        })
    }

    /// Raises a file's size to at least `size_bytes` (never lowers it) and sets its mtime:
    /// what a writer reports on close or fsync, so that two writers of disjoint ranges
    /// closing in either order leave the larger size.
    pub fn grow_size(
        &self,
        id: u64,
        size_bytes: u64,
        mtime_ns: TimeNs,
        now_ns: TimeNs,
    ) -> Result<Attributes, NamespaceError> {
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            if inode.attrs.kind != FileKind::File {
                return Err(NamespaceError::invalid(format!("inode {id:016x} is not a regular file")));
            }
            inode.attrs.size_bytes = inode.attrs.size_bytes.max(size_bytes);
            inode.attrs.mtime_ns = inode.attrs.mtime_ns.max(mtime_ns);
            inode.attrs.ctime_ns = now_ns;
            tables.put(id, &inode)?;
            Ok(inode.attrs)
        })
    }

    /// Changes the layout of an empty file (a file holding data keeps its layout: its bytes
    /// are where the old layout put them).
    pub fn set_file_layout(
        &self,
        id: u64,
        layout: flotilla_types::Layout,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        crate::edit::check_layout(&layout)?;
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            let size = inode.attrs.size_bytes;
            let Body::File { layout: current, .. } = &mut inode.body else {
                return Err(NamespaceError::invalid(format!("inode {id:016x} is not a regular file")));
            };
            if size > 0 && *current != layout {
                return Err(NamespaceError::invalid("cannot change the layout of a file that holds data"));
            }
            *current = layout;
            inode.attrs.ctime_ns = now_ns;
            tables.put(id, &inode)?;
            Ok(inode.into_entry(id))
        })
    }
}

fn apply(inode: &mut Inode, id: u64, change: &SetAttr, now_ns: TimeNs) -> Result<(), NamespaceError> {
    let attrs = &mut inode.attrs;
    if let Some(size_bytes) = change.size_bytes {
        match attrs.kind {
            FileKind::File => {}
            FileKind::Directory => {
                return Err(NamespaceError::IsADirectory { path: format!("inode {id:016x}") })
            }
            FileKind::Symlink => return Err(NamespaceError::invalid("cannot set the size of a symlink")),
            _ => return Err(NamespaceError::invalid("cannot set the size of a FIFO, socket or device")),
        }
        attrs.size_bytes = size_bytes;
        attrs.mtime_ns = now_ns;
    }
    attrs.mode = change.mode.unwrap_or(attrs.mode);
    attrs.uid = change.uid.unwrap_or(attrs.uid);
    attrs.gid = change.gid.unwrap_or(attrs.gid);
    attrs.atime_ns = change.atime_ns.unwrap_or(attrs.atime_ns);
    attrs.mtime_ns = change.mtime_ns.unwrap_or(attrs.mtime_ns);
    attrs.ctime_ns = now_ns;
    Ok(())
}
