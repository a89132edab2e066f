//! Cold reads of one `dir` target by several reader threads at once, with 1 and with N disk
//! threads per target alternated in one process (queue depth 1 against N; issue 12). A fork
//! of `FORK_MIB` MiB is written and synced once; each pass drops the OS page cache (as root;
//! otherwise the reads come from it), opens a store with a 16 MiB cache and the given disk
//! threads, and has `READERS` threads read their own quarter of the fork in 256 KiB requests
//! through the cache (`bulk_bytes_min = 0`, so every block is a disk-thread read).
//!
//! `cargo run --release -p flotilla-store --example disk_depth_bench -- ROUNDS THREADS...`
//! (default: 3 rounds of 1 and 4 threads).

use flotilla_store::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use std::path::Path;
use std::time::Instant;

const FORK_MIB: u64 = 256;
const REQUEST_BYTES: u64 = 256 << 10;
const READERS: u64 = 4;

fn config(dir: &Path, disk_threads: usize) -> StoreConfig {
    let mut config = StoreConfig::new(vec![dir.to_path_buf()], true);
    config.cache_capacity_bytes = 16 << 20;
    config.bulk_bytes_min = 0;
    config.disk_threads_per_target = disk_threads;
    config
}

fn fork_of(store: &Store) -> ForkRef<'static> {
    ForkRef::new(store.target_ids()[0], FileId(1), SubfileIndex(0), "data")
}

fn write_fork(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(config(dir, 1))?;
    store.create_subfile(store.target_ids()[0], FileId(1), SubfileIndex(0))?;
    let data: Vec<u8> = (0..1u64 << 20).map(|at| (at * 31 % 251) as u8).collect();
    for mib in 0..FORK_MIB {
        store.write(&fork_of(&store), &[Extent::new(mib << 20, 1 << 20)], &data)?;
    }
    store.sync(&fork_of(&store))?;
    Ok(())
}

/// Drops the OS page cache; false when not allowed (not root).
fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync").status().is_ok_and(|status| status.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// One pass: returns MB/s and the transfers that overlapped another.
fn read_pass(dir: &Path, disk_threads: usize) -> Result<(f64, u64), Box<dyn std::error::Error>> {
    let store = Store::open(StoreConfig { init: false, ..config(dir, disk_threads) })?;
    let share = (FORK_MIB << 20) / READERS;
    let started = Instant::now();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|reader| {
                let store = &store;
                scope.spawn(move || -> Result<(), flotilla_store::StoreError> {
                    let mut out = vec![0u8; REQUEST_BYTES as usize];
                    for offset in (reader * share..(reader + 1) * share).step_by(REQUEST_BYTES as usize) {
                        store.read(&fork_of(store), &[Extent::new(offset, REQUEST_BYTES)], &mut out)?;
                    }
                    Ok(())
                })
            })
            .collect();
        readers.into_iter().try_for_each(|reader| reader.join().expect("a reader panicked"))
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats();
    assert_eq!(stats.checksum_errors, 0);
    Ok(((FORK_MIB << 20) as f64 / seconds / 1e6, stats.disk_runs_overlapped))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).map(|arg| arg.parse()).collect::<Result<_, _>>()?;
    let rounds = args.first().copied().unwrap_or(3);
    let threads = if args.len() > 1 { args[1..].to_vec() } else { vec![1, 4] };
    let dir = tempfile::tempdir_in(std::env::var("FLOTILLA_BENCH_DIR").unwrap_or_else(|_| ".".into()))?;
    write_fork(dir.path())?;
    println!("round\tdisk_threads\tcold\tMB/s\toverlapped\tload1");
    for round in 1..=rounds {
        for &disk_threads in &threads {
            let cold = drop_page_cache();
            let (rate, overlapped) = read_pass(dir.path(), disk_threads)?;
            let load = std::fs::read_to_string("/proc/loadavg")?;
            let load1 = load.split_whitespace().next().unwrap_or("?").to_string();
            println!("{round}\t{disk_threads}\t{cold}\t{rate:.1}\t{overlapped}\t{load1}");
        }
    }
    Ok(())
}
