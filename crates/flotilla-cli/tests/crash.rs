//! The durability contract under `kill -9` (issue 8): what `close`, `fsync` and `sync`
//! acknowledged is there after any process dies. Real processes, killed with SIGKILL (never
//! SIGTERM) and restarted on the same folders and addresses; every file read back and
//! compared byte for byte. Seeds are printed; `FLOTILLA_CRASH_SEED=N` repeats a run.

mod common;

use common::{kill_and_restart_meta, random_bytes, seed_for, Cluster, FLOTILLA};
use flotilla_client::{Client, CreateOptions, File, Layout};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Server settings that keep acknowledged writes in the servers' caches until a Sync: a
/// restart then loses them unless the client sends them again. Bulk pieces (1 MiB stripe
/// units and more) still go straight to the fork files' page cache, which a SIGKILL of the
/// server does not lose.
const CACHING_SERVERS: &str = "dirty_age_max_ms = 600000\ncache_capacity_bytes = 268435456";
/// `CACHING_SERVERS` with every piece through the cache (`bulk_bytes_min = 0`), so that a
/// restart surely loses every unsynced write.
const CACHE_ONLY_SERVERS: &str =
    "dirty_age_max_ms = 600000\ncache_capacity_bytes = 268435456\nbulk_bytes_min = 0";

/// A small deterministic generator for the test's choices.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The content of byte range `[offset, offset + length)` of a file made with `seed`: every
/// 8-byte word is a hash of the seed and its position, so any range can be made alone.
fn pattern(seed: u64, offset: u64, length: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(length + 16);
    let first_word = offset / 8;
    let mut word = first_word;
    while out.len() < length + (offset % 8) as usize {
        out.extend_from_slice(&Dice(seed ^ word.wrapping_mul(0x2545_f491_4f6c_dd1d)).next().to_le_bytes());
        word += 1;
    }
    out.drain(..(offset % 8) as usize);
    out.truncate(length);
    out
}

fn striped(subfiles: u32, unit_bytes: u64) -> CreateOptions {
    CreateOptions {
        subfiles,
        layout: Some(Layout::Stripe { unit_bytes, count: 0 }),
        exclusive: true,
        ..CreateOptions::default()
    }
}

/// The index of the first byte where `got` differs from `want`, if any.
fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then_some(got.len().min(want.len())))
}

/// Checks that `path` holds exactly `size` bytes of `seed`'s pattern; names what differs.
fn verify(client: &Client, path: &str, seed: u64, size: u64) -> Result<(), String> {
    let file = client.open(path).map_err(|e| format!("{path}: cannot open: {e}"))?;
    if file.size() != size {
        return Err(format!("{path}: size {} where {size} was acknowledged", file.size()));
    }
    let piece_bytes = 8u64 << 20;
    let mut offset = 0;
    while offset < size {
        let length = piece_bytes.min(size - offset) as usize;
        let mut got = vec![0u8; length];
        let read = file.read_at(offset, &mut got).map_err(|e| format!("{path}: read at {offset}: {e}"))?;
        got.truncate(read);
        let want = pattern(seed, offset, length);
        if let Some(at) = first_difference(&got, &want) {
            let at = offset + at as u64;
            return Err(format!("{path} (seed {seed}): differs from byte {at} of {size} on"));
        }
        offset += length as u64;
    }
    Ok(())
}

/// Kills I/O server `index` with SIGKILL and starts it again on the same folder and address.
fn kill_and_restart_server(cluster: &mut Cluster, index: usize) {
    let process = cluster.servers[index].take().expect("server running");
    let addr = process.addr.clone();
    process.kill();
    let restarted = cluster.start_server_listening(&cluster.target_dir(index), &addr);
    assert_eq!(restarted.addr, addr, "server {index} came back elsewhere");
    cluster.servers[index] = Some(restarted);
}

/// Writes acknowledged by a server and then lost with its cache (SIGKILL) are sent again by
/// the client before `close` returns, so the closed file is whole. The fork is read by a
/// second client before the close to prove the restart did lose them.
#[test]
fn writes_a_server_restart_lost_are_sent_again_before_close_returns() {
    let seed = seed_for("resend");
    let mut cluster = Cluster::start_configured(2, "", CACHE_ONLY_SERVERS);
    let client = cluster.client();
    let size = 8u64 << 20;
    let file = client.create("/resent", &striped(2, 1 << 20)).expect("create");
    file.write_at(0, &pattern(seed, 0, size as usize)).expect("write");

    let holder = &file.entry().subfiles[0].server;
    let index = cluster.servers.iter().position(|s| s.as_ref().is_some_and(|p| p.addr == *holder));
    kill_and_restart_server(&mut cluster, index.expect("the server holding subfile 0"));
    cluster.wait_up(2);
    let other = cluster.client();
    let fork = other.open("/resent").expect("open").fork(0, "data").expect("fork");
    let mut on_server = vec![0u8; (size / 2) as usize];
    let read = fork.read(&flotilla_client::Shape::contiguous(0, size / 2), &mut on_server);
    let stripe_unit_0 = pattern(seed, 0, 1 << 20);
    assert!(
        read.is_err() || on_server[..1 << 20] != stripe_unit_0[..],
        "the killed server still had the unsynced writes: this test proves nothing (cache settings?)"
    );

    file.close().expect("close after the server restarted");
    verify(&other, "/resent", seed, size).expect("the closed file is whole");
}

/// Chunk `index` of the big file: `base` with the chunk's index and each 4 KiB block's index
/// stamped at the start of every block, so no block reads right from anywhere else.
fn big_chunk(base: &[u8], index: u64) -> Vec<u8> {
    let mut chunk = base.to_vec();
    for (block, bytes) in chunk.chunks_mut(4096).enumerate() {
        bytes[..8].copy_from_slice(&index.to_le_bytes());
        bytes[8..16].copy_from_slice(&(block as u64).to_le_bytes());
    }
    chunk
}

/// Checks the first `size` bytes of the big file chunk by chunk.
fn verify_big(client: &Client, path: &str, base: &[u8], size: u64) -> Result<(), String> {
    let file = client.open(path).map_err(|e| format!("{path}: cannot open: {e}"))?;
    let chunk_bytes = base.len() as u64;
    let mut got = vec![0u8; base.len()];
    for index in 0..size.div_ceil(chunk_bytes) {
        let offset = index * chunk_bytes;
        let length = chunk_bytes.min(size - offset) as usize;
        let read = file.read_at(offset, &mut got[..length]).map_err(|e| format!("read at {offset}: {e}"))?;
        let want = big_chunk(base, index);
        if let Some(at) = first_difference(&got[..read], &want[..length]) {
            return Err(format!("{path}: differs from byte {} of {size} on", offset + at as u64));
        }
    }
    Ok(())
}

/// Issue 8's second reproduction: SIGKILL an I/O server during a 1 GiB write. The writer
/// retries the writes that failed while the server was down; `close` then either succeeds and
/// every byte reads back, or fails with an error and the published size covers only bytes
/// that read back right. Never a silent loss.
#[test]
fn kill_9_during_a_1_gib_write_then_close_keeps_or_fails_never_loses_silently() {
    let seed = seed_for("1 GiB");
    let total = 1u64 << 30;
    let chunk = 8u64 << 20;
    let base = random_bytes(seed, chunk as usize);
    let mut cluster = Cluster::start_configured(2, "", CACHING_SERVERS);
    let client = cluster.client();
    let file = client.create("/big", &striped(2, 1 << 20)).expect("create");
    let written = Arc::new(AtomicU64::new(0));
    let killer = {
        let written = written.clone();
        std::thread::spawn(move || {
            while written.load(Ordering::Relaxed) < total * 3 / 8 {
                std::thread::sleep(Duration::from_millis(5));
            }
            kill_and_restart_server(&mut cluster, 1);
            cluster
        })
    };
    let mut retries = 0;
    for index in 0..total / chunk {
        let (offset, data) = (index * chunk, big_chunk(&base, index));
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(error) = file.write_at(offset, &data) {
            assert!(Instant::now() < deadline, "the write at {offset} kept failing: {error}");
            retries += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        written.store(offset + chunk, Ordering::Relaxed);
    }
    let cluster = killer.join().expect("killer thread");
    println!("writes retried while the server was down: {retries}");
    let closed = file.close();
    let reader = cluster.client();
    match closed {
        Ok(()) => {
            verify_big(&reader, "/big", &base, total).expect("closed without error: every byte is kept")
        }
        Err(error) => {
            println!("close failed with: {error}");
            let size = reader.stat("/big").expect("stat").attrs.size_bytes;
            verify_big(&reader, "/big", &base, size).expect("the published size covers only kept bytes");
        }
    }
}

/// One writer of the crash checker: files of random sizes written in random pieces, some with
/// an `fsync` half way, each recorded as acknowledged only when its `close` returned Ok.
fn checker_writer(
    meta: String,
    writer: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, u64, u64)>>>,
) {
    checker_writer_with(meta, writer, seed, stop, acked, striped(3, 256 << 10))
}

/// [`checker_writer`] creating its files with `options` (e.g. replicated).
fn checker_writer_with(
    meta: String,
    writer: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, u64, u64)>>>,
    options: CreateOptions,
) {
    let mut dice = Dice(seed ^ writer);
    let client = common::client_at(&meta);
    let mut number = 0;
    while !stop.load(Ordering::Relaxed) {
        number += 1;
        let path = format!("/w{writer}-{number}");
        let file_seed = dice.next();
        let size = 1 + dice.below(3 << 20);
        match write_one(&client, &path, &options, (file_seed, size), &mut dice) {
            Ok(()) => acked.lock().expect("acked").push((path, file_seed, size)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn write_one(
    client: &Client,
    path: &str,
    options: &CreateOptions,
    (seed, size): (u64, u64),
    dice: &mut Dice,
) -> Result<(), String> {
    let file: File = client.create(path, options).map_err(|e| e.to_string())?;
    let sync_at = if dice.below(3) == 0 { dice.below(size) } else { u64::MAX };
    let mut offset = 0;
    while offset < size {
        let length = (64 << 10) + dice.below(1 << 20);
        let length = length.min(size - offset);
        file.write_at(offset, &pattern(seed, offset, length as usize)).map_err(|e| e.to_string())?;
        offset += length;
        if offset >= sync_at {
            file.sync().map_err(|e| e.to_string())?;
        }
    }
    file.close().map_err(|e| e.to_string())
}

/// A `flotilla mount` of the cluster, as its own process, that the checker kills and
/// mounts again; `lock` is held for reading while a program writes through it, and for
/// writing while it is unmounted and mounted again (so no write lands in the bare folder).
struct CheckerMount {
    dir: PathBuf,
    process: Mutex<Option<common::Process>>,
    lock: std::sync::RwLock<()>,
}

impl CheckerMount {
    fn start(meta: &str, dir: PathBuf) -> CheckerMount {
        fs::create_dir_all(&dir).expect("create mount point");
        let mount = CheckerMount { dir, process: Mutex::new(None), lock: std::sync::RwLock::new(()) };
        *mount.process.lock().expect("mount process") = Some(mount.mount(meta));
        mount
    }

    fn mount(&self, meta: &str) -> common::Process {
        let args = ["mount", "--meta", meta, common::path(&self.dir)];
        let process = common::Process::start(&args, "mount").expect("start flotilla mount");
        assert!(common::is_mounted(&self.dir), "{} is not mounted", self.dir.display());
        process
    }

    /// SIGKILL the mount, detach it, mount again.
    fn kill_and_remount(&self, meta: &str) {
        if let Some(process) = self.process.lock().expect("mount process").take() {
            process.kill();
        }
        let _unmounted = self.lock.write().expect("mount lock");
        unmount(&self.dir);
        *self.process.lock().expect("mount process") = Some(self.mount(meta));
    }
}

impl Drop for CheckerMount {
    fn drop(&mut self) {
        if let Some(process) = self.process.lock().expect("mount process").take() {
            process.kill();
        }
        unmount(&self.dir);
    }
}

/// The crash checker's program writer: `dd conv=fsync` copies files of known content into
/// the mount; a file is acknowledged when dd exits 0 (its fsync and close succeeded).
fn mount_writer(
    mount: Arc<CheckerMount>,
    dir: PathBuf,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(String, u64, u64)>>>,
) {
    let mut dice = Dice(seed ^ 0xdd);
    let source = dir.join("source");
    let mut number = 0;
    while !stop.load(Ordering::Relaxed) {
        number += 1;
        let (file_seed, size) = (dice.next(), 1 + dice.below(2 << 20));
        fs::write(&source, pattern(file_seed, 0, size as usize)).expect("write the source file");
        let name = format!("m-{number}");
        let copied = {
            let _mounted = mount.lock.read().expect("mount lock");
            Command::new("dd")
                .arg(format!("if={}", source.display()))
                .arg(format!("of={}", mount.dir.join(&name).display()))
                .args(["bs=256k", "conv=fsync", "status=none"])
                .stderr(Stdio::null())
                .status()
        };
        match copied {
            Ok(status) if status.success() => {
                acked.lock().expect("acked").push((format!("/{name}"), file_seed, size))
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The crash checker: three library writers and `dd` through a mount create, write and close
/// files while a driver SIGKILLs an I/O server, the metadata service or the mount at random
/// moments (at least 50 kills) and restarts it. Afterwards every file whose `close` (or dd's
/// fsync and close) returned success must have its size and every byte.
#[test]
fn crash_checker_every_acknowledged_file_survives_50_kills() {
    let seed = seed_for("crash checker");
    let mut dice = Dice(seed);
    let mut cluster = Cluster::start_configured(3, "", CACHING_SERVERS);
    let meta = cluster.meta_addr();
    let work = tempfile::tempdir().expect("temporary folder");
    let mount = Arc::new(CheckerMount::start(&meta, work.path().join("mnt")));
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut writers: Vec<_> = (0..3)
        .map(|writer| {
            let (meta, stop, acked) = (meta.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || checker_writer(meta, writer, seed, stop, acked))
        })
        .collect();
    writers.push({
        let (mount, dir, stop, acked) =
            (mount.clone(), work.path().to_path_buf(), stop.clone(), acked.clone());
        std::thread::spawn(move || mount_writer(mount, dir, seed, stop, acked))
    });
    let (mut kills, mut meta_kills, mut mount_kills) = (0, 0, 0);
    // At least 50 kills; then, while too few files were acknowledged to check much (a busy
    // machine finishes few between kills), more kills at longer intervals, for at most 3 min.
    let enough = |acked: &Mutex<Vec<(String, u64, u64)>>| {
        let acked = acked.lock().expect("acked");
        acked.len() >= 10 && acked.iter().filter(|(path, _, _)| path.starts_with("/m-")).count() >= 3
    };
    let extra_until = Instant::now() + Duration::from_secs(180);
    while kills < 50 || (!enough(&acked) && Instant::now() < extra_until) {
        let spell_ms = if kills < 50 { 50 + dice.below(250) } else { 500 + dice.below(1000) };
        std::thread::sleep(Duration::from_millis(spell_ms));
        match dice.below(8) {
            0 | 1 => {
                kill_and_restart_meta(&mut cluster);
                meta_kills += 1;
            }
            2 => {
                mount.kill_and_remount(&meta);
                mount_kills += 1;
            }
            _ => kill_and_restart_server(&mut cluster, dice.below(3) as usize),
        }
        kills += 1;
    }
    // A last quiet spell, so writers finish files after the last restart too.
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer thread");
    }
    cluster.wait_up(3);
    let acked = acked.lock().expect("acked").clone();
    let through_mount = acked.iter().filter(|(path, _, _)| path.starts_with("/m-")).count();
    println!(
        "{kills} kills ({meta_kills} of the metadata service, {mount_kills} of the mount), {} files acknowledged ({through_mount} by dd through the mount)",
        acked.len()
    );
    assert!(
        acked.len() >= 10 && through_mount >= 3,
        "too few files were acknowledged to check anything, even after {kills} kills"
    );
    let reader = cluster.client();
    let failures: Vec<String> =
        acked.iter().filter_map(|(path, seed, size)| verify(&reader, path, *seed, *size).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} acknowledged files are damaged: {failures:#?}",
        failures.len(),
        acked.len()
    );
}

/// `flotilla local --mount`: the metadata service, its I/O servers and the mount in one
/// process, so one SIGKILL takes everything down at once.
struct Local {
    child: Option<Child>,
    mount: PathBuf,
}

impl Local {
    fn start(data: &Path, mount: &Path) -> Local {
        fs::create_dir_all(mount).expect("create mount point");
        let mut child = Command::new(FLOTILLA)
            .args(["local", "--servers", "2", "--listen", "127.0.0.1:0", "--data", common::path(data)])
            .args(["--mount", common::path(mount)])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn flotilla local");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let printed: Vec<String> =
            lines.map_while(Result::ok).take_while(|l| !l.starts_with("mount=")).collect();
        assert!(
            printed.first().is_some_and(|l| l.starts_with("meta=")),
            "flotilla local printed {printed:?}"
        );
        assert!(common::is_mounted(mount), "flotilla local did not mount {}", mount.display());
        Local { child: Some(child), mount: mount.to_path_buf() }
    }

    /// SIGKILL, then detach the dead mount (the kernel keeps it until unmounted).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        unmount(&self.mount);
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.kill();
    }
}

fn unmount(dir: &Path) {
    if common::is_mounted(dir) {
        let _ = Command::new(FLOTILLA).args(["umount", "--lazy", common::path(dir)]).status();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::is_mounted(dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 8's first reproduction: `cp` a 20 MB file into the mount, `kill -9` the whole
/// `flotilla local` half a second after `cp` returns, restart: the file reads back exactly
/// (before commit-on-close it had its full size and read as zeros).
#[test]
fn cp_then_kill_9_of_flotilla_local_keeps_the_file() {
    let work = tempfile::tempdir().expect("temporary folder");
    fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let (data, mount) = (work.path().join("data"), work.path().join("mnt"));
    let source = work.path().join("source");
    let seed = seed_for("cp");
    let content = random_bytes(seed, 20_000_000);
    fs::write(&source, &content).expect("write source file");

    let mut local = Local::start(&data, &mount);
    let copied = Command::new("cp").arg(&source).arg(mount.join("copy")).status().expect("run cp");
    assert!(copied.success(), "cp failed: {copied}");
    std::thread::sleep(Duration::from_millis(500));
    local.kill();

    let local = Local::start(&data, &mount);
    let read = fs::read(local.mount.join("copy")).expect("read the copy after restart");
    assert_eq!(read.len(), content.len(), "size after restart");
    if let Some(at) = first_difference(&read, &content) {
        panic!("the copy differs from byte {at} on (read {:#04x}, wrote {:#04x})", read[at], content[at]);
    }
}

/// Short membership timings for the replicated runs (heartbeats every 200 ms);
/// `fence_after_ms > lease_ms + clock_margin_ms` holds.
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Bound on every wait for the cluster to settle (generous: a loaded 2-core machine).
const SETTLE: Duration = Duration::from_secs(60);

/// A metadata service whose chains have `replicas` members and `servers` I/O servers,
/// server `i` in failure group `rack-i`, their caches keeping writes until a sync.
fn grouped_cluster(servers: usize, replicas: u32) -> Cluster {
    let meta_extra = format!("{MEMBERSHIP}chain_replicas = {replicas}\n");
    let mut cluster = Cluster::start_configured(0, &meta_extra, CACHING_SERVERS);
    for index in 0..servers {
        let server = start_grouped(&cluster, index);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(servers);
    let deadline = Instant::now() + SETTLE;
    while chain_states(&cluster.meta_addr()).is_empty() {
        assert!(Instant::now() < deadline, "the chain table was not built");
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster
}

/// Server `index` of `cluster` on its target folder, in failure group `rack-index`.
fn start_grouped(cluster: &Cluster, index: usize) -> common::Process {
    let dir = cluster.target_dir(index);
    fs::create_dir_all(&dir).expect("target folder");
    let (config, meta, target) = (cluster.config(), cluster.meta_addr(), common::target_spec(&dir));
    let group = format!("rack-{index}");
    let args = [
        "--config",
        common::path(&config),
        "server",
        "--meta",
        &meta,
        "--target",
        common::path(&target),
        "--listen",
        "127.0.0.1:0",
        "--failure-group",
        &group,
    ];
    common::Process::start(&args, "server").expect("start server")
}

/// Every chain's member states (`target:state`), as `flotilla status --chains` shows them;
/// empty while the table is not built or the service does not answer.
fn chain_states(meta: &str) -> Vec<Vec<String>> {
    let (ok, stdout, _) = common::cli(&["status", "--chains", "--meta", meta]);
    if !ok {
        return Vec::new();
    }
    stdout
        .lines()
        .filter(|line| line.starts_with("chain="))
        .filter_map(|line| line.split_whitespace().find_map(|w| w.strip_prefix("members=")))
        .map(|members| members.split(',').map(str::to_string).collect())
        .collect()
}

/// Waits (bounded) until every chain of the table serves on every member again; returns
/// how long that took.
fn wait_all_serving(meta: &str, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let states = chain_states(meta);
        if !states.is_empty() && states.iter().all(|m| m.iter().all(|s| s.ends_with(":serving"))) {
            return started.elapsed();
        }
        assert!(started.elapsed() < SETTLE, "{what}: the chains did not all serve again: {states:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILLs every process at one instant (the signals sent back to back, then reaped).
fn kill_at_once(processes: Vec<common::Process>) {
    for process in &processes {
        // SAFETY: kill with a child's pid and SIGKILL has no memory-safety preconditions.
        unsafe { libc::kill(process.child.id() as i32, libc::SIGKILL) };
    }
    for process in processes {
        process.kill();
    }
}

/// A replicated create of the checker's writers: `replicas` copies, 256 KiB stripe units
/// over as many disjoint chains as the table has.
/// Files the checker's writers had acknowledged: path, seed of their bytes and size.
type AckedFiles = Arc<Mutex<Vec<(String, u64, u64)>>>;

/// `count` checker writers on `replicas`-way replicated files, each on its own thread.
fn replicated_writers(
    count: u64,
    meta: &str,
    seed: u64,
    stop: &Arc<AtomicBool>,
    acked: &AckedFiles,
    replicas: u32,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..count)
        .map(|writer| {
            let (meta, stop, acked) = (meta.to_string(), stop.clone(), acked.clone());
            std::thread::spawn(move || {
                checker_writer_with(meta, writer, seed, stop, acked, replicated(replicas))
            })
        })
        .collect()
}

fn replicated(replicas: u32) -> CreateOptions {
    CreateOptions {
        subfiles: 0,
        layout: Some(Layout::Stripe { unit_bytes: 256 << 10, count: 0 }),
        replicas,
        exclusive: true,
        ..CreateOptions::default()
    }
}

/// Verifies `path`, retrying (bounded by `deadline`) while reads fail: a file whose bytes
/// differ fails at once.
fn verify_until(client: &Client, path: &str, seed: u64, size: u64, deadline: Instant) -> Result<(), String> {
    loop {
        match verify(client, path, seed, size) {
            Ok(()) => return Ok(()),
            Err(error) if error.contains("differs") || error.contains("where") => return Err(error),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The crash checker with `replicas=3` over five servers in five failure groups: three
/// library writers create, write (some fsync half way) and close files while, three times,
/// two servers are SIGKILLed at the same instant, kept down while the writers go on, and
/// restarted; a reader keeps reading acknowledged files all along. Every read succeeds
/// with the acknowledged bytes, and afterwards every acknowledged file reads back whole.
#[test]
fn crash_checker_with_three_replicas_survives_two_servers_killed_at_once() {
    const SERVERS: usize = 5;
    const ROUNDS: usize = 3;
    let seed = seed_for("crash checker replicas=3");
    let mut dice = Dice(seed);
    let mut cluster = grouped_cluster(SERVERS, 3);
    let meta = cluster.meta_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers = replicated_writers(3, &meta, seed, &stop, &acked, 3);
    // Reads go on through the kills: a reader checks acknowledged files as they come.
    let reader = {
        let (meta, stop, acked) = (meta.clone(), stop.clone(), acked.clone());
        std::thread::spawn(move || -> (usize, Vec<String>) {
            let client = common::client_at(&meta);
            let (mut reads, mut failures) = (0, Vec::new());
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                let file = acked.lock().expect("acked").get(next).cloned();
                let Some((path, seed, size)) = file else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                match verify(&client, &path, seed, size) {
                    Ok(()) => reads += 1,
                    Err(error) => failures.push(error),
                }
                next += 1;
            }
            (reads, failures)
        })
    };
    let started = Instant::now();
    for round in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(300 + dice.below(1000)));
        let first = dice.below(SERVERS as u64) as usize;
        let second = (first + 1 + dice.below(SERVERS as u64 - 1) as usize) % SERVERS;
        let before = acked.lock().expect("acked").len();
        let victims = vec![
            cluster.servers[first].take().expect("server running"),
            cluster.servers[second].take().expect("server running"),
        ];
        kill_at_once(victims);
        println!(
            "round {round}: servers {first} and {second} SIGKILLed together ({before} files acknowledged)"
        );
        // The writers go on with two servers down.
        let deadline = Instant::now() + SETTLE;
        while acked.lock().expect("acked").len() < before + 2 {
            assert!(
                Instant::now() < deadline,
                "round {round}: no file was acknowledged with two servers down"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for index in [first, second] {
            cluster.servers[index] = Some(start_grouped(&cluster, index));
        }
        let took = wait_all_serving(&meta, &format!("round {round}"));
        println!("round {round}: every chain serving again {took:?} after the restarts");
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer thread");
    }
    let (reads, read_failures) = reader.join().expect("reader thread");
    let acked = acked.lock().expect("acked").clone();
    println!(
        "{ROUNDS} double kills in {:?}: {} files acknowledged, {reads} read back during the kills",
        started.elapsed(),
        acked.len()
    );
    assert!(read_failures.is_empty(), "reads failed during the kills: {read_failures:#?}");
    let client = cluster.client();
    let deadline = Instant::now() + SETTLE;
    let failures: Vec<String> = acked
        .iter()
        .filter_map(|(path, seed, size)| verify_until(&client, path, *seed, *size, deadline).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} acknowledged files are damaged: {failures:#?}",
        failures.len(),
        acked.len()
    );
}

/// A power cut: `replicas=2` over four servers in four failure groups, three library
/// writers running; the metadata service and every server SIGKILLed at one instant, then
/// all restarted on their folders. Every file closed before the cut (and any whose close
/// succeeded after the restart) reads back byte for byte, and every chain serves again.
#[test]
fn a_power_cut_of_every_process_keeps_every_closed_file() {
    const SERVERS: usize = 4;
    let seed = seed_for("power cut");
    let mut cluster = grouped_cluster(SERVERS, 2);
    let meta = cluster.meta_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers = replicated_writers(3, &meta, seed, &stop, &acked, 2);
    let deadline = Instant::now() + SETTLE;
    while acked.lock().expect("acked").len() < 6 {
        assert!(Instant::now() < deadline, "too few files were acknowledged before the cut");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The cut: every process SIGKILLed at one instant, writers mid-file.
    let mut everyone: Vec<common::Process> = cluster.servers.iter_mut().filter_map(Option::take).collect();
    everyone.push(cluster.meta.take().expect("meta running"));
    kill_at_once(everyone);
    let closed_before = acked.lock().expect("acked").len();
    stop.store(true, Ordering::Relaxed);
    println!("power cut with {closed_before} files closed");
    cluster.start_meta(&meta);
    for index in 0..SERVERS {
        cluster.servers[index] = Some(start_grouped(&cluster, index));
    }
    let took = wait_all_serving(&meta, "after the power cut");
    println!("every chain serving again {took:?} after the restart");
    for writer in writers {
        writer.join().expect("writer thread");
    }
    let acked = acked.lock().expect("acked").clone();
    let client = cluster.client();
    let deadline = Instant::now() + SETTLE;
    let failures: Vec<String> = acked
        .iter()
        .filter_map(|(path, seed, size)| verify_until(&client, path, *seed, *size, deadline).err())
        .collect();
    println!(
        "{} files acknowledged ({closed_before} before the cut), {} damaged",
        acked.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} acknowledged files are damaged: {failures:#?}",
        failures.len(),
        acked.len()
    );
}
