//! Fair service, restart persistence, placement and membership against a real cluster.

mod common;

use common::{random_bytes, Cluster};
use flotilla_client::{CreateOptions, Shape, TargetState};

#[test]
fn two_clients_on_one_server_get_fair_service() {
    let cluster = Cluster::start(1);
    let setup = cluster.client();
    let file = setup.create("/fair", &CreateOptions::default()).unwrap();
    let fork = file.fork(0, "data").unwrap();
    let data = random_bytes(1, 8 << 20);
    fork.write(&Shape::contiguous(0, data.len() as u64), &data).unwrap();

    // Phase 1: client A queues many heavy requests (8 MiB each in 64-byte pieces).
    let heavy = cluster.client();
    let heavy_fork = heavy.open("/fair").unwrap().fork(0, "data").unwrap();
    let shape = Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 64,
        file_stride: 64,
        memory_stride: 64,
        count: 1 << 17,
    };
    let mut queued: Vec<_> = (0..48).map(|_| heavy_fork.read_nb(shape.clone(), vec![0u8; 8 << 20])).collect();

    // Phase 2: client B, on its own connection, does a few small reads meanwhile.
    let light = cluster.client();
    let light_fork = light.open("/fair").unwrap().fork(0, "data").unwrap();
    let mut small = vec![0u8; 64];
    for i in 0..5u64 {
        light_fork.read(&Shape::contiguous(i * 4096, 64), &mut small).unwrap();
        assert_eq!(&small[..], &data[(i * 4096) as usize..(i * 4096 + 64) as usize]);
    }

    // Phase 3: B was served while A still had requests waiting: A's deep queue did not
    // push B to the back.
    let finished = queued.iter_mut().map(|h| h.test()).filter(|done| *done).count();
    assert!(
        finished < queued.len(),
        "all {finished} heavy requests finished before 5 small ones: unfair service"
    );
    for handle in queued {
        assert_eq!(handle.wait().unwrap(), data);
    }
}

#[test]
fn namespace_and_synced_data_survive_a_restart() {
    let mut cluster = Cluster::start(4);
    let client = cluster.client();
    client.mkdir("/results", 0o755).unwrap();
    client.mkdir("/results/run-1", 0o700).unwrap();
    let file = client
        .create("/results/run-1/out", &CreateOptions { subfiles: 3, ..CreateOptions::default() })
        .unwrap();
    let mut expected = Vec::new();
    for subfile in 0..3 {
        let data = random_bytes(subfile.into(), 300_000 + subfile as usize);
        let fork = file.create_fork(subfile, "index").unwrap();
        fork.write(&Shape::contiguous(0, data.len() as u64), &data).unwrap();
        fork.sync().unwrap();
        expected.push(data);
    }
    drop(client);

    cluster.restart();

    let client = cluster.client();
    let names: Vec<String> = client.readdir("/results/run-1").unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["out".to_string()]);
    assert_eq!(client.stat("/results/run-1").unwrap().attrs.mode & 0o777, 0o700);
    let file = client.open("/results/run-1/out").unwrap();
    for subfile in 0..3u32 {
        let fork = file.fork(subfile, "index").unwrap();
        let data = &expected[subfile as usize];
        assert_eq!(fork.size().unwrap(), data.len() as u64);
        let mut back = vec![0u8; data.len()];
        fork.read(&Shape::contiguous(0, data.len() as u64), &mut back).unwrap();
        assert!(back == *data, "subfile {subfile} lost synced bytes across the restart");
    }
}

#[test]
fn forks_are_created_listed_and_removed() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    let file = client.create("/forks", &CreateOptions { subfiles: 2, ..CreateOptions::default() }).unwrap();
    file.create_fork(1, "index").unwrap();
    let error = file.create_fork(1, "index").expect_err("second create must fail");
    assert_eq!(error.errno(), 17, "{error}");
    let fork = file.fork(1, "index").unwrap();
    fork.extend(1 << 20).unwrap();
    fork.write(&Shape::contiguous(0, 5), b"hello").unwrap();
    let mut names: Vec<(String, u64)> =
        file.list_forks(1).unwrap().into_iter().map(|f| (f.name, f.size_bytes)).collect();
    names.sort();
    assert_eq!(names[0].0, "data");
    assert_eq!(names[1].0, "index");
    assert!(names[1].1 >= 5);
    fork.truncate(3).unwrap();
    assert_eq!(fork.size().unwrap(), 3);
    file.remove_fork(1, "index").unwrap();
    let error = fork.size().expect_err("removed fork must be gone");
    assert_eq!(error.errno(), 2, "{error}");
    assert_eq!(file.list_forks(0).unwrap().len(), 1);
}

#[test]
fn placement_uses_distinct_targets_and_membership_tracks_liveness() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    let error =
        client.create("/too-wide", &CreateOptions { subfiles: 4, ..CreateOptions::default() }).err().unwrap();
    assert!(error.to_string().contains("live"), "{error}");
    let status = client.status().unwrap();
    let chosen = vec![status[2].target, status[0].target];
    let options = CreateOptions { subfiles: 2, targets: Some(chosen.clone()), ..CreateOptions::default() };
    let file = client.create("/named", &options).unwrap();
    let placed: Vec<_> = file.entry().subfiles.iter().map(|p| p.target).collect();
    assert_eq!(placed, chosen);

    // A server that stops heartbeating is shown down, and new files avoid it.
    cluster.servers[1].take().unwrap().kill();
    cluster.wait_down(1);
    let status = client.status().unwrap();
    assert_eq!(status.iter().filter(|t| t.state == TargetState::Up).count(), 2);
    let file = client.create("/after", &CreateOptions { subfiles: 2, ..CreateOptions::default() }).unwrap();
    assert!(file.entry().subfiles.iter().all(|p| p.up));
}

#[test]
fn connect_servers_connects_to_every_live_server_and_names_one_it_cannot_reach() {
    let mut cluster = Cluster::start(2);
    assert_eq!(cluster.client().connect_servers().unwrap(), 2);
    for server in cluster.servers.iter_mut() {
        server.take().unwrap().kill();
    }
    // Killed, and reported down only after `down_after_ms` (1 s here): a fresh client must
    // fail to connect and name the server, unless the service already shows it down.
    let client = cluster.client();
    match client.connect_servers() {
        Err(error) => assert!(error.to_string().contains("127.0.0.1:"), "names the server: {error}"),
        Ok(connected) => {
            let up = client.status().unwrap().iter().filter(|t| t.state == TargetState::Up).count();
            assert!(connected == 0 && up == 0, "connected to {connected} killed servers ({up} up)");
        }
    }
    cluster.wait_down(2);
    assert_eq!(client.connect_servers().unwrap(), 0, "down servers are skipped");
}

#[test]
fn removed_files_are_deleted_from_the_targets() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    let file = client.create("/doomed", &CreateOptions { subfiles: 2, ..CreateOptions::default() }).unwrap();
    let id = format!("{}", file.entry().file_id());
    // This file's subfile directories only (a target's `subfiles/` also holds its content
    // marker, `flotilla-content-<target id>`).
    let prefix = format!("{:016x}.", file.entry().file_id().0);
    let subfile_dirs = |cluster: &Cluster| -> usize {
        (0..2)
            .filter_map(|i| std::fs::read_dir(cluster.target_dir(i).join("subfiles")).ok())
            .flat_map(|dir| dir.filter_map(Result::ok))
            .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    };
    // Subfiles are made lazily, by the first request for them, not at the create.
    assert_eq!(subfile_dirs(&cluster), 0, "subfiles of {id} made before any request");
    file.fork(0, "data").unwrap().write(&Shape::contiguous(0, 4), b"gone").unwrap();
    assert_eq!(subfile_dirs(&cluster), 1, "the first write to subfile 0 of {id} should make it");
    let mut empty = [0u8; 4];
    let read = file.fork(1, "data").unwrap().read(&Shape::contiguous(0, 4), &mut empty);
    assert!(read.is_ok(), "a never-written subfile reads as an empty one: {read:?}");
    assert_eq!(subfile_dirs(&cluster), 2, "subfiles of {id} should exist");
    // The last handle is closed first: an open file outlives its name (POSIX open-unlink).
    file.close().unwrap();
    client.remove("/doomed").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while subfile_dirs(&cluster) > 0 {
        assert!(std::time::Instant::now() < deadline, "subfiles of a removed file were not deleted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(client.stat("/doomed").err().unwrap().errno(), 2);
}

#[test]
fn namespace_calls_have_nonblocking_forms() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    // Phase 1: several calls in flight at once.
    let dirs: Vec<_> = (0..8).map(|i| client.mkdir_nb(&format!("/d{i}"), 0o755)).collect();
    for handle in dirs {
        handle.wait().unwrap();
    }
    let created = client.create_nb("/d0/f", &CreateOptions { subfiles: 2, ..CreateOptions::default() });
    let file = created.wait().unwrap();
    assert_eq!(file.subfile_count(), 2);
    // Phase 2: lookups, listing, status, rename and removal, each through a handle.
    let mut listing = client.readdir_nb("/");
    let stat = client.stat_nb("/d0/f");
    let status = client.status_nb();
    while !listing.test() {
        std::thread::yield_now();
    }
    assert_eq!(listing.wait().unwrap().len(), 8);
    assert_eq!(stat.wait().unwrap().id, file.id());
    assert_eq!(status.wait().unwrap().len(), 2);
    client.rename_nb("/d0/f", "/d1/g").wait().unwrap();
    assert_eq!(client.open_nb("/d1/g").wait().unwrap().id(), file.id());
    client.remove_nb("/d1/g").wait().unwrap();
    client.rmdir_nb("/d0").wait().unwrap();
    assert_eq!(client.stat_nb("/d1/g").wait().expect_err("removed").errno(), 2);
}
