//! Helpers shared by the integration tests.
#![allow(dead_code)]

use flotilla_store::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::path::Path;

pub const FILE: FileId = FileId(0xab);
pub const SUBFILE: SubfileIndex = SubfileIndex(3);

/// A store on one fresh target in `dir`, with `block_bytes` blocks and a cache of
/// `cache_blocks` blocks. With `FLOTILLA_TEST_TARGET_KIND` set (e.g. `lines`), the target is
/// of that kind (scripts/test.sh runs `tests/store.rs` on `lines` this way); with
/// `FLOTILLA_TEST_DISK_THREADS=N`, a `dir` target has N disk threads.
pub fn config(dir: &Path, block_bytes: usize, cache_blocks: u64) -> StoreConfig {
    let target = match std::env::var("FLOTILLA_TEST_TARGET_KIND") {
        Ok(kind) if !kind.is_empty() && kind != "dir" => format!("{kind}:{}", dir.display()).into(),
        _ => dir.to_path_buf(),
    };
    let mut config = StoreConfig::new(vec![target], true);
    config.block_bytes = block_bytes as u64;
    config.cache_capacity_bytes = cache_blocks * block_bytes as u64;
    if let Ok(threads) = std::env::var("FLOTILLA_TEST_DISK_THREADS") {
        config.disk_threads_per_target = threads.parse().expect("FLOTILLA_TEST_DISK_THREADS is a number");
    }
    config
}

/// Opens the store and creates the test subfile; returns the store and its target.
pub fn open_with_subfile(config: StoreConfig) -> (Store, TargetId) {
    let store = Store::open(config).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FILE, SUBFILE).unwrap();
    (store, target)
}

pub fn data_fork(target: TargetId) -> ForkRef<'static> {
    ForkRef::new(target, FILE, SUBFILE, "data")
}

pub fn pattern(length: usize, seed: u64) -> Vec<u8> {
    (0..length as u64).map(|at| (at.wrapping_mul(0x9e37_79b9).wrapping_add(seed) >> 7) as u8).collect()
}

pub fn read_range(store: &Store, fork: &ForkRef<'_>, offset: u64, length: usize) -> Vec<u8> {
    let mut out = vec![0xee; length];
    store.read(fork, &[Extent::new(offset, length as u64)], &mut out).unwrap();
    out
}
