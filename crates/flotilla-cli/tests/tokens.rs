//! Byte-range tokens across mounts (issue 11, GPFS §2): a byte written through one mount
//! is read through another as soon as the `write` returned (no `close` between), a
//! truncate through one mount is seen by the other's open file, concurrent overlapping
//! writes through two mounts are never mixed within one write as a reader sees them, and
//! the no-overlap hint makes the token traffic zero (counted by the metadata service),
//! writers of disjoint segments of one file through four mounts split its token once
//! instead of trading it (counted the same way), and a
//! SIGKILLed metadata service makes token holders write back (they are told their tokens were
//! lost) before anyone is granted their bytes.
//!
//! Real processes: `flotilla local` (metadata service and I/O servers, with its metrics
//! endpoint) and `flotilla mount` processes; system calls through std. Needs root.

mod common;

use common::{Local, Mount};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

fn mount(local: &Local, extra: &[&str]) -> Mount {
    let key = common::path(&local.key).to_string();
    let mut args = vec!["--key", key.as_str()];
    args.extend_from_slice(extra);
    Mount::start_with(&local.meta, &args)
}

/// `TokenAcquire` requests the metadata service answered so far (its metrics endpoint).
fn token_acquires(local: &Local) -> u64 {
    meta_requests(local, "token_acquire")
}

/// Requests of `kind` the metadata service answered so far (its metrics endpoint).
fn meta_requests(local: &Local, kind: &str) -> u64 {
    let addr = local.metrics.as_deref().expect("a metrics endpoint");
    let text = common::http_get(addr, "/metrics").expect("scrape the metrics");
    let label = format!("kind=\"{kind}\"");
    text.lines()
        .filter(|line| line.starts_with("flotilla_meta_request_duration_seconds_count"))
        .filter(|line| line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Four mounts (four client sessions, as four nodes) each writing its own 4 MiB segment of
/// one shared file in 1 MiB writes, all at once, twice over: the writers do not trade a
/// byte-range token back and forth. Each asks for what its write requires and is granted as
/// much of the file as nobody else holds (GPFS's required and desired ranges), so the token
/// requests (`TokenAcquire`; `TokenRelease` answers a revocation) stay a few per writer
/// however many writes there are — a token traded per write would be 32 acquires. Counted
/// by the metadata service, not timed; the file reads back whole.
#[test]
fn writers_of_disjoint_segments_through_four_mounts_split_the_token_once() {
    const SEGMENT: usize = 4 << 20;
    const WRITE: usize = 1 << 20;
    let local = Local::start(4, true);
    let mounts: Vec<Mount> = (0..4).map(|_| mount(&local, &[])).collect();
    fs::write(mounts[0].path("shared"), b"").expect("create");
    let (acquires_before, releases_before) = (token_acquires(&local), meta_requests(&local, "token_release"));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    std::thread::scope(|scope| {
        for (index, mount) in mounts.iter().enumerate() {
            let (path, barrier) = (mount.path("shared"), barrier.clone());
            scope.spawn(move || {
                let file = fs::OpenOptions::new().write(true).open(&path).expect("open");
                for round in 0..2u8 {
                    barrier.wait();
                    for at in (0..SEGMENT).step_by(WRITE) {
                        let offset = (index * SEGMENT + at) as u64;
                        file.write_all_at(&vec![index as u8 * 2 + round; WRITE], offset).expect("write");
                    }
                }
            });
        }
    });
    let acquires = token_acquires(&local) - acquires_before;
    let releases = meta_requests(&local, "token_release") - releases_before;
    let writes = 4 * 2 * SEGMENT / WRITE;
    eprintln!("{writes} writes of 4 writers: {acquires} token acquires, {releases} token releases");
    assert!(acquires <= 16, "{acquires} token acquires for {writes} writes: the writers traded the token");
    let whole = fs::read(mounts[1].path("shared")).expect("read back");
    assert_eq!(whole.len(), 4 * SEGMENT);
    for (index, segment) in whole.chunks(SEGMENT).enumerate() {
        assert!(segment.iter().all(|byte| *byte == index as u8 * 2 + 1), "segment {index} differs");
    }
}

fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length).map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

/// The case: writer on A, reader on B; B sees every byte once A's `write`
/// returned, with A's file still open (its small writes wait in A's write-behind buffer
/// until B's read token revokes A's write token). Then A overwrites and extends the file
/// and B, still open, reads the new bytes and the new size.
#[test]
fn a_write_is_read_through_another_mount_before_close() {
    let local = Local::start(2, false);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    let mut writer = fs::File::create(a.path("shared")).expect("create on A");
    let first = pattern(1, 1 << 20);
    for chunk in first.chunks(4096) {
        writer.write_all(chunk).expect("write on A");
    }
    let reader = fs::File::open(b.path("shared")).expect("open on B");
    let mut seen = vec![0u8; first.len()];
    reader.read_exact_at(&mut seen, 0).expect("read on B");
    assert!(seen == first, "B did not read what A's returned writes wrote");

    // A overwrites the middle and writes past the end; B's open file sees both.
    let second = pattern(7, 256 << 10);
    writer.write_all_at(&second, 512 << 10).expect("overwrite on A");
    writer.write_all_at(b"tail", 1 << 20).expect("extend on A");
    let mut middle = vec![0u8; second.len()];
    reader.read_exact_at(&mut middle, 512 << 10).expect("read the middle on B");
    assert!(middle == second, "B read stale bytes after A's overwrite");
    let mut tail = Vec::new();
    let mut at = (1 << 20) - 4;
    let mut buffer = [0u8; 64];
    loop {
        let count = reader.read_at(&mut buffer, at).expect("read the end on B");
        if count == 0 {
            break;
        }
        tail.extend_from_slice(&buffer[..count]);
        at += count as u64;
    }
    assert_eq!(&tail[..], &[&first[first.len() - 4..], b"tail"].concat()[..], "B missed A's extension");

    // A truncates; B's open file ends there.
    writer.set_len(100).expect("truncate on A");
    let mut after = vec![0u8; 4096];
    let count = reader.read_at(&mut after, 0).expect("read after truncate on B");
    assert_eq!(count, 100, "B read past A's truncation");
    drop(writer);
}

/// Two mounts rewrite the same 256 KiB (four stripe units, over both servers) with writes
/// of one byte value each, while a reader on a third mount reads it again and again with
/// O_DIRECT: every read sees one write whole, never parts of two.
#[test]
fn overlapping_writes_through_two_mounts_are_never_mixed() {
    const WRITE_BYTES: usize = 256 << 10;
    let local = Local::start(2, false);
    let mounts = [mount(&local, &[]), mount(&local, &[]), mount(&local, &[])];
    fs::write(mounts[0].path("contended"), vec![b'0'; WRITE_BYTES]).expect("create");
    let deadline = Instant::now() + Duration::from_secs(6);
    let reads = std::thread::scope(|scope| {
        for (index, value) in [(0usize, b'A'), (1, b'B')] {
            let path = mounts[index].path("contended");
            scope.spawn(move || {
                let file = fs::OpenOptions::new().write(true).open(&path).expect("open to write");
                while Instant::now() < deadline {
                    file.write_all_at(&[value; WRITE_BYTES], 0).expect("write");
                }
            });
        }
        let path = mounts[2].path("contended");
        scope
            .spawn(move || {
                // O_DIRECT: each read is one request to the mount, not pages filled by
                // several (through the page cache a read is atomic per page only, as on a
                // local Linux file system).
                let file = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .expect("open to read");
                let mut buffer = vec![0u8; WRITE_BYTES];
                let mut reads = 0;
                while Instant::now() < deadline {
                    file.read_exact_at(&mut buffer, 0).expect("read");
                    let first = buffer[0];
                    if let Some(at) = buffer.iter().position(|byte| *byte != first) {
                        panic!(
                            "read {reads} mixes two writes: {:?} at 0, {:?} at {at}",
                            first as char, buffer[at] as char
                        );
                    }
                    reads += 1;
                }
                reads
            })
            .join()
            .expect("the reader saw a mixed write")
    });
    assert!(reads > 0, "no read finished");
    let last = fs::read(mounts[2].path("contended")).expect("read at the end");
    assert!(last.iter().all(|byte| *byte == last[0]) && last[0] != b'0', "the file ends mixed or unwritten");
}

/// With `user.flotilla.no_overlap` set, two mounts writing disjoint records of one file and
/// reading them back ask for no token at all; the same work on a file without the hint
/// does (so the counter counts).
#[test]
fn the_no_overlap_hint_makes_token_traffic_zero() {
    let local = Local::start(2, true);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    let work = |name: &str| {
        for (index, mount) in [&a, &b].iter().enumerate() {
            let file = fs::OpenOptions::new().read(true).write(true).open(mount.path(name)).expect("open");
            for record in (index..64).step_by(2) {
                file.write_all_at(&[record as u8; 4096], record as u64 * 4096).expect("write a record");
            }
            let mut buffer = [0u8; 4096];
            for record in (index..64).step_by(2) {
                file.read_exact_at(&mut buffer, record as u64 * 4096).expect("read a record");
                assert!(buffer.iter().all(|byte| *byte == record as u8), "record {record} differs");
            }
        }
    };
    fs::write(a.path("hinted"), b"").expect("create");
    set_hint(&a.path("hinted"));
    let listed = std::process::Command::new("python3")
        .args(["-c", "import os,sys; print(os.getxattr(sys.argv[1], 'user.flotilla.no_overlap').decode())"])
        .arg(b.path("hinted"))
        .output()
        .expect("python3");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "1", "B does not see the hint");

    let before = token_acquires(&local);
    work("hinted");
    assert_eq!(token_acquires(&local), before, "tokens were asked for a no-overlap file");

    fs::write(a.path("plain"), b"").expect("create");
    work("plain");
    assert!(token_acquires(&local) > before, "a file without the hint took no tokens");
}

/// Sets the no-overlap hint with `os.setxattr`, as any program would.
fn set_hint(path: &std::path::Path) {
    let status = std::process::Command::new("python3")
        .args(["-c", "import os,sys; os.setxattr(sys.argv[1], 'user.flotilla.no_overlap', b'1')"])
        .arg(path)
        .status()
        .expect("python3");
    assert!(status.success(), "setting the hint failed");
}

/// With tokens off, the mount keeps close-to-open consistency only: the reader of the
/// first test's case does not see bytes still in the writer's write-behind buffer (this is
/// what the tokens change).
#[test]
fn without_tokens_a_buffered_write_is_not_seen_before_close() {
    let local = Local::start(2, false);
    let (a, b) = (mount(&local, &["--tokens", "off"]), mount(&local, &["--tokens", "off"]));
    let mut writer = fs::File::create(a.path("f")).expect("create on A");
    writer.write_all(&[9u8; 4096]).expect("write on A");
    let mut seen = vec![0u8; 4096];
    let count = fs::File::open(b.path("f")).expect("open on B").read_at(&mut seen, 0).expect("read on B");
    assert_eq!(count, 0, "B saw A's buffered write without tokens");
    drop(writer);
    let after = fs::read(b.path("f")).expect("read after close");
    assert_eq!(after, vec![9u8; 4096]);
}

/// Permission changes, renames and unlinks through one mount are seen by the other at once.
#[test]
fn permission_changes_renames_and_unlinks_are_seen_by_the_other_mount() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    let local = Local::start(1, false);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    fs::write(a.path("f"), b"data").expect("create on A");
    let read_as_nobody = |path: std::path::PathBuf| {
        let output =
            std::process::Command::new("cat").arg(path).uid(NOBODY).gid(NOBODY).output().expect("cat");
        output.status.success().then_some(output.stdout)
    };
    fs::set_permissions(a.path("f"), fs::Permissions::from_mode(0o600)).expect("chmod on A");
    assert_eq!(read_as_nobody(b.path("f")), None, "B let another user read a 0600 file");
    fs::set_permissions(a.path("f"), fs::Permissions::from_mode(0o644)).expect("chmod on A");
    assert_eq!(read_as_nobody(b.path("f")).as_deref(), Some(&b"data"[..]), "B kept the old mode");
    fs::rename(a.path("f"), a.path("g")).expect("rename on A");
    assert!(!b.path("f").exists(), "B still sees the old name");
    assert_eq!(fs::read(b.path("g")).expect("read the new name on B"), b"data");
    fs::remove_file(a.path("g")).expect("unlink on A");
    assert!(!b.path("g").exists(), "B still sees the unlinked file");
}

/// The metadata service is killed (SIGKILL) and restarted while mount A holds a write token
/// with writes waiting in its write-behind buffer: A is told its tokens were lost and writes
/// back and publishes; B, granted nothing until the recovery window has passed, then reads
/// every byte A's returned writes wrote; and tokens work again afterwards.
#[test]
fn a_killed_metadata_service_makes_holders_write_back_and_tokens_work_again() {
    let mut cluster = common::Cluster::start(2);
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    let mut writer = fs::File::create(a.path("f")).expect("create on A");
    let first = pattern(3, 256 << 10);
    for chunk in first.chunks(4096) {
        writer.write_all(chunk).expect("write on A");
    }
    common::kill_and_restart_meta(&mut cluster);
    let deadline = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let read = fs::File::open(b.path("f")).and_then(|file| {
            let mut seen = vec![0u8; first.len()];
            file.read_exact_at(&mut seen, 0).map(|()| seen)
        });
        match read {
            Ok(seen) => break seen,
            Err(error) if Instant::now() < deadline => {
                eprintln!("B cannot read yet: {error}");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(error) => panic!("B never read A's bytes after the restart: {error}"),
        }
    };
    assert!(seen == first, "B read other bytes than A's returned writes after the restart");
    let second = pattern(9, 64 << 10);
    writer.write_all_at(&second, 0).expect("overwrite on A");
    let mut again = vec![0u8; second.len()];
    fs::File::open(b.path("f")).expect("open on B").read_exact_at(&mut again, 0).expect("read on B");
    assert!(again == second, "tokens did not work again after the restart");
}

/// Read requests the cluster's servers have served so far.
fn server_read_ops(client: &flotilla_client::Client) -> u64 {
    let servers: std::collections::BTreeSet<String> =
        client.status().expect("status").into_iter().map(|target| target.server).collect();
    servers.iter().map(|server| client.server_stats(server).expect("server stats").total.read_ops).sum()
}

/// A file read again through a mount is read from the kernel's page cache (the mount kept
/// its read token past the close, and passes FOPEN_KEEP_CACHE at the next open): the
/// servers serve no read. A write through another mount revokes the kept token (the next
/// open reads the new bytes, even when the writer set the mtime back), and so is a write by
/// a library client that takes no tokens (by the size and mtime checked at open).
#[test]
fn a_file_read_again_is_served_by_the_page_cache_until_someone_writes() {
    let local = Local::start(2, false);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    // Takes no tokens: its write is seen through the size and mtime checked at open.
    let client = library(&local, |config| config.tokens = false);
    let first = pattern(3, 2 << 20);
    fs::write(a.path("again"), &first).expect("write on A");
    assert!(fs::read(b.path("again")).expect("first read on B") == first, "B's first read differs");

    let before = server_read_ops(&client);
    assert!(fs::read(b.path("again")).expect("second read on B") == first, "B's second read differs");
    let served = server_read_ops(&client) - before;
    assert_eq!(served, 0, "the servers served {served} reads of a file B read before and nobody changed");

    // A overwrites and sets the mtime back (as `cp -p` would): the size and mtime are as
    // before, so only the revocation of B's kept read token tells B.
    let mtime = fs::metadata(a.path("again")).and_then(|meta| meta.modified()).expect("mtime");
    let second = pattern(5, 64 << 10);
    let writer = fs::OpenOptions::new().write(true).open(a.path("again")).expect("open on A");
    writer.write_all_at(&second, 1 << 20).expect("overwrite on A");
    writer.set_times(fs::FileTimes::new().set_modified(mtime)).expect("set the mtime back on A");
    drop(writer);
    let now = fs::metadata(a.path("again")).and_then(|meta| meta.modified()).expect("mtime");
    assert_eq!(now, mtime, "A's mtime was not set back");
    let mut expected = first.clone();
    expected[1 << 20..(1 << 20) + second.len()].copy_from_slice(&second);
    assert!(fs::read(b.path("again")).expect("read on B after A's write") == expected, "B kept stale pages");

    let third = pattern(9, 4096);
    let file = client.open("/again").expect("library open");
    file.write_at(0, &third).expect("library write");
    file.close().expect("library close");
    expected[..third.len()].copy_from_slice(&third);
    assert!(
        fs::read(b.path("again")).expect("read on B after the library's write") == expected,
        "B kept pages a library client changed"
    );
}

/// A library client of `local` with `change` made to its configuration.
fn library(
    local: &Local,
    change: impl FnOnce(&mut flotilla_client::ClientConfig),
) -> flotilla_client::Client {
    let mut config = flotilla_client::ClientConfig::new(&local.meta);
    config.key = Some(local.key.clone());
    change(&mut config);
    flotilla_client::Client::with_config(config).expect("library client")
}

/// Writes `data` through mount A in 4 KiB `write`s (they wait in A's write-behind buffer),
/// keeps the file open, and returns what a library client (`tokens` on or off) reads of it.
fn library_read_of_buffered_writes(tokens: bool, data: &[u8]) -> Vec<u8> {
    let local = Local::start(2, false);
    let a = mount(&local, &[]);
    let mut writer = fs::File::create(a.path("buffered")).expect("create on A");
    for chunk in data.chunks(4096) {
        writer.write_all(chunk).expect("write on A");
    }
    let client = library(&local, |config| config.tokens = tokens);
    let file = client.open("/buffered").expect("open in the library");
    let mut seen = vec![0u8; data.len()];
    let count = file.read_at(0, &mut seen).expect("read in the library");
    seen.truncate(count);
    drop(writer);
    seen
}

/// The case with a library reader: every byte mount A's returned `write`s wrote is
/// read by a library client while A still has the file open (its read token revokes A's
/// write token, and A writes its buffer back first).
#[test]
fn a_library_client_reads_a_mounts_buffered_writes_before_close() {
    let data = pattern(5, 1 << 20);
    let seen = library_read_of_buffered_writes(true, &data);
    assert_eq!(seen.len(), data.len(), "the library read stopped short of A's returned writes");
    assert!(seen == data, "the library read other bytes than A's returned writes");
}

/// What the library's tokens change: with them off, the same read misses the bytes still in
/// A's write-behind buffer (close-to-open consistency only).
#[test]
fn without_library_tokens_a_mounts_buffered_writes_are_not_read_before_close() {
    let data = pattern(6, 64 << 10);
    let seen = library_read_of_buffered_writes(false, &data);
    assert!(seen.len() < data.len(), "the library read A's buffered writes without tokens");
}

/// A library writer overwrites and extends a file that mount B has open read-only and has
/// read through the kernel's page cache; with the library's file still open, B's next reads
/// see the new bytes and the new size (the library's write token revoked B's read token,
/// which dropped B's cached pages; B's read revokes the library's token, which publishes
/// the size first).
#[test]
fn a_mount_sees_a_library_write_over_its_cached_pages() {
    let local = Local::start(2, false);
    let b = mount(&local, &[]);
    let old = pattern(1, 256 << 10);
    fs::write(b.path("cached"), &old).expect("create on B");
    let reader = fs::File::open(b.path("cached")).expect("open on B");
    let mut seen = vec![0u8; old.len()];
    reader.read_exact_at(&mut seen, 0).expect("first read on B");
    reader.read_exact_at(&mut seen, 0).expect("second read on B (page cache)");
    assert!(seen == old, "B read other bytes than were written");

    let client = library(&local, |_| {});
    let file = client.open("/cached").expect("open in the library");
    let new = pattern(9, 64 << 10);
    file.write_at(64 << 10, &new).expect("overwrite in the library");
    file.write_at(old.len() as u64, b"appended").expect("extend in the library");

    let mut middle = vec![0u8; new.len()];
    reader.read_exact_at(&mut middle, 64 << 10).expect("read the middle on B");
    assert!(middle == new, "B read stale cached pages after the library's write");
    let size = reader.metadata().expect("stat on B").len();
    assert_eq!(size, old.len() as u64 + 8, "B does not see the library's extension in the size");
    let mut tail = [0u8; 8];
    reader.read_exact_at(&mut tail, old.len() as u64).expect("read the extension on B");
    assert_eq!(&tail, b"appended");
    drop(file);
}

/// A library writer and a mount writer rewrite the same 512 KiB (eight stripe units over
/// four servers) with one byte value each, while an O_DIRECT reader on another mount and a
/// library reader in a third client read it again and again: no read ever mixes two writes.
/// (512 KiB: one FUSE request, which is what a mount's write or read is atomic up to; the
/// kernel splits an unaligned 1 MiB buffer in two.)
#[test]
fn library_and_mount_writers_are_never_mixed() {
    const WRITE_BYTES: usize = 512 << 10;
    let local = Local::start(4, false);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    fs::write(a.path("contended"), vec![b'0'; WRITE_BYTES]).expect("create");
    let deadline = Instant::now() + Duration::from_secs(6);
    let (writer_client, reader_client) = (library(&local, |_| {}), library(&local, |_| {}));
    let check = |who: &str, reads: u64, buffer: &[u8]| {
        if let Some(at) = buffer.iter().position(|byte| *byte != buffer[0]) {
            panic!(
                "{who} read {reads} mixes two writes: {:?} at 0, {:?} at {at}",
                buffer[0] as char, buffer[at] as char
            );
        }
    };
    let (direct_reads, library_reads) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let file = writer_client.open("/contended").expect("open in the library");
            while Instant::now() < deadline {
                file.write_at(0, &[b'L'; WRITE_BYTES]).expect("library write");
            }
        });
        scope.spawn(|| {
            let file = fs::OpenOptions::new().write(true).open(a.path("contended")).expect("open on A");
            while Instant::now() < deadline {
                file.write_all_at(&[b'M'; WRITE_BYTES], 0).expect("mount write");
            }
        });
        let direct = scope.spawn(|| {
            let file = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(b.path("contended"))
                .expect("open on B");
            let (mut buffer, mut reads) = (vec![0u8; WRITE_BYTES], 0);
            while Instant::now() < deadline {
                file.read_exact_at(&mut buffer, 0).expect("read on B");
                check("the O_DIRECT", reads, &buffer);
                reads += 1;
            }
            reads
        });
        let library_reader = scope.spawn(|| {
            let file = reader_client.open("/contended").expect("open in the library");
            let (mut buffer, mut reads) = (vec![0u8; WRITE_BYTES], 0);
            while Instant::now() < deadline {
                assert_eq!(file.read_at(0, &mut buffer).expect("library read"), WRITE_BYTES);
                check("the library", reads, &buffer);
                reads += 1;
            }
            reads
        });
        (direct.join().expect("the O_DIRECT reader"), library_reader.join().expect("the library reader"))
    });
    assert!(direct_reads > 0 && library_reads > 0, "a reader finished no read");
    let last = fs::read(b.path("contended")).expect("read at the end");
    assert!(last.iter().all(|byte| *byte == last[0]) && last[0] != b'0', "the file ends mixed or unwritten");
}

/// The library's open flag `no_overlap` (and a file's `user.flotilla.no_overlap` hint) makes
/// its token traffic zero; the same work without either asks for tokens (the counter counts).
#[test]
fn the_no_overlap_open_flag_makes_library_token_traffic_zero() {
    let local = Local::start(2, true);
    let client = library(&local, |_| {});
    let work = |file: &flotilla_client::File| {
        for record in 0..32u64 {
            file.write_at(record * 4096, &[record as u8; 4096]).expect("write a record");
        }
        file.set_size(32 * 4096).expect("set the size");
        let mut buffer = [0u8; 4096];
        for record in 0..32u64 {
            assert_eq!(file.read_at(record * 4096, &mut buffer).expect("read a record"), 4096);
            assert!(buffer.iter().all(|byte| *byte == record as u8), "record {record} differs");
        }
    };
    let flagged = flotilla_client::OpenOptions { no_overlap: true };
    let create = flotilla_client::CreateOptions { no_overlap: true, ..Default::default() };
    let before = token_acquires(&local);
    let created = client.create("/flagged-new", &create).expect("create with the flag");
    assert!(!created.takes_tokens(), "a create with no_overlap takes tokens");
    work(&created);
    client.create("/flagged", &Default::default()).expect("create").close().expect("close");
    work(&client.open_with("/flagged", &flagged).expect("open with the flag"));
    let hinted = client.create("/hinted", &Default::default()).expect("create");
    client.set_no_overlap_id(hinted.id(), true).expect("set the hint");
    drop(hinted);
    work(&client.open("/hinted").expect("open the hinted file"));
    assert_eq!(token_acquires(&local), before, "tokens were asked for with no_overlap");

    work(&client.create("/plain", &Default::default()).expect("create"));
    assert!(token_acquires(&local) > before, "a plain library file took no tokens");
}

/// A holder that never gives its token back (a SIGSTOPped mount holding a write token)
/// makes a library read fail within `acquire_timeout_ms` with a token error naming the
/// file and the range, not hang.
#[test]
fn a_token_that_never_comes_fails_the_call_naming_file_and_range() {
    let local = Local::start(1, false);
    let a = mount(&local, &[]);
    let mut writer = fs::File::create(a.path("held")).expect("create on A");
    writer.write_all(&[1u8; 4096]).expect("write on A");
    let pid = a.process.as_ref().expect("mount process").child.id() as i32;
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let client = library(&local, |config| config.token_settings.acquire_timeout_ms = 1500);
    let outcome = client.open("/held").and_then(|file| file.read_at(0, &mut [0u8; 16]));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let error = outcome.expect_err("a read without its token succeeded");
    let message = error.to_string();
    assert!(matches!(error, flotilla_client::ClientError::Token(_)), "not a token error: {message}");
    assert_eq!(error.errno(), libc::EIO);
    assert!(
        message.contains("/held") && message.contains("0..="),
        "the error names no file or range: {message}"
    );
    drop(writer);
}

/// A library writer and a mount writer rewrite the same 1 MiB in tight loops while a
/// mount and a library client read it: every call returns within the token timeout. (Each
/// writer's client keeps asking for the token the other holds; a revocation used to wait
/// until no acquire of the file was in flight, which a client asking again at once never
/// let happen, so both waited out `acquire_timeout_ms`.) 1 MiB: the kernel may split the
/// mount's write in two, so mixed reads are not checked here.
#[test]
fn contending_library_and_mount_writers_all_progress() {
    const WRITE_BYTES: usize = 1 << 20;
    let local = Local::start(4, false);
    let (a, b) = (mount(&local, &[]), mount(&local, &[]));
    fs::write(a.path("both"), vec![b'0'; WRITE_BYTES]).expect("create");
    let quick =
        |config: &mut flotilla_client::ClientConfig| config.token_settings.acquire_timeout_ms = 20_000;
    let (writer, reader) = (library(&local, quick), library(&local, quick));
    let deadline = Instant::now() + Duration::from_secs(4);
    let library_file = writer.open("/both").expect("open in the library");
    let mount_file = fs::OpenOptions::new().write(true).open(a.path("both")).expect("open on A");
    let direct = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(b.path("both"))
        .expect("open on B");
    let read_file = reader.open("/both").expect("open in the reading library");
    let counts = std::thread::scope(|scope| {
        let loops = [
            scope.spawn(|| {
                repeat_until(deadline, || {
                    library_file.write_at(0, &[b'L'; WRITE_BYTES]).expect("library write")
                })
            }),
            scope.spawn(|| {
                repeat_until(deadline, || {
                    mount_file.write_all_at(&[b'M'; WRITE_BYTES], 0).expect("mount write")
                })
            }),
            scope.spawn(|| {
                let mut buffer = vec![0u8; WRITE_BYTES];
                repeat_until(deadline, || direct.read_exact_at(&mut buffer, 0).expect("read on B"))
            }),
            scope.spawn(|| {
                let mut buffer = vec![0u8; WRITE_BYTES];
                repeat_until(deadline, || {
                    assert_eq!(read_file.read_at(0, &mut buffer).expect("library read"), WRITE_BYTES)
                })
            }),
        ];
        loops.map(|handle| handle.join().expect("a call failed"))
    });
    assert!(counts.iter().all(|calls| *calls > 0), "some loop made no call: {counts:?}");
}

/// Calls `step` until `deadline`; how many times.
fn repeat_until(deadline: Instant, mut step: impl FnMut()) -> u64 {
    let mut calls = 0;
    while Instant::now() < deadline {
        step();
        calls += 1;
    }
    calls
}
