//! The storage engine's error type.
//!
//! Every variant names what it is about (target, file, subfile, fork, offset) so that the
//! I/O server can report it without adding context. I/O failures keep the `io::Error` (and
//! so its kind) together with a verb phrase saying what was being done, for example
//! `read block 12 of fork data of 00000000000000ab:3 on target ...`.

use flotilla_types::{FileId, NameError, SubfileIndex, TargetId};
use std::io;
use std::path::PathBuf;

/// What went wrong in a storage operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("target directory {dir:?} does not exist or is not a directory")]
    TargetMissing { dir: PathBuf },
    #[error("target directory {dir:?} has no flotilla-target file and init was not requested")]
    TargetNotInitialized { dir: PathBuf },
    #[error("target id file {path:?} is corrupt: {reason}")]
    TargetIdCorrupt { path: PathBuf, reason: String },
    #[error("target directories {first:?} and {second:?} have the same target id {target}")]
    DuplicateTarget { target: TargetId, first: PathBuf, second: PathBuf },
    #[error("no target with id {target} in this store")]
    UnknownTarget { target: TargetId },
    #[error("subfile {file}:{subfile} does not exist on target {target}")]
    UnknownSubfile { file: FileId, subfile: SubfileIndex, target: TargetId },
    #[error("fork {fork:?} of subfile {file}:{subfile} does not exist on target {target}")]
    UnknownFork { file: FileId, subfile: SubfileIndex, fork: String, target: TargetId },
    #[error("fork {fork:?} of subfile {file}:{subfile} already exists on target {target}")]
    ForkExists { file: FileId, subfile: SubfileIndex, fork: String, target: TargetId },
    #[error("bad fork name: {source}")]
    BadForkName {
        #[source]
        source: NameError,
    },
    #[error("extent at offset {offset} with length {length} overflows a 64-bit offset")]
    ExtentOverflow { offset: u64, length: u64 },
    #[error(
        "extent at offset {offset} with length {length} ends past fork_bytes_max \
         ({fork_bytes_max}) of fork {fork:?} of {file}:{subfile} on target {target}"
    )]
    ForkTooLarge {
        file: FileId,
        subfile: SubfileIndex,
        fork: String,
        target: TargetId,
        offset: u64,
        length: u64,
        fork_bytes_max: u64,
    },
    #[error("buffer holds {actual_bytes} bytes but the extents cover {expected_bytes} bytes")]
    BufferLength { expected_bytes: u64, actual_bytes: u64 },
    #[error("target {target} at {dir:?} is full (no space to reserve)")]
    TargetFull { target: TargetId, dir: PathBuf },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "checksum mismatch in fork {fork:?} of subfile {file}:{subfile} on target {target} at \
         offset {offset} ({length} bytes): stored CRC32C {stored:#010x}, data on disk has {computed:#010x}"
    )]
    ChecksumMismatch {
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
        fork: String,
        offset: u64,
        length: u64,
        stored: u32,
        computed: u32,
    },
    #[error(
        "target {target} at {dir:?} has lost its contents ({reason}); it serves nothing until \
         repaired: with its server stopped, `flotilla target accept-loss {dir:?}` accepts the loss \
         (its stripes then read as zeros)"
    )]
    TargetLost { target: TargetId, dir: PathBuf, reason: String },
    #[error(
        "fork {fork:?} of subfile {file}:{subfile} on target {target} is damaged: {path:?} should \
         exist and does not (lost from the disk)"
    )]
    ForkFileMissing { target: TargetId, file: FileId, subfile: SubfileIndex, fork: String, path: PathBuf },
    #[error("bad store configuration: {name} {reason}")]
    BadConfig { name: &'static str, reason: String },
    #[error("the store is shutting down")]
    ShuttingDown,
    #[error("target {target} has no archive tier (only lines targets of a server with an archive have one)")]
    NoTier { target: TargetId },
    #[error("hsm {action} of fork {fork:?} of {file}:{subfile} refused: {reason}")]
    HsmRefused { action: &'static str, file: FileId, subfile: SubfileIndex, fork: String, reason: String },
}

impl StoreError {
    /// Wraps an I/O error with a verb phrase saying what was being done.
    pub(crate) fn io(action: impl Into<String>, source: io::Error) -> Self {
        StoreError::Io { action: action.into(), source }
    }

    /// The `io::ErrorKind` of an I/O error, if this is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            StoreError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

/// A checksum mismatch found by a disk thread, kept (cloneable) in the failed cache slot
/// until every waiter has turned it into `StoreError::ChecksumMismatch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub target: TargetId,
    pub file: FileId,
    pub subfile: SubfileIndex,
    pub fork: String,
    pub offset: u64,
    pub length: u64,
    pub stored: u32,
    pub computed: u32,
}

impl Mismatch {
    pub(crate) fn to_error(&self) -> StoreError {
        StoreError::ChecksumMismatch {
            target: self.target,
            file: self.file,
            subfile: self.subfile,
            fork: self.fork.clone(),
            offset: self.offset,
            length: self.length,
            stored: self.stored,
            computed: self.computed,
        }
    }
}

/// Whether an I/O error means the file system is out of space.
pub(crate) fn is_no_space(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOSPC) || error.kind() == io::ErrorKind::StorageFull
}
