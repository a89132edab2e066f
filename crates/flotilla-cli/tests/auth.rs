//! Authentication refusals with real processes: every refused peer is refused with a clear
//! error, and the services keep serving a legitimate client afterwards.

mod common;

use bytes::Bytes;
use common::{cli, cli_without_key, path, Cluster};
use flotilla_client::{CreateOptions, Shape};
use flotilla_proto::{
    decode_frame, encode_body, Capability, ErrorCode, IoReply, IoRequest, MetaReply, MetaRequest, Rights,
    TargetReport,
};
use flotilla_rpc::Connection;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Reads until the peer closes (or 10 s pass) and returns what arrived.
fn read_until_closed(stream: &mut TcpStream) -> (Vec<u8>, bool) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return (received, true),
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (received, true),
            Err(_) => return (received, false),
        }
    }
}

/// Issues a credential from the shared test CA with `flotilla keygen issue`.
fn issue(dir: &std::path::Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{name}.cred"));
    let ca = common::test_keys().join("cluster.key");
    let mut args = vec!["keygen", "issue", "--ca", path(&ca), "--name", name, "--out", path(&out)];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = cli(&args);
    assert!(ok, "keygen issue: {stderr}");
    assert!(stdout.contains(&format!("key={}", out.display())), "{stdout}");
    out
}

/// The capability the metadata service hands credential `key` with the entry at `path`.
async fn capability_as(meta: &str, key: &std::path::Path, path: &str) -> Capability {
    let connection = Connection::connect(meta, common::connection_config_with(key)).await.unwrap();
    let lookup = MetaRequest::Lookup { path: path.to_string() };
    match connection.call::<MetaRequest, MetaReply>(&lookup, Bytes::new()).await.unwrap().0 {
        MetaReply::Entry(entry) => entry.capability.expect("a file entry carries a capability"),
        other => panic!("lookup {path}: {other:?}"),
    }
}

/// One request under `capability`.
async fn call_with(
    connection: &Connection,
    capability: &Capability,
    request: IoRequest,
    data: Bytes,
) -> (IoReply, Bytes) {
    let with = IoRequest::With { capability: capability.clone(), request: Box::new(request) };
    connection.call::<IoRequest, IoReply>(&with, data).await.unwrap()
}

fn expect_refusal(reply: IoReply, code: ErrorCode, needle: &str) {
    match reply {
        IoReply::Error(error) => {
            assert_eq!(error.code, code, "{error:?}");
            assert!(error.message.contains(needle), "{:?} should mention {needle:?}", error.message);
        }
        other => panic!("expected a {code:?} refusal mentioning {needle:?}, got {other:?}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn no_credential_is_refused_with_a_clear_error() {
    let cluster = Cluster::start(1);
    let meta = cluster.meta_addr();
    let (ok, _, stderr) = cli_without_key(&["status", "--meta", &meta]);
    assert!(!ok);
    assert!(stderr.contains("no credential") && stderr.contains("FLOTILLA_KEY"), "{stderr}");
    let data = cluster.dir.path().join("keyless-meta");
    let (ok, _, stderr) = cli_without_key(&["meta", "--data", path(&data), "--listen", "127.0.0.1:0"]);
    assert!(!ok && stderr.contains("no credential for the metadata service"), "{stderr}");
    let (ok, _, stderr) = cli(&["meta", "--data", path(&data), "--listen", "127.0.0.1:0"]);
    assert!(!ok && stderr.contains("needs a server credential"), "a client key ran a service: {stderr}");
    let missing = cluster.dir.path().join("missing.cred");
    let (ok, _, stderr) = cli(&["--key", path(&missing), "status", "--meta", &meta]);
    assert!(!ok && stderr.contains("--key") && stderr.contains("missing.cred"), "{stderr}");

    // A peer that skips the handshake and sends a plain frame gets nothing and is closed.
    for addr in [meta.clone(), cluster.servers[0].as_ref().unwrap().addr.clone()] {
        let mut stream = TcpStream::connect(&addr).unwrap();
        let body = encode_body(&MetaRequest::Status).unwrap();
        let header = flotilla_proto::FrameHeader::for_payload(1, &body, &[]).unwrap();
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(&body);
        // The service may already have closed after the first bytes: a failed write is fine.
        let _ = stream.write_all(&bytes);
        let (received, closed) = read_until_closed(&mut stream);
        assert!(closed, "{addr}: connection without a handshake left open");
        assert!(decode_frame(&received, 1 << 20).is_err(), "{addr}: answered without a handshake");
    }
    common::assert_still_serving(&cluster);
}

#[test]
fn a_credential_from_another_cluster_is_refused() {
    let cluster = Cluster::start(1);
    let other = cluster.dir.path().join("other-keys");
    let (ok, _, stderr) = cli(&["keygen", "--out", path(&other)]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) =
        cli(&["--key", path(&other.join("client.cred")), "status", "--meta", &cluster.meta_addr()]);
    assert!(!ok && stderr.contains("cluster's CA"), "{stderr}");
    let server = cluster.servers[0].as_ref().unwrap().addr.clone();
    let refused = common::raw_connect(&server, &other.join("client.cred")).err();
    assert!(refused.is_some(), "an I/O server accepted a foreign credential");
    // A server of the other cluster cannot join this one.
    let target = cluster.dir.path().join("foreign-target");
    std::fs::create_dir_all(&target).unwrap();
    let foreign = common::Process::start(
        &[
            "--key",
            path(&other.join("server.cred")),
            "server",
            "--meta",
            &cluster.meta_addr(),
            "--target",
            path(&target),
            "--listen",
            "127.0.0.1:0",
        ],
        "server",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let status = cluster.client().status().unwrap();
    assert!(status.iter().all(|t| t.server != foreign.addr), "foreign server registered: {status:?}");
    foreign.kill();
    common::assert_still_serving(&cluster);
}

/// Registers `target` (with 1 PiB free, at a made-up address) as the holder of `key`.
fn register_as(meta: &str, key: &std::path::Path, target: flotilla_types::TargetId) -> MetaReply {
    let report = TargetReport { target, used_bytes: 0, free_bytes: 1 << 50, lost: false };
    runtime().block_on(async {
        let connection = Connection::connect(meta, common::connection_config_with(key)).await.unwrap();
        let request = MetaRequest::Register { server: "127.0.0.1:9".into(), targets: vec![report] };
        connection.call::<MetaRequest, MetaReply>(&request, Bytes::new()).await.unwrap().0
    })
}

fn expect_denied(reply: MetaReply, needle: &str) {
    match reply {
        MetaReply::Error(error) => {
            assert_eq!(error.code, ErrorCode::PermissionDenied, "{error:?}");
            assert!(error.message.contains(needle), "{:?} should mention {needle:?}", error.message);
        }
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn membership_needs_the_server_credential_that_owns_the_target() {
    let cluster = Cluster::start(1);
    let (ok, status, stderr) = cli(&["status", "--meta", &cluster.meta_addr()]);
    assert!(ok && status.contains("credential=server"), "{status}{stderr}");
    let existing = cluster.client().status().unwrap()[0].target;
    let meta = cluster.meta_addr();
    // A client credential may not register any target.
    expect_denied(
        register_as(&meta, &common::client_key(), flotilla_types::TargetId(77)),
        "only a server credential",
    );
    // Another server credential of the same cluster may not take over a bound target.
    let intruder = issue(cluster.dir.path(), "intruder", &["--role", "server"]);
    expect_denied(register_as(&meta, &intruder, existing), "bound to server credential \"server\"");
    let status = cluster.client().status().unwrap();
    assert!(status.iter().all(|t| t.server != "127.0.0.1:9"), "{status:?}");
    common::assert_still_serving(&cluster);
}

#[test]
fn a_target_binding_survives_a_killed_metadata_service() {
    let mut cluster = Cluster::start(1);
    let existing = cluster.client().status().unwrap()[0].target;
    let listen = cluster.meta_addr();
    // The server and the metadata service die; the new metadata service has heard from
    // nobody when the intruder claims the target, so only the stored binding can refuse it.
    cluster.servers[0].take().expect("server running").kill();
    cluster.meta.take().expect("meta running").kill();
    cluster.start_meta(&listen);
    let intruder = issue(cluster.dir.path(), "intruder", &["--role", "server"]);
    expect_denied(register_as(&listen, &intruder, existing), "bound to server credential \"server\"");
    // The owner's own server registers again and serves.
    cluster.servers[0] = Some(cluster.start_server(0));
    cluster.wait_up(1);
    let status = cluster.client().status().unwrap();
    let target = status.iter().find(|t| t.target == existing).expect("the server's target");
    assert_eq!(target.credential, "server", "{status:?}");
    assert_ne!(target.server, "127.0.0.1:9", "{status:?}");
    common::assert_still_serving(&cluster);
}

/// Forwards one connection to `target`, recording what the client sent.
fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let sink = recorded.clone();
    std::thread::spawn(move || {
        let Ok((mut client, _)) = listener.accept() else { return };
        let Ok(mut server) = TcpStream::connect(&target) else { return };
        let (mut client_reader, mut server_writer) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = client_reader.read(&mut chunk) {
                if n == 0 || server_writer.write_all(&chunk[..n]).is_err() {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
            let _ = server_writer.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut server, &mut client);
    });
    (addr, recorded)
}

#[test]
fn a_replayed_handshake_is_refused() {
    let cluster = Cluster::start(1);
    let (proxy, recorded) = recording_proxy(cluster.meta_addr());
    let (ok, status, stderr) = cli(&["status", "--meta", &proxy]);
    assert!(ok && status.contains("state=up"), "through the proxy: {stderr}");
    let bytes = recorded.lock().unwrap().clone();
    assert!(bytes.len() > 64, "recorded only {} bytes", bytes.len());
    let mut replay = TcpStream::connect(cluster.meta_addr()).unwrap();
    let _ = replay.write_all(&bytes);
    let (received, closed) = read_until_closed(&mut replay);
    assert!(closed, "the replayed connection was left open");
    // What came back is the service's own (fresh) handshake message, never a frame.
    let frame_found = (0..received.len()).any(|at| decode_frame(&received[at..], 1 << 20).is_ok());
    assert!(!frame_found, "the service answered a replayed handshake with a frame");
    common::assert_still_serving(&cluster);
}

#[test]
fn a_frame_with_an_altered_tag_closes_only_its_connection() {
    let cluster = Cluster::start(1);
    let server = cluster.servers[0].as_ref().unwrap().addr.clone();
    let mut connection = common::raw_connect(&server, &common::client_key()).unwrap();
    let body = encode_body(&IoRequest::Hello { client: "tamper".into() }).unwrap();
    let mut bytes = connection.frame(3, &body, &[]);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    connection.stream.write_all(&bytes).unwrap();
    let (received, closed) = read_until_closed(&mut connection.stream);
    assert!(closed, "the connection stayed open after a bad tag");
    let (frame, _) = decode_frame(&received, 1 << 20).expect("an error reply before closing");
    match flotilla_proto::decode_body::<IoReply>(&frame.body, "reply").unwrap() {
        IoReply::Error(error) => assert!(error.message.contains("integrity tag"), "{error:?}"),
        other => panic!("expected an integrity error, got {other:?}"),
    }
    // The same request with its tag intact is answered.
    let mut fresh = common::raw_connect(&server, &common::client_key()).unwrap();
    let bytes = fresh.frame(4, &body, &[]);
    fresh.stream.write_all(&bytes).unwrap();
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    while decode_frame(&received, 1 << 20).is_err() {
        let n = fresh.stream.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before answering a correct frame");
        received.extend_from_slice(&chunk[..n]);
    }
    let (frame, _) = decode_frame(&received, 1 << 20).unwrap();
    let reply = flotilla_proto::decode_body::<IoReply>(&frame.body, "reply").unwrap();
    assert!(matches!(reply, IoReply::Welcome { .. }), "{reply:?}");
    common::assert_still_serving(&cluster);
}

#[test]
fn a_read_only_credential_reads_but_cannot_write() {
    let cluster = Cluster::start(1);
    let meta = cluster.meta_addr();
    let file = cluster.client().create("/shared", &CreateOptions::default()).unwrap();
    let fork = file.fork(0, "data").unwrap();
    fork.write(&Shape::contiguous(0, 5), b"hello").unwrap();
    let fork_ref = fork.fork_ref().clone();
    let reader = issue(cluster.dir.path(), "reader", &["--role", "client", "--read-only"]);
    let (ok, listing, stderr) = cli(&["--key", path(&reader), "ls", "/", "--meta", &meta]);
    assert!(ok && listing.contains("shared"), "{stderr}");
    let (ok, _, stderr) = cli(&["--key", path(&reader), "mkdir", "/new", "--meta", &meta]);
    assert!(!ok && stderr.contains("read-only"), "{stderr}");
    let (ok, _, stderr) = cli(&["--key", path(&reader), "rm", "/shared", "--meta", &meta]);
    assert!(!ok && stderr.contains("read-only"), "{stderr}");
    // Opening a file to read it is not a change: a read-only credential may.
    let copy = cluster.dir.path().join("copy");
    let (ok, _, stderr) = cli(&["--key", path(&reader), "get", "/shared", path(&copy), "--meta", &meta]);
    assert!(ok, "a read-only credential opens and reads: {stderr}");

    // At the I/O server: the capability the metadata service gives a read-only credential
    // reads and does not write; a write without one is refused too.
    let server = file.entry().subfiles[0].server.clone();
    let (read, write, bare) = runtime().block_on(async {
        let capability = capability_as(&meta, &reader, "/shared").await;
        assert_eq!(capability.rights, Rights::READ, "a read-only credential is granted reading only");
        let connection = Connection::connect(&server, common::connection_config_with(&reader)).await.unwrap();
        let read = IoRequest::Read { fork: fork_ref.clone(), shape: Shape::contiguous(0, 5) };
        let read = call_with(&connection, &capability, read, Bytes::new()).await;
        let write = IoRequest::Write { fork: fork_ref.clone(), shape: Shape::contiguous(0, 5) };
        let bare = connection.call::<IoRequest, IoReply>(&write, Bytes::from_static(b"HACKD")).await.unwrap();
        let write = call_with(&connection, &capability, write, Bytes::from_static(b"HACKD")).await;
        (read, write.0, bare.0)
    });
    assert_eq!(&read.1[..], b"hello", "{:?}", read.0);
    expect_refusal(write, ErrorCode::PermissionDenied, "needs write");
    expect_refusal(bare, ErrorCode::PermissionDenied, "needs a capability");
    let mut back = [0u8; 5];
    fork.read(&Shape::contiguous(0, 5), &mut back).unwrap();
    assert_eq!(&back, b"hello");
    common::assert_still_serving(&cluster);
}

#[test]
fn a_silent_peer_is_dropped_after_the_handshake_timeout() {
    let cluster = Cluster::start_with(1, "handshake_timeout_ms = 300");
    let mut silent = TcpStream::connect(cluster.meta_addr()).unwrap();
    let (received, closed) = read_until_closed(&mut silent);
    assert!(closed && received.is_empty(), "a silent peer was kept ({} bytes sent)", received.len());
    common::assert_still_serving(&cluster);
}

/// A credential's limits are the metadata service's policy for its connections: a
/// subtree-confined credential reaches nothing outside its subtree, and a root-squashed one
/// acts as nobody (root's files in root's directories are out of its reach), while a plain
/// client credential still may.
#[test]
fn subtree_and_root_squash_credentials_are_enforced_by_the_metadata_service() {
    let cluster = Cluster::start(1);
    let meta = cluster.meta_addr();
    let admin = cluster.client();
    admin.mkdir("/project", 0o777).unwrap();
    admin.mkdir("/private", 0o755).unwrap();
    admin.create("/private/results", &CreateOptions::default()).unwrap();

    let confined = issue(cluster.dir.path(), "confined", &["--role", "client", "--subtree", "/project"]);
    let (ok, _, stderr) = cli(&["--key", path(&confined), "mkdir", "/project/run1", "--meta", &meta]);
    assert!(ok, "inside its subtree: {stderr}");
    let (ok, _, stderr) = cli(&["--key", path(&confined), "ls", "/private", "--meta", &meta]);
    assert!(!ok && stderr.contains("outside"), "outside its subtree: {stderr}");
    // A program's create (one `CreateOpen`) is confined by its path too.
    let mut config = flotilla_client::ClientConfig::new(meta.clone());
    config.key = Some(confined.clone());
    let confined_client = flotilla_client::Client::with_config(config).expect("client");
    let refused = confined_client.create("/private/planted", &CreateOptions::default()).unwrap_err();
    assert_eq!(refused.code(), Some(flotilla_client::ErrorCode::PermissionDenied), "{refused}");
    assert!(admin.stat("/private/planted").is_err(), "nothing was created outside the subtree");
    let inside = confined_client.create("/project/made", &CreateOptions::default()).expect("inside");
    assert_eq!(inside.id(), admin.stat("/project/made").unwrap().id);

    let squashed = issue(cluster.dir.path(), "squashed", &["--role", "client", "--root-squash"]);
    let (ok, _, stderr) = cli(&["--key", path(&squashed), "rm", "/private/results", "--meta", &meta]);
    assert!(!ok && stderr.to_lowercase().contains("permission"), "root squashed to nobody: {stderr}");
    assert!(admin.stat("/private/results").is_ok(), "the file is still there");
    let (ok, _, stderr) = cli(&["--key", path(&squashed), "mkdir", "/project/by-nobody", "--meta", &meta]);
    assert!(ok, "nobody may write a 0777 directory: {stderr}");
    assert_eq!(admin.stat("/project/by-nobody").unwrap().attrs.uid, flotilla_types::NOBODY_ID);

    // A squashed root may not give root's file away (chown is the owner's, and it is nobody).
    let mut config = flotilla_client::ClientConfig::new(meta.clone());
    config.key = Some(squashed.clone());
    let squashed_root = flotilla_client::Client::with_config(config).expect("client");
    let id = admin.stat("/private/results").unwrap().id;
    let chown = flotilla_client::SetAttr { uid: Some(1234), ..flotilla_client::SetAttr::default() };
    let refused = squashed_root.set_attr(id, chown).unwrap_err();
    assert_eq!(refused.code(), Some(flotilla_client::ErrorCode::PermissionDenied), "{refused}");
    assert_eq!(admin.stat("/private/results").unwrap().attrs.uid, 0, "still root's");
    common::assert_still_serving(&cluster);
}

#[test]
fn io_servers_refuse_requests_their_capability_does_not_cover() {
    let cluster = Cluster::start_with(1, "capability_lifetime_ms = 1500\n");
    let meta = cluster.meta_addr();
    let client = cluster.client();
    let options = CreateOptions::default();
    let (a, b) = (client.create("/a", &options).unwrap(), client.create("/b", &options).unwrap());
    a.fork(0, "data").unwrap().write(&Shape::contiguous(0, 6), b"secret").unwrap();
    b.fork(0, "data").unwrap().write(&Shape::contiguous(0, 2), b"bb").unwrap();
    let fork_a = a.fork(0, "data").unwrap().fork_ref().clone();
    let fork_b = b.fork(0, "data").unwrap().fork_ref().clone();
    let server = a.entry().subfiles[0].server.clone();
    let other = issue(cluster.dir.path(), "other", &["--role", "client"]);
    let replies = runtime().block_on(async {
        let own = capability_as(&meta, &common::client_key(), "/b").await;
        let others = capability_as(&meta, &other, "/a").await;
        let connection = Connection::connect(&server, common::connection_config()).await.unwrap();
        let read_a = || IoRequest::Read { fork: fork_a.clone(), shape: Shape::contiguous(0, 6) };
        let mut forged = own.clone();
        forged.file = fork_a.file;
        let mut extended = own.clone();
        extended.expires_unix_ms += 3_600_000;
        extended.file = fork_a.file;
        let replies = vec![
            ("B's capability on A", call_with(&connection, &own, read_a(), Bytes::new()).await.0),
            ("B's capability renamed to A", call_with(&connection, &forged, read_a(), Bytes::new()).await.0),
            (
                "another credential's capability",
                call_with(&connection, &others, read_a(), Bytes::new()).await.0,
            ),
            ("an extended capability", call_with(&connection, &extended, read_a(), Bytes::new()).await.0),
        ];
        let good = IoRequest::Read { fork: fork_b.clone(), shape: Shape::contiguous(0, 2) };
        let (reply, data) = call_with(&connection, &own, good, Bytes::new()).await;
        assert!(matches!(reply, IoReply::Data) && &data[..] == b"bb", "B's capability reads B: {reply:?}");
        tokio::time::sleep(Duration::from_millis(1700)).await;
        let late = IoRequest::Read { fork: fork_b.clone(), shape: Shape::contiguous(0, 2) };
        (replies, call_with(&connection, &own, late, Bytes::new()).await.0)
    });
    let (refused, expired) = replies;
    let needles = ["not file", "forged", "not to this connection's credential", "forged"];
    for ((what, reply), needle) in refused.into_iter().zip(needles) {
        match reply {
            IoReply::Error(error) => {
                assert_eq!(error.code, ErrorCode::PermissionDenied, "{what}: {error:?}");
                assert!(
                    error.message.contains(needle),
                    "{what}: {:?} should mention {needle:?}",
                    error.message
                );
            }
            other => panic!("{what} was accepted: {other:?}"),
        }
    }
    expect_refusal(expired, ErrorCode::CapabilityExpired, "expired");
    // The library renews before and after expiry without the program noticing: a handle
    // kept open across several lifetimes still writes, syncs and reads.
    let fork = a.fork(0, "data").unwrap();
    for round in 0..3u8 {
        std::thread::sleep(Duration::from_millis(900));
        fork.write(&Shape::contiguous(0, 6), &[b'a' + round; 6]).unwrap();
    }
    a.sync().unwrap();
    let mut back = [0u8; 6];
    fork.read(&Shape::contiguous(0, 6), &mut back).unwrap();
    assert_eq!(&back, b"cccccc");
    common::assert_still_serving(&cluster);
}

/// What a relay saw: bytes from its clients and bytes to them.
#[derive(Default)]
struct Recorded {
    sent: Vec<u8>,
    received: Vec<u8>,
}

/// Copies `from` to `to`, appending what passed to `record`'s chosen half.
fn relay_half(mut from: TcpStream, mut to: TcpStream, record: Arc<Mutex<Recorded>>, sent: bool) {
    let mut chunk = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut chunk) {
        if n == 0 || to.write_all(&chunk[..n]).is_err() {
            break;
        }
        let mut record = record.lock().unwrap();
        let half = if sent { &mut record.sent } else { &mut record.received };
        half.extend_from_slice(&chunk[..n]);
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Forwards every connection it accepts to `target`, recording both directions. Stops
/// accepting when the test process ends.
fn recording_relay(target: String) -> (String, Arc<Mutex<Recorded>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let recorded = Arc::new(Mutex::new(Recorded::default()));
    let record = recorded.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&target) else { return };
            let (client_reader, server_writer) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let up = record.clone();
            std::thread::spawn(move || relay_half(client_reader, server_writer, up, true));
            let down = record.clone();
            std::thread::spawn(move || relay_half(server, client, down, false));
        }
    });
    (addr, recorded)
}

/// A distinctive 64 KiB pattern, and a file of several copies of it.
fn pattern_file(dir: &std::path::Path) -> (Vec<u8>, PathBuf) {
    let pattern = common::random_bytes(0x5eed_c0de, 64 * 1024);
    let local = dir.join("pattern.bin");
    std::fs::write(&local, pattern.repeat(8)).unwrap();
    (pattern, local)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A one-server cluster configured with `integrity` on [meta] and [server], whose I/O
/// server clients reach through a recording relay; puts and gets a file of a distinctive
/// pattern with the default client (which asks for mac) and returns what crossed the relay.
fn put_and_get_through_a_relay(integrity: &str) -> (Vec<u8>, Recorded) {
    let setting = format!("integrity = {integrity:?}");
    let mut cluster = Cluster::start_configured(0, &setting, &setting);
    let listen = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (relay, recorded) = recording_relay(listen.clone());
    let (meta, target) = (cluster.meta_addr(), cluster.target_dir(0));
    std::fs::create_dir_all(&target).unwrap();
    cluster.servers.push(Some(cluster.start_server_advertising(&target, &listen, Some(&relay))));
    cluster.wait_up(1);
    let (pattern, local) = pattern_file(cluster.dir.path());
    let (ok, _, stderr) = cli(&["put", path(&local), "/pattern", "--meta", &meta]);
    assert!(ok, "put with integrity = {integrity}: {stderr}");
    let copy = cluster.dir.path().join("copy.bin");
    let (ok, _, stderr) = cli(&["get", "/pattern", path(&copy), "--meta", &meta]);
    assert!(ok, "get with integrity = {integrity}: {stderr}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&local).unwrap(), "the copy differs");
    let recorded = std::mem::take(&mut *recorded.lock().unwrap());
    (pattern, recorded)
}

#[test]
fn an_encrypted_cluster_moves_files_byte_exact_and_no_plaintext_crosses_the_wire() {
    let (pattern, recorded) = put_and_get_through_a_relay("encrypt");
    let total = pattern.len() * 8;
    assert!(recorded.sent.len() > total && recorded.received.len() > total, "the data went around the relay");
    assert!(!contains(&recorded.sent, &pattern), "the pattern crossed the wire in clear (put)");
    assert!(!contains(&recorded.received, &pattern), "the pattern crossed the wire in clear (get)");
    // The same run with mac: the pattern is visible, so the check above can fail.
    let (pattern, recorded) = put_and_get_through_a_relay("mac");
    assert!(contains(&recorded.sent, &pattern), "with mac, the put's data is on the wire");
    assert!(contains(&recorded.received, &pattern), "with mac, the get's data is on the wire");
}

#[test]
fn local_integrity_encrypt_encrypts_every_service_and_raises_clients_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "local",
        "--servers",
        "2",
        "--data",
        path(&data),
        "--listen",
        "127.0.0.1:0",
        "--integrity",
        "encrypt",
    ];
    let local = common::Process::start(&args, "meta").unwrap();
    let key = local.credential.clone().expect("key= line");
    let meta = local.addr.clone();
    let (ok, status, stderr) = cli(&["--key", path(&key), "status", "--meta", &meta]);
    assert!(ok, "{stderr}");
    let servers: Vec<&str> =
        status.lines().filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("server="))).collect();
    assert_eq!(servers.len(), 2, "{status}");
    // A client that asks for mac (the default) gets encrypt from every service.
    for addr in servers.iter().copied().chain([meta.as_str()]) {
        let connection = common::raw_connect(addr, &key).unwrap();
        assert_eq!(connection.sealer.integrity(), flotilla_auth::Integrity::Encrypt, "{addr}");
    }
    let (_, local_file) = pattern_file(dir.path());
    let copy = dir.path().join("copy.bin");
    let (ok, _, stderr) = cli(&["--key", path(&key), "put", path(&local_file), "/p", "--meta", &meta]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = cli(&["--key", path(&key), "get", "/p", path(&copy), "--meta", &meta]);
    assert!(ok, "{stderr}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&local_file).unwrap(), "the copy differs");
    let (ok, _, stderr) = cli(&["local", "--integrity", "secret", "--data", path(&data)]);
    assert!(!ok && stderr.contains("expected none, mac or encrypt"), "{stderr}");
    local.stop();
}
