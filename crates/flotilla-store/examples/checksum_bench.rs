//! The cost of the data path's disk side: 256 MiB written in 1 MiB extents and synced, then
//! read back through a cold store cache (the OS page cache stays warm, so the read measures
//! the store's CPU cost per byte, checksum verification included). Run with `--release`.

use flotilla_store::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use std::time::Instant;

const TOTAL_BYTES: u64 = 256 << 20;
const EXTENT_BYTES: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = StoreConfig::new(vec![dir.path().to_path_buf()], true);
    config.cache_capacity_bytes = 64 << 20;
    let data: Vec<u8> = (0..EXTENT_BYTES).map(|at| (at * 31 % 251) as u8).collect();
    let fork_of = |store: &Store| ForkRef::new(store.target_ids()[0], FileId(1), SubfileIndex(0), "data");
    {
        let store = Store::open(config.clone())?;
        store.create_subfile(store.target_ids()[0], FileId(1), SubfileIndex(0))?;
        let fork = fork_of(&store);
        let started = Instant::now();
        for index in 0..TOTAL_BYTES / EXTENT_BYTES {
            store.write(&fork, &[Extent::new(index * EXTENT_BYTES, EXTENT_BYTES)], &data)?;
        }
        store.sync(&fork)?;
        report("write + sync 256 MiB", started);
    }
    config.init = false;
    let store = Store::open(config)?;
    let fork = fork_of(&store);
    let mut out = vec![0u8; EXTENT_BYTES as usize];
    let started = Instant::now();
    for index in 0..TOTAL_BYTES / EXTENT_BYTES {
        store.read(&fork, &[Extent::new(index * EXTENT_BYTES, EXTENT_BYTES)], &mut out)?;
    }
    report("read 256 MiB (cold store cache)", started);
    Ok(())
}

fn report(label: &str, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!("{label:34} {:8.1} ms {:8.0} MB/s", seconds * 1e3, TOTAL_BYTES as f64 / seconds / 1e6);
}
