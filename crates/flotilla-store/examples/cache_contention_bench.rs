//! Cache hits from several threads at once, with the cache index in one shard and in N
//! shards alternated in one process (issue 12, "the cache index sharded"). Each pass opens a
//! store (a `CACHE_MIB` cache of 32 KiB blocks, `bulk_bytes_min = 0`), writes and reads once the
//! blocks of `THREADS_MAX` threads (`BLOCKS_PER_THREAD` each, all cached), then has T threads
//! each read `READS` 32 KiB block-aligned pieces of its own blocks through `Store::read`:
//! every read is one cache hit (one pin and one unpin of one shard). Prints every pass, then
//! per thread count the median hits/s over the rounds for 1 shard and for N, and the cache
//! lock waits (a shard's mutex found held).
//!
//! `cargo run --release -p flotilla-store --example cache_contention_bench -- ROUNDS SHARDS READS CACHE_MIB`
//! (default: 5 rounds, 8 shards, 200000 reads per thread, 64 MiB). `SHARDS` is the
//! configured `cache_shards`, an upper bound: a 64 MiB cache uses 2 of 8 (windows of half
//! the cache), 512 MiB and up all 8.

use flotilla_store::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use std::path::Path;
use std::time::Instant;

const BLOCK_BYTES: u64 = 32 << 10;
const BLOCKS_PER_THREAD: u64 = 64;
const THREADS: [u64; 3] = [1, 2, 4];
const THREADS_MAX: u64 = 4;

fn fork_of(store: &Store) -> ForkRef<'static> {
    ForkRef::new(store.target_ids()[0], FileId(1), SubfileIndex(0), "data")
}

/// A store over `dir` with the blocks of every thread cached.
fn warm_store(dir: &Path, shards: usize, cache_mib: u64) -> Result<Store, Box<dyn std::error::Error>> {
    let mut config = StoreConfig::new(vec![dir.to_path_buf()], true);
    config.cache_capacity_bytes = cache_mib << 20;
    config.block_bytes = BLOCK_BYTES;
    config.bulk_bytes_min = 0;
    config.cache_shards = shards;
    let store = Store::open(config)?;
    store.create_subfile(store.target_ids()[0], FileId(1), SubfileIndex(0))?;
    let span_bytes = THREADS_MAX * BLOCKS_PER_THREAD * BLOCK_BYTES;
    let data: Vec<u8> = (0..span_bytes).map(|at| (at * 31 % 251) as u8).collect();
    store.write(&fork_of(&store), &[Extent::new(0, span_bytes)], &data)?;
    let mut out = vec![0u8; span_bytes as usize];
    store.read(&fork_of(&store), &[Extent::new(0, span_bytes)], &mut out)?;
    Ok(store)
}

/// One pass: `threads` threads reading `reads` hits each; returns (hits/s, lock waits).
fn hit_pass(store: &Store, threads: u64, reads: u64) -> Result<(f64, u64), Box<dyn std::error::Error>> {
    let before = store.stats();
    let started = Instant::now();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> Result<(), flotilla_store::StoreError> {
                    let mut out = vec![0u8; BLOCK_BYTES as usize];
                    let first = thread * BLOCKS_PER_THREAD;
                    for read in 0..reads {
                        let block = first + read % BLOCKS_PER_THREAD;
                        let extent = Extent::new(block * BLOCK_BYTES, BLOCK_BYTES);
                        store.read(&fork_of(store), &[extent], &mut out)?;
                    }
                    Ok(())
                })
            })
            .collect();
        readers.into_iter().try_for_each(|reader| reader.join().expect("a reader panicked"))
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats().since(&before);
    assert_eq!(stats.cache_misses, 0, "the cache was warm");
    Ok(((threads * reads) as f64 / seconds, stats.cache_lock_waits))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args().skip(1).map(|arg| arg.parse()).collect::<Result<_, _>>()?;
    let rounds = args.first().copied().unwrap_or(5) as usize;
    let shards_many = args.get(1).copied().unwrap_or(8) as usize;
    let reads = args.get(2).copied().unwrap_or(200_000);
    let cache_mib = args.get(3).copied().unwrap_or(64);
    let dir = tempfile::tempdir_in(std::env::var("FLOTILLA_BENCH_DIR").unwrap_or_else(|_| ".".into()))?;
    let layouts = [1, shards_many];
    // rates[layout][threads index]: one hits/s figure per round.
    let mut rates = vec![vec![Vec::new(); THREADS.len()]; layouts.len()];
    let mut waits = vec![vec![0u64; THREADS.len()]; layouts.len()];
    println!("round\tthreads\tshards\thits/s\tlock_waits");
    for round in 1..=rounds {
        for (at, &threads) in THREADS.iter().enumerate() {
            for (layout, &shards) in layouts.iter().enumerate() {
                let pass_dir = tempfile::tempdir_in(dir.path())?;
                let store = warm_store(pass_dir.path(), shards, cache_mib)?;
                let (rate, lock_waits) = hit_pass(&store, threads, reads)?;
                drop(store);
                println!("{round}\t{threads}\t{shards}\t{rate:.0}\t{lock_waits}");
                rates[layout][at].push(rate);
                waits[layout][at] += lock_waits;
            }
        }
    }
    println!("\nmedian over {rounds} rounds, {reads} reads per thread:");
    println!(
        "threads\thits/s 1 shard\thits/s {shards_many} shards\tratio\tlock waits 1\tlock waits {shards_many}"
    );
    for (at, threads) in THREADS.iter().enumerate() {
        let one = median(&mut rates[0][at]);
        let many = median(&mut rates[1][at]);
        println!("{threads}\t{one:.0}\t{many:.0}\t{:.2}\t{}\t{}", many / one, waits[0][at], waits[1][at]);
    }
    Ok(())
}
