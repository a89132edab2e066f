//! `Store::prefetch`: ready when cached, pending (one callback) when not, pins held until
//! the handle drops, and declined — nothing pinned — when there is no room.

use crate::{Declined, Extent, ForkRef, PendingLoads, Prefetch, ReadOrPrefetch, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const BLOCK_BYTES: u64 = 512;

fn config(dir: &std::path::Path, cache_blocks: u64) -> StoreConfig {
    let mut config = StoreConfig::new(vec![dir.to_path_buf()], true);
    config.block_bytes = BLOCK_BYTES;
    config.cache_capacity_bytes = cache_blocks * BLOCK_BYTES;
    config.bulk_bytes_min = 0;
    config
}

fn open(config: &StoreConfig) -> (Store, ForkRef<'static>) {
    let store = Store::open(config.clone()).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(7), SubfileIndex(0)).ok();
    (store, ForkRef::new(target, FileId(7), SubfileIndex(0), "data"))
}

fn blocks(first: u64, count: u64) -> Vec<Extent> {
    vec![Extent::new(first * BLOCK_BYTES, count * BLOCK_BYTES)]
}

fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|at| (at % 251) as u8).collect()
}

/// A store whose first `count` blocks are on disk and not cached (written, then reopened).
fn cold_store(dir: &std::path::Path, cache_blocks: u64, count: u64) -> (Store, ForkRef<'static>) {
    let config = config(dir, cache_blocks);
    {
        let (store, fork) = open(&config);
        for first in 0..count {
            store.write(&fork, &blocks(first, 1), &pattern(BLOCK_BYTES as usize)).unwrap();
        }
    }
    open(&StoreConfig { init: false, ..config })
}

fn pending(prefetch: Prefetch) -> PendingLoads {
    match prefetch {
        Prefetch::Pending(loads) => loads,
        other => panic!("expected pending loads, got {other:?}"),
    }
}

#[test]
fn cached_blocks_are_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = open(&config(dir.path(), 16));
    store.write(&fork, &blocks(0, 4), &pattern(4 * BLOCK_BYTES as usize)).unwrap();
    assert!(matches!(store.prefetch(&fork, &blocks(0, 4), false).unwrap(), Prefetch::Ready));
    assert_eq!(store.pinned_slots(), 0, "a ready prefetch keeps nothing pinned");
    store.check_invariants();
}

#[test]
fn missing_blocks_pend_call_back_once_and_stay_pinned_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = cold_store(dir.path(), 16, 4);
    let loads = pending(store.prefetch(&fork, &blocks(0, 4), false).unwrap());
    assert_eq!(loads.pinned_blocks(), 4);
    assert_eq!(store.pinned_slots(), 4);
    store.check_invariants();
    let calls = Arc::new(AtomicUsize::new(0));
    let (sender, handles) = mpsc::channel();
    let counted = calls.clone();
    loads.when_loaded(move |loads| {
        counted.fetch_add(1, Ordering::SeqCst);
        sender.send(loads).unwrap();
    });
    let loads = handles.recv_timeout(Duration::from_secs(10)).expect("the loads call back");
    assert!(loads.is_loaded() && !loads.failed());
    assert_eq!(store.pinned_slots(), 4, "pinned while the handle lives");
    store.check_invariants();
    drop(loads);
    assert_eq!(store.pinned_slots(), 0, "unpinned when the handle drops");
    store.check_invariants();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called back exactly once");
    let misses = store.stats().cache_misses;
    let mut out = vec![0u8; 4 * BLOCK_BYTES as usize];
    store.read(&fork, &blocks(0, 4), &mut out).unwrap();
    assert_eq!(store.stats().cache_misses, misses, "the request found its blocks cached");
    assert_eq!(&out[..BLOCK_BYTES as usize], &pattern(BLOCK_BYTES as usize)[..]);
}

#[test]
fn prefetch_pins_are_bounded_by_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    // 8 slots: windows of 4, prefetches may pin 8 - 4 together.
    let (store, fork) = cold_store(dir.path(), 8, 6);
    let held = pending(store.prefetch(&fork, &blocks(0, 4), false).unwrap());
    let refused = store.prefetch(&fork, &blocks(4, 1), false).unwrap();
    assert!(matches!(refused, Prefetch::Declined(Declined::NoRoom)), "{refused:?}");
    assert_eq!(store.pinned_slots(), 4, "the declined prefetch pinned nothing");
    drop(held);
    let loads = pending(store.prefetch(&fork, &blocks(4, 1), false).unwrap());
    drop(loads);
    store.check_invariants();
}

#[test]
fn no_room_declines_and_the_blocking_read_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = open(&StoreConfig { cache_shards: 1, ..config(dir.path(), 8) });
    // Every slot dirty: no free or clean room without a write-back.
    store.write(&fork, &blocks(0, 4), &pattern(4 * BLOCK_BYTES as usize)).unwrap();
    store.write(&fork, &blocks(4, 4), &pattern(4 * BLOCK_BYTES as usize)).unwrap();
    assert_eq!(store.stats().dirty_bytes, 8 * BLOCK_BYTES);
    let declined = store.prefetch(&fork, &blocks(10, 1), false).unwrap();
    assert!(matches!(declined, Prefetch::Declined(Declined::NoRoom)), "{declined:?}");
    assert_eq!(store.pinned_slots(), 0);
    store.check_invariants();
    let mut out = vec![1u8; BLOCK_BYTES as usize];
    store.read(&fork, &blocks(10, 1), &mut out).unwrap();
    assert!(out.iter().all(|&byte| byte == 0), "past the end reads as zeros");
}

#[test]
fn a_shard_without_room_declines_while_another_shard_has_room() {
    let dir = tempfile::tempdir().unwrap();
    // 8 slots in 2 shards of 4; blocks 0..4 share a shard group, so they fill one shard.
    let (store, fork) = cold_store(dir.path(), 8, 0);
    assert_eq!(store.cache_shape(), (2, 4));
    store.write(&fork, &blocks(0, 4), &pattern(4 * BLOCK_BYTES as usize)).unwrap();
    assert_eq!(store.stats().dirty_bytes, 4 * BLOCK_BYTES);
    let full = store.cache_shard_of(&fork, 0);
    let group_in = |wanted: bool| {
        (1..64).map(|group| group * 8).find(|&block| (store.cache_shard_of(&fork, block) == full) == wanted)
    };
    let (same, other) = (group_in(true).unwrap(), group_in(false).unwrap());
    let declined = store.prefetch(&fork, &blocks(same, 1), false).unwrap();
    assert!(matches!(declined, Prefetch::Declined(Declined::NoRoom)), "{declined:?}");
    assert_eq!(store.pinned_slots(), 0, "the declined prefetch pinned nothing");
    // Past the end: a zero-filled block, pinned, with nothing to read.
    assert!(matches!(store.prefetch(&fork, &blocks(other, 1), false).unwrap(), Prefetch::Ready));
    store.check_invariants();
    let mut out = vec![1u8; BLOCK_BYTES as usize];
    store.read(&fork, &blocks(same, 1), &mut out).unwrap();
    assert!(out.iter().all(|&byte| byte == 0), "the blocking read writes back and reads");
    store.check_invariants();
}

#[test]
fn requests_of_many_windows_are_declined() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = cold_store(dir.path(), 8, 6);
    let declined = store.prefetch(&fork, &blocks(0, 5), false).unwrap();
    assert!(matches!(declined, Prefetch::Declined(Declined::ManyWindows)), "{declined:?}");
    assert_eq!(store.pinned_slots(), 0);
}

#[test]
fn a_write_prefetches_only_its_partly_covered_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = cold_store(dir.path(), 16, 4);
    // Blocks 0 and 1 whole, half of block 2: only block 2 is read first.
    let partial = [Extent::new(0, 2 * BLOCK_BYTES + BLOCK_BYTES / 2)];
    let loads = pending(store.prefetch(&fork, &partial, true).unwrap());
    assert_eq!(loads.pinned_blocks(), 1);
    drop(loads);
    assert!(matches!(store.prefetch(&fork, &blocks(0, 2), true).unwrap(), Prefetch::Ready));
    store.check_invariants();
    // No block the write covers whole was cached as zeros by the prefetch.
    let mut out = vec![0u8; BLOCK_BYTES as usize];
    store.read(&fork, &blocks(0, 1), &mut out).unwrap();
    assert_eq!(out, pattern(BLOCK_BYTES as usize));
}

/// Waits for a prefetch's loads, then drops the handle (unpinning its blocks).
fn wait_loaded(loads: PendingLoads) {
    let (sender, handles) = mpsc::channel();
    loads.when_loaded(move |loads| sender.send(loads).unwrap());
    let loads = handles.recv_timeout(Duration::from_secs(10)).expect("the loads call back");
    assert!(!loads.failed());
}

#[test]
fn a_read_found_cached_runs_at_once_and_one_that_is_not_only_starts_its_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = cold_store(dir.path(), 16, 4);
    let whole = pattern(BLOCK_BYTES as usize).repeat(2);
    let asked = AtomicUsize::new(0);
    let buffer = |bytes| {
        asked.fetch_add(1, Ordering::SeqCst);
        vec![0u8; bytes]
    };
    let loads = match store.read_or_prefetch(&fork, &blocks(1, 2), buffer).unwrap() {
        ReadOrPrefetch::Pending(loads) => loads,
        other => panic!("expected pending loads, got {other:?}"),
    };
    assert_eq!(asked.load(Ordering::SeqCst), 0, "no buffer is asked for before the loads");
    assert_eq!(store.stats().read_requests, 0, "nothing was read yet");
    wait_loaded(loads);
    assert_eq!(store.pinned_slots(), 0);
    let misses = store.stats().cache_misses;
    let outcome = store.read_or_prefetch(&fork, &blocks(1, 2), buffer).unwrap();
    let ReadOrPrefetch::Read(out) = outcome else { panic!("expected a read, got {outcome:?}") };
    assert_eq!(out, whole);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(store.stats().cache_misses, misses, "no block was loaded again");
    assert_eq!((store.stats().read_requests, store.stats().read_bytes), (1, whole.len() as u64));
    assert_eq!(store.pinned_slots(), 0, "the read unpinned its window");
    store.check_invariants();
}

#[test]
fn a_cached_read_of_small_strided_pieces_and_one_past_the_end_read_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, fork) = cold_store(dir.path(), 16, 2);
    wait_loaded(pending(store.prefetch(&fork, &blocks(0, 2), false).unwrap()));
    // Every other 16 bytes of blocks 0 and 1, in reverse order.
    let extents: Vec<Extent> = (0..2 * BLOCK_BYTES / 32).rev().map(|k| Extent::new(k * 32, 16)).collect();
    let outcome = store.read_or_prefetch(&fork, &extents, |bytes| vec![0u8; bytes]).unwrap();
    let ReadOrPrefetch::Read(strided) = outcome else { panic!("expected a read, got {outcome:?}") };
    let block = pattern(BLOCK_BYTES as usize);
    let expected: Vec<u8> = extents
        .iter()
        .flat_map(|e| {
            let at = (e.offset % BLOCK_BYTES) as usize;
            block[at..at + 16].to_vec()
        })
        .collect();
    assert_eq!(strided, expected);
    // Past the end of the fork: zeros, with no disk read.
    let outcome = store.read_or_prefetch(&fork, &blocks(6, 2), |bytes| vec![1u8; bytes]).unwrap();
    let ReadOrPrefetch::Read(out) = outcome else { panic!("expected a read, got {outcome:?}") };
    assert!(out.len() == 2 * BLOCK_BYTES as usize && out.iter().all(|&byte| byte == 0), "zeros");
    // A buffer of the wrong length is refused, and nothing stays pinned.
    let short = store.read_or_prefetch(&fork, &blocks(0, 1), |bytes| vec![0u8; bytes - 1]);
    assert!(matches!(short, Err(crate::StoreError::BufferLength { .. })), "{short:?}");
    assert_eq!(store.pinned_slots(), 0);
    store.check_invariants();
}
