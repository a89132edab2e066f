//! Seeded power-loss tests over the crash-modelling backend (`crash:DIR` targets): write,
//! sync some forks, lose power (unsynced writes kept, dropped or torn by sector), reopen, and
//! check that (a) every durable byte reads back exactly, (b) no torn block passes its
//! checksum, and (c) never-synced blocks read as some version that was written, or fail with
//! a checksum error. Writes are mixed with truncates. Every failure message names the seed; `FLOTILLA_POWER_LOSS_SEED=N`
//! runs only seed N.

mod common;

use common::{FILE, SUBFILE};
use flotilla_store::{CrashDisk, Extent, ForkRef, Store, StoreConfig, StoreError};
use flotilla_types::TargetId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::time::Duration;

const BLOCK_BYTES: usize = 4096;
const FORK_BYTES_MAX: usize = 64 * 1024;
const FORK_NAMES: [&str; 4] = ["data", "f1", "f2", "f3"];
const SEEDS: u64 = 48;

/// Every version a fork's bytes went through since its last sync (the first is durable).
struct ForkModel {
    versions: Vec<Vec<u8>>,
    synced: bool,
}

impl ForkModel {
    fn latest(&self) -> &Vec<u8> {
        self.versions.last().expect("a model has at least one version")
    }

    /// Block `index` of version `version`, zero-padded past its end.
    fn block(&self, version: usize, index: usize) -> Vec<u8> {
        let bytes = &self.versions[version];
        let start = (index * BLOCK_BYTES).min(bytes.len());
        let end = ((index + 1) * BLOCK_BYTES).min(bytes.len());
        let mut block = bytes[start..end].to_vec();
        block.resize(BLOCK_BYTES, 0);
        block
    }
}

#[derive(Default)]
struct Tally {
    checksum_errors: u64,
    blocks_not_durable: u64,
    torn_writes: u64,
    bulk_writes: u64,
    bulk_reads: u64,
}

/// What varies between the runs: bulk pieces from `bulk_bytes_min` (0: none), and disk
/// threads per target.
#[derive(Clone, Copy, Debug)]
struct Setup {
    bulk_bytes_min: u64,
    disk_threads: usize,
}

const CACHE_ONLY: Setup = Setup { bulk_bytes_min: 0, disk_threads: 1 };

fn store_config(dir: &Path, init: bool, setup: Setup) -> StoreConfig {
    let spec = format!("crash:{}", dir.display());
    let mut config = StoreConfig::new(vec![spec.into()], init);
    config.bulk_bytes_min = setup.bulk_bytes_min;
    config.disk_threads_per_target = setup.disk_threads;
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = 48 * BLOCK_BYTES as u64;
    config.dirty_bytes_high_max = 24 * BLOCK_BYTES as u64;
    config
}

fn fork_ref(target: TargetId, index: usize) -> ForkRef<'static> {
    ForkRef::new(target, FILE, SUBFILE, FORK_NAMES[index])
}

/// A random write, or now and then a truncate to a random size.
fn random_write(store: &Store, fork: &ForkRef<'_>, model: &mut ForkModel, rng: &mut StdRng) {
    if rng.random_bool(0.15) {
        let size = rng.random_range(0..FORK_BYTES_MAX);
        store.truncate(fork, size as u64).unwrap();
        let mut next = model.latest().clone();
        next.resize(size, 0);
        model.versions.push(next);
        return;
    }
    let offset = rng.random_range(0..FORK_BYTES_MAX - 1);
    let length = rng.random_range(1..=(FORK_BYTES_MAX - offset).min(12 * 1024));
    let data: Vec<u8> = (0..length).map(|_| rng.random()).collect();
    store.write(fork, &[Extent::new(offset as u64, length as u64)], &data).unwrap();
    let mut next = model.latest().clone();
    if next.len() < offset + length {
        next.resize(offset + length, 0);
    }
    next[offset..offset + length].copy_from_slice(&data);
    model.versions.push(next);
}

/// Phase 1 (all synced), phase 2 (some synced, write-backs of the rest), then power loss.
fn write_and_crash(
    dir: &Path,
    seed: u64,
    setup: Setup,
    rng: &mut StdRng,
    tally: &mut Tally,
) -> Vec<ForkModel> {
    let store = Store::open(store_config(dir, true, setup)).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FILE, SUBFILE).unwrap();
    let forks: Vec<ForkRef<'_>> = (0..FORK_NAMES.len()).map(|index| fork_ref(target, index)).collect();
    for fork in &forks[1..] {
        store.create_fork(fork).unwrap();
    }
    let mut models: Vec<ForkModel> =
        forks.iter().map(|_| ForkModel { versions: vec![Vec::new()], synced: false }).collect();
    for (fork, model) in forks.iter().zip(&mut models) {
        for _ in 0..rng.random_range(0..4) {
            random_write(&store, fork, model, rng);
        }
    }
    store.sync_many(&forks).unwrap();
    for model in &mut models {
        let durable = model.latest().clone();
        model.versions = vec![durable];
    }
    for _ in 0..rng.random_range(1..16) {
        let index = rng.random_range(0..forks.len());
        random_write(&store, &forks[index], &mut models[index], rng);
        if rng.random_bool(0.4) {
            store.flush_aged(Duration::ZERO).unwrap();
        }
    }
    let synced: Vec<usize> = (0..forks.len()).filter(|_| rng.random_bool(0.5)).collect();
    let to_sync: Vec<ForkRef<'_>> = synced.iter().map(|index| forks[*index]).collect();
    store.sync_many(&to_sync).unwrap();
    for index in synced {
        let durable = models[index].latest().clone();
        models[index] = ForkModel { versions: vec![durable], synced: true };
    }
    tally.bulk_writes += store.stats().bulk_writes;
    let report = CrashDisk::for_dir(dir).power_loss(seed);
    tally.torn_writes += report.writes_torn;
    drop(store); // its shutdown flush fails: the device it wrote to is gone
    models
}

fn check_after_crash(dir: &Path, seed: u64, setup: Setup, models: &[ForkModel], tally: &mut Tally) {
    let store = Store::open(store_config(dir, false, setup)).unwrap();
    let target = store.target_ids()[0];
    for (index, model) in models.iter().enumerate() {
        let fork = fork_ref(target, index);
        let size = store.fork_size(&fork).unwrap() as usize;
        if model.synced {
            assert_eq!(size, model.latest().len(), "seed {seed}: size of synced fork {}", FORK_NAMES[index]);
        }
        let longest = model.versions.iter().map(Vec::len).max().unwrap_or(0).max(size);
        for block in 0..longest.div_ceil(BLOCK_BYTES) {
            check_block(&store, &fork, model, block, seed, tally);
        }
    }
    tally.bulk_reads += store.stats().bulk_reads;
}

fn check_block(
    store: &Store,
    fork: &ForkRef<'_>,
    model: &ForkModel,
    block: usize,
    seed: u64,
    tally: &mut Tally,
) {
    let mut out = vec![0u8; BLOCK_BYTES];
    let extent = Extent::new((block * BLOCK_BYTES) as u64, BLOCK_BYTES as u64);
    let name = fork.fork;
    match store.read(fork, &[extent], &mut out) {
        Ok(()) if model.synced => {
            assert!(out == model.block(0, block), "seed {seed}: durable block {block} of {name} differs");
        }
        Ok(()) => {
            let version = (0..model.versions.len()).find(|version| model.block(*version, block) == out);
            assert!(
                version.is_some(),
                "seed {seed}: block {block} of {name} is no version ever written (torn?)"
            );
            tally.blocks_not_durable += u64::from(version != Some(0));
        }
        Err(StoreError::ChecksumMismatch { offset, .. }) => {
            assert!(!model.synced, "seed {seed}: durable block {block} of {name} failed its checksum");
            assert_eq!(
                offset / BLOCK_BYTES as u64,
                block as u64,
                "seed {seed}: mismatch names the wrong offset"
            );
            tally.checksum_errors += 1;
        }
        Err(other) => panic!("seed {seed}: reading block {block} of {name}: {other}"),
    }
}

fn run_seed(seed: u64, setup: Setup, tally: &mut Tally) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let models = write_and_crash(dir.path(), seed, setup, &mut rng, tally);
    check_after_crash(dir.path(), seed, setup, &models, tally);
}

#[test]
fn after_power_loss_durable_bytes_survive_and_no_torn_block_passes() {
    power_loss_seeds(CACHE_ONLY);
}

/// The same with three disk threads: a sync must wait for the write-backs of every thread.
#[test]
fn after_power_loss_on_three_disk_threads_durable_bytes_survive() {
    power_loss_seeds(Setup { disk_threads: 3, ..CACHE_ONLY });
}

/// The same with bulk pieces from one block: most writes put whole blocks straight into the
/// fork (data, then checksum entries) and every check after the crash reads straight from it.
#[test]
fn after_power_loss_bulk_written_bytes_survive_and_no_torn_block_passes() {
    power_loss_seeds(Setup { bulk_bytes_min: BLOCK_BYTES as u64, ..CACHE_ONLY });
}

fn power_loss_seeds(setup: Setup) {
    let seeds: Vec<u64> = match std::env::var("FLOTILLA_POWER_LOSS_SEED") {
        Ok(seed) => vec![seed.parse().expect("FLOTILLA_POWER_LOSS_SEED is a number")],
        Err(_) => (0..SEEDS).collect(),
    };
    let mut tally = Tally::default();
    for seed in &seeds {
        run_seed(*seed, setup, &mut tally);
    }
    if seeds.len() > 1 {
        // The test must have met what it checks: torn writes, caught blocks, surviving new data.
        assert!(tally.torn_writes > 0, "no write was torn in {} seeds", seeds.len());
        assert!(tally.checksum_errors > 0, "no block failed its checksum in {} seeds", seeds.len());
        assert!(tally.blocks_not_durable > 0, "no unsynced write survived in {} seeds", seeds.len());
        if setup.bulk_bytes_min > 0 {
            assert!(tally.bulk_writes > 0 && tally.bulk_reads > 0, "the bulk path was not taken");
        }
    }
}

#[test]
fn a_store_cut_off_by_power_loss_cannot_write_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(store_config(dir.path(), true, CACHE_ONLY)).unwrap();
    let target = store.target_ids()[0];
    store.create_subfile(target, FILE, SUBFILE).unwrap();
    let fork = fork_ref(target, 0);
    store.write(&fork, &[Extent::new(0, 5)], b"first").unwrap();
    store.sync(&fork).unwrap();
    store.write(&fork, &[Extent::new(0, 6)], b"second").unwrap();
    CrashDisk::for_dir(dir.path()).power_loss(1);
    assert!(store.sync(&fork).is_err(), "a sync after power loss succeeded");
    drop(store);
    let store = Store::open(store_config(dir.path(), false, CACHE_ONLY)).unwrap();
    let mut out = [0u8; 5];
    store.read(&fork_ref(target, 0), &[Extent::new(0, 5)], &mut out).unwrap();
    assert_eq!(&out, b"first");
}
