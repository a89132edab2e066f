//! Replication's control plane (issue 32) with real processes: failure groups, the chain
//! table built and driven by heartbeats, fencing of a killed server, its return, the table
//! surviving a SIGKILL of the metadata service, and replicated creates refused for the
//! right reason (`replicated.rs` has the replicated files themselves).

mod common;

use common::{
    cli, client_key, http_get, kill_and_restart_meta, path, status_field, target_spec, Cluster, Process,
};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::{Duration, Instant};

/// Short membership timings (the cluster's heartbeats come every 200 ms); the safety rule
/// `fence_after_ms > lease_ms + clock_margin_ms` holds.
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Bound on waiting for a change the service makes within about `fence_after_ms` (plus a
/// tick, a heartbeat and a slow machine's scheduling).
const SETTLE: Duration = Duration::from_secs(15);

/// The arguments of an I/O server of `cluster` on target folder `index`, in `group`.
fn server_args(cluster: &Cluster, index: usize, group: Option<&str>) -> Vec<String> {
    let dir = cluster.target_dir(index);
    std::fs::create_dir_all(&dir).expect("target folder");
    let (config, meta, target) = (cluster.config(), cluster.meta_addr(), target_spec(&dir));
    let mut args = vec!["--config", path(&config), "server", "--meta", &meta, "--target", path(&target)];
    args.extend_from_slice(&["--listen", "127.0.0.1:0"]);
    if let Some(group) = group {
        args.extend_from_slice(&["--failure-group", group]);
    }
    args.into_iter().map(String::from).collect()
}

/// Starts an I/O server of `cluster` on target folder `index`, in `group` (or the default).
fn start_server(cluster: &Cluster, index: usize, group: Option<&str>) -> Process {
    let args = server_args(cluster, index, group);
    Process::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), "server").expect("start server")
}

/// `start_server` with a metrics endpoint; returns the process and the endpoint's address.
fn start_server_with_metrics(cluster: &Cluster, index: usize, group: &str) -> (Process, String) {
    let mut args = server_args(cluster, index, Some(group));
    args.extend(["--metrics-listen".to_string(), "127.0.0.1:0".to_string()]);
    let mut child = std::process::Command::new(common::FLOTILLA)
        .args(&args)
        .env("FLOTILLA_KEY", client_key())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn server");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = |key: &str| {
        let mut text = String::new();
        stdout.read_line(&mut text).expect("read a line");
        text.trim()
            .strip_prefix(&format!("{key}="))
            .unwrap_or_else(|| panic!("{key}= line: {text:?}"))
            .to_string()
    };
    let (addr, metrics) = (line("server"), line("metrics"));
    (Process { child, addr, credential: None }, metrics)
}

/// A cluster of one metadata service and one server per group, in those groups; the first
/// server's metrics endpoint.
fn cluster_in_groups(groups: &[&str]) -> (Cluster, String) {
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    let (first, metrics) = start_server_with_metrics(&cluster, 0, groups[0]);
    cluster.servers.push(Some(first));
    for (index, group) in groups.iter().enumerate().skip(1) {
        let server = start_server(&cluster, index, Some(group));
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(groups.len());
    (cluster, metrics)
}

/// `flotilla status --chains`.
fn status(cluster: &Cluster) -> String {
    let (ok, stdout, stderr) = cli(&["status", "--chains", "--meta", &cluster.meta_addr()]);
    assert!(ok, "status failed: {stderr}");
    stdout
}

/// The status line of the target in `group`.
fn target_line<'a>(status: &'a str, group: &str) -> Option<&'a str> {
    status.lines().find(|l| l.starts_with("target=") && status_field(l, "group") == Some(group))
}

/// Every chain's version and members, by chain id.
fn chains(status: &str) -> BTreeMap<u32, (u64, String)> {
    status
        .lines()
        .filter(|l| l.starts_with("chain="))
        .map(|l| {
            let id = status_field(l, "chain").and_then(|v| v.parse().ok()).expect("chain id");
            let version = status_field(l, "version").and_then(|v| v.parse().ok()).expect("chain version");
            (id, (version, status_field(l, "members").unwrap_or_default().to_string()))
        })
        .collect()
}

/// Polls `status` until `done` holds, for at most `SETTLE`; returns the status that did.
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

/// Each member's state in the chains of `status` (`TARGET:STATE` pairs).
fn member_states(status: &str, target: &str) -> Vec<String> {
    chains(status)
        .values()
        .flat_map(|(_, members)| members.split(',').map(str::to_string).collect::<Vec<_>>())
        .filter_map(|m| m.strip_prefix(&format!("{target}:")).map(str::to_string))
        .collect()
}

#[test]
fn groups_show_a_killed_server_is_fenced_and_returns_and_the_table_survives_a_meta_kill() {
    let (mut cluster, metrics) = cluster_in_groups(&["rack-a", "rack-b"]);
    let built = wait_status(&cluster, "the chain table", |s| !chains(s).is_empty());
    for group in ["rack-a", "rack-b"] {
        let line = target_line(&built, group).unwrap_or_else(|| panic!("no target in {group}:\n{built}"));
        assert_eq!(status_field(line, "health"), Some("up"), "{line}");
        assert_eq!(status_field(line, "chains"), Some("2"), "two targets, two chains each of two: {line}");
    }
    assert!(built.contains("chains=2 degraded=0 unavailable=0 replicas=2 failure_groups=2"), "{built}");
    let before = chains(&built);
    // Heartbeat replies hand the server its chains and a lease, which it keeps.
    let deadline = Instant::now() + SETTLE;
    let held = loop {
        let text = http_get(&metrics, "/metrics").unwrap_or_default();
        if text.contains("flotilla_server_chains 2") && text.contains("flotilla_server_chain_lease_valid 1") {
            break text;
        }
        assert!(Instant::now() < deadline, "the server never held its chains:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(held.contains("flotilla_server_chains 2"));
    let b_target = status_field(target_line(&built, "rack-b").unwrap(), "target").unwrap().to_string();

    // SIGKILL the server of rack-b: fenced (offline in every chain, versions up) in about
    // fence_after_ms.
    let killed_at = Instant::now();
    cluster.servers[1].take().expect("server b").kill();
    let fenced = wait_status(&cluster, "rack-b fenced", |s| {
        target_line(s, "rack-b").and_then(|l| status_field(l, "health")) == Some("down")
    });
    println!("fenced {:?} after the kill:\n{fenced}", killed_at.elapsed());
    let after_kill = chains(&fenced);
    assert_eq!(after_kill.len(), before.len());
    for (id, (version, _)) in &after_kill {
        assert!(*version > before[id].0, "chain {id} did not move on: {before:?} -> {after_kill:?}");
    }
    assert!(member_states(&fenced, &b_target).iter().all(|s| s.starts_with("offline@")), "{fenced}");
    assert!(fenced.contains("chains=2 degraded=2 unavailable=0"), "{fenced}");

    // It comes back (a new incarnation): up again, syncing in its chains (no data path copies
    // what it missed yet, so it is never made serving).
    let server = start_server(&cluster, 1, Some("rack-b"));
    cluster.servers[1] = Some(server);
    let back = wait_status(&cluster, "rack-b back and syncing", |s| {
        let up = target_line(s, "rack-b").and_then(|l| status_field(l, "health")) == Some("up");
        up && member_states(s, &b_target).iter().all(|state| state.starts_with("syncing@"))
    });
    println!("after the restart:\n{back}");
    let returned = chains(&back);

    // SIGKILL the metadata service: the chain table and its versions are still there.
    kill_and_restart_meta(&mut cluster);
    let restarted = wait_status(&cluster, "the chain table after a meta restart", |s| !chains(s).is_empty());
    let reloaded = chains(&restarted);
    assert_eq!(reloaded.keys().collect::<Vec<_>>(), returned.keys().collect::<Vec<_>>());
    for (id, (version, _)) in &reloaded {
        assert!(*version >= returned[id].0, "chain {id} went back: {returned:?} -> {reloaded:?}");
    }
    assert!(target_line(&restarted, "rack-a").is_some() && target_line(&restarted, "rack-b").is_some());
}

#[test]
fn replicated_creates_are_refused_naming_the_groups_then_the_tables_replica_count() {
    let (mut cluster, _) = cluster_in_groups(&["rack-a", "rack-b"]);
    let meta = cluster.meta_addr();
    let local = cluster.dir.path().join("local.bin");
    std::fs::write(&local, b"replicated?").unwrap();
    let put = |layout: &str| cli(&["put", "--layout", layout, path(&local), "/r", "--meta", &meta]);

    let (ok, _, stderr) = put("stripe:64k:2,replicas=3");
    assert!(!ok, "replicas=3 over two groups must fail");
    assert!(stderr.contains("3 replicas need 3 distinct failure groups, but only 2"), "{stderr}");
    assert!(stderr.contains("stripe:64K:2,replicas=3"), "the error names the layout: {stderr}");
    let (ok, _, stderr) = cli(&["stat", "/r", "--meta", &meta]);
    assert!(!ok && stderr.contains("no such file"), "no file was made: {stderr}");

    // A server started without --failure-group is in its host's group, a third group: now
    // replicas=3 has its groups but the table was built with chains of two.
    let third = start_server(&cluster, 2, None);
    cluster.servers.push(Some(third));
    cluster.wait_up(3);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let shown = wait_status(&cluster, "the third group", |s| s.contains("failure_groups=3"));
    assert!(host.is_empty() || target_line(&shown, &host).is_some(), "host group {host:?}:\n{shown}");
    // The table was extended with chains that use the new target (chains_per_target = 2).
    assert!(shown.contains("chains=4 degraded=0"), "{shown}");
    let third = shown.lines().filter(|l| l.starts_with("target=")).find(|l| !l.contains("group=rack-"));
    assert_eq!(third.and_then(|l| status_field(l, "chains")), Some("2"), "{shown}");
    let (ok, _, stderr) = put("stripe:64k:2,replicas=3");
    assert!(!ok && stderr.contains("the chain table has 2 replicas per chain"), "{stderr}");

    let (ok, _, stderr) = put("stripe:64k:2");
    assert!(ok, "one replica is today's behaviour: {stderr}");
}
