//! Fairness under hostile peers (issue 31, item 5): while one client attacks a real
//! `flotilla server` (or `flotilla meta`) process, a second, honest client's work must finish
//! within a bound derived from the configured limits, not after the old 26–27 s.
//!
//! The limits that bound the attacks are set short here (`progress_interval_ms = 300`);
//! the whole-frame and whole-reply limits (`frame_read_timeout_ms`, `reply_stall_ms_max`)
//! are left long, as they were what an attacker could hold the server's budget for.

mod common;

use common::{cli, path, random_bytes, Cluster, RawConnection};
use flotilla_client::Shape;
use flotilla_proto::{encode_body, FrameHeader, IoRequest, FLAG_TAGGED};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The window a stalled peer may hold anything for.
const PROGRESS_INTERVAL_MS: u64 = 300;
/// What the old code let a stalled peer hold the budget for.
const WHOLE_LIMIT_MS: u64 = 20_000;

fn server_settings() -> String {
    format!(
        "data_bytes_in_memory_max = 33554432\n\
         frame_read_timeout_ms = {WHOLE_LIMIT_MS}\n\
         reply_stall_ms_max = {WHOLE_LIMIT_MS}\n\
         progress_interval_ms = {PROGRESS_INTERVAL_MS}\n\
         progress_bytes_min = 65536\n\
         overdraft_wait_ms = 100\n\
         connection_data_bytes_max = 16777216\n"
    )
}

/// Bytes of the file the honest client reads (the 40 MB read).
const BIG_FILE_BYTES: usize = 40 << 20;

/// A one-server cluster with `/big` on it.
fn cluster_with_big_file() -> Cluster {
    let cluster = Cluster::start_configured(1, "", &server_settings());
    let local = cluster.dir.path().join("big.bin");
    std::fs::write(&local, random_bytes(31, BIG_FILE_BYTES)).expect("write the local file");
    let (ok, _, stderr) = cli(&["put", path(&local), "/big", "--meta", &cluster.meta_addr()]);
    assert!(ok, "flotilla put failed: {stderr}");
    cluster
}

/// How long an honest `flotilla get` of `/big` takes (a process of its own); it must succeed
/// and return the file's bytes.
fn honest_read(cluster: &Cluster) -> Duration {
    let out = cluster.dir.path().join(format!("got-{}", rand::random::<u64>()));
    let started = Instant::now();
    let (ok, _, stderr) = cli(&["get", "/big", path(&out), "--meta", &cluster.meta_addr()]);
    let took = started.elapsed();
    assert!(ok, "the honest get failed after {took:?}: {stderr}");
    let got = std::fs::read(&out).expect("read the got file");
    assert!(got == random_bytes(31, BIG_FILE_BYTES), "the honest get returned other bytes");
    let _ = std::fs::remove_file(&out);
    took
}

/// The bound an honest read under attack must stay within: twice its time alone plus a
/// generous multiple of the progress window (the old code: over `WHOLE_LIMIT_MS`).
fn bound(alone: Duration) -> Duration {
    alone * 2 + Duration::from_millis(20 * PROGRESS_INTERVAL_MS)
}

fn server_addr(cluster: &Cluster) -> String {
    cluster.servers[0].as_ref().expect("server").addr.clone()
}

/// A connection with a completed handshake under the shared client credential.
fn authenticated(addr: &str) -> Option<RawConnection> {
    common::raw_connect(addr, &common::client_key()).ok()
}

/// Runs `attack` over and over on a thread until the returned guard is dropped.
struct Attacker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Attacker {
    fn start(mut attack: impl FnMut() + Send + 'static) -> Attacker {
        let stop = Arc::new(AtomicBool::new(false));
        let running = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rounds = 0;
            while !running.load(Ordering::Relaxed) {
                attack();
                rounds += 1;
            }
            rounds
        });
        Attacker { stop, thread: Some(thread) }
    }

    /// Stops the attack; how many rounds it made.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("attack thread").join().expect("attack thread panicked")
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Keeps `connection` open (not reading) until the server closes it or `most` passed.
fn hold_until_closed(stream: &mut TcpStream, most: Duration) {
    stream.set_read_timeout(Some(Duration::from_millis(50))).expect("read timeout");
    let deadline = Instant::now() + most;
    let mut byte = [0u8; 1];
    while Instant::now() < deadline {
        match stream.peek(&mut byte) {
            Ok(0) => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// (1) A tagged frame header claiming 64 MiB, then nothing: the old server reserved the
/// claim from `data_bytes_in_memory_max` until `frame_read_timeout_ms`. Now memory is
/// reserved as bytes arrive, and the silent frame ends within one progress window.
#[test]
fn a_half_sent_64_mib_frame_does_not_stall_other_clients() {
    let cluster = cluster_with_big_file();
    let alone = honest_read(&cluster);
    let addr = server_addr(&cluster);
    let attacker = Attacker::start(move || {
        let Some(mut raw) = authenticated(&addr) else { return };
        let header = FrameHeader {
            flags: FLAG_TAGGED,
            body_bytes: 64 << 20,
            payload_crc32c: 0,
            ..FrameHeader::for_payload(1, b"", b"").expect("header")
        };
        if raw.stream.write_all(&header.encode()).is_ok() {
            hold_until_closed(&mut raw.stream, Duration::from_millis(WHOLE_LIMIT_MS + 5000));
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let attacked = honest_read(&cluster);
    let rounds = attacker.stop();
    println!(
        "honest 40 MiB read: {alone:?} alone, {attacked:?} beside the half-sent frame ({rounds} rounds)"
    );
    assert!(
        attacked <= bound(alone),
        "honest read took {attacked:?} beside a half-sent 64 MiB frame, over {:?}",
        bound(alone)
    );
    common::assert_still_serving(&cluster);
}

/// The body of a 16 MiB read of `/big`'s first fork, under its capability.
fn big_read_body(cluster: &Cluster) -> Vec<u8> {
    let file = cluster.client().open("/big").expect("open /big");
    let fork = file.fork(0, "data").expect("fork").fork_ref().clone();
    let capability = file.entry().capability.clone().expect("an open hands out a capability");
    let read = IoRequest::Read { fork, shape: Shape::contiguous(0, 16 << 20) };
    encode_body(&IoRequest::With { capability, request: Box::new(read) }).expect("encode")
}

/// (2) Four 16 MiB reads whose replies are never read: the old server held their share of
/// the data budget until `reply_stall_ms_max`. Now one connection holds at most
/// `connection_data_bytes_max`, and a writer that moves nothing ends within one window.
#[test]
fn four_16_mib_reads_never_read_back_do_not_stall_other_clients() {
    let cluster = cluster_with_big_file();
    let alone = honest_read(&cluster);
    let (addr, body) = (server_addr(&cluster), big_read_body(&cluster));
    let attacker = Attacker::start(move || {
        let Some(mut raw) = authenticated(&addr) else { return };
        let frames: Vec<u8> = (1..=4).flat_map(|id| raw.frame(id, &body, b"")).collect();
        raw.stream.set_write_timeout(Some(Duration::from_secs(5))).expect("write timeout");
        if raw.stream.write_all(&frames).is_ok() {
            hold_until_closed(&mut raw.stream, Duration::from_millis(WHOLE_LIMIT_MS + 5000));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let attacked = honest_read(&cluster);
    let rounds = attacker.stop();
    println!("honest 40 MiB read: {alone:?} alone, {attacked:?} beside unread replies ({rounds} rounds)");
    assert!(
        attacked <= bound(alone),
        "honest read took {attacked:?} beside four unread 16 MiB replies, over {:?}",
        bound(alone)
    );
    common::assert_still_serving(&cluster);
}

/// A TCP connection from `from` to `addr` that sends nothing (no handshake), or `None`.
fn half_open(addr: SocketAddr, from: &str) -> Option<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    let source: SocketAddr = format!("{from}:0").parse().ok()?;
    socket.bind(&source.into()).ok()?;
    socket.connect_timeout(&addr.into(), Duration::from_millis(500)).ok()?;
    let stream: TcpStream = socket.into();
    stream.set_nonblocking(true).ok()?;
    Some(stream)
}

/// Whether the server has closed a non-blocking `stream`.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

/// `per_address` half-open connections from each of `sources` to each of `targets`,
/// reopened as soon as the server closes them, until stopped.
fn flood(targets: Vec<SocketAddr>, sources: &[&'static str], per_address: usize) -> Vec<Attacker> {
    let mut attackers = Vec::new();
    for target in targets {
        for &from in sources {
            let mut held: Vec<Option<TcpStream>> = (0..per_address).map(|_| None).collect();
            attackers.push(Attacker::start(move || {
                for slot in held.iter_mut() {
                    if slot.as_mut().is_none_or(closed) {
                        *slot = half_open(target, from);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }));
        }
    }
    attackers
}

fn flood_settings() -> String {
    "connections_max = 300\n\
     connections_per_peer_max = 300\n\
     handshake_timeout_ms = 3000\n\
     handshakes_max = 64\n"
        .to_string()
}

/// An honest client's whole task (metadata service and I/O server: `flotilla get` of a
/// 1 MiB file) must succeed within `within` while the flood runs.
fn honest_work_completes(cluster: &Cluster, within: Duration) {
    let out = cluster.dir.path().join(format!("small-{}", rand::random::<u64>()));
    let meta = cluster.meta_addr();
    let mut child = std::process::Command::new(common::FLOTILLA)
        .args(["get", "/small", path(&out), "--meta", &meta])
        .env("FLOTILLA_KEY", common::client_key())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn flotilla get");
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for flotilla get") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the honest get did not finish within {within:?} during the flood");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut stderr));
    assert!(status.success(), "the honest get failed during the flood: {stderr}");
    assert_eq!(std::fs::read(&out).expect("read the got file"), random_bytes(5, 1 << 20));
}

/// (3) A flood of unauthenticated half-open connections, from one address and from five,
/// against the I/O server and the metadata service at once: they no longer take
/// `connections_max` (authenticated connections only) but a handshake pool of their own,
/// where a newcomer from a quieter address evicts the busiest address's oldest handshake.
#[test]
fn a_flood_of_half_open_connections_does_not_lock_out_an_honest_client() {
    let cluster = Cluster::start_configured(1, &flood_settings(), &flood_settings());
    let local = cluster.dir.path().join("small.bin");
    std::fs::write(&local, random_bytes(5, 1 << 20)).expect("write the local file");
    let (ok, _, stderr) = cli(&["put", path(&local), "/small", "--meta", &cluster.meta_addr()]);
    assert!(ok, "flotilla put failed: {stderr}");
    let targets: Vec<SocketAddr> = [server_addr(&cluster), cluster.meta_addr()]
        .iter()
        .map(|a| a.parse().expect("socket address"))
        .collect();
    for sources in [&["127.0.0.2"][..], &["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"]] {
        // 400 connections to each service (past connections_max = 300), reopened at once.
        let attackers = flood(targets.clone(), sources, 400 / sources.len());
        std::thread::sleep(Duration::from_millis(1500));
        let started = Instant::now();
        honest_work_completes(&cluster, Duration::from_secs(15));
        println!("{} flooding address(es): the honest get took {:?}", sources.len(), started.elapsed());
        let rounds: usize = attackers.into_iter().map(Attacker::stop).sum();
        assert!(rounds > 0, "the flood did not run");
    }
    common::assert_still_serving(&cluster);
}
