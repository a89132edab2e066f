//! The pipelined chain head (issue 32) with real processes: one chain of two members in two
//! failure groups, several clients each with many chained writes in flight at once, all
//! over the same overlapping ranges of one fork. The head orders them and sends up to
//! `chain_window_max` down the chain concurrently; the tail may receive them out of order
//! and must still apply them in the head's order. Afterwards every member's own target,
//! read directly (not through the chain), holds the same bytes: the same writes in the same
//! order on both. A last write, sent alone, is the last word on its range on both members.

mod common;

use bytes::Bytes;
use common::{cli, hex_target, server_key, status_field, Cluster};
use flotilla_proto::{ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short membership timings; two replicas, one chain per target.
const MEMBERSHIP: &str =
    "lease_ms = 1000\nclock_margin_ms = 500\nfence_after_ms = 2500\nchains_per_target = 1\nchain_replicas = 2\n";
/// A small window so that the head also waits for room in it.
const SERVER: &str = "chain_window_max = 8\n";
const SETTLE: Duration = Duration::from_secs(20);
const GROUPS: [&str; 2] = ["rack-a", "rack-b"];
/// The region every client writes over.
const REGION_BYTES: u64 = 1 << 20;
const CLIENTS: usize = 4;
/// Writes each client keeps in flight on its own connection.
const LANES: usize = 6;
const WRITES_PER_LANE: usize = 24;

/// A chain whose members all serve: (chain, version, members in order).
fn serving_chain(status: &str) -> Option<(u32, u64, Vec<TargetId>)> {
    status.lines().filter(|l| l.starts_with("chain=")).find_map(|l| {
        let members: Vec<(TargetId, &str)> = status_field(l, "members")?
            .split(',')
            .filter(|m| !m.is_empty())
            .map(|m| {
                let (target, state) = m.split_once(':').unwrap_or((m, ""));
                (hex_target(target), state)
            })
            .collect();
        if members.len() != 2 || !members.iter().all(|(_, state)| state.starts_with("serving")) {
            return None;
        }
        let chain = status_field(l, "chain")?.parse().ok()?;
        let version = status_field(l, "version")?.parse().ok()?;
        Some((chain, version, members.into_iter().map(|(t, _)| t).collect()))
    })
}

fn target_of(status: &str, group: &str) -> Option<TargetId> {
    let line =
        status.lines().find(|l| l.starts_with("target=") && status_field(l, "group") == Some(group))?;
    status_field(line, "target").map(hex_target)
}

fn fork(target: TargetId) -> ForkRef {
    ForkRef { target, file: FileId(0x9e11), subfile: SubfileIndex(0), fork: "data".into() }
}

async fn connect(server: &str) -> Connection {
    Connection::connect(server, common::connection_config_with(&server_key())).await.expect("connect")
}

/// The offset and length of write `n` of `client`: spread over the region, overlapping the
/// other clients' writes, never 4 KiB aligned.
fn shape_of(client: usize, n: usize) -> (u64, u64) {
    let seed = (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (n as u64).wrapping_mul(0xbf58_476d);
    let length = 1 + (seed >> 7) % (96 << 10);
    let offset = (seed >> 29) % (REGION_BYTES - length);
    (offset, length)
}

#[test]
fn overlapping_pipelined_writes_from_several_clients_leave_both_replicas_identical() {
    let mut cluster = Cluster::start_configured(0, MEMBERSHIP, SERVER);
    for (index, group) in GROUPS.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    let deadline = Instant::now() + SETTLE;
    let (status, (chain, version, members)) = loop {
        let (ok, status, stderr) = cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
        assert!(ok, "status failed: {stderr}");
        if let Some(found) = serving_chain(&status) {
            break (status, found);
        }
        assert!(Instant::now() < deadline, "no chain of two serving members:\n{status}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let addr_of = |target: TargetId| {
        let index = GROUPS.iter().position(|g| target_of(&status, g) == Some(target)).expect("a group");
        cluster.servers[index].as_ref().expect("running").addr.clone()
    };
    let (head, tail) = (members[0], members[1]);
    let head_addr = addr_of(head);
    println!("chain {chain} v{version}: {head} -> {tail}");
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // The first write goes through once the head holds the chain view.
    let chained = move |request: IoRequest| IoRequest::Chained { chain, version, request: Box::new(request) };
    runtime.block_on(async {
        let connection = connect(&head_addr).await;
        let zeros = Bytes::from(vec![0u8; REGION_BYTES as usize]);
        loop {
            let write = IoRequest::Write { fork: fork(head), shape: Shape::contiguous(0, REGION_BYTES) };
            let (reply, _) =
                connection.call::<IoRequest, IoReply>(&chained(write), zeros.clone()).await.expect("reply");
            match reply {
                IoReply::Done { .. } => break,
                other => assert!(Instant::now() < deadline, "the first chained write failed: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    // Every client on its own connection, LANES writes in flight each, all at once.
    let started = Instant::now();
    runtime.block_on(async {
        let mut lanes = Vec::new();
        for client in 0..CLIENTS {
            let connection = Arc::new(connect(&head_addr).await);
            for lane in 0..LANES {
                let connection = connection.clone();
                lanes.push(tokio::spawn(async move {
                    for step in 0..WRITES_PER_LANE {
                        let n = step * LANES + lane;
                        let (offset, length) = shape_of(client, n);
                        let data = common::random_bytes((client * 100_000 + n) as u64, length as usize);
                        let write =
                            IoRequest::Write { fork: fork(head), shape: Shape::contiguous(offset, length) };
                        let (reply, _) = connection
                            .call::<IoRequest, IoReply>(&chained(write), Bytes::from(data))
                            .await
                            .expect("a reply");
                        assert!(
                            matches!(reply, IoReply::Done { .. }),
                            "client {client} write {n} at {offset}+{length}: {reply:?}"
                        );
                    }
                }));
            }
        }
        for lane in lanes {
            lane.await.expect("a writer");
        }
    });
    let writes = CLIENTS * LANES * WRITES_PER_LANE;
    println!("{writes} overlapping chained writes in {} ms", started.elapsed().as_millis());

    // Each member's own target, read directly: byte-identical.
    let read_member = |target: TargetId| {
        runtime.block_on(async {
            let connection = connect(&addr_of(target)).await;
            let read = IoRequest::Read { fork: fork(target), shape: Shape::contiguous(0, REGION_BYTES) };
            let (reply, data) =
                connection.call::<IoRequest, IoReply>(&read, Bytes::new()).await.expect("a reply");
            assert!(matches!(reply, IoReply::Data), "read of {target}: {reply:?}");
            data.to_vec()
        })
    };
    let (at_head, at_tail) = (read_member(head), read_member(tail));
    assert_eq!(at_head.len() as u64, REGION_BYTES);
    let differ = at_head.iter().zip(&at_tail).position(|(a, b)| a != b);
    assert_eq!(at_head.len(), at_tail.len(), "both replicas hold the region");
    assert!(differ.is_none(), "the replicas differ first at byte {differ:?}");
    // The writes landed (the region is not still the zeros written first).
    assert!(at_head.iter().any(|&b| b != 0), "the clients' writes are in the replicas");

    // A write sent alone afterwards is the last word on its range, on both members.
    let last = common::random_bytes(999, 5000);
    runtime.block_on(async {
        let connection = connect(&head_addr).await;
        let write =
            IoRequest::Write { fork: fork(head), shape: Shape::contiguous(12_345, last.len() as u64) };
        let (reply, _) = connection
            .call::<IoRequest, IoReply>(&chained(write), Bytes::from(last.clone()))
            .await
            .expect("a reply");
        assert!(matches!(reply, IoReply::Done { .. }), "{reply:?}");
    });
    for target in [head, tail] {
        let data = read_member(target);
        assert_eq!(&data[12_345..12_345 + last.len()], &last[..], "member {target} holds the last write");
    }
}
