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
