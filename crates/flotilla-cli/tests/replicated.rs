//! Replicated files (issue 32) with real processes: a replicated create is placed on
//! pairwise disjoint chains, `flotilla stat` shows each subfile's replicas and follows a
//! member's death, a create asking for more replicas than failure groups is refused naming
//! them; with the chain head on the servers, a put/get round trip and four writers
//! surviving the SIGKILL of one server mid-write; a write resent at close after its head
//! died not landing over a newer write of the same bytes; and resync: a member SIGKILLed, written
//! past and restarted catches up (every chain serves again) and then serves every byte
//! alone.

mod common;

use common::replication::{replicated, until};
use common::{cli, cli_ok, path, random_bytes, status_field, Cluster};
use flotilla_client::CreateOptions;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms); `fence_after_ms > lease_ms +
/// clock_margin_ms` holds.
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Bound on waiting for a chain change (about `fence_after_ms`, plus a tick and a slow
/// machine's scheduling).
const SETTLE: Duration = Duration::from_secs(20);
/// The stripe unit of the test files.
const UNIT_BYTES: u64 = 64 << 10;

/// One metadata service and one server per group, in those groups.
fn cluster_in_groups(groups: &[&str]) -> Cluster {
    Cluster::start_in_groups(MEMBERSHIP, "", groups, SETTLE)
}

/// One subfile line of `flotilla stat`: its target, chain, version and replicas as
/// `(target, server, state)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Subfile {
    target: String,
    chain: u32,
    version: u64,
    replicas: Vec<(String, String, String)>,
}

fn subfiles(meta: &str, file: &str) -> Vec<Subfile> {
    let stat = cli_ok(&["stat", file, "--meta", meta]);
    stat.lines()
        .filter(|l| l.starts_with("subfile="))
        .map(|l| {
            let replicas = status_field(l, "replicas")
                .unwrap_or_else(|| panic!("no replicas on {l:?}"))
                .split(',')
                .map(|r| {
                    // TARGET@HOST:PORT:STATE (the state may hold `@`).
                    let (target, rest) = r.split_once('@').expect("target@server");
                    let (host, rest) = rest.split_once(':').expect("host:port");
                    let (port, state) = rest.split_once(':').expect("port:state");
                    (target.to_string(), format!("{host}:{port}"), state.to_string())
                })
                .collect();
            Subfile {
                target: status_field(l, "target").expect("target").to_string(),
                chain: status_field(l, "chain").and_then(|c| c.parse().ok()).expect("chain"),
                version: status_field(l, "version").and_then(|v| v.parse().ok()).expect("version"),
                replicas,
            }
        })
        .collect()
}

#[test]
fn a_replicated_file_sits_on_disjoint_chains_and_stat_follows_a_dead_member() {
    let mut cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();
    let client = cluster.client();
    client.create("/r", &replicated(2, UNIT_BYTES)).expect("a replicated create over four groups");

    let placed = subfiles(&meta, "/r");
    assert_eq!(placed.len(), 2, "{placed:?}");
    let mut targets = BTreeSet::new();
    for subfile in &placed {
        assert_eq!(subfile.replicas.len(), 2, "two replicas: {subfile:?}");
        assert!(subfile.replicas.iter().all(|r| r.2 == "serving"), "{subfile:?}");
        assert_eq!(subfile.target, subfile.replicas[0].0, "the head is the subfile's target: {subfile:?}");
        for replica in &subfile.replicas {
            assert!(targets.insert(replica.0.clone()), "two replicas share target {}: {placed:?}", replica.0);
        }
    }
    let (ok, _, stderr) = cli(&["stat", "--json", "/r", "--meta", &meta]);
    assert!(ok, "{stderr}");

    // SIGKILL the head of subfile 0: its chain's next version shows it offline and the
    // other member heading.
    let before = placed[0].clone();
    let dead_server = before.replicas[0].1.clone();
    let index = cluster
        .servers
        .iter()
        .position(|s| s.as_ref().is_some_and(|p| p.addr == dead_server))
        .expect("the head's server is one of the cluster's");
    cluster.servers[index].take().unwrap().kill();
    let after = until("the chain to drop its dead head", SETTLE, || {
        let now = subfiles(&meta, "/r");
        let changed =
            now[0].version > before.version && now[0].replicas.iter().any(|r| r.2.starts_with("offline"));
        changed.then_some(now)
    });
    let chain = &after[0];
    assert_eq!(chain.chain, before.chain, "the file keeps its chain: {after:?}");
    assert_eq!(chain.target, before.replicas[1].0, "the surviving member heads: {after:?}");
    assert_eq!(after[1].version, placed[1].version, "the other chain did not change: {after:?}");

    // More replicas than failure groups is refused naming both.
    let local = cluster.dir.path().join("local.bin");
    std::fs::write(&local, b"five?").unwrap();
    let (ok, _, stderr) = cli(&["put", "--replicas", "5", path(&local), "/five", "--meta", &meta]);
    assert!(!ok);
    assert!(stderr.contains("5 replicas need 5 distinct failure groups, but only 3"), "{stderr}");
}

/// A writer overwrites the same bytes before and after its chain's head is SIGKILLed. Its
/// close sends again the write the dead head acknowledged (in another boot epoch than the
/// next head's: every member may have lost it); the newer write must go again after it, so
/// the file reads back the newest bytes, not the older write's (found by
/// `replicated_netns.rs`).
#[test]
fn a_write_resent_after_its_head_died_does_not_land_over_newer_bytes() {
    let mut cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c"]);
    let meta = cluster.meta_addr();
    let client = cluster.client();
    let file = client.create("/over", &replicated(1, UNIT_BYTES)).expect("create");
    let (old, new) = (random_bytes(11, 200_000), random_bytes(12, 200_000));
    file.write_at(0, &old).expect("the write through the first head");
    let head = subfiles(&meta, "/over")[0].replicas[0].1.clone();
    let index = cluster
        .servers
        .iter()
        .position(|s| s.as_ref().is_some_and(|p| p.addr == head))
        .expect("the head's server is one of the cluster's");
    cluster.servers[index].take().expect("head").kill();
    file.write_at(0, &new).expect("the write through the next head");
    file.close().expect("close");
    let reader = cluster.client();
    let mut got = vec![0u8; new.len()];
    let read = reader.open("/over").expect("open").read_at(0, &mut got).expect("read");
    assert_eq!(read, got.len(), "short read");
    let held = if got == old { "the older write's bytes" } else { "bytes of neither write" };
    assert!(got == new, "the file holds {held}, not the newest write's");
}

/// `flotilla put --replicas 2` and `get` of a replicated file, then a read and a write of it
/// through the mount.
#[test]
fn a_replicated_put_reads_back() {
    let cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();
    let data = random_bytes(7, (3 << 20) + 4321);
    let local = cluster.dir.path().join("in.bin");
    std::fs::write(&local, &data).unwrap();
    let args = ["put", "--replicas", "2", "--layout", "stripe:64k:2", path(&local), "/p", "--meta", &meta];
    cli_ok(&args);
    let back = cluster.dir.path().join("out.bin");
    cli_ok(&["get", "/p", path(&back), "--meta", &meta]);
    assert!(std::fs::read(&back).unwrap() == data, "the bytes read back differ");
    assert!(subfiles(&meta, "/p").iter().all(|s| s.replicas.len() == 2));

    // Through the mount (the client library underneath): read it, overwrite a range that
    // spans both subfiles, and read that back with `get`.
    let mount = common::Mount::start(&meta);
    let mounted = mount.path("p");
    assert!(std::fs::read(&mounted).unwrap() == data, "the mount reads other bytes");
    let mut expected = data.clone();
    let patch = random_bytes(8, 100_000);
    let at = 60_000;
    expected[at..at + patch.len()].copy_from_slice(&patch);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(&mounted).unwrap();
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.write_all(&patch).unwrap();
        file.sync_all().unwrap();
    }
    drop(mount);
    cli_ok(&["get", "/p", path(&back), "--meta", &meta]);
    assert!(std::fs::read(&back).unwrap() == expected, "the write through the mount did not read back");
}

/// Bytes and requests each server has read for clients so far (`IoRequest::Stats`).
fn reads_by_server(client: &flotilla_client::Client, servers: &[String]) -> Vec<(u64, u64)> {
    let stats = |addr: &String| client.server_stats(addr).unwrap_or_else(|e| panic!("stats of {addr}: {e}"));
    servers.iter().map(stats).map(|s| (s.total.read_bytes, s.total.read_ops)).collect()
}

/// CRAQ-style reads: one large read of a `replicas=2` file (two subfiles on two disjoint
/// chains over four servers) is cut per chain into one part per serving member, so every
/// one of the four servers answers part of it (counted by each server's read counters);
/// with one member SIGKILLed the same read fails over to the other member of its chain and
/// reads back the same bytes.
#[test]
fn one_large_read_is_served_by_every_member_of_its_chains() {
    let mut cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();
    let client = cluster.client();
    let file = client.create("/big", &replicated(2, UNIT_BYTES)).expect("create");
    let data = random_bytes(11, 16 << 20);
    file.write_at(0, &data).expect("write");
    file.sync().expect("sync");
    let placed = subfiles(&meta, "/big");
    let servers: Vec<String> = placed.iter().flat_map(|s| s.replicas.iter().map(|r| r.1.clone())).collect();
    assert_eq!(servers.iter().collect::<BTreeSet<_>>().len(), 4, "four distinct members: {placed:?}");
    assert!(placed.iter().flat_map(|s| &s.replicas).all(|r| r.2 == "serving"), "{placed:?}");

    let before = reads_by_server(&client, &servers);
    let mut back = vec![0u8; data.len()];
    assert_eq!(file.read_at(0, &mut back).expect("read"), data.len());
    assert!(back == data, "the bytes read back differ");
    let after = reads_by_server(&client, &servers);
    for ((server, (bytes0, ops0)), (bytes1, ops1)) in servers.iter().zip(&before).zip(&after) {
        assert!(ops1 > ops0, "{server} answered no part of the read ({ops0} -> {ops1} reads)");
        // Each chain holds 8 MiB of the read, cut in two parts of 4 MiB.
        assert!(bytes1 - bytes0 >= 2 << 20, "{server} read only {} bytes of the 16 MiB", bytes1 - bytes0);
    }

    // SIGKILL the first member of subfile 0's chain: its part fails over to the other member.
    let (dead, alive) = (servers[0].clone(), servers[1].clone());
    let index = cluster
        .servers
        .iter()
        .position(|s| s.as_ref().is_some_and(|p| p.addr == dead))
        .expect("the member's server is one of the cluster's");
    cluster.servers[index].take().unwrap().kill();
    let before = reads_by_server(&client, std::slice::from_ref(&alive));
    let mut back = vec![0u8; data.len()];
    assert_eq!(file.read_at(0, &mut back).expect("a read with one member dead"), data.len());
    assert!(back == data, "the bytes read back with one member dead differ");
    let after = reads_by_server(&client, std::slice::from_ref(&alive));
    assert!(
        after[0].0 - before[0].0 >= 8 << 20,
        "the surviving member {alive} read {} bytes, not the whole 8 MiB of its chain",
        after[0].0 - before[0].0
    );
}

/// The end-to-end test of issue 32: replicas=2 over four servers in four failure groups,
/// four writers (library clients, each its own file), one server SIGKILLed while every
/// writer is part-way through; every write and close succeeds and every byte reads back (by
/// `flotilla get`) while that server stays down.
#[test]
fn four_writers_survive_a_server_killed_mid_write() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();
    const WRITERS: usize = 4;
    const CHUNK_BYTES: usize = 1 << 20;
    const CHUNKS: usize = 48;
    let chunk = |writer: usize, index: usize| random_bytes((writer * 1000 + index) as u64, CHUNK_BYTES);
    let progress: Arc<Vec<AtomicUsize>> = Arc::new((0..WRITERS).map(|_| AtomicUsize::new(0)).collect());
    let mut writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (client, progress) = (cluster.client(), progress.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let name = format!("/w{writer}");
                let file = client
                    .create(&name, &replicated(2, UNIT_BYTES))
                    .map_err(|e| format!("create {name}: {e}"))?;
                for index in 0..CHUNKS {
                    let offset = (index * CHUNK_BYTES) as u64;
                    file.write_at(offset, &chunk(writer, index))
                        .map_err(|e| format!("write {name}@{offset}: {e}"))?;
                    progress[writer].store(index + 1, Ordering::SeqCst);
                }
                file.close().map_err(|e| format!("close {name}: {e}"))
            })
        })
        .collect();
    // Every writer a quarter of the way through, none finished: SIGKILL a server.
    let deadline = Instant::now() + Duration::from_secs(120);
    while progress.iter().any(|p| p.load(Ordering::SeqCst) < CHUNKS / 4) {
        if let Some(early) = writers.iter().position(|w| w.is_finished()) {
            let outcome = writers.remove(early).join();
            panic!("writer {early} stopped before the kill: {outcome:?}");
        }
        assert!(Instant::now() < deadline, "the writers did not get a quarter of the way");
        std::thread::sleep(Duration::from_millis(5));
    }
    let at_kill: Vec<usize> = progress.iter().map(|p| p.load(Ordering::SeqCst)).collect();
    let victim = cluster.servers[1].take().expect("server 1");
    for writer in 0..WRITERS {
        let placed = subfiles(&meta, &format!("/w{writer}"));
        let on_victim = placed.iter().flat_map(|s| &s.replicas).any(|r| r.1 == victim.addr);
        assert!(on_victim, "writer {writer}'s file has no replica on the server to be killed: {placed:?}");
    }
    victim.kill();
    eprintln!("server 1 killed with the writers at chunks {at_kill:?} of {CHUNKS}");
    assert!(at_kill.iter().all(|&n| n < CHUNKS), "a writer had finished before the kill: {at_kill:?}");
    for (writer, handle) in writers.into_iter().enumerate() {
        let outcome = handle.join().expect("writer thread");
        assert!(outcome.is_ok(), "writer {writer}: {outcome:?}");
    }
    for writer in 0..WRITERS {
        let back = cluster.dir.path().join(format!("out-{writer}.bin"));
        cli_ok(&["get", &format!("/w{writer}"), path(&back), "--meta", &meta]);
        let got = std::fs::read(&back).unwrap();
        assert_eq!(got.len(), CHUNKS * CHUNK_BYTES, "writer {writer}: length");
        for index in 0..CHUNKS {
            let range = index * CHUNK_BYTES..(index + 1) * CHUNK_BYTES;
            assert!(got[range] == chunk(writer, index)[..], "writer {writer}: chunk {index} differs");
        }
    }
}

/// Every chain of `flotilla status --chains`, as (chain, member states) — empty while the
/// table is not built.
fn chain_states(meta: &str) -> Vec<(u32, Vec<String>)> {
    let status = cli_ok(&["status", "--chains", "--meta", meta]);
    status
        .lines()
        .filter_map(|line| {
            let chain = status_field(line, "chain")?.parse().ok()?;
            let members = status_field(line, "members")?;
            Some((chain, members.split(',').map(str::to_string).collect()))
        })
        .collect()
}

/// Resync (issue 32): replicas=2 over three servers in three failure groups. Files are
/// written (one with a second fork), server 1 is SIGKILLed, the files are written past
/// (ranges overwritten, extended, one truncated, new files made), server 1 is restarted
/// on its target while a writer keeps overwriting one of its files; within 60 s every
/// chain must be fully serving again (its copy source copied it what it missed and
/// reported `SyncDone`). Then the two other servers are
/// SIGKILLed and every file with a replica on server 1 must read back byte for byte from
/// it alone.
#[test]
fn a_restarted_member_catches_up_and_then_serves_alone() {
    let groups = ["rack-a", "rack-b", "rack-c"];
    let mut cluster = cluster_in_groups(&groups);
    let meta = cluster.meta_addr();
    let client = cluster.client();
    const FILES: usize = 6;
    const FILE_BYTES: usize = (384 << 10) + 17;
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    for index in 0..FILES {
        let name = format!("/r{index}");
        let data = random_bytes(100 + index as u64, FILE_BYTES);
        let file = client.create(&name, &replicated(1, UNIT_BYTES)).expect("create");
        file.write_at(0, &data).expect("write");
        file.close().expect("close");
        expected.push((name, data));
    }
    let fork_data = random_bytes(999, 70_000);
    {
        let file = client.open("/r0").expect("open /r0");
        let fork = file.create_fork(0, "extra").expect("create fork");
        let length = fork_data.len() as u64;
        fork.write(&flotilla_request::Shape::contiguous(0, length), &fork_data).expect("fork write");
        file.close().expect("close");
    }
    let victim = cluster.servers[1].take().expect("server 1");
    let victim_addr = victim.addr.clone();
    victim.kill();
    // Written past while server 1 is down: overwrites, an extension, a truncation, new files.
    for (index, (name, data)) in expected.iter_mut().enumerate() {
        let file = client.open(name).expect("open");
        let patch = random_bytes(200 + index as u64, 5000 + index * 700);
        let offset = 1000 + index * 33_000;
        file.write_at(offset as u64, &patch).expect("overwrite");
        data[offset..offset + patch.len()].copy_from_slice(&patch);
        if index == 1 {
            let tail = random_bytes(300, 100_000);
            file.write_at(data.len() as u64, &tail).expect("extend");
            data.extend_from_slice(&tail);
        }
        if index == 2 {
            file.set_size(50_000).expect("truncate");
            data.truncate(50_000);
        }
        file.close().expect("close");
    }
    for index in FILES..FILES + 2 {
        let name = format!("/r{index}");
        let data = random_bytes(400 + index as u64, FILE_BYTES / 2);
        let file = client.create(&name, &replicated(1, UNIT_BYTES)).expect("create while a member is down");
        file.write_at(0, &data).expect("write");
        file.close().expect("close");
        expected.push((name, data));
    }
    // Which files have a replica on the killed member (as the metadata service places them).
    let on_victim: Vec<usize> = (0..expected.len())
        .filter(|&i| {
            subfiles(&meta, &expected[i].0)
                .iter()
                .flat_map(|s| &s.replicas)
                .any(|r| r.1 == victim_addr || r.2 != "serving")
        })
        .collect();
    assert!(on_victim.len() >= 3, "too few files placed on the killed member's chains: {on_victim:?}");
    let bytes: usize = on_victim.iter().map(|&i| expected[i].1.len()).sum::<usize>() + fork_data.len();
    // A writer keeps overwriting one of those files while the member returns and catches up
    // (the copy must not race with it: every write after the copy reaches the member too).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = on_victim[0];
    let writer = {
        let (client, stop) = (cluster.client(), stop.clone());
        let (name, mut data) = expected[live].clone();
        std::thread::spawn(move || -> Result<(Vec<u8>, usize), String> {
            let file = client.open(&name).map_err(|e| format!("open {name}: {e}"))?;
            let mut writes = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let patch = random_bytes(5000 + writes as u64, 8192);
                let offset = (writes * 8192 * 7) % (data.len() - patch.len());
                file.write_at(offset as u64, &patch).map_err(|e| format!("write {name}@{offset}: {e}"))?;
                data[offset..offset + patch.len()].copy_from_slice(&patch);
                writes += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            file.close().map_err(|e| format!("close {name}: {e}"))?;
            Ok((data, writes))
        })
    };
    let restarted_at = Instant::now();
    cluster.servers[1] = Some(cluster.start_server_in_group(1, groups[1]));
    let deadline = restarted_at + Duration::from_secs(60);
    loop {
        let states = chain_states(&meta);
        let all_serving =
            !states.is_empty() && states.iter().all(|(_, m)| m.iter().all(|s| s.ends_with(":serving")));
        if all_serving {
            break;
        }
        assert!(Instant::now() < deadline, "the chains did not all serve again within 60 s: {states:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = restarted_at.elapsed();
    eprintln!(
        "resync: every chain serving {} ms after the restart ({} files, at most {bytes} bytes on the member's chains)",
        took.as_millis(),
        on_victim.len()
    );
    // Some writes after the member serves again, then the writer stops.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (data, writes) = writer.join().expect("writer thread").expect("the writer during the resync");
    eprintln!("{writes} writes of 8 KiB to {} during the restart and resync", expected[live].0);
    expected[live].1 = data;
    // Server 1 alone: the other members of its chains are SIGKILLed.
    for index in [0, 2] {
        cluster.servers[index].take().expect("server").kill();
    }
    for &i in &on_victim {
        let (name, data) = &expected[i];
        let back = cluster.dir.path().join(format!("back{i}.bin"));
        let deadline = Instant::now() + SETTLE;
        let got = loop {
            let (ok, _, stderr) = cli(&["get", name, path(&back), "--meta", &meta]);
            if ok {
                break std::fs::read(&back).unwrap();
            }
            assert!(Instant::now() < deadline, "get {name} from the restarted member failed: {stderr}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(got.len(), data.len(), "{name}: length on the restarted member");
        assert!(got == *data, "{name}: the bytes on the restarted member differ");
    }
    if on_victim.contains(&0) {
        let file = client.open("/r0").expect("open /r0");
        let fork = file.fork(0, "extra").expect("the fork on the restarted member");
        let mut buffer = vec![0u8; fork_data.len()];
        let shape = flotilla_request::Shape::contiguous(0, fork_data.len() as u64);
        fork.read(&shape, &mut buffer).expect("fork read");
        assert!(buffer == fork_data, "the fork's bytes on the restarted member differ");
    }
}

/// Replica counts of every subfile of `file` (empty for a file of one copy: no chains).
fn replica_counts(meta: &str, file: &str) -> Vec<usize> {
    let stat = cli_ok(&["stat", file, "--meta", meta]);
    let lines: Vec<&str> = stat.lines().filter(|l| l.starts_with("subfile=")).collect();
    assert!(!lines.is_empty(), "{file} has no subfile: {stat}");
    lines.iter().filter_map(|l| status_field(l, "replicas")).map(|r| r.split(',').count()).collect()
}

/// Every subfile of `file` on a chain of two members.
fn assert_two_copies(meta: &str, file: &str) {
    let counts = replica_counts(meta, file);
    assert!(
        !counts.is_empty() && counts.iter().all(|&c| c == 2),
        "{file}: replicas per subfile {counts:?}, not all 2"
    );
}

/// A directory's default layout carries a replica count (`flotilla layout set DIR
/// stripe:64k:2,replicas=2`): files created in it without a count of their own, by the
/// library, `flotilla put` and the mount, and in a subdirectory made after, keep two
/// copies; cleared, new files keep one; files elsewhere keep one.
#[test]
fn a_directory_default_of_two_replicas_is_taken_by_its_files() {
    let cluster = cluster_in_groups(&["rack-a", "rack-b", "rack-c", "rack-d"]);
    let meta = cluster.meta_addr();
    let client = cluster.client();
    client.mkdir("/d", 0o755).expect("mkdir /d");
    let set = cli_ok(&["layout", "set", "/d", "stripe:64k:2,replicas=2", "--meta", &meta]);
    assert_eq!(set.trim(), "stripe:64K:2,replicas=2");
    let got = cli_ok(&["layout", "get", "/d", "--meta", &meta]);
    assert_eq!(got.trim(), "stripe:64K:2,replicas=2");
    assert!(cli_ok(&["stat", "/d", "--meta", &meta]).contains("default_layout=stripe:64K:2,replicas=2"));
    // A file cannot be given a replica count after its create.
    client.create("/plain", &CreateOptions::default()).expect("create /plain").close().expect("close");
    let (ok, _, stderr) = cli(&["layout", "set", "/plain", "stripe:64k:2,replicas=2", "--meta", &meta]);
    assert!(!ok && stderr.contains("replica count is chosen when it is created"), "{stderr}");

    // The library, with default create options.
    let data = random_bytes(11, 300_000);
    let file = client.create("/d/lib", &CreateOptions::default()).expect("create in /d");
    file.write_at(0, &data).expect("write");
    file.close().expect("close");
    assert_two_copies(&meta, "/d/lib");
    // `flotilla put` without --replicas.
    let local = cluster.dir.path().join("in.bin");
    std::fs::write(&local, &data).unwrap();
    cli_ok(&["put", path(&local), "/d/put", "--meta", &meta]);
    assert_two_copies(&meta, "/d/put");
    let back = cluster.dir.path().join("back.bin");
    cli_ok(&["get", "/d/put", path(&back), "--meta", &meta]);
    assert!(std::fs::read(&back).unwrap() == data, "the put file reads back other bytes");
    // A subdirectory made now inherits the default.
    client.mkdir("/d/sub", 0o755).expect("mkdir /d/sub");
    assert_eq!(cli_ok(&["layout", "get", "/d/sub", "--meta", &meta]).trim(), "stripe:64K:2,replicas=2");
    client.create("/d/sub/f", &CreateOptions::default()).expect("create in /d/sub").close().expect("close");
    assert_two_copies(&meta, "/d/sub/f");
    // Through the mount: a file made by a program, and the attribute read back.
    {
        let mount = common::Mount::start(&meta);
        std::fs::write(mount.path("d/m"), &data).expect("write through the mount");
        let value = xattr_text(&mount.path("d"), "user.flotilla.layout");
        assert_eq!(value, "stripe:64K:2,replicas=2");
        assert!(std::fs::read(mount.path("d/m")).unwrap() == data, "the mount reads other bytes");
    }
    assert_two_copies(&meta, "/d/m");
    // Elsewhere, and after clearing: one copy (no chain on the subfile lines).
    client.create("/other", &CreateOptions::default()).expect("create /other").close().expect("close");
    assert!(replica_counts(&meta, "/other").is_empty(), "a file outside /d has replicas");
    cli_ok(&["layout", "set", "/d", "none", "--meta", &meta]);
    client
        .create("/d/after", &CreateOptions::default())
        .expect("create after clearing")
        .close()
        .expect("close");
    assert!(replica_counts(&meta, "/d/after").is_empty(), "a file made after clearing has replicas");
}

/// An extended attribute's value as text (`getxattr(2)`).
fn xattr_text(file: &std::path::Path, name: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buffer = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and the buffer is as long as we say.
    let length =
        unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(length >= 0, "getxattr {}: {}", file.display(), std::io::Error::last_os_error());
    buffer.truncate(length as usize);
    String::from_utf8(buffer).expect("utf-8 attribute")
}

/// `flotilla local --replicas 2`: the root directory's default keeps two copies, so a file
/// put without a count is replicated (the three embedded servers each in their own failure
/// group); asking for more replicas than servers is refused naming both.
#[test]
fn flotilla_local_with_two_replicas_replicates_every_new_file() {
    let local = common::Local::start_with(&[], &["--servers", "3", "--replicas", "2"], false);
    let (ok, layout, stderr) = local.cli(&["layout", "get", "/"], &[]);
    assert!(ok, "{stderr}");
    assert_eq!(layout.trim(), "stripe:1M:0,replicas=2");
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(12, (2 << 20) + 99);
    let input = dir.path().join("in.bin");
    std::fs::write(&input, &data).unwrap();
    let (ok, _, stderr) = local.cli(&["put", path(&input), "/f"], &[]);
    assert!(ok, "put: {stderr}");
    let (ok, stat, stderr) = local.cli(&["stat", "/f"], &[]);
    assert!(ok, "{stderr}");
    let counts: Vec<usize> = stat
        .lines()
        .filter(|l| l.starts_with("subfile="))
        .map(|l| status_field(l, "replicas").map_or(1, |r| r.split(',').count()))
        .collect();
    assert!(!counts.is_empty() && counts.iter().all(|&c| c == 2), "{stat}");
    let output = dir.path().join("out.bin");
    let (ok, _, stderr) = local.cli(&["get", "/f", path(&output)], &[]);
    assert!(ok, "get: {stderr}");
    assert!(std::fs::read(&output).unwrap() == data, "the replicated file reads back other bytes");

    let refused = std::process::Command::new(common::FLOTILLA)
        .args(["local", "--servers", "2", "--replicas", "3", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .output()
        .expect("run flotilla local");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "three replicas on two servers started");
    assert!(stderr.contains("--replicas 3 needs at least 3 servers"), "{stderr}");
}
