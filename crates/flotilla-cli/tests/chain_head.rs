//! Replication's data path through the head (issue 32) with real processes: one chain of
//! three members in three failure groups. A chained change (`IoRequest::Chained`) sent to
//! the head is applied by it, forwarded down the chain and answered once every serving
//! member applied it, so every member holds it byte for byte; a change sent to another
//! member is refused naming the head; the middle member SIGKILLed just before a write: the
//! write stalls until the metadata service fences it, then completes, and the head and the
//! tail both hold it; the old version is refused; the killed member, restarted, is syncing
//! and refuses reads.

mod common;

use bytes::Bytes;
use common::{cli, hex_target, server_key, status_field, Cluster};
use flotilla_proto::{ForkRef, ForwardRefusalReason, ForwardRefused, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms), with room for a loaded machine;
/// `fence_after_ms > lease_ms + clock_margin_ms` holds. Three replicas, one chain per
/// target: one chain of all three targets.
const MEMBERSHIP: &str =
    "lease_ms = 1000\nclock_margin_ms = 500\nfence_after_ms = 2500\nchains_per_target = 1\nchain_replicas = 3\n";
/// Bound on waiting for a change the service makes within about `fence_after_ms`.
const SETTLE: Duration = Duration::from_secs(20);
const GROUPS: [&str; 3] = ["rack-a", "rack-b", "rack-c"];

fn status(cluster: &Cluster) -> String {
    let (ok, stdout, stderr) = cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
    assert!(ok, "status failed: {stderr}");
    stdout
}

fn target_of(status: &str, group: &str) -> Option<TargetId> {
    let line =
        status.lines().find(|l| l.starts_with("target=") && status_field(l, "group") == Some(group))?;
    status_field(line, "target").map(hex_target)
}

/// Every chain: id → (version, members as (target, state)).
fn chains(status: &str) -> BTreeMap<u32, (u64, Vec<(TargetId, String)>)> {
    status
        .lines()
        .filter(|l| l.starts_with("chain="))
        .map(|l| {
            let id = status_field(l, "chain").and_then(|v| v.parse().ok()).expect("chain id");
            let version = status_field(l, "version").and_then(|v| v.parse().ok()).expect("chain version");
            let members = status_field(l, "members").unwrap_or_default();
            let targets = members
                .split(',')
                .filter(|m| !m.is_empty())
                .map(|m| {
                    let mut parts = m.splitn(2, ':');
                    let target = hex_target(parts.next().unwrap_or_default());
                    (target, parts.next().unwrap_or_default().to_string())
                })
                .collect();
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

/// Sends requests with the server credential (trusted bare: no capability needed).
struct Caller {
    runtime: tokio::runtime::Runtime,
}

impl Caller {
    fn call(&self, server: &str, request: &IoRequest, data: &[u8]) -> Result<(IoReply, Vec<u8>), String> {
        self.runtime.block_on(async {
            let config = common::connection_config_with(&server_key());
            let connection = Connection::connect(server, config).await.map_err(|e| e.to_string())?;
            let (reply, data) = connection
                .call::<IoRequest, IoReply>(request, Bytes::copy_from_slice(data))
                .await
                .map_err(|e| e.to_string())?;
            Ok((reply, data.to_vec()))
        })
    }

    fn chained(
        &self,
        server: &str,
        (chain, version): (u32, u64),
        request: IoRequest,
        data: &[u8],
    ) -> (IoReply, Vec<u8>) {
        let request = IoRequest::Chained { chain, version, request: Box::new(request) };
        self.call(server, &request, data).expect("a reply")
    }
}

/// Bytes [`Caller::stream`] writes.
const STREAM_BYTES: usize = 32 << 20;

impl Caller {
    /// Writes `STREAM_BYTES` to a scratch fork in 256 KiB writes, 8 in flight on one
    /// connection, chained or plain; returns the milliseconds it took.
    fn stream(&self, server: &str, chained: Option<(u32, u64)>, target: TargetId) -> u128 {
        const WRITE: usize = 256 << 10;
        self.runtime.block_on(async {
            let config = common::connection_config_with(&server_key());
            let connection = std::sync::Arc::new(Connection::connect(server, config).await.expect("connect"));
            let bytes = Bytes::from(common::random_bytes(7, WRITE));
            let scratch = ForkRef { fork: "stream".into(), ..fork(target) };
            let started = Instant::now();
            let mut writers = Vec::new();
            for lane in 0..8usize {
                let (connection, bytes, scratch) = (connection.clone(), bytes.clone(), scratch.clone());
                writers.push(tokio::spawn(async move {
                    for i in (lane..STREAM_BYTES / WRITE).step_by(8) {
                        let write = IoRequest::Write {
                            fork: scratch.clone(),
                            shape: Shape::contiguous((i * WRITE) as u64, WRITE as u64),
                        };
                        let request = match chained {
                            Some((chain, version)) => {
                                IoRequest::Chained { chain, version, request: Box::new(write) }
                            }
                            None => write,
                        };
                        let (reply, _) = connection
                            .call::<IoRequest, IoReply>(&request, bytes.clone())
                            .await
                            .expect("a reply");
                        assert!(matches!(reply, IoReply::Done { .. }), "stream write {i}: {reply:?}");
                    }
                }));
            }
            for writer in writers {
                writer.await.expect("a writer");
            }
            started.elapsed().as_millis()
        })
    }
}

fn fork(target: TargetId) -> ForkRef {
    ForkRef { target, file: FileId(0xc4a2), subfile: SubfileIndex(0), fork: "data".into() }
}

fn write(target: TargetId, offset: u64, length: usize) -> IoRequest {
    IoRequest::Write { fork: fork(target), shape: Shape::contiguous(offset, length as u64) }
}

fn read(target: TargetId, offset: u64, length: usize) -> IoRequest {
    IoRequest::Read { fork: fork(target), shape: Shape::contiguous(offset, length as u64) }
}

fn refusal(reply: IoReply) -> ForwardRefused {
    match reply {
        IoReply::ForwardRefused(refused) => refused,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn done(reply: IoReply) {
    assert!(matches!(reply, IoReply::Done { .. }), "expected the change done, got {reply:?}");
}

#[test]
fn chained_changes_reach_every_member_and_survive_a_member_killed() {
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    for (index, group) in GROUPS.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    let built = wait_status(&cluster, "a chain of three serving members", |s| {
        chains(s)
            .values()
            .any(|(_, m)| m.len() == 3 && m.iter().all(|(_, state)| state.starts_with("serving")))
    });
    let (chain, (version, members)) = chains(&built).into_iter().next().expect("the chain");
    let order: Vec<TargetId> = members.iter().map(|(t, _)| *t).collect();
    // Which server holds which member.
    let index_of = |target: TargetId| {
        GROUPS.iter().position(|g| target_of(&built, g) == Some(target)).expect("a member's group")
    };
    let addr = |cluster: &Cluster, target: TargetId| {
        cluster.servers[index_of(target)].as_ref().expect("running").addr.clone()
    };
    let (head, middle, tail) = (order[0], order[1], order[2]);
    let caller = Caller { runtime: tokio::runtime::Runtime::new().unwrap() };
    println!("chain {chain} v{version}: {head} -> {middle} -> {tail}");

    // The head holds the chain view once a heartbeat reply brought it (every member too).
    let first = common::random_bytes(41, 64 << 10);
    let deadline = Instant::now() + SETTLE;
    loop {
        match caller.chained(&addr(&cluster, head), (chain, version), write(head, 0, first.len()), &first).0 {
            IoReply::Done { .. } => break,
            other => {
                assert!(Instant::now() < deadline, "the first chained write never went through: {other:?}")
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every member holds it, each under its own target: through a chained read to it, and
    // through a bare read of its own target.
    for member in [head, middle, tail] {
        let (reply, data) =
            caller.chained(&addr(&cluster, member), (chain, version), read(head, 0, first.len()), &[]);
        assert!(matches!(reply, IoReply::Data), "chained read from {member}: {reply:?}");
        assert_eq!(data, first, "member {member} holds the chained write");
        let (reply, data) =
            caller.call(&addr(&cluster, member), &read(member, 0, first.len()), &[]).expect("read");
        assert!(matches!(reply, IoReply::Data), "bare read of {member}: {reply:?}");
        assert_eq!(data, first, "member {member}'s own target holds the chained write");
    }

    // Changes other than writes travel too: a truncate and a fork created.
    done(
        caller
            .chained(
                &addr(&cluster, head),
                (chain, version),
                IoRequest::Truncate { fork: fork(head), size_bytes: 1000 },
                &[],
            )
            .0,
    );
    let side = ForkRef { fork: "side".into(), ..fork(head) };
    done(
        caller.chained(&addr(&cluster, head), (chain, version), IoRequest::CreateFork { fork: side }, &[]).0,
    );
    done(
        caller.chained(&addr(&cluster, head), (chain, version), IoRequest::Sync { fork: fork(head) }, &[]).0,
    );
    for member in [head, middle, tail] {
        let size = IoRequest::ForkSize { fork: fork(head) };
        match caller.chained(&addr(&cluster, member), (chain, version), size, &[]).0 {
            IoReply::Size { bytes } => assert_eq!(bytes, 1000, "member {member} truncated"),
            other => panic!("fork size from {member}: {other:?}"),
        }
        let list = IoRequest::ListForks { target: head, file: FileId(0xc4a2), subfile: SubfileIndex(0) };
        match caller.chained(&addr(&cluster, member), (chain, version), list, &[]).0 {
            IoReply::Forks(forks) => {
                assert!(forks.iter().any(|f| f.name == "side"), "member {member} has the new fork: {forks:?}")
            }
            other => panic!("list forks from {member}: {other:?}"),
        }
    }

    // A figure, not a bound: 8 writes of 256 KiB in flight on one connection, chained
    // through three members, then plain to the head's own target (a scratch fork).
    let stream = ForkRef { fork: "stream".into(), ..fork(head) };
    done(
        caller
            .chained(&addr(&cluster, head), (chain, version), IoRequest::CreateFork { fork: stream }, &[])
            .0,
    );
    let chained_ms = caller.stream(&addr(&cluster, head), Some((chain, version)), head);
    let plain_ms = caller.stream(&addr(&cluster, head), None, head);
    println!(
        "{STREAM_BYTES} bytes in 256 KiB writes, 8 in flight: chained through 3 members {chained_ms} ms, plain {plain_ms} ms"
    );

    // A change sent to a member that is not the head is refused naming the head.
    for member in [middle, tail] {
        let refused =
            refusal(caller.chained(&addr(&cluster, member), (chain, version), write(head, 0, 4), b"nope").0);
        assert_eq!((refused.chain, refused.version), (chain, version));
        assert_eq!(refused.reason, ForwardRefusalReason::NotHead { head: Some(head) }, "{refused}");
    }

    // SIGKILL the middle member, then write at once: the head's forward fails, it asks for
    // news, and once the service fenced the middle (fence_after_ms) it sends the entry to
    // the tail under the new version and answers.
    let second = common::random_bytes(42, 32 << 10);
    let middle_index = index_of(middle);
    let head_addr = addr(&cluster, head);
    cluster.servers[middle_index].take().expect("middle").kill();
    let started = Instant::now();
    let reply = caller.chained(&head_addr, (chain, version), write(head, 4096, second.len()), &second).0;
    let stall = started.elapsed();
    done(reply);
    println!("write pending while the middle member died: answered after {} ms", stall.as_millis());
    let fenced = status(&cluster);
    let (new_version, after) = chains(&fenced)[&chain].clone();
    assert!(new_version > version, "the chain changed: {fenced}");
    assert!(
        after.iter().any(|(t, state)| *t == middle && !state.starts_with("serving")),
        "the middle member is out: {after:?}"
    );
    let mut expected = first[..1000].to_vec();
    expected.resize(4096, 0);
    expected.extend_from_slice(&second);
    for member in [head, tail] {
        let (reply, data) =
            caller.chained(&addr(&cluster, member), (chain, new_version), read(head, 0, expected.len()), &[]);
        assert!(matches!(reply, IoReply::Data), "read from {member} at v{new_version}: {reply:?}");
        assert_eq!(data, expected, "member {member} holds every acknowledged byte");
    }
    // The old version is refused, by the head and the tail.
    for member in [head, tail] {
        let refused =
            refusal(caller.chained(&addr(&cluster, member), (chain, version), read(head, 0, 4), &[]).0);
        assert_eq!(refused.reason, ForwardRefusalReason::Stale { current: new_version }, "{refused}");
    }
    // Writes go on under the new version (the head and the tail).
    let third = common::random_bytes(43, 8 << 10);
    done(caller.chained(&head_addr, (chain, new_version), write(head, 65536, third.len()), &third).0);
    let (_, data) =
        caller.chained(&addr(&cluster, tail), (chain, new_version), read(tail, 65536, third.len()), &[]);
    assert_eq!(data, third, "the tail holds the write made after the change");

    // The killed member comes back: it is syncing (it missed writes) and serves no read.
    let restarted = cluster.start_server_in_group(middle_index, GROUPS[middle_index]);
    cluster.servers[middle_index] = Some(restarted);
    let back = wait_status(&cluster, "the middle member back as syncing", |s| {
        chains(s)[&chain].1.iter().any(|(t, state)| *t == middle && state.starts_with("syncing"))
    });
    let back_version = chains(&back)[&chain].0;
    let middle_addr = addr(&cluster, middle);
    // While it syncs it serves no read; its resync (nothing of this chain is in the
    // metadata service's inodes: the copy is empty) may end first and move the version on.
    let deadline = Instant::now() + SETTLE;
    loop {
        match caller.chained(&middle_addr, (chain, back_version), read(head, 0, 4), &[]).0 {
            IoReply::ForwardRefused(r) if r.reason == ForwardRefusalReason::NotReadable => break,
            IoReply::ForwardRefused(r) if matches!(r.reason, ForwardRefusalReason::Stale { current } if current > back_version) => {
                break
            }
            IoReply::ForwardRefused(r) => assert!(Instant::now() < deadline, "{r}"),
            other => panic!("a syncing member answered a read: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Writes go through while it syncs and after (it receives them once copied).
    let deadline = Instant::now() + SETTLE;
    loop {
        let (version, head_now) = current(&cluster.meta_addr(), chain).expect("the chain");
        let reply =
            caller.chained(&addr(&cluster, head_now), (chain, version), write(head_now, 0, 4), b"four").0;
        match reply {
            IoReply::Done { .. } => break,
            other => assert!(Instant::now() < deadline, "a write while a member syncs: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its resync ends (SyncDone): it serves again, and holds the write.
    let served = wait_status(&cluster, "the middle member serving again", |s| {
        chains(s)[&chain].1.iter().any(|(t, state)| *t == middle && state == "serving")
    });
    let version = chains(&served)[&chain].0;
    let (_, head_now) = current(&cluster.meta_addr(), chain).expect("the chain");
    let reply = caller.chained(&addr(&cluster, head_now), (chain, version), write(head_now, 8, 4), b"five").0;
    done(reply);
    let (_, data) = caller.chained(&middle_addr, (chain, version), read(middle, 8, 4), &[]);
    assert_eq!(data, b"five", "the returned member, serving again, takes the chain's writes");
}

/// The chain's version and head (first serving member) as the metadata service shows them.
fn current(cluster_meta: &str, chain: u32) -> Option<(u64, TargetId)> {
    let (ok, stdout, _) = cli(&["status", "--chains", "--meta", cluster_meta]);
    if !ok {
        return None;
    }
    let (version, members) = chains(&stdout).remove(&chain)?;
    let head = members.iter().find(|(_, state)| state.starts_with("serving"))?.0;
    Some((version, head))
}

#[test]
fn a_writer_goes_on_when_the_tail_then_the_head_are_killed() {
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    for (index, group) in GROUPS.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    let built = wait_status(&cluster, "a chain of three serving members", |s| {
        chains(s)
            .values()
            .any(|(_, m)| m.len() == 3 && m.iter().all(|(_, state)| state.starts_with("serving")))
    });
    let (chain, (_, members)) = chains(&built).into_iter().next().expect("the chain");
    let order: Vec<TargetId> = members.iter().map(|(t, _)| *t).collect();
    let index_of = |target: TargetId| {
        GROUPS.iter().position(|g| target_of(&built, g) == Some(target)).expect("a member's group")
    };
    let addresses: BTreeMap<TargetId, String> = order
        .iter()
        .map(|&t| (t, cluster.servers[index_of(t)].as_ref().expect("running").addr.clone()))
        .collect();
    let (head, middle, tail) = (order[0], order[1], order[2]);

    // One writer, as a client would: to the head it knows, refetching the chain on a
    // refusal or a broken connection; every write must succeed within the bound.
    const WRITES: usize = 60;
    const RECORD: usize = 16 << 10;
    let (meta, writer_addresses) = (cluster.meta_addr(), addresses.clone());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = done.clone();
    let writer = std::thread::spawn(move || {
        let caller = Caller { runtime: tokio::runtime::Runtime::new().unwrap() };
        let mut known = current(&meta, chain).expect("the chain");
        let mut stalls = Vec::new();
        for i in 0..WRITES {
            let bytes = common::random_bytes(100 + i as u64, RECORD);
            let started = Instant::now();
            loop {
                let (version, at) = known;
                let request = IoRequest::Chained {
                    chain,
                    version,
                    request: Box::new(write(at, (i * RECORD) as u64, RECORD)),
                };
                match caller.call(&writer_addresses[&at], &request, &bytes) {
                    Ok((IoReply::Done { .. }, _)) => break,
                    Ok((IoReply::ForwardRefused(_), _)) | Err(_) => {}
                    Ok((other, _)) => panic!("write {i}: {other:?}"),
                }
                assert!(started.elapsed() < SETTLE, "write {i} never went through");
                std::thread::sleep(Duration::from_millis(50));
                known = current(&meta, chain).unwrap_or(known);
            }
            stalls.push(started.elapsed());
            progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        stalls
    });
    let wait_for = |count: usize| {
        let deadline = Instant::now() + SETTLE * 2;
        while done.load(std::sync::atomic::Ordering::SeqCst) < count {
            assert!(Instant::now() < deadline, "the writer stopped before write {count}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(10);
    cluster.servers[index_of(tail)].take().expect("tail").kill();
    wait_for(30);
    cluster.servers[index_of(head)].take().expect("head").kill();
    let mut stalls = writer.join().expect("the writer");
    stalls.sort();
    println!(
        "{WRITES} writes of {RECORD} bytes, tail then head SIGKILLed: median {} ms, worst {} ms",
        stalls[WRITES / 2].as_millis(),
        stalls[WRITES - 1].as_millis()
    );

    // The survivor holds every acknowledged byte.
    let (version, now_head) = current(&cluster.meta_addr(), chain).expect("the chain");
    assert_eq!(now_head, middle, "the last serving member took over");
    let caller = Caller { runtime: tokio::runtime::Runtime::new().unwrap() };
    let (reply, data) =
        caller.chained(&addresses[&middle], (chain, version), read(middle, 0, WRITES * RECORD), &[]);
    assert!(matches!(reply, IoReply::Data), "read from the survivor: {reply:?}");
    for i in 0..WRITES {
        let expected = common::random_bytes(100 + i as u64, RECORD);
        assert!(data[i * RECORD..(i + 1) * RECORD] == expected[..], "write {i} is on the survivor");
    }
}
