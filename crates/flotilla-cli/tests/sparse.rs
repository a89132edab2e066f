//! Holes stay holes (issue 31, item 1): a byte at 0 and a byte at 1 TiB written through the
//! mount in one open, through the library in one request, and through an ENWRICH flush cost
//! the servers' disks a few blocks, not the terabyte between them; and random sparse write
//! patterns allocate no more than the blocks they touch.
//!
//! Needs root (the mount). A `flotilla local` cluster of two servers on `dir` targets
//! (32 KiB cache blocks, 4 KiB checksum blocks); allocation is `st_blocks` × 512 summed over
//! every file of the servers' targets.

mod common;

use common::{allocated_bytes_under, Local, Mount};
use flotilla_client::{Client, CreateOptions, EnwrichOptions, Piece, Shape};
use std::os::unix::fs::FileExt;
use std::path::Path;

const GIB: u64 = 1 << 30;
/// Where the far byte goes: 1 TiB (ext4 takes files up to 16 TiB).
const FAR_BYTES: u64 = 1 << 40;
/// Random writes land below this.
const SPREAD_BYTES_MAX: u64 = 64 * GIB;
/// The servers' cache block: a write-back writes whole blocks.
const BLOCK_BYTES: u64 = 32 << 10;
/// Checksum file space is reserved in 4 KiB steps.
const CHECKSUM_GRANULE_BYTES: u64 = 4096;
/// Metadata of new fork and checksum files and the file system's extent tree blocks.
const ALLOWANCE_BYTES: u64 = 512 << 10;

/// Bytes allocated under every server's directory of the cluster's data.
fn target_bytes(local: &Local) -> u64 {
    let data = local.data_dir();
    let servers = std::fs::read_dir(&data).expect("read the data directory");
    servers
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("server-"))
        .map(|entry| allocated_bytes_under(&entry.path()))
        .sum()
}

/// The most a set of writes may allocate: each touches at most its own blocks plus one
/// (a piece may straddle a stripe unit, so two subfiles), and two checksum granules.
fn bound_bytes(lengths: impl Iterator<Item = u64>) -> u64 {
    let per_write =
        |length: u64| (length.div_ceil(BLOCK_BYTES) + 2) * BLOCK_BYTES + 2 * CHECKSUM_GRANULE_BYTES;
    lengths.map(per_write).sum::<u64>() + ALLOWANCE_BYTES
}

fn start() -> Local {
    Local::start_with(&[], &["--servers", "2"], false)
}

/// Reads `length` bytes at `offset` through the mount.
fn read_mounted(path: &Path, offset: u64, length: usize) -> Vec<u8> {
    let file = std::fs::File::open(path).expect("open to read");
    let mut bytes = vec![0xAA; length];
    file.read_exact_at(&mut bytes, offset).expect("read through the mount");
    bytes
}

/// Reads `length` bytes at `offset` through the library.
fn read_library(client: &Client, path: &str, offset: u64, length: usize) -> Vec<u8> {
    let file = client.open(path).expect("open to read");
    let mut bytes = vec![0xAA; length];
    let read = file.read_at(offset, &mut bytes).expect("read through the library");
    assert_eq!(read, length, "short read at {offset}");
    bytes
}

/// Spots between 1 and `far` that nobody wrote: zeros.
fn gap_spots(far: u64) -> [u64; 4] {
    [1, 1 << 20, far / 2, far - 4096]
}

#[test]
fn two_bytes_a_terabyte_apart_through_the_mount_allocate_two_blocks() {
    let local = start();
    let key = local.key.to_string_lossy().into_owned();
    let mount = Mount::start_with(&local.meta, &["--key", &key]);
    let before = target_bytes(&local);
    // Phase 1: one open, two one-byte pwrites a terabyte apart (the write-behind packs them
    // into one request), and a close that must succeed.
    let path = mount.path("header-and-trailer");
    let file = std::fs::File::create(&path).expect("create through the mount");
    file.write_all_at(b"H", 0).expect("write the header");
    file.write_all_at(b"T", FAR_BYTES).expect("write the trailer");
    file.sync_all().expect("fsync");
    drop(file);
    // Phase 2: the servers hold a few blocks, not the gap.
    let grown = target_bytes(&local).saturating_sub(before);
    let bound = bound_bytes([1, 1].into_iter());
    assert!(grown <= bound, "two bytes allocated {grown} bytes on the targets (at most {bound})");
    // Phase 3: both bytes read back, zeros between.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FAR_BYTES + 1);
    assert_eq!(read_mounted(&path, 0, 1), b"H");
    assert_eq!(read_mounted(&path, FAR_BYTES, 1), b"T");
    for spot in gap_spots(FAR_BYTES) {
        assert_eq!(read_mounted(&path, spot, 4096), vec![0; 4096], "a hole at {spot} reads zeros");
    }
}

#[test]
fn two_bytes_a_terabyte_apart_through_the_library_allocate_two_blocks() {
    let local = start();
    let client = local.client();
    let options = CreateOptions { subfiles: 2, ..CreateOptions::default() };
    let before = target_bytes(&local);
    // Phase 1: two writes in one open, then one request carrying both pieces.
    let file = client.create("/two-writes", &options).expect("create");
    file.write_at(0, b"H").expect("write the header");
    file.write_at(FAR_BYTES, b"T").expect("write the trailer");
    file.close().expect("close");
    let file = client.create("/one-request", &options).expect("create");
    let pieces = vec![
        Piece { file_offset: 0, memory_offset: 0, length: 1 },
        Piece { file_offset: FAR_BYTES, memory_offset: 1, length: 1 },
    ];
    file.write_shape(&Shape::List { pieces }, b"HT").expect("write both pieces at once");
    file.close().expect("close");
    // Phase 2: a few blocks each.
    let grown = target_bytes(&local).saturating_sub(before);
    let bound = bound_bytes([1, 1, 1, 1].into_iter());
    assert!(grown <= bound, "four bytes allocated {grown} bytes on the targets (at most {bound})");
    // Phase 3: everything reads back.
    for path in ["/two-writes", "/one-request"] {
        assert_eq!(read_library(&client, path, 0, 1), b"H", "{path}");
        assert_eq!(read_library(&client, path, FAR_BYTES, 1), b"T", "{path}");
        for spot in gap_spots(FAR_BYTES) {
            assert_eq!(read_library(&client, path, spot, 4096), vec![0; 4096], "{path}: hole at {spot}");
        }
    }
}

#[test]
fn an_enwrich_flush_of_far_apart_writes_allocates_only_their_blocks() {
    let local = start();
    let client = local.client();
    client.create("/enwrich", &CreateOptions::default()).expect("create").close().expect("close");
    let before = target_bytes(&local);
    // Phase 1: a job of one process logs three bytes (two in one flush block, one far out)
    // and flushes them at close.
    let file = client.open_enwrich("/enwrich", &EnwrichOptions::new("sparse-enwrich", 1)).expect("open");
    file.write_at(0, b"A").expect("log");
    file.write_at(900 << 10, b"B").expect("log");
    file.write_at(FAR_BYTES, b"C").expect("log");
    file.close().expect("flush and close");
    // Phase 2: a few blocks.
    let grown = target_bytes(&local).saturating_sub(before);
    let bound = bound_bytes([1, 1, 1].into_iter());
    assert!(grown <= bound, "an ENWRICH flush of three bytes allocated {grown} bytes (at most {bound})");
    // Phase 3: the bytes read back, zeros between.
    assert_eq!(read_library(&client, "/enwrich", 0, 1), b"A");
    assert_eq!(read_library(&client, "/enwrich", 900 << 10, 1), b"B");
    assert_eq!(read_library(&client, "/enwrich", FAR_BYTES, 1), b"C");
    assert_eq!(read_library(&client, "/enwrich", 4096, 4096), vec![0; 4096]);
    assert_eq!(read_library(&client, "/enwrich", FAR_BYTES / 2, 4096), vec![0; 4096]);
}

/// A handful of small writes at offsets up to 64 GiB: (offset, length, fill byte).
fn sparse_writes() -> impl proptest::strategy::Strategy<Value = Vec<(u64, usize, u8)>> {
    use proptest::prelude::*;
    prop::collection::vec((0u64..SPREAD_BYTES_MAX, 1usize..5000, 1u8..=255), 1..6)
}

/// Applies `writes` to a model of the file's written bytes (later writes win).
fn expected_bytes(writes: &[(u64, usize, u8)]) -> std::collections::BTreeMap<u64, u8> {
    let mut bytes = std::collections::BTreeMap::new();
    for (offset, length, fill) in writes {
        for at in *offset..offset + *length as u64 {
            bytes.insert(at, *fill);
        }
    }
    bytes
}

/// Every written byte reads back through `read(offset, length)`, one read per write.
fn check_written(writes: &[(u64, usize, u8)], read: impl Fn(u64, usize) -> Vec<u8>) {
    let expected = expected_bytes(writes);
    for (offset, length, _) in writes {
        let got = read(*offset, *length);
        let want: Vec<u8> = (*offset..offset + *length as u64).map(|at| expected[&at]).collect();
        assert!(got == want, "the bytes written at {offset} (+{length}) did not read back");
    }
}

#[test]
fn random_sparse_writes_allocate_no_more_than_the_blocks_they_touch() {
    use proptest::test_runner::{Config, TestRunner};
    let local = start();
    let key = local.key.to_string_lossy().into_owned();
    let mount = Mount::start_with(&local.meta, &["--key", &key]);
    let client = local.client();
    let mut runner = TestRunner::new(Config {
        cases: 6,
        max_shrink_iters: 8,
        failure_persistence: None,
        ..Config::default()
    });
    let cases = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&sparse_writes(), |writes| {
            let case = cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let lengths = || writes.iter().map(|(_, length, _)| *length as u64);
            // Through the mount: one open, every write, close.
            let before = target_bytes(&local);
            let path = mount.path(&format!("mounted-{case}"));
            let file = std::fs::File::create(&path).expect("create through the mount");
            for (offset, length, fill) in &writes {
                file.write_all_at(&vec![*fill; *length], *offset).expect("write through the mount");
            }
            file.sync_all().expect("fsync");
            drop(file);
            let grown = target_bytes(&local).saturating_sub(before);
            let bound = bound_bytes(lengths());
            assert!(grown <= bound, "mount: {writes:?} allocated {grown} bytes (at most {bound})");
            check_written(&writes, |offset, length| read_mounted(&path, offset, length));
            // Through the library: every write in one request.
            let before = target_bytes(&local);
            let name = format!("/library-{case}");
            let file =
                client.create(&name, &CreateOptions { subfiles: 2, ..CreateOptions::default() }).unwrap();
            let (pieces, data) = list_of(&writes);
            file.write_shape(&Shape::List { pieces }, &data).expect("write through the library");
            file.close().expect("close");
            let grown = target_bytes(&local).saturating_sub(before);
            assert!(grown <= bound, "library: {writes:?} allocated {grown} bytes (at most {bound})");
            check_written(&writes, |offset, length| read_library(&client, &name, offset, length));
            Ok(())
        })
        .unwrap();
}

/// The writes as one `List` request, later writes winning where they overlap: overlapping
/// pieces of one request land in any order, so each byte is sent once, with its last value.
fn list_of(writes: &[(u64, usize, u8)]) -> (Vec<Piece>, Vec<u8>) {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut data = Vec::new();
    for (offset, value) in expected_bytes(writes) {
        match pieces.last_mut() {
            Some(last) if last.file_offset + last.length == offset => last.length += 1,
            _ => pieces.push(Piece { file_offset: offset, memory_offset: data.len() as u64, length: 1 }),
        }
        data.push(value);
    }
    (pieces, data)
}
