//! Tests of `Namespace` against a real redb file in a temporary directory.

use flotilla_namespace::*;
use flotilla_types::{FileId, FileKind, Layout, SubfileIndex, TargetId};
use std::path::PathBuf;

const OWNER: Owner = Owner { mode: 0o644, uid: 1000, gid: 100 };

fn live(count: u64) -> Vec<TargetUsage> {
    (1..=count)
        .map(|id| TargetUsage { target: TargetId(id * 10), used_bytes: 0, free_bytes: 1 << 30 })
        .collect()
}

fn spec(subfile_count: u32) -> CreateFile {
    CreateFile { owner: OWNER, subfile_count, targets: None, layout: None, exclusive: true }
}

fn fresh() -> (tempfile::TempDir, PathBuf, Namespace) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("namespace.redb");
    let namespace = Namespace::open(&path).unwrap();
    (dir, path, namespace)
}

fn names(namespace: &Namespace, path: &str) -> Vec<String> {
    namespace.readdir(path).unwrap().into_iter().map(|entry| entry.name_lossy()).collect()
}

#[test]
fn new_database_has_only_the_root() {
    let (_dir, _path, ns) = fresh();
    let root = ns.lookup("/").unwrap();
    assert_eq!(root.id, ROOT_ID);
    assert_eq!(root.attrs.kind, FileKind::Directory);
    assert_eq!((root.attrs.mode, root.attrs.uid, root.attrs.nlink), (0o755, 0, 2));
    assert!(ns.readdir("/").unwrap().is_empty());
    assert_eq!(ns.get(ROOT_ID).unwrap(), root);
}

#[test]
fn everything_survives_reopen() {
    // Phase 1: build a small tree and record a target, then drop the handle.
    let (_dir, path, ns) = fresh();
    ns.mkdir("/d", OWNER, 5).unwrap();
    let file = ns.create_file("/d/f", &spec(2), &live(3), 6).unwrap();
    ns.symlink("/l", "/d/f", OWNER, 7).unwrap();
    ns.record_target(TargetId(10), "10.0.0.1:7100", 1, 2).unwrap();
    ns.bind_targets("server-a", &[TargetId(10)]).unwrap();
    drop(ns);

    // Phase 2: reopen and find all of it, including the advanced placement cursor.
    let ns = Namespace::open(&path).unwrap();
    assert_eq!(ns.lookup("/d/f").unwrap(), file);
    assert_eq!(ns.lookup_follow("/l").unwrap(), file);
    assert_eq!(ns.lookup("/l").unwrap().symlink_target.as_deref(), Some("/d/f"));
    let targets = ns.targets().unwrap();
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0].server_addr, "10.0.0.1:7100");
    assert_eq!(ns.target_owners().unwrap(), vec![(TargetId(10), "server-a".to_string())]);
    assert!(ns.bind_targets("server-b", &[TargetId(10)]).is_err());
    let next = ns.create_file("/d/g", &spec(1), &live(3), 8).unwrap();
    assert_eq!(next.file.unwrap().targets, vec![TargetId(20)]);
}

#[test]
fn mkdir_counts_links_and_touches_parent() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/a", OWNER, 10).unwrap();
    ns.mkdir("/a/b", OWNER, 20).unwrap();
    ns.create_file("/a/f", &spec(1), &live(1), 30).unwrap();
    let a = ns.lookup("/a").unwrap();
    assert_eq!(a.attrs.nlink, 3);
    assert_eq!(a.attrs.size_bytes, 2);
    assert_eq!((a.attrs.mtime_ns, a.attrs.ctime_ns), (30, 30));
    assert_eq!(ns.lookup("/").unwrap().attrs.nlink, 3);
    assert_eq!(ns.mkdir("/a", OWNER, 40), Err(NamespaceError::AlreadyExists { path: "/a".into() }));
    assert_eq!(ns.mkdir("/", OWNER, 40).unwrap_err().errno(), EEXIST);
    assert_eq!(ns.mkdir("/x/y", OWNER, 40).unwrap_err().errno(), ENOENT);
    assert_eq!(ns.mkdir("/a/f/y", OWNER, 40).unwrap_err().errno(), ENOTDIR);
}

#[test]
fn bad_paths_and_arguments_are_typed_errors() {
    let (_dir, _path, ns) = fresh();
    let long = format!("/{}", "n".repeat(256));
    assert_eq!(ns.mkdir(&long, OWNER, 0).unwrap_err().errno(), ENAMETOOLONG);
    assert_eq!(ns.mkdir("/a/../b", OWNER, 0).unwrap_err().errno(), EINVAL);
    assert_eq!(ns.mkdir("relative", OWNER, 0).unwrap_err().errno(), EINVAL);
    let bad_mode = Owner { mode: 0o10000, ..OWNER };
    assert_eq!(ns.mkdir("/m", bad_mode, 0).unwrap_err().errno(), EINVAL);
    // Zero subfiles means "one per live target" (or the layout's count).
    let chosen = ns.create_file("/zero", &spec(0), &live(2), 0).unwrap();
    assert_eq!(chosen.file.unwrap().targets.len(), 2);
    assert_eq!(ns.create_file("/f", &spec(70_000), &live(2), 0).unwrap_err().errno(), EINVAL);
    assert_eq!(
        ns.create_file("/f", &spec(3), &live(2), 0),
        Err(NamespaceError::NotEnoughTargets { wanted: 3, live: 2 })
    );
    let names: Vec<String> = ns.readdir("/").unwrap().into_iter().map(|e| e.name_lossy()).collect();
    assert_eq!(names, vec!["zero".to_string()], "failed calls change nothing");
}

#[test]
fn create_file_places_round_robin_and_respects_exclusive() {
    let (_dir, _path, ns) = fresh();
    let first = ns.create_file("/f", &spec(2), &live(3), 1).unwrap();
    let record = first.file.clone().unwrap();
    assert_eq!(record.id, FileId(first.id));
    assert_eq!(record.targets, vec![TargetId(10), TargetId(20)]);
    assert_eq!(record.layout, flotilla_namespace::DEFAULT_LAYOUT, "no layout named or inherited");
    assert_eq!(first.attrs.nlink, 1);

    let again = CreateFile { exclusive: false, ..spec(3) };
    assert_eq!(ns.create_file("/f", &again, &live(3), 2).unwrap(), first);
    assert_eq!(ns.create_file("/f", &spec(1), &live(3), 2).unwrap_err().errno(), EEXIST);
    ns.mkdir("/d", OWNER, 3).unwrap();
    assert_eq!(ns.create_file("/d", &again, &live(3), 4).unwrap_err().errno(), EISDIR);

    let second = ns.create_file("/g", &spec(2), &live(3), 5).unwrap();
    // The target the first file left out comes first, then the next from the cursor.
    assert_eq!(second.file.unwrap().targets, vec![TargetId(30), TargetId(20)]);
}

#[test]
fn named_targets_are_checked() {
    let (_dir, _path, ns) = fresh();
    let named = |targets: Vec<u64>| CreateFile {
        subfile_count: targets.len() as u32,
        targets: Some(targets.into_iter().map(TargetId).collect()),
        ..spec(1)
    };
    let entry = ns.create_file("/ok", &named(vec![30, 10]), &live(3), 0).unwrap();
    assert_eq!(entry.file.unwrap().targets, vec![TargetId(30), TargetId(10)]);
    assert_eq!(
        ns.create_file("/a", &named(vec![10, 99]), &live(3), 0),
        Err(NamespaceError::TargetNotLive { target: TargetId(99) })
    );
    assert_eq!(
        ns.create_file("/b", &named(vec![10, 10]), &live(3), 0),
        Err(NamespaceError::DuplicateTarget { target: TargetId(10) })
    );
    let mismatched = CreateFile { subfile_count: 1, ..named(vec![10, 20]) };
    assert_eq!(ns.create_file("/c", &mismatched, &live(3), 0).unwrap_err().errno(), EINVAL);
}

#[test]
fn default_layout_is_used_and_inherited() {
    let (_dir, _path, ns) = fresh();
    let stripe = Layout::Stripe { unit_bytes: 1 << 20, count: 0 };
    ns.mkdir("/s", OWNER, 0).unwrap();
    ns.set_default_layout("/s", Some(stripe), 1).unwrap();
    ns.mkdir("/s/t", OWNER, 2).unwrap();
    assert_eq!(ns.lookup("/s/t").unwrap().default_layout, Some(stripe));
    let file = ns.create_file("/s/t/f", &spec(1), &live(1), 3).unwrap();
    assert_eq!(file.file.unwrap().layout, stripe);
    let explicit = CreateFile { layout: Some(Layout::Explicit), ..spec(1) };
    let file = ns.create_file("/s/g", &explicit, &live(1), 4).unwrap();
    assert_eq!(file.file.unwrap().layout, Layout::Explicit);
    let zero = Some(Layout::Stripe { unit_bytes: 0, count: 0 });
    assert_eq!(ns.set_default_layout("/s", zero, 5).unwrap_err().errno(), EINVAL);
}

#[test]
fn unlink_queues_deletes_only_for_the_last_link() {
    let (_dir, _path, ns) = fresh();
    let file = ns.create_file("/f", &spec(2), &live(2), 0).unwrap();
    let linked = ns.link("/f", "/g", 1).unwrap();
    assert_eq!(linked.attrs.nlink, 2);
    assert_eq!(ns.lookup("/").unwrap().attrs.size_bytes, 2);

    assert_eq!(ns.unlink("/f", 2).unwrap(), None);
    assert_eq!(ns.lookup("/g").unwrap().attrs.nlink, 1);
    assert!(ns.pending_deletes(TargetId(10), 100).unwrap().is_empty());

    let gone = ns.unlink("/g", 3).unwrap().unwrap();
    assert_eq!(Some(gone.clone()), file.file);
    assert_eq!(ns.get(file.id).unwrap_err().errno(), ENOENT);
    let id = FileId(file.id);
    assert_eq!(ns.pending_deletes(TargetId(10), 100).unwrap(), vec![(id, SubfileIndex(0))]);
    assert_eq!(ns.pending_deletes(TargetId(20), 100).unwrap(), vec![(id, SubfileIndex(1))]);
    assert!(ns.pending_deletes(TargetId(20), 0).unwrap().is_empty());

    ns.ack_deletes(TargetId(10), &[(id, SubfileIndex(0))]).unwrap();
    ns.ack_deletes(TargetId(10), &[(id, SubfileIndex(0))]).unwrap();
    assert!(ns.pending_deletes(TargetId(10), 100).unwrap().is_empty());
    assert_eq!(ns.pending_deletes(TargetId(20), 100).unwrap().len(), 1);
}

#[test]
fn unlink_and_link_refuse_directories() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/d", OWNER, 0).unwrap();
    assert_eq!(ns.unlink("/d", 1).unwrap_err().errno(), EISDIR);
    assert_eq!(ns.link("/d", "/e", 1).unwrap_err().errno(), EPERM);
    assert_eq!(ns.unlink("/nope", 1).unwrap_err().errno(), ENOENT);
    assert_eq!(ns.unlink("/", 1).unwrap_err().errno(), EINVAL);
}

#[test]
fn rmdir_needs_an_empty_directory() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/d", OWNER, 0).unwrap();
    ns.symlink("/d/l", "x", OWNER, 0).unwrap();
    assert_eq!(ns.rmdir("/d", 1).unwrap_err().errno(), ENOTEMPTY);
    assert_eq!(ns.rmdir("/d/l", 1).unwrap_err().errno(), ENOTDIR);
    assert_eq!(ns.unlink("/d/l", 2).unwrap(), None, "a symlink has no data");
    ns.rmdir("/d", 3).unwrap();
    let root = ns.lookup("/").unwrap();
    assert_eq!((root.attrs.nlink, root.attrs.size_bytes, root.attrs.mtime_ns), (2, 0, 3));
    assert_eq!(ns.rmdir("/", 4).unwrap_err().errno(), EINVAL);
}

#[test]
fn rename_moves_and_replaces() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/a", OWNER, 0).unwrap();
    ns.mkdir("/b", OWNER, 0).unwrap();
    let f = ns.create_file("/a/f", &spec(1), &live(2), 0).unwrap();
    let g = ns.create_file("/b/g", &spec(1), &live(2), 0).unwrap();

    // A file over a file: the replaced one loses its last link.
    assert_eq!(ns.rename("/a/f", "/b/g", 5).unwrap(), g.file);
    assert_eq!(ns.lookup("/b/g").unwrap().id, f.id);
    assert_eq!(names(&ns, "/a"), Vec::<String>::new());
    assert_eq!(ns.pending_deletes(TargetId(20), 10).unwrap().len(), 1);

    // A directory into another: link counts follow.
    ns.rename("/a", "/b/a", 6).unwrap();
    assert_eq!(ns.lookup("/").unwrap().attrs.nlink, 3);
    assert_eq!(ns.lookup("/b").unwrap().attrs.nlink, 3);
    assert_eq!(names(&ns, "/b"), vec!["a", "g"]);

    // Same inode on both sides: nothing happens.
    ns.link("/b/g", "/h", 7).unwrap();
    assert_eq!(ns.rename("/b/g", "/h", 8).unwrap(), None);
    assert_eq!(ns.lookup("/h").unwrap().attrs.nlink, 2);
    assert_eq!(ns.rename("/h", "/h", 8).unwrap(), None);
}

#[test]
fn rename_refuses_bad_replacements_and_cycles() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/a", OWNER, 0).unwrap();
    ns.mkdir("/a/b", OWNER, 0).unwrap();
    ns.mkdir("/e", OWNER, 0).unwrap();
    ns.create_file("/f", &spec(1), &live(1), 0).unwrap();
    assert_eq!(ns.rename("/a", "/a/b/c", 1).unwrap_err().errno(), EINVAL);
    assert_eq!(ns.rename("/a", "/a/c", 1).unwrap_err().errno(), EINVAL);
    assert_eq!(ns.rename("/a/b", "/a", 1).unwrap_err().errno(), ENOTEMPTY);
    assert_eq!(ns.rename("/a", "/f", 1).unwrap_err().errno(), ENOTDIR);
    assert_eq!(ns.rename("/f", "/e", 1).unwrap_err().errno(), EISDIR);
    assert_eq!(ns.rename("/nope", "/x", 1).unwrap_err().errno(), ENOENT);
    assert_eq!(ns.rename("/", "/x", 1).unwrap_err().errno(), EINVAL);

    // An empty directory may be replaced by a directory.
    ns.rename("/a", "/e", 2).unwrap();
    assert_eq!(names(&ns, "/"), vec!["e", "f"]);
    assert_eq!(names(&ns, "/e"), vec!["b"]);
    assert_eq!(ns.lookup("/").unwrap().attrs.nlink, 3);
}

#[test]
fn rename_through_a_symlink_still_sees_the_cycle() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/a", OWNER, 0).unwrap();
    ns.mkdir("/a/b", OWNER, 0).unwrap();
    ns.symlink("/l", "/a/b", OWNER, 0).unwrap();
    assert_eq!(ns.rename("/a", "/l/c", 1).unwrap_err().errno(), EINVAL);
}

#[test]
fn symlinks_are_followed_in_the_middle_and_loops_stop() {
    let (_dir, _path, ns) = fresh();
    ns.mkdir("/a", OWNER, 0).unwrap();
    ns.mkdir("/a/b", OWNER, 0).unwrap();
    let f = ns.create_file("/a/b/f", &spec(1), &live(1), 0).unwrap();
    ns.symlink("/abs", "/a/b", OWNER, 0).unwrap();
    ns.symlink("/a/rel", "b/../b/.", OWNER, 0).unwrap();
    ns.symlink("/a/up", "..", OWNER, 0).unwrap();
    assert_eq!(ns.lookup("/abs/f").unwrap().id, f.id);
    assert_eq!(ns.lookup("/a/rel/f").unwrap().id, f.id);
    assert_eq!(ns.lookup("/a/up/a/b/f").unwrap().id, f.id);
    assert_eq!(ns.lookup_follow("/a/up").unwrap().id, ROOT_ID);
    assert_eq!(names(&ns, "/abs"), vec!["f"]);
    ns.create_file("/abs/g", &spec(1), &live(1), 0).unwrap();
    assert_eq!(names(&ns, "/a/b"), vec!["f", "g"]);

    ns.symlink("/loop1", "/loop2", OWNER, 0).unwrap();
    ns.symlink("/loop2", "/loop1", OWNER, 0).unwrap();
    assert_eq!(ns.lookup("/loop1/x").unwrap_err().errno(), ELOOP);
    assert_eq!(ns.lookup("/loop1").unwrap().kind(), FileKind::Symlink);
    assert_eq!(ns.lookup("/a/b/f/x").unwrap_err().errno(), ENOTDIR);
    assert_eq!(ns.symlink("/e", "", OWNER, 0).unwrap_err().errno(), EINVAL);
}

#[test]
fn set_attr_changes_what_was_asked() {
    let (_dir, _path, ns) = fresh();
    let f = ns.create_file("/f", &spec(1), &live(1), 0).unwrap();
    let change =
        SetAttr { mode: Some(0o600), size_bytes: Some(4096), atime_ns: Some(-3), ..SetAttr::default() };
    let attrs = ns.set_attr(f.id, &change, 9).unwrap();
    assert_eq!((attrs.mode, attrs.uid, attrs.size_bytes), (0o600, 1000, 4096));
    assert_eq!((attrs.atime_ns, attrs.mtime_ns, attrs.ctime_ns), (-3, 9, 9));
    assert_eq!(ns.get(f.id).unwrap().attrs, attrs);

    let size = SetAttr { size_bytes: Some(1), ..SetAttr::default() };
    assert_eq!(ns.set_attr(ROOT_ID, &size, 10).unwrap_err().errno(), EISDIR);
    assert_eq!(ns.set_attr(12345, &size, 10).unwrap_err().errno(), ENOENT);
    let mode = SetAttr { mode: Some(0o100644), ..SetAttr::default() };
    assert_eq!(ns.set_attr(f.id, &mode, 10).unwrap_err().errno(), EINVAL);
}

#[test]
fn readdir_pages_in_name_order() {
    let (_dir, _path, ns) = fresh();
    for name in ["c", "a", "b", "aa"] {
        ns.mkdir(&format!("/{name}"), OWNER, 0).unwrap();
    }
    ns.mkdir("/a/inner", OWNER, 0).unwrap();
    assert_eq!(names(&ns, "/"), vec!["a", "aa", "b", "c"]);
    let page = ns.readdir_page("/", Some(b"aa".as_slice()), 1).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].name, b"b");
    assert_eq!(page[0].kind, FileKind::Directory);
    assert!(ns.readdir_page("/", Some(b"c".as_slice()), 10).unwrap().is_empty());
    ns.create_file("/f", &spec(1), &live(1), 0).unwrap();
    assert_eq!(ns.readdir("/f").unwrap_err().errno(), ENOTDIR);
}

#[test]
fn targets_are_listed_in_id_order_and_updated() {
    let (_dir, _path, ns) = fresh();
    ns.record_target(TargetId(7), "b:1", 1, 2).unwrap();
    ns.record_target(TargetId(3), "a:1", 3, 4).unwrap();
    ns.record_target(TargetId(7), "b:2", 5, 6).unwrap();
    let targets = ns.targets().unwrap();
    assert_eq!(targets.len(), 2);
    assert_eq!(targets[0].target, TargetId(3));
    assert_eq!((targets[1].server_addr.as_str(), targets[1].used_bytes), ("b:2", 5));
    let long = "x".repeat(SERVER_ADDR_BYTES_MAX + 1);
    assert_eq!(ns.record_target(TargetId(1), &long, 0, 0).unwrap_err().errno(), EINVAL);
}

#[test]
fn a_damaged_record_is_reported_not_trusted() {
    // Phase 1: create a file, then overwrite its inode record behind the namespace's back.
    let (_dir, path, ns) = fresh();
    ns.create_file("/f", &spec(1), &live(1), 0).unwrap();
    drop(ns);
    let inodes: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("inodes_by_seq");
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        use redb::ReadableTable;
        let mut table = txn.open_table(inodes).unwrap();
        // The file is the newest inode: the last sequence number.
        let seq = table.last().unwrap().unwrap().0.value();
        table.insert(seq, &[1u8, 2, 3][..]).unwrap();
    }
    txn.commit().unwrap();
    drop(db);

    // Phase 2: every path to that record reports corruption as EIO.
    let ns = Namespace::open(&path).unwrap();
    let err = ns.lookup("/f").unwrap_err();
    assert!(matches!(err, NamespaceError::Corrupt { .. }), "{err}");
    assert_eq!(err.errno(), EIO);
    assert_eq!(ns.readdir("/").unwrap_err().errno(), EIO);
    assert_eq!(ns.unlink("/f", 1).unwrap_err().errno(), EIO);
}

#[test]
fn an_unknown_schema_version_is_refused() {
    let (_dir, path, ns) = fresh();
    drop(ns);
    let counters: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("counters");
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(counters).unwrap().insert("schema_version", 4).unwrap();
    txn.commit().unwrap();
    drop(db);
    assert_eq!(
        Namespace::open(&path).unwrap_err(),
        NamespaceError::UnsupportedFormat { found: 4, supported: 3 }
    );
}

/// A version 1 database (no `dir_parents` table) is migrated on open: the parents of its
/// directories are found again, so renames by directory id still refuse cycles.
const COUNTERS: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("counters");
const INODES: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("inodes");
const INODES_BY_SEQ: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("inodes_by_seq");
const PARENTS: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("dir_parents");
const PARENTS_BY_SEQ: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("dir_parents_by_seq");
const KEYS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("keys");

/// Turns a database this build wrote into what version 2 wrote: every inode under its id in
/// `inodes`, every directory's parent under its id in `dir_parents`, no key, no sequence
/// counter, no version 3 tables. `created` are the ids of every inode but the root, in the
/// order they were created (sequence numbers grow with it).
fn downgrade_to_v2(path: &std::path::Path, created: &[u64]) {
    use redb::{ReadableTable, ReadableTableMetadata};
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let by_seq = txn.open_table(INODES_BY_SEQ).unwrap();
        let mut inodes = txn.open_table(INODES).unwrap();
        assert!(inodes.is_empty().unwrap());
        let mut id_of = std::collections::HashMap::new();
        let rows: Vec<(u64, Vec<u8>)> = by_seq
            .iter()
            .unwrap()
            .map(|item| item.unwrap())
            .map(|(k, v)| (k.value(), v.value().to_vec()))
            .collect();
        assert_eq!(rows.len(), 1 + created.len());
        for ((seq, record), id) in rows.iter().zip(std::iter::once(ROOT_ID).chain(created.iter().copied())) {
            inodes.insert(id, record.as_slice()).unwrap();
            id_of.insert(*seq, id);
        }
        let parents_by_seq = txn.open_table(PARENTS_BY_SEQ).unwrap();
        let mut parents = txn.open_table(PARENTS).unwrap();
        for item in parents_by_seq.iter().unwrap() {
            let (seq, parent) = item.unwrap();
            parents.insert(id_of[&seq.value()], parent.value()).unwrap();
        }
        txn.open_table(COUNTERS).unwrap().remove("inode_seq").unwrap().unwrap();
        txn.open_table(COUNTERS).unwrap().insert("schema_version", 2).unwrap();
    }
    assert!(txn.delete_table(INODES_BY_SEQ).unwrap());
    assert!(txn.delete_table(PARENTS_BY_SEQ).unwrap());
    assert!(txn.delete_table(KEYS).unwrap());
    txn.commit().unwrap();
}

fn schema_version(path: &std::path::Path) -> u64 {
    let db = redb::Database::open(path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let version = txn.open_table(COUNTERS).unwrap().get("schema_version").unwrap().unwrap().value();
    version
}

#[test]
fn a_version_1_database_is_migrated() {
    let (_dir, path, ns) = fresh();
    let owner = flotilla_namespace::Owner { mode: 0o755, uid: 0, gid: 0 };
    let a = ns.mkdir("/a", owner, 1).unwrap();
    let b = ns.mkdir("/a/b", owner, 1).unwrap();
    let c0 = ns.mkdir("/a/b/c", owner, 1).unwrap();
    drop(ns);
    downgrade_to_v2(&path, &[a.id, b.id, c0.id]);
    // Turn it into what version 1 wrote: UTF-8 names in `dirents`, no `dir_parents`.
    let entries: redb::TableDefinition<(u64, &[u8]), u64> = redb::TableDefinition::new("entries");
    let dirents_v1: redb::TableDefinition<(u64, &str), u64> = redb::TableDefinition::new("dirents");
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        use redb::ReadableTable;
        let new = txn.open_table(entries).unwrap();
        let mut old = txn.open_table(dirents_v1).unwrap();
        for item in new.iter().unwrap() {
            let (key, child) = item.unwrap();
            let (parent, name) = key.value();
            old.insert((parent, std::str::from_utf8(name).unwrap()), child.value()).unwrap();
        }
    }
    assert!(txn.delete_table(entries).unwrap());
    assert!(txn.delete_table(PARENTS).unwrap());
    txn.open_table(COUNTERS).unwrap().insert("schema_version", 1).unwrap();
    txn.commit().unwrap();
    drop(db);

    let ns = Namespace::open(&path).unwrap();
    let root = flotilla_types::Caller::root();
    let into_own_subtree = ns.rename_in(
        &root,
        flotilla_namespace::Place::At { parent: 1, name: b"a" },
        flotilla_namespace::Place::At { parent: b.id, name: b"a2" },
        &|_| false,
        2,
    );
    assert_eq!(into_own_subtree.unwrap_err().errno(), flotilla_namespace::EINVAL);
    let c = ns.lookup("/a/b/c").unwrap();
    assert_eq!(c.id, c0.id);
    ns.rename_in(
        &root,
        flotilla_namespace::Place::At { parent: b.id, name: b"c" },
        flotilla_namespace::Place::At { parent: 1, name: b"c" },
        &|_| false,
        3,
    )
    .unwrap();
    assert_eq!(ns.lookup_at(&root, 1, b"c").unwrap().id, c.id);
    assert_eq!(ns.lookup("/a").unwrap().id, a.id);
    drop(ns);
    assert_eq!(schema_version(&path), 3, "migrated through version 2 to 3");
    let db = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    assert_eq!(txn.open_table(PARENTS).unwrap().get(c.id).unwrap().unwrap().value(), 1);
    assert_eq!(txn.open_table(entries).unwrap().get((1, b"a".as_slice())).unwrap().unwrap().value(), a.id);
    assert!(txn.open_table(dirents_v1).is_err(), "the version 1 table is gone");
}

#[test]
fn a_version_2_database_is_migrated_and_keeps_every_id() {
    let (_dir, path, ns) = fresh();
    let dir_owner = Owner { mode: 0o755, uid: 0, gid: 0 };
    let a = ns.mkdir("/a", dir_owner, 1).unwrap();
    let b = ns.mkdir("/a/b", dir_owner, 1).unwrap();
    let f = ns.create_file("/a/f", &spec(2), &live(2), 1).unwrap();
    let g = ns.create_file("/a/b/g", &spec(1), &live(2), 1).unwrap();
    let s = ns.symlink("/s", "/a/f", OWNER, 1).unwrap();
    let linked = ns.link("/a/b/g", "/h", 1).unwrap();
    let before: Vec<Entry> = ["/", "/a", "/a/b", "/a/f", "/a/b/g", "/s", "/h"]
        .into_iter()
        .map(|path| ns.lookup(path).unwrap())
        .collect();
    drop(ns);
    downgrade_to_v2(&path, &[a.id, b.id, f.id, g.id, s.id]);
    assert_eq!(schema_version(&path), 2);

    let ns = Namespace::open(&path).unwrap();
    assert!(!ns.created());
    // Every old id and path finds what it found before, by path, by id and by (parent, name).
    for (path, entry) in ["/", "/a", "/a/b", "/a/f", "/a/b/g", "/s", "/h"].into_iter().zip(&before) {
        assert_eq!(&ns.lookup(path).unwrap(), entry, "{path}");
        assert_eq!(&ns.get(entry.id).unwrap(), entry, "{path}");
    }
    let root = flotilla_types::Caller::root();
    assert_eq!(ns.lookup_at(&root, a.id, b"f").unwrap().id, f.id);
    assert_eq!(ns.lookup_at(&root, b.id, b"g").unwrap().id, linked.id);
    assert_eq!(names(&ns, "/a"), vec!["b", "f"]);
    assert!(ns.directory_within(b.id, "/a").unwrap());

    // New inodes, in old directories and holding old ones, with ids unlike the old.
    let n = ns.mkdir("/a/b/n", dir_owner, 2).unwrap();
    let new_file = ns.create_file("/a/new", &spec(1), &live(2), 2).unwrap();
    for old in [ROOT_ID, a.id, b.id, f.id, g.id, s.id] {
        assert_ne!(n.id, old);
        assert_ne!(new_file.id, old);
    }
    assert_eq!(ns.inode_count().unwrap(), 8);
    assert_eq!(ns.lookup("/a").unwrap().attrs.size_bytes, 3);
    assert_eq!(ns.lookup("/a/b").unwrap().attrs.nlink, 3);
    // The ancestors of a new directory run through old ones (rename's cycle check).
    assert_eq!(ns.rename("/a", "/a/b/n/x", 3).unwrap_err().errno(), EINVAL);
    assert!(ns.directory_within(n.id, "/a").unwrap());
    // Old inodes change, move and go; so do new ones.
    let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
    assert_eq!(ns.set_attr(g.id, &chmod, 4).unwrap().mode, 0o600);
    ns.rename("/a/b", "/b", 4).unwrap();
    assert_eq!(ns.lookup("/b/g").unwrap().id, g.id);
    assert_eq!(ns.rename("/b", "/b/n/y", 4).unwrap_err().errno(), EINVAL);
    ns.rename("/a/new", "/b/n/moved", 4).unwrap();
    assert_eq!(ns.unlink("/a/f", 5).unwrap().unwrap().id, FileId(f.id));
    assert_eq!(ns.get(f.id).unwrap_err().errno(), ENOENT);
    assert_eq!(ns.pending_deletes(TargetId(10), 10).unwrap().len(), 1);
    assert_eq!(ns.unlink("/h", 5).unwrap(), None);
    assert_eq!(ns.get(g.id).unwrap().attrs.nlink, 1);
    ns.unlink("/s", 5).unwrap();
    assert_eq!(ns.get(s.id).unwrap_err().errno(), ENOENT);
    drop(ns);

    // After another reopen the mix of old and new inodes is still whole.
    let ns = Namespace::open(&path).unwrap();
    assert_eq!(ns.lookup("/b/n/moved").unwrap().id, new_file.id);
    assert_eq!(ns.get(n.id).unwrap().attrs.kind, FileKind::Directory);
    assert_eq!(ns.get(g.id).unwrap().attrs.mode, 0o600);
    assert_eq!(ns.get(f.id).unwrap_err().errno(), ENOENT);
    ns.unlink("/b/g", 6).unwrap();
    ns.rmdir("/a", 6).unwrap();
    assert_eq!(ns.get(a.id).unwrap_err().errno(), ENOENT);
    assert_eq!(names(&ns, "/"), vec!["b"]);
    assert_eq!(ns.inode_count().unwrap(), 4, "root, b, n, moved");
    drop(ns);
    assert_eq!(schema_version(&path), 3);
    let db = redb::Database::open(&path).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let legacy = txn.open_table(INODES).unwrap();
    assert!(legacy.get(ROOT_ID).unwrap().is_none(), "the root moved to sequence number 0");
    assert!(legacy.get(b.id).unwrap().is_some(), "an old inode stays under its id");
    assert!(txn.open_table(INODES_BY_SEQ).unwrap().get(0).unwrap().is_some());
    assert_eq!(txn.open_table(PARENTS).unwrap().get(b.id).unwrap().unwrap().value(), ROOT_ID);
}

#[test]
fn ids_look_unrelated_and_differ_between_databases() {
    let (_dir, _path, one) = fresh();
    let (_dir2, _path2, two) = fresh();
    let ids: Vec<u64> =
        (0..200).map(|i| one.create_file(&format!("/f{i}"), &spec(1), &live(1), 1).unwrap().id).collect();
    let rising = ids.windows(2).filter(|pair| pair[1] > pair[0]).count();
    assert!((50..=150).contains(&rising), "{rising} of 199 steps go up: not monotone");
    assert!(ids.windows(2).all(|pair| pair[0].abs_diff(pair[1]) > 1 << 32), "no consecutive ids");
    assert!(ids.iter().all(|id| *id > ROOT_ID));
    // The same creates in another database (another key) give other ids.
    let other: Vec<u64> =
        (0..200).map(|i| two.create_file(&format!("/f{i}"), &spec(1), &live(1), 1).unwrap().id).collect();
    assert!(ids.iter().zip(&other).all(|(a, b)| a != b));
    // An id no inode has (one more create's worth of guessing) is simply not found.
    for guess in [0, u64::MAX, ids[0] ^ 1, ids[199].wrapping_add(1), other[0]] {
        assert_eq!(one.get(guess).unwrap_err().errno(), ENOENT, "{guess:016x}");
    }
}
#[test]
fn grow_size_never_shrinks_and_layout_changes_only_when_empty() {
    let dir = tempfile::tempdir().unwrap();
    let ns = flotilla_namespace::Namespace::open(&dir.path().join("ns.redb")).unwrap();
    let live = [flotilla_namespace::TargetUsage {
        target: flotilla_types::TargetId(5),
        used_bytes: 1,
        free_bytes: 100,
    }];
    let spec = flotilla_namespace::CreateFile {
        owner: flotilla_namespace::Owner { mode: 0o644, uid: 0, gid: 0 },
        subfile_count: 1,
        targets: None,
        layout: None,
        exclusive: true,
    };
    let file = ns.create_file("/f", &spec, &live, 10).unwrap();
    let hash = Layout::Hash { block_bytes: 4096, sequentiality: 2, count: 0 };
    assert_eq!(ns.set_file_layout(file.id, hash, 11).unwrap().file.unwrap().layout, hash);
    assert_eq!(ns.grow_size(file.id, 500, 12, 12).unwrap().size_bytes, 500);
    assert_eq!(
        ns.grow_size(file.id, 100, 13, 13).unwrap().size_bytes,
        500,
        "a smaller size must not shrink the file"
    );
    assert!(ns.set_file_layout(file.id, Layout::Explicit, 14).is_err(), "a file with data keeps its layout");
    assert_eq!(ns.get(file.id).unwrap().file.unwrap().layout, hash);
}

#[test]
fn rename_no_replace_refuses_an_existing_target_and_changes_nothing() {
    let (_dir, _path, ns) = fresh();
    let a = ns.create_file("/a", &spec(1), &live(2), 1).unwrap();
    let b = ns.create_file("/b", &spec(1), &live(2), 2).unwrap();
    let error = ns.rename_no_replace("/a", "/b", 3).unwrap_err();
    assert!(matches!(error, NamespaceError::AlreadyExists { .. }), "{error}");
    assert_eq!(ns.lookup("/a").unwrap().id, a.id, "source untouched");
    assert_eq!(ns.lookup("/b").unwrap().id, b.id, "target untouched");

    ns.rename_no_replace("/a", "/c", 4).unwrap();
    assert_eq!(ns.lookup("/c").unwrap().id, a.id);
    assert!(matches!(ns.lookup("/a"), Err(NamespaceError::NotFound { .. })));
}

#[test]
fn unlink_id_removes_only_the_named_entry() {
    let (_dir, _path, ns) = fresh();
    let first = ns.create_file("/f", &spec(1), &live(1), 1).unwrap();
    ns.unlink("/f", 2).unwrap();
    let second = ns.create_file("/f", &spec(1), &live(1), 3).unwrap();
    let error = ns.unlink_id("/f", first.id, 4).unwrap_err();
    assert!(matches!(error, NamespaceError::NotFound { .. }), "{error}");
    assert_eq!(ns.lookup("/f").unwrap().id, second.id, "another file at the path is kept");
    ns.unlink_id("/f", second.id, 5).unwrap();
    assert!(matches!(ns.lookup("/f"), Err(NamespaceError::NotFound { .. })));
}

#[test]
fn an_open_file_that_loses_its_last_name_is_kept_until_released() {
    let (_dir, path, ns) = fresh();
    let file = ns.create_file("/tmpfile", &spec(2), &live(2), 1).unwrap();
    let open = |id: u64| id == file.id;

    // Phase: unlinked while open: the name goes, the inode and the data stay.
    assert_eq!(ns.unlink_keeping_open("/tmpfile", &open, 2).unwrap(), None);
    assert!(matches!(ns.lookup("/tmpfile"), Err(NamespaceError::NotFound { .. })));
    let orphan = ns.get(file.id).unwrap();
    assert_eq!(orphan.attrs.nlink, 0);
    assert!(ns.pending_deletes(TargetId(10), 10).unwrap().is_empty(), "nothing deleted while open");
    assert_eq!(ns.orphans(10).unwrap(), vec![file.id]);

    // Phase: the orphan survives a restart of the service.
    drop(ns);
    let ns = Namespace::open(&path).unwrap();
    assert_eq!(ns.orphans(10).unwrap(), vec![file.id]);

    // Phase: released (last close): inode gone, subfiles queued, released only once.
    assert!(ns.release_orphan(file.id).unwrap());
    assert!(!ns.release_orphan(file.id).unwrap());
    assert!(ns.get(file.id).is_err());
    let queued: usize = [10, 20].iter().map(|t| ns.pending_deletes(TargetId(*t), 10).unwrap().len()).sum();
    assert_eq!(queued, 2, "both subfiles queued for deletion");
}

#[test]
fn a_file_renamed_over_while_open_is_kept_and_a_closed_one_is_not() {
    let (_dir, _path, ns) = fresh();
    let old = ns.create_file("/old", &spec(1), &live(1), 1).unwrap();
    ns.create_file("/new", &spec(1), &live(1), 2).unwrap();
    let open = |id: u64| id == old.id;
    assert_eq!(ns.rename_keeping_open("/new", "/old", &open, 3).unwrap(), None);
    assert_eq!(ns.get(old.id).unwrap().attrs.nlink, 0, "replaced file kept for its open handle");
    assert_eq!(ns.orphans(10).unwrap(), vec![old.id]);

    let other = ns.create_file("/x", &spec(1), &live(1), 4).unwrap();
    let replaced = ns.rename_keeping_open("/old", "/x", &open, 5).unwrap();
    assert_eq!(replaced.map(|r| r.id.0), Some(other.id), "a file nobody has open is deleted");
}

/// The operations addressed by (directory id, name): special files, hard links across
/// directories, RENAME_EXCHANGE (files and directories), and listing by id.
#[test]
fn id_addressed_operations() {
    use flotilla_namespace::Place::At;
    use flotilla_types::{Caller, FileKind};
    let (_dir, _path, ns) = fresh();
    let root = Caller::root();
    let owner = flotilla_namespace::Owner { mode: 0o755, uid: 0, gid: 0 };
    let q1 = ns.mkdir_in(&root, At { parent: 1, name: b"q1" }, owner, 1).unwrap();
    let other = ns.mkdir_in(&root, At { parent: 1, name: b"other" }, owner, 1).unwrap();
    let fifo = ns.mknod_in(&root, At { parent: q1.id, name: b"p" }, FileKind::Fifo, 0, owner, 2).unwrap();
    let dev = ns
        .mknod_in(&root, At { parent: q1.id, name: b"d" }, FileKind::BlockDevice, 0x0801, owner, 2)
        .unwrap();
    assert_eq!(ns.get(dev.id).unwrap().attrs.rdev, 0x0801);
    assert_eq!(ns.get(fifo.id).unwrap().kind(), FileKind::Fifo);
    let bad = ns.mknod_in(&root, At { parent: q1.id, name: b"x" }, FileKind::Fifo, 7, owner, 2);
    assert_eq!(bad.unwrap_err().errno(), flotilla_namespace::EINVAL);

    // A hard link into another directory, by the entry's id.
    let linked = ns.link_in(&root, fifo.id, At { parent: other.id, name: b"p2" }, 3).unwrap();
    assert_eq!(linked.attrs.nlink, 2);
    assert_eq!(ns.lookup("/other/p2").unwrap().id, fifo.id);

    // Rename q1 away and make a new q1: the old directory's id still names the old one.
    ns.rename_in(&root, At { parent: 1, name: b"q1" }, At { parent: 1, name: b"q2" }, &|_| false, 4).unwrap();
    let new_q1 = ns.mkdir_in(&root, At { parent: 1, name: b"q1" }, owner, 5).unwrap();
    assert_ne!(new_q1.id, q1.id);
    assert_eq!(ns.lookup_at(&root, q1.id, b"p").unwrap().id, fifo.id);
    assert!(ns.readdir_page_id(&root, new_q1.id, None, 10).unwrap().is_empty());
    let listed: Vec<String> =
        ns.readdir_page_id(&root, q1.id, None, 10).unwrap().into_iter().map(|e| e.name_lossy()).collect();
    assert_eq!(listed, ["d", "p"]);

    // Exchange a directory with a file in another directory; nlinks follow.
    ns.exchange_in(&root, At { parent: 1, name: b"q1" }, At { parent: other.id, name: b"p2" }, 6).unwrap();
    assert_eq!(ns.lookup("/q1").unwrap().id, fifo.id);
    assert_eq!(ns.lookup("/other/p2").unwrap().id, new_q1.id);
    assert_eq!(ns.get(other.id).unwrap().attrs.nlink, 3);
    let exchanged_into_itself =
        ns.exchange_in(&root, At { parent: 1, name: b"other" }, At { parent: other.id, name: b"p2" }, 7);
    assert_eq!(exchanged_into_itself.unwrap_err().errno(), flotilla_namespace::EINVAL);
    let no_replace =
        ns.rename_no_replace_in(&root, At { parent: 1, name: b"q2" }, At { parent: 1, name: b"q1" }, 8);
    assert_eq!(no_replace.unwrap_err().errno(), flotilla_namespace::EEXIST);
    // Names are bytes: one that is not UTF-8 is kept and listed as it is.
    let raw =
        ns.mknod_in(&root, At { parent: q1.id, name: b"\xff\xfe" }, FileKind::Socket, 0, owner, 9).unwrap();
    assert_eq!(ns.lookup_at(&root, q1.id, b"\xff\xfe").unwrap().id, raw.id);
    let page = ns.readdir_page_id(&root, q1.id, Some(b"p".as_slice()), 10).unwrap();
    assert_eq!(page.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), [b"\xff\xfe".to_vec()]);
    // A name that is not a single component is refused.
    let slash = ns.lookup_at(&root, 1, b"a/b");
    assert_eq!(slash.unwrap_err().errno(), flotilla_namespace::EINVAL);
}

/// Issue 31: a layout change (path or id form) needs search permission along the path and
/// the entry's owner (or root), as chmod does; so do an undo-create unlink and an atime
/// other than now.
#[test]
fn layout_changes_need_the_owner_and_a_searchable_path() {
    use flotilla_types::Caller;
    let (_dir, _path, ns) = fresh();
    let nobody = Caller { uid: 65534, gid: 65534, groups: Vec::new() };
    let root_owned = Owner { mode: 0o700, uid: 0, gid: 0 };
    ns.mkdir("/secret", root_owned, 1).unwrap();
    ns.mkdir("/secret/inner", Owner { uid: 65534, gid: 65534, ..root_owned }, 1).unwrap();
    let private = CreateFile { owner: Owner { mode: 0o600, uid: 0, gid: 0 }, ..spec(1) };
    let file = ns.create_file("/private", &private, &live(1), 1).unwrap();
    ns.mkdir("/mine", Owner { mode: 0o755, uid: 65534, gid: 65534 }, 1).unwrap();
    let stripe = Layout::Stripe { unit_bytes: 1 << 16, count: 1 };
    let tiny = Some(stripe);

    for path in ["/", "/secret", "/private"] {
        let refused = ns.set_layout_as(&nobody, LayoutOf::Path(path), tiny, 2).unwrap_err();
        assert_eq!(refused.errno(), EPERM, "{path}: {refused}");
    }
    let unsearchable = ns.set_layout_as(&nobody, LayoutOf::Path("/secret/inner"), tiny, 2).unwrap_err();
    assert_eq!(unsearchable.errno(), EACCES, "{unsearchable}");
    let by_id = ns.set_layout_as(&nobody, LayoutOf::Id(file.id), tiny, 2).unwrap_err();
    assert_eq!(by_id.errno(), EPERM, "{by_id}");
    assert_eq!(ns.lookup("/").unwrap().default_layout, None, "nothing changed");

    let mine = ns.set_layout_as(&nobody, LayoutOf::Path("/mine"), tiny, 3).unwrap();
    assert_eq!(mine.default_layout, tiny);
    let by_root = ns.set_layout_as(&Caller::root(), LayoutOf::Id(file.id), tiny, 3).unwrap();
    assert_eq!(by_root.file.unwrap().layout, stripe);
    let cleared = ns.set_layout_as(&Caller::root(), LayoutOf::Path("/private"), None, 3).unwrap_err();
    assert_eq!(cleared.errno(), EINVAL, "{cleared}");

    let unlink = ns.unlink_id_as(&nobody, "/private", file.id, 4).unwrap_err();
    assert_eq!(unlink.errno(), EACCES, "{unlink}");
    let back = ns.touch_atime_as(&nobody, file.id, 5, 1_000_000_000_000).unwrap_err();
    assert_eq!(back.errno(), EPERM, "{back}");
    assert!(ns.lookup("/private").is_ok());
}

/// Resync (issue 32): the subfiles of one chain, found page by page over every inode.
#[test]
fn a_chains_subfiles_are_listed_page_by_page() {
    let (_dir, _path, ns) = fresh();
    let root = flotilla_types::Caller::root();
    let stripe = |count| Some(Layout::Stripe { unit_bytes: 65536, count });
    let mut wanted = Vec::new();
    for index in 0..10u32 {
        let name = format!("/f{index}");
        let spec = CreateFile { layout: stripe(2), ..spec(2) };
        // Chain 7 holds subfile (index % 2) of every file; the other subfile is on 8 or 9.
        let other = 8 + index % 2;
        let chains = match index % 2 {
            0 => [(7, TargetId(1)), (other, TargetId(2))],
            _ => [(other, TargetId(2)), (7, TargetId(1))],
        };
        let entry = ns.create_file_chained_in(&root, Place::Path(&name), &spec, 2, &chains, 1).unwrap();
        wanted.push((entry.id, index % 2));
    }
    ns.create_file("/plain", &spec(1), &live(3), 1).unwrap();
    ns.mkdir("/dir", OWNER, 1).unwrap();
    let (mut found, mut after, mut pages) = (Vec::new(), 0, 0);
    loop {
        let page = ns.chain_subfiles(7, after, 3).unwrap();
        assert!(page.subfiles.len() <= 3, "a page scans at most 3 inodes");
        found.extend(page.subfiles);
        pages += 1;
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(found, wanted);
    assert!(pages >= 4, "12 inodes in pages of 3: {pages} pages");
    let nine = ns.chain_subfiles(9, 0, 4096).unwrap();
    assert_eq!(nine.subfiles.len(), 5);
    assert!(nine.subfiles.iter().all(|&(_, subfile)| subfile == 0), "odd files have chain 9 first");
    assert_eq!(ns.chain_subfiles(42, 0, 4096).unwrap(), ChainSubfilesPage::default());
}
