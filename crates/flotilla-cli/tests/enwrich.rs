//! ENWRICH with real processes: job members are `flotilla enwrich-member` processes driven
//! over stdin; the cluster has four I/O servers. Writes overlap at random, are flushed by
//! every trigger (data full, directory full, timeout, close, sync, flush-on-read), read back
//! and compared with a newest-wins model; a member and a server are SIGKILLed mid-flush.
//! Flushes by a full cache or a timeout are not durable (the size is published by the next
//! durable one: sync, close, a read), so those checks read after the members closed.

mod common;

use common::enwrich_member::{member_bytes, Member};
use common::{path, Cluster};
use flotilla_client::{Client, CreateOptions, Layout};
use std::time::Duration;

/// Servers answer a missing member within this long (the tests' `flush_member_wait_ms`).
const MEMBER_WAIT_MS: u64 = 3000;

fn cluster() -> Cluster {
    let server = format!("flush_member_wait_ms = {MEMBER_WAIT_MS}\nflush_block_bytes = 16384");
    Cluster::start_configured(4, "", &server)
}

/// Members of one job, each with `path` open in ENWRICH mode, indexed by member index.
fn job(cluster: &Cluster, name: &str, size: u32, file: &str, cache: (u64, f64, u64)) -> Vec<Member> {
    let meta = cluster.meta_addr();
    let mut members: Vec<Member> = (0..size).map(|_| Member::start(&meta, name, size)).collect();
    for member in members.iter_mut() {
        member.open(file, cache.0, cache.1, cache.2);
    }
    members.sort_by_key(|m| m.index);
    assert_eq!(members.iter().map(|m| m.index).collect::<Vec<_>>(), (0..size).collect::<Vec<_>>());
    members
}

fn create(client: &Client, file: &str) {
    let options = CreateOptions {
        subfiles: 4,
        layout: Some(Layout::Stripe { unit_bytes: 4096, count: 4 }),
        ..CreateOptions::default()
    };
    client.create(file, &options).expect("create").close().expect("close");
}

fn read_all(client: &Client, file: &str, length: usize) -> Vec<u8> {
    let file = client.open(file).expect("open for reading");
    assert_eq!(file.size(), length as u64, "the published size");
    let mut buffer = vec![0u8; length];
    file.read_at(0, &mut buffer).expect("read");
    buffer
}

/// One logged write, for the model.
struct Logged {
    stamp: u64,
    member: u32,
    order: usize,
    offset: u64,
    data: Vec<u8>,
}

/// Newest wins by (stamp, member, order), as the servers resolve it.
fn model(mut writes: Vec<Logged>) -> Vec<u8> {
    writes.sort_by_key(|w| (w.stamp, w.member, w.order));
    let end = writes.iter().map(|w| w.offset as usize + w.data.len()).max().unwrap_or(0);
    let mut bytes = vec![0u8; end];
    for w in writes {
        bytes[w.offset as usize..w.offset as usize + w.data.len()].copy_from_slice(&w.data);
    }
    bytes
}

#[test]
fn random_overlapping_writes_flush_to_the_newest_wins_model() {
    let cluster = cluster();
    let client = cluster.client();
    create(&client, "/model");
    let mut members = job(&cluster, "model", 6, "/model", (1 << 20, 0.1, 0));
    let mut writes = Vec::new();
    let mut state = 0x5EED_u64;
    let mut next = |bound: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % bound
    };
    for round in 0..3 {
        for order in 0..40 {
            let member = next(6) as usize;
            let (offset, length, seed) = (next(96 << 10), 1 + next(6000) as usize, next(1 << 40));
            let stamp = members[member].write(offset, length, seed);
            let data = member_bytes(seed, length);
            writes.push(Logged { stamp, member: member as u32, order: round * 40 + order, offset, data });
        }
        // Every round is one collective flush, asked by a different member.
        let asking = round % 6;
        assert_eq!(members[asking].ask("sync"), "ok");
        for member in members.iter_mut() {
            member.wait_flushes(round as u64 + 1);
        }
    }
    let expected = model(writes);
    assert_eq!(read_all(&client, "/model", expected.len()), expected, "flushed bytes differ from the model");
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
}

#[test]
fn every_trigger_flushes_the_job() {
    let cluster = cluster();
    let client = cluster.client();

    // Data section full: 64 KiB cache, 90% data; 70 000 bytes do not fit.
    create(&client, "/data-full");
    let mut members = job(&cluster, "data-full", 2, "/data-full", (64 << 10, 0.1, 0));
    members[1].write(0, 70_000, 7);
    members[0].wait_flushes(1);
    members[1].wait_flushes(1);
    assert_eq!(members[1].ask("close"), "ok");
    assert_eq!(members[0].ask("close"), "ok");
    assert_eq!(read_all(&client, "/data-full", 70_000), member_bytes(7, 70_000));

    // Directory section full: 4800 bytes, 10% directory = 10 entries.
    create(&client, "/directory-full");
    let mut members = job(&cluster, "directory-full", 2, "/directory-full", (4800, 0.1, 0));
    for i in 0..10 {
        members[0].write(i * 10, 10, 100 + i);
    }
    members[1].wait_flushes(1);
    members[0].wait_flushes(1);
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
    let expected: Vec<u8> = (0..10).flat_map(|i| member_bytes(100 + i, 10)).collect();
    assert_eq!(read_all(&client, "/directory-full", 100), expected);

    // Timeout: a cache holding data for 200 ms asks for a flush by itself.
    create(&client, "/timeout");
    let mut members = job(&cluster, "timeout", 2, "/timeout", (1 << 20, 0.1, 200));
    members[0].write(5, 1000, 9);
    members[1].wait_flushes(1);
    members[0].wait_flushes(1);
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
    let mut expected = vec![0u8; 5];
    expected.extend(member_bytes(9, 1000));
    assert_eq!(read_all(&client, "/timeout", 1005), expected);

    // Close: nothing reaches the servers before the members close.
    create(&client, "/close");
    let mut members = job(&cluster, "close", 2, "/close", (1 << 20, 0.1, 0));
    members[0].write(0, 3000, 11);
    members[1].write(3000, 3000, 12);
    assert_eq!(client.open("/close").unwrap().size(), 0, "nothing flushed yet");
    assert_eq!(members[0].ask("close"), "ok");
    assert_eq!(members[1].ask("close"), "ok");
    let mut expected = member_bytes(11, 3000);
    expected.extend(member_bytes(12, 3000));
    assert_eq!(read_all(&client, "/close", 6000), expected);

    // Flush-on-read: reopening the file for reading in the writing process flushes first.
    create(&client, "/on-read");
    let mut members = job(&cluster, "on-read", 2, "/on-read", (1 << 20, 0.1, 0));
    members[1].write(0, 5000, 13);
    let data = member_bytes(13, 5000);
    let sum = data.iter().fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
    assert_eq!(members[1].ask("read 0 5000"), format!("sum={sum}"));
    assert_eq!(read_all(&client, "/on-read", 5000), data);
    for member in members.iter_mut() {
        assert_eq!(member.ask("close"), "ok");
    }
}

#[test]
fn a_member_killed_mid_flush_fails_the_flush_on_every_member_naming_it() {
    let cluster = cluster();
    let client = cluster.client();
    create(&client, "/member-dies");
    let mut members = job(&cluster, "member-dies", 3, "/member-dies", (4 << 20, 0.1, 0));
    members[0].write(0, 10_000, 1);
    assert_eq!(members[0].ask("sync"), "ok");
    let durable = member_bytes(1, 10_000);
    for (i, member) in members.iter_mut().enumerate() {
        member.write(20_000 + i as u64 * 1000, 300_000, 50 + i as u64);
    }
    // Member 2 is stopped, so the flush cannot finish before it is killed: the servers hold
    // the other members' directories (and may be pulling from them) when it dies.
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(members[2].pid() as i32, libc::SIGSTOP) };
    members[0].send("sync");
    std::thread::sleep(Duration::from_millis(300));
    members[2].kill();
    let answer = members[0].answer();
    assert!(answer.starts_with("error=") && answer.contains("member 2"), "member 0 got {answer:?}");
    let failure = members[1].wait_failure();
    assert!(failure.contains("member 2"), "member 1's flush failed with {failure:?}");
    // What was durable before stays durable.
    let file = client.open("/member-dies").unwrap();
    let mut buffer = vec![0u8; 10_000];
    file.read_at(0, &mut buffer).unwrap();
    assert_eq!(buffer, durable);
}

#[test]
fn a_server_killed_mid_flush_fails_the_flush_naming_it_and_loses_nothing_durable() {
    let mut cluster = cluster();
    let client = cluster.client();
    create(&client, "/server-dies");
    let mut members = job(&cluster, "server-dies", 3, "/server-dies", (4 << 20, 0.1, 0));
    members[1].write(0, 40_000, 3);
    assert_eq!(members[1].ask("sync"), "ok");
    let durable = member_bytes(3, 40_000);
    members[0].write(40_000, 40_000, 4);
    // Member 2 is stopped, so every server's flush waits for its directory while the
    // server is killed.
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(members[2].pid() as i32, libc::SIGSTOP) };
    members[0].send("sync");
    std::thread::sleep(Duration::from_millis(300));
    let victim = cluster.servers[3].take().expect("server 3");
    let victim_addr = victim.addr.clone();
    victim.kill();
    // SAFETY: as above.
    unsafe { libc::kill(members[2].pid() as i32, libc::SIGCONT) };
    let answer = members[0].answer();
    assert!(answer.starts_with("error=") && answer.contains(&victim_addr), "member 0 got {answer:?}");
    let failure = members[1].wait_failure();
    assert!(failure.contains(&victim_addr), "member 1's flush failed with {failure:?}");
    // The server comes back where it was: the bytes flushed before are all there.
    let target = cluster.target_dir(3);
    cluster.servers[3] = Some(cluster.start_server_listening(&target, &victim_addr));
    cluster.wait_up(4);
    let file = cluster.client().open("/server-dies").unwrap();
    let mut buffer = vec![0u8; 40_000];
    file.read_at(0, &mut buffer).unwrap();
    assert_eq!(buffer, durable);
    let _ = path(&target);
}

#[test]
fn a_server_restart_after_an_unsynced_flush_fails_the_next_sync() {
    let mut cluster = cluster();
    let client = cluster.client();
    create(&client, "/restart");
    let mut members = job(&cluster, "restart", 2, "/restart", (64 << 10, 0.1, 0));
    // A full cache flushes without syncing: the bytes sit in the servers' caches.
    members[0].write(0, 70_000, 21);
    members[0].wait_flushes(1);
    members[1].wait_flushes(1);
    let victim = cluster.servers[1].take().expect("server 1");
    let addr = victim.addr.clone();
    victim.kill();
    let target = cluster.target_dir(1);
    cluster.servers[1] = Some(cluster.start_server_listening(&target, &addr));
    cluster.wait_up(4);
    let answer = members[0].ask("sync");
    assert!(answer.starts_with("error=") && answer.contains("restarted"), "member 0 got {answer:?}");
    assert!(answer.contains(&addr), "the restarted server is named: {answer:?}");
    let again = members[0].ask("sync");
    assert!(again.contains("may be lost"), "the loss is reported on every later sync: {again:?}");
}

#[test]
fn members_that_left_take_no_part_in_later_flushes() {
    let cluster = cluster();
    let client = cluster.client();
    create(&client, "/leavers");
    let mut members = job(&cluster, "leavers", 3, "/leavers", (64 << 10, 0.1, 0));
    assert_eq!(members[1].ask("close"), "ok");
    assert_eq!(members[2].ask("close"), "ok");
    // Member 0 alone: a full cache (not durable), then a sync (durable), then a close.
    members[0].write(0, 100_000, 31);
    assert_eq!(members[0].ask("sync"), "ok");
    members[0].write(100_000, 1000, 32);
    assert_eq!(members[0].ask("close"), "ok");
    let mut expected = member_bytes(31, 100_000);
    expected.extend(member_bytes(32, 1000));
    assert_eq!(read_all(&client, "/leavers", 101_000), expected);
}
