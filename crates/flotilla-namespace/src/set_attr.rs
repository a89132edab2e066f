//! `set_attr`: chmod, chown, truncate and utimes on one inode.

use crate::edit::check_mode;
use crate::entry::Entry;
use crate::error::NamespaceError;
use crate::namespace::{not_found_id, Namespace};
use crate::record::{Body, Inode};
use crate::request::SetAttr;
use crate::tables::Source;
use crate::walk::resolve;
use flotilla_types::{Attributes, Caller, FileKind, Layout, TimeNs};

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

/// The entry a layout change applies to.
#[derive(Clone, Copy, Debug)]
pub enum LayoutOf<'a> {
    /// A path, resolved as the caller (search permission along it; a final symlink is
    /// followed, as chmod follows it).
    Path(&'a str),
    /// An entry by id (as an open file descriptor names it).
    Id(u64),
}

impl LayoutOf<'_> {
    fn describe(&self) -> String {
        match self {
            LayoutOf::Path(path) => (*path).to_string(),
            LayoutOf::Id(id) => format!("inode {id:016x}"),
        }
    }
}

impl Namespace {
    /// Sets a directory's default layout (`None` clears it) or an empty file's layout, for
    /// `who`: only the entry's owner or root may, as for chmod; checked in the transaction
    /// that changes it.
    pub fn set_layout_as(
        &self,
        who: &Caller,
        of: LayoutOf<'_>,
        layout: Option<Layout>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.set_layout_replicated_as(who, of, layout, 1, now_ns)
    }

    /// `set_layout_as` with a directory's default replica count (issue 32): 1 for a file
    /// (its count is chosen at create) and when the layout is cleared.
    pub fn set_layout_replicated_as(
        &self,
        who: &Caller,
        of: LayoutOf<'_>,
        layout: Option<Layout>,
        replicas: u32,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        if let Some(layout) = &layout {
            crate::edit::check_layout(layout)?;
        }
        let replicas = match layout {
            Some(layout) => {
                let replicated = flotilla_types::ReplicatedLayout { layout, replicas };
                crate::create::replicas_byte(Some(&replicated))?
            }
            None if replicas <= 1 => 1,
            None => {
                return Err(NamespaceError::invalid(format!(
                    "a default of {replicas} replicas needs a layout to go with it"
                )))
            }
        };
        let what = &format!("set the layout of {}", of.describe());
        self.write(|tables| {
            let (id, mut inode) = match of {
                LayoutOf::Path(path) => {
                    let found = resolve(tables, path, true, who)?;
                    (found.id, found.inode)
                }
                LayoutOf::Id(id) => (id, tables.inode(id)?.ok_or_else(|| not_found_id(id))?),
            };
            crate::access::require_owner(&inode.attrs, who, what)?;
            replace_layout(&mut inode, layout, replicas, what)?;
            inode.attrs.ctime_ns = now_ns;
            tables.put(id, &inode)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Sets the atime of inode `id` as a read does: nothing else changes (not the ctime).
    pub fn touch_atime(&self, id: u64, atime_ns: TimeNs) -> Result<Attributes, NamespaceError> {
        self.touch_atime_as(&Caller::root(), id, atime_ns, atime_ns)
    }

    /// `touch_atime` for `who` ([`crate::access::check_touch_atime`]: a reader may set now).
    pub fn touch_atime_as(
        &self,
        who: &Caller,
        id: u64,
        atime_ns: TimeNs,
        now_ns: TimeNs,
    ) -> Result<Attributes, NamespaceError> {
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| not_found_id(id))?;
            crate::access::check_touch_atime(&inode.attrs, who, atime_ns, now_ns)?;
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

/// Puts `layout` in place: a directory's default (or none), an empty file's layout (a file
/// holding data keeps the layout its bytes were placed by).
fn replace_layout(
    inode: &mut Inode,
    layout: Option<Layout>,
    replicas: u8,
    what: &str,
) -> Result<(), NamespaceError> {
    let size = inode.attrs.size_bytes;
    match (&mut inode.body, layout) {
        (Body::Directory { default_layout, default_replicas }, layout) => {
            *default_layout = layout;
            *default_replicas = replicas;
        }
        (Body::File { .. }, Some(_)) if replicas != 1 => {
            return Err(NamespaceError::invalid(format!(
                "{what}: a file's replica count is chosen when it is created (set it on its directory)"
            )))
        }
        (Body::File { .. }, None) => {
            return Err(NamespaceError::invalid(format!("{what}: a file's layout cannot be cleared")))
        }
        (Body::File { layout: current, .. }, Some(layout)) => {
            if size > 0 && *current != layout {
                return Err(NamespaceError::invalid(format!(
                    "{what}: cannot change the layout of a file that holds data"
                )));
            }
            *current = layout;
        }
        _ => {
            return Err(NamespaceError::invalid(format!("{what}: only files and directories have a layout")))
        }
    }
    Ok(())
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
