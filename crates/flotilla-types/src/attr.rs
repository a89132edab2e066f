//! POSIX-style attributes of a namespace entry and the layout of a file's bytes.

use serde::{Deserialize, Serialize};

pub use crate::layout::Layout;

/// Nanoseconds since the Unix epoch.
pub type TimeNs = i64;

/// What a namespace entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    Directory,
    File,
    Symlink,
    /// A named pipe (`mkfifo`).
    Fifo,
    /// A UNIX domain socket's name (`bind`).
    Socket,
    /// A character device node (`mknod`), with its device number in `Attributes::rdev`.
    CharDevice,
    /// A block device node (`mknod`), with its device number in `Attributes::rdev`.
    BlockDevice,
}

impl FileKind {
    /// A FIFO, socket or device node: an inode with no data of its own in the cluster.
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice)
    }
}

/// Attributes kept by the metadata service for every entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attributes {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
    pub nlink: u32,
    pub atime_ns: TimeNs,
    pub mtime_ns: TimeNs,
    pub ctime_ns: TimeNs,
    /// The device number of a character or block device node (Linux `dev_t`); 0 otherwise.
    pub rdev: u64,
}

/// A change to an entry's attributes; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size_bytes: Option<u64>,
    pub atime_ns: Option<TimeNs>,
    pub mtime_ns: Option<TimeNs>,
}
