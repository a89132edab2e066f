//! The one error type of the namespace. Every variant names what was wrong and maps to one
//! POSIX errno (see [`NamespaceError::errno`]), so the metadata service can answer a client
//! with a number without parsing text.

use flotilla_types::{NameError, TargetId};

/// No such file or directory.
pub const ENOENT: i32 = 2;
/// Input/output error (storage failure or corrupt record).
pub const EIO: i32 = 5;
/// Operation not permitted (for example a hard link to a directory).
pub const EPERM: i32 = 1;
/// File exists.
pub const EEXIST: i32 = 17;
/// Not a directory.
pub const ENOTDIR: i32 = 20;
/// Is a directory.
pub const EISDIR: i32 = 21;
/// Invalid argument.
pub const EINVAL: i32 = 22;
/// No space left on device (not enough storage targets).
pub const ENOSPC: i32 = 28;
/// Permission denied (a permission bit is missing).
pub const EACCES: i32 = 13;
/// Read-only file system.
pub const EROFS: i32 = 30;
/// Too many links.
pub const EMLINK: i32 = 31;
/// File name too long.
pub const ENAMETOOLONG: i32 = 36;
/// Directory not empty.
pub const ENOTEMPTY: i32 = 39;
/// Too many levels of symbolic links.
pub const ELOOP: i32 = 40;

/// What went wrong in a namespace operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NamespaceError {
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path}: already exists")]
    AlreadyExists { path: String },
    #[error("{path}: not a directory")]
    NotADirectory { path: String },
    #[error("{path}: is a directory")]
    IsADirectory { path: String },
    #[error("{path}: directory not empty")]
    NotEmpty { path: String },
    #[error("{path}: too many levels of symbolic links")]
    TooManySymlinks { path: String },
    #[error("{path}: too many links (at most {nlink_max})")]
    TooManyLinks { path: String, nlink_max: u32 },
    #[error("invalid name: {0}")]
    InvalidName(#[from] NameError),
    #[error("invalid argument: {what}")]
    InvalidArgument { what: String },
    #[error("not permitted: {what}")]
    NotPermitted { what: String },
    #[error("permission denied: {what}")]
    AccessDenied { what: String },
    #[error("read-only: {what}")]
    ReadOnly { what: String },
    #[error("{wanted} subfiles need {wanted} distinct live targets, but only {live} are live")]
    NotEnoughTargets { wanted: usize, live: usize },
    #[error("target {target} is not live")]
    TargetNotLive { target: TargetId },
    #[error("target {target} is named more than once")]
    DuplicateTarget { target: TargetId },
    #[error("database format version {found} is not supported (this build reads {supported})")]
    UnsupportedFormat { found: u64, supported: u64 },
    #[error("corrupt namespace database: {what}")]
    Corrupt { what: String },
    #[error("namespace storage failed: {0}")]
    Storage(String),
    /// A new inode's sequence number already holds an inode (the `inode_seq` counter went
    /// back): the create is refused and nothing is overwritten.
    #[error("corrupt namespace database: inode sequence number {seq} is already in use")]
    SequenceInUse { seq: u64 },
    #[error("the namespace database's disk is full: {message}")]
    NoSpace { message: String },
}

impl NamespaceError {
    /// The POSIX errno that best describes this error.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound { .. } => ENOENT,
            Self::AlreadyExists { .. } => EEXIST,
            Self::NotADirectory { .. } => ENOTDIR,
            Self::IsADirectory { .. } => EISDIR,
            Self::NotEmpty { .. } => ENOTEMPTY,
            Self::TooManySymlinks { .. } => ELOOP,
            Self::TooManyLinks { .. } => EMLINK,
            Self::InvalidName(name) => name_errno(name),
            Self::InvalidArgument { .. } | Self::TargetNotLive { .. } | Self::DuplicateTarget { .. } => {
                EINVAL
            }
            Self::NotPermitted { .. } => EPERM,
            Self::NotEnoughTargets { .. } | Self::NoSpace { .. } => ENOSPC,
            Self::AccessDenied { .. } => EACCES,
            Self::ReadOnly { .. } => EROFS,
            Self::UnsupportedFormat { .. }
            | Self::Corrupt { .. }
            | Self::Storage(_)
            | Self::SequenceInUse { .. } => EIO,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        Self::Corrupt { what: what.into() }
    }

    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        Self::InvalidArgument { what: what.into() }
    }
}

fn name_errno(name: &NameError) -> i32 {
    match name {
        NameError::TooLong { .. } | NameError::PathTooLong { .. } => ENAMETOOLONG,
        _ => EINVAL,
    }
}

/// A storage error as the namespace reports it: a full disk is `NoSpace` (ENOSPC), anything
/// else `Storage` (EIO).
fn classify(error: redb::Error) -> NamespaceError {
    match &error {
        redb::Error::Io(io)
            if io.raw_os_error() == Some(ENOSPC) || io.kind() == std::io::ErrorKind::StorageFull =>
        {
            NamespaceError::NoSpace { message: error.to_string() }
        }
        _ => NamespaceError::Storage(error.to_string()),
    }
}

impl NamespaceError {
    /// Whether the database may be unusable after this error until it is reopened (redb
    /// refuses every later transaction after a failed write: "previous I/O error").
    pub(crate) fn breaks_database(&self) -> bool {
        matches!(self, Self::Storage(_) | Self::NoSpace { .. })
    }
}

macro_rules! storage_error {
    ($($source:ty),+) => {
        $(impl From<$source> for NamespaceError {
            fn from(error: $source) -> Self {
                classify(redb::Error::from(error))
            }
        })+
    };
}

storage_error!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_match_linux() {
        let not_found = NamespaceError::NotFound { path: "/a".into() };
        assert_eq!(not_found.errno(), 2);
        let long = NamespaceError::InvalidName(NameError::PathTooLong { length: 5000 });
        assert_eq!(long.errno(), 36);
        let dot = NamespaceError::InvalidName(NameError::Empty);
        assert_eq!(dot.errno(), 22);
        let full = NamespaceError::NotEnoughTargets { wanted: 4, live: 2 };
        assert_eq!(full.errno(), 28);
        assert!(full.to_string().contains('4') && full.to_string().contains('2'));
    }
}
