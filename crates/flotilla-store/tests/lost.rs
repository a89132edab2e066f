//! A target knows what it held (issue 31, item 3) and a refused size change changes nothing
//! (item 7): lost content directories, missing fork and checksum files, the upgrade of a
//! format version 2 target, and Extend/Truncate past what the disk can hold.

mod common;

use common::*;
use flotilla_store::{Extent, Store, StoreConfig, StoreError, Target, TargetSpec};
use std::path::Path;

const KIB: usize = 1024;

/// A store on one `dir` target in `dir` (whatever `FLOTILLA_TEST_TARGET_KIND` says).
fn dir_config(dir: &Path) -> StoreConfig {
    let mut config = StoreConfig::new(vec![dir.to_path_buf()], true);
    config.block_bytes = 4096;
    config.cache_capacity_bytes = 64 * 4096;
    config
}

/// Writes 64 KiB to the test fork and makes it durable; returns the data.
fn write_synced(store: &Store, target: flotilla_types::TargetId) -> Vec<u8> {
    let data = pattern(64 * KIB, 7);
    store.write(&data_fork(target), &[Extent::new(0, data.len() as u64)], &data).unwrap();
    store.sync(&data_fork(target)).unwrap();
    data
}

fn read_error(store: &Store, target: flotilla_types::TargetId) -> StoreError {
    let mut out = vec![0u8; 4096];
    store.read(&data_fork(target), &[Extent::new(0, 4096)], &mut out).expect_err("read succeeded")
}

#[test]
fn lost_content_directories_make_a_lost_target_until_the_loss_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    write_synced(&store, target);
    drop(store);
    std::fs::remove_dir_all(dir.path().join("subfiles")).unwrap();
    std::fs::remove_dir_all(dir.path().join("checksums")).unwrap();

    let store = Store::open(dir_config(dir.path())).unwrap();
    assert!(store.target_lost(target).unwrap().is_some_and(|why| why.contains("subfiles/")));
    let error = read_error(&store, target);
    assert!(matches!(error, StoreError::TargetLost { target: t, .. } if t == target), "{error}");
    assert!(error.to_string().contains(&target.to_string()), "{error}");
    assert!(matches!(store.create_subfile(target, FILE, SUBFILE), Err(StoreError::TargetLost { .. })));
    assert!(store.usage(target).is_ok(), "a lost target still reports its usage");
    drop(store);
    // Still lost after another restart: nothing was recreated behind the operator's back.
    let store = Store::open(dir_config(dir.path())).unwrap();
    assert!(store.target_lost(target).unwrap().is_some());
    drop(store);

    let spec = TargetSpec::parse(dir.path()).unwrap();
    assert_eq!(Target::accept_loss(&spec).unwrap(), target);
    let error = Target::accept_loss(&spec).expect_err("a whole target was 'repaired'");
    assert!(error.to_string().contains("has not lost its contents"), "{error}");
    let (store, _) = open_with_subfile(dir_config(dir.path()));
    assert_eq!(store.target_lost(target).unwrap(), None);
    assert_eq!(
        read_range(&store, &data_fork(target), 0, 4096),
        vec![0; 4096],
        "accepted loss reads as zeros"
    );
}

#[test]
fn an_emptied_content_directory_is_a_loss_too() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    write_synced(&store, target);
    drop(store);
    let checksums = dir.path().join("checksums");
    std::fs::remove_dir_all(&checksums).unwrap();
    std::fs::create_dir(&checksums).unwrap();
    let store = Store::open(dir_config(dir.path())).unwrap();
    let why = store.target_lost(target).unwrap().expect("lost");
    assert!(why.contains("checksums/ has no marker"), "{why}");
}

#[test]
fn a_missing_checksum_or_fork_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    write_synced(&store, target);
    let index = flotilla_store::ForkRef::new(target, FILE, SUBFILE, "index");
    store.create_fork(&index).unwrap();
    store.write(&index, &[Extent::new(0, 10)], b"0123456789").unwrap();
    store.sync(&index).unwrap();
    drop(store);
    let subfile = format!("{:016x}.{}", FILE.0, SUBFILE.0);
    let checksum_file = dir.path().join("checksums").join(&subfile).join("data");
    std::fs::remove_file(&checksum_file).unwrap();
    let fork_file = dir.path().join("subfiles").join(&subfile).join("index");
    std::fs::remove_file(&fork_file).unwrap();

    let store = Store::open(dir_config(dir.path())).unwrap();
    assert_eq!(store.target_lost(target).unwrap(), None, "one fork's files are not the whole disk");
    let error = read_error(&store, target);
    assert!(matches!(&error, StoreError::ForkFileMissing { path, .. } if *path == checksum_file), "{error}");
    assert!(error.to_string().contains(&target.to_string()), "{error}");
    let mut out = vec![0u8; 10];
    let error = store.read(&index, &[Extent::new(0, 10)], &mut out).expect_err("read of a lost fork file");
    assert!(matches!(&error, StoreError::ForkFileMissing { path, .. } if *path == fork_file), "{error}");
    // Removing the damaged fork works, and a never-created fork is still just unknown.
    store.remove_fork(&index).unwrap();
    let never = flotilla_store::ForkRef::new(target, FILE, SUBFILE, "never");
    assert!(matches!(store.fork_size(&never), Err(StoreError::UnknownFork { .. })));
}

#[test]
fn an_empty_fork_without_its_checksum_file_gets_one_and_sparse_forks_read_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    drop(store);
    let subfile = format!("{:016x}.{}", FILE.0, SUBFILE.0);
    // A crash between creating the fork file and its checksum file.
    std::fs::remove_file(dir.path().join("checksums").join(&subfile).join("data")).unwrap();
    let store = Store::open(dir_config(dir.path())).unwrap();
    assert_eq!(read_range(&store, &data_fork(target), 0, 100), vec![0; 100]);
    // A sparse fork: written far out only, its hole reads as zeros; so does an unused subfile.
    store.write(&data_fork(target), &[Extent::new(1 << 30, 10)], b"0123456789").unwrap();
    store.sync(&data_fork(target)).unwrap();
    drop(store);
    let store = Store::open(dir_config(dir.path())).unwrap();
    assert_eq!(read_range(&store, &data_fork(target), 1 << 20, 4096), vec![0; 4096]);
    assert_eq!(read_range(&store, &data_fork(target), 1 << 30, 10), b"0123456789");
}

#[test]
fn a_version_2_target_in_use_is_upgraded_and_an_unused_one_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    let data = write_synced(&store, target);
    drop(store);
    let make_version_2 = |dir: &Path| {
        let id_file = dir.join("flotilla-target");
        let text =
            std::fs::read_to_string(&id_file).unwrap().replace("format_version = 3", "format_version = 2");
        std::fs::write(&id_file, text).unwrap();
        for content in ["subfiles", "checksums"] {
            let marker = dir.join(content).join(format!("flotilla-content-{target}"));
            std::fs::remove_dir(marker).unwrap();
        }
    };
    make_version_2(dir.path());
    let store = Store::open(dir_config(dir.path())).unwrap();
    assert_eq!(store.target_lost(target).unwrap(), None);
    assert_eq!(read_range(&store, &data_fork(target), 0, data.len()), data);
    drop(store);
    let id_file = std::fs::read_to_string(dir.path().join("flotilla-target")).unwrap();
    assert!(id_file.contains("format_version = 3"), "{id_file}");

    // A version 2 target whose subfiles/ is gone cannot be told from an unused one: lost.
    make_version_2(dir.path());
    std::fs::remove_dir_all(dir.path().join("subfiles")).unwrap();
    let store = Store::open(dir_config(dir.path())).unwrap();
    assert!(store.target_lost(target).unwrap().is_some_and(|why| why.contains("format version 2")));
}

/// Item 7: an Extend or growing Truncate the disk cannot hold is refused and leaves the
/// fork's size (in memory and on disk) as it was.
#[test]
fn a_refused_extend_or_truncate_leaves_the_size_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(dir_config(dir.path()));
    let data = write_synced(&store, target);
    let fork = data_fork(target);
    let huge = 1u64 << 50;
    let error = store.truncate(&fork, huge).expect_err("a 1 PiB truncate was accepted");
    assert!(matches!(error, StoreError::TargetFull { .. } | StoreError::Io { .. }), "{error}");
    assert_eq!(store.fork_size(&fork).unwrap(), data.len() as u64, "truncate left the size changed");
    store.extend(&fork, huge).expect_err("a 1 PiB extend was accepted");
    assert_eq!(store.fork_size(&fork).unwrap(), data.len() as u64, "extend left the size changed");
    assert_eq!(read_range(&store, &fork, 0, data.len()), data);
    let path = dir.path().join(format!("subfiles/{:016x}.{}/data", FILE.0, SUBFILE.0));
    store.sync(&fork).unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), data.len() as u64);
    // A write after the refusals lands where it should, and a small growth still works.
    store.truncate(&fork, 100 * KIB as u64).unwrap();
    assert_eq!(store.fork_size(&fork).unwrap(), 100 * KIB as u64);
}
