//! Issue 32's partition test: the metadata service and four I/O servers, each in its own
//! network namespace with its own address (`common/netns.rs`), four writers (library
//! clients in the test's namespace, reaching the hosts over the bridge) overwriting
//! `replicas=2` files. One server host's link goes down mid-write (a partition: the
//! process keeps running and keeps its data):
//!
//! - the writers go on and every close succeeds; the longest write after the cut (the
//!   writer's stall) is printed, never asserted;
//! - inside the cut-off host, its member answers no read with bytes older than the last
//!   acknowledged write (it refuses: its lease ran out and its chains moved on);
//! - the link comes back: until it serves again, every read of it (direct, at the old
//!   and the current chain version) and every read through a client returns the last
//!   acknowledged bytes or is refused; within a bounded time every chain serves again, and
//!   then the member alone holds the last acknowledged bytes.
//!
//! Needs root and iproute2; says why and does nothing otherwise.

mod common;

use bytes::Bytes;
use common::netns::Netns;
use common::{
    cli, cli_ok, client_key, path, random_bytes, server_args, server_key, status_field, Process, FLOTILLA,
};
use flotilla_client::CreateOptions;
use flotilla_proto::{ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, Layout, SubfileIndex, TargetId};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms); `fence_after_ms > lease_ms +
/// clock_margin_ms` holds.
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Bound on every wait for the cluster (generous: a loaded 2-core machine).
const SETTLE: Duration = Duration::from_secs(90);
const SERVERS: usize = 4;
const WRITERS: usize = 4;
/// Each writer overwrites `SLOTS` slots of `CHUNK_BYTES` in turn, `WRITES` times in all.
const CHUNK_BYTES: usize = 256 << 10;
const SLOTS: usize = 8;
const WRITES: usize = 48;
const UNIT_BYTES: u64 = 64 << 10;
const SUBFILES: u32 = 2;

/// Every process of the test, SIGKILLed when it ends (passed or not), before the
/// namespaces are removed (declared after them).
struct Hosts(Vec<Option<Process>>);

impl Drop for Hosts {
    fn drop(&mut self) {
        for process in self.0.iter_mut().filter_map(Option::take) {
            process.kill();
        }
    }
}

/// Starts `flotilla ARGS` in host `host`'s namespace and waits for its `KEY=ADDR` line.
fn start_in(netns: &Netns, host: usize, args: &[&str], key: &str) -> Process {
    let mut child = Command::new("ip")
        .args(netns.exec_prefix(host))
        .arg(FLOTILLA)
        .args(args)
        .env("FLOTILLA_KEY", client_key())
        .env("FLOTILLA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn flotilla in a namespace");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read its first line");
    match line.trim().strip_prefix(&format!("{key}=")) {
        Some(addr) => Process { child, addr: addr.to_string(), credential: None },
        None => {
            let _ = child.kill();
            let status = child.wait();
            panic!("flotilla {args:?} in host {host} printed {line:?} and exited: {status:?}")
        }
    }
}

/// One replicated subfile of `flotilla stat`: (chain, version, members as (target, server)).
type Placed = (u32, u64, Vec<(TargetId, String)>);

fn placed(meta: &str, file: &str) -> Vec<Placed> {
    cli_ok(&["stat", file, "--meta", meta])
        .lines()
        .filter(|l| l.starts_with("subfile="))
        .map(|l| {
            let members = status_field(l, "replicas")
                .unwrap_or_else(|| panic!("no replicas on {l:?}"))
                .split(',')
                .map(|r| {
                    let (target, rest) = r.split_once('@').expect("target@server");
                    let (host, rest) = rest.split_once(':').expect("host:port");
                    let (port, _state) = rest.split_once(':').expect("port:state");
                    let target = u64::from_str_radix(target, 16).expect("a target id in hex");
                    (TargetId(target), format!("{host}:{port}"))
                })
                .collect();
            let chain = status_field(l, "chain").and_then(|c| c.parse().ok()).expect("chain");
            let version = status_field(l, "version").and_then(|v| v.parse().ok()).expect("version");
            (chain, version, members)
        })
        .collect()
}

/// Every chain of `flotilla status --chains` with its member states.
fn chain_states(meta: &str) -> Vec<(u32, u64, Vec<String>)> {
    let (ok, stdout, _) = cli(&["status", "--chains", "--meta", meta]);
    if !ok {
        return Vec::new();
    }
    stdout
        .lines()
        .filter_map(|line| {
            let chain = status_field(line, "chain")?.parse().ok()?;
            let version = status_field(line, "version").and_then(|v| v.parse().ok()).unwrap_or(0);
            let members = status_field(line, "members")?;
            Some((chain, version, members.split(',').map(str::to_string).collect()))
        })
        .collect()
}

fn options() -> CreateOptions {
    let layout = Layout::Stripe { unit_bytes: UNIT_BYTES, count: SUBFILES };
    CreateOptions { subfiles: SUBFILES, layout: Some(layout), replicas: 2, ..CreateOptions::default() }
}

/// Write `index` of writer `writer`: its bytes (slot `index % SLOTS`).
fn chunk(writer: usize, index: usize) -> Vec<u8> {
    random_bytes((writer * 10_000 + index) as u64, CHUNK_BYTES)
}

/// The file writer `writer` leaves: each slot holds its last write.
fn final_bytes(writer: usize) -> Vec<u8> {
    let mut out = vec![0u8; SLOTS * CHUNK_BYTES];
    for index in WRITES - SLOTS..WRITES {
        let slot = index % SLOTS;
        out[slot * CHUNK_BYTES..(slot + 1) * CHUNK_BYTES].copy_from_slice(&chunk(writer, index));
    }
    out
}

/// Which write each slot of `got` holds where it differs from the last acknowledged bytes.
fn explain(writer: usize, got: &[u8]) -> String {
    let want = final_bytes(writer);
    let mut out = Vec::new();
    for slot in 0..SLOTS {
        let range = slot * CHUNK_BYTES..(slot + 1) * CHUNK_BYTES;
        if got[range.clone()] == want[range.clone()] {
            continue;
        }
        let first = range.clone().find(|&i| got[i] != want[i]).unwrap_or(range.start);
        let held =
            (0..WRITES).filter(|i| i % SLOTS == slot).find(|&i| got[range.clone()] == chunk(writer, i)[..]);
        out.push(format!("slot {slot} differs from byte {first}, holds write {held:?}"));
    }
    out.join("; ")
}

/// The bytes subfile `subfile` of a file holding `file` keeps (striped by `options()`).
fn subfile_bytes(file: &[u8], subfile: u32) -> Vec<u8> {
    let layout = Layout::Stripe { unit_bytes: UNIT_BYTES, count: SUBFILES };
    let mut out = Vec::new();
    let mut offset = 0u64;
    while offset < file.len() as u64 {
        let (index, at, run) = layout.locate(FileId(0), SUBFILES, offset).expect("locate");
        let end = (offset + run).min(file.len() as u64);
        if index == subfile {
            assert_eq!(at, out.len() as u64, "stripe units in order");
            out.extend_from_slice(&file[offset as usize..end as usize]);
        }
        offset = end;
    }
    out
}

/// A chained read of a whole subfile straight from one member, with the server
/// credential (trusted bare): `Some(bytes)` when it served it, `None` when it refused or
/// could not be reached within a few seconds.
fn read_member(
    member: &str,
    (chain, version): (u32, u64),
    fork: ForkRef,
    length: usize,
) -> Result<Option<Vec<u8>>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let request = IoRequest::Chained {
            chain,
            version,
            request: Box::new(IoRequest::Read { fork, shape: Shape::contiguous(0, length as u64) }),
        };
        let config = common::connection_config_with(&server_key());
        let call = async {
            let connection = Connection::connect(member, config).await.map_err(|e| e.to_string())?;
            connection.call::<IoRequest, IoReply>(&request, Bytes::new()).await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(5), call).await {
            Err(_) | Ok(Err(_)) => Ok(None),
            Ok(Ok((IoReply::Data, data))) => Ok(Some(data.to_vec())),
            Ok(Ok((IoReply::ForwardRefused(_), _))) | Ok(Ok((IoReply::Error(_), _))) => Ok(None),
            Ok(Ok((other, _))) => Err(format!("{member} answered a read with {other:?}")),
        }
    })
}

#[test]
fn a_partitioned_server_never_serves_old_bytes_and_catches_up() {
    if let Err(why) = Netns::usable() {
        println!("skipped: {why}");
        return;
    }
    let netns = Netns::create(1 + SERVERS).expect("make the network namespaces");
    let dir = tempfile::tempdir().expect("temporary folder");
    let key = server_key();
    let config = dir.path().join("flotilla.toml");
    let text = format!(
        "[meta]\nheartbeat_ms = 200\ndown_after_ms = 1000\nkey = {key:?}\n{MEMBERSHIP}\n\
         [server]\nheartbeat_ms = 200\nkey = {key:?}\n\n[client]\nkey = {:?}\n",
        client_key()
    );
    std::fs::write(&config, text).expect("write the config");
    let mut hosts = Hosts(Vec::new());
    let data = dir.path().join("meta");
    let listen = format!("{}:0", netns.address(0));
    let meta_args = ["--config", path(&config), "meta", "--data", path(&data), "--listen", &listen];
    hosts.0.push(Some(start_in(&netns, 0, &meta_args, "meta")));
    let meta = hosts.0[0].as_ref().expect("meta").addr.clone();
    for host in 1..=SERVERS {
        let target = dir.path().join(format!("target-{host}"));
        std::fs::create_dir_all(&target).expect("target folder");
        let (listen, group) = (format!("{}:0", netns.address(host)), format!("host-{host}"));
        let args = server_args(&config, &meta, &target, &listen, &group);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        hosts.0.push(Some(start_in(&netns, host, &args, "server")));
    }
    let deadline = Instant::now() + SETTLE;
    while !cli(&["status", "--chains", "--meta", &meta]).1.contains("chain=") {
        assert!(Instant::now() < deadline, "the chain table was not built over the four hosts");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The writers create their files first, so the host to cut can be one holding a replica
    // of as many of them as possible.
    let probe = common::client_at(&meta);
    for writer in 0..WRITERS {
        probe
            .create(&format!("/w{writer}"), &options())
            .expect("a replicated create")
            .close()
            .expect("close");
    }
    let servers: Vec<String> =
        (1..=SERVERS).map(|h| hosts.0[h].as_ref().expect("server").addr.clone()).collect();
    let places: Vec<Vec<Placed>> = (0..WRITERS).map(|w| placed(&meta, &format!("/w{w}"))).collect();
    let on = |server: &str| {
        places.iter().filter(|file| file.iter().any(|(_, _, m)| m.iter().any(|(_, s)| s == server))).count()
    };
    let victim = (0..SERVERS).max_by_key(|&i| on(&servers[i])).expect("a server");
    let victim_addr = servers[victim].clone();
    let victim_host = victim + 1;
    println!(
        "cutting host {victim_host} ({victim_addr}), holding replicas of {} of the files",
        on(&victim_addr)
    );

    let progress: Arc<Vec<AtomicUsize>> = Arc::new((0..WRITERS).map(|_| AtomicUsize::new(0)).collect());
    let cut_at: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let mut writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (meta, progress, cut_at) = (meta.clone(), progress.clone(), cut_at.clone());
            std::thread::spawn(move || -> Result<Duration, String> {
                let client = common::client_at(&meta);
                let name = format!("/w{writer}");
                let file = client.open(&name).map_err(|e| format!("open {name}: {e}"))?;
                // The longest write (or close) that ended after the cut.
                let mut stall = Duration::ZERO;
                for index in 0..WRITES {
                    let offset = ((index % SLOTS) * CHUNK_BYTES) as u64;
                    let started = Instant::now();
                    file.write_at(offset, &chunk(writer, index))
                        .map_err(|e| format!("write {name}@{offset} (write {index}): {e}"))?;
                    if cut_at.get().is_some() {
                        stall = stall.max(started.elapsed());
                    }
                    progress[writer].store(index + 1, Ordering::SeqCst);
                }
                let started = Instant::now();
                file.close().map_err(|e| format!("close {name}: {e}"))?;
                Ok(stall.max(started.elapsed()))
            })
        })
        .collect();
    let deadline = Instant::now() + SETTLE;
    while progress.iter().any(|p| p.load(Ordering::SeqCst) < WRITES / 4) {
        if let Some(early) = writers.iter().position(|w| w.is_finished()) {
            let outcome = writers.remove(early).join();
            panic!("writer {early} stopped before the cut: {outcome:?}");
        }
        assert!(Instant::now() < deadline, "the writers did not get a quarter of the way");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The partition: the victim's link goes down; the server process keeps running.
    netns.link_down(victim_host).expect("link down");
    let _ = cut_at.set(Instant::now());
    let at_cut: Vec<usize> = progress.iter().map(|p| p.load(Ordering::SeqCst)).collect();
    println!("link of host {victim_host} down with the writers at writes {at_cut:?} of {WRITES}");
    assert!(at_cut.iter().all(|&n| n < WRITES), "a writer had finished before the cut: {at_cut:?}");
    let mut stalls = Vec::new();
    for (writer, handle) in writers.into_iter().enumerate() {
        let outcome = handle.join().expect("writer thread");
        match outcome {
            Ok(stall) => stalls.push(stall),
            Err(error) => panic!("writer {writer} during the partition: {error}"),
        }
    }
    let closed_after = cut_at.get().expect("cut").elapsed();
    stalls.sort();
    println!(
        "every writer closed {closed_after:?} after the cut; longest write or close after the cut per writer: {stalls:?} (median {:?}, worst {:?})",
        stalls[WRITERS / 2],
        stalls[WRITERS - 1]
    );

    // What the victim's member must never serve: anything but the last acknowledged bytes.
    // Each (file, subfile) with a replica on the victim: (version before the cut, chain, fork, bytes).
    let mut checks = Vec::new();
    for (writer, file) in places.iter().enumerate() {
        let id = probe.stat(&format!("/w{writer}")).expect("stat").id;
        let expected = final_bytes(writer);
        for (subfile, (chain, version, members)) in file.iter().enumerate() {
            let Some((target, _)) = members.iter().find(|(_, s)| *s == victim_addr) else { continue };
            let fork = ForkRef {
                target: *target,
                file: FileId(id),
                subfile: SubfileIndex(subfile as u32),
                fork: "data".into(),
            };
            checks.push((*chain, *version, fork, subfile_bytes(&expected, subfile as u32)));
        }
    }
    assert!(!checks.is_empty(), "no subfile has a replica on the cut-off host");
    let check_member = |when: &str, current: &dyn Fn(u32) -> Option<u64>| -> usize {
        let mut served = 0;
        for (chain, before, fork, bytes) in &checks {
            let mut versions = vec![*before];
            versions.extend(current(*chain).filter(|v| v != before));
            for version in versions {
                let got = read_member(&victim_addr, (*chain, version), fork.clone(), bytes.len())
                    .unwrap_or_else(|e| panic!("{when}: {e}"));
                if let Some(got) = got {
                    assert!(
                        got == *bytes,
                        "{when}: the cut-off member served chain {chain} v{version} with bytes older than the last acknowledged write"
                    );
                    served += 1;
                }
            }
        }
        served
    };
    // Inside the cut-off host (its own address is reachable there), after the writers were
    // acknowledged without it.
    let (victim_checks, victim_addr_in) = (checks.clone(), victim_addr.clone());
    let served_inside = netns.run_in(victim_host, move || {
        let mut served = 0;
        for (chain, before, fork, bytes) in &victim_checks {
            if let Some(got) = read_member(&victim_addr_in, (*chain, *before), fork.clone(), bytes.len())
                .expect("a read inside the cut-off host")
            {
                assert!(got == *bytes, "the cut-off member served chain {chain} v{before} with old bytes");
                served += 1;
            }
        }
        served
    });
    println!(
        "inside the partition the member served {served_inside} of {} reads (all refused is expected)",
        checks.len()
    );

    // The link returns: the member is read directly and through clients until it serves again.
    netns.link_up(victim_host).expect("link up");
    let healed_at = Instant::now();
    let current = |chain: u32| chain_states(&meta).into_iter().find(|c| c.0 == chain).map(|c| c.1);
    let deadline = healed_at + SETTLE;
    let mut rounds = 0;
    loop {
        check_member("while catching up", &current);
        let reader = common::client_at(&meta);
        for writer in 0..WRITERS {
            let name = format!("/w{writer}");
            let file = reader.open(&name).unwrap_or_else(|e| panic!("open {name} after the heal: {e}"));
            let mut got = vec![0u8; SLOTS * CHUNK_BYTES];
            let read =
                file.read_at(0, &mut got).unwrap_or_else(|e| panic!("read {name} after the heal: {e}"));
            assert_eq!(read, got.len(), "{name}: short read after the heal");
            if got != final_bytes(writer) {
                panic!(
                    "{name}: a client read bytes other than the last acknowledged: {}",
                    explain(writer, &got)
                );
            }
        }
        rounds += 1;
        let states = chain_states(&meta);
        if !states.is_empty() && states.iter().all(|(_, _, m)| m.iter().all(|s| s.ends_with(":serving"))) {
            break;
        }
        assert!(Instant::now() < deadline, "the cut-off host did not catch up within {SETTLE:?}: {states:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "every chain serving again {:?} after the link came back ({rounds} rounds of reads)",
        healed_at.elapsed()
    );
    // Serving again: the member alone holds the last acknowledged bytes.
    let served = check_member("serving again", &current);
    let versions: usize =
        checks.iter().map(|(chain, before, _, _)| 1 + usize::from(current(*chain) != Some(*before))).sum();
    assert!(served >= checks.len(), "the member serves again but answered {served} of {versions} reads");
}
