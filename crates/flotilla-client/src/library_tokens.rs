//! Byte-range tokens for library clients (issue 11, GPFS §2): every `File` read, write and
//! size change takes a [`TokenUse`] on the bytes it touches, so a library client revokes a
//! mount's write token before it reads (the mount writes its buffered bytes back first), a
//! mount's read token before it writes (the mount drops its cached pages), and a write is
//! atomic with respect to every other token holder's reads and writes.
//!
//! The library caches no data, so giving a token back only commits the file's writes and
//! then makes the size they gave it known to the metadata service (what `File::publish_size`
//! does; a size is never published over bytes not yet durable). One
//! [`TokenCache`] per client, made at the first use (a client that never reads or writes a
//! file starts no poll thread), given back file by file when the client's last handle on
//! the file closes. `ClientConfig::tokens` turns them off for the client, the open flag
//! `no_overlap` (`OpenOptions`, `CreateOptions`) and the file's `user.flotilla.no_overlap`
//! hint for one file.

use crate::error::ClientError;
use crate::tokens::{ByteRange, TokenCache, TokenHolder, TokenSettings, TokenUse};
use crate::transport::WeakMetaLine;
use flotilla_proto::TokenMode;
use flotilla_request::Summary;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// A client's library tokens: whether it takes them, and its cache once made.
pub(crate) struct LibraryTokens {
    enabled: AtomicBool,
    settings: TokenSettings,
    /// The cache and its holder (the cache holds it weakly).
    cache: OnceLock<(TokenCache, Arc<dyn TokenHolder>)>,
}

impl LibraryTokens {
    pub fn new(enabled: bool, settings: TokenSettings) -> LibraryTokens {
        LibraryTokens { enabled: AtomicBool::new(enabled), settings, cache: OnceLock::new() }
    }

    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::SeqCst);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// The client's token cache, made on first use over `line` with the holder `holder`
    /// makes (what a revocation reaches: it publishes the sizes the client's writes gave
    /// the file); `None` with tokens off.
    pub fn cache(
        &self,
        line: WeakMetaLine,
        holder: impl FnOnce() -> Arc<dyn TokenHolder>,
    ) -> Option<TokenCache> {
        if !self.enabled() {
            return None;
        }
        let (cache, _) = self.cache.get_or_init(|| {
            let holder = holder();
            (TokenCache::over(line, Arc::downgrade(&holder), self.settings), holder)
        });
        Some(cache.clone())
    }

    /// The cache if one was made (nothing to give back otherwise).
    pub fn made(&self) -> Option<TokenCache> {
        self.cache.get().map(|(cache, _)| cache.clone())
    }
}

impl Drop for LibraryTokens {
    fn drop(&mut self) {
        if let Some((cache, _)) = self.cache.get() {
            cache.stop();
        }
    }
}

/// The bytes a read of `summary` needs a token on: from its lowest byte to the end of any
/// file (a sequential reader asks once), `None` when it moves nothing.
pub(crate) fn read_range(summary: &Summary) -> Option<ByteRange> {
    (summary.total_bytes > 0).then_some((summary.file_start, u64::MAX))
}

/// The bytes a write of `summary` needs a token on: its lowest to its highest byte.
pub(crate) fn write_range(summary: &Summary) -> Option<ByteRange> {
    (summary.total_bytes > 0).then(|| (summary.file_start, summary.file_end - 1))
}

/// Takes a token use on `range` of file `id` (`path` names it in errors), blocking.
pub(crate) fn cover(
    cache: &TokenCache,
    path: &str,
    id: u64,
    mode: TokenMode,
    range: ByteRange,
) -> Result<TokenUse, ClientError> {
    cache.cover(id, mode, range).map_err(|error| naming(error, path))
}

/// `cover` from inside the client's runtime: at once when the token is held, else on a
/// blocking thread (asking the service blocks).
pub(crate) async fn cover_async(
    cache: TokenCache,
    path: String,
    id: u64,
    mode: TokenMode,
    range: ByteRange,
) -> Result<TokenUse, ClientError> {
    if let Some(used) = cache.try_cover(id, mode, range) {
        return Ok(used);
    }
    let asked = tokio::task::spawn_blocking(move || cover(&cache, &path, id, mode, range));
    asked.await.map_err(|_| ClientError::Abandoned)?
}

fn naming(error: ClientError, path: &str) -> ClientError {
    match error {
        ClientError::Token(message) => ClientError::Token(format!("{path}: {message}")),
        other => other,
    }
}

/// Gives back every token of file `id` (its last handle in this client closed): at once
/// outside the runtime, else on a blocking thread (the release blocks). `then` runs after.
pub(crate) fn release_file(
    cache: TokenCache,
    id: u64,
    runtime: &tokio::runtime::Handle,
    then: impl FnOnce() + Send + 'static,
) {
    let release = move || {
        if let Err(error) = cache.release_file(id) {
            tracing::warn!(%error, file = id, "giving the file's tokens back failed; the lease will");
        }
        then();
    };
    match tokio::runtime::Handle::try_current() {
        Err(_) => release(),
        Ok(_) => {
            runtime.spawn_blocking(release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_request::{Piece, Shape, ShapeLimits};

    fn summary(shape: &Shape) -> Summary {
        shape.validate(&ShapeLimits { pieces_max: 1 << 20, bytes_max: u64::MAX }).unwrap()
    }

    #[test]
    fn reads_reach_to_the_end_of_any_file_and_writes_cover_their_bytes() {
        let contiguous = summary(&Shape::contiguous(4096, 100));
        assert_eq!(read_range(&contiguous), Some((4096, u64::MAX)));
        assert_eq!(write_range(&contiguous), Some((4096, 4195)));
        let pieces = vec![
            Piece { file_offset: 900, memory_offset: 0, length: 10 },
            Piece { file_offset: 50, memory_offset: 10, length: 5 },
            Piece { file_offset: 10, memory_offset: 15, length: 0 },
        ];
        let list = summary(&Shape::List { pieces });
        assert_eq!(write_range(&list), Some((50, 909)), "lowest to highest byte, empty pieces aside");
        assert_eq!(read_range(&list), Some((50, u64::MAX)));
        let empty = summary(&Shape::contiguous(7, 0));
        assert_eq!((read_range(&empty), write_range(&empty)), (None, None), "nothing moved, no token");
    }
}
