//! File lifetimes with real processes: a create never removes an existing file, subfiles
//! made lazily on first use, and layouts that no create could satisfy.

mod common;

use common::{random_bytes, Cluster, Local};
use flotilla_client::{ClientError, CreateOptions, ErrorCode, Layout, Shape};
use std::time::{Duration, Instant};

/// A non-exclusive create of an existing file while one of its servers is down keeps the
/// existing file (its name, id and bytes): it contacts no server (subfiles are made lazily),
/// so it opens that file or fails, and never removes it.
#[test]
fn failed_create_never_removes_an_existing_file() {
    let mut cluster = Cluster::start(2);
    let client = cluster.client();
    let options = CreateOptions { subfiles: 2, ..Default::default() };
    let file = client.create("/kept", &options).expect("create");
    let data = random_bytes(7, 300_000);
    file.write_at(0, &data).expect("write");
    file.sync().expect("sync");
    file.close().expect("close");
    let before = client.stat("/kept").expect("stat");

    // Phase: one server of the file is gone (SIGKILL); the create cannot reach it.
    let killed = cluster.servers[1].take().expect("server 1");
    let addr = killed.addr.clone();
    killed.kill();
    let again = CreateOptions { subfiles: 2, exclusive: false, ..Default::default() };
    if let Ok(opened) = client.create("/kept", &again) {
        assert_eq!(opened.id(), before.id, "a create of an existing name must open that file");
    }

    // Phase: the file is still there, the same file, with its size.
    let after = client.stat("/kept").expect("the existing file must survive a failed create");
    assert_eq!(after.id, before.id, "the name must still name the same file");
    assert_eq!(after.attrs.size_bytes, data.len() as u64);

    // Phase: with the server back, the bytes read back exactly. It comes back where it was:
    // the service may still list the killed instance as up (its lease has not run out), so
    // `wait_up` can return before the new one registers, and the open would then be sent
    // to the old address (a restart on a new port failed the read now and then).
    cluster.servers[1] = Some(cluster.start_server_listening(&cluster.target_dir(1), &addr));
    cluster.wait_up(2);
    let reopened = client.open("/kept").expect("open");
    let mut back = vec![0u8; data.len()];
    reopened.read_at(0, &mut back).expect("read");
    assert!(back == data, "bytes of the existing file changed");
}

/// A create makes no round trip to the I/O servers: it succeeds while a server of the new
/// file is down, and that server makes its subfile on the first request for it once it is
/// back (lazy subfile creation).
#[test]
fn a_create_needs_no_server_and_subfiles_are_made_on_first_use() {
    let mut cluster = Cluster::start(2);
    let client = cluster.client();
    let killed = cluster.servers[0].take().expect("server 0");
    let addr = killed.addr.clone();
    killed.kill();
    let options = CreateOptions { subfiles: 2, ..Default::default() };
    let file = client.create("/lazy", &options).expect("a create contacts no I/O server");
    let restarted = cluster.start_server_listening(&cluster.target_dir(0), &addr);
    cluster.servers[0] = Some(restarted);
    cluster.wait_up(2);
    for subfile in 0..2u32 {
        let data = random_bytes(u64::from(subfile) + 40, 5000);
        let fork = file.fork(subfile, "data").expect("fork");
        fork.write(&Shape::contiguous(0, data.len() as u64), &data)
            .expect("the first write makes the subfile");
        let mut back = vec![0u8; data.len()];
        fork.read(&Shape::contiguous(0, data.len() as u64), &mut back).expect("read");
        assert!(back == data, "subfile {subfile} read back other bytes");
    }
}

/// A default layout asking for more subfiles than the cluster has targets is refused when it
/// is set, and creates in that directory keep working.
#[test]
fn unsatisfiable_layouts_are_refused_when_set() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    client.mkdir("/d", 0o755).expect("mkdir");
    let wide = Layout::Stripe { unit_bytes: 1, count: 99_999 };
    let error = client.set_layout("/d", Some(wide)).expect_err("99999 subfiles on 2 targets");
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");
    assert!(error.to_string().contains("99999 subfiles"), "message names the count: {error}");

    let options = CreateOptions { subfiles: 0, layout: Some(wide), ..Default::default() };
    let error = client.create("/d/f", &options).expect_err("create with an unsatisfiable layout");
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");

    let fits = Layout::Stripe { unit_bytes: 4096, count: 2 };
    client.set_layout("/d", Some(fits)).expect("a layout that fits");
    let file =
        client.create("/d/g", &CreateOptions { subfiles: 0, ..Default::default() }).expect("create in /d");
    assert_eq!(file.subfile_count(), 2);
}

/// Through the library: a file unlinked by another client stays readable and writable
/// through the handle that has it open, and is deleted after the handle is dropped.
#[test]
fn library_handles_keep_an_unlinked_file_alive() {
    let cluster = Cluster::start_with(2, "open_lease_ms = 3000");
    // Past the start-up grace period (one lease), in which any unlinked file is kept.
    std::thread::sleep(std::time::Duration::from_millis(3200));
    let holder = cluster.client();
    let other = cluster.client();
    let data = random_bytes(5, 1 << 20);
    let file = holder.create("/t", &CreateOptions { subfiles: 2, ..Default::default() }).unwrap();
    file.write_at(0, &data).unwrap();
    file.flush().unwrap();
    other.remove("/t").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut back = vec![0u8; data.len()];
    assert_eq!(file.read_at(0, &mut back).unwrap(), data.len());
    assert!(back == data, "bytes of the unlinked file changed");
    file.write_at(10, b"more").unwrap();
    file.flush().expect("size publish on an unlinked file");
    let mut four = [0u8; 4];
    file.read_at(10, &mut four).unwrap();
    assert_eq!(&four, b"more");
    let id = file.id();
    drop(file);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while other.stat_id(id).is_ok() {
        assert!(std::time::Instant::now() < deadline, "orphan never released after close");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Right after the metadata service restarts (SIGKILL), a create waits for the servers to
/// register again (the recovery window) instead of failing with ENOSPC, and places the file
/// on every target as before.
#[test]
fn creates_right_after_a_meta_restart_wait_for_the_servers() {
    let mut cluster = Cluster::start(3);
    let listen = cluster.meta_addr();
    cluster.meta.take().expect("meta").kill();
    cluster.start_meta(&listen);
    let client = cluster.client();
    let file = client
        .create("/after-restart", &CreateOptions { subfiles: 0, ..Default::default() })
        .expect("create during the recovery window");
    assert_eq!(file.subfile_count(), 3, "one subfile per remembered target");
    file.write_at(0, b"hello").unwrap();
    file.close().unwrap();
}

/// A program's open of an existing file is one round trip (`OpenPath`: the lookup and the
/// open together, counted by the service's metrics), and the file it opened outlives the
/// loss of its name as with a lookup and `Opened`: the service keeps the unlinked file for
/// the open handle and drops it at the close. A directory is refused and a missing name
/// named.
#[test]
fn an_open_is_one_round_trip_and_keeps_the_file_past_its_unlink() {
    let local = Local::start(2, true);
    let (writer, reader) = (local.client(), local.client());
    let data = random_bytes(11, 200_000);
    let file =
        writer.create("/kept-open", &CreateOptions { subfiles: 2, ..Default::default() }).expect("create");
    file.write_at(0, &data).expect("write");
    file.close().expect("close");
    writer.mkdir("/dir", 0o755).expect("mkdir");

    let kinds = ["open_path", "lookup", "lookup_cached", "opened"];
    let counts = || kinds.map(|kind| local.meta_requests(kind));
    let before = counts();
    let opened = reader.open("/kept-open").expect("open");
    let after = counts();
    let sent: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(sent, [1, 0, 0, 0], "an open should be one OpenPath ({kinds:?})");
    let id = opened.id();

    writer.remove("/kept-open").expect("unlink");
    assert!(is_not_found(writer.stat("/kept-open")), "the name should be gone");
    assert!(writer.stat_id(id).is_ok(), "the unlinked file must be kept while it is open");
    let mut back = vec![0u8; data.len()];
    opened.read_at(0, &mut back).expect("read after the unlink");
    assert!(back == data, "bytes of the open, unlinked file changed");
    opened.close().expect("close");
    let deadline = Instant::now() + Duration::from_secs(10);
    while writer.stat_id(id).is_ok() {
        assert!(Instant::now() < deadline, "the unlinked file outlived its last close");
        std::thread::sleep(Duration::from_millis(20));
    }

    assert!(matches!(reader.open("/dir"), Err(ClientError::NotAFile { .. })), "a directory opened as a file");
    assert!(is_not_found(reader.open("/missing").map(|file| file.entry().clone())), "a missing name opened");
}

fn is_not_found<T>(result: Result<T, ClientError>) -> bool {
    matches!(result, Err(ClientError::Meta(error)) if error.code == ErrorCode::NotFound)
}
