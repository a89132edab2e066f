//! Integration tests of the storage engine on real files in temporary directories.

mod common;

use common::*;
use flotilla_store::{Extent, ForkRef, Store, StoreConfig, StoreError};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::sync::Arc;
use std::time::Duration;

const KIB: usize = 1024;

#[test]
fn full_block_writes_never_read_and_partial_ones_read_only_existing_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 64));
    let fork = data_fork(target);

    // Phase 1: whole blocks of a new fork, as one extent and as many small ones.
    store.write(&fork, &[Extent::new(0, 16 * 1024)], &pattern(16 * KIB, 1)).unwrap();
    let tiny: Vec<Extent> = (0..256).map(|i| Extent::new(16 * 1024 + i * 64, 64)).collect();
    store.write(&fork, &tiny, &pattern(16 * KIB, 2)).unwrap();
    assert_eq!(store.stats().disk_reads, 0, "full-block writes must not read");

    // Phase 2: a partial block past the end of the fork is zero-filled, not read.
    store.write(&fork, &[Extent::new(40 * 1024 + 100, 10)], b"0123456789").unwrap();
    assert_eq!(store.stats().disk_reads, 0);
    store.sync(&fork).unwrap();
    drop(store);

    // Phase 3: with a cold cache, a partial write inside the fork reads its block first.
    let store = Store::open(config(dir.path(), 4 * KIB, 64)).unwrap();
    store.write(&fork, &[Extent::new(100, 10)], b"abcdefghij").unwrap();
    let stats = store.stats();
    assert_eq!(stats.disk_read_blocks, 1);
    // ...while a cold full-block overwrite inside the fork does not.
    store.write(&fork, &[Extent::new(8 * 1024, 4 * 1024)], &pattern(4 * KIB, 3)).unwrap();
    assert_eq!(store.stats().disk_read_blocks, 1);

    let mut expected = pattern(16 * KIB, 1);
    expected[100..110].copy_from_slice(b"abcdefghij");
    expected[8 * KIB..12 * KIB].copy_from_slice(&pattern(4 * KIB, 3));
    assert_eq!(read_range(&store, &fork, 0, 16 * KIB), expected);
    assert_eq!(read_range(&store, &fork, 16 * 1024, 16 * KIB), pattern(16 * KIB, 2));
    assert_eq!(store.fork_size(&fork).unwrap(), 40 * 1024 + 110);
}

#[test]
fn dirty_blocks_survive_eviction_from_a_tiny_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 512, 4));
    let fork = data_fork(target);
    for block in 0..64u64 {
        let data = pattern(512, block);
        store.write(&fork, &[Extent::new(block * 512, 512)], &data).unwrap();
    }
    let stats = store.stats();
    assert!(stats.disk_write_blocks >= 60, "dirty blocks were written back: {stats:?}");
    assert!(stats.dirty_bytes <= 4 * 512);
    for block in (0..64u64).rev() {
        assert_eq!(read_range(&store, &fork, block * 512, 512), pattern(512, block));
    }
    assert!(store.stats().evictions > 0);
    // A request larger than the cache works a window at a time.
    let all = read_range(&store, &fork, 0, 64 * 512);
    for block in 0..64usize {
        assert_eq!(all[block * 512..][..512], pattern(512, block as u64)[..]);
    }
}

#[test]
fn synced_data_is_there_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 32 * KIB, 64);
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    let data = pattern(100_000, 9);
    store.write(&fork, &[Extent::new(5, 100_000)], &data).unwrap();
    store.sync(&fork).unwrap();
    assert_eq!(store.stats().dirty_bytes, 0);
    assert!(store.stats().disk_syncs >= 1);
    // Dropping without flush_all must not be needed for synced data; leak-free drop anyway.
    drop(store);

    let reopened = Store::open(StoreConfig { init: false, ..config }).unwrap();
    assert_eq!(reopened.target_ids(), vec![target]);
    assert_eq!(reopened.fork_size(&fork).unwrap(), 100_005);
    assert_eq!(read_range(&reopened, &fork, 5, 100_000), data);
    assert_eq!(read_range(&reopened, &fork, 0, 5), vec![0; 5]);
}

#[test]
fn sync_coalesces_adjacent_blocks_into_few_writes() {
    let dir = tempfile::tempdir().unwrap();
    // Through the cache (a 2 MiB write would otherwise go straight to the file as one bulk
    // piece: `bulk_bytes_min`).
    let config = StoreConfig { bulk_bytes_min: 0, ..config(dir.path(), 32 * KIB, 128) };
    let (store, target) = open_with_subfile(config);
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 64 * 32 * 1024)], &pattern(64 * 32 * KIB, 4)).unwrap();
    store.sync(&fork).unwrap();
    let stats = store.stats();
    assert_eq!(stats.disk_write_blocks, 64);
    // 1 MiB runs of 32 KiB blocks: two system calls.
    assert_eq!(stats.disk_writes, 2, "{stats:?}");
}

#[test]
fn concurrent_reads_of_one_block_share_one_disk_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 32 * KIB, 64);
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 32 * 1024)], &pattern(32 * KIB, 5)).unwrap();
    drop(store);

    let store = Arc::new(Store::open(config).unwrap());
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || read_range(&store, &data_fork(target), 0, 32 * KIB))
        })
        .collect();
    for reader in readers {
        assert_eq!(reader.join().unwrap(), pattern(32 * KIB, 5));
    }
    assert_eq!(store.stats().disk_read_blocks, 1);
}

#[test]
fn concurrent_writers_and_readers_on_disjoint_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 24));
    let store = Arc::new(store);
    let threads: Vec<_> = (0..8u64)
        .map(|worker| {
            let store = store.clone();
            std::thread::spawn(move || {
                let fork = data_fork(target);
                let base = worker * 256 * 1024;
                for round in 0..20u64 {
                    let offset = base + (round % 5) * 20_000;
                    let data = pattern(30_000, worker * 100 + round);
                    store.write(&fork, &[Extent::new(offset, 30_000)], &data).unwrap();
                    assert_eq!(read_range(&store, &fork, offset, 30_000), data);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Final state: the last write of each worker is intact.
    let fork = data_fork(target);
    for worker in 0..8u64 {
        let offset = worker * 256 * 1024 + (19 % 5) * 20_000;
        assert_eq!(read_range(&store, &fork, offset, 30_000), pattern(30_000, worker * 100 + 19));
    }
    store.flush_all().unwrap();
    assert_eq!(store.stats().dirty_bytes, 0);
}

#[test]
fn a_million_tiny_extents_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 32 * KIB, 2048));
    let fork = data_fork(target);
    // 1M extents of 64 bytes with a stride of 128: 64 MiB of data over a 128 MiB range,
    // larger than the cache, so it runs in several windows.
    let count = 1 << 20;
    let extents: Vec<Extent> = (0..count).map(|i| Extent::new(i * 128, 64)).collect();
    let data = pattern(count as usize * 64, 6);
    let started = std::time::Instant::now();
    store.write(&fork, &extents, &data).unwrap();
    let mut out = vec![0; data.len()];
    store.read(&fork, &extents, &mut out).unwrap();
    assert!(out == data, "tiny extents did not round-trip");
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    let gaps = read_range(&store, &fork, 64, 64);
    assert_eq!(gaps, vec![0; 64]);
}

#[test]
fn errors_name_what_is_missing_or_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(matches!(
        Store::open(StoreConfig::new(vec![missing.clone()], true)),
        Err(StoreError::TargetMissing { dir }) if dir == missing
    ));
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let mut out = [0u8; 4];
    let four = [Extent::new(0, 4)];

    let unknown = ForkRef::new(target, FILE, SUBFILE, "index");
    let error = store.read(&unknown, &four, &mut out).unwrap_err();
    assert!(matches!(&error, StoreError::UnknownFork { fork, .. } if fork == "index"));
    assert!(error.to_string().contains("index") && error.to_string().contains("00000000000000ab:3"));

    let no_subfile = ForkRef::new(target, FILE, SubfileIndex(4), "data");
    assert!(matches!(
        store.read(&no_subfile, &four, &mut out),
        Err(StoreError::UnknownSubfile { subfile: SubfileIndex(4), .. })
    ));
    let no_target = ForkRef::new(TargetId(12345), FILE, SUBFILE, "data");
    assert!(matches!(store.read(&no_target, &four, &mut out), Err(StoreError::UnknownTarget { .. })));

    for bad in ["", "a/b", "..", ".", "x\0y"] {
        let fork = ForkRef::new(target, FILE, SUBFILE, bad);
        assert!(matches!(store.create_fork(&fork), Err(StoreError::BadForkName { .. })), "{bad:?}");
        assert!(matches!(store.read(&fork, &four, &mut out), Err(StoreError::BadForkName { .. })));
    }
    let long = "x".repeat(256);
    assert!(matches!(
        store.create_fork(&ForkRef::new(target, FILE, SUBFILE, &long)),
        Err(StoreError::BadForkName { .. })
    ));

    let fork = data_fork(target);
    assert!(matches!(
        store.read(&fork, &[Extent::new(u64::MAX, 2)], &mut [0; 2]),
        Err(StoreError::ExtentOverflow { offset: u64::MAX, length: 2 })
    ));
    assert!(matches!(
        store.write(&fork, &[Extent::new(1 << 50, 1)], &[0]),
        Err(StoreError::ForkTooLarge { .. })
    ));
    assert!(matches!(
        store.write(&fork, &four, &[0; 3]),
        Err(StoreError::BufferLength { expected_bytes: 4, actual_bytes: 3 })
    ));
}

#[test]
fn corrupt_or_duplicate_targets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    drop(Store::open(config.clone()).unwrap());
    let mut twice = config.clone();
    twice.targets.push(dir.path().to_path_buf());
    assert!(matches!(Store::open(twice), Err(StoreError::DuplicateTarget { .. })));
    std::fs::write(dir.path().join("flotilla-target"), "format_version = 9\n").unwrap();
    assert!(matches!(Store::open(config), Err(StoreError::TargetIdCorrupt { .. })));
    let fresh = tempfile::tempdir().unwrap();
    let uninitialized = StoreConfig::new(vec![fresh.path().to_path_buf()], false);
    assert!(matches!(Store::open(uninitialized), Err(StoreError::TargetNotInitialized { .. })));
}

#[test]
fn extend_preallocates_and_sets_the_size() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let fork = data_fork(target);
    store.extend(&fork, 1 << 20).unwrap();
    assert_eq!(store.fork_size(&fork).unwrap(), 1 << 20);
    let path = dir.path().join("subfiles/00000000000000ab.3/data");
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.len(), 1 << 20);
    use std::os::unix::fs::MetadataExt;
    assert!(metadata.blocks() * 512 >= 1 << 20, "space is allocated");
    assert_eq!(read_range(&store, &fork, 1000, 100), vec![0; 100]);
    let before = store.stats().reservations;
    store.write(&fork, &[Extent::new(500_000, 10)], b"0123456789").unwrap();
    assert_eq!(store.stats().reservations, before, "no reservation needed inside an extended fork");
    // Extending to less than the size changes nothing.
    store.extend(&fork, 10).unwrap();
    assert_eq!(store.fork_size(&fork).unwrap(), 1 << 20);
}

#[test]
fn truncate_drops_data_beyond_and_grows_with_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 40_000)], &pattern(40_000, 7)).unwrap();
    store.sync(&fork).unwrap();
    store.write(&fork, &[Extent::new(20_000, 20_000)], &pattern(20_000, 8)).unwrap();

    store.truncate(&fork, 10_000).unwrap();
    assert_eq!(store.fork_size(&fork).unwrap(), 10_000);
    assert_eq!(read_range(&store, &fork, 9_000, 2_000)[1_000..], vec![0; 1_000][..]);
    store.truncate(&fork, 30_000).unwrap();
    assert_eq!(read_range(&store, &fork, 10_000, 20_000), vec![0; 20_000]);
    assert_eq!(read_range(&store, &fork, 0, 10_000), pattern(40_000, 7)[..10_000]);
    store.sync(&fork).unwrap();
    drop(store);

    let store = Store::open(config).unwrap();
    assert_eq!(store.fork_size(&fork).unwrap(), 30_000);
    assert_eq!(read_range(&store, &fork, 0, 10_000), pattern(40_000, 7)[..10_000]);
    assert_eq!(read_range(&store, &fork, 10_000, 20_000), vec![0; 20_000]);
}

#[test]
fn forks_are_created_listed_and_removed_with_their_cached_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let index = ForkRef::new(target, FILE, SUBFILE, "index");
    store.create_fork(&index).unwrap();
    assert!(matches!(store.create_fork(&index), Err(StoreError::ForkExists { .. })));
    store.write(&index, &[Extent::new(0, 5000)], &pattern(5000, 1)).unwrap();
    let forks = store.list_forks(target, FILE, SUBFILE).unwrap();
    assert_eq!(forks, vec![("data".to_string(), 0), ("index".to_string(), 5000)]);

    // Removing a fork with dirty cached blocks discards them; a new fork of that name is empty.
    store.remove_fork(&index).unwrap();
    assert_eq!(store.stats().dirty_bytes, 0);
    assert_eq!(store.stats().cached_bytes, 0);
    assert!(matches!(store.fork_size(&index), Err(StoreError::UnknownFork { .. })));
    assert!(matches!(store.remove_fork(&index), Err(StoreError::UnknownFork { .. })));
    store.create_fork(&index).unwrap();
    assert_eq!(store.fork_size(&index).unwrap(), 0);
    assert_eq!(read_range(&store, &index, 0, 100), vec![0; 100]);

    store.write(&data_fork(target), &[Extent::new(0, 10)], &[1; 10]).unwrap();
    store.remove_subfile(target, FILE, SUBFILE).unwrap();
    assert_eq!(store.stats().cached_bytes, 0);
    assert!(matches!(store.list_forks(target, FILE, SUBFILE), Err(StoreError::UnknownSubfile { .. })));
    assert!(matches!(store.remove_subfile(target, FILE, SUBFILE), Err(StoreError::UnknownSubfile { .. })));
    store.create_subfile(target, FILE, SUBFILE).unwrap();
    assert_eq!(store.fork_size(&data_fork(target)).unwrap(), 0);
}

#[test]
fn flush_aged_writes_back_old_dirty_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let fork = data_fork(target);
    store.write(&fork, &[Extent::new(0, 12_000)], &pattern(12_000, 2)).unwrap();
    assert_eq!(store.flush_aged(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(store.stats().dirty_bytes, 3 * 4096);
    assert_eq!(store.flush_aged(Duration::ZERO).unwrap(), 3);
    assert_eq!(store.stats().dirty_bytes, 0);
    assert_eq!(store.stats().disk_write_bytes, 12_000);
}

#[test]
fn the_fd_cache_bounds_open_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 4 * KIB, 64);
    config.fd_cache_max = 2;
    let (store, target) = open_with_subfile(config);
    let names: Vec<String> = (0..6).map(|i| format!("fork{i}")).collect();
    for (round, name) in names.iter().enumerate() {
        let fork = ForkRef::new(target, FILE, SUBFILE, name);
        store.create_fork(&fork).unwrap();
        store.write(&fork, &[Extent::new(0, 5000)], &pattern(5000, round as u64)).unwrap();
        store.sync(&fork).unwrap();
        assert!(store.open_fork_files() <= 2);
    }
    store.flush_all().unwrap();
    for (round, name) in names.iter().enumerate() {
        let fork = ForkRef::new(target, FILE, SUBFILE, name);
        assert_eq!(read_range(&store, &fork, 0, 5000), pattern(5000, round as u64));
        assert!(store.open_fork_files() <= 2);
    }
}

#[test]
fn usage_reports_space() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 16));
    let usage = store.usage(target).unwrap();
    assert!(usage.free_bytes > 0 && usage.used_bytes > 0);
    assert!(matches!(store.usage(TargetId(1)), Err(StoreError::UnknownTarget { .. })));
}

#[test]
fn two_targets_are_independent() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let mut config = config(first.path(), 4 * KIB, 16);
    config.targets.push(second.path().to_path_buf());
    let store = Store::open(config).unwrap();
    let ids = store.target_ids();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    for (seed, &target) in ids.iter().enumerate() {
        store.create_subfile(target, FILE, SUBFILE).unwrap();
        let fork = data_fork(target);
        store.write(&fork, &[Extent::new(0, 9000)], &pattern(9000, seed as u64)).unwrap();
    }
    for (seed, &target) in ids.iter().enumerate() {
        assert_eq!(read_range(&store, &data_fork(target), 0, 9000), pattern(9000, seed as u64));
    }
    assert_eq!(store.target_dir(ids[1]).unwrap(), second.path());
    let _ = FileId(0);
}

#[test]
fn writers_flushers_and_namespace_changes_run_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 512, 8);
    config.disk_queue_max = 4;
    config.fd_cache_max = 2;
    let (store, target) = open_with_subfile(config);
    let store = Arc::new(store);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // FLOTILLA_STRESS_ROUNDS raises the load for a longer soak.
    let rounds: u64 =
        std::env::var("FLOTILLA_STRESS_ROUNDS").ok().and_then(|value| value.parse().ok()).unwrap_or(40);
    let mut threads = Vec::new();
    for worker in 0..4u64 {
        let store = store.clone();
        threads.push(std::thread::spawn(move || {
            let fork = data_fork(target);
            for round in 0..rounds {
                let offset = worker * 10_000 + (round % 3) * 700;
                let data = pattern(1500, worker * 1000 + round);
                store.write(&fork, &[Extent::new(offset, 1500)], &data).unwrap();
                assert_eq!(read_range(&store, &fork, offset, 1500), data);
            }
        }));
    }
    let flusher = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.flush_aged(Duration::ZERO).unwrap();
                store.sync(&data_fork(target)).unwrap();
            }
        })
    };
    let churner = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let scratch = ForkRef::new(target, FILE, SUBFILE, "scratch");
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.create_fork(&scratch).unwrap();
                let data = pattern(3000, round);
                store.write(&scratch, &[Extent::new(0, 3000)], &data).unwrap();
                store.truncate(&scratch, 1000).unwrap();
                assert_eq!(read_range(&store, &scratch, 0, 1200)[..1000], data[..1000]);
                store.remove_fork(&scratch).unwrap();
                round += 1;
            }
        })
    };
    for thread in threads {
        thread.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
    churner.join().unwrap();
    let fork = data_fork(target);
    for worker in 0..4u64 {
        let last = rounds - 1;
        let offset = worker * 10_000 + (last % 3) * 700;
        assert_eq!(read_range(&store, &fork, offset, 1500), pattern(1500, worker * 1000 + last));
    }
}

#[test]
fn io_errors_keep_their_kind_and_say_what_was_done() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 16);
    let (store, target) = open_with_subfile(config.clone());
    drop(store);
    // Replace the fork's file by a directory: opening it fails with EISDIR.
    let path = dir.path().join("subfiles/00000000000000ab.3/data");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let store = Store::open(config).unwrap();
    let error = store.read(&data_fork(target), &[Extent::new(0, 4)], &mut [0; 4]).unwrap_err();
    let StoreError::Io { action, source } = &error else {
        panic!("expected an I/O error, got {error:?}");
    };
    assert_eq!(source.raw_os_error(), Some(libc::EISDIR));
    assert!(action.starts_with("open fork") && action.contains("00000000000000ab.3"), "{action}");
    assert!(error.io_kind().is_some());
}

#[test]
fn a_write_far_past_the_end_reserves_only_its_own_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, target) = open_with_subfile(config(dir.path(), 4 * KIB, 64));
    let fork = data_fork(target);
    // Phase 1: a dense start, then one block far out (a sparse fork, as hash layouts make).
    store.write(&fork, &[Extent::new(0, 8 * 1024)], &pattern(8 * KIB, 1)).unwrap();
    let far = 1u64 << 40;
    store.write(&fork, &[Extent::new(far, 4096)], &pattern(4 * KIB, 2)).unwrap();
    store.sync(&fork).unwrap();
    // Phase 2: the hole between them holds no disk blocks.
    let path = dir.path().join("subfiles");
    let allocated_bytes: u64 = std::fs::read_dir(&path)
        .unwrap()
        .flat_map(|subfile| std::fs::read_dir(subfile.unwrap().path()).unwrap())
        .map(|fork| std::os::unix::fs::MetadataExt::blocks(&fork.unwrap().metadata().unwrap()) * 512)
        .sum();
    assert!(allocated_bytes < 1 << 20, "a sparse write reserved {allocated_bytes} bytes");
    // Phase 3: the hole can still be written (its space is reserved then), and all reads back.
    store.write(&fork, &[Extent::new(1 << 30, 4096)], &pattern(4 * KIB, 3)).unwrap();
    assert_eq!(read_range(&store, &fork, far, 4 * KIB), pattern(4 * KIB, 2));
    assert_eq!(read_range(&store, &fork, 1 << 30, 4 * KIB), pattern(4 * KIB, 3));
    assert_eq!(read_range(&store, &fork, 0, 8 * KIB), pattern(8 * KIB, 1));
}

/// Bytes allocated to every fork and checksum file of the target at `dir`.
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    ["subfiles", "checksums"]
        .iter()
        .filter_map(|top| std::fs::read_dir(dir.join(top)).ok())
        .flatten()
        .flat_map(|subfile| std::fs::read_dir(subfile.unwrap().path()).unwrap())
        .map(|fork| std::os::unix::fs::MetadataExt::blocks(&fork.unwrap().metadata().unwrap()) * 512)
        .sum()
}

#[test]
fn one_request_with_pieces_a_terabyte_apart_reserves_only_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 * KIB, 64);
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    // Phase 1: one request, a byte at 0 and a byte at 1 TiB (what the mount's write-behind
    // sends for a header and a trailer). Before issue 31 it reserved the terabyte between.
    let far = 1u64 << 40;
    store.write(&fork, &[Extent::new(0, 1), Extent::new(far, 1)], b"HT").unwrap();
    store.sync(&fork).unwrap();
    let allocated = allocated_bytes(dir.path());
    assert!(allocated < 256 * KIB as u64, "two bytes in one request allocated {allocated} bytes");
    assert_eq!(read_range(&store, &fork, 0, 1), b"H");
    assert_eq!(read_range(&store, &fork, far, 1), b"T");
    assert_eq!(read_range(&store, &fork, far / 2, 4 * KIB), vec![0; 4 * KIB]);
    // Phase 2: growing with truncate leaves a hole too.
    store.truncate(&fork, far * 2).unwrap();
    store.sync(&fork).unwrap();
    assert!(allocated_bytes(dir.path()) < 256 * KIB as u64, "a truncate up allocated its growth");
    // Phase 3: reopened, the sparse fork still reserves a hole before writing into it.
    drop(store);
    let store = Store::open(config).unwrap();
    let before = store.stats().reservations;
    store.write(&fork, &[Extent::new(far / 2, 10)], b"0123456789").unwrap();
    assert_eq!(store.stats().reservations, before + 1, "a write into a hole of a reopened fork reserves");
    store.sync(&fork).unwrap();
    assert_eq!(read_range(&store, &fork, far / 2, 10), b"0123456789");
    assert_eq!(read_range(&store, &fork, far, 1), b"T");
}
