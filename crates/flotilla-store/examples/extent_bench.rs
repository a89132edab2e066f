//! Rough throughput of the request path: many tiny extents and a few large ones, with the
//! cache warm and cold. Run with `cargo run --release -p flotilla-store --example extent_bench`.

use flotilla_store::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = StoreConfig::new(vec![dir.path().to_path_buf()], true);
    config.cache_capacity_bytes = 256 << 20;
    let store = Store::open(config)?;
    let target = store.target_ids()[0];
    store.create_subfile(target, FileId(1), SubfileIndex(0))?;
    let fork = ForkRef::new(target, FileId(1), SubfileIndex(0), "data");

    let count = 1u64 << 20;
    let tiny: Vec<Extent> = (0..count).map(|i| Extent::new(i * 128, 64)).collect();
    let data = vec![7u8; (count * 64) as usize];
    let mut out = vec![0u8; data.len()];
    time("write 1M x 64 B (new fork)", data.len(), || store.write(&fork, &tiny, &data))?;
    time("write 1M x 64 B (warm)", data.len(), || store.write(&fork, &tiny, &data))?;
    time("read 1M x 64 B (warm)", data.len(), || store.read(&fork, &tiny, &mut out))?;
    time("sync 128 MiB", 128 << 20, || store.sync(&fork))?;
    let large = [Extent::new(0, 64 << 20)];
    time("read 1 x 64 MiB (warm)", 64 << 20, || store.read(&fork, &large, &mut out))?;
    println!("{:?}", store.stats());
    Ok(())
}

fn time<E>(label: &str, bytes: usize, run: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
    let started = Instant::now();
    run()?;
    let seconds = started.elapsed().as_secs_f64();
    println!("{label:32} {:8.1} ms {:8.0} MB/s", seconds * 1e3, bytes as f64 / seconds / 1e6);
    Ok(())
}
