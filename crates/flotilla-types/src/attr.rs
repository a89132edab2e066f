//! POSIX-style attributes of a namespace entry and the layout of a file's bytes.

use serde::{Deserialize, Serialize};

/// Nanoseconds since the Unix epoch.
pub type TimeNs = i64;

/// What a namespace entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    Directory,
    File,
    Symlink,
}

/// How a file's linear byte sequence maps onto its subfiles.
///
/// The core model is `Explicit` (programs address subfiles and forks themselves); `Stripe`
/// is what `flotilla put` uses: round robin in units of `unit_bytes` over every subfile,
/// each unit going to the subfile's `data` fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    Explicit,
    Stripe { unit_bytes: u64 },
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
