//! ENWRICH on a replicated file (issue 32) with real processes: a job of
//! `flotilla enwrich-member` processes writes a `replicas=2` file over two I/O servers in two
//! failure groups (every chain has both), flushes; each chain's head pulls the data and
//! applies it through the chain, so each member holds every byte: both members' subfiles are
//! read bare (server credential) and compared, then one server is SIGKILLed and the whole
//! file is read from the other alone. A server SIGKILLed during a flush: the flush fails
//! naming it (its part was pulled by it), nothing logged is dropped, and the next flush
//! (to the chains' new heads) completes; every byte then reads back from the survivor.

mod common;

use bytes::Bytes;
use common::enwrich_member::{member_bytes, Member};
use common::{server_key, Cluster};
use flotilla_client::{CreateOptions, Layout};
use flotilla_proto::{EntryInfo, ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, SubfileIndex};
use std::time::{Duration, Instant};

const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\nchain_replicas = 2\n";
const SERVER: &str = "flush_member_wait_ms = 3000\nflush_block_bytes = 16384\n";
const GROUPS: [&str; 2] = ["rack-a", "rack-b"];
const SETTLE: Duration = Duration::from_secs(30);

fn cluster() -> Cluster {
    let mut cluster = Cluster::start_configured(0, MEMBERSHIP, SERVER);
    for (index, group) in GROUPS.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    let deadline = Instant::now() + SETTLE;
    loop {
        let (ok, status, _) = common::cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
        if ok && status.contains("chain=") {
            return cluster;
        }
        assert!(Instant::now() < deadline, "no chain table: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `size` members with `file` open in ENWRICH mode (never flushed on a timeout).
fn job(cluster: &Cluster, name: &str, size: u32, file: &str) -> Vec<Member> {
    let meta = cluster.meta_addr();
    let mut members: Vec<Member> = (0..size).map(|_| Member::start(&meta, name, size)).collect();
    for member in members.iter_mut() {
        let answer = member.ask(&format!("open {file} {} 0.1 0", 4 << 20));
        assert!(answer.starts_with("member="), "open {file}: {answer}");
    }
    members
}

fn create(cluster: &Cluster, file: &str) -> EntryInfo {
    let options = CreateOptions {
        // Two targets, and a replicated file's subfiles sit on chains with disjoint members:
        // one subfile, on a chain of both.
        subfiles: 1,
        layout: Some(Layout::Stripe { unit_bytes: 4096, count: 1 }),
        replicas: 2,
        ..CreateOptions::default()
    };
    let client = cluster.client();
    let created = client.create(file, &options).expect("create");
    let entry = created.entry().clone();
    created.close().expect("close");
    assert!(entry.subfiles.iter().all(|p| p.chain.as_ref().is_some_and(|c| c.members.len() == 2)));
    entry
}

/// Every byte of `file`, read through a client (retried while chains settle).
fn read_whole(cluster: &Cluster, file: &str, expected: &[u8]) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let attempt = (|| {
            let file = cluster.client().open(file).map_err(|e| e.to_string())?;
            let mut buffer = vec![0u8; expected.len()];
            file.read_at(0, &mut buffer).map_err(|e| e.to_string())?;
            Ok::<_, String>((file.size(), buffer))
        })();
        match attempt {
            Ok((size, buffer)) => {
                assert_eq!(size, expected.len() as u64, "{file}: the published size");
                assert!(buffer == expected, "{file}: the bytes read back differ");
                return;
            }
            Err(error) => assert!(Instant::now() < deadline, "reading {file}: {error}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One bare request with the server credential to `server`.
fn server_call(server: &str, request: IoRequest) -> (IoReply, Bytes) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let connection = Connection::connect(server, common::connection_config_with(&server_key()))
            .await
            .expect("connect");
        connection.call::<IoRequest, IoReply>(&request, Bytes::new()).await.expect("a reply")
    })
}

/// A subfile's `data` fork on one member, read bare (empty when it does not exist).
fn member_subfile(server: &str, fork: ForkRef) -> Vec<u8> {
    let size = match server_call(server, IoRequest::ForkSize { fork: fork.clone() }).0 {
        IoReply::Size { bytes } => bytes,
        IoReply::Error(_) => return Vec::new(),
        other => panic!("fork size at {server}: {other:?}"),
    };
    let request = IoRequest::Read { fork, shape: Shape::contiguous(0, size) };
    match server_call(server, request) {
        (IoReply::Data, data) => data.to_vec(),
        (other, _) => panic!("read at {server}: {other:?}"),
    }
}

/// Each subfile holds the same bytes on both members of its chain; the bytes held in all.
fn members_agree(entry: &EntryInfo) -> usize {
    let mut total = 0;
    for (index, place) in entry.subfiles.iter().enumerate() {
        let chain = place.chain.as_ref().expect("a chained subfile");
        let copies: Vec<Vec<u8>> = chain
            .members
            .iter()
            .map(|member| {
                let fork = ForkRef {
                    target: member.target,
                    file: FileId(entry.id),
                    subfile: SubfileIndex(index as u32),
                    fork: "data".into(),
                };
                member_subfile(&member.server, fork)
            })
            .collect();
        assert!(!copies[0].is_empty(), "subfile {index}: nothing on {}", chain.members[0].server);
        for (member, copy) in chain.members.iter().zip(&copies).skip(1) {
            assert!(
                *copy == copies[0],
                "subfile {index}: member {} ({} bytes) differs from {} ({} bytes)",
                member.server,
                copy.len(),
                chain.members[0].server,
                copies[0].len()
            );
        }
        total += copies[0].len();
    }
    total
}

#[test]
fn a_job_flushes_a_replicated_file_onto_every_member() {
    let mut cluster = cluster();
    let entry = create(&cluster, "/rep");
    let mut members = job(&cluster, "rep", 3, "/rep");
    const PART: usize = 50_000;
    let mut expected = Vec::new();
    for (index, member) in members.iter_mut().enumerate() {
        let answer = member.ask(&format!("write {} {PART} {}", index * PART, 10 + index));
        assert!(answer.starts_with("stamp="), "{answer}");
        expected.extend_from_slice(&member_bytes(10 + index as u64, PART));
    }
    assert_eq!(members[0].ask("sync"), "ok");
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
    let held = members_agree(&entry);
    assert_eq!(held, expected.len(), "every byte on each member");
    read_whole(&cluster, "/rep", &expected);
    // Each member alone: the other one SIGKILLed.
    cluster.servers[0].take().expect("server 0").kill();
    read_whole(&cluster, "/rep", &expected);
}

#[test]
fn a_server_killed_during_a_replicated_flush_fails_it_by_name_and_the_next_flush_completes() {
    let mut cluster = cluster();
    create(&cluster, "/rep-dies");
    let mut members = job(&cluster, "rep-dies", 3, "/rep-dies");
    const PART: usize = 40_000;
    let mut expected = Vec::new();
    for (index, member) in members.iter_mut().enumerate() {
        let answer = member.ask(&format!("write {} {PART} {}", index * PART, 20 + index));
        assert!(answer.starts_with("stamp="), "{answer}");
        expected.extend_from_slice(&member_bytes(20 + index as u64, PART));
    }
    // Member 2 stopped: every server's part of the flush waits for its directory while a
    // server is killed.
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(members[2].pid() as i32, libc::SIGSTOP) };
    members[0].send("sync");
    std::thread::sleep(Duration::from_millis(300));
    let victim = cluster.servers[0].take().expect("server 0");
    let victim_addr = victim.addr.clone();
    victim.kill();
    // SAFETY: as above.
    unsafe { libc::kill(members[2].pid() as i32, libc::SIGCONT) };
    let first = members[0].answer();
    println!("the flush during the kill: {first}");
    if first != "ok" {
        assert!(first.starts_with("error=") && first.contains(&victim_addr), "member 0 got {first:?}");
        // Nothing logged was dropped: the next flush goes to the chains' new heads (the
        // survivor, once the metadata service fenced the dead server) and completes.
        let deadline = Instant::now() + SETTLE;
        loop {
            let again = members[0].ask("sync");
            if again == "ok" {
                break;
            }
            assert!(again.starts_with("error="), "{again}");
            assert!(Instant::now() < deadline, "no flush completed after the kill: {again}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
    read_whole(&cluster, "/rep-dies", &expected);
}
