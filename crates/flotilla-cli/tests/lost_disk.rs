//! A target knows what it held (issue 31, item 3), with real processes: a server whose disk
//! lost `subfiles/` and `checksums/` (its id file kept) is reported `lost` and refuses every
//! request, naming the target, until `flotilla target accept-loss` repairs it (its stripes
//! then read as zeros); a fork's missing checksum or data file is an error naming the file,
//! never zeros. And item 7: a refused 1 PiB Truncate/Extend leaves the fork's size alone.

mod common;

use common::{cli, path, random_bytes, seed_for, Cluster, Mount};
use flotilla_client::{Client, CreateOptions, Layout};
use flotilla_proto::TargetState;
use flotilla_types::TargetId;
use std::time::{Duration, Instant};

const UNIT_BYTES: usize = 64 << 10;

fn striped(subfiles: u32) -> CreateOptions {
    CreateOptions {
        subfiles,
        layout: Some(Layout::Stripe { unit_bytes: UNIT_BYTES as u64, count: 0 }),
        exclusive: true,
        ..CreateOptions::default()
    }
}

/// Writes `data` to a new file at `name` and closes it (durable).
fn put(client: &Client, name: &str, subfiles: u32, data: &[u8]) -> flotilla_client::EntryInfo {
    let file = client.create(name, &striped(subfiles)).expect("create");
    file.write_at(0, data).expect("write");
    let entry = file.entry().clone();
    file.close().expect("close");
    entry
}

/// SIGKILLs the server on `addr`, runs `damage` on its target folder, and starts it again
/// on the same folder and address.
fn kill_damage_restart(cluster: &mut Cluster, addr: &str, damage: impl FnOnce(&std::path::Path)) -> usize {
    let index = cluster
        .servers
        .iter()
        .position(|s| s.as_ref().is_some_and(|p| p.addr == addr))
        .expect("the server holding the subfile");
    cluster.servers[index].take().expect("running").kill();
    damage(&cluster.target_dir(index));
    let restarted = cluster.start_server_listening(&cluster.target_dir(index), addr);
    assert_eq!(restarted.addr, addr, "server {index} came back elsewhere");
    cluster.servers[index] = Some(restarted);
    index
}

/// Waits (bounded) until the metadata service reports `target` in `state`.
fn wait_state(client: &Client, target: TargetId, state: TargetState) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = client.status().expect("status");
        if status.iter().any(|t| t.target == target && t.state == state) {
            return;
        }
        assert!(Instant::now() < deadline, "target {target} never {state:?}: {status:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The library's read of the whole of `name`, as an error message if it fails.
fn read_all(client: &Client, name: &str, size: usize) -> Result<Vec<u8>, String> {
    let file = client.open(name).map_err(|e| e.to_string())?;
    let mut out = vec![0u8; size];
    let read = file.read_at(0, &mut out).map_err(|e| e.to_string())?;
    out.truncate(read);
    Ok(out)
}

#[test]
fn a_lost_disk_is_refused_and_shown_lost_until_the_loss_is_accepted() {
    let mut cluster = Cluster::start(2);
    let (meta, client) = (cluster.meta_addr(), cluster.client());
    let data = random_bytes(seed_for("lost disk"), 16 * UNIT_BYTES);
    let entry = put(&client, "/striped", 2, &data);
    let (victim, addr) = (entry.subfiles[0].target, entry.subfiles[0].server.clone());
    let index = kill_damage_restart(&mut cluster, &addr, |dir| {
        std::fs::remove_dir_all(dir.join("subfiles")).unwrap();
        std::fs::remove_dir_all(dir.join("checksums")).unwrap();
        assert!(dir.join("flotilla-target").is_file());
    });

    // Reported lost, refused through the CLI, the library and the mount, naming the target.
    wait_state(&client, victim, TargetState::Lost);
    let (ok, status, stderr) = cli(&["status", "--meta", &meta]);
    assert!(ok, "status failed: {stderr}");
    assert!(
        status.lines().any(|l| l.contains(&format!("target={victim}")) && l.contains("state=lost")),
        "{status}"
    );
    let copy = cluster.dir.path().join("copy.bin");
    let (ok, _, stderr) = cli(&["get", "/striped", path(&copy), "--meta", &meta]);
    assert!(!ok, "get of a file on a lost disk succeeded");
    assert!(stderr.contains(&victim.to_string()) && stderr.contains("lost"), "{stderr}");
    let error = read_all(&client, "/striped", data.len()).expect_err("the library read zeros");
    assert!(error.contains(&victim.to_string()), "{error}");
    let mount = Mount::start(&meta);
    let through_mount = std::fs::read(mount.path("striped")).expect_err("the mount read zeros");
    assert_eq!(through_mount.raw_os_error(), Some(libc::EIO), "{through_mount}");
    drop(mount);

    // Repaired by accepting the loss (server stopped): served again, the lost stripes zeros.
    cluster.servers[index].take().expect("running").kill();
    let target_dir = cluster.target_dir(index);
    let (ok, stdout, stderr) = cli(&["target", "accept-loss", path(&target_dir)]);
    assert!(ok && stdout.contains(&victim.to_string()), "accept-loss failed: {stdout} {stderr}");
    cluster.servers[index] = Some(cluster.start_server_listening(&target_dir, &addr));
    wait_state(&client, victim, TargetState::Up);
    let (ok, _, stderr) = cli(&["get", "/striped", path(&copy), "--meta", &meta]);
    assert!(ok, "get after accept-loss failed: {stderr}");
    let got = std::fs::read(&copy).unwrap();
    assert_eq!(got.len(), data.len());
    let units = got.chunks(UNIT_BYTES).zip(data.chunks(UNIT_BYTES));
    let zeroed = units.clone().filter(|(got, _)| got.iter().all(|b| *b == 0)).count();
    assert!(units.clone().all(|(got, want)| got == want || got.iter().all(|b| *b == 0)));
    assert_eq!(zeroed, 8, "half the stripe units were on the lost disk");
}

#[test]
fn a_missing_checksum_or_fork_file_is_an_error_naming_the_file() {
    let mut cluster = Cluster::start(1);
    let (meta, client) = (cluster.meta_addr(), cluster.client());
    let data = random_bytes(seed_for("lost files"), 3 * UNIT_BYTES + 123);
    let a = put(&client, "/a", 1, &data);
    let b = put(&client, "/b", 1, &data);
    let (a_checksums, b_fork) =
        (format!("checksums/{:016x}.0/data", a.id), format!("subfiles/{:016x}.0/data", b.id));
    let target = a.subfiles[0].target;
    kill_damage_restart(&mut cluster, &a.subfiles[0].server, |dir| {
        std::fs::remove_file(dir.join(&a_checksums)).unwrap();
        std::fs::remove_file(dir.join(&b_fork)).unwrap();
    });
    cluster.wait_up(1);

    let error = read_all(&client, "/a", data.len()).expect_err("read without its checksum file");
    assert!(error.contains(&a_checksums) && error.contains(&target.to_string()), "{error}");
    let copy = cluster.dir.path().join("a.bin");
    let (ok, _, stderr) = cli(&["get", "/a", path(&copy), "--meta", &meta]);
    assert!(!ok && stderr.contains(&a_checksums), "get of /a: {stderr}");
    let error = read_all(&client, "/b", data.len()).expect_err("read without its fork file");
    assert!(error.contains(&b_fork) && error.contains(&target.to_string()), "{error}");
    let status = client.status().expect("status");
    assert!(status.iter().all(|t| t.state == TargetState::Up), "one fork is not a lost disk: {status:?}");
}

/// Item 7 through the protocol: a 1 PiB Truncate and Extend of a fork are refused and its
/// size stays what it was (it used to stay 1 PiB until the server restarted).
#[test]
fn a_refused_petabyte_truncate_or_extend_leaves_the_fork_size() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let data = random_bytes(seed_for("petabyte"), 100_000);
    put(&client, "/p", 1, &data);
    let fork = client.open("/p").expect("open").fork(0, "data").expect("fork");
    assert_eq!(fork.size().expect("size"), data.len() as u64);
    fork.truncate(1 << 50).expect_err("a 1 PiB truncate was accepted");
    assert_eq!(fork.size().expect("size"), data.len() as u64, "the refused truncate changed the size");
    fork.extend(1 << 50).expect_err("a 1 PiB extend was accepted");
    assert_eq!(fork.size().expect("size"), data.len() as u64, "the refused extend changed the size");
    assert_eq!(read_all(&client, "/p", data.len()).expect("read"), data);
}
