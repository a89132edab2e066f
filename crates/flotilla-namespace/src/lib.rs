//! The metadata service's namespace: directories, files and their subfile placement,
//! symlinks, hard links, subfiles waiting for deletion, the targets ever seen and the server
//! credential each target is bound to, kept in one redb database.
//!
//! This crate is pure storage logic with no networking. [`Namespace`] is synchronous; the
//! metadata service calls it from a blocking thread. Crash safety comes from redb: every
//! mutating call is exactly one write transaction, made durable (by a group commit shared
//! with concurrent calls, see `group.rs`) before it returns, so after a crash each call
//! either happened completely or not at all.
//!
//! Invariants the namespace keeps (checked by the model test in `tests/model.rs`):
//! - every directory entry names an existing inode, and the root (inode 1) always exists;
//! - a directory has exactly one name (no hard links to directories), so its ancestors form
//!   a chain and a directory is never moved into its own subtree;
//! - a directory's `nlink` is 2 plus its subdirectories and its `size_bytes` is its number
//!   of entries; a file's or symlink's `nlink` is the number of names it has;
//! - a file with no names left is removed in the same transaction that writes one
//!   `pending_deletes` row per subfile;
//! - a file's subfiles are on distinct targets, all live when it was created.
//!
//! The on-disk format is documented byte by byte in `FORMAT.md` (the `schema` module).

pub mod access;
mod batch;
pub use batch::{BatchDurability, Batched};
mod chain_record;
mod chain_scan;
pub use chain_record::{ChainChange, ChainTarget, StoredChains};
pub use chain_scan::ChainSubfilesPage;
mod codec;
mod create;
pub use create::DEFAULT_LAYOUT;
mod edit;
mod entry;
mod error;
mod group;
pub use group::{CommitStats, GroupCommit};
mod guard;
mod hints;
mod ids;
pub use ids::ID_KEY_BYTES;
mod image;
pub use image::NamespaceImage;
mod namespace;
mod placement;
mod record;
mod remove;
mod request;
mod schema;
mod set_attr;
pub use set_attr::LayoutOf;
mod shared_txn;
mod tables;
mod target_owner;
mod target_record;
mod targets;
mod touched;
mod walk;

pub use edit::{IsOpen, NLINK_MAX};
pub use entry::{DirEntry, DirEntryPlus, Entry, FileRecord};
pub use error::{
    NamespaceError, EACCES, EEXIST, EINVAL, EIO, EISDIR, ELOOP, EMLINK, ENAMETOOLONG, ENOENT, ENOSPC,
    ENOTDIR, ENOTEMPTY, EPERM, EROFS,
};
pub use namespace::{Namespace, READDIR_PAGE_ENTRIES_MAX};
pub use placement::{
    check_targets, choose_targets, rank_targets, take_ranked, Spread, TargetUsage, FREE_PERCENT_MIN,
};
pub use record::SUBFILE_COUNT_MAX;
pub use request::{CreateFile, Owner, SetAttr, MODE_MAX};
pub use schema::ROOT_ID;
pub use target_owner::{OWNER_NAME_BYTES_MAX, TARGETS_BOUND_PER_CALL_MAX};
pub use target_record::{TargetRecord, SERVER_ADDR_BYTES_MAX};
pub use targets::PENDING_DELETES_BATCH_MAX;
pub use touched::{recording, walking, Touched};
pub use walk::{Place, DIRECTORY_DEPTH_MAX, SYMLINK_FOLLOWS_MAX};

/// A new inode id key from the operating system's random source (for the proposer of a
/// replicated namespace's genesis, [`NamespaceImage::fresh`]).
pub fn draw_id_key() -> Result<[u8; ID_KEY_BYTES], NamespaceError> {
    ids::InodeIds::draw_key()
}

/// Decodes an inode record (the value of the `inodes_by_seq` and `inodes` tables); for
/// fuzzing and tools.
/// Returns `Corrupt` for anything that is not a valid record, never panics.
#[doc(hidden)]
pub fn decode_inode_record(record: &[u8]) -> Result<Entry, NamespaceError> {
    record::Inode::decode(record).map(|inode| inode.into_entry(0))
}
