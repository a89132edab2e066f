//! Settings of one mount; every table and thread pool has its bound here.

/// How to run a mount.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Threads serving kernel requests, each with its own clone of the FUSE device; this many
    /// requests (reads and writes of one file by several processes included) run at once.
    pub threads: usize,
    /// Most files open through the mount at once (ENFILE beyond).
    pub open_files_max: usize,
    /// Most directory listings open at once (ENFILE beyond).
    pub open_dirs_max: usize,
    /// Most entries one open directory listing holds (a larger directory fails to open,
    /// with EINVAL).
    pub listing_entries_max: usize,
    /// How long the kernel may cache attributes and names held under no inode token, in
    /// milliseconds, when inode tokens are off (`metadata_timeout_ms` 0, or a service that
    /// does not know them); with them on, such answers are not cached (timeout 0).
    pub attr_timeout_ms: u64,
    /// How long the kernel may cache names and attributes this mount holds inode tokens on
    /// (`meta_tokens.rs`), in milliseconds; 0 turns inode tokens off.
    pub metadata_timeout_ms: u64,
    /// Most names and inodes recorded under inode tokens at once; past it answers are not
    /// cached.
    pub metadata_recorded_max: usize,
    /// Writes shorter than this wait in their file's write-behind buffer and travel packed;
    /// longer ones are queued on their own.
    pub write_behind_piece_bytes_max: u64,
    /// A file's write-behind buffer is queued when it holds this many bytes, and a writer
    /// finding more of its file queued sends the oldest batch itself (0: no write-behind).
    pub write_behind_bytes_max: u64,
    /// Bytes waiting in all write-behind buffers and queues together; writes beyond go
    /// straight out.
    pub write_behind_total_bytes_max: u64,
    /// Let every user use the mount (`allow_other`) with the kernel checking permissions
    /// (`default_permissions`); `None` means "when running as root".
    pub allow_other: Option<bool>,
    /// When reads update access times: `relatime` (default), `strictatime` or `noatime`.
    pub atime: crate::AtimeMode,
    /// Mount read-only (`ro`): the kernel refuses every change with EROFS.
    pub read_only: bool,
    /// ENWRICH mode (`enwrich`): a file opened write-only by a process whose environment
    /// names a job is opened in ENWRICH mode (see `enwrich.rs`).
    pub enwrich: bool,
    /// The log cache of each file opened in ENWRICH mode, in bytes.
    pub enwrich_cache_bytes: u64,
    /// Bytes one read-only open may fetch ahead of its reads when they are sequential or
    /// strided (`readahead.rs`); 0 turns read-ahead off.
    pub readahead_bytes_max: u64,
    /// Keep caches coherent across clients with byte-range tokens (`coherence.rs`); off:
    /// close-to-open consistency only, as NFS.
    pub tokens: bool,
    /// Read-only opens of files under tokens use the kernel's page cache (`coherence.rs`).
    pub kernel_cache: bool,
    /// How far the kernel reads ahead of page-cache reads (the mount's `read_ahead_kb`);
    /// each read-ahead request to the mount carries at most 1 MiB.
    pub kernel_readahead_bytes: u64,
    /// Closed files whose tokens (and, unchanged, kernel pages) the mount keeps for a later
    /// open (`kept.rs`); past it the least recently closed give theirs back.
    pub kept_files_max: usize,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            threads: 16,
            open_files_max: 65_536,
            open_dirs_max: 4_096,
            listing_entries_max: 1 << 22,
            attr_timeout_ms: 1_000,
            metadata_timeout_ms: 600_000,
            metadata_recorded_max: 1 << 20,
            write_behind_piece_bytes_max: 512 << 10,
            write_behind_bytes_max: 4 << 20,
            write_behind_total_bytes_max: 256 << 20,
            allow_other: None,
            atime: crate::AtimeMode::RelAtime,
            read_only: false,
            enwrich: false,
            enwrich_cache_bytes: 4 << 20,
            readahead_bytes_max: 8 << 20,
            tokens: true,
            kernel_cache: true,
            kernel_readahead_bytes: 4 << 20,
            kept_files_max: 4_096,
        }
    }
}
