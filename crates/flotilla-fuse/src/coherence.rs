//! Byte-range tokens in the mount (GPFS §2): what this mount caches — write-behind buffers,
//! read-ahead windows, the sizes it knows — it keeps only under tokens, so that another
//! mount (or client) sees every byte a `write` here returned for, and this mount sees every
//! byte another one wrote, without waiting for a `close`.
//!
//! Reads take a read token from their offset to the end of the file, writes a write token
//! on the bytes they write (the service extends both as far as nothing conflicts: a lone
//! writer holds the whole file and never asks again). A revocation (`TokenHolder`) sends
//! the file's write-behind buffer, publishes the size this mount's writes gave it, and
//! empties the read-ahead windows and the known size, before the bytes go back. Files with
//! the no-overlap hint (`user.flotilla.no_overlap`) and ENWRICH opens take no tokens, and
//! neither does anything with `--tokens off` (close-to-open consistency, NFS's).

use crate::open_files::SizeTable;
use crate::write_behind::WriteBehind;
use flotilla_client::{ByteRange, Shape, TokenHolder, TokenMode};
use std::sync::Arc;

/// What a revocation reaches in the mount.
pub struct MountHolder {
    pub write_behind: Arc<WriteBehind>,
    pub sizes: Arc<SizeTable>,
}

impl TokenHolder for MountHolder {
    fn give_back(&self, id: u64, range: ByteRange, to: Option<TokenMode>) {
        if let Some(file) = self.sizes.file(id) {
            let send = |shape: Shape, data: &[u8]| {
                file.write_shape(&shape, data).map(|_| ()).map_err(crate::names::failed)
            };
            // A failure is kept by the write-behind buffer and reported by the next close or
            // fsync of the file (as any lost write-behind data is).
            if let Err(errno) = self.write_behind.flush(id, &send) {
                tracing::warn!(?errno, file = id, "writing back before giving a token back failed");
            }
            if let Err(error) = file.publish_size() {
                tracing::warn!(%error, file = id, "publishing the size before giving a token back failed");
            }
        }
        tracing::debug!(file = id, ?range, ?to, "token given back");
        if to.is_none() {
            // Another client may change these bytes and the size now: what was fetched
            // ahead and the size known here are stale.
            self.sizes.invalidate(id);
        }
    }
}
