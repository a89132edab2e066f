//! Namespace operations: lookup, attributes, directories, special files, links, renames,
//! listings, space. Every call names a directory by its inode id and an entry by its name
//! there (`At`), or an entry by its id: the mount never builds a path.

use crate::convert::{errno, file_attr, file_type, time_or_now};
use crate::fs::{FlotillaFs, Listed};
use crate::meta_tokens::Timeouts;
use crate::nodes::{check_name, ROOT_INO};
use crate::open_files::FILE_BYTES_MAX;
use flotilla_client::CachedLookup;
use flotilla_client::{
    At, ClientError, CreateOptions, EntryInfo, FileKind, Owner, RenameMode, SetAttr, TokenMode, WHOLE_FILE,
};
use fuser::{Errno, FileAttr, RenameFlags, Request, TimeOrNow};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::Duration;

/// The block `statfs` counts in.
pub const STATFS_BLOCK_BYTES: u64 = 4096;
/// Free inodes reported by `statfs`: the namespace has no fixed inode table (ids are random
/// 64-bit numbers), so as many as a `u32` counts.
const STATFS_FILES_FREE: u64 = 1 << 32;

/// What a `setattr` asks for.
pub struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

/// Space over every target, in `STATFS_BLOCK_BYTES` blocks.
pub struct Space {
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
}

pub(crate) fn failed(error: ClientError) -> Errno {
    let errno = errno(&error);
    if errno == Errno::EIO {
        tracing::warn!(%error, "cluster call failed");
    }
    errno
}

fn owner(request: &Request) -> Owner {
    Owner { uid: request.uid(), gid: request.gid() }
}

impl FlotillaFs {
    /// The entry `name` in directory `parent`, with the timeouts the kernel may cache it
    /// for: long under inode tokens, recorded before the reply goes (`meta_tokens.rs`).
    pub(crate) fn lookup_entry(&self, parent: u64, name: &OsStr) -> Result<(FileAttr, Timeouts), Errno> {
        let at = At { parent, name: check_name(name)? };
        if let Some(cache) = self.active_meta_tokens() {
            let asked = cache.generation();
            match self.retrying(|| self.client.lookup_at_cached(at)) {
                Ok(CachedLookup::Found { entry, grants }) => {
                    let timeouts = cache.record_lookup(asked, (parent, name), Some(entry.id), &grants);
                    return Ok((self.attr_of(&entry), timeouts));
                }
                Ok(CachedLookup::Missing { .. }) => return Err(Errno::ENOENT),
                Err(error) if !self.inode_tokens_refused(&error) => return Err(failed(error)),
                Err(_) => {}
            }
        }
        let entry = self.retrying(|| self.client.lookup_at(at)).map_err(failed)?;
        let ttl = self.untokened_ttl();
        Ok((self.attr_of(&entry), Timeouts { entry: ttl, attributes: ttl }))
    }

    /// Whether `error` is an older service refusing `InodeCached`: the mount then goes on
    /// without inode tokens, with `attr_timeout_ms`.
    fn inode_tokens_refused(&self, error: &ClientError) -> bool {
        let refused =
            matches!(error, ClientError::Meta(wire) if wire.code == flotilla_client::ErrorCode::BadRequest);
        if refused && !self.meta_refused.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(%error, "the metadata service refuses inode tokens; names and attributes are cached for attr_timeout_ms");
            self.client.set_changes_carry_session(false);
        }
        refused
    }

    /// `attributes`, with the timeout the kernel may cache them for (long under an inode
    /// token).
    pub(crate) fn attributes_timed(&self, ino: u64) -> Result<(FileAttr, Duration), Errno> {
        let Some(cache) = self.active_meta_tokens() else {
            return Ok((self.attributes(ino)?, self.untokened_ttl()));
        };
        let _token = self.token_cover(ino, self.sizes.cached_opens(ino) > 0, TokenMode::Read, WHOLE_FILE)?;
        let asked = cache.generation();
        let (entry, grants) = match self.retrying(|| self.client.stat_id_cached(ino)) {
            Ok(answer) => answer,
            Err(error) if self.inode_tokens_refused(&error) => {
                return Ok((self.attributes(ino)?, self.untokened_ttl()))
            }
            Err(error) => return Err(failed(error)),
        };
        if entry.attrs.kind == FileKind::File {
            self.sizes.observed(ino, entry.attrs.size_bytes, || self.write_behind.holds(ino));
        }
        let timeout = cache.record_attributes(asked, ino, &grants);
        Ok((self.attr_of(&entry), timeout))
    }

    pub(crate) fn attributes(&self, ino: u64) -> Result<FileAttr, Errno> {
        // The kernel reads a page-cache open up to the size it was given: that size must
        // include what other clients wrote and hold in their caches (GPFS: a stat needs a
        // read token), so their write tokens are revoked first.
        let _token = self.token_cover(ino, self.sizes.cached_opens(ino) > 0, TokenMode::Read, WHOLE_FILE)?;
        let entry = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?;
        // Writes waiting in the write-behind buffer are not in the service's size yet.
        if entry.attrs.kind == FileKind::File {
            self.sizes.observed(ino, entry.attrs.size_bytes, || self.write_behind.holds(ino));
        }
        Ok(self.attr_of(&entry))
    }

    pub(crate) fn set_attributes(&self, ino: u64, change: Change) -> Result<FileAttr, Errno> {
        let mut attrs = None;
        if let Some(size) = change.size {
            attrs = Some(self.truncate(ino, size)?);
        }
        let rest = SetAttr {
            mode: change.mode.map(|mode| mode & 0o7777),
            uid: change.uid,
            gid: change.gid,
            size_bytes: None,
            atime_ns: change.atime.map(time_or_now),
            mtime_ns: change.mtime.map(time_or_now),
        };
        if rest != SetAttr::default() {
            if rest.mtime_ns.is_some() {
                // This mount's unsent and unpublished writes carry their own mtime, which the
                // next flush would raise the file's to: send and publish them first.
                if self.write_behind.holds(ino) {
                    let file = self.retrying(|| self.client.open_id(ino)).map_err(failed)?;
                    self.write_behind.flush_to(ino, &file)?;
                }
                // Not over a lost write-behind batch (that close fails, and publishes nothing).
                if self.write_behind.failure(ino).is_ok() {
                    self.retrying(|| self.client.flush_id(ino)).map_err(failed)?;
                }
            }
            attrs = Some(self.client.set_attr(ino, rest).map_err(failed)?);
        }
        let mut attrs = match attrs {
            Some(attrs) => attrs,
            None => return self.attributes(ino),
        };
        self.client.overlay(ino, &mut attrs);
        if change.size.is_none() {
            if let Some(known) = self.sizes.known(ino) {
                attrs.size_bytes = attrs.size_bytes.max(known);
            }
        }
        Ok(file_attr(ino, &attrs))
    }

    /// Sets a file's size, shrinking its forks when it shrinks (a fresh handle: its idea of
    /// the current size must include every write published so far).
    fn truncate(&self, ino: u64, size: u64) -> Result<flotilla_client::Attributes, Errno> {
        if size > FILE_BYTES_MAX {
            return Err(Errno::EFBIG);
        }
        let file = self.retrying(|| self.client.open_id(ino)).map_err(failed)?;
        // Every other client's cached bytes and size of the file are stale after this.
        let token = self.token_cover(ino, !file.entry().no_overlap, TokenMode::Write, WHOLE_FILE)?;
        self.write_behind.flush_to(ino, &file)?;
        let attrs = self.retrying(|| file.set_size(size)).map_err(failed)?;
        self.sizes.truncated(ino, size);
        drop(token);
        if let (Some(tokens), None) = (&self.tokens, self.sizes.known(ino)) {
            // Not open here: nothing to keep the token for.
            tokens.release_file(ino).map_err(failed)?;
        }
        Ok(attrs)
    }

    pub(crate) fn link_target(&self, ino: u64) -> Result<String, Errno> {
        let entry = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?;
        entry.symlink.ok_or(Errno::EINVAL)
    }

    pub(crate) fn make_directory(
        &self,
        request: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        let at = At { parent, name: check_name(name)? };
        let entry = self.client.mkdir_at(at, mode & 0o7777, owner(request)).map_err(failed)?;
        Ok(self.attr_of(&entry))
    }

    /// `mknod`: a FIFO, socket or device node; a regular file is created (and closed) as
    /// `create` would.
    pub(crate) fn make_node(
        &self,
        request: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        let at = At { parent, name: check_name(name)? };
        let kind = match mode & libc::S_IFMT {
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            0 | libc::S_IFREG => return self.make_regular(request, at, mode),
            _ => return Err(Errno::EINVAL),
        };
        let rdev =
            if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) { u64::from(rdev) } else { 0 };
        let entry = self.client.mknod_at(at, kind, rdev, mode & 0o7777, owner(request)).map_err(failed)?;
        Ok(self.attr_of(&entry))
    }

    fn make_regular(&self, request: &Request, at: At<'_>, mode: u32) -> Result<FileAttr, Errno> {
        let file = self.client.create_at(at, &exclusive_create(mode), owner(request)).map_err(failed)?;
        let attr = self.attr_of(file.entry());
        file.close().map_err(failed)?;
        Ok(attr)
    }

    pub(crate) fn make_symlink(
        &self,
        request: &Request,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        let at = At { parent, name: check_name(name)? };
        let target = target.to_str().ok_or(Errno::EINVAL)?;
        let entry = self.client.symlink_at(at, target, owner(request)).map_err(failed)?;
        Ok(self.attr_of(&entry))
    }

    pub(crate) fn remove_name(&self, parent: u64, name: &OsStr, directory: bool) -> Result<(), Errno> {
        let at = At { parent, name: check_name(name)? };
        let removed = if directory { self.client.rmdir_at(at) } else { self.client.unlink_at(at) };
        removed.map_err(failed)
    }

    pub(crate) fn rename_entry(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let mode = if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        } else if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EINVAL);
            }
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else {
            RenameMode::Replace
        };
        let from = At { parent, name: check_name(name)? };
        let to = At { parent: new_parent, name: check_name(new_name)? };
        self.client.rename_at(from, to, mode).map_err(failed)
    }

    /// A second name for entry `ino`, linked by its id (so it is `ino` whatever another
    /// client did to its other names meanwhile).
    pub(crate) fn hard_link(&self, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<FileAttr, Errno> {
        let at = At { parent: new_parent, name: check_name(new_name)? };
        let entry = self.client.link_at(ino, at).map_err(failed)?;
        Ok(self.attr_of(&entry))
    }

    /// Reads the whole listing of directory `ino` (at most `listing_entries_max` entries)
    /// when it is opened. The ".." entry carries the root's inode number: the mount keeps no
    /// parents (the kernel resolves ".." itself).
    pub(crate) fn open_directory(&self, ino: u64) -> Result<u64, Errno> {
        let entries =
            self.retrying(|| self.client.readdir_plus_id(ino, self.listing_entries_max)).map_err(failed)?;
        let mut listing = Vec::with_capacity(entries.len() + 2);
        let dot = |ino, name: &str| Listed {
            ino,
            kind: fuser::FileType::Directory,
            name: OsString::from(name),
            attr: None,
        };
        listing.push(dot(ino, "."));
        listing.push(dot(ROOT_INO, ".."));
        listing.extend(entries.into_iter().map(|entry| {
            let attr = self.listed_attr(entry.id, entry.attrs.clone());
            Listed {
                ino: entry.id,
                kind: file_type(entry.attrs.kind),
                name: OsString::from_vec(entry.name),
                attr: Some(attr),
            }
        }));
        self.dirs.insert(listing)
    }

    pub(crate) fn space(&self) -> Result<Space, Errno> {
        let targets = self.retrying(|| self.client.status()).map_err(failed)?;
        let used: u64 = targets.iter().map(|t| t.used_bytes).sum();
        let free: u64 = targets.iter().map(|t| t.free_bytes).sum();
        let inodes = self.retrying(|| self.client.inode_count()).map_err(failed)?;
        Ok(Space {
            blocks: (used + free) / STATFS_BLOCK_BYTES,
            blocks_free: free / STATFS_BLOCK_BYTES,
            files: inodes.saturating_add(STATFS_FILES_FREE),
            files_free: STATFS_FILES_FREE,
        })
    }

    /// Creates (or, without O_EXCL, opens an existing) file and opens it.
    pub(crate) fn create_file(
        &self,
        request: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, (u64, fuser::FopenFlags)), Errno> {
        let at = At { parent, name: check_name(name)? };
        let file = match self.client.create_at(at, &exclusive_create(mode), owner(request)) {
            Ok(file) => file,
            Err(error) if errno(&error) == Errno::EEXIST && flags & libc::O_EXCL == 0 => {
                let existing = self.client.lookup_at(at).map_err(failed)?;
                if existing.attrs.kind == FileKind::Directory {
                    return Err(Errno::EISDIR);
                }
                self.client.open_id(existing.id).map_err(failed)?
            }
            Err(error) => return Err(failed(error)),
        };
        let entry: EntryInfo = file.entry().clone();
        let handle = self.insert_open(file, flags, request.pid())?;
        Ok((self.attr_of(&entry), handle))
    }
}

/// How the mount creates a regular file: the default layout, `mode`'s permission bits, and
/// always exclusive (the client removes a file whose subfiles it could not create, which must
/// never be a file that existed before).
fn exclusive_create(mode: u32) -> CreateOptions {
    CreateOptions {
        subfiles: 0,
        targets: None,
        layout: None,
        mode: mode & 0o7777,
        exclusive: true,
        no_overlap: false,
        replicas: 1,
    }
}
