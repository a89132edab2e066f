//! Hostile peers: every attack below is made on a real `flotilla server` (or `flotilla meta`)
//! process, and each test then checks that the attacked process is still running and that
//! a second, ordinary client (`flotilla get`, its own process) still gets the right bytes.
//!
//! Raw frames are built and sent only by [`raw_connect`] and [`frame_bytes`]/[`send_frame`],
//! so that a connection handshake added later is added in one place.

mod common;

use common::{cli, path, random_bytes, Cluster, Process, FLOTILLA};
use flotilla_client::Shape;
use flotilla_proto::{
    decode_body, decode_frame, encode_body, ErrorCode, FrameHeader, IoReply, IoRequest, MetaReply,
    HEADER_BYTES,
};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Small budgets and short timeouts, so that every attack is felt quickly.
const SERVER_SETTINGS: &str = "data_bytes_in_memory_max = 8388608\n\
cache_capacity_bytes = 8388608\n\
frame_read_timeout_ms = 5000\n\
reply_stall_ms_max = 1000\n\
idle_timeout_ms = 3000\n\
connections_max = 4000\n\
connections_per_peer_max = 2000\n";

const META_SETTINGS: &str = "frame_bytes_in_memory_max = 4194304\n\
frame_read_timeout_ms = 5000\n\
reply_stall_ms_max = 1000\n\
idle_timeout_ms = 3000\n\
connections_max = 4000\n\
connections_per_peer_max = 2000\n";

/// Bytes of the file every test reads back.
const FILE_BYTES: usize = 3 << 20;

/// A one-server cluster with `server_extra`/`meta_extra` settings and one file on it.
fn cluster_with_file(meta_extra: &str, server_extra: &str) -> (Cluster, Vec<u8>) {
    let cluster = Cluster::start_configured(1, meta_extra, server_extra);
    let data = random_bytes(8, FILE_BYTES);
    let local = cluster.dir.path().join("kept.bin");
    std::fs::write(&local, &data).expect("write the local file");
    let (ok, _, stderr) = cli(&["put", path(&local), "/kept", "--meta", &cluster.meta_addr()]);
    assert!(ok, "flotilla put failed: {stderr}");
    (cluster, data)
}

/// Connects to `addr` from the local address `from` (e.g. `127.0.0.2` to look like another
/// peer on loopback). The one place a handshake would be added.
fn raw_connect_from(addr: &str, from: &str) -> TcpStream {
    let target: SocketAddr = addr.parse().expect("socket address");
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let source: SocketAddr = format!("{from}:0").parse().expect("source address");
    socket.bind(&source.into()).expect("bind source address");
    socket.connect(&target.into()).expect("connect");
    let stream: TcpStream = socket.into();
    let auth = flotilla_auth::ClientAuth {
        credential: flotilla_auth::load_credential(
            Some(&common::client_key()),
            "test",
            flotilla_auth::Role::Client,
        )
        .expect("test credential"),
        bounds: flotilla_auth::AuthBounds::default(),
    };
    // A connection refused at once (over a connection limit) fails its handshake: it is
    // returned as it is, for the test to see it closed.
    let spare = stream.try_clone().expect("clone the socket");
    let stream = match common::authenticate(stream, auth) {
        Ok(connection) => {
            let stream = connection.stream;
            SEALERS.lock().unwrap().insert(stream.local_addr().expect("local address"), connection.sealer);
            stream
        }
        Err(_) => {
            spare.set_nonblocking(false).expect("blocking socket");
            spare
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    stream.set_write_timeout(Some(Duration::from_secs(20))).expect("write timeout");
    stream
}

/// The tag state of every raw connection, by its local address.
static SEALERS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<SocketAddr, flotilla_auth::Sealer>>,
> = std::sync::LazyLock::new(Default::default);

fn raw_connect(addr: &str) -> TcpStream {
    raw_connect_from(addr, "127.0.0.1")
}

/// The bytes of one frame as it goes on the wire.
fn frame_bytes(request_id: u64, body: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = FrameHeader::for_payload(request_id, body, data).expect("header").encode().to_vec();
    out.extend_from_slice(body);
    out.extend_from_slice(data);
    out
}

/// Sends one frame with its integrity tag (the connection's tag state is kept in `SEALERS`).
fn send_frame(stream: &mut TcpStream, request_id: u64, body: &[u8], data: &[u8]) -> std::io::Result<()> {
    let local = stream.local_addr()?;
    let bytes = match SEALERS.lock().unwrap().get_mut(&local) {
        Some(sealer) => sealer.seal_frame(request_id, body, data).map_err(std::io::Error::other)?,
        None => frame_bytes(request_id, body, data),
    };
    stream.write_all(&bytes)
}

/// A header claiming `payload_bytes` of body that will never come.
fn claiming_header(request_id: u64, payload_bytes: u32) -> Vec<u8> {
    let header =
        FrameHeader { body_bytes: payload_bytes, ..FrameHeader::for_payload(request_id, b"", b"").unwrap() };
    header.encode().to_vec()
}

/// Reads one reply frame's body (None when the connection ends first).
fn read_reply_body(stream: &mut TcpStream) -> Option<(u64, Vec<u8>)> {
    let mut received = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        if let Ok((frame, _)) = decode_frame(&received, 128 << 20) {
            return Some((frame.request_id, frame.body.to_vec()));
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Whether the peer has closed the connection: reads (and discards) until end of stream or
/// a reset; false if it is still open after the socket's read timeout.
fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut chunk = [0u8; 64 << 10];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

/// `flotilla get` as a separate client process must return `expected` (killed and failed
/// after a minute, so that a server that stopped serving fails the test instead of hanging it).
fn get_returns(cluster: &Cluster, expected: &[u8]) {
    let out = cluster.dir.path().join(format!("got-{}", rand_suffix()));
    let meta = cluster.meta_addr();
    let mut child = std::process::Command::new(FLOTILLA)
        .args(["get", "/kept", path(&out), "--meta", &meta])
        .env("FLOTILLA_KEY", common::client_key())
        .spawn()
        .expect("spawn flotilla get");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for flotilla get") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("flotilla get did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "flotilla get failed: {status}");
    let got = std::fs::read(&out).expect("read the got file");
    let first_difference = got.iter().zip(expected).position(|(a, b)| a != b);
    assert!(
        got == expected,
        "get returned different bytes: {} bytes, {} expected, first difference at {first_difference:?}",
        got.len(),
        expected.len()
    );
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn assert_running(process: &mut Process, what: &str) {
    let exited = process.child.try_wait().expect("query process");
    assert!(exited.is_none(), "{what} exited: {exited:?}");
}

fn assert_all_running(cluster: &mut Cluster) {
    assert_running(cluster.meta.as_mut().expect("meta"), "metadata service");
    assert_running(cluster.servers[0].as_mut().expect("server"), "I/O server");
}

fn server_addr(cluster: &Cluster) -> String {
    cluster.servers[0].as_ref().expect("server").addr.clone()
}

fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).expect("VmRSS value").parse().expect("VmRSS number");
    kib * 1024
}

/// Postcard bytes of `Shape::Batched` holding one chain of `depth` nested vectors, built by
/// hand (building the value would recurse as deep as the attack).
fn nested_shape_bytes(depth: usize) -> Vec<u8> {
    let mut out = vec![3, 1];
    for _ in 0..depth {
        out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 1, 1]);
    }
    out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 1]);
    out
}

/// `request` under the capability the metadata service gave `file`'s opener.
fn with_capability(file: &flotilla_client::File, request: IoRequest) -> IoRequest {
    let capability = file.entry().capability.clone().expect("an open hands out a capability");
    IoRequest::With { capability, request: Box::new(request) }
}

/// A read request whose shape nests `depth` vectors deep.
fn deep_read_body(fork: &flotilla_proto::ForkRef, depth: usize) -> Vec<u8> {
    let plain = Shape::contiguous(0, 1);
    let mut body = encode_body(&IoRequest::Read { fork: fork.clone(), shape: plain.clone() }).unwrap();
    let shape_bytes = encode_body(&plain).unwrap();
    assert!(body.ends_with(&shape_bytes), "the shape is the last field of a read");
    body.truncate(body.len() - shape_bytes.len());
    body.extend_from_slice(&nested_shape_bytes(depth));
    body
}

#[test]
fn deeply_nested_frames_are_refused_by_io_server_and_meta() {
    let (mut cluster, data) = cluster_with_file(META_SETTINGS, SERVER_SETTINGS);
    let fork = cluster.client().open("/kept").unwrap().fork(0, "data").unwrap().fork_ref().clone();
    let body = deep_read_body(&fork, 20_000);
    assert!(body.len() > 150_000, "the attack frame is about 180 KB, not {}", body.len());

    let mut io = raw_connect(&server_addr(&cluster));
    send_frame(&mut io, 41, &body, b"").unwrap();
    let (request_id, reply) = read_reply_body(&mut io).expect("the I/O server answers");
    assert_eq!(request_id, 41);
    match decode_body::<IoReply>(&reply, "reply").unwrap() {
        IoReply::Error(error) => {
            assert_eq!(error.code, ErrorCode::BadRequest, "{error:?}");
            println!("I/O server's reply to the deep frame: {error:?}");
            assert!(error.message.contains("over the decoding limit of 34"), "{}", error.message);
        }
        other => panic!("deep request accepted: {other:?}"),
    }

    let mut meta = raw_connect(&cluster.meta_addr());
    send_frame(&mut meta, 42, &body, b"").unwrap();
    let (request_id, reply) = read_reply_body(&mut meta).expect("the metadata service answers");
    assert_eq!(request_id, 42);
    match decode_body::<MetaReply>(&reply, "reply").unwrap() {
        // Metadata messages hold no nested structure: the body is refused as a whole.
        MetaReply::Error(error) => {
            println!("metadata service's reply to the deep frame: {error:?}");
            assert!(!error.message.is_empty(), "{error:?}");
        }
        other => panic!("deep frame accepted by meta: {other:?}"),
    }
    assert_all_running(&mut cluster);
    get_returns(&cluster, &data);
}

#[test]
fn a_thousand_stalled_maximum_claims_do_not_grow_memory() {
    let (mut cluster, data) = cluster_with_file(META_SETTINGS, SERVER_SETTINGS);
    let addr = server_addr(&cluster);
    println!("I/O server {addr}, metadata service {}", cluster.meta_addr());
    let claim = 65 << 20; // The largest payload the default frame_bytes_max allows.
    let stalled: Vec<TcpStream> = (0..1000u64)
        .map(|i| {
            let mut stream = raw_connect(&addr);
            stream.write_all(&claiming_header(i, claim - HEADER_BYTES as u32)).unwrap();
            stream
        })
        .collect();
    let meta_stalled: Vec<TcpStream> = (0..200u64)
        .map(|i| {
            let mut stream = raw_connect(&cluster.meta_addr());
            stream.write_all(&claiming_header(i, (4 << 20) - HEADER_BYTES as u32)).unwrap();
            stream
        })
        .collect();
    let pid = cluster.servers[0].as_ref().unwrap().child.id();
    let rss = vm_rss_bytes(pid);
    println!("I/O server VmRSS with 1,000 stalled maximum claims: {rss} bytes");
    let bound = (8 << 20) + (8 << 20) + (64 << 20);
    assert!(rss <= bound, "I/O server RSS {rss} bytes with 1,000 stalled claims, over {bound}");
    get_returns(&cluster, &data);
    let rss = vm_rss_bytes(pid);
    assert!(rss <= bound, "I/O server RSS {rss} bytes after a get beside 1,000 stalled claims, over {bound}");
    assert_all_running(&mut cluster);
    drop((stalled, meta_stalled));
}

#[test]
fn a_client_that_never_reads_its_replies_is_dropped() {
    let (mut cluster, data) = cluster_with_file(META_SETTINGS, SERVER_SETTINGS);
    let file = cluster.client().open("/kept").unwrap();
    let fork = file.fork(0, "data").unwrap().fork_ref().clone();
    let read = IoRequest::Read { fork, shape: Shape::contiguous(0, 1 << 20) };
    let body = encode_body(&with_capability(&file, read)).unwrap();
    let mut greedy = raw_connect(&server_addr(&cluster));
    greedy.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut sent = 0u64;
    // Ask for up to 2 GiB of replies, never reading one; stop when the server stops taking
    // requests (write blocks) or has dropped the connection (write fails).
    while sent < 2048 && send_frame(&mut greedy, sent, &body, b"").is_ok() {
        sent += 1;
    }
    assert!(sent > 0, "not even one request was sent");
    println!("{sent} read requests of 1 MiB sent without reading a reply");
    get_returns(&cluster, &data);
    // The replies it could not write made the server drop the connection: reading now ends
    // before all of them arrive.
    assert!(
        closed_by_peer(&mut greedy),
        "the server kept a connection whose peer never reads ({sent} requests)"
    );
    assert_all_running(&mut cluster);
}

#[test]
fn clients_vanishing_mid_frame_release_what_they_held() {
    let (mut cluster, data) = cluster_with_file(META_SETTINGS, SERVER_SETTINGS);
    let file = cluster.client().open("/kept").unwrap();
    let fork = file.fork(0, "data").unwrap().fork_ref().clone();
    let write = IoRequest::Write { fork, shape: Shape::contiguous(0, 4 << 20) };
    let write = encode_body(&with_capability(&file, write)).unwrap();
    let whole = frame_bytes(7, &write, &vec![0x5a; 4 << 20]);
    for round in 0..100u64 {
        // Half a real write (its claim covers most of the data budget), then gone.
        let mut stream = raw_connect(&server_addr(&cluster));
        stream.write_all(&whole[..whole.len() / 2]).unwrap();
        drop(stream);
        // A maximum claim with a few bytes, then gone, to both services.
        let mut stream = raw_connect(&server_addr(&cluster));
        stream.write_all(&claiming_header(round, 60 << 20)).unwrap();
        stream.write_all(&[1, 2, 3]).unwrap();
        drop(stream);
        let mut stream = raw_connect(&cluster.meta_addr());
        stream.write_all(&claiming_header(round, 3 << 20)).unwrap();
        drop(stream);
    }
    // Had any of them kept its share of the 8 MiB budget, these reads would wait forever.
    get_returns(&cluster, &data);
    get_returns(&cluster, &data);
    assert_all_running(&mut cluster);
}

#[test]
fn a_thousand_idle_connections_do_not_lock_out_a_new_client() {
    let per_peer = "connections_max = 300\nconnections_per_peer_max = 100\nidle_timeout_ms = 3000\n";
    let (mut cluster, data) = cluster_with_file(per_peer, per_peer);
    // The attacker is another address on loopback, so its limit is not the client's.
    let mut idle: Vec<TcpStream> = Vec::new();
    for addr in [server_addr(&cluster), cluster.meta_addr()] {
        idle.extend((0..1000).map(|_| raw_connect_from(&addr, "127.0.0.2")));
    }
    get_returns(&cluster, &data);
    // Connections past the per-peer limit were closed at once, and the ones served are
    // closed by the idle timeout: none is left holding a slot.
    for (index, stream) in idle.iter_mut().enumerate() {
        assert!(closed_by_peer(stream), "idle connection {index} still open");
    }
    assert_all_running(&mut cluster);
    get_returns(&cluster, &data);
}
