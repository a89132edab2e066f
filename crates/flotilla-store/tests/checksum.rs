//! On-disk checksums on real files: corruption behind the store's back is caught right after
//! the read, named, counted and never returned; holes, truncation and growth keep checksums
//! right across reopening.

mod common;

use common::*;
use flotilla_store::{Extent, Store, StoreConfig, StoreError};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

const KIB: usize = 1024;

/// Writes `data` at `offset`, syncs, and closes the store.
fn write_synced(config: &StoreConfig, offset: u64, data: &[u8]) {
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(offset, data.len() as u64)], data).unwrap();
    store.sync(&fork).unwrap();
}

fn flip_byte(dir: &std::path::Path, offset: u64) {
    let path = dir.join("subfiles/00000000000000ab.3/data");
    let file = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x20], offset).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn a_corrupt_byte_on_disk_is_a_named_counted_error_and_other_blocks_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    let data = pattern(40 * KIB, 7);
    write_synced(&config, 0, &data);
    flip_byte(dir.path(), 9 * 1024 + 17);

    let store = Store::open(StoreConfig { init: false, ..config }).unwrap();
    let target = store.target_ids()[0];
    let fork = data_fork(target);
    let mut out = vec![0u8; 4 * KIB];
    let error = store.read(&fork, &[Extent::new(8 * 1024, 4 * 1024)], &mut out).unwrap_err();
    match &error {
        StoreError::ChecksumMismatch { target: named, file, subfile, fork, offset, .. } => {
            assert_eq!(
                (*named, *file, *subfile, fork.as_str(), *offset),
                (target, FILE, SUBFILE, "data", 8192)
            );
        }
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    let message = error.to_string();
    for part in [target.to_string(), FILE.to_string(), "\"data\"".into(), "offset 8192".into()] {
        assert!(message.contains(&part), "{message:?} does not name {part:?}");
    }
    assert_ne!(&out[..], &data[8 * KIB..12 * KIB], "corrupt data was returned");
    assert_eq!(store.stats().checksum_errors, 1);

    // Every other block still reads, before and after the bad one.
    assert_eq!(read_range(&store, &fork, 0, 8 * KIB), data[..8 * KIB]);
    assert_eq!(read_range(&store, &fork, 12 * 1024, 28 * KIB), data[12 * KIB..]);
    // The bad block keeps failing (it is not cached as good data).
    assert!(store.read(&fork, &[Extent::new(9 * 1024, 10)], &mut [0u8; 10]).is_err());
    assert!(store.stats().checksum_errors >= 2);
}

#[test]
fn holes_read_as_zeros_and_a_corrupted_hole_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    write_synced(&config, 20 * 1024, &pattern(4 * KIB, 3));
    {
        let store = Store::open(StoreConfig { init: false, ..config.clone() }).unwrap();
        let fork = data_fork(store.target_ids()[0]);
        assert_eq!(read_range(&store, &fork, 0, 20 * KIB), vec![0u8; 20 * KIB]);
        assert_eq!(read_range(&store, &fork, 20 * 1024, 4 * KIB), pattern(4 * KIB, 3));
        assert_eq!(store.stats().checksum_errors, 0);
    }
    // Bytes appearing in a never-written block fail: its entry says "unwritten" (zeros).
    flip_byte(dir.path(), 5000);
    let store = Store::open(StoreConfig { init: false, ..config }).unwrap();
    let fork = data_fork(store.target_ids()[0]);
    let mut out = vec![0u8; 4 * KIB];
    let error = store.read(&fork, &[Extent::new(4096, 4096)], &mut out).unwrap_err();
    assert!(matches!(error, StoreError::ChecksumMismatch { offset: 4096, .. }), "{error:?}");
}

#[test]
fn truncate_and_growth_keep_checksums_right_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    let data = pattern(30 * KIB, 9);
    write_synced(&config, 0, &data);
    let reopen = || Store::open(StoreConfig { init: false, ..config.clone() }).unwrap();
    {
        let store = reopen();
        let fork = data_fork(store.target_ids()[0]);
        store.truncate(&fork, 10_000).unwrap();
        store.sync(&fork).unwrap();
    }
    {
        let store = reopen();
        let fork = data_fork(store.target_ids()[0]);
        assert_eq!(store.fork_size(&fork).unwrap(), 10_000);
        assert_eq!(read_range(&store, &fork, 0, 12 * KIB)[..10_000], data[..10_000]);
        store.truncate(&fork, 50_000).unwrap();
        store.extend(&fork, 60_000).unwrap();
        store.sync(&fork).unwrap();
    }
    let store = reopen();
    let fork = data_fork(store.target_ids()[0]);
    let mut expected = data[..10_000].to_vec();
    expected.resize(60_000, 0);
    assert_eq!(read_range(&store, &fork, 0, 60_000), expected);
    assert_eq!(store.stats().checksum_errors, 0);
}

#[test]
fn sync_many_makes_every_fork_durable_and_checksummed() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 64);
    let names = ["data", "a", "b", "c"];
    {
        let (store, target) = open_with_subfile(config.clone());
        let forks: Vec<_> =
            names.iter().map(|name| flotilla_store::ForkRef::new(target, FILE, SUBFILE, name)).collect();
        for (index, fork) in forks.iter().enumerate().skip(1) {
            store.create_fork(fork).unwrap();
            store.write(fork, &[Extent::new(0, 9000)], &pattern(9000, index as u64)).unwrap();
        }
        store.write(&forks[0], &[Extent::new(0, 9000)], &pattern(9000, 0)).unwrap();
        let syncs_before = store.stats().disk_syncs;
        store.sync_many(&forks).unwrap();
        assert_eq!(store.stats().disk_syncs - syncs_before, 4);
        assert_eq!(store.stats().dirty_bytes, 0);
        std::mem::forget(store); // no flush on drop: only sync_many made it durable
    }
    let store = Store::open(StoreConfig { init: false, ..config }).unwrap();
    let target = store.target_ids()[0];
    for (index, name) in names.iter().enumerate() {
        let fork = flotilla_store::ForkRef::new(target, FILE, SUBFILE, name);
        assert_eq!(read_range(&store, &fork, 0, 9000), pattern(9000, index as u64), "fork {name}");
        let entries =
            std::fs::metadata(dir.path().join(format!("checksums/00000000000000ab.3/{name}"))).unwrap();
        assert_eq!(entries.len(), 3 * 4, "fork {name}: one 4-byte entry per 4 KiB block");
    }
}

#[test]
fn version_1_targets_and_mismatched_block_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    drop(Store::open(config.clone()).unwrap());
    let small = config_with_block(&config, 2048);
    let error = Store::open(small).unwrap_err();
    assert!(matches!(error, StoreError::BadConfig { name: "block_bytes", .. }), "{error:?}");
    std::fs::write(
        dir.path().join("flotilla-target"),
        "format_version = 1\ntarget_id = \"00000000000000aa\"\n",
    )
    .unwrap();
    let error = Store::open(config).unwrap_err();
    assert!(error.to_string().contains("without checksums"), "{error}");
}

fn config_with_block(config: &StoreConfig, block_bytes: u64) -> StoreConfig {
    StoreConfig { block_bytes, cache_capacity_bytes: 16 * block_bytes, ..config.clone() }
}

#[test]
fn a_growing_write_reserves_its_checksum_entries_before_it_is_acknowledged() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 9000)], &pattern(9000, 1)).unwrap();
    let checksums = std::fs::metadata(dir.path().join("checksums/00000000000000ab.3/data")).unwrap();
    assert_eq!(checksums.len(), 0, "nothing written back yet");
    assert!(checksums.blocks() > 0, "no space reserved for the checksum entries");
}

#[test]
fn sync_many_accepts_a_fork_named_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 100)], &pattern(100, 4)).unwrap();
    store.sync_many(&[fork, fork]).unwrap();
    assert_eq!(store.stats().dirty_bytes, 0);
    assert_eq!(store.stats().disk_syncs, 1);
}

/// `config` with bulk pieces from one 4 KiB block (`bulk_bytes_min`).
fn bulk_config(dir: &std::path::Path) -> StoreConfig {
    StoreConfig { bulk_bytes_min: 4096, ..config(dir, 4 * KIB, 16) }
}

#[test]
fn bulk_written_blocks_carry_right_checksums_and_are_durable_after_sync() {
    let dir = tempfile::tempdir().unwrap();
    let config = bulk_config(dir.path());
    let data = pattern(40 * KIB + 300, 11);
    {
        let (store, target) = open_with_subfile(config.clone());
        let fork = data_fork(target);
        // Head (100..4096) and tail through the cache, 4096..40960 straight to the file.
        store.write(&fork, &[Extent::new(100, data.len() as u64)], &data).unwrap();
        let stats = store.stats();
        assert_eq!((stats.bulk_writes, stats.bulk_write_bytes), (1, 36 * KIB as u64));
        store.sync(&fork).unwrap();
        std::mem::forget(store); // no flush on drop: only the sync made it durable
    }
    // Read back through the cache alone: every entry the disk thread checks is right.
    let store = Store::open(StoreConfig { init: false, bulk_bytes_min: 0, ..config }).unwrap();
    let fork = data_fork(store.target_ids()[0]);
    assert_eq!(read_range(&store, &fork, 100, data.len()), data);
    assert_eq!(store.stats().checksum_errors, 0);
    let entries = std::fs::metadata(dir.path().join("checksums/00000000000000ab.3/data")).unwrap();
    assert_eq!(entries.len(), 11 * 4, "one entry per 4 KiB block");
}

#[test]
fn a_bulk_read_of_a_corrupt_block_fails_with_the_checksum_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = bulk_config(dir.path());
    let data = pattern(40 * KIB, 7);
    write_synced(&config, 0, &data);
    flip_byte(dir.path(), 9 * 1024 + 17);

    let store = Store::open(StoreConfig { init: false, ..config }).unwrap();
    let fork = data_fork(store.target_ids()[0]);
    let mut out = vec![0u8; 16 * KIB];
    let error = store.read(&fork, &[Extent::new(4096, 16 * 1024)], &mut out).unwrap_err();
    assert!(matches!(error, StoreError::ChecksumMismatch { offset: 8192, .. }), "{error:?}");
    assert!(error.to_string().contains("offset 8192"), "{error}");
    assert_eq!(store.stats().bulk_reads, 1, "the read went straight to the file");
    assert_eq!(store.stats().checksum_errors, 1);
    // Blocks around it still read, straight and through the cache; the bad one keeps failing.
    assert_eq!(read_range(&store, &fork, 0, 8 * KIB), data[..8 * KIB]);
    assert_eq!(read_range(&store, &fork, 12 * 1024, 28 * KIB), data[12 * KIB..]);
    assert!(store.read(&fork, &[Extent::new(9 * 1024, 10)], &mut [0u8; 10]).is_err());
    assert!(store.read(&fork, &[Extent::new(8 * 1024, 4096)], &mut [0u8; 4096]).is_err());
    assert!(store.stats().checksum_errors >= 3);
}
