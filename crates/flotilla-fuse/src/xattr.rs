//! Extended attributes: the layout, as `user.flotilla.layout` (`stripe:1M`, `hash:...`,
//! `explicit`). On a file it is the file's layout (settable while the file is empty); on a
//! directory it is the default layout new files inherit (removable). And the no-overlap
//! hint, `user.flotilla.no_overlap` (`1`; removing it or setting `0` clears it): the file's
//! writers promise never to overlap, so opens made after it is set take no byte-range
//! tokens. No other attribute is stored: reading one gives ENODATA, setting one ENOTSUP, as
//! on a file system without them.

use crate::fs::FlotillaFs;
use crate::names::failed;
use flotilla_client::{EntryInfo, FileKind, ReplicatedLayout};
use fuser::{Errno, ReplyXattr};
use std::ffi::OsStr;

pub const LAYOUT_XATTR: &str = "user.flotilla.layout";
pub const NO_OVERLAP_XATTR: &str = "user.flotilla.no_overlap";

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
        if name == NO_OVERLAP_XATTR {
            return match self.entry(ino)?.no_overlap {
                true => Ok(b"1".to_vec()),
                false => Err(Errno::NO_XATTR),
            };
        }
        if name != LAYOUT_XATTR {
            return Err(Errno::NO_XATTR);
        }
        let layout = self.entry(ino)?.replicated_layout().ok_or(Errno::NO_XATTR)?;
        Ok(layout.to_string().into_bytes())
    }

    pub(crate) fn list_xattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let entry = self.entry(ino)?;
        let mut names = Vec::new();
        if entry.layout.is_some() {
            names.extend_from_slice(format!("{LAYOUT_XATTR}\0").as_bytes());
        }
        if entry.no_overlap {
            names.extend_from_slice(format!("{NO_OVERLAP_XATTR}\0").as_bytes());
        }
        Ok(names)
    }

    pub(crate) fn set_xattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        if name == NO_OVERLAP_XATTR {
            return self.set_no_overlap(ino, value, flags);
        }
        if name != LAYOUT_XATTR {
            return Err(Errno::ENOTSUP);
        }
        // `,replicas=N` sets a directory's default replica count (issue 32).
        let layout = ReplicatedLayout::parse(value_text(value)?).map_err(|_| Errno::EINVAL)?;
        let entry = self.entry(ino)?;
        check_set_flags(flags, entry.layout.is_some())?;
        refuse_symlink(&entry)?;
        self.client.set_layout_id_replicated(entry.id, Some(layout)).map(|_| ()).map_err(failed)
    }

    /// Sets (`1`) or clears (`0`) the no-overlap hint of a file.
    fn set_no_overlap(&self, ino: u64, value: &[u8], flags: i32) -> Result<(), Errno> {
        let no_overlap = match value_text(value)? {
            "1" | "true" | "yes" => true,
            "0" | "false" | "no" => false,
            _ => return Err(Errno::EINVAL),
        };
        let entry = self.entry(ino)?;
        if entry.attrs.kind != FileKind::File {
            return Err(Errno::EPERM);
        }
        check_set_flags(flags, entry.no_overlap)?;
        self.client.set_no_overlap_id(ino, no_overlap).map(|_| ()).map_err(failed)
    }

    pub(crate) fn remove_xattr(&self, ino: u64, name: &OsStr) -> Result<(), Errno> {
        if name == NO_OVERLAP_XATTR {
            if !self.entry(ino)?.no_overlap {
                return Err(Errno::NO_XATTR);
            }
            return self.client.set_no_overlap_id(ino, false).map(|_| ()).map_err(failed);
        }
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

/// An attribute's value as text: UTF-8, a trailing NUL or newline and spaces dropped.
fn value_text(value: &[u8]) -> Result<&str, Errno> {
    let text = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
    Ok(text.trim_end_matches(['\0', '\n']).trim())
}

/// `XATTR_CREATE` fails on an attribute that `exists`, `XATTR_REPLACE` on one that does not.
fn check_set_flags(flags: i32, exists: bool) -> Result<(), Errno> {
    if flags & libc::XATTR_CREATE != 0 && exists {
        return Err(Errno::EEXIST);
    }
    if flags & libc::XATTR_REPLACE != 0 && !exists {
        return Err(Errno::NO_XATTR);
    }
    Ok(())
}

/// Linux allows no user attributes on symbolic links.
fn refuse_symlink(entry: &EntryInfo) -> Result<(), Errno> {
    if entry.attrs.kind == FileKind::Symlink {
        return Err(Errno::EPERM);
    }
    Ok(())
}
