//! Errors as they travel on the wire: a stable code plus a message naming what was wrong.

use serde::{Deserialize, Serialize};

/// Stable error codes; new codes are only ever appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request could not be decoded or is malformed.
    BadRequest,
    /// A request went over a limit; the message names the limit.
    OverLimit,
    /// A file, subfile, fork, path or target does not exist.
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    NotEmpty,
    InvalidArgument,
    /// The storage target has no space left.
    NoSpace,
    /// The server or target is not available.
    Unavailable,
    /// A disk or network I/O error on the server.
    Io,
    /// The frame or protocol version is not understood.
    Protocol,
    PermissionDenied,
    NameTooLong,
    CrossDevice,
    /// A capability's lifetime ran out: ask the metadata service for a new one and retry.
    CapabilityExpired,
    /// This build does not do what was asked (yet); the message names what.
    Unsupported,
    /// The metadata service is in its lock grace period after a restart (holders reclaim
    /// their locks; nothing new is granted): ask again shortly.
    Recovering,
    /// A reclaimed lock is not held for the session: the grace period was over, or it
    /// conflicts with another owner's lock, or its file is not open by the session.
    LockLost,
    /// The metadata group forgot the client session a `Sequenced` change named (it
    /// expired, or the reply asked for was dropped): open a new session; the change's
    /// outcome is unknown if it was sent before.
    SessionExpired,
    /// Stored data failed its per-block CRC32C and no other replica could answer for it
    /// (a file with one copy, or every copy bad); the message names the fork and offset.
    ChecksumMismatch,
}

impl ErrorCode {
    /// The Linux errno that best matches the code.
    pub fn errno(self) -> i32 {
        match self {
            ErrorCode::NotFound => 2,
            ErrorCode::Io | ErrorCode::Protocol => 5,
            ErrorCode::PermissionDenied | ErrorCode::CapabilityExpired => 13,
            ErrorCode::AlreadyExists => 17,
            ErrorCode::CrossDevice => 18,
            ErrorCode::NotADirectory => 20,
            ErrorCode::IsADirectory => 21,
            ErrorCode::BadRequest | ErrorCode::InvalidArgument => 22,
            ErrorCode::OverLimit => 7,
            ErrorCode::NoSpace => 28,
            ErrorCode::NameTooLong => 36,
            ErrorCode::NotEmpty => 39,
            ErrorCode::Unavailable => 112,
            ErrorCode::Unsupported => 95,
            ErrorCode::Recovering => 11,
            ErrorCode::LockLost => 37,
            ErrorCode::SessionExpired => 116,
            ErrorCode::ChecksumMismatch => 5,
        }
    }
}

/// An error reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError { code, message: message.into() }
    }
}
