//! The tertiary tier (issue 13) with real processes: I/O servers on lines targets with an
//! archive — a directory, or a real S3 server (`s3s-fs`) on loopback — archive, release,
//! transparent recall through the library, the CLI and the mount, rewrite and archive again;
//! an unreachable archive fails a recall with EIO and a clear message, and the data comes back
//! once it is reachable; and `kill -9` while migration managers archive and reclaim loses no
//! byte that a `sync` acknowledged.

mod common;

use common::s3::S3Server;
use common::{path, random_bytes, seed_for, Cluster};
use flotilla_client::{Client, CreateOptions, File, Layout};
use flotilla_proto::{HsmAction, Residency};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LINES: &str = "lines,capacity=64m,block=64k,line_blocks=64,group_blocks=8";

fn spec(dir: &Path) -> PathBuf {
    PathBuf::from(format!("{LINES}:{}", dir.display()))
}

/// `archive = { ... }` for the `[server]` table.
fn archive_setting(url: &str, policy: &str) -> String {
    format!("archive = {{ url = {url:?}, timeout_ms = 3000, retries_max = 0, {policy} }}")
}

/// A metadata service and `servers` I/O servers on lines targets with the archive setting.
fn tier_cluster(servers: usize, setting: &str, env: Vec<(String, String)>) -> Cluster {
    Cluster::start_on_specs(servers, spec, setting, env)
}

fn restart_all(cluster: &mut Cluster) {
    for index in 0..cluster.servers.len() {
        let process = cluster.servers[index].take().expect("server running");
        let addr = process.addr.clone();
        process.kill();
        cluster.servers[index] =
            Some(cluster.start_server_listening(&spec(&cluster.target_dir(index)), &addr));
    }
    cluster.wait_up(cluster.servers.len());
}

fn striped(subfiles: u32) -> CreateOptions {
    CreateOptions {
        subfiles,
        layout: Some(Layout::Stripe { unit_bytes: 256 << 10, count: 0 }),
        exclusive: true,
        ..CreateOptions::default()
    }
}

fn write_file(client: &Client, name: &str, data: &[u8]) {
    let file = client.create(name, &striped(2)).expect("create");
    file.write_at(0, data).expect("write");
    file.close().expect("close");
}

fn read_all(file: &File) -> Result<Vec<u8>, flotilla_client::ClientError> {
    let mut got = vec![0u8; file.size() as usize];
    file.read_at(0, &mut got).map(|read| {
        got.truncate(read);
        got
    })
}

fn residency(client: &Client, name: &str) -> Residency {
    let forks = client.open(name).expect("open").hsm(HsmAction::State).expect("hsm state");
    let worst = forks.iter().map(|fork| fork.state.residency).max_by_key(|r| match r {
        Residency::Archived => 0,
        Residency::Resident => 1,
        Residency::Released => 2,
        Residency::Modified => 3,
    });
    worst.expect("the file has forks")
}

fn recalls(client: &Client) -> u64 {
    let servers: Vec<String> =
        client.status().expect("status").into_iter().map(|target| target.server).collect();
    servers.iter().flat_map(|server| client.hsm_status(server).expect("hsm status")).map(|t| t.recalls).sum()
}

fn objects(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type().expect("file type").is_dir() {
            true => objects(&entry.path()),
            false => 1,
        })
        .sum()
}

/// The whole cycle against a directory archive: archive, release (refused first for a file
/// never archived), recall on read (library and `flotilla get`), `stat` naming the tier, a
/// rewrite making the file modified (release refused), archive again superseding the old
/// copies, and the archive state surviving a restart of every server.
#[test]
fn archive_release_recall_rewrite_and_archive_again_with_a_directory_archive() {
    let seed = seed_for("tier_dir");
    let archive = tempfile::tempdir().expect("archive dir");
    let setting = archive_setting(path(archive.path()), "archive_age_s = 3600");
    let mut cluster = tier_cluster(2, &setting, Vec::new());
    let client = cluster.client();
    let mut data = random_bytes(seed, 3 << 20);
    write_file(&client, "/a", &data);
    let file = client.open("/a").expect("open");

    let refused = file.hsm(HsmAction::Release).unwrap_err().to_string();
    assert!(refused.contains("no archive copy"), "{refused}");
    assert_eq!(residency(&client, "/a"), Residency::Resident);
    file.hsm(HsmAction::Archive).expect("archive");
    assert_eq!(residency(&client, "/a"), Residency::Archived);
    assert_eq!(objects(archive.path()), 2, "one object per subfile's fork");
    file.hsm(HsmAction::Release).expect("release");
    assert_eq!(residency(&client, "/a"), Residency::Released);
    let (ok, stdout, stderr) = common::cli(&["stat", "--meta", &cluster.meta_addr(), "/a"]);
    assert!(ok && stdout.contains("tier=released on_disk_bytes=0"), "{stdout}{stderr}");

    let before = recalls(&client);
    assert!(read_all(&client.open("/a").expect("open")).expect("read recalls") == data);
    assert!(recalls(&client) > before, "the read was served by recalls");
    assert_eq!(residency(&client, "/a"), Residency::Archived, "recalled blocks are clean");

    // A rewrite of the released file: the untouched bytes come back from the archive.
    file.hsm(HsmAction::Release).expect("release again");
    let patch = random_bytes(seed + 1, 1000);
    data[700_000..701_000].copy_from_slice(&patch);
    let writer = client.open("/a").expect("open");
    writer.write_at(700_000, &patch).expect("rewrite");
    writer.close().expect("close");
    assert_eq!(residency(&client, "/a"), Residency::Modified);
    let refused = file.hsm(HsmAction::Release).unwrap_err().to_string();
    assert!(refused.contains("changed since"), "{refused}");
    file.hsm(HsmAction::Archive).expect("archive again");
    assert_eq!(objects(archive.path()), 2, "superseded copies are deleted");
    file.hsm(HsmAction::Release).expect("release the new copy");

    restart_all(&mut cluster);
    let client = cluster.client();
    assert_eq!(residency(&client, "/a"), Residency::Released, "records survive a restart");
    let local = tempfile::tempdir().expect("local dir");
    let out = local.path().join("a.out");
    let (ok, _, stderr) = common::cli(&["get", "--meta", &cluster.meta_addr(), "/a", path(&out)]);
    assert!(ok, "flotilla get: {stderr}");
    assert!(std::fs::read(&out).expect("read the copy") == data, "recalled bytes differ");
}

/// A real S3 server as the archive: archive and release, then the S3 server dies — a read
/// fails with EIO naming the archive (never zeros, never a hang) — and once it is back the
/// same read returns every byte.
#[test]
fn an_s3_archive_recalls_and_an_unreachable_one_gives_eio_until_it_is_back() {
    let seed = seed_for("tier_s3");
    let mut s3 = S3Server::start();
    let url = format!("s3://{}/flotilla", s3.bucket);
    let setting = archive_setting(&url, "archive_age_s = 3600");
    let cluster = tier_cluster(2, &setting, s3.env());
    let client = cluster.client();
    let data = random_bytes(seed, (2 << 20) + 12345);
    write_file(&client, "/s3file", &data);
    let file = client.open("/s3file").expect("open");
    let forks = file.hsm(HsmAction::Archive).expect("archive to S3");
    assert!(forks.iter().all(|fork| fork
        .state
        .object_key
        .starts_with(&format!("{:016x}", fork_target(&fork.server, &client)))));
    file.hsm(HsmAction::Release).expect("release");

    s3.stop();
    let started = Instant::now();
    let error = read_all(&client.open("/s3file").expect("open")).unwrap_err();
    assert_eq!(error.errno(), libc::EIO, "{error}");
    let message = error.to_string();
    assert!(message.contains("recall") && message.contains("archive"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(60), "the failure took {:?}", started.elapsed());

    s3.restart();
    let got = read_all(&client.open("/s3file").expect("open")).expect("read once S3 is back");
    assert!(got == data, "recalled bytes differ");

    // Rewrite, archive again (the new copy supersedes the old), release, recall.
    let mut data = data;
    let patch = random_bytes(seed + 2, 5000);
    data[1_000_000..1_005_000].copy_from_slice(&patch);
    let writer = client.open("/s3file").expect("open");
    writer.write_at(1_000_000, &patch).expect("rewrite");
    writer.close().expect("close");
    assert_eq!(residency(&client, "/s3file"), Residency::Modified);
    let again = file.hsm(HsmAction::Archive).expect("archive again");
    assert!(again.iter().zip(&forks).all(|(new, old)| new.state.object_key != old.state.object_key));
    file.hsm(HsmAction::Release).expect("release");
    let got = read_all(&client.open("/s3file").expect("open")).expect("recall the new copy");
    assert!(got == data, "recalled bytes of the new copy differ");
}

fn fork_target(server: &str, client: &Client) -> u64 {
    client
        .status()
        .expect("status")
        .into_iter()
        .find(|t| t.server == server)
        .expect("target of server")
        .target
        .0
}

/// Migration managers archive every file at once and reclaim clean blocks down to a high
/// free-space watermark, over and over, while files are written; every server is killed with
/// SIGKILL at a random moment. After the restart every file whose `close` returned reads back
/// byte for byte — from disk or recalled — and no block is served from a reclaimed slot.
#[test]
fn kill_9_during_migration_and_reclaim_loses_no_acknowledged_byte() {
    let seed = seed_for("tier_crash");
    let archive = tempfile::tempdir().expect("archive dir");
    let policy = "archive_age_s = 0, scan_interval_ms = 20, free_low_percent = 90, free_high_percent = 95, \
                  recall_extent_bytes = 1048576";
    let mut cluster = tier_cluster(2, &archive_setting(path(archive.path()), policy), Vec::new());
    let mut closed: Vec<(String, Vec<u8>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut round = 0u64;
    while round < 3 || (Instant::now() < deadline && round < 8) {
        let client = cluster.client();
        for index in 0..4u64 {
            let name = format!("/r{round}f{index}");
            let size = (256 << 10) + ((seed.rotate_left((round * 4 + index) as u32) % (3 << 20)) as usize);
            let data = random_bytes(seed ^ (round << 8 | index), size);
            write_file(&client, &name, &data);
            closed.push((name, data));
        }
        // One more file is being written when the kill comes.
        let doomed = client.create(&format!("/r{round}doomed"), &striped(2)).expect("create");
        doomed.write_at(0, &random_bytes(seed + round, 1 << 20)).expect("write");
        std::thread::sleep(Duration::from_millis(20 + seed.rotate_left(round as u32) % 200));
        restart_all(&mut cluster);
        let reader = cluster.client();
        for (name, data) in &closed {
            let got = read_all(&reader.open(name).expect("open")).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(got.len() == data.len(), "{name}: size {} != {}", got.len(), data.len());
            if let Some(at) = got.iter().zip(data).position(|(a, b)| a != b) {
                panic!("{name}: differs from byte {at} on (round {round}, seed {seed})");
            }
        }
        round += 1;
    }
    let client = cluster.client();
    let servers: Vec<String> = client.status().expect("status").into_iter().map(|t| t.server).collect();
    let reclaimed: u64 = servers
        .iter()
        .flat_map(|s| client.hsm_status(s).expect("hsm status"))
        .map(|t| t.reclaimed_blocks)
        .sum();
    eprintln!("tier_crash: {round} rounds, {reclaimed} blocks reclaimed, {} recalls", recalls(&client));
    assert!(reclaimed > 0, "the managers never reclaimed: the test proved nothing");
    assert!(objects(archive.path()) > 0, "nothing was archived");
}
