//! Operating a real cluster: a real Prometheus scrapes `flotilla local --metrics-listen`
//! during a workload tagged with a job id; `flotilla jobs` and `top` read the servers'
//! counters (`--json` parsed); `mount -t flotilla` and an fstab line through mount(8) and the
//! `mount.flotilla` helper; `cp -r` of a tree in, within and out of Flotilla, compared byte
//! for byte.
//!
//! Needs root (mount, /sbin) and Prometheus (Debian's `prometheus`; `scripts/test.sh`
//! installs it). A missing program fails the test, never skips it.

mod common;

use common::{http_get, is_mounted, path, random_bytes, Local, FLOTILLA};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound and released; the caller binds it right after).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The samples of an instant PromQL query: (labels, value).
fn prometheus_query(addr: &str, query: &str) -> Vec<(Value, f64)> {
    let Ok(body) = http_get(addr, &format!("/api/v1/query?query={}", percent_encode(query))) else {
        return Vec::new();
    };
    let reply: Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    let results = reply["data"]["result"].as_array().cloned().unwrap_or_default();
    results
        .into_iter()
        .map(|r| {
            let value = r["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            (r["metric"].clone(), value)
        })
        .collect()
}

/// A Prometheus server scraping `target` every second; killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temporary folder");
        let config = dir.path().join("prometheus.yml");
        let text = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: flotilla\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(&config, text).expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (Debian package `prometheus`; scripts/test.sh installs it)");
        Prometheus { child, addr, _dir: dir }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_byte_counters_of_every_server_and_of_the_job() {
    let cluster = Local::start(2, true);
    let metrics = cluster.metrics.clone().expect("metrics address");
    let prometheus = Prometheus::start(&metrics);
    let job = format!("ops-test-{}", std::process::id());
    let scratch = tempfile::tempdir().unwrap();
    let local = scratch.path().join("data");
    std::fs::write(&local, random_bytes(7, 6 << 20)).unwrap();
    let env = [("FLOTILLA_JOB", job.as_str())];
    let (ok, _, stderr) = cluster.cli(&["put", "--layout", "stripe:256K", path(&local), "/data"], &env);
    assert!(ok, "put: {stderr}");
    let back = scratch.path().join("back");
    let (ok, _, stderr) = cluster.cli(&["get", "/data", path(&back)], &env);
    assert!(ok, "get: {stderr}");

    let per_server = "sum by (service) (flotilla_server_target_written_bytes_total)";
    let per_job = format!("sum(flotilla_server_job_read_bytes_total{{job_id=\"{job}\"}})");
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut servers, mut job_read) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        servers = prometheus_query(&prometheus.addr, per_server);
        job_read = prometheus_query(&prometheus.addr, &per_job);
        let every_server = servers.len() == 2 && servers.iter().all(|(_, v)| *v > 0.0);
        if every_server && job_read.first().is_some_and(|(_, v)| *v >= (6 << 20) as f64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(servers.len(), 2, "a written-bytes series per server: {servers:?}");
    for (labels, value) in &servers {
        assert!(*value > 0.0, "server {labels} wrote nothing according to Prometheus");
    }
    let total: f64 = servers.iter().map(|(_, v)| v).sum();
    assert_eq!(total, (6 << 20) as f64, "the servers' written bytes add up to the file");
    assert_eq!(job_read.first().map(|s| s.1), Some((6 << 20) as f64), "job {job}'s read bytes: {job_read:?}");
    let written = prometheus_query(
        &prometheus.addr,
        &format!("sum(flotilla_server_job_written_bytes_total{{job_id=\"{job}\"}})"),
    );
    assert_eq!(written.first().map(|s| s.1), Some((6 << 20) as f64), "job {job}'s written bytes");
    let latency = prometheus_query(
        &prometheus.addr,
        "sum(flotilla_server_request_duration_seconds_count{kind=\"write\"})",
    );
    assert!(latency.first().is_some_and(|s| s.1 > 0.0), "write latencies observed: {latency:?}");
    let meta = prometheus_query(
        &prometheus.addr,
        "sum(flotilla_meta_request_duration_seconds_count{service=\"meta\"})",
    );
    assert!(meta.first().is_some_and(|s| s.1 > 0.0), "metadata requests observed: {meta:?}");
}

#[test]
fn jobs_and_top_report_the_job_in_json() {
    let cluster = Local::start(2, false);
    let scratch = tempfile::tempdir().unwrap();
    let local = scratch.path().join("data");
    std::fs::write(&local, random_bytes(3, 3 << 20)).unwrap();
    let env = [("SLURM_JOB_ID", "4242"), ("FLOTILLA_JOB", "not-this-one")];
    let (ok, _, stderr) = cluster.cli(&["put", path(&local), "/a"], &env);
    assert!(ok, "put: {stderr}");
    let (ok, _, stderr) = cluster.cli(&["put", path(&local), "/b"], &[("FLOTILLA_JOB", "second")]);
    assert!(ok, "put: {stderr}");

    let (ok, stdout, stderr) = cluster.cli(&["jobs", "--json"], &[]);
    assert!(ok, "jobs: {stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("jobs --json is one JSON document");
    let jobs = report["jobs"].as_array().expect("a jobs list");
    let written = |name: &str| jobs.iter().find(|j| j["job"] == name).and_then(|j| j["write_bytes"].as_u64());
    assert_eq!(written("4242"), Some(3 << 20), "SLURM_JOB_ID comes first: {jobs:?}");
    assert_eq!(written("second"), Some(3 << 20));
    assert_eq!(written("not-this-one"), None);
    assert_eq!(report["servers"].as_array().map(Vec::len), Some(2));
    let (ok, text, _) = cluster.cli(&["jobs"], &[]);
    assert!(ok && text.contains("4242") && text.contains("3.00 MiB"), "human units: {text}");

    let mut top = Command::new(FLOTILLA)
        .arg("--key")
        .arg(&cluster.key)
        .args(["top", "--json", "--count", "3", "--interval-ms", "300", "--meta", &cluster.meta])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start flotilla top");
    let (ok, _, stderr) = cluster.cli(&["put", path(&local), "/c"], &[("FLOTILLA_JOB", "during-top")]);
    assert!(ok, "put: {stderr}");
    let mut stdout = String::new();
    top.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert!(top.wait().unwrap().success());
    let refreshes: Vec<Value> =
        stdout.lines().map(|line| serde_json::from_str(line).expect("each refresh is a JSON line")).collect();
    assert_eq!(refreshes.len(), 3, "--count 3: {stdout}");
    for refresh in &refreshes {
        assert_eq!(refresh["servers"].as_array().map(Vec::len), Some(2), "{refresh}");
    }
    let moved: f64 = refreshes
        .iter()
        .flat_map(|r| r["servers"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["bytes_per_second"].as_f64())
        .sum();
    assert!(moved > 0.0, "top saw the put made while it ran: {stdout}");
}

#[test]
fn an_oversized_job_id_is_refused_and_the_connection_still_serves() {
    let cluster = Local::start(1, false);
    let long = "j".repeat(flotilla_proto::JOB_ID_BYTES_MAX + 1);
    let mut config = flotilla_client::ClientConfig::new(&cluster.meta);
    config.key = Some(cluster.key.clone());
    config.job = Some(long.clone());
    let client = flotilla_client::Client::with_config(config).unwrap();
    let file = client.create("/x", &flotilla_client::CreateOptions::default()).unwrap();
    file.write_at(0, b"still served").unwrap();
    file.sync().unwrap();
    let server = client.status().unwrap()[0].server.clone();
    let stats = client.server_stats(&server).unwrap();
    assert!(stats.jobs.iter().all(|j| j.job != long), "an over-long job id is not counted");
    assert_eq!(stats.total.write_bytes, 12);
}

/// `/sbin/mount.flotilla`, linked by `flotilla install`, removed when dropped.
struct Helper;

impl Helper {
    fn install() -> Helper {
        let status =
            Command::new(FLOTILLA).args(["install", "--dir", "/sbin"]).status().expect("flotilla install");
        assert!(status.success(), "flotilla install --dir /sbin");
        Helper
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = Command::new(FLOTILLA).args(["install", "--dir", "/sbin", "--remove"]).status();
    }
}

/// Unmounts `dir` (if mounted) when dropped.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
}

fn wait_unmounted(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while is_mounted(dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!is_mounted(dir), "{} still mounted", dir.display());
}

#[test]
fn mount_t_flotilla_and_an_fstab_line_mount_read_only_with_options() {
    let cluster = Local::start(1, false);
    let scratch = tempfile::tempdir().unwrap();
    let content = random_bytes(11, 300_000);
    std::fs::write(scratch.path().join("f"), &content).unwrap();
    let (ok, _, stderr) = cluster.cli(&["put", path(&scratch.path().join("f")), "/f"], &[]);
    assert!(ok, "put: {stderr}");
    let _helper = Helper::install();
    let dir = scratch.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let _unmount = Unmount(&dir);

    let options = format!("ro,key={},threads=4,attr_timeout_ms=500,_netdev", cluster.key.display());
    let output = Command::new("mount")
        .args(["-t", "flotilla", &cluster.meta, path(&dir), "-o", &options])
        .output()
        .unwrap();
    assert!(output.status.success(), "mount -t flotilla: {}", String::from_utf8_lossy(&output.stderr));
    assert!(is_mounted(&dir), "mount returned with the file system mounted");
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), content, "the file reads back through the mount");
    let refused = std::fs::write(dir.join("new"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "ro: {refused}");
    assert!(Command::new("umount").arg(&dir).status().unwrap().success());
    wait_unmounted(&dir);

    let fstab = scratch.path().join("fstab");
    let line = format!(
        "{} {} flotilla noauto,key={},threads=2 0 0\n",
        cluster.meta,
        dir.display(),
        cluster.key.display()
    );
    std::fs::write(&fstab, line).unwrap();
    let output = Command::new("mount").args(["-T", path(&fstab), path(&dir)]).output().unwrap();
    assert!(output.status.success(), "mount from an fstab line: {}", String::from_utf8_lossy(&output.stderr));
    std::fs::write(dir.join("g"), b"written through an fstab mount").unwrap();
    assert!(Command::new("umount").arg(&dir).status().unwrap().success());
    wait_unmounted(&dir);
    let (ok, stdout, _) = cluster.cli(&["stat", "--json", "/g"], &[]);
    let stat: Value = serde_json::from_str(&stdout).expect("stat --json");
    assert!(ok && stat["size_bytes"] == 30, "{stat}");

    let output = Command::new("mount")
        .args(["-t", "flotilla", &cluster.meta, path(&dir), "-o", "bogus_option=1"])
        .output()
        .unwrap();
    assert!(!output.status.success(), "an unknown option fails the mount");
    assert!(String::from_utf8_lossy(&output.stderr).contains("bogus_option"), "the error names the option");
}

/// Every file under `root` (relative path → contents), symlinks as their targets.
fn tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            let relative = entry.path().strip_prefix(root).unwrap().to_path_buf();
            if kind.is_dir() {
                found.push((relative, b"<dir>".to_vec()));
                pending.push(entry.path());
            } else if kind.is_symlink() {
                found.push((
                    relative,
                    std::fs::read_link(entry.path()).unwrap().into_os_string().into_encoded_bytes(),
                ));
            } else {
                found.push((relative, std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    found.sort();
    found
}

fn checksum(tree: &[(PathBuf, Vec<u8>)]) -> u32 {
    tree.iter().fold(0, |sum, (name, bytes)| {
        let sum = crc32c(sum, name.as_os_str().as_encoded_bytes());
        crc32c(sum, bytes)
    })
}

/// CRC32C, bitwise (test-only; the product uses the crc32c crate).
fn crc32c(crc: u32, bytes: &[u8]) -> u32 {
    let mut crc = !crc;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn cp_r_copies_a_tree_in_within_and_out_of_flotilla() {
    let cluster = Local::start(2, false);
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("src");
    for dir in ["a/b/c", "empty", "d"] {
        std::fs::create_dir_all(source.join(dir)).unwrap();
    }
    let files =
        [("top", 0usize), ("a/one", 1), ("a/b/big", 9 << 20), ("a/b/c/mid", 300_001), ("d/x", 65_536)];
    for (seed, (name, length)) in files.iter().enumerate() {
        std::fs::write(source.join(name), random_bytes(seed as u64, *length)).unwrap();
    }
    std::os::unix::fs::symlink("a/one", source.join("link")).unwrap();
    let original = tree(&source);

    let (ok, _, stderr) = cluster.cli(&["cp", "-r", "--jobs", "3", path(&source), "flotilla:/"], &[]);
    assert!(ok, "cp -r in: {stderr}");
    assert!(stderr.contains("copied 5 files"), "final throughput line: {stderr}");
    let (ok, _, stderr) = cluster.cli(&["cp", "-r", "flotilla:/src", "flotilla:/again"], &[]);
    assert!(ok, "cp -r within: {stderr}");
    let out = scratch.path().join("out");
    let (ok, _, stderr) = cluster.cli(&["cp", "-r", "flotilla:/again", path(&out)], &[]);
    assert!(ok, "cp -r out: {stderr}");
    let copied = tree(&out);
    assert_eq!(copied.len(), original.len(), "same entries");
    assert_eq!(checksum(&copied), checksum(&original), "same names and bytes");
    assert!(copied == original, "byte for byte");

    let (ok, _, stderr) = cluster.cli(&["cp", path(&source), "flotilla:/nope"], &[]);
    assert!(!ok && stderr.contains("is a directory (use -r)"), "{stderr}");
    let (ok, stdout, _) = cluster.cli(&["du", "--json", "/again"], &[]);
    let du: Value = serde_json::from_str(&stdout).expect("du --json");
    let total: usize = files.iter().map(|(_, n)| n).sum();
    assert!(ok && du["size_bytes"] == total as u64 && du["files"] == 5 && du["symlinks"] == 1, "{du}");
}

#[test]
fn a_library_client_serves_its_own_metrics_on_request() {
    let cluster = Local::start(1, true);
    let mut config = flotilla_client::ClientConfig::new(&cluster.meta);
    config.key = Some(cluster.key.clone());
    config.metrics_listen = Some("127.0.0.1:0".to_string());
    let client = flotilla_client::Client::with_config(config).unwrap();
    let file = client.create("/m", &flotilla_client::CreateOptions::default()).unwrap();
    file.write_at(0, &random_bytes(5, 100_000)).unwrap();
    file.sync().unwrap();
    let mut back = vec![0u8; 100_000];
    assert_eq!(file.read_at(0, &mut back).unwrap(), 100_000);

    let addr = client.metrics_addr().expect("the client serves metrics").to_string();
    let text = http_get(&addr, "/metrics").expect("client metrics");
    assert!(text.contains("flotilla_client_data_bytes_total{kind=\"write\"} 100000"), "{text}");
    assert!(text.contains("flotilla_client_data_bytes_total{kind=\"read\"} 100000"), "{text}");
    assert!(text.contains("flotilla_client_request_duration_seconds_count{kind=\"write\"}"), "{text}");

    let cluster_text = http_get(cluster.metrics.as_deref().unwrap(), "/metrics").expect("cluster metrics");
    for name in [
        "flotilla_server_cache_dirty_bytes{service=\"server-0\"}",
        "flotilla_server_connections{service=\"server-0\"} ",
        "flotilla_server_queue_depth{service=\"server-0\"} ",
        "flotilla_server_cache_hits_total{service=\"server-0\"}",
        "flotilla_meta_connections{service=\"meta\"}",
        "flotilla_server_target_read_bytes_total{service=\"server-0\",target=",
    ] {
        assert!(cluster_text.contains(name), "{name} missing from the cluster's metrics");
    }
    let written = cluster_text
        .lines()
        .find(|l| l.starts_with("flotilla_server_target_written_bytes_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(written, Some(100_000), "the server counted the client's bytes");
}

/// `flotilla ARGS` (test server credential) and the values of its first `names` lines.
fn start_service(args: &[&str], names: &[&str]) -> (KillOnDrop, Vec<String>) {
    let mut child = Command::new(FLOTILLA)
        .arg("--key")
        .arg(common::server_key())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start flotilla");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let values = names
        .iter()
        .map(|name| {
            let line = lines.next().expect("a line").expect("utf-8");
            line.strip_prefix(&format!("{name}="))
                .unwrap_or_else(|| panic!("{name}= expected: {line}"))
                .to_string()
        })
        .collect();
    (KillOnDrop(child), values)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn meta_and_server_serve_metrics_on_their_own_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (meta_data, target) = (dir.path().join("meta"), dir.path().join("target"));
    std::fs::create_dir_all(&target).unwrap();
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let meta_args = [&["meta", "--data", path(&meta_data), "--listen", "127.0.0.1:0"][..], &metrics].concat();
    let (_meta, meta) = start_service(&meta_args, &["meta", "metrics"]);
    let server_args =
        [&["server", "--meta", &meta[0], "--target", path(&target), "--listen", "127.0.0.1:0"][..], &metrics]
            .concat();
    let (_server, server) = start_service(&server_args, &["server", "metrics"]);

    let deadline = Instant::now() + Duration::from_secs(30);
    let registered = "flotilla_meta_request_duration_seconds_count{kind=\"register_member\"} 1";
    let mut text = String::new();
    while Instant::now() < deadline && !text.contains(registered) {
        text = http_get(&meta[1], "/metrics").unwrap_or_default();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(text.contains(registered), "the server's registration is counted: {text}");
    assert!(text.contains("flotilla_meta_auth_failures_total 0"), "{text}");
    let text = http_get(&server[1], "/metrics").expect("server metrics");
    assert!(text.contains("flotilla_server_connections 0"), "no client connected yet: {text}");
    assert!(text.contains("flotilla_server_target_written_bytes_total{target="), "{text}");
}

#[test]
fn a_mount_serves_its_client_metrics() {
    let cluster = Local::start(1, false);
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    let _unmount = Unmount(&mountpoint);
    let mut child = Command::new(FLOTILLA)
        .arg("--key")
        .arg(&cluster.key)
        .args(["mount", "--meta", &cluster.meta, "--metrics-listen", "127.0.0.1:0", path(&mountpoint)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start flotilla mount");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("a line").expect("utf-8");
    let metrics = next().strip_prefix("metrics=").expect("metrics= first").to_string();
    assert!(next().starts_with("mount="));
    let mount = KillOnDrop(child);
    std::fs::write(mountpoint.join("file"), random_bytes(9, 50_000)).unwrap();
    let text = http_get(&metrics, "/metrics").expect("mount metrics");
    assert!(text.contains("flotilla_client_data_bytes_total{kind=\"write\"} 50000"), "{text}");
    assert!(Command::new("umount").arg(&mountpoint).status().unwrap().success());
    wait_unmounted(&mountpoint);
    drop(mount);
}
