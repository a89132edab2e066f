//! Byte-range tokens in the mount (GPFS §2): what this mount caches — write-behind buffers,
//! read-ahead windows, the sizes it knows — it keeps only under tokens, so that another
//! mount (or client) sees every byte a `write` here returned for, and this mount sees every
//! byte another one wrote, without waiting for a `close`.
//!
//! Reads take a read token from their offset to the end of the file, writes a write token
//! on the bytes they write (the service extends both as far as nothing conflicts: a lone
//! writer holds the whole file and never asks again). A revocation (`TokenHolder`) sends
//! the file's write-behind buffer, commits it and publishes the size this mount's writes
//! gave it (never a size over bytes not yet durable), and empties the read-ahead windows
//! and the known size, before the bytes go back. Files with
//! the no-overlap hint (`user.flotilla.no_overlap`) and ENWRICH opens take no tokens, and
//! neither does anything with `--tokens off` (close-to-open consistency, NFS's).
//!
//! Read-only opens of such files use the kernel's page cache (`--kernel-cache`, on by
//! default): repeated and strided small reads are served by the kernel, and the kernel's
//! own read-ahead asks the mount for large reads. A revocation drops the pages it covers
//! (`FUSE_NOTIFY_INVAL_INODE`); reads that arrive meanwhile never wait for it (the kernel
//! holds their pages locked, and the invalidation would wait for them): see
//! `TokenCache::cover_or_pass`.

use crate::open_files::SizeTable;
use crate::write_behind::WriteBehind;
use flotilla_client::{ByteRange, TokenHolder, TokenMode};
use std::sync::Arc;

/// What a revocation reaches in the mount.
pub struct MountHolder {
    pub write_behind: Arc<WriteBehind>,
    pub sizes: Arc<SizeTable>,
    /// Tells the kernel to drop cached pages and attributes (set once the session exists).
    pub notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Closed files whose tokens this mount keeps (`kept.rs`).
    pub kept: parking_lot::Mutex<crate::kept::KeptFiles>,
}

impl MountHolder {
    /// Drops the kernel's cached pages of bytes `range` of inode `id`, and its attributes.
    pub fn invalidate_kernel(&self, id: u64, (start, end): ByteRange) {
        let offset = i64::try_from(start).unwrap_or(i64::MAX);
        // 0: to the end of the file.
        let length = if end == u64::MAX { 0 } else { i64::try_from(end - start + 1).unwrap_or(0) };
        self.notify(id, offset, length);
    }

    /// Drops the kernel's cached attributes of inode `id` (its size), not its pages.
    pub fn invalidate_attributes(&self, id: u64) {
        self.notify(id, -1, 0);
    }

    fn notify(&self, id: u64, offset: i64, length: i64) {
        let Some(notifier) = self.notifier.get() else { return };
        if let Err(error) = notifier.inval_inode(fuser::INodeNo(id), offset, length) {
            // ENOENT: the kernel has no such inode cached (nothing to drop).
            if error.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(%error, ino = id, "the kernel refused to drop cached pages");
            }
        }
    }
}

impl TokenHolder for MountHolder {
    fn give_back(&self, id: u64, range: ByteRange, to: Option<TokenMode>) {
        if let Some(file) = self.sizes.file(id) {
            // A failure is kept by the write-behind buffer and reported by the next close or
            // fsync of the file (as any lost write-behind data is); no size is published over
            // the lost bytes.
            let sent = self.write_behind.flush_to(id, &file).and(self.write_behind.failure(id));
            if let Err(errno) = sent {
                tracing::warn!(?errno, file = id, "writing back before giving a token back failed");
            } else if let Err(error) = file.publish_size() {
                tracing::warn!(%error, file = id, "publishing the size before giving a token back failed");
            }
        }
        tracing::debug!(file = id, ?range, ?to, "token given back");
        if to.is_none() {
            // Another client may change these bytes and the size now: what was fetched
            // ahead and the size known here are stale.
            self.sizes.invalidate(id);
            if self.kept.lock().given_back(id) {
                // Closed here: no read is in flight, and the next open would otherwise keep
                // pages another client may now make stale.
                self.invalidate_kernel(id, flotilla_client::WHOLE_FILE);
            }
        }
    }

    fn caches_outside(&self, id: u64) -> bool {
        self.sizes.cached_opens(id) > 0
    }

    fn invalidate(&self, id: u64, range: ByteRange) {
        self.invalidate_kernel(id, range);
    }
}
