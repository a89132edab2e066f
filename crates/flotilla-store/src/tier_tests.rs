//! The tertiary tier of a lines target against real files: a directory archive, archive,
//! release, transparent recall, rewrite, truncation, reclaim under pressure, reopening, and
//! the migration manager's pass.

use crate::{Extent, ForkRef, HsmAction, Residency, Store, StoreConfig, StoreError, TierConfig, TierPolicy};
use flotilla_archive::{Archive, ArchiveOptions};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::path::Path;
use std::sync::Arc;

const BLOCK: u64 = 4096;
const SUBFILE: SubfileIndex = SubfileIndex(0);

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|at| ((at / 7) as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn open(dir: &Path, archive: &Path, policy: TierPolicy) -> Store {
    let spec =
        format!("lines,capacity=1m,block=4k,line_blocks=16,group_blocks=4,reorganize_ms=0:{}", dir.display());
    let archive = Archive::open(archive.to_str().unwrap(), ArchiveOptions::default()).unwrap();
    let config = StoreConfig {
        block_bytes: BLOCK,
        cache_capacity_bytes: 64 * BLOCK,
        tier: Some(TierConfig { archive: Arc::new(archive), policy }),
        ..StoreConfig::new(vec![spec.into()], true)
    };
    Store::open(config).unwrap()
}

fn policy() -> TierPolicy {
    TierPolicy {
        recall_extent_bytes: 64 << 10,
        free_low_percent: 0,
        free_high_percent: 0,
        ..TierPolicy::default()
    }
}

fn fork(store: &Store, file: u64, name: &'static str) -> ForkRef<'static> {
    ForkRef::new(target(store), FileId(file), SUBFILE, name)
}

fn target(store: &Store) -> TargetId {
    store.target_ids()[0]
}

fn write(store: &Store, fork: &ForkRef<'_>, offset: u64, data: &[u8]) {
    store.write(fork, &[Extent::new(offset, data.len() as u64)], data).unwrap();
    store.sync(fork).unwrap();
}

fn read(store: &Store, fork: &ForkRef<'_>, offset: u64, length: usize) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![0u8; length];
    store.read(fork, &[Extent::new(offset, length as u64)], &mut out).map(|()| out)
}

fn objects(archive: &Path) -> usize {
    walk(archive).len()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        match entry.file_type().unwrap().is_dir() {
            true => found.extend(walk(&entry.path())),
            false => found.push(entry.path()),
        }
    }
    found
}

#[test]
fn archive_release_recall_rewrite_and_archive_again() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(dir.path(), archive.path(), policy());
    store.create_subfile(target(&store), FileId(1), SUBFILE).unwrap();
    let data_fork = fork(&store, 1, "data");
    let mut model = pattern(200_000, 1);
    write(&store, &data_fork, 0, &model);
    assert_eq!(store.hsm(&data_fork, HsmAction::State).unwrap().residency, Residency::Resident);
    let refused = store.hsm(&data_fork, HsmAction::Release).unwrap_err();
    assert!(matches!(refused, StoreError::HsmRefused { .. }), "{refused}");

    let archived = store.hsm(&data_fork, HsmAction::Archive).unwrap();
    assert_eq!((archived.residency, archived.archived_bytes), (Residency::Archived, 200_000));
    assert_eq!(objects(archive.path()), 1);

    let released = store.hsm(&data_fork, HsmAction::Release).unwrap();
    assert_eq!((released.residency, released.resident_bytes), (Residency::Released, 0));
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert_eq!(stats.clean_blocks, 0);
    // A read recalls transparently, one archive request per 64 KiB extent.
    assert_eq!(read(&store, &data_fork, 100_000, 5000).unwrap(), model[100_000..105_000]);
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert_eq!((stats.recalls, stats.recalled_bytes), (1, 64 << 10));
    assert_eq!(read(&store, &data_fork, 0, 200_000).unwrap(), model);
    assert_eq!(store.hsm(&data_fork, HsmAction::State).unwrap().residency, Residency::Archived);

    // A rewrite (a partial block of a released fork keeps its other bytes) makes it modified.
    store.hsm(&data_fork, HsmAction::Release).unwrap();
    model[10_000..10_100].fill(0xee);
    write(&store, &data_fork, 10_000, &[0xee; 100]);
    assert_eq!(store.hsm(&data_fork, HsmAction::State).unwrap().residency, Residency::Modified);
    let refused = store.hsm(&data_fork, HsmAction::Release).unwrap_err();
    assert!(refused.to_string().contains("changed since"), "{refused}");
    assert_eq!(read(&store, &data_fork, 0, 200_000).unwrap(), model);
    store.hsm(&data_fork, HsmAction::Release).unwrap_err();
    let again = store.hsm(&data_fork, HsmAction::Archive).unwrap();
    assert_eq!(again.residency, Residency::Archived);
    assert_eq!(objects(archive.path()), 1, "the superseded copy is deleted");
    assert_eq!(store.tier_stats(target(&store)).unwrap().unwrap().superseded_copies, 1);

    // A truncation cuts the copy's valid bytes: growing again reads zeros, not old data.
    store.hsm(&data_fork, HsmAction::Release).unwrap();
    store.truncate(&data_fork, 10_050).unwrap();
    store.truncate(&data_fork, 200_000).unwrap();
    store.sync(&data_fork).unwrap();
    model[10_050..].fill(0);
    assert_eq!(read(&store, &data_fork, 0, 200_000).unwrap(), model);

    // Records and clean states survive reopening.
    store.hsm(&data_fork, HsmAction::Archive).unwrap();
    store.hsm(&data_fork, HsmAction::Release).unwrap();
    drop(store);
    let store = open(dir.path(), archive.path(), policy());
    let data_fork = fork(&store, 1, "data");
    assert_eq!(store.hsm(&data_fork, HsmAction::State).unwrap().residency, Residency::Released);
    assert_eq!(store.hsm(&data_fork, HsmAction::Restore).unwrap().residency, Residency::Archived);
    assert_eq!(read(&store, &data_fork, 0, 200_000).unwrap(), model);

    // Removing the fork removes its copy.
    store.remove_subfile(target(&store), FileId(1), SUBFILE).unwrap();
    assert_eq!(objects(archive.path()), 0);
}

#[test]
fn a_full_target_reclaims_clean_blocks_and_recalls_them_later() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(dir.path(), archive.path(), policy());
    for file in [1, 2] {
        store.create_subfile(target(&store), FileId(file), SUBFILE).unwrap();
    }
    let (a, b) = (fork(&store, 1, "data"), fork(&store, 2, "data"));
    let (data_a, data_b) = (pattern(200 * 1024, 3), pattern(220 * 4096, 4));
    write(&store, &a, 0, &data_a);
    store.hsm(&a, HsmAction::Archive).unwrap();
    // 50 clean blocks of A + 220 dirty of B exceed the 256 slots: B's writes reclaim A's.
    write(&store, &b, 0, &data_b);
    assert_eq!(read(&store, &b, 0, data_b.len()).unwrap(), data_b, "B as written");
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert!(stats.reclaimed_blocks > 0, "{stats:?}");
    assert_eq!(store.hsm(&a, HsmAction::State).unwrap().residency, Residency::Released);
    // Recalling A needs space, and only B's dirty blocks hold it: the read is served from the
    // archive without keeping the data.
    assert_eq!(read(&store, &a, 0, data_a.len()).unwrap(), data_a, "A read through");
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert!(stats.read_throughs > 0, "{stats:?}");
    assert_eq!(store.hsm(&a, HsmAction::State).unwrap().residency, Residency::Released);
    assert_eq!(read(&store, &b, 0, data_b.len()).unwrap(), data_b, "B after A's read-through");
    store.hsm(&b, HsmAction::Archive).unwrap();
    assert_eq!(read(&store, &b, 0, data_b.len()).unwrap(), data_b, "B after archive");
    assert_eq!(read(&store, &a, 0, data_a.len()).unwrap(), data_a);
    assert_eq!(read(&store, &b, 0, data_b.len()).unwrap(), data_b);
}

#[test]
fn the_migration_manager_archives_old_forks_and_reclaims_to_the_high_watermark() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let policy = TierPolicy { archive_age_s: 0, free_low_percent: 50, free_high_percent: 60, ..policy() };
    let store = open(dir.path(), archive.path(), policy);
    store.create_subfile(target(&store), FileId(7), SUBFILE).unwrap();
    let data_fork = fork(&store, 7, "data");
    let data = pattern(160 * 4096, 9);
    write(&store, &data_fork, 0, &data);
    let pass = store.tier_pass(target(&store)).unwrap().unwrap();
    assert_eq!(pass.archived_forks, 1);
    // 160 of 224 slots were taken (29% free < 50%): reclaim back to 60% free.
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    let total = stats.free_blocks + stats.clean_blocks + stats.dirty_blocks;
    assert_eq!(total, 224);
    assert_eq!(stats.free_blocks, total * 60 / 100, "{stats:?}");
    assert_eq!(pass.reclaimed_blocks, total * 60 / 100 - (total - 160));
    let pass = store.tier_pass(target(&store)).unwrap().unwrap();
    assert_eq!((pass.archived_forks, pass.reclaimed_blocks), (0, 0), "nothing left to do");
    assert_eq!(read(&store, &data_fork, 0, data.len()).unwrap(), data);
}

#[test]
fn a_lost_archive_copy_fails_the_read_with_a_clear_error() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(dir.path(), archive.path(), policy());
    store.create_subfile(target(&store), FileId(3), SUBFILE).unwrap();
    let data_fork = fork(&store, 3, "data");
    write(&store, &data_fork, 0, &pattern(50_000, 5));
    let state = store.hsm(&data_fork, HsmAction::Archive).unwrap();
    store.hsm(&data_fork, HsmAction::Release).unwrap();
    for object in walk(archive.path()) {
        std::fs::remove_file(object).unwrap();
    }
    let error = read(&store, &data_fork, 0, 4096).unwrap_err().to_string();
    assert!(error.contains("recall") && error.contains(&state.object_key), "{error}");
    assert_eq!(store.tier_stats(target(&store)).unwrap().unwrap().recall_failures, 1);
}

#[test]
fn concurrent_readers_of_a_released_fork_share_its_recalls() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(dir.path(), archive.path(), policy());
    store.create_subfile(target(&store), FileId(4), SUBFILE).unwrap();
    let data_fork = fork(&store, 4, "data");
    let data = pattern(256 << 10, 8);
    write(&store, &data_fork, 0, &data);
    store.hsm(&data_fork, HsmAction::Archive).unwrap();
    // Several rounds: a follower finding the leader's recall finished but not yet gone from
    // the map once locked itself out (a hang in about one run in twenty).
    const ROUNDS: u64 = 5;
    for _ in 0..ROUNDS {
        store.hsm(&data_fork, HsmAction::Release).unwrap();
        // Restores recall in the callers' threads, reads in the target's disk thread.
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| store.hsm(&data_fork, HsmAction::Restore).unwrap());
                scope.spawn(|| assert_eq!(read(&store, &data_fork, 0, data.len()).unwrap(), data));
            }
        });
    }
    // 256 KiB in 64 KiB extents: four recalls a round, whatever the number of readers.
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert_eq!((stats.recalls, stats.recalled_bytes), (4 * ROUNDS, ROUNDS * (256 << 10)), "{stats:?}");
}

#[test]
fn a_sparse_fork_is_archived_and_recalled_without_its_holes() {
    let (dir, archive) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(dir.path(), archive.path(), policy());
    store.create_subfile(target(&store), FileId(4), SUBFILE).unwrap();
    let data_fork = fork(&store, 4, "data");
    // Phase 1: a block at 0 and a byte at 1 GiB; the archive copy holds two blocks.
    let far = 1u64 << 30;
    write(&store, &data_fork, 0, &pattern(BLOCK as usize, 6));
    write(&store, &data_fork, far, b"T");
    let archived = store.hsm(&data_fork, HsmAction::Archive).unwrap();
    assert_eq!((archived.residency, archived.archived_bytes), (Residency::Archived, far + 1));
    let object_bytes: u64 = walk(archive.path()).iter().map(|object| object.metadata().unwrap().len()).sum();
    assert_eq!(object_bytes, BLOCK + 1, "the copy holds the blocks, not the gigabyte between");
    // Phase 2: released, a read of a hole recalls nothing and stays a hole.
    store.hsm(&data_fork, HsmAction::Release).unwrap();
    let free_before = store.tier_stats(target(&store)).unwrap().unwrap().free_blocks;
    assert_eq!(read(&store, &data_fork, far / 2, 8192).unwrap(), vec![0; 8192]);
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert_eq!((stats.recalls, stats.recalled_bytes, stats.free_blocks), (0, 0, free_before), "{stats:?}");
    assert_eq!(store.hsm(&data_fork, HsmAction::State).unwrap().residency, Residency::Released);
    // Phase 3: reads of the written bytes recall exactly their blocks; restore the rest.
    assert_eq!(read(&store, &data_fork, far, 1).unwrap(), b"T");
    assert_eq!(read(&store, &data_fork, 0, BLOCK as usize).unwrap(), pattern(BLOCK as usize, 6));
    let stats = store.tier_stats(target(&store)).unwrap().unwrap();
    assert_eq!(stats.recalled_bytes, BLOCK + 1, "{stats:?}");
    assert_eq!(stats.free_blocks, free_before - 2, "two blocks came back, no hole was filled");
    assert_eq!(store.hsm(&data_fork, HsmAction::Restore).unwrap().residency, Residency::Archived);
    // Phase 4: archived again, the copy still holds only those two blocks.
    write(&store, &data_fork, far + 8 * BLOCK, b"U");
    store.hsm(&data_fork, HsmAction::Archive).unwrap();
    let object_bytes: u64 = walk(archive.path()).iter().map(|object| object.metadata().unwrap().len()).sum();
    assert_eq!(object_bytes, 2 * BLOCK + 1, "the new copy: three blocks, the last cut at the size");
    assert_eq!(read(&store, &data_fork, far + 8 * BLOCK, 1).unwrap(), b"U");
}
