//! Read repair and scrub (issue 32) with real processes: a metadata service and four
//! servers in four failure groups, files with `replicas=2` on one subfile each. A block of
//! one replica's fork file is corrupted on disk (bytes flipped in the middle); then a read
//! returns the right bytes and the corrupted replica's block is repaired on disk, `flotilla
//! scrub` finds and repairs another corruption and reports it, and a `replicas=1` file's
//! corrupted block still fails with a checksum error (and scrub reports it unrepaired).

mod common;

use common::{cli, random_bytes, Cluster};
use flotilla_client::CreateOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Whole cache blocks go straight to the fork files (so a read meets the disk's bytes, not
/// a cached copy), and no background scrub repairs behind the test's back.
const SERVER: &str = "block_bytes = 32768\nbulk_bytes_min = 32768\nscrub_bytes_per_s = 0\n";

fn cluster_in_groups(groups: &[&str]) -> Cluster {
    let mut cluster = Cluster::start_configured(0, MEMBERSHIP, SERVER);
    for (index, group) in groups.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(groups.len());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
        if out.contains("chain=") {
            break;
        }
        assert!(Instant::now() < deadline, "timed out waiting for the chain table");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
}

fn options(replicas: u32) -> CreateOptions {
    let layout = flotilla_types::Layout::Stripe { unit_bytes: 64 << 10, count: 1 };
    CreateOptions { subfiles: 1, layout: Some(layout), replicas, ..CreateOptions::default() }
}

/// Every `data` fork file under the cluster's target folders of exactly `size` bytes.
fn fork_files(cluster: &Cluster, size: u64) -> Vec<PathBuf> {
    fn walk(dir: &Path, size: u64, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, size, out);
            } else if path.file_name().is_some_and(|n| n == "data")
                && path.metadata().is_ok_and(|m| m.len() == size)
            {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for index in 0..4 {
        walk(&cluster.target_dir(index).join("subfiles"), size, &mut found);
    }
    found.sort();
    found
}

/// Flips 16 bytes at `at` of a file on disk; returns what they were.
fn corrupt(file: &Path, at: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let handle = std::fs::OpenOptions::new().read(true).write(true).open(file).expect("open fork file");
    let mut bytes = vec![0u8; 16];
    handle.read_exact_at(&mut bytes, at).expect("read fork file");
    let flipped: Vec<u8> = bytes.iter().map(|b| b ^ 0xA5).collect();
    handle.write_all_at(&flipped, at).expect("corrupt fork file");
    handle.sync_all().expect("sync fork file");
    bytes
}

fn on_disk(file: &Path, at: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; 16];
    std::fs::File::open(file).unwrap().read_exact_at(&mut bytes, at).unwrap();
    bytes
}

fn write_file(cluster: &Cluster, name: &str, replicas: u32, data: &[u8]) {
    let client = cluster.client();
    let file = client.create(name, &options(replicas)).expect("create");
    file.write_at(0, data).expect("write");
    file.sync().expect("sync");
    file.close().expect("close");
}

#[test]
fn a_corrupted_replica_is_repaired_by_a_read_and_by_scrub_and_a_single_copy_fails_clearly() {
    let cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();

    // (a) Read repair. Sizes tell the fork files apart.
    let (size_a, size_b, size_c) = (256u64 << 10, 288u64 << 10, 320u64 << 10);
    let data_a = random_bytes(1, size_a as usize);
    write_file(&cluster, "/a", 2, &data_a);
    let replicas = fork_files(&cluster, size_a);
    assert_eq!(replicas.len(), 2, "two replicas of /a on disk: {replicas:?}");
    let middle = size_a / 2 + 100;
    let original = corrupt(&replicas[1], middle);
    assert_ne!(on_disk(&replicas[1], middle), original);
    let client = cluster.client();
    let file = client.open("/a").expect("open /a");
    // Reads alternate between the serving members: several reach the corrupted one.
    for round in 0..4 {
        let mut back = vec![0u8; size_a as usize];
        let got = file.read_at(0, &mut back).unwrap_or_else(|e| panic!("read {round} of /a failed: {e}"));
        assert_eq!(got as u64, size_a);
        assert!(back == data_a, "read {round} of /a returned other bytes");
    }
    assert_eq!(on_disk(&replicas[1], middle), original, "the corrupted replica's block was repaired on disk");
    assert_eq!(on_disk(&replicas[0], middle), original);

    // (b) Scrub finds and repairs another corruption, and says so.
    let data_b = random_bytes(2, size_b as usize);
    write_file(&cluster, "/b", 2, &data_b);
    let replicas_b = fork_files(&cluster, size_b);
    assert_eq!(replicas_b.len(), 2, "two replicas of /b on disk: {replicas_b:?}");
    let at_b = size_b / 2 + 7;
    let original_b = corrupt(&replicas_b[0], at_b);
    let (ok, stdout, stderr) = cli(&["scrub", "/b", "--meta", &meta]);
    assert!(ok, "flotilla scrub /b failed: {stdout}\n{stderr}");
    assert!(stdout.contains("2 replicas compared"), "{stdout}");
    assert!(stdout.contains("1 bad, 1 repaired, 0 differing"), "{stdout}");
    assert!(stdout.contains("failed its checksum; repaired"), "{stdout}");
    assert_eq!(on_disk(&replicas_b[0], at_b), original_b, "scrub rewrote the bad block");
    let (ok, stdout, stderr) = cli(&["scrub", "--meta", &meta]);
    assert!(ok, "a second scrub of everything finds nothing: {stdout}\n{stderr}");
    assert!(stdout.contains("0 bad, 0 repaired, 0 differing"), "{stdout}");

    // (c) One copy: the read fails naming the checksum, and scrub reports it unrepaired.
    let data_c = random_bytes(3, size_c as usize);
    write_file(&cluster, "/c", 1, &data_c);
    let single = fork_files(&cluster, size_c);
    assert_eq!(single.len(), 1, "one copy of /c on disk: {single:?}");
    corrupt(&single[0], size_c / 2);
    let file = client.open("/c").expect("open /c");
    let mut back = vec![0u8; size_c as usize];
    let error = file.read_at(0, &mut back).expect_err("a corrupted single copy cannot be read");
    let message = error.to_string();
    assert!(message.contains("checksum mismatch"), "{message}");
    let (ok, stdout, _) = cli(&["scrub", "/c", "--meta", &meta]);
    assert!(!ok, "scrub fails while a bad block stays: {stdout}");
    assert!(stdout.contains("NOT repaired") && stdout.contains("one copy"), "{stdout}");
}
