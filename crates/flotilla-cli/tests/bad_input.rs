//! Bad input gets a clear error naming what was wrong, the server keeps serving everyone
//! else, and acknowledged data is not lost.

mod common;

use bytes::Bytes;
use common::{cli, path, random_bytes, Cluster};
use flotilla_client::{CreateOptions, Shape, StrideLevel};
use flotilla_proto::{
    decode_frame, encode_body, ErrorCode, ForkRef, FrameHeader, IoReply, IoRequest, HEADER_BYTES,
};
use flotilla_rpc::Connection;
use std::io::{Read, Write};

/// A connection that has completed its handshake with the test client credential.
fn connect(addr: &str) -> common::RawConnection {
    common::raw_connect(addr, &common::client_key()).unwrap()
}

/// Sends raw bytes on an authenticated connection and returns the first reply frame (if
/// any) and its request id.
fn raw_exchange(mut connection: common::RawConnection, bytes: &[u8]) -> (Option<IoReply>, u64) {
    let stream = &mut connection.stream;
    stream.write_all(bytes).unwrap();
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok((frame, _)) = decode_frame(&received, 1 << 20) {
            let reply = flotilla_proto::decode_body::<IoReply>(&frame.body, "reply").ok();
            return (reply, frame.request_id);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return (None, 0),
            Ok(n) => received.extend_from_slice(&chunk[..n]),
        }
    }
}

fn expect_error(reply: Option<IoReply>, code: ErrorCode, needle: &str) {
    match reply {
        Some(IoReply::Error(error)) => {
            assert_eq!(error.code, code, "{error:?}");
            assert!(error.message.contains(needle), "error {:?} should mention {needle:?}", error.message);
        }
        other => panic!("expected a {code:?} error mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn malformed_frames_get_clear_errors_and_others_are_unaffected() {
    let cluster = Cluster::start(1);
    let server = cluster.servers[0].as_ref().unwrap().addr.clone();

    // Garbage: not a frame at all.
    let (reply, _) = raw_exchange(connect(&server), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n..........");
    expect_error(reply, ErrorCode::Protocol, "magic");

    // A frame from a future protocol version.
    let mut header = FrameHeader::for_payload(5, b"", b"").unwrap();
    header.version = 9;
    let (reply, _) = raw_exchange(connect(&server), &header.encode());
    expect_error(reply, ErrorCode::Protocol, "version 9");

    // A frame claiming to be larger than the limit: refused before anything is allocated.
    let huge = FrameHeader { body_bytes: u32::MAX, ..FrameHeader::for_payload(6, b"", b"").unwrap() };
    let (reply, _) = raw_exchange(connect(&server), &huge.encode());
    expect_error(reply, ErrorCode::Protocol, "frame_bytes_max");

    // A corrupted payload: a tagged frame carries no CRC32C, its keyed tag fails, and the
    // error names the request; only this connection closes.
    let mut connection = connect(&server);
    let mut corrupt =
        connection.frame(7, &encode_body(&IoRequest::Hello { client: "x".into() }).unwrap(), b"");
    let last_payload_byte = corrupt.len() - 1 - flotilla_auth::TAG_BYTES;
    corrupt[last_payload_byte] ^= 0xff;
    let (reply, _) = raw_exchange(connection, &corrupt);
    expect_error(reply, ErrorCode::Protocol, "integrity tag mismatch on frame 0 (request 7)");

    // A well-formed frame whose body is not a request.
    let mut connection = connect(&server);
    let bytes = connection.frame(8, &[0xff, 0xff, 0xff, 0x01], b"");
    let (reply, request_id) = raw_exchange(connection, &bytes);
    expect_error(reply, ErrorCode::BadRequest, "decode");
    assert_eq!(request_id, 8);

    // A truncated frame, then the client vanishes.
    {
        let mut connection = connect(&server);
        let full =
            connection.frame(9, &encode_body(&IoRequest::Hello { client: "x".into() }).unwrap(), &[0u8; 100]);
        connection.stream.write_all(&full[..HEADER_BYTES + 3]).unwrap();
    }
    common::assert_still_serving(&cluster);
}

#[test]
fn requests_over_limits_and_bad_shapes_are_refused_by_the_server() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let file = client.create("/limits", &CreateOptions::default()).unwrap();
    let fork = file.fork(0, "data").unwrap().fork_ref().clone();
    let server = cluster.servers[0].as_ref().unwrap().addr.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Requests go with the capability the create handed out, as the library sends them.
    let capability = file.entry().capability.clone().expect("a create hands out a capability");
    let with =
        |request: IoRequest| IoRequest::With { capability: capability.clone(), request: Box::new(request) };
    let call_as = |config: flotilla_rpc::ConnectionConfig, request: IoRequest, data: Bytes| -> IoReply {
        runtime.block_on(async {
            let connection = Connection::connect(&server, config).await.unwrap();
            connection.call::<IoRequest, IoReply>(&request, data).await.unwrap().0
        })
    };
    let call = |request: IoRequest| call_as(common::connection_config(), with(request), Bytes::new());
    // The cluster's own services are trusted without capabilities.
    let server_call = |request: IoRequest| {
        call_as(common::connection_config_with(&common::server_key()), request, Bytes::new())
    };
    let read = |shape: Shape| IoRequest::Read { fork: fork.clone(), shape };

    let many = Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 1,
        file_stride: 1,
        memory_stride: 1,
        count: 1 << 60,
    };
    expect_error(Some(call(read(many))), ErrorCode::OverLimit, "request_bytes_max");
    let pieces = Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 0,
        file_stride: 1,
        memory_stride: 0,
        count: 1 << 40,
    };
    expect_error(Some(call(read(pieces))), ErrorCode::OverLimit, "pieces_per_request_max");
    expect_error(Some(call(read(Shape::contiguous(0, 1 << 30)))), ErrorCode::OverLimit, "request_bytes_max");
    let backwards = Shape::Strided {
        file_offset: 100,
        memory_offset: 0,
        record_bytes: 8,
        file_stride: -64,
        memory_stride: 8,
        count: 3,
    };
    expect_error(Some(call(read(backwards.clone()))), ErrorCode::InvalidArgument, "before offset 0");
    let levels = vec![StrideLevel { file_stride: i64::MAX, memory_stride: 1, count: 4 }; 2];
    let overflow = Shape::Nested { file_offset: 0, memory_offset: 0, record_bytes: 8, levels };
    expect_error(Some(call(read(overflow))), ErrorCode::InvalidArgument, "past the largest offset");
    let unknown_file = ForkRef { file: flotilla_client::FileId(0xdead), ..fork.clone() };
    let unknown_read = IoRequest::Read { fork: unknown_file, shape: Shape::contiguous(0, 1) };
    expect_error(Some(call(unknown_read.clone())), ErrorCode::PermissionDenied, "not file");
    expect_error(Some(server_call(unknown_read)), ErrorCode::NotFound, "dead");
    let unknown_fork = ForkRef { fork: "nope".into(), ..fork.clone() };
    expect_error(
        Some(call(IoRequest::Read { fork: unknown_fork, shape: Shape::contiguous(0, 1) })),
        ErrorCode::NotFound,
        "nope",
    );
    let bad_name = ForkRef { fork: "../escape".into(), ..fork.clone() };
    expect_error(Some(call(IoRequest::CreateFork { fork: bad_name })), ErrorCode::InvalidArgument, "escape");
    let short = IoRequest::Write { fork: fork.clone(), shape: Shape::contiguous(0, 100) };
    let reply = call_as(common::connection_config(), with(short), Bytes::from_static(b"only ten b"));
    expect_error(Some(reply), ErrorCode::BadRequest, "data bytes");

    // The client library refuses a bad shape before sending it.
    let error = file.fork(0, "data").unwrap().read(&backwards, &mut [0u8; 24]).err().unwrap();
    assert!(error.to_string().contains("before offset 0"), "{error}");
    common::assert_still_serving(&cluster);
}

#[test]
fn bad_paths_are_refused() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    for bad in ["/a/../b", "/a//b", "relative", "/./x"] {
        let error = client.mkdir(bad, 0o755).err().unwrap_or_else(|| panic!("{bad} accepted"));
        assert_eq!(error.errno(), 22, "{bad}: {error}");
    }
    let long = format!("/{}", "n".repeat(300));
    let error = client.mkdir(&long, 0o755).err().unwrap();
    assert_eq!(error.errno(), 36, "{error}");
    let error = client.create("/missing-dir/file", &CreateOptions::default()).err().unwrap();
    assert_eq!(error.errno(), 2, "{error}");
    common::assert_still_serving(&cluster);
}

#[test]
fn missing_target_directory_is_named() {
    let cluster = Cluster::start(1);
    let missing = cluster.dir.path().join("no-such-target");
    let server_key = common::server_key();
    let (ok, _, stderr) = cli(&[
        "--key",
        path(&server_key),
        "server",
        "--meta",
        &cluster.meta_addr(),
        "--target",
        path(&missing),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(!ok);
    assert!(stderr.contains("no-such-target"), "{stderr}");
}

#[test]
fn a_server_that_disappears_mid_request_fails_only_its_requests() {
    let mut cluster = Cluster::start(2);
    // The server stays away: waiting half a second for it (not the default minute) is enough.
    let mut config = flotilla_client::ClientConfig::new(cluster.meta_addr());
    config.key = Some(common::client_key());
    config.outage.wait_ms = 500;
    let client = flotilla_client::Client::with_config(config).unwrap();
    let file = client.create("/split", &CreateOptions { subfiles: 2, ..CreateOptions::default() }).unwrap();
    let doomed = file.entry().subfiles[0].server.clone();
    let data = random_bytes(3, 8 << 20);
    for subfile in 0..2 {
        file.fork(subfile, "data").unwrap().write(&Shape::contiguous(0, data.len() as u64), &data).unwrap();
    }
    let fork = file.fork(0, "data").unwrap();
    let shape = Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 16,
        file_stride: 16,
        memory_stride: 16,
        count: 1 << 19,
    };
    let in_flight: Vec<_> = (0..32).map(|_| fork.read_nb(shape.clone(), vec![0u8; 8 << 20])).collect();
    let index = cluster.servers.iter().position(|s| s.as_ref().is_some_and(|p| p.addr == doomed)).unwrap();
    cluster.servers[index].take().unwrap().kill();
    let failures: Vec<_> = in_flight.into_iter().filter_map(|h| h.wait().err()).collect();
    assert!(!failures.is_empty(), "killing the server failed none of 32 requests in flight");
    for error in &failures {
        assert!(error.to_string().contains(&doomed), "error should name the lost server {doomed}: {error}");
    }
    let error = fork.read(&Shape::contiguous(0, 8), &mut [0u8; 8]).err().unwrap();
    assert!(error.to_string().contains(&doomed), "{error}");
    let mut back = vec![0u8; 4096];
    file.fork(1, "data").unwrap().read(&Shape::contiguous(0, 4096), &mut back).unwrap();
    assert_eq!(&back[..], &data[..4096]);
}

/// A small tmpfs, unmounted when dropped.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(dir: std::path::PathBuf, bytes: u64) -> SmallDisk {
        std::fs::create_dir_all(&dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", path(&dir)])
            .status()
            .expect("run mount (the disk-full test needs root)");
        assert!(status.success(), "mounting a tmpfs failed: the disk-full test needs root");
        SmallDisk { dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").args(["-l", path(&self.dir)]).status();
    }
}

#[test]
fn a_full_target_refuses_writes_and_keeps_acknowledged_data() {
    let cluster = Cluster::start(1);
    let disk = SmallDisk::mount(cluster.dir.path().join("small"), 4 << 20);
    let small_server = cluster.start_server_on(&disk.dir);
    cluster.wait_up(2);
    let client = cluster.client();
    let small_target =
        client.status().unwrap().into_iter().find(|t| t.server == small_server.addr).unwrap().target;
    let options = CreateOptions { targets: Some(vec![small_target]), ..CreateOptions::default() };
    let file = client.create("/full", &options).unwrap();
    let fork = file.fork(0, "data").unwrap();
    let kept = random_bytes(9, 1 << 20);
    fork.write(&Shape::contiguous(0, kept.len() as u64), &kept).unwrap();
    fork.sync().unwrap();

    let too_much = random_bytes(10, 8 << 20);
    let error = fork
        .write(&Shape::contiguous(1 << 20, too_much.len() as u64), &too_much)
        .expect_err("write past a full disk");
    assert_eq!(error.errno(), 28, "{error}");
    assert!(error.to_string().contains("full"), "{error}");

    let mut back = vec![0u8; kept.len()];
    fork.read(&Shape::contiguous(0, kept.len() as u64), &mut back).unwrap();
    assert!(back == kept, "acknowledged data was lost on a full target");
    common::assert_still_serving(&cluster);
    small_server.kill();
}
