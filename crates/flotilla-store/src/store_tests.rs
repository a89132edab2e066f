//! Property tests of the whole engine against an in-memory model, with a tiny block size and
//! cache so that windows, eviction and write-back under pressure are exercised constantly.
//! The `bulk` variants set `bulk_bytes_min` to one block, so most requests mix bulk pieces
//! (straight to and from the fork file) with cached heads, tails and small pieces over the
//! same blocks.

use crate::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use proptest::prelude::*;
use std::sync::Arc;

const BLOCK_BYTES: usize = 512;
const SPAN_BYTES: u64 = 24 * 1024;

#[derive(Clone, Debug)]
enum Op {
    Write(Vec<Extent>, u8),
    Read(Vec<Extent>),
    Sync,
    FlushAged,
    Truncate(u64),
    /// Remove the fork (dropping its cached blocks) and create it again, empty.
    Recreate,
}

fn extent() -> impl Strategy<Value = Extent> {
    (0..SPAN_BYTES, 0..2048u64).prop_map(|(offset, length)| Extent::new(offset, length))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (prop::collection::vec(extent(), 0..8), any::<u8>()).prop_map(|(e, seed)| Op::Write(e, seed)),
        4 => prop::collection::vec(extent(), 0..8).prop_map(Op::Read),
        1 => Just(Op::Sync),
        1 => Just(Op::FlushAged),
        1 => (0..SPAN_BYTES).prop_map(Op::Truncate),
        1 => Just(Op::Recreate),
    ]
}

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|at| (at as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn model_write(model: &mut Vec<u8>, extents: &[Extent], data: &[u8]) {
    let mut at = 0;
    for extent in extents.iter().filter(|extent| extent.length > 0) {
        let (start, end) = (extent.offset as usize, (extent.offset + extent.length) as usize);
        if model.len() < end {
            model.resize(end, 0);
        }
        model[start..end].copy_from_slice(&data[at..at + extent.length as usize]);
        at += extent.length as usize;
    }
}

fn model_read(model: &[u8], extents: &[Extent]) -> Vec<u8> {
    let mut out = Vec::new();
    for extent in extents {
        for offset in extent.offset..extent.offset + extent.length {
            out.push(model.get(offset as usize).copied().unwrap_or(0));
        }
    }
    out
}

/// The target kinds every property runs against: `dir`, and `lines` with small lines (so
/// forks overflow their home lines) and the reorganizer running every millisecond.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Dir,
    Lines,
}

fn target_spec(kind: Kind, dir: &std::path::Path) -> std::path::PathBuf {
    match kind {
        Kind::Dir => dir.to_path_buf(),
        Kind::Lines => format!(
            "lines,capacity=512k,block=1k,line_blocks=16,group_blocks=4,reorganize_ms=1:{}",
            dir.display()
        )
        .into(),
    }
}

fn run(ops: &[Op], cache_blocks: u64, kind: Kind) {
    run_with(ops, cache_blocks, kind, 0);
}

/// `run` with bulk pieces from `bulk_bytes_min` (0: none).
fn run_with(ops: &[Op], cache_blocks: u64, kind: Kind, bulk_bytes_min: u64) {
    run_threads(ops, cache_blocks, kind, bulk_bytes_min, 1);
}

/// `run_with` on `disk_threads` threads per target.
fn run_threads(ops: &[Op], cache_blocks: u64, kind: Kind, bulk_bytes_min: u64, disk_threads: usize) {
    let shards =
        Shards { configured: crate::CACHE_SHARDS_DEFAULT, slots_min: crate::block_cache::SHARD_SLOTS_MIN };
    run_sharded(ops, cache_blocks, kind, bulk_bytes_min, disk_threads, shards);
}

/// The cache's shards: as configured, each keeping at least `slots_min` slots (or half).
#[derive(Clone, Copy, Debug)]
struct Shards {
    configured: usize,
    slots_min: usize,
}

/// `run_threads` with the cache cut into `shards`.
fn run_sharded(
    ops: &[Op],
    cache_blocks: u64,
    kind: Kind,
    bulk_bytes_min: u64,
    disk_threads: usize,
    shards: Shards,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(vec![target_spec(kind, dir.path())], true);
    config.cache_shards = shards.configured;
    config.disk_threads_per_target = disk_threads;
    config.bulk_bytes_min = bulk_bytes_min;
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = cache_blocks * BLOCK_BYTES as u64;
    config.disk_run_bytes_max = 4 * BLOCK_BYTES as u64;
    config.dirty_bytes_high_max = 2 * BLOCK_BYTES as u64;
    let store = Store::open_sharded(config.clone(), shards.slots_min).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(7), SubfileIndex(0)).unwrap();
    let fork = ForkRef::new(target, FileId(7), SubfileIndex(0), "data");
    let mut model = Vec::new();
    for op in ops {
        apply(&store, &fork, &mut model, op);
        store.check_invariants();
        assert_eq!(store.fork_size(&fork).unwrap(), model.len() as u64);
    }
    drop(store);
    let reopened = Store::open(config).unwrap();
    let whole = [Extent::new(0, SPAN_BYTES + 2048)];
    let mut out = vec![0; whole[0].length as usize];
    reopened.read(&fork, &whole, &mut out).unwrap();
    assert_eq!(out, model_read(&model, &whole), "after reopening");
    assert_eq!(reopened.fork_size(&fork).unwrap(), model.len() as u64);
}

fn apply(store: &Store, fork: &ForkRef<'_>, model: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write(extents, seed) => {
            let total: u64 = extents.iter().map(|e| e.length).sum();
            let data = pattern(total as usize, *seed);
            store.write(fork, extents, &data).unwrap();
            model_write(model, extents, &data);
        }
        Op::Read(extents) => {
            let total: u64 = extents.iter().map(|e| e.length).sum();
            let mut out = vec![0xee; total as usize];
            store.read(fork, extents, &mut out).unwrap();
            assert_eq!(out, model_read(model, extents));
        }
        Op::Sync => store.sync(fork).unwrap(),
        Op::FlushAged => {
            store.flush_aged(std::time::Duration::ZERO).unwrap();
        }
        Op::Truncate(size) => {
            store.truncate(fork, *size).unwrap();
            model.resize(*size as usize, 0);
        }
        Op::Recreate => {
            store.remove_fork(fork).unwrap();
            store.create_fork(fork).unwrap();
            model.clear();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matches_model_with_tiny_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 6, Kind::Dir);
    }

    #[test]
    fn matches_model_with_roomy_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 256, Kind::Dir);
    }

    #[test]
    fn matches_model_with_tiny_cache_on_three_disk_threads(ops in prop::collection::vec(op(), 1..40)) {
        run_threads(&ops, 6, Kind::Dir, 0, 3);
    }

    #[test]
    fn matches_model_with_roomy_cache_on_three_disk_threads(ops in prop::collection::vec(op(), 1..40)) {
        run_threads(&ops, 256, Kind::Dir, 0, 3);
    }

    #[test]
    fn bulk_matches_model_with_tiny_cache_on_three_disk_threads(ops in prop::collection::vec(op(), 1..40)) {
        run_threads(&ops, 6, Kind::Dir, BLOCK_BYTES as u64, 3);
    }

    #[test]
    fn bulk_matches_model_with_tiny_cache(ops in prop::collection::vec(op(), 1..40)) {
        run_with(&ops, 6, Kind::Dir, BLOCK_BYTES as u64);
    }

    #[test]
    fn bulk_matches_model_with_roomy_cache(ops in prop::collection::vec(op(), 1..40)) {
        run_with(&ops, 256, Kind::Dir, BLOCK_BYTES as u64);
    }

    #[test]
    fn bulk_of_two_blocks_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        run_with(&ops, 16, Kind::Dir, 2 * BLOCK_BYTES as u64);
    }

    #[test]
    fn lines_ignores_bulk_and_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        run_with(&ops, 16, Kind::Lines, BLOCK_BYTES as u64);
    }

    #[test]
    fn lines_matches_model_with_tiny_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 6, Kind::Lines);
    }

    #[test]
    fn one_shard_matches_model_with_tiny_cache(ops in prop::collection::vec(op(), 1..40)) {
        run_sharded(&ops, 6, Kind::Dir, 0, 1, Shards { configured: 1, slots_min: 2 });
    }

    #[test]
    fn one_shard_matches_model_with_roomy_cache(ops in prop::collection::vec(op(), 1..40)) {
        run_sharded(&ops, 256, Kind::Dir, BLOCK_BYTES as u64, 1, Shards { configured: 1, slots_min: 2 });
    }

    #[test]
    fn eight_shards_of_two_slots_match_model(ops in prop::collection::vec(op(), 1..40)) {
        run_sharded(&ops, 16, Kind::Dir, 0, 3, Shards { configured: 8, slots_min: 2 });
    }

    #[test]
    fn sixteen_shards_with_bulk_match_model(ops in prop::collection::vec(op(), 1..40)) {
        run_sharded(&ops, 64, Kind::Dir, 2 * BLOCK_BYTES as u64, 1, Shards { configured: 16, slots_min: 3 });
    }

    #[test]
    fn lines_on_four_shards_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        run_sharded(&ops, 12, Kind::Lines, 0, 1, Shards { configured: 4, slots_min: 3 });
    }

    #[test]
    fn lines_matches_model_with_roomy_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 256, Kind::Lines);
    }
}

/// A store with 512-byte blocks, bulk pieces from one block, and the test fork.
fn bulk_store(dir: &std::path::Path, bulk_bytes_min: u64) -> (Store, StoreConfig, ForkRef<'static>) {
    let mut config = StoreConfig::new(vec![dir.to_path_buf()], true);
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = 64 * BLOCK_BYTES as u64;
    config.bulk_bytes_min = bulk_bytes_min;
    let store = Store::open(config.clone()).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(7), SubfileIndex(0)).ok();
    (store, config, ForkRef::new(target, FileId(7), SubfileIndex(0), "data"))
}

#[test]
fn a_bulk_write_over_dirty_cached_blocks_is_not_overwritten_by_their_write_back() {
    let dir = tempfile::tempdir().unwrap();
    let (store, config, fork) = bulk_store(dir.path(), BLOCK_BYTES as u64);
    let old = pattern(4 * BLOCK_BYTES, 1);
    // Small writes (below a block each) leave blocks 0..4 dirty in the cache.
    for (index, chunk) in old.chunks(BLOCK_BYTES / 2).enumerate() {
        let extent = Extent::new((index * BLOCK_BYTES / 2) as u64, chunk.len() as u64);
        store.write(&fork, &[extent], chunk).unwrap();
    }
    assert_eq!(store.stats().dirty_bytes, 4 * BLOCK_BYTES as u64);
    // A bulk write covering blocks 1..3 wholly drops their dirty copies.
    let new = pattern(2 * BLOCK_BYTES, 9);
    let before = store.stats();
    store.write(&fork, &[Extent::new(BLOCK_BYTES as u64, new.len() as u64)], &new).unwrap();
    let after = store.stats().since(&before);
    assert_eq!((after.bulk_writes, after.bulk_write_bytes), (1, new.len() as u64));
    assert_eq!(store.stats().dirty_bytes, 2 * BLOCK_BYTES as u64, "blocks 1 and 2 were dropped");
    store.check_invariants();
    // Writing the rest back must not bring the stale blocks back.
    store.flush_aged(std::time::Duration::ZERO).unwrap();
    store.sync(&fork).unwrap();
    let mut expected = old.clone();
    expected[BLOCK_BYTES..3 * BLOCK_BYTES].copy_from_slice(&new);
    let whole = [Extent::new(0, 4 * BLOCK_BYTES as u64)];
    let mut out = vec![0; 4 * BLOCK_BYTES];
    store.read(&fork, &whole, &mut out).unwrap();
    assert_eq!(out, expected);
    drop(store);
    // And on disk, read back through the cache alone, checksums included.
    let reopened = Store::open(StoreConfig { init: false, bulk_bytes_min: 0, ..config }).unwrap();
    let mut out = vec![0; 4 * BLOCK_BYTES];
    reopened.read(&fork, &whole, &mut out).unwrap();
    assert_eq!(out, expected);
    assert_eq!(reopened.stats().checksum_errors, 0);
}

#[test]
fn flush_all_skips_a_fork_removed_after_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _config, fork) = bulk_store(dir.path(), BLOCK_BYTES as u64);
    let other = ForkRef::new(fork.target, FileId(7), SubfileIndex(0), "other");
    store.create_fork(&other).unwrap();
    // Bulk writes go to the fork files at once and leave both forks unsynced.
    for (seed, each) in [(5, &fork), (6, &other)] {
        store.write(each, &[Extent::new(0, BLOCK_BYTES as u64)], &pattern(BLOCK_BYTES, seed)).unwrap();
    }
    // Both forks in use (held, as by requests in flight); flush_all's snapshot, then the
    // removal it races with, then its sync.
    let _held = [store.hold_fork(&fork).unwrap(), store.hold_fork(&other).unwrap()];
    let live = store.live_forks();
    assert_eq!(live.len(), 2);
    store.remove_fork(&other).unwrap();
    store.sync_live(&live).expect("a removed fork has nothing to flush");
    store.flush_all().unwrap();
    let mut out = vec![0; BLOCK_BYTES];
    store.read(&fork, &[Extent::new(0, BLOCK_BYTES as u64)], &mut out).unwrap();
    assert_eq!(out, pattern(BLOCK_BYTES, 5));
}

#[test]
fn over_the_dirty_high_mark_every_shard_writes_back_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(vec![dir.path().to_path_buf()], true);
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = 64 * BLOCK_BYTES as u64;
    config.bulk_bytes_min = 0;
    config.dirty_bytes_high_max = 8 * BLOCK_BYTES as u64;
    let store = Store::open_sharded(config, 4).unwrap();
    assert_eq!(store.cache_shape(), (8, 8));
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(7), SubfileIndex(0)).ok();
    let fork = ForkRef::new(target, FileId(7), SubfileIndex(0), "data");
    // One block in each of 32 shard groups: dirty blocks in (nearly) every shard.
    for group in 0..32u64 {
        let extent = Extent::new(group * 8 * BLOCK_BYTES as u64, BLOCK_BYTES as u64);
        store.write(&fork, &[extent], &pattern(BLOCK_BYTES, group as u8)).unwrap();
    }
    let dirty_before = store.stats().dirty_bytes;
    assert!(dirty_before > 8 * BLOCK_BYTES as u64, "{dirty_before}");
    // Nothing is old enough; only the excess over the high mark goes, down to half of it.
    store.flush_aged(std::time::Duration::from_secs(3600)).unwrap();
    let dirty_after = store.stats().dirty_bytes;
    assert!(dirty_after <= 4 * BLOCK_BYTES as u64, "{dirty_before} -> {dirty_after}");
    store.check_invariants();
    for group in 0..32u64 {
        let mut out = vec![0; BLOCK_BYTES];
        store
            .read(&fork, &[Extent::new(group * 8 * BLOCK_BYTES as u64, BLOCK_BYTES as u64)], &mut out)
            .unwrap();
        assert_eq!(out, pattern(BLOCK_BYTES, group as u8), "group {group}");
    }
}

#[test]
fn a_bulk_write_over_a_block_written_back_keeps_the_newest_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _config, fork) = bulk_store(dir.path(), BLOCK_BYTES as u64);
    // Block 0 cached and clean after a write-back; a bulk write then replaces it.
    store.write(&fork, &[Extent::new(0, 100)], &pattern(100, 3)).unwrap();
    store.sync(&fork).unwrap();
    let new = pattern(BLOCK_BYTES, 4);
    store.write(&fork, &[Extent::new(0, BLOCK_BYTES as u64)], &new).unwrap();
    assert_eq!(store.stats().cached_bytes, 0, "the clean copy was dropped");
    let mut out = vec![0; BLOCK_BYTES];
    store.read(&fork, &[Extent::new(0, BLOCK_BYTES as u64)], &mut out).unwrap();
    assert_eq!(out, new);
}

#[test]
fn a_bulk_read_sees_dirty_cached_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _config, fork) = bulk_store(dir.path(), BLOCK_BYTES as u64);
    let base = pattern(8 * BLOCK_BYTES, 5);
    store.write(&fork, &[Extent::new(0, base.len() as u64)], &base).unwrap();
    assert_eq!(store.stats().bulk_writes, 1);
    // A small write dirties part of block 3 in the cache only.
    let patch = pattern(40, 6);
    store.write(&fork, &[Extent::new(3 * BLOCK_BYTES as u64 + 7, 40)], &patch).unwrap();
    assert_eq!(store.stats().dirty_bytes, BLOCK_BYTES as u64);
    let mut expected = base.clone();
    expected[3 * BLOCK_BYTES + 7..][..40].copy_from_slice(&patch);
    let before = store.stats();
    let mut out = vec![0; base.len()];
    store.read(&fork, &[Extent::new(0, base.len() as u64)], &mut out).unwrap();
    assert_eq!(out, expected);
    let after = store.stats().since(&before);
    assert_eq!(after.bulk_reads, 2, "blocks 0..3 and 4..8 straight from the file");
    assert_eq!(after.bulk_read_bytes, 7 * BLOCK_BYTES as u64);
}

#[test]
fn bulk_and_cached_requests_from_many_threads_keep_every_block_whole() {
    // Writers each write whole blocks of one byte value, bulk and cached, over the same
    // blocks; readers check that every block they see holds one value, and at the end every
    // block holds a value some writer wrote, on disk as in the cache.
    let dir = tempfile::tempdir().unwrap();
    let (store, config, fork) = bulk_store(dir.path(), 2 * BLOCK_BYTES as u64);
    let blocks = 16u64;
    let span = blocks * BLOCK_BYTES as u64;
    store.write(&fork, &[Extent::new(0, span)], &vec![1u8; span as usize]).unwrap();
    std::thread::scope(|scope| {
        for writer in 0..3u8 {
            let (store, fork) = (&store, &fork);
            scope.spawn(move || {
                for round in 0..200u64 {
                    let value = 2 + writer * 50 + (round % 50) as u8;
                    let first = (round * 7 + u64::from(writer) * 3) % (blocks - 4);
                    let count = 1 + round % 4;
                    let extent = Extent::new(first * BLOCK_BYTES as u64, count * BLOCK_BYTES as u64);
                    store.write(fork, &[extent], &vec![value; extent.length as usize]).unwrap();
                    if round % 16 == 0 {
                        store.sync(fork).unwrap();
                    }
                }
            });
        }
        for _ in 0..2 {
            let (store, fork) = (&store, &fork);
            scope.spawn(move || {
                for round in 0..200u64 {
                    let mut out = vec![0u8; span as usize];
                    let extent = Extent::new(0, span - (round % 3) * BLOCK_BYTES as u64);
                    store.read(fork, &[extent], &mut out[..extent.length as usize]).unwrap();
                    for block in out[..extent.length as usize].chunks(BLOCK_BYTES) {
                        assert!(block.iter().all(|byte| *byte == block[0]), "a torn block");
                    }
                }
            });
        }
    });
    store.check_invariants();
    let mut cached = vec![0u8; span as usize];
    store.read(&fork, &[Extent::new(0, span)], &mut cached).unwrap();
    assert!(store.stats().bulk_writes > 0 && store.stats().bulk_reads > 0);
    assert_eq!(store.stats().checksum_errors, 0);
    drop(store);
    let reopened = Store::open(StoreConfig { init: false, bulk_bytes_min: 0, ..config }).unwrap();
    let mut on_disk = vec![0u8; span as usize];
    reopened.read(&fork, &[Extent::new(0, span)], &mut on_disk).unwrap();
    assert_eq!(on_disk, cached);
    assert_eq!(reopened.stats().checksum_errors, 0);
}

#[test]
fn a_bulk_gate_keeps_the_cache_and_conflicting_bulk_writes_out_until_it_opens() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (store, _config, fork) = bulk_store(dir.path(), BLOCK_BYTES as u64);
    let data = pattern(4 * BLOCK_BYTES, 1);
    store.write(&fork, &[Extent::new(0, data.len() as u64)], &data).unwrap();
    let block = BLOCK_BYTES as u64;
    for write in [true, false] {
        let (runs, gate, _live) = store.hold_bulk_gate(&fork, 1, 3, write);
        assert_eq!(runs, [crate::block_cache::BulkRun { first: 1, end: 3, direct: true }]);
        let small_read_done = AtomicBool::new(false);
        let bulk_write_done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut out = [0u8; 10];
                store.read(&fork, &[Extent::new(2 * block + 5, 10)], &mut out).unwrap();
                assert_eq!(out, data[2 * BLOCK_BYTES + 5..][..10]);
                small_read_done.store(true, Ordering::SeqCst);
            });
            scope.spawn(|| {
                store.write(&fork, &[Extent::new(0, 4 * block)], &data).unwrap();
                bulk_write_done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(200));
            // A block missing from the cache inside any gate is not taken up; a bulk write
            // overlapping any gate waits.
            assert!(
                !small_read_done.load(Ordering::SeqCst),
                "a gated block was loaded (write gate: {write})"
            );
            assert!(!bulk_write_done.load(Ordering::SeqCst), "a bulk write passed a gate");
            drop(gate);
        });
        assert!(small_read_done.load(Ordering::SeqCst) && bulk_write_done.load(Ordering::SeqCst));
        store.check_invariants();
        // A bulk write over blocks nobody pins drops their cached copies.
        store.write(&fork, &[Extent::new(0, 4 * block)], &data).unwrap();
        assert_eq!(store.stats().cached_bytes, 0);
    }
    // Two read gates share their blocks.
    let (_runs, first, _live) = store.hold_bulk_gate(&fork, 0, 4, false);
    let (_runs, second, _live) = store.hold_bulk_gate(&fork, 1, 2, false);
    drop((first, second));
}

/// Writers (each checking its own region at the end), readers over every region, a thread
/// truncating and recreating a second fork, and a flusher, on a cache of 8 shards of 4 slots
/// far too small for all of their windows at once. Fails if it has not finished in 60 s.
#[test]
fn sharded_cache_under_pressure_neither_deadlocks_nor_loses_data() {
    use std::time::Duration;
    const REGION_BLOCKS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(vec![dir.path().to_path_buf()], true);
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = 32 * BLOCK_BYTES as u64;
    config.cache_shards = 8;
    config.bulk_bytes_min = 0;
    config.dirty_bytes_high_max = 4 * BLOCK_BYTES as u64;
    let store = Arc::new(Store::open_sharded(config, 4).unwrap());
    assert_eq!(store.cache_shape(), (8, 4));
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(7), SubfileIndex(0)).unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let workload = {
        let store = store.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(pressure_workload(&store, target));
        })
    };
    let models = match done_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(models) => models,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("deadlock: the workload did not finish within 60 s")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the workload panicked"),
    };
    workload.join().unwrap();
    let fork = ForkRef::new(target, FileId(7), SubfileIndex(0), "data");
    for (writer, model) in models.iter().enumerate() {
        let start = writer as u64 * REGION_BLOCKS * BLOCK_BYTES as u64;
        let mut out = vec![0; model.len()];
        store.read(&fork, &[Extent::new(start, model.len() as u64)], &mut out).unwrap();
        assert!(out == *model, "region of writer {writer} differs");
    }
    store.check_invariants();
    assert!(store.stats().cache_lock_waits > 0 || store.stats().evictions > 0);
}

/// The threads of `sharded_cache_under_pressure_neither_deadlocks_nor_loses_data`; returns
/// what each writer's region must hold.
fn pressure_workload(store: &Store, target: flotilla_types::TargetId) -> Vec<Vec<u8>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    const REGION_BLOCKS: u64 = 40;
    let fork = ForkRef::new(target, FileId(7), SubfileIndex(0), "data");
    let other = ForkRef::new(target, FileId(7), SubfileIndex(0), "other");
    store.create_fork(&other).unwrap();
    let writing = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let writers: Vec<_> = (0..3u64)
            .map(|writer| {
                let fork = &fork;
                scope.spawn(move || write_region(store, fork, writer * REGION_BLOCKS, REGION_BLOCKS))
            })
            .collect();
        for reader in 0..2u64 {
            let (fork, writing) = (&fork, &writing);
            scope.spawn(move || read_everywhere(store, fork, reader, 3 * REGION_BLOCKS, writing));
        }
        scope.spawn(|| churn_fork(store, &other, &writing));
        scope.spawn(|| flush_while(store, &writing));
        let models = writers.into_iter().map(|writer| writer.join()).collect::<Vec<_>>();
        writing.store(false, Ordering::SeqCst);
        models.into_iter().map(|model| model.expect("a writer panicked")).collect()
    })
}

/// Writes scattered extents (so windows span shards) into `blocks` blocks from `first`;
/// returns what the region must hold.
fn write_region(store: &Store, fork: &ForkRef<'_>, first: u64, blocks: u64) -> Vec<u8> {
    let region_bytes = blocks * BLOCK_BYTES as u64;
    let base = first * BLOCK_BYTES as u64;
    let mut model = vec![0u8; region_bytes as usize];
    for round in 0..300u64 {
        let extents: Vec<Extent> = (0..1 + round % 7)
            .map(|at| {
                let offset = (round * 1031 + at * 4099 + first * 7) % (region_bytes - 1);
                let length = (1 + (round * 37 + at * 101) % 1500).min(region_bytes - offset);
                Extent::new(base + offset, length)
            })
            .collect();
        let total: u64 = extents.iter().map(|extent| extent.length).sum();
        let data = pattern(total as usize, (round + first) as u8);
        store.write(fork, &extents, &data).unwrap();
        let local: Vec<Extent> =
            extents.iter().map(|extent| Extent::new(extent.offset - base, extent.length)).collect();
        model_write(&mut model, &local, &data);
    }
    model.resize(region_bytes as usize, 0);
    model
}

fn read_everywhere(
    store: &Store,
    fork: &ForkRef<'_>,
    seed: u64,
    blocks: u64,
    writing: &std::sync::atomic::AtomicBool,
) {
    let span = blocks * BLOCK_BYTES as u64;
    let mut round = seed;
    while writing.load(std::sync::atomic::Ordering::SeqCst) {
        round += 1;
        let extents: Vec<Extent> =
            (0..4).map(|at| Extent::new((round * 2053 + at * 8209) % (span - 3000), 3000)).collect();
        let mut out = vec![0; 12000];
        store.read(fork, &extents, &mut out).unwrap();
    }
}

/// Writes, truncates and recreates a fork (drop_fork and truncate_blocks under load).
fn churn_fork(store: &Store, fork: &ForkRef<'_>, writing: &std::sync::atomic::AtomicBool) {
    let mut round = 0u64;
    while writing.load(std::sync::atomic::Ordering::SeqCst) {
        round += 1;
        store.write(fork, &[Extent::new(round % 5000, 6000)], &pattern(6000, round as u8)).unwrap();
        store.truncate(fork, (round * 777) % 9000).unwrap();
        if round.is_multiple_of(8) {
            store.remove_fork(fork).unwrap();
            store.create_fork(fork).unwrap();
        }
    }
}

/// Writes back aged blocks and flushes everything, including the fork `churn_fork` removes
/// and creates again meanwhile.
fn flush_while(store: &Store, writing: &std::sync::atomic::AtomicBool) {
    while writing.load(std::sync::atomic::Ordering::SeqCst) {
        store.flush_aged(std::time::Duration::ZERO).unwrap();
        store.flush_all().unwrap();
    }
}
