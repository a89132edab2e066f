//! Arguments of the mutating calls that take more than a path.

use flotilla_types::{Layout, TargetId};

/// Largest permission value accepted for `mode` (`rwx` for all plus setuid, setgid, sticky).
pub const MODE_MAX: u32 = 0o7777;

/// Owner and permissions of a new entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Permission bits only, at most [`MODE_MAX`]; the kind is not part of it.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// How to create a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateFile {
    pub owner: Owner,
    /// Number of subfiles, `1..=SUBFILE_COUNT_MAX` and at most the number of live targets.
    pub subfile_count: u32,
    /// Targets the program chose (index = subfile index); `None` lets the namespace place.
    pub targets: Option<Vec<TargetId>>,
    /// `None` takes the parent directory's default layout, else `DEFAULT_LAYOUT`.
    pub layout: Option<Layout>,
    /// When false and a file already exists at the path, that file is returned unchanged.
    pub exclusive: bool,
}

/// Attribute changes; `None` leaves a field alone. Any change sets `ctime` to now. The same
/// type travels on the wire, so the metadata service passes it through unchanged.
pub use flotilla_types::SetAttr;
