//! Calls a POSIX front end (the FUSE mount) needs beyond the path-based API: acting on
//! behalf of another user (the caller of a system call, not this process) and opening a
//! file by inode number, which is how the kernel names it.

use crate::client::{Client, CreateOptions};
use crate::error::{unexpected, ClientError};
use crate::file::File;
use crate::opens::create_file;
use flotilla_proto::{EntryInfo, MetaReply, MetaRequest};
use flotilla_types::Attributes;

/// The user and group a new entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Client {
    /// Opens the file with inode number `id` (the path is only kept for messages).
    pub fn open_id(&self, id: u64) -> Result<File, ClientError> {
        self.block_on(crate::opens::open_file(self.clone(), format!("inode {id:016x}"), id))
    }

    /// Raises `attrs` of entry `id` by this client's writes not yet published (what `stat`
    /// and `stat_id` do to the attributes they return).
    pub fn overlay(&self, id: u64, attrs: &mut Attributes) {
        self.core.overlay(id, attrs);
    }

    /// Makes this client's writes of file `id` durable, then publishes the size and mtime
    /// they gave it, as `File::flush` does (so that an explicit mtime set next is not raised
    /// by them later, and so that a token given back leaves the size known). A size is
    /// published only once every byte below it is committed: when the commit fails, nothing
    /// is published and the writes stay for a later flush.
    pub fn flush_id(&self, id: u64) -> Result<(), ClientError> {
        self.block_on(self.core.flush_file(id))
    }

    /// Drops what this client has not made durable of file `id`: its unstable writes and
    /// the size they would have published. For a write or close that failed and will not
    /// be retried (the last handle of a mount closed with an error, a copy given up): the
    /// client then reports the metadata service's size again, which covers only durable
    /// bytes, instead of a size it will never publish.
    pub fn discard_unpublished(&self, id: u64) {
        self.core.discard_unpublished(id);
    }

    /// Raises file `id`'s size to at least `size_bytes` (never lowers it) and sets its mtime
    /// to now: what `fallocate` does to the size, safe when several clients do it at once.
    pub fn grow_size(&self, id: u64, size_bytes: u64) -> Result<Attributes, ClientError> {
        let request = MetaRequest::GrowSize { id, size_bytes, mtime_ns: crate::file::now_ns() };
        match self.meta(request)? {
            MetaReply::Attributes(attrs) => Ok(attrs),
            other => Err(unexpected("grow size", &other)),
        }
    }

    /// `create`, with the new file owned by `owner`.
    pub fn create_as(&self, path: &str, options: &CreateOptions, owner: Owner) -> Result<File, ClientError> {
        let future = create_file(
            self.core.transport.clone(),
            path.to_string(),
            options.clone(),
            (owner.uid, owner.gid),
        );
        let client = self.clone();
        let file = self.block_on(async move {
            crate::opens::open_file(client, path.to_string(), future.await?.id).await
        })?;
        Ok(file.with_no_overlap(options.no_overlap))
    }

    /// `mkdir`, with the new directory owned by `owner`.
    pub fn mkdir_as(&self, path: &str, mode: u32, owner: Owner) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::Mkdir { path: path.to_string(), mode, uid: owner.uid, gid: owner.gid };
        expect_entry(self.meta(request)?, "mkdir")
    }

    /// `symlink`, with the new link owned by `owner`.
    pub fn symlink_as(&self, path: &str, target: &str, owner: Owner) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::Symlink {
            path: path.to_string(),
            target: target.to_string(),
            uid: owner.uid,
            gid: owner.gid,
        };
        expect_entry(self.meta(request)?, "symlink")
    }
}

fn expect_entry(reply: MetaReply, what: &'static str) -> Result<EntryInfo, ClientError> {
    match reply {
        MetaReply::Entry(entry) => Ok(entry),
        other => Err(unexpected(what, &other)),
    }
}
