//! Issue 31, item 2 and three smaller items of item 7: a failed write or copy never leaves a
//! size over bytes that are not durable; `flotilla put` publishes the whole file or nothing;
//! the mount, after a failed fsync, ends up reporting the metadata service's size; `flotilla
//! get` of an unreadable file is EACCES and creates nothing; a CLI command whose stdout
//! closes ends quietly. Real processes, servers killed with SIGKILL.

mod common;

use common::{cli, path, random_bytes, seed_for, Cluster, Mount, FLOTILLA};
use flotilla_client::{Client, CreateOptions, Layout};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Servers that keep acknowledged writes in their caches until a Sync (every piece through
/// the cache), so that a SIGKILL surely loses every unsynced write.
const CACHE_ONLY_SERVERS: &str =
    "dirty_age_max_ms = 600000\ncache_capacity_bytes = 268435456\nbulk_bytes_min = 0";

/// How long a killed server stays down before it is started again (as in the issue).
const DOWN_MS: u64 = 1000;

fn striped(subfiles: u32, unit_bytes: u64) -> CreateOptions {
    let layout = Layout::Stripe { unit_bytes, count: subfiles };
    CreateOptions { subfiles, layout: Some(layout), ..CreateOptions::default() }
}

/// SIGKILLs I/O server `index` and returns its address.
fn kill_server(cluster: &mut Cluster, index: usize) -> String {
    let process = cluster.servers[index].take().expect("server running");
    let addr = process.addr.clone();
    process.kill();
    addr
}

/// Starts I/O server `index` again on its folder and address.
fn restart_server(cluster: &mut Cluster, index: usize, addr: &str) {
    let restarted = cluster.start_server_listening(&cluster.target_dir(index), addr);
    assert_eq!(restarted.addr, addr, "server {index} came back elsewhere");
    cluster.servers[index] = Some(restarted);
}

/// Every byte below `path`'s published size reads back as `want` has it (a size over bytes
/// a restart lost reads zeros there, or fails).
fn published_bytes_are_durable(client: &Client, path: &str, want: &[u8]) -> Result<u64, String> {
    let size = client.stat(path).map_err(|e| format!("stat {path}: {e}"))?.attrs.size_bytes;
    if size > want.len() as u64 {
        return Err(format!("{path}: size {size} is larger than the {} bytes written", want.len()));
    }
    let file = client.open(path).map_err(|e| format!("open {path}: {e}"))?;
    let mut got = vec![0u8; size as usize];
    let read = file.read_at(0, &mut got).map_err(|e| format!("read {path} below its size {size}: {e}"))?;
    if read as u64 != size {
        return Err(format!("{path}: read {read} of its {size} bytes"));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(at) => Err(format!("{path}: published size {size} covers wrong bytes from byte {at} on")),
        None => Ok(size),
    }
}

/// The root cause of item 2: a handle whose writes were never committed gave its byte-range
/// token back when it went (its last close here) and published the size of those writes,
/// still only in a server's cache. Here the server is killed before the handle is dropped
/// and comes back a second later: whatever size the file has afterwards, every byte below it
/// must read back as written (the drop either committed the writes after the restart, or
/// published nothing).
#[test]
fn a_dropped_handle_publishes_no_size_over_writes_a_restart_lost() {
    let seed = seed_for("dropped handle");
    let mut cluster = Cluster::start_configured(2, "", CACHE_ONLY_SERVERS);
    let client = cluster.client();
    let data = random_bytes(seed, 8 << 20);
    let file = client.create("/dropped", &striped(2, 1 << 20)).expect("create");
    file.write_at(0, &data).expect("write");
    let addr = kill_server(&mut cluster, 1);
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(DOWN_MS));
        restart_server(&mut cluster, 1, &addr);
        cluster
    });
    drop(file);
    let cluster = restarter.join().expect("restarter");
    cluster.wait_up(2);
    let size = published_bytes_are_durable(&cluster.client(), "/dropped", &data).expect("no size over zeros");
    println!("published size after the drop: {size}");
}

/// Names in `/` that look like an unfinished copy's temporary.
fn leftover_temporaries(client: &Client) -> Vec<String> {
    let names = client.readdir("/").expect("readdir /").into_iter().map(|e| e.name);
    names.filter(|name| name.contains(".flotilla-put.")).collect()
}

/// Item 2's reproduction: SIGKILL an I/O server 50–400 ms into a `flotilla put` and start it
/// again a second later. Either the put succeeds and `get` returns every byte, or it fails and
/// the destination does not exist (no size over zeros, no temporary left behind).
#[test]
fn put_with_a_server_killed_publishes_the_whole_file_or_nothing() {
    let seed = seed_for("put kill");
    let mut cluster = Cluster::start_configured(2, "", CACHE_ONLY_SERVERS);
    let meta = cluster.meta_addr();
    let scratch = tempfile::tempdir().expect("scratch");
    let source = scratch.path().join("source");
    let data = random_bytes(seed, 96 << 20);
    std::fs::write(&source, &data).expect("write the source");
    let started = Instant::now();
    let (mut failed, mut round) = (0, 0);
    while round < 2 || (round < 6 && started.elapsed() < Duration::from_secs(24)) {
        round += 1;
        let dest = format!("/put-{round}");
        let put = Command::new(FLOTILLA)
            .args([
                "put",
                path(&source),
                &dest,
                "--meta",
                &meta,
                "--subfiles",
                "2",
                "--stripe-unit",
                "1048576",
            ])
            .env("FLOTILLA_KEY", common::client_key())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start flotilla put");
        std::thread::sleep(Duration::from_millis(50 + (seed.wrapping_mul(round) % 350)));
        let addr = kill_server(&mut cluster, 1);
        std::thread::sleep(Duration::from_millis(DOWN_MS));
        restart_server(&mut cluster, 1, &addr);
        let output = put.wait_with_output().expect("wait for put");
        cluster.wait_up(2);
        let client = cluster.client();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            let copy = scratch.path().join("copy");
            let (ok, _, err) = cli(&["get", &dest, path(&copy), "--meta", &meta]);
            assert!(ok, "get of {dest}: {err}");
            assert!(
                std::fs::read(&copy).expect("read the copy") == data,
                "{dest}: put succeeded, get differs"
            );
        } else {
            failed += 1;
            println!("round {round}: put failed: {}", stderr.trim());
            let found = client.stat(&dest).map(|e| e.attrs.size_bytes);
            assert!(found.is_err(), "{dest}: a failed put left the destination (size {found:?}): {stderr}");
        }
        assert_eq!(leftover_temporaries(&client), Vec::<String>::new(), "round {round}: {stderr}");
    }
    println!("{round} rounds, {failed} failed puts");
}

/// `put` keeps its options through the temporary: layout, subfiles and mode arrive with the
/// file, and an existing destination is refused and left alone.
#[test]
fn put_publishes_with_its_layout_and_refuses_an_existing_destination() {
    let cluster = Cluster::start(2);
    let meta = cluster.meta_addr();
    let scratch = tempfile::tempdir().expect("scratch");
    let source = scratch.path().join("source");
    let data = random_bytes(7, 300_000);
    std::fs::write(&source, &data).expect("write the source");
    let args = ["put", path(&source), "/laid", "--meta", &meta, "--subfiles", "2", "--stripe-unit", "65536"];
    let (ok, _, stderr) = cli(&args);
    assert!(ok, "put: {stderr}");
    let client = cluster.client();
    let entry = client.stat("/laid").expect("stat");
    assert!(matches!(entry.layout, Some(Layout::Stripe { unit_bytes: 65536, .. })), "{:?}", entry.layout);
    assert_eq!(entry.subfiles.len(), 2);
    assert_eq!((entry.attrs.size_bytes, entry.attrs.mode & 0o777), (data.len() as u64, 0o644));

    std::fs::write(&source, b"other").expect("rewrite the source");
    let (ok, _, stderr) = cli(&["put", path(&source), "/laid", "--meta", &meta]);
    assert!(!ok && stderr.contains("already exists"), "put over an existing file: {stderr}");
    assert_eq!(client.stat("/laid").expect("stat").attrs.size_bytes, data.len() as u64, "left alone");
    assert_eq!(leftover_temporaries(&client), Vec::<String>::new());
}

/// Item 2 through the mount: SIGKILL an I/O server during `dd conv=fsync` into a mount and
/// start it again a second later. If dd succeeded every byte is there; if it failed, once
/// its handle is released the mount reports the metadata service's size (never one it holds
/// no bytes for), and every byte below that size is right.
#[test]
fn dd_into_a_mount_with_a_server_killed_leaves_no_size_the_service_lacks() {
    let seed = seed_for("mount dd kill");
    let mut cluster = Cluster::start_configured(2, "", CACHE_ONLY_SERVERS);
    let meta = cluster.meta_addr();
    let mount = Mount::start(&meta);
    let scratch = tempfile::tempdir().expect("scratch");
    let source = scratch.path().join("source");
    let data = random_bytes(seed, 48 << 20);
    std::fs::write(&source, &data).expect("write the source");
    let started = Instant::now();
    let mut round = 0;
    while round < 2 || (round < 5 && started.elapsed() < Duration::from_secs(20)) {
        round += 1;
        let name = format!("dd-{round}");
        let mut dd = Command::new("dd")
            .arg(format!("if={}", source.display()))
            .arg(format!("of={}", mount.path(&name).display()))
            .args(["bs=1M", "conv=fsync", "status=none"])
            .stderr(Stdio::null())
            .spawn()
            .expect("start dd");
        std::thread::sleep(Duration::from_millis(30 + (seed.wrapping_mul(round) % 200)));
        let addr = kill_server(&mut cluster, 1);
        std::thread::sleep(Duration::from_millis(DOWN_MS));
        restart_server(&mut cluster, 1, &addr);
        let copied = dd.wait().expect("wait for dd").success();
        cluster.wait_up(2);
        let client = cluster.client();
        let file = format!("/{name}");
        if copied {
            assert_eq!(published_bytes_are_durable(&client, &file, &data), Ok(data.len() as u64));
            continue;
        }
        // The kernel releases dd's handle after dd exits: wait for the sizes to agree.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let shown = std::fs::metadata(mount.path(&name)).expect("stat in the mount").len();
            let service = client.stat(&file).expect("stat").attrs.size_bytes;
            if shown == service {
                println!("round {round}: dd failed; mount and service agree on {shown} bytes");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{file}: the mount shows {shown} bytes, the service {service}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        published_bytes_are_durable(&client, &file, &data).expect("no size over zeros");
    }
}

/// Item 7: `flotilla get` of a file the caller may not read fails with permission denied
/// (EACCES), not "needs a capability", and creates no output file.
#[test]
fn get_of_an_unreadable_file_is_permission_denied_and_creates_nothing() {
    let cluster = Cluster::start(1);
    let admin = cluster.client();
    let private =
        admin.create("/private", &CreateOptions { mode: 0o600, ..CreateOptions::default() }).unwrap();
    private.write_at(0, b"root's secret").unwrap();
    private.close().unwrap();
    let nobody = flotilla_types::NOBODY_ID;
    let dir = tempfile::tempdir().expect("scratch");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let key = common::client_key_for(dir.path(), nobody);
    let out = dir.path().join("out");
    let output = Command::new(FLOTILLA)
        .args(["--key", path(&key), "get", "--meta", &cluster.meta_addr(), "/private", path(&out)])
        .uid(nobody)
        .gid(nobody)
        .output()
        .expect("run flotilla get as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "nobody read root's 0600 file: {stderr}");
    assert!(stderr.to_lowercase().contains("permission denied"), "EACCES, clearly: {stderr}");
    assert!(!stderr.contains("capability"), "no talk of capabilities: {stderr}");
    assert!(!out.exists(), "an output file was left behind");
}

/// Item 7: `flotilla stat - | head` must not panic when head goes: the command ends quietly
/// (killed by SIGPIPE, as `cat` would be, or status 0), with no backtrace.
#[test]
fn stat_into_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    let cluster = Cluster::start(1);
    let dir = tempfile::tempdir().expect("scratch");
    let paths = dir.path().join("paths");
    std::fs::write(&paths, "/\n".repeat(20_000)).expect("write the paths");
    let mut stat = Command::new(FLOTILLA)
        .args(["stat", "--meta", &cluster.meta_addr(), "-"])
        .env("FLOTILLA_KEY", common::client_key())
        .env("RUST_BACKTRACE", "1")
        .stdin(std::fs::File::open(&paths).expect("open the paths"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flotilla stat");
    let mut first = [0u8; 64];
    stat.stdout.take().expect("stdout").read_exact(&mut first).expect("the first lines");
    // The read end is closed now; the command has far more to write than a pipe holds.
    let output = stat.wait_with_output().expect("wait for stat");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "a panic on a closed pipe: {stderr}");
    let quiet = output.status.success() || output.status.signal() == Some(libc::SIGPIPE);
    assert!(quiet, "stat ended with {:?}: {stderr}", output.status);
}
