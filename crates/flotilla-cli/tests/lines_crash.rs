//! The durability contract on `lines` targets (issue 13) under `kill -9`: I/O servers whose
//! target is a RAMA disk-line image are killed with SIGKILL while clients write and while
//! the background reorganizer moves blocks, restarted on the same image, and every file
//! whose `sync` returned is read back byte for byte. A block served from a reclaimed slot
//! (reused before the descriptor naming its new home was durable) would show up as another
//! file's bytes. Seeds are printed; `FLOTILLA_CRASH_SEED=N` repeats a run.

mod common;

use common::{random_bytes, seed_for, Cluster};
use flotilla_client::{Client, CreateOptions, Layout};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Small lines (64 blocks of 64 KiB, 8 per group) so files spread over several lines and
/// interleaved writers fragment them; the reorganizer runs every millisecond.
const LINES_OPTIONS: &str = "lines,capacity=64m,block=64k,line_blocks=64,group_blocks=8,reorganize_ms=1";

fn spec(dir: &Path) -> PathBuf {
    PathBuf::from(format!("{LINES_OPTIONS}:{}", dir.display()))
}

/// A cluster of one metadata service and `servers` I/O servers on lines targets.
fn lines_cluster(servers: usize) -> Cluster {
    Cluster::start_on_specs(servers, spec, "", Vec::new())
}

fn kill_and_restart(cluster: &mut Cluster, index: usize) {
    let process = cluster.servers[index].take().expect("server running");
    let addr = process.addr.clone();
    process.kill();
    let restarted = cluster.start_server_listening(&spec(&cluster.target_dir(index)), &addr);
    cluster.servers[index] = Some(restarted);
    cluster.wait_up(cluster.servers.len());
}

fn one_subfile() -> CreateOptions {
    CreateOptions {
        subfiles: 1,
        layout: Some(Layout::Stripe { unit_bytes: 1 << 20, count: 0 }),
        exclusive: true,
        ..CreateOptions::default()
    }
}

fn verify(client: &Client, path: &str, want: &[u8]) {
    let file = client.open(path).unwrap_or_else(|e| panic!("{path}: cannot open: {e}"));
    assert_eq!(file.size(), want.len() as u64, "{path}: size");
    let mut got = vec![0u8; want.len()];
    let read = file.read_at(0, &mut got).unwrap_or_else(|e| panic!("{path}: read: {e}"));
    assert_eq!(read, want.len(), "{path}: short read");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{path}: differs from byte {at} of {} on", want.len());
    }
}

/// Two writers interleave 64 KiB blocks of two files on one server (so their blocks
/// alternate in the lines), syncing as they go; the server is killed at a random moment
/// while writes, syncs and reorganizations are under way. After the restart every synced
/// file reads back whole; the writes after the last sync may be lost, nothing else.
#[test]
fn synced_files_survive_kill_during_writes_and_reorganization() {
    let seed = seed_for("lines_crash");
    let mut cluster = lines_cluster(1);
    let client = cluster.client();
    let mut synced: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..4u64 {
        let blocks = 24usize;
        let names = [format!("/r{round}a"), format!("/r{round}b")];
        let contents: Vec<Vec<u8>> =
            (0..2u64).map(|which| random_bytes(seed ^ (round * 2 + which), blocks << 16)).collect();
        let files: Vec<_> =
            names.iter().map(|name| client.create(name, &one_subfile()).expect("create")).collect();
        for block in 0..blocks {
            for (file, content) in files.iter().zip(&contents) {
                file.write_at((block << 16) as u64, &content[block << 16..(block + 1) << 16]).expect("write");
                file.flush().expect("flush");
            }
        }
        for file in &files {
            file.sync().expect("sync");
        }
        synced.extend(names.iter().cloned().zip(contents.iter().cloned()));
        // An unsynced third file is being written when the kill comes.
        let doomed = client.create(&format!("/r{round}doomed"), &one_subfile()).expect("create");
        doomed.write_at(0, &random_bytes(seed.wrapping_add(round), 1 << 20)).expect("write");
        let _ = doomed.flush();
        std::thread::sleep(Duration::from_millis((seed.rotate_left(round as u32 * 7) % 40) + round));
        kill_and_restart(&mut cluster, 0);
        let reader = cluster.client();
        for (name, content) in &synced {
            verify(&reader, name, content);
        }
    }
    // The reorganizer did its work on the restarted servers: no fork left fragmented where
    // its line has room to make it contiguous.
    let image = cluster.target_dir(0).join(flotilla_store::LINES_IMAGE_NAME);
    let process = cluster.servers[0].take().expect("server running");
    std::thread::sleep(Duration::from_millis(200));
    process.stop();
    let disk = flotilla_store::LinesDisk::open_image(&image).expect("reopen the image");
    assert!(!disk.needs_reorganization(), "lines left fragmented");
    assert_eq!(disk.recovery().duplicates, 0, "a block was named by two durable descriptors");
}

/// Waits until the target's reported free space satisfies `done`.
fn wait_free(client: &Client, what: &str, done: impl Fn(u64) -> bool) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let free = client.status().expect("status")[0].free_bytes;
        if done(free) {
            return free;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}: {free} bytes free");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removing a file frees its blocks (durably, before the namespace entry goes): after a
/// kill and restart the space is free again, and a new file that needs it fits and reads
/// back without stale bytes.
#[test]
fn removed_files_give_their_space_back_across_a_kill() {
    let seed = seed_for("lines_remove");
    let mut cluster = lines_cluster(1);
    let client = cluster.client();
    let total = wait_free(&client, "the first report", |_| true);
    let big = random_bytes(seed, 40 << 20);
    let file = client.create("/big", &one_subfile()).expect("create");
    file.write_at(0, &big).expect("write");
    file.sync().expect("sync");
    drop(file);
    wait_free(&client, "the write to show", |free| free + (40 << 20) <= total);
    client.remove("/big").expect("remove");
    wait_free(&client, "the removal to free the space", |free| free == total);
    kill_and_restart(&mut cluster, 0);
    let client = cluster.client();
    wait_free(&client, "the restarted server's report", |free| free == total);
    let again = random_bytes(seed + 1, 48 << 20);
    let file = client.create("/again", &one_subfile()).expect("create");
    file.write_at(0, &again).expect("write into the freed space");
    file.sync().expect("sync");
    verify(&client, "/again", &again);
}

/// A loop device over a sparse file, detached on drop.
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn attach(file: &Path) -> LoopDevice {
        let output = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("run losetup (util-linux)");
        assert!(output.status.success(), "losetup: {}", String::from_utf8_lossy(&output.stderr));
        LoopDevice { path: PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()) }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").arg("--detach").arg(&self.path).status();
    }
}

fn format_on_device(dir: &Path, device: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "format-target",
            &format!("lines:{}", dir.display()),
            "--line-blocks",
            "64",
            "--group-blocks",
            "8",
        ])
        .arg("--device")
        .arg(device)
        .output()
        .expect("run flotilla format-target")
}

/// A lines target on a block device (a loop device over a sparse file): `format-target
/// --device` links the image name to the device and formats the whole device; a server
/// stores files on it and keeps every synced byte across SIGKILL; formatting the same device
/// again is refused with a clear error.
#[test]
fn a_lines_target_on_a_block_device_keeps_synced_files_across_a_kill() {
    let seed = seed_for("lines_device");
    let backing = tempfile::tempdir().expect("tempdir");
    let backing_file = backing.path().join("disk.img");
    std::fs::File::create(&backing_file).and_then(|f| f.set_len(64 << 20)).expect("sparse backing file");
    let device = LoopDevice::attach(&backing_file);
    let mut cluster = Cluster::start_configured(0, "", "");
    let dir = cluster.target_dir(0);
    let output = format_on_device(&dir, &device.path);
    assert!(output.status.success(), "format-target: {}", String::from_utf8_lossy(&output.stderr));
    let image = dir.join(flotilla_store::LINES_IMAGE_NAME);
    assert_eq!(std::fs::read_link(&image).expect("image is a link"), device.path);
    let process = cluster.start_server_on(&spec(&dir));
    cluster.servers.push(Some(process));
    cluster.wait_up(1);
    let client = cluster.client();
    let content = random_bytes(seed, 5 << 20);
    let file = client.create("/on-device", &one_subfile()).expect("create");
    file.write_at(0, &content).expect("write");
    file.sync().expect("sync");
    drop(file);
    kill_and_restart(&mut cluster, 0);
    verify(&cluster.client(), "/on-device", &content);
    // The bytes are on the device itself: its superblock names a lines image.
    let process = cluster.servers[0].take().expect("server running");
    process.stop();
    let disk = flotilla_store::LinesDisk::open_image(&device.path).expect("open the device as an image");
    assert!(
        disk.free_bytes() + (5 << 20) <= disk.geometry().slots() * u64::from(disk.geometry().block_bytes)
    );
    drop(disk);
    let other = backing.path().join("other");
    let again = format_on_device(&other, &device.path);
    assert!(!again.status.success(), "a device holding an image was formatted again");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("already holds a lines image"), "{stderr}");
}
