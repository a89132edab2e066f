//! Extended attributes: the layout, as `user.flotilla.layout` (`stripe:1M`, `hash:...`,
//! `explicit`). On a file it is the file's layout (settable while the file is empty); on a
//! directory it is the default layout new files inherit (removable). No other attribute is
//! stored: reading one gives ENODATA, setting one ENOTSUP, as on a file system without them.

use crate::fs::FlotillaFs;
use crate::names::failed;
use flotilla_client::{EntryInfo, FileKind, Layout};
use fuser::{Errno, ReplyXattr};
use std::ffi::OsStr;

pub const LAYOUT_XATTR: &str = "user.flotilla.layout";

/// Replies with an attribute's value or a name list, or only its length when asked (size 0).
pub(crate) fn reply_value(reply: ReplyXattr, size: u32, value: Result<Vec<u8>, Errno>) {
    match value {
        Ok(bytes) if size == 0 => reply.size(bytes.len() as u32),
        Ok(bytes) if bytes.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(bytes) => reply.data(&bytes),
        Err(errno) => reply.error(errno),
    }
}

impl FlotillaFs {
    fn entry(&self, ino: u64) -> Result<EntryInfo, Errno> {
        self.retrying(|| self.client.stat_id(ino)).map_err(failed)
    }

    pub(crate) fn get_xattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, Errno> {
        if name != LAYOUT_XATTR {
            return Err(Errno::NO_XATTR);
        }
        let layout = self.entry(ino)?.layout.ok_or(Errno::NO_XATTR)?;
        Ok(layout.to_string().into_bytes())
    }

    pub(crate) fn list_xattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        match self.entry(ino)?.layout {
            Some(_) => Ok(format!("{LAYOUT_XATTR}\0").into_bytes()),
            None => Ok(Vec::new()),
        }
    }

    pub(crate) fn set_xattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        if name != LAYOUT_XATTR {
            return Err(Errno::ENOTSUP);
        }
        let text = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
        let layout = Layout::parse(text.trim_end_matches(['\0', '\n']).trim()).map_err(|_| Errno::EINVAL)?;
        let entry = self.entry(ino)?;
        let exists = entry.layout.is_some();
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::NO_XATTR);
        }
        refuse_symlink(&entry)?;
        self.client.set_layout_id(entry.id, Some(layout)).map(|_| ()).map_err(failed)
    }

    pub(crate) fn remove_xattr(&self, ino: u64, name: &OsStr) -> Result<(), Errno> {
        if name != LAYOUT_XATTR {
            return Err(Errno::NO_XATTR);
        }
        let entry = self.entry(ino)?;
        if entry.layout.is_none() {
            return Err(Errno::NO_XATTR);
        }
        refuse_symlink(&entry)?;
        self.client.set_layout_id(entry.id, None).map(|_| ()).map_err(failed)
    }
}

/// Linux allows no user attributes on symbolic links.
fn refuse_symlink(entry: &EntryInfo) -> Result<(), Errno> {
    if entry.attrs.kind == FileKind::Symlink {
        return Err(Errno::EPERM);
    }
    Ok(())
}
