//! Resync from a record (issue 32), with real processes: a member SIGKILLed while a few
//! MiB of a 24 MiB replicated data set change, then restarted, is copied only what
//! it missed (the copy sources' `server_resync_copied_bytes` metrics add up to far fewer
//! bytes than the data set) and then serves every byte alone; and a metadata service
//! SIGKILLed and restarted keeps a target's drain and dead marks.

mod common;

use common::replication::{chain_lines, chain_table_built, replicated, wait_until};
use common::{
    cli, cli_ok, http_get, kill_and_restart_meta, path, random_bytes, status_field, Cluster, Process,
};
use flotilla_types::TargetId;
use std::time::{Duration, Instant};

/// Short membership timings (heartbeats every 200 ms).
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
const SETTLE: Duration = Duration::from_secs(60);
/// The stripe unit of the files (each subfile on a chain of its own, sharing no target).
const UNIT_BYTES: u64 = 256 << 10;

/// A loopback port free now (for a metrics endpoint).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// Server `index` in `group`, with a metrics endpoint at `metrics`.
fn start_server(cluster: &Cluster, index: usize, group: &str, metrics: &str) -> Process {
    cluster.start_server_in_group_with(index, group, &["--metrics-listen", metrics])
}

/// A counter of a server's metrics endpoint (0 if it is not listed).
fn counter(metrics: &str, name: &str) -> u64 {
    let text = http_get(metrics, "/metrics").expect("scrape the metrics");
    let name = format!("flotilla_{name}");
    text.lines()
        .filter(|line| line.starts_with(&name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Every chain's members as `TARGET:STATE`, from `flotilla status --chains`.
fn all_serving(meta: &str) -> bool {
    let lines = chain_lines(meta);
    !lines.is_empty()
        && lines.iter().all(|l| {
            status_field(l, "members").is_some_and(|m| m.split(',').all(|s| s.ends_with(":serving")))
        })
}

#[test]
fn a_restarted_member_is_copied_only_what_it_missed_and_then_serves_alone() {
    let groups = ["rack-a", "rack-b"];
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    let metrics: Vec<String> = groups.iter().map(|_| format!("127.0.0.1:{}", free_port())).collect();
    for (index, group) in groups.iter().enumerate() {
        let server = start_server(&cluster, index, group, &metrics[index]);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(groups.len());
    let meta = cluster.meta_addr();
    wait_until("the chain table", SETTLE, || chain_table_built(&meta));
    let client = cluster.client();
    // 24 MiB on two servers (every chain has both: the restarted member holds it all).
    const FILES: usize = 16;
    const FILE_BYTES: usize = (3 << 19) + 11;
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    for index in 0..FILES {
        let name = format!("/f{index}");
        let data = random_bytes(10 + index as u64, FILE_BYTES);
        let file = client.create(&name, &replicated(1, UNIT_BYTES)).expect("create");
        file.write_at(0, &data).expect("write");
        file.close().expect("close");
        expected.push((name, data));
    }
    let total: usize = expected.iter().map(|(_, d)| d.len()).sum();
    let before: u64 = metrics.iter().map(|m| counter(m, "server_resync_copied_bytes")).sum();
    let victim = cluster.servers[1].take().expect("server 1");
    victim.kill();
    // About 2 MiB changed while server 1 is down: overwrites, a truncation, extensions and
    // a removal.
    let mut changed = 0usize;
    for (index, (name, data)) in expected.iter_mut().enumerate().take(8) {
        let file = client.open(name).expect("open");
        let patch = random_bytes(100 + index as u64, 128 << 10);
        let offset = 4096 + index * 150_001;
        file.write_at(offset as u64, &patch).expect("overwrite");
        data[offset..offset + patch.len()].copy_from_slice(&patch);
        changed += patch.len();
        if index == 1 {
            file.set_size(300_000).expect("truncate");
            data.truncate(300_000);
        }
        if index == 2 {
            let tail = random_bytes(300, 200_000);
            file.write_at(data.len() as u64, &tail).expect("extend");
            data.extend_from_slice(&tail);
            changed += tail.len();
        }
        file.close().expect("close");
    }
    let (gone, _) = expected.remove(FILES - 1);
    client.remove(&gone).expect("remove a file while a member is down");
    // (A new file needs both failure groups: a create is refused while one is down.)
    let (name, data) = &mut expected[9];
    let tail = random_bytes(500, 512 << 10);
    let file = client.open(name).expect("open");
    file.write_at(data.len() as u64, &tail).expect("append");
    file.close().expect("close");
    data.extend_from_slice(&tail);
    changed += tail.len();

    let restarted_at = Instant::now();
    cluster.servers[1] = Some(start_server(&cluster, 1, groups[1], &metrics[1]));
    wait_until("every chain serving again", SETTLE, || all_serving(&meta));
    let took = restarted_at.elapsed();
    let copied: u64 = metrics.iter().map(|m| counter(m, "server_resync_copied_bytes")).sum::<u64>() - before;
    let recorded: u64 = metrics.iter().map(|m| counter(m, "server_resync_recorded_copies")).sum();
    eprintln!(
        "resync: {copied} bytes copied ({recorded} copies from a record) for {changed} bytes changed \
         of {total}; every chain serving {} ms after the restart",
        took.as_millis()
    );
    assert!(recorded > 0, "no copy was made from a record");
    assert!(copied as usize >= changed / 2, "copied {copied} bytes, fewer than was changed ({changed})");
    assert!(
        (copied as usize) < total / 4,
        "copied {copied} bytes of a {total}-byte data set for {changed} bytes changed"
    );
    // Server 1 alone: the other member is SIGKILLed; every byte reads back from it.
    cluster.servers[0].take().expect("server 0").kill();
    for (name, data) in &expected {
        let back = cluster.dir.path().join("back.bin");
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
    let (ok, _, _) = cli(&["stat", &gone, "--meta", &meta]);
    assert!(!ok, "{gone} was removed");
}

/// The `health=` and `chains=` of a target's status line.
fn health(meta: &str, target: TargetId) -> (String, String) {
    let status = cli_ok(&["status", "--meta", meta]);
    let wanted = target.to_string();
    let line =
        status.lines().find(|l| status_field(l, "target") == Some(wanted.as_str())).unwrap_or_default();
    let field = |key| status_field(line, key).unwrap_or_default().to_string();
    (field("health"), field("chains"))
}

/// The targets of `flotilla status`, in listed order.
fn targets(meta: &str) -> Vec<TargetId> {
    let status = cli_ok(&["status", "--meta", meta]);
    status.lines().filter_map(|l| status_field(l, "target")).map(common::hex_target).collect()
}

#[test]
fn drain_and_dead_marks_survive_a_killed_metadata_service() {
    let groups = ["rack-a", "rack-b", "rack-c", "rack-d"];
    let mut cluster = Cluster::start_with(0, MEMBERSHIP);
    for (index, group) in groups.iter().enumerate() {
        let server = cluster.start_server_in_group(index, group);
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(groups.len());
    let meta = cluster.meta_addr();
    wait_until("the chain table", SETTLE, || chain_table_built(&meta));
    let client = cluster.client();
    for index in 0..4 {
        let file = client.create(&format!("/m{index}"), &replicated(2, UNIT_BYTES)).expect("create");
        file.write_at(0, &random_bytes(index, 300_000)).expect("write");
        file.close().expect("close");
    }
    let all = targets(&meta);
    assert_eq!(all.len(), 4, "{all:?}");
    let (drained, removed) = (all[2], all[3]);
    cli_ok(&["target", "drain", &drained.to_string(), "--meta", &meta]);
    wait_until("the drain to finish", SETTLE, || health(&meta, drained) == ("drained".into(), "0".into()));
    cli_ok(&["target", "remove", &removed.to_string(), "--meta", &meta]);
    wait_until("the removed target dead", SETTLE, || health(&meta, removed).0 == "dead");
    kill_and_restart_meta(&mut cluster);
    let meta = cluster.meta_addr();
    // Heartbeats of every server (the drained and the removed one too) come in meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(health(&meta, drained), ("drained".into(), "0".into()), "the drain mark after a restart");
    assert_eq!(health(&meta, removed).0, "dead", "the dead mark after a restart");
    wait_until("every chain serving", SETTLE, || all_serving(&meta));
    let status = cli_ok(&["status", "--chains", "--meta", &meta]);
    for line in status.lines().filter(|l| l.starts_with("chain=")) {
        let members = status_field(line, "members").unwrap_or_default();
        assert!(
            !members.contains(&format!("{drained}:")) && !members.contains(&format!("{removed}:serving")),
            "a marked target serves again after the restart: {line}"
        );
    }
}
