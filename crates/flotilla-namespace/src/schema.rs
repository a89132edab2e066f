#![doc = include_str!("../FORMAT.md")]

use redb::TableDefinition;

/// Inode id → inode record (see `record.rs`): the inodes created before schema version 3,
/// under their random ids (the *legacy* table: version 3 updates and removes its rows but
/// never adds one).
pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// Sequence number → inode record: every inode created by schema version 3 and the root
/// (sequence number 0). The public id is the keyed permutation of the number (`ids.rs`).
pub(crate) const INODES_BY_SEQ: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes_by_seq");
/// Directory sequence number → the id of its parent directory, for the directories of
/// `inodes_by_seq` (those of the legacy table keep their rows in `dir_parents`).
pub(crate) const DIR_PARENTS_BY_SEQ: TableDefinition<u64, u64> = TableDefinition::new("dir_parents_by_seq");
/// Key name → key record: `inode_ids`, the key of the id permutation (schema version 3).
pub(crate) const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
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
/// Directory inode id → the id of its parent directory (the root has no row), for the
/// directories of the legacy `inodes` table. Lets an
/// operation addressed by (parent id, name) find a directory's ancestors, which `rename`
/// needs to refuse moving a directory into its own subtree. Added in schema version 2.
pub(crate) const DIR_PARENTS: TableDefinition<u64, u64> = TableDefinition::new("dir_parents");
/// Counter name → value.
pub(crate) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");

/// `counters` key holding the database format version.
pub(crate) const SCHEMA_VERSION_KEY: &str = "schema_version";
/// Database format version written by this build. Version 1 databases (UTF-8 names in
/// `dirents`, no `dir_parents`) and version 2 databases (random ids only) are migrated on
/// open.
pub(crate) const SCHEMA_VERSION: u64 = 3;
/// `counters` key holding the next inode sequence number (schema version 3).
pub(crate) const INODE_SEQ_KEY: &str = "inode_seq";
/// `keys` key holding the id permutation's key.
pub(crate) const ID_KEY_NAME: &str = "inode_ids";
/// `counters` key holding the round-robin placement cursor.
pub(crate) const PLACEMENT_CURSOR_KEY: &str = "placement_cursor";
/// Inode id of the root directory.
pub const ROOT_ID: u64 = 1;

/// Files whose writers promised not to overlap (`user.flotilla.no_overlap`): clients take
/// no byte-range tokens for them. Created on first use (older databases have no such table).
pub(crate) const NO_OVERLAP: TableDefinition<u64, ()> = TableDefinition::new("no_overlap");

/// Chain id → chain record (see `chain_record.rs`): replication's chain table (issue 32).
/// Created on first use (older databases have no such table).
pub(crate) const CHAINS: TableDefinition<u32, &[u8]> = TableDefinition::new("chains");
/// Target id → chain target record: each target's failure group and last incarnation.
pub(crate) const CHAIN_TARGETS: TableDefinition<u64, &[u8]> = TableDefinition::new("chain_targets");
