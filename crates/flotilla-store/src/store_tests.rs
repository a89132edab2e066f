//! Property tests of the whole engine against an in-memory model, with a tiny block size and
//! cache so that windows, eviction and write-back under pressure are exercised constantly.

use crate::{Extent, ForkRef, Store, StoreConfig};
use flotilla_types::{FileId, SubfileIndex};
use proptest::prelude::*;

const BLOCK_BYTES: usize = 512;
const SPAN_BYTES: u64 = 24 * 1024;

#[derive(Clone, Debug)]
enum Op {
    Write(Vec<Extent>, u8),
    Read(Vec<Extent>),
    Sync,
    FlushAged,
    Truncate(u64),
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
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(vec![target_spec(kind, dir.path())], true);
    config.block_bytes = BLOCK_BYTES as u64;
    config.cache_capacity_bytes = cache_blocks * BLOCK_BYTES as u64;
    config.disk_run_bytes_max = 4 * BLOCK_BYTES as u64;
    config.dirty_bytes_high_max = 2 * BLOCK_BYTES as u64;
    let store = Store::open(config.clone()).unwrap();
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
    fn lines_matches_model_with_tiny_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 6, Kind::Lines);
    }

    #[test]
    fn lines_matches_model_with_roomy_cache(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, 256, Kind::Lines);
    }
}
