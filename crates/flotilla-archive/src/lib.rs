//! `flotilla-archive`: the tertiary tier's backends (RAMA §4.2.3: tertiary storage behind
//! user-level storage managers), through `object_store`, behind a blocking API that the
//! storage engine's threads call.
//!
//! Two backends: a POSIX directory (which also covers tape through LTFS and any slower mounted
//! file system) and an S3 bucket. Every call is bounded by [`ArchiveOptions::timeout`], and
//! an S3 client retries at most [`ArchiveOptions::retries_max`] times, so an unreachable
//! archive is an error within a bounded time, never a hang.
//!
//! Durability: [`Archive::put`] returns only once the object is durable — for a directory
//! after `fsync` of the object file and of every directory from it up to the root; for S3 when
//! the service acknowledged the (possibly multipart) upload.

use bytes::Bytes;
use futures::future::BoxFuture;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why an archive call failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("archive URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("archive {url} has no object {key:?}")]
    NotFound { url: String, key: String },
    #[error("archive {url} unreachable or failing ({what} {key:?}): {detail}")]
    Unreachable { url: String, what: &'static str, key: String, detail: String },
    #[error("archive {url}: {what} {key:?} gave no answer within {timeout_ms} ms")]
    TimedOut { url: String, what: &'static str, key: String, timeout_ms: u64 },
}

impl From<ArchiveError> for std::io::Error {
    fn from(error: ArchiveError) -> Self {
        let kind = match error {
            ArchiveError::NotFound { .. } => std::io::ErrorKind::NotFound,
            ArchiveError::TimedOut { .. } => std::io::ErrorKind::TimedOut,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, error.to_string())
    }
}

/// Limits of an archive client.
#[derive(Clone, Debug)]
pub struct ArchiveOptions {
    /// Longest wait for any one call (a part of an upload, a ranged read, a delete).
    pub timeout: Duration,
    /// Retries of a failed S3 request (0: fail at once).
    pub retries_max: usize,
    /// Size of one part of a multipart upload (S3 needs at least 5 MiB but for the last).
    pub part_bytes: usize,
}

impl Default for ArchiveOptions {
    fn default() -> Self {
        ArchiveOptions { timeout: Duration::from_secs(30), retries_max: 2, part_bytes: 8 << 20 }
    }
}

/// The smallest part an S3 multipart upload accepts (other than its last).
pub const PART_BYTES_MIN: usize = 5 << 20;

/// A tertiary store: one directory or one S3 bucket (and key prefix).
pub struct Archive {
    url: String,
    store: Arc<dyn ObjectStore>,
    /// Root directory of a directory archive (for the `fsync`s after a put).
    local_root: Option<PathBuf>,
    prefix: String,
    options: ArchiveOptions,
    runtime: tokio::runtime::Runtime,
}

impl fmt::Debug for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archive").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Archive {
    /// Opens an archive: a directory path (created if missing) or `file:///DIR`, or
    /// `s3://BUCKET[/PREFIX]`, whose endpoint, region and credentials come from the
    /// standard `AWS_*` environment variables (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...).
    pub fn open(url: &str, options: ArchiveOptions) -> Result<Archive, ArchiveError> {
        let bad = |reason: String| ArchiveError::BadUrl { url: url.to_string(), reason };
        if options.part_bytes < PART_BYTES_MIN {
            return Err(bad(format!(
                "part size {} is below the {PART_BYTES_MIN} bytes S3 needs",
                options.part_bytes
            )));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("flotilla-archive")
            .enable_all()
            .build()
            .map_err(|error| bad(format!("cannot start its I/O thread: {error}")))?;
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("names no bucket".into()));
            }
            let client = ClientOptions::new()
                .with_timeout(options.timeout)
                .with_connect_timeout(options.timeout.min(Duration::from_secs(10)));
            let retry = RetryConfig {
                max_retries: options.retries_max,
                retry_timeout: options.timeout,
                ..RetryConfig::default()
            };
            // Client options first: they carry `allow_http`, which the environment may set.
            let mut builder = AmazonS3Builder::new().with_client_options(client);
            for (name, value) in std::env::vars() {
                if let Some(key) =
                    name.strip_prefix("AWS_").and_then(|_| name.to_ascii_lowercase().parse().ok())
                {
                    builder = builder.with_config(key, value);
                }
            }
            let store = builder
                .with_bucket_name(bucket)
                .with_retry(retry)
                .build()
                .map_err(|error| bad(error.to_string()))?;
            return Ok(Archive {
                url: url.to_string(),
                store: Arc::new(store),
                local_root: None,
                prefix: prefix.trim_matches('/').to_string(),
                options,
                runtime,
            });
        }
        if url.contains("://") && !url.starts_with("file://") {
            return Err(bad("is neither a directory, file:///DIR nor s3://BUCKET/PREFIX".into()));
        }
        let root = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
        if !root.is_absolute() {
            return Err(bad("a directory archive needs an absolute path".into()));
        }
        std::fs::create_dir_all(&root).map_err(|error| bad(format!("cannot create {root:?}: {error}")))?;
        let store = LocalFileSystem::new_with_prefix(&root).map_err(|error| bad(error.to_string()))?;
        Ok(Archive {
            url: url.to_string(),
            store: Arc::new(store),
            local_root: Some(root),
            prefix: String::new(),
            options,
            runtime,
        })
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Largest part of an upload.
    pub fn part_bytes(&self) -> usize {
        self.options.part_bytes
    }

    fn location(&self, key: &str) -> ObjectPath {
        match self.prefix.is_empty() {
            true => ObjectPath::from(key),
            false => ObjectPath::from(format!("{}/{key}", self.prefix)),
        }
    }

    fn run<T>(
        &self,
        what: &'static str,
        key: &str,
        call: BoxFuture<'_, object_store::Result<T>>,
    ) -> Result<T, ArchiveError> {
        let timeout = self.options.timeout;
        let outcome = self.runtime.block_on(async { tokio::time::timeout(timeout, call).await });
        match outcome {
            Err(_) => Err(ArchiveError::TimedOut {
                url: self.url.clone(),
                what,
                key: key.to_string(),
                timeout_ms: timeout.as_millis() as u64,
            }),
            Ok(Err(object_store::Error::NotFound { .. })) => {
                Err(ArchiveError::NotFound { url: self.url.clone(), key: key.to_string() })
            }
            Ok(Err(error)) => Err(ArchiveError::Unreachable {
                url: self.url.clone(),
                what,
                key: key.to_string(),
                detail: error.to_string(),
            }),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// Stores an object of `size_bytes` whose bytes `fill(offset, buffer)` provides a part at a
    /// time (at most [`Archive::part_bytes`] in memory), and returns once it is durable.
    /// Returns the CRC32C of the bytes stored.
    pub fn put(
        &self,
        key: &str,
        size_bytes: u64,
        mut fill: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> Result<u32, ArchiveError> {
        let location = self.location(key);
        let part_bytes = self.options.part_bytes as u64;
        let failed = |error: std::io::Error| ArchiveError::Unreachable {
            url: self.url.clone(),
            what: "read the data to put",
            key: key.to_string(),
            detail: error.to_string(),
        };
        let mut crc = 0u32;
        let mut next_part = |offset: u64| -> Result<Bytes, ArchiveError> {
            let mut buffer = vec![0u8; (size_bytes - offset).min(part_bytes) as usize];
            fill(offset, &mut buffer).map_err(failed)?;
            crc = crc32c::crc32c_append(crc, &buffer);
            Ok(Bytes::from(buffer))
        };
        if size_bytes <= part_bytes {
            let payload = PutPayload::from(next_part(0)?);
            self.run("put", key, Box::pin(self.store.put(&location, payload)))?;
        } else {
            let mut upload =
                self.run("start upload of", key, Box::pin(self.store.put_multipart(&location)))?;
            let mut offset = 0;
            while offset < size_bytes {
                let part = next_part(offset)?;
                offset += part.len() as u64;
                if let Err(error) = self.run("upload a part of", key, upload.put_part(PutPayload::from(part)))
                {
                    let _ = self.run("abort upload of", key, upload.abort());
                    return Err(error);
                }
            }
            self.run("complete upload of", key, upload.complete())?;
        }
        self.sync_local(&location, key)?;
        Ok(crc)
    }

    /// `fsync` of a directory archive's object and its directories (S3: nothing to do).
    fn sync_local(&self, location: &ObjectPath, key: &str) -> Result<(), ArchiveError> {
        let Some(root) = &self.local_root else { return Ok(()) };
        let failed = |error: std::io::Error| ArchiveError::Unreachable {
            url: self.url.clone(),
            what: "fsync",
            key: key.to_string(),
            detail: error.to_string(),
        };
        let mut path = root.clone();
        for part in location.parts() {
            path.push(part.as_ref());
        }
        std::fs::File::open(&path).and_then(|file| file.sync_all()).map_err(failed)?;
        let mut dir: Option<&Path> = path.parent();
        while let Some(current) = dir {
            std::fs::File::open(current).and_then(|file| file.sync_all()).map_err(failed)?;
            if current == root.as_path() {
                break;
            }
            dir = current.parent();
        }
        Ok(())
    }

    /// Reads `range` of an object (past its end: as much as there is).
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, ArchiveError> {
        let location = self.location(key);
        let size = self.size(key)?;
        let range = range.start.min(size)..range.end.min(size);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.run("read", key, Box::pin(self.store.get_range(&location, range)))
    }

    /// Size of an object.
    pub fn size(&self, key: &str) -> Result<u64, ArchiveError> {
        let location = self.location(key);
        let meta = self.run("stat", key, Box::pin(self.store.head(&location)))?;
        Ok(meta.size)
    }

    /// Deletes an object (absent already: fine).
    pub fn delete(&self, key: &str) -> Result<(), ArchiveError> {
        let location = self.location(key);
        match self.run("delete", key, Box::pin(self.store.delete(&location))) {
            Ok(()) | Err(ArchiveError::NotFound { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(offset: u64, buffer: &mut [u8]) -> std::io::Result<()> {
        for (at, byte) in buffer.iter_mut().enumerate() {
            *byte = ((offset + at as u64) % 251) as u8;
        }
        Ok(())
    }

    #[test]
    fn a_directory_archive_keeps_small_and_multipart_objects() {
        let dir = tempfile::tempdir().unwrap();
        let options = ArchiveOptions { part_bytes: PART_BYTES_MIN, ..ArchiveOptions::default() };
        let archive = Archive::open(dir.path().to_str().unwrap(), options).unwrap();
        let small_crc = archive.put("a/small", 1000, pattern).unwrap();
        let mut expected = vec![0u8; 1000];
        pattern(0, &mut expected).unwrap();
        assert_eq!(small_crc, crc32c::crc32c(&expected));
        assert_eq!(archive.get_range("a/small", 0..1000).unwrap(), expected);
        let size = (PART_BYTES_MIN * 2 + 12345) as u64;
        archive.put("b/large", size, pattern).unwrap();
        assert_eq!(archive.size("b/large").unwrap(), size);
        let mut middle = vec![0u8; 4096];
        pattern(PART_BYTES_MIN as u64 - 100, &mut middle).unwrap();
        let start = PART_BYTES_MIN as u64 - 100;
        assert_eq!(archive.get_range("b/large", start..start + 4096).unwrap(), middle);
        // A range past the end gives what there is.
        assert_eq!(archive.get_range("b/large", size - 10..size + 100).unwrap().len(), 10);
        archive.delete("b/large").unwrap();
        assert!(matches!(archive.get_range("b/large", 0..1), Err(ArchiveError::NotFound { .. })));
        archive.delete("b/large").unwrap();
    }

    #[test]
    fn bad_urls_are_named() {
        for url in ["relative/dir", "http://host/x", "s3://"] {
            let error = Archive::open(url, ArchiveOptions::default()).unwrap_err();
            assert!(error.to_string().contains(url), "{error}");
        }
        let small = ArchiveOptions { part_bytes: 1 << 20, ..ArchiveOptions::default() };
        assert!(Archive::open("/tmp/x", small).unwrap_err().to_string().contains("part size"));
    }

    #[test]
    fn a_failed_fill_aborts_the_put() {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(dir.path().to_str().unwrap(), ArchiveOptions::default()).unwrap();
        let error = archive.put("c", 10, |_, _| Err(std::io::Error::other("disk gone"))).unwrap_err();
        assert!(error.to_string().contains("disk gone"), "{error}");
        assert!(matches!(archive.size("c"), Err(ArchiveError::NotFound { .. })));
    }
}
