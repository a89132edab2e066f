//! Rebuild after permanent loss and drain (issue 32), with real processes: one `flotilla
//! meta` and four `flotilla server`s in four failure groups, files with `replicas=2`.
//!
//! - Disk loss: a server holding replicas is SIGKILLed, its target folder deleted, and it
//!   is started again on a fresh empty folder (a new target). Every file reads back byte for
//!   byte all along (a reader loops over them); the lost target is declared dead after
//!   `dead_after_ms` (short here), each of its chains gets a replacement member copied whole
//!   by the surviving member, and every chain is back to two serving members — checked by
//!   asking each member's server directly for the subfile's bytes.
//! - Drain: `flotilla target drain` of a target holding replicas: every chain leaves it
//!   with two serving members elsewhere, the data intact on each; unknown targets and a
//!   read-only credential are refused by name.

mod common;

use bytes::Bytes;
use common::replication::{replicated, wait_until};
use common::{cli, cli_ok, random_bytes, server_key, status_field, Cluster};
use flotilla_client::Client;
use flotilla_proto::{ChainMemberState, ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_rpc::Connection;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms) and a short `dead_after_ms`, so a
/// lost target is replaced within seconds.
const MEMBERSHIP: &str = "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\n\
                          dead_after_ms = 2500\nchains_per_target = 2\nchain_replicas = 2\n";
const GROUPS: [&str; 4] = ["rack-a", "rack-b", "rack-c", "rack-d"];
/// Bound on a rebuild or drain of the test's few megabytes (copies run at the default
/// `resync_bytes_per_s`).
const SETTLE: Duration = Duration::from_secs(60);
const UNIT_BYTES: u64 = 64 << 10;
const FILES: usize = 6;

fn cluster() -> Cluster {
    cluster_with("")
}

/// `cluster` with `server_extra` added to every server's `[server]` table.
fn cluster_with(server_extra: &str) -> Cluster {
    Cluster::start_in_groups(MEMBERSHIP, server_extra, &GROUPS, SETTLE)
}

/// Files of one or two subfiles (stripes of 64 KiB), with two replicas each.
fn put_files(client: &Client) -> Vec<(String, Vec<u8>)> {
    (0..FILES)
        .map(|index| {
            let name = format!("/f{index}");
            let options = replicated(1 + (index % 2) as u32, UNIT_BYTES);
            let data = random_bytes(500 + index as u64, (1 << 20) + 4321 * index);
            let file = client.create(&name, &options).expect("create");
            file.write_at(0, &data).expect("write");
            file.close().expect("close");
            (name, data)
        })
        .collect()
}

/// The bytes subfile `index` of `count` holds of `data` striped in `UNIT_BYTES` units.
fn subfile_bytes(data: &[u8], count: usize, index: usize) -> Vec<u8> {
    data.chunks(UNIT_BYTES as usize).skip(index).step_by(count).flatten().copied().collect()
}

/// Reads the whole file through the library.
fn read_all(client: &Client, name: &str, size: usize) -> Result<Vec<u8>, String> {
    let file = client.open(name).map_err(|e| format!("open {name}: {e}"))?;
    let mut out = vec![0u8; size];
    let read = file.read_at(0, &mut out).map_err(|e| format!("read {name}: {e}"))?;
    out.truncate(read);
    Ok(out)
}

/// A reader looping over every file until stopped; returns (passes, failures).
fn reader(
    client: Client,
    files: Vec<(String, Vec<u8>)>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut passes, mut failures) = (0, Vec::new());
        while !stop.load(Ordering::SeqCst) {
            for (name, data) in &files {
                match read_all(&client, name, data.len()) {
                    Ok(got) if got == *data => {}
                    Ok(got) => {
                        failures.push(format!("{name}: {} bytes read, not the bytes written", got.len()))
                    }
                    Err(error) => failures.push(error),
                }
            }
            passes += 1;
        }
        (passes, failures)
    })
}

/// One request to a server with the server credential (a bare, trusted read of a target).
fn ask(
    runtime: &tokio::runtime::Runtime,
    server: &str,
    request: &IoRequest,
) -> Result<(IoReply, Vec<u8>), String> {
    runtime.block_on(async {
        let config = common::connection_config_with(&server_key());
        let connection =
            Connection::connect(server, config).await.map_err(|e| format!("connect {server}: {e}"))?;
        let (reply, data) = connection
            .call::<IoRequest, IoReply>(request, Bytes::new())
            .await
            .map_err(|e| format!("call {server}: {e}"))?;
        Ok((reply, data.to_vec()))
    })
}

/// Every subfile of every file has exactly two members in its chain, both serving, none of
/// them `gone`, and each member's server holds the subfile's bytes exactly (data fork size
/// and contents). Returns the problems found (empty: all good). `client` must be fresh: a
/// client caches entries, chains included.
fn check_replicas(client: &Client, files: &[(String, Vec<u8>)], gone: TargetId) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut problems = Vec::new();
    for (name, data) in files {
        let entry = match client.stat(name) {
            Ok(entry) => entry,
            Err(error) => {
                problems.push(format!("stat {name}: {error}"));
                continue;
            }
        };
        let count = entry.subfiles.len();
        for (index, place) in entry.subfiles.iter().enumerate() {
            let Some(chain) = &place.chain else {
                problems.push(format!("{name} subfile {index}: no chain"));
                continue;
            };
            let serving: Vec<_> = chain
                .members
                .iter()
                .filter(|m| m.state == ChainMemberState::Serving && m.target != gone)
                .collect();
            if serving.len() != 2 || chain.members.len() != 2 {
                problems.push(format!(
                    "{name} subfile {index}: chain {} members {:?}",
                    chain.chain, chain.members
                ));
                continue;
            }
            let expected = subfile_bytes(data, count, index);
            for member in serving {
                let fork = ForkRef {
                    target: member.target,
                    file: FileId(entry.id),
                    subfile: SubfileIndex(index as u32),
                    fork: "data".into(),
                };
                let list =
                    IoRequest::ListForks { target: member.target, file: fork.file, subfile: fork.subfile };
                let size = match ask(&runtime, &member.server, &list) {
                    Ok((IoReply::Forks(forks), _)) => {
                        forks.iter().find(|f| f.name == "data").map(|f| f.size_bytes)
                    }
                    other => {
                        problems.push(format!("{name}/{index} on {}: list forks: {other:?}", member.target));
                        continue;
                    }
                };
                if size != Some(expected.len() as u64) {
                    problems.push(format!(
                        "{name}/{index} on {}: data fork of {size:?} bytes, {} expected",
                        member.target,
                        expected.len()
                    ));
                    continue;
                }
                let read = IoRequest::Read { fork, shape: Shape::contiguous(0, expected.len() as u64) };
                match ask(&runtime, &member.server, &read) {
                    Ok((IoReply::Data, got)) if got == expected => {}
                    Ok((IoReply::Data, _)) => {
                        problems.push(format!("{name}/{index} on {}: other bytes", member.target))
                    }
                    other => problems.push(format!("{name}/{index} on {}: read: {other:?}", member.target)),
                }
            }
        }
    }
    problems
}

/// The target of a replica of `name`'s subfile 0 that is not its chain's head, and the
/// index of its server in `cluster`.
fn victim_of(cluster: &Cluster, client: &Client, name: &str) -> (TargetId, usize) {
    let entry = client.stat(name).expect("stat");
    let chain = entry.subfiles[0].chain.clone().expect("a replicated subfile");
    let member = chain.members.last().expect("a member").clone();
    let index = cluster
        .servers
        .iter()
        .position(|s| s.as_ref().is_some_and(|p| p.addr == member.server))
        .expect("the member's server is one of the cluster's");
    (member.target, index)
}

/// The summary line of `flotilla status` (`chains=… rebuilding=… rebuild_bytes_left=…`).
fn summary(meta: &str) -> String {
    let status = cli_ok(&["status", "--meta", meta]);
    status.lines().find(|l| l.starts_with("chains=")).unwrap_or_default().to_string()
}

/// The `health=` a target's status line shows.
fn health(meta: &str, target: TargetId) -> Option<String> {
    let status = cli_ok(&["status", "--meta", meta]);
    let wanted = target.to_string();
    let line = status.lines().find(|l| status_field(l, "target") == Some(wanted.as_str()))?;
    status_field(line, "health").map(str::to_string)
}

/// Chains of `flotilla status --chains` that still list `target`.
fn chains_with(meta: &str, target: TargetId) -> BTreeSet<u32> {
    let status = cli_ok(&["status", "--chains", "--meta", meta]);
    let wanted = target.to_string();
    status
        .lines()
        .filter(|l| l.starts_with("chain="))
        .filter(|l| status_field(l, "members").unwrap_or_default().split(',').any(|m| m.starts_with(&wanted)))
        .filter_map(|l| status_field(l, "chain")?.parse().ok())
        .collect()
}

#[test]
fn a_lost_disk_is_rebuilt_to_two_serving_replicas_while_every_file_reads_back() {
    let mut cluster = cluster();
    let (meta, client) = (cluster.meta_addr(), cluster.client());
    let files = put_files(&client);
    let (lost, index) = victim_of(&cluster, &client, &files[0].0);
    let holding = chains_with(&meta, lost);
    assert!(!holding.is_empty(), "target {lost} is in no chain");

    let stop = Arc::new(AtomicBool::new(false));
    let reading = reader(cluster.client(), files.clone(), stop.clone());
    // The disk is lost: SIGKILL, its folder deleted, the server started on an empty one.
    cluster.servers[index].take().expect("running").kill();
    let dir = cluster.target_dir(index);
    std::fs::remove_dir_all(&dir).expect("delete the target folder");
    let lost_at = Instant::now();
    cluster.servers[index] = Some(cluster.start_server_in_group(index, GROUPS[index]));

    wait_until("the lost target declared dead", SETTLE, || health(&meta, lost).as_deref() == Some("dead"));
    let dead_after = lost_at.elapsed();
    let mut rebuilding_seen = false;
    let mut bytes_seen = 0u64;
    wait_until("every chain to leave the lost target and serve two replicas", SETTLE, || {
        let line = summary(&meta);
        let rebuilding: u64 = status_field(&line, "rebuilding").and_then(|v| v.parse().ok()).unwrap_or(0);
        let left: u64 = status_field(&line, "rebuild_bytes_left").and_then(|v| v.parse().ok()).unwrap_or(0);
        rebuilding_seen |= rebuilding > 0;
        bytes_seen = bytes_seen.max(left);
        chains_with(&meta, lost).is_empty() && status_field(&line, "degraded") == Some("0") && rebuilding == 0
    });
    let rebuilt_after = lost_at.elapsed();
    // A few more passes of the reader after the rebuild, then it stops.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let (passes, failures) = reading.join().expect("reader thread");
    eprintln!(
        "disk loss: dead after {} ms, every chain serving two replicas after {} ms; rebuilding seen: \
         {rebuilding_seen}, most bytes left shown: {bytes_seen}; {passes} reader passes",
        dead_after.as_millis(),
        rebuilt_after.as_millis()
    );
    assert!(failures.is_empty(), "reads failed during the loss and rebuild: {failures:?}");
    assert!(passes >= 2, "the reader made {passes} passes");
    let problems = check_replicas(&cluster.client(), &files, lost);
    assert!(problems.is_empty(), "replicas after the rebuild: {problems:#?}");
    assert_eq!(health(&meta, lost).as_deref(), Some("dead"));
}

#[test]
fn a_drained_target_leaves_every_chain_with_two_serving_replicas_elsewhere() {
    let cluster = cluster();
    let (meta, client) = (cluster.meta_addr(), cluster.client());
    let files = put_files(&client);
    let (drained, _) = victim_of(&cluster, &client, &files[0].0);
    assert!(!chains_with(&meta, drained).is_empty());

    // Refusals name what was wrong.
    let (ok, _, stderr) = cli(&["target", "drain", "123abc", "--meta", &meta]);
    assert!(!ok && stderr.contains("not in the chain table"), "{stderr}");
    let (ok, _, stderr) = cli(&["target", "drain", "nothex", "--meta", &meta]);
    assert!(!ok && stderr.contains("not a target id"), "{stderr}");

    let stop = Arc::new(AtomicBool::new(false));
    let reading = reader(cluster.client(), files.clone(), stop.clone());
    let started = Instant::now();
    let out = cli_ok(&["target", "drain", &drained.to_string(), "--meta", &meta]);
    assert!(out.contains("draining"), "{out}");
    assert_eq!(health(&meta, drained).as_deref(), Some("draining"));
    wait_until("every chain to leave the drained target", SETTLE, || {
        let line = summary(&meta);
        chains_with(&meta, drained).is_empty()
            && status_field(&line, "degraded") == Some("0")
            && status_field(&line, "rebuilding") == Some("0")
    });
    let took = started.elapsed();
    assert_eq!(health(&meta, drained).as_deref(), Some("drained"), "a finished drain says so");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (passes, failures) = reading.join().expect("reader thread");
    eprintln!("drain: every chain off the target after {} ms; {passes} reader passes", took.as_millis());
    assert!(failures.is_empty(), "reads failed during the drain: {failures:?}");
    let problems = check_replicas(&cluster.client(), &files, drained);
    assert!(problems.is_empty(), "replicas after the drain: {problems:#?}");
    // New files never land on the drained target.
    let more: Vec<(String, Vec<u8>)> = (0..3)
        .map(|index| {
            let name = format!("/after{index}");
            let data = random_bytes(900 + index, 200_000);
            let file = client.create(&name, &replicated(1, UNIT_BYTES)).expect("create after the drain");
            file.write_at(0, &data).expect("write");
            file.close().expect("close");
            (name, data)
        })
        .collect();
    for (name, data) in &more {
        assert_eq!(read_all(&client, name, data.len()).as_ref(), Ok(data), "{name}");
        let entry = client.stat(name).expect("stat");
        for place in &entry.subfiles {
            let chain = place.chain.as_ref().expect("chain");
            assert!(chain.members.iter().all(|m| m.target != drained), "{name} placed on the drained target");
        }
    }
}
