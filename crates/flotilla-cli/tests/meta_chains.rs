//! Replicated files on a metadata group (issues 32 and 33): the chain table goes through the
//! group's log. Three `flotilla meta` nodes on loopback, four I/O servers in four failure
//! groups, one writer writing a replicas=2 file through the whole run:
//! - the metadata leader is SIGKILLed: the writer goes on, and the new leader serves the
//!   chain table the old one served;
//! - a server holding replicas of the file is SIGKILLed: the new leader fences it (the
//!   versions of its chains move) and the writer goes on without an error;
//! - every acknowledged byte reads back; `flotilla status --chains` asked of each node
//!   agrees, and the three nodes' databases, read after stopping them, hold equal chain
//!   tables.

mod common;

use common::metagroup::MetaGroup;
use common::replication::chain_lines;
use common::{cli_ok, path, random_bytes, server_args, status_field, Process};
use flotilla_client::CreateOptions;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Membership timings: a lease of 1 s, fencing after 3 s of silence (more than the lease
/// plus the clock margin, as the engine requires); dead only after the test ends.
const MEMBERSHIP: &str =
    "lease_ms = 1000\nclock_margin_ms = 500\nfence_after_ms = 3000\nchains_per_target = 2\n";
const CHUNK_BYTES: usize = 256 << 10;
/// Most chunks the writer writes (a bound on the run, far above what it needs).
const CHUNKS_MAX: usize = 4096;
/// Bound on each wait of the test (an election, a fence, progress of the writer).
const WAIT: Duration = Duration::from_secs(40);

fn chunk(index: usize) -> Vec<u8> {
    random_bytes(index as u64 + 3300, CHUNK_BYTES)
}

fn until<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    common::replication::until(what, WAIT, probe)
}

fn start_server(group: &MetaGroup, index: usize) -> Process {
    let dir = group.dir.path().join(format!("target-{index}"));
    std::fs::create_dir_all(&dir).expect("target folder");
    let (config, meta) = (group.dir.path().join("flotilla.toml"), group.addresses());
    let args = server_args(&config, &meta, &dir, "127.0.0.1:0", &format!("rack-{index}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let quiet = [("FLOTILLA_LOG".to_string(), "error".to_string())];
    Process::start_with_env(&args, "server", &quiet).expect("start server")
}

/// The servers, SIGKILLed when the test ends (also when it fails).
struct Servers(Vec<Option<Process>>);

impl Drop for Servers {
    fn drop(&mut self) {
        for server in self.0.iter_mut() {
            if let Some(server) = server.take() {
                server.kill();
            }
        }
    }
}

#[test]
fn a_replicated_writer_outlives_a_metadata_leader_kill_and_a_fenced_server() {
    // The nodes read `[meta]`, the servers `[server]` of one file (heartbeats every 200 ms).
    let key = common::server_key();
    let toml = format!("heartbeat_ms = 200\ndown_after_ms = 1000\n{MEMBERSHIP}\n[server]\nheartbeat_ms = 200\nkey = {key:?}\n");
    let mut group = MetaGroup::loopback_configured(3, &[], &toml);
    let metas = group.addresses();
    let mut servers = Servers((0..4).map(|i| Some(start_server(&group, i))).collect());
    // Phase: the leader builds the chain table once the four groups reported.
    let deadline = Instant::now() + WAIT;
    let built = loop {
        let lines = chain_lines(&metas);
        if !lines.is_empty() {
            break lines;
        }
        if Instant::now() > deadline {
            for node in &group.nodes {
                let log = node.log_text();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                eprintln!("node {} log tail: {tail:#?}", node.id);
            }
            panic!("no chain table within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("chain table built: {} chains", built.len());

    // Phase: a writer writes a replicas=2 file of two subfiles, chunk after chunk.
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let client = common::client_at(&metas);
    let layout = flotilla_types::Layout::Stripe { unit_bytes: 64 << 10, count: 2 };
    let options =
        CreateOptions { subfiles: 2, layout: Some(layout), replicas: 2, ..CreateOptions::default() };
    let file = client.create("/w", &options).expect("a replicated create on the group");
    eprintln!("phase: /w created on the group");
    let writer = {
        let (written, stop) = (written.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(), String> {
            for index in 0..CHUNKS_MAX {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let offset = (index * CHUNK_BYTES) as u64;
                file.write_at(offset, &chunk(index)).map_err(|e| format!("write @{offset}: {e}"))?;
                written.store(index + 1, Ordering::SeqCst);
            }
            file.close().map_err(|e| format!("close: {e}"))
        })
    };
    let progressed = |from: usize, what: &str| {
        until(what, || {
            assert!(!writer_finished(&stop, &written), "the writer stopped early");
            (written.load(Ordering::SeqCst) >= from + 4).then_some(())
        })
    };
    progressed(0, "the writer's first chunks");
    eprintln!("phase: the writer wrote its first chunks");

    // Phase: SIGKILL the metadata leader; a new one serves the same chain table and the
    // writer goes on.
    let leader = group.leader();
    let before = chain_lines(&group.nodes[leader].meta.clone());
    assert!(!before.is_empty());
    let at_kill = written.load(Ordering::SeqCst);
    let killed_at = Instant::now();
    group.nodes[leader].kill();
    let next = group.leader();
    assert_ne!(next, leader);
    let after = chain_lines(&group.nodes[next].meta.clone());
    eprintln!("new leader node {} serving after {:?}", group.nodes[next].id, killed_at.elapsed());
    assert_eq!(after, before, "the new leader's chain table is the old one's");
    progressed(at_kill, "the writer after the leader's kill");
    eprintln!("phase: the writer went on after the leader's kill");
    group.nodes[leader].start();

    // Phase: SIGKILL a server holding a replica: the leader fences it (its chains move to a
    // higher version with it offline) and the writer goes on.
    let victim = servers.0[1].take().expect("server 1");
    let victim_target = until("server 1's target in the status", || {
        let status = cli_ok(&["status", "--meta", &metas]);
        status
            .lines()
            .find(|l| status_field(l, "server") == Some(victim.addr.as_str()))
            .and_then(|l| status_field(l, "target"))
            .map(str::to_string)
    });
    let holding: Vec<String> = before.iter().filter(|l| l.contains(&victim_target)).cloned().collect();
    assert!(!holding.is_empty(), "target {victim_target} holds no chain: {before:?}");
    let at_server_kill = written.load(Ordering::SeqCst);
    victim.kill();
    let fenced = until("the dead server's chains to move", || {
        let now = chain_lines(&metas);
        let moved = holding.iter().all(|old| {
            let chain = status_field(old, "chain");
            let old_version: u64 = status_field(old, "version").and_then(|v| v.parse().ok()).unwrap();
            now.iter().any(|l| {
                status_field(l, "chain") == chain
                    && status_field(l, "version").and_then(|v| v.parse::<u64>().ok()).unwrap() > old_version
            })
        });
        moved.then_some(now)
    });
    eprintln!("fenced: {fenced:?}");
    progressed(at_server_kill, "the writer after the server's kill");
    eprintln!("phase: the writer went on after the server's kill");

    // Phase: the writer stops; everything it was acknowledged reads back.
    stop.store(true, Ordering::SeqCst);
    let outcome = writer.join().expect("writer thread");
    eprintln!("phase: the writer stopped: {outcome:?}");
    assert!(outcome.is_ok(), "writer: {outcome:?}");
    let chunks = written.load(Ordering::SeqCst);
    let back = group.dir.path().join("back.bin");
    cli_ok(&["get", "/w", path(&back), "--meta", &metas]);
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), chunks * CHUNK_BYTES, "length of {chunks} chunks");
    for index in 0..chunks {
        let range = index * CHUNK_BYTES..(index + 1) * CHUNK_BYTES;
        assert!(got[range] == chunk(index)[..], "chunk {index} differs");
    }
    eprintln!("{chunks} chunks of {CHUNK_BYTES} bytes written and read back");

    // Phase: each node agrees, asked and from its own database once stopped.
    let agreed = chain_lines(&metas);
    for node in &group.nodes {
        assert_eq!(chain_lines(&node.meta), agreed, "status --chains through node {}", node.id);
    }
    // The nodes stop before the servers, so no fence is decided while they stop (a leader
    // elected meanwhile gives every target a fresh lease of fence_after_ms).
    std::thread::sleep(Duration::from_secs(1));
    for node in &mut group.nodes {
        node.stop();
    }
    for server in servers.0.iter_mut() {
        if let Some(server) = server.take() {
            server.kill();
        }
    }
    let tables: Vec<_> = group
        .nodes
        .iter()
        .map(|node| {
            let ns = flotilla_namespace::Namespace::open(&node.data.join("namespace.redb")).expect("open");
            ns.chain_table().expect("chain table")
        })
        .collect();
    assert!(!tables[0].chains.is_empty());
    assert_eq!(tables[0], tables[1], "nodes 1 and 2 hold different chain tables");
    assert_eq!(tables[1], tables[2], "nodes 2 and 3 hold different chain tables");
}

fn writer_finished(stop: &AtomicBool, written: &AtomicUsize) -> bool {
    !stop.load(Ordering::SeqCst) && written.load(Ordering::SeqCst) >= CHUNKS_MAX
}
