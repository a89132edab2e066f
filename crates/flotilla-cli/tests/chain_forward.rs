//! Replication's data path on a member (issue 32) with real processes: a chain forward
//! (`IoRequest::Forward`) sent with a server credential is fenced by the receiving server
//! against the chain view its heartbeats brought (member, exact version, lease), ordered
//! (next applied, duplicate re-acknowledged, gap named) and applied to its target; a
//! client credential, a chain it is not in, a wrong version, and — once another member is
//! SIGKILLed and the chain's version grows — the old version are refused by name.

mod common;

use bytes::Bytes;
use common::{cli, client_key, hex_target, server_key, status_field, Cluster};
use flotilla_proto::{
    ChainForward, ErrorCode, ForkRef, ForwardEntry, ForwardRefusalReason, ForwardRefused, IoReply, IoRequest,
};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms), with room for a loaded machine's
/// scheduling before anyone is fenced by accident; `fence_after_ms > lease_ms +
/// clock_margin_ms` holds. Two replicas, two chains per target: three chains of two over
/// three targets, extended by two chains when the third registers after the table was built.
const MEMBERSHIP: &str =
    "lease_ms = 1000\nclock_margin_ms = 500\nfence_after_ms = 2500\nchains_per_target = 2\nchain_replicas = 2\n";
/// Bound on waiting for a change the service makes within about `fence_after_ms`.
const SETTLE: Duration = Duration::from_secs(15);
const GROUPS: [&str; 3] = ["rack-a", "rack-b", "rack-c"];

fn status(cluster: &Cluster) -> String {
    let (ok, stdout, stderr) = cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
    assert!(ok, "status failed: {stderr}");
    stdout
}

/// The target of the server in `group`.
fn target_of(status: &str, group: &str) -> Option<TargetId> {
    let line =
        status.lines().find(|l| l.starts_with("target=") && status_field(l, "group") == Some(group))?;
    status_field(line, "target").map(hex_target)
}

/// Every chain: id → (version, members).
fn chains(status: &str) -> BTreeMap<u32, (u64, Vec<TargetId>)> {
    status
        .lines()
        .filter(|l| l.starts_with("chain="))
        .map(|l| {
            let id = status_field(l, "chain").and_then(|v| v.parse().ok()).expect("chain id");
            let version = status_field(l, "version").and_then(|v| v.parse().ok()).expect("chain version");
            let members = status_field(l, "members").unwrap_or_default();
            let targets = members.split(',').filter_map(|m| m.split(':').next()).map(hex_target).collect();
            (id, (version, targets))
        })
        .collect()
}

fn wait_status(cluster: &Cluster, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + SETTLE;
    loop {
        let status = status(cluster);
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends requests to one server with one credential.
struct Caller {
    runtime: tokio::runtime::Runtime,
    server: String,
    key: std::path::PathBuf,
}

impl Caller {
    fn call(&self, request: &IoRequest, data: &[u8]) -> (IoReply, Vec<u8>) {
        self.runtime.block_on(async {
            let config = common::connection_config_with(&self.key);
            let connection = Connection::connect(&self.server, config).await.expect("connect");
            let (reply, data) = connection
                .call::<IoRequest, IoReply>(request, Bytes::copy_from_slice(data))
                .await
                .expect("a reply");
            (reply, data.to_vec())
        })
    }

    /// A bare read (trusted from a server credential) of what the target holds.
    fn read(&self, fork: &ForkRef, offset: u64, length: usize) -> Vec<u8> {
        let request = IoRequest::Read { fork: fork.clone(), shape: Shape::contiguous(offset, length as u64) };
        match self.call(&request, &[]) {
            (IoReply::Data, data) => data,
            (other, _) => panic!("read back: {other:?}"),
        }
    }

    fn forward(&self, forward: ChainForward, data: &[u8]) -> IoReply {
        self.call(&IoRequest::Forward { forward }, data).0
    }
}

fn write(
    chain: u32,
    version: u64,
    position: u64,
    fork: &ForkRef,
    offset: u64,
    length: usize,
) -> ChainForward {
    let entry = ForwardEntry::Write { fork: fork.clone(), offset, length_bytes: length as u64 };
    ChainForward { chain, version, position, entry }
}

fn refusal(reply: IoReply) -> ForwardRefused {
    match reply {
        IoReply::ForwardRefused(refused) => refused,
        other => panic!("expected a forward refusal, got {other:?}"),
    }
}

fn applied(reply: IoReply) -> u64 {
    match reply {
        IoReply::Forwarded(ack) => ack.applied,
        other => panic!("expected the forward applied, got {other:?}"),
    }
}

#[test]
fn forwards_are_fenced_by_member_version_and_credential_and_applied_in_order() {
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    for (index, group) in GROUPS.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    // Every target in the table (the table is built once two groups are up and extended by
    // the third's chains).
    let in_table = |s: &str| {
        let table = chains(s);
        GROUPS.iter().all(|g| target_of(s, g).is_some_and(|t| table.values().any(|(_, m)| m.contains(&t))))
    };
    let built = wait_status(&cluster, "every target in the chain table", in_table);
    let table = chains(&built);
    // The server under test: one whose target is out of some chain (there always is one).
    let (me_index, me) = GROUPS
        .iter()
        .enumerate()
        .map(|(i, g)| (i, target_of(&built, g).expect("a target per group")))
        .find(|(_, t)| table.values().any(|(_, m)| !m.contains(t)))
        .expect("a target out of some chain");
    let (&chain, (version, members)) =
        table.iter().find(|(_, (_, members))| members.contains(&me)).expect("a chain of the server");
    let (&other_chain, _) =
        table.iter().find(|(_, (_, members))| !members.contains(&me)).expect("a chain without the server");
    let (version, partner) = (*version, *members.iter().find(|&&t| t != me).expect("a second member"));
    let server = Caller {
        runtime: tokio::runtime::Runtime::new().unwrap(),
        server: cluster.servers[me_index].as_ref().unwrap().addr.clone(),
        key: server_key(),
    };
    let fork = ForkRef { target: me, file: FileId(0xc4a1), subfile: SubfileIndex(0), fork: "data".into() };
    let first = common::random_bytes(32, 4096);

    // The server holds the chain view once a heartbeat reply brought it: until then the
    // forward is refused (no lease yet, or not a member as far as it knows).
    let deadline = Instant::now() + SETTLE;
    loop {
        match server.forward(write(chain, version, 1, &fork, 0, first.len()), &first) {
            IoReply::Forwarded(ack) => {
                assert_eq!((ack.chain, ack.version, ack.applied), (chain, version, 1));
                break;
            }
            other => assert!(Instant::now() < deadline, "the first forward was never applied: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.read(&fork, 0, first.len()), first, "the forwarded bytes are on the target");

    // In order: the next position is applied, a duplicate re-acknowledged (not applied
    // again), a gap refused naming the position expected.
    let second = common::random_bytes(33, 1000);
    assert_eq!(applied(server.forward(write(chain, version, 2, &fork, 4096, second.len()), &second)), 2);
    let stale_bytes = vec![0u8; second.len()];
    let duplicate = server.forward(write(chain, version, 2, &fork, 4096, stale_bytes.len()), &stale_bytes);
    assert_eq!(applied(duplicate), 2);
    assert_eq!(server.read(&fork, 4096, second.len()), second, "a duplicate changes nothing");
    let gap = refusal(server.forward(write(chain, version, 5, &fork, 0, 4), b"late"));
    assert_eq!(gap.reason, ForwardRefusalReason::Gap { expected: 3 });

    // Another version, older or newer, is refused naming the server's.
    for wrong in [version - 1, version + 1] {
        let refused = refusal(server.forward(write(chain, wrong, 3, &fork, 0, 4), b"nope"));
        assert_eq!((refused.chain, refused.version), (chain, wrong));
        assert_eq!(refused.reason, ForwardRefusalReason::Stale { current: version });
        assert!(refused.to_string().contains(&format!("chain {chain} v{wrong}")), "{refused}");
    }
    // A chain the server is not in.
    let other_version = table[&other_chain].0;
    let refused = refusal(server.forward(write(other_chain, other_version, 1, &fork, 0, 4), b"nope"));
    assert_eq!(refused.reason, ForwardRefusalReason::NotMember, "{refused}");
    // A client credential, whatever it forwards.
    let client = Caller { key: client_key(), ..server };
    match client.forward(write(chain, version, 3, &fork, 0, 4), b"nope") {
        IoReply::Error(error) => {
            assert_eq!(error.code, ErrorCode::PermissionDenied);
            assert!(error.message.contains("only from a server credential"), "{}", error.message);
        }
        other => panic!("a client's forward must be refused: {other:?}"),
    }
    // A server credential of this cluster that reported none of the chain's members.
    let intruder = Caller { key: issue_server_credential(&cluster, "intruder"), ..client };
    match intruder.forward(write(chain, version, 3, &fork, 0, 4), b"evil") {
        IoReply::Error(error) => {
            assert_eq!(error.code, ErrorCode::PermissionDenied, "{error:?}");
            assert!(error.message.contains(&format!("chain {chain} v{version}")), "{}", error.message);
            assert!(error.message.contains("\"intruder\""), "{}", error.message);
        }
        other => panic!("a non-member's forward must be refused: {other:?}"),
    }
    let server = Caller { key: server_key(), ..intruder };
    assert_eq!(server.read(&fork, 0, 4), first[..4], "nothing refused reached the target");
    assert_eq!(
        applied(server.forward(write(chain, version, 2, &fork, 4096, 4), b"dupl")),
        2,
        "position 3 was never applied"
    );

    // SIGKILL the chain's other member: it is fenced and the chain's version grows; once the
    // server holds the new version, the old one is refused and the new one applies in order.
    let partner_index =
        GROUPS.iter().position(|g| target_of(&built, g) == Some(partner)).expect("the partner's group");
    cluster.servers[partner_index].take().expect("partner").kill();
    let fenced = wait_status(&cluster, "the chain's new version", |s| {
        chains(s).get(&chain).is_some_and(|(v, _)| *v > version)
    });
    let new_version = chains(&fenced)[&chain].0;
    let deadline = Instant::now() + SETTLE;
    let refused = loop {
        let reply = server.forward(write(chain, version, 3, &fork, 8192, 4), b"old!");
        match reply {
            IoReply::ForwardRefused(refused) => break refused,
            IoReply::Forwarded(ack) => {
                // Still the old view: applied as position 3, so the next try is a duplicate.
                assert!(Instant::now() < deadline, "the old version was never refused: {ack:?}");
            }
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((refused.chain, refused.version), (chain, version));
    assert_eq!(refused.reason, ForwardRefusalReason::Stale { current: new_version }, "{refused}");
    println!("chain {chain}: {version} -> {new_version}; the old version refused: {refused}");
    let next = read_applied_position(&server, chain, new_version, &fork);
    let third = common::random_bytes(34, 512);
    assert_eq!(
        applied(server.forward(write(chain, new_version, next + 1, &fork, 16384, third.len()), &third)),
        next + 1
    );
    assert_eq!(server.read(&fork, 16384, third.len()), third);
}

/// A server credential named `name` from the test CA (`flotilla keygen issue --role server`).
fn issue_server_credential(cluster: &Cluster, name: &str) -> std::path::PathBuf {
    let out = cluster.dir.path().join(format!("{name}.cred"));
    let ca = common::test_keys().join("cluster.key");
    let args = [
        "keygen",
        "issue",
        "--ca",
        common::path(&ca),
        "--name",
        name,
        "--out",
        common::path(&out),
        "--role",
        "server",
    ];
    let (ok, _, stderr) = cli(&args);
    assert!(ok, "keygen issue: {stderr}");
    out
}

/// The last position the server applied in `chain` (a duplicate of position 1 answers it).
fn read_applied_position(server: &Caller, chain: u32, version: u64, fork: &ForkRef) -> u64 {
    applied(server.forward(write(chain, version, 1, fork, 0, 0), &[]))
}
