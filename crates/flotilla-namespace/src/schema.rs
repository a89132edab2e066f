#![doc = include_str!("../FORMAT.md")]

use redb::TableDefinition;

/// Inode id → inode record (see `record.rs`).
pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// (parent inode id, name as bytes) → child inode id. Names are any bytes but '/' and NUL
/// (schema version 2; version 1 kept UTF-8 names in the table `dirents`, see FORMAT.md).
pub(crate) const DIRENTS: TableDefinition<(u64, &[u8]), u64> = TableDefinition::new("entries");
/// Schema version 1's directory entries, (parent inode id, UTF-8 name) → child inode id:
/// read once by the migration to version 2, then deleted.
pub(crate) const DIRENTS_V1: TableDefinition<(u64, &str), u64> = TableDefinition::new("dirents");
/// (target id, file id, subfile index) → nothing.
pub(crate) const PENDING_DELETES: TableDefinition<(u64, u64, u32), ()> =
    TableDefinition::new("pending_deletes");
/// Target id → target record (see `target_record.rs`).
pub(crate) const TARGETS: TableDefinition<u64, &[u8]> = TableDefinition::new("targets");
/// File id → nothing: files whose last name is gone while a client still has them open
/// (their inode stays, with nlink 0, until the metadata service releases them).
pub(crate) const ORPHANS: TableDefinition<u64, ()> = TableDefinition::new("orphans");
/// Target id → owner record (see `target_owner.rs`): the server credential bound to the
/// target when it was first reported.
pub(crate) const TARGET_OWNERS: TableDefinition<u64, &[u8]> = TableDefinition::new("target_owners");
/// Directory inode id → the id of its parent directory (the root has no row). Lets an
/// operation addressed by (parent id, name) find a directory's ancestors, which `rename`
/// needs to refuse moving a directory into its own subtree. Added in schema version 2.
pub(crate) const DIR_PARENTS: TableDefinition<u64, u64> = TableDefinition::new("dir_parents");
/// Counter name → value.
pub(crate) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");

/// `counters` key holding the database format version.
pub(crate) const SCHEMA_VERSION_KEY: &str = "schema_version";
/// Database format version written by this build. Version 1 databases (UTF-8 names in
/// `dirents`, no `dir_parents`) are migrated on open.
pub(crate) const SCHEMA_VERSION: u64 = 2;
/// `counters` key holding the round-robin placement cursor.
pub(crate) const PLACEMENT_CURSOR_KEY: &str = "placement_cursor";
/// Inode id of the root directory.
pub const ROOT_ID: u64 = 1;

/// Files whose writers promised not to overlap (`user.flotilla.no_overlap`): clients take
/// no byte-range tokens for them. Created on first use (older databases have no such table).
pub(crate) const NO_OVERLAP: TableDefinition<u64, ()> = TableDefinition::new("no_overlap");
