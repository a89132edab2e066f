//! Several disk threads per target (`disk_threads_per_target`) against real files: writers,
//! readers and a flusher hammer interleaved blocks of one fork through a tiny cache, so
//! write-backs and reads of neighbouring (and the same) blocks are in flight on different
//! threads at once; the data must read back exactly, before and after reopening, with every
//! checksum verified.

mod common;

use common::{config, data_fork, open_with_subfile, pattern, read_range};
use flotilla_store::{Extent, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BLOCK_BYTES: usize = 4096;
const WRITERS: u64 = 4;
const BLOCKS_PER_WRITER: u64 = 12;
const ROUNDS: u64 = 30;

/// Block `index` of writer `writer`: writers' blocks interleave, so a run of adjacent
/// blocks holds blocks of every writer.
fn block_of(writer: u64, index: u64) -> u64 {
    index * WRITERS + writer
}

/// What writer `writer` last wrote to its block `index` in round `round`.
fn content(writer: u64, index: u64, round: u64) -> Vec<u8> {
    pattern(BLOCK_BYTES, (writer << 32) | (index << 16) | round)
}

/// Each writer rewrites its blocks `ROUNDS` times (so a block's write-back can be queued
/// while an older one, or its read, is in flight) and reads each back at once.
fn write_rounds(store: &Store, target: flotilla_types::TargetId, writer: u64) {
    let fork = data_fork(target);
    for round in 0..ROUNDS {
        for index in 0..BLOCKS_PER_WRITER {
            let offset = block_of(writer, index) * BLOCK_BYTES as u64;
            let data = content(writer, index, round);
            store.write(&fork, &[Extent::new(offset, BLOCK_BYTES as u64)], &data).unwrap();
            assert_eq!(read_range(store, &fork, offset, BLOCK_BYTES), data, "writer {writer} block {index}");
        }
    }
}

fn check_last_round(store: &Store, target: flotilla_types::TargetId) {
    let fork = data_fork(target);
    for writer in 0..WRITERS {
        for index in 0..BLOCKS_PER_WRITER {
            let offset = block_of(writer, index) * BLOCK_BYTES as u64;
            let expected = content(writer, index, ROUNDS - 1);
            assert_eq!(
                read_range(store, &fork, offset, BLOCK_BYTES),
                expected,
                "writer {writer} block {index}"
            );
        }
    }
}

fn hammer(disk_threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), BLOCK_BYTES, 8);
    config.disk_threads_per_target = disk_threads;
    config.bulk_bytes_min = 0;
    config.disk_run_bytes_max = 4 * BLOCK_BYTES as u64;
    config.dirty_bytes_high_max = 2 * BLOCK_BYTES as u64;
    let (store, target) = open_with_subfile(config.clone());
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                store.flush_aged(Duration::ZERO).unwrap();
                store.sync(&data_fork(target)).unwrap();
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            std::thread::spawn(move || write_rounds(&store, target, writer))
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    flusher.join().unwrap();
    check_last_round(&store, target);
    store.sync(&data_fork(target)).unwrap();
    let stats = store.stats();
    assert_eq!(stats.checksum_errors, 0);
    assert!(
        stats.disk_reads > 0 && stats.disk_writes > 0,
        "the tiny cache must have gone to disk: {stats:?}"
    );
    drop(store);

    let reopened = Store::open(config).unwrap();
    check_last_round(&reopened, target);
    let stats = reopened.stats();
    let blocks = WRITERS * BLOCKS_PER_WRITER;
    assert!(
        stats.disk_read_blocks >= blocks - 8,
        "every block but those cached was read and checked: {stats:?}"
    );
    assert_eq!(stats.checksum_errors, 0);
}

#[test]
fn interleaved_writers_through_a_tiny_cache_on_three_disk_threads() {
    hammer(3);
}

#[test]
fn interleaved_writers_through_a_tiny_cache_on_one_disk_thread() {
    hammer(1);
}

/// Cold reads of many blocks from several readers at once on four disk threads: each reader
/// gets its own bytes, and the checksum of every block read is checked.
#[test]
fn concurrent_cold_readers_on_four_disk_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), BLOCK_BYTES, 16);
    config.disk_threads_per_target = 4;
    config.bulk_bytes_min = 0;
    let (store, target) = open_with_subfile(config.clone());
    let fork = data_fork(target);
    let bytes = 256 * BLOCK_BYTES;
    store.write(&fork, &[Extent::new(0, bytes as u64)], &pattern(bytes, 11)).unwrap();
    drop(store);

    let store = Arc::new(Store::open(config).unwrap());
    let readers: Vec<_> = (0..6u64)
        .map(|reader| {
            let store = store.clone();
            std::thread::spawn(move || {
                for pass in 0..3u64 {
                    let first = (reader * 37 + pass * 91) % 250;
                    let offset = first * BLOCK_BYTES as u64;
                    let got = read_range(&store, &data_fork(target), offset, 6 * BLOCK_BYTES);
                    let expected = &pattern(bytes, 11)[offset as usize..offset as usize + 6 * BLOCK_BYTES];
                    assert_eq!(got, expected, "reader {reader} pass {pass}");
                }
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    assert_eq!(store.stats().checksum_errors, 0);
}

#[test]
fn zero_disk_threads_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), BLOCK_BYTES, 16);
    config.disk_threads_per_target = 0;
    match Store::open(config) {
        Err(StoreError::BadConfig { name, .. }) => assert_eq!(name, "disk_threads_per_target"),
        other => panic!("expected BadConfig, got {other:?}"),
    }
}
