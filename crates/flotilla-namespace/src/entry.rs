//! What the namespace returns about an entry: its attributes and, by kind, its file record,
//! symlink target or directory default layout.

use flotilla_types::{Attributes, FileId, FileKind, Layout, TargetId};

/// Where a file's bytes live: the subfile `i` is on `targets[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRecord {
    /// The file's id, equal to its inode id.
    pub id: FileId,
    pub layout: Layout,
    /// Placement: index = subfile index. Never two equal targets.
    pub targets: Vec<TargetId>,
    /// Copies of every subfile (1: one copy, as every file before replicas existed).
    pub replicas: u32,
    /// Replicated files (`replicas` > 1): the chain holding each subfile's replicas (index =
    /// subfile index); `targets[i]` is then the chain's head when the file was created.
    /// Empty for a file of one copy.
    pub chains: Vec<u32>,
}

impl FileRecord {
    /// Number of subfiles (`targets.len()`).
    pub fn subfile_count(&self) -> usize {
        self.targets.len()
    }
}

/// One namespace entry as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Inode id; 1 is the root directory.
    pub id: u64,
    pub attrs: Attributes,
    /// For files only.
    pub file: Option<FileRecord>,
    /// For symlinks only.
    pub symlink_target: Option<String>,
    /// For directories only: the layout new files take when they name none.
    pub default_layout: Option<Layout>,
    /// For directories only: the replica count new files take when they ask for none
    /// (issue 32); 1 otherwise.
    pub default_replicas: u32,
}

impl Entry {
    pub fn kind(&self) -> FileKind {
        self.attrs.kind
    }
}

/// One directory entry with its attributes, as listed by `readdir_plus_page_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryPlus {
    pub name: Vec<u8>,
    pub id: u64,
    pub attrs: Attributes,
}

/// One directory entry as listed by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name as stored: any bytes but '/' and NUL.
    pub name: Vec<u8>,
    pub id: u64,
    pub kind: FileKind,
}

impl DirEntry {
    /// The name as text, with bytes that are not UTF-8 replaced (for path-based callers).
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}
