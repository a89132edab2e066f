//! One short end-to-end run of each `flotilla bench` workload: tiny sizes, one run each. The
//! client processes check every byte they read and the driver every byte written, so a run
//! that completes has moved the right data; speed is not asserted.

mod common;

use serde_json::Value;
use std::process::Command;

const FLOTILLA: &str = env!("CARGO_BIN_EXE_flotilla");

/// Runs `flotilla bench ARGS --json` and returns its JSON.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(FLOTILLA)
        .arg("bench")
        .args(args)
        .arg("--json")
        .env_remove("FLOTILLA_META")
        .output()
        .expect("run flotilla bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "flotilla bench {args:?} failed:\n{stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("bad JSON from {args:?}: {e}\n{stderr}"))
}

fn points(value: &Value) -> Vec<Value> {
    match value.get("points") {
        Some(Value::Array(points)) => points.clone(),
        _ => vec![value.clone()],
    }
}

fn assert_rates(value: &Value, count: usize) {
    let points = points(value);
    assert_eq!(points.len(), count, "{value}");
    for point in points {
        let median = point["median_bytes_per_s"].as_f64().expect("median");
        assert!(median > 0.0, "{point}");
        assert!(point["min_bytes_per_s"].as_f64().unwrap() <= median);
        assert!(point["max_bytes_per_s"].as_f64().unwrap() >= median);
    }
}

#[test]
fn interleaved_compares_traditional_strided_and_pread() {
    let value =
        bench(&["interleaved", "--servers", "2", "--clients", "2", "--fork-bytes", "16k", "--runs", "1"]);
    assert_rates(&value, 3);
    assert!(value["strided_over_traditional"].as_f64().unwrap() > 0.0);
    assert!(value["strided_over_pread"].as_f64().unwrap() > 0.0);
}

#[test]
fn galley_reads_overwrites_and_writes_every_pattern() {
    let value = bench(&[
        "galley",
        "--servers",
        "2",
        "--clients",
        "2",
        "--record",
        "64,1k",
        "--fork-bytes",
        "8k",
        "--runs",
        "1",
        "--pattern",
        "broadcast,partitioned,interleaved",
        "--op",
        "read,overwrite,write",
    ]);
    // Broadcast is read only: 3 patterns × 2 records × 2 interfaces for read, 2 patterns for the others.
    assert_rates(&value, 12 + 8 + 8);
    assert!(value["server_peak_rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn gpfs_shared_file_and_file_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("gpfs.csv");
    let plot = dir.path().join("gpfs.png");
    let value = bench(&[
        "gpfs",
        "--servers",
        "2",
        "--clients-per-server",
        "1,2",
        "--transfer",
        "4k,32k",
        "--bytes-per-server",
        "128k",
        "--runs",
        "1",
        "--pattern",
        "segmented,strided,file-per-process",
        "--op",
        "read,write",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_rates(&value, 2 * 2 * 3 * 2);
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 25);
    assert!(std::fs::metadata(&plot).unwrap().len() > 1000);
}

#[test]
fn gpfs_single_point_json_is_flat() {
    let value = bench(&[
        "gpfs",
        "--servers",
        "1",
        "--clients",
        "2",
        "--transfer",
        "64k",
        "--bytes-per-server",
        "256k",
        "--runs",
        "2",
        "--pattern",
        "segmented",
    ]);
    assert!(value.get("points").is_none(), "{value}");
    assert_eq!(value["transfer_bytes"], 65536);
    assert_eq!(value["runs_bytes_per_s"].as_array().unwrap().len(), 2);
    assert_rates(&value, 1);
}

#[test]
fn rama_whole_file_strided_and_lu() {
    let whole = bench(&[
        "rama",
        "--servers",
        "2",
        "--clients",
        "2",
        "--file-bytes",
        "256k",
        "--chunk",
        "16k",
        "--runs",
        "1",
        "--layout",
        "stripe:8k,stripe:64k,hash:8k",
        "--op",
        "read,write",
    ]);
    assert_rates(&whole, 3 * 2 * 2);
    let strided = bench(&[
        "rama",
        "--experiment",
        "strided",
        "--servers",
        "2",
        "--clients",
        "2",
        "--request",
        "16k",
        "--iterations",
        "4",
        "--think-us",
        "1000",
        "--runs",
        "1",
        "--layout",
        "stripe:16k,hash:16k",
        "--op",
        "write",
    ]);
    assert_rates(&strided, 2 * 2);
    assert!(points(&strided).iter().all(|p| p["cpu_utilization"].as_f64().unwrap() > 0.0));
    let lu = bench(&[
        "rama",
        "--experiment",
        "lu",
        "--servers",
        "2",
        "--clients",
        "2",
        "--lu-order",
        "64",
        "--lu-block",
        "8",
        "--runs",
        "1",
        "--layout",
        "stripe:4k,hash:4k",
    ]);
    assert_rates(&lu, 2);
}

#[test]
fn sim_disks_serve_correct_data_and_take_disk_time() {
    // 256 KiB per server on an HP 97560 (2.2 MB/s) cannot go much faster than the disk.
    let value = bench(&[
        "gpfs",
        "--servers",
        "2",
        "--clients",
        "2",
        "--target-kind",
        "sim:hp97560",
        "--transfer",
        "64k",
        "--bytes-per-server",
        "256k",
        "--runs",
        "1",
        "--pattern",
        "segmented",
        "--op",
        "read,write",
    ]);
    assert_rates(&value, 2);
    assert_eq!(value["target_kind"], "sim:hp97560");
    assert_eq!(value["cold_cache"], true);
    for point in points(&value) {
        assert!(point["median_bytes_per_s"].as_f64().unwrap() < 2.0 * 2.5e6, "{point}");
    }
}

#[test]
fn paper_prints_the_papers_figures_beside_ours() {
    let output = Command::new(FLOTILLA)
        .args(["bench", "paper", "rama", "--quick", "--runs", "1", "--target-kind", "dir"])
        .env_remove("FLOTILLA_META")
        .output()
        .expect("run flotilla bench paper");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("a factor of 5 (Fig. 7-2)"), "{stdout}");
    assert!(stdout.contains("as low as 21% (Fig. 7-8)"), "{stdout}");
    assert!(stdout.contains("rama gator"), "{stdout}");
    assert!(stdout.contains("verdict"), "{stdout}");
}

/// The migration experiment replays its month under every policy (each read checked byte
/// for byte inside the replay), archives, reclaims and recalls: the disk is far smaller
/// than the month's data, so some reads must be recalls and none may be lost.
#[test]
fn paper_rama_migration_replays_a_month_under_three_policies() {
    let output = Command::new(FLOTILLA)
        .args(["bench", "paper", "rama-migration", "--quick", "--json"])
        .output()
        .expect("run flotilla bench paper rama-migration");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let value: Value = serde_json::from_slice(&output.stdout).expect("json");
    let policies = value["policies"].as_array().expect("policies");
    assert_eq!(policies.len(), 3, "{value}");
    let written = value["written_bytes"].as_u64().expect("written");
    assert!(written > value["capacity_bytes"].as_u64().expect("capacity") * 2, "{value}");
    for policy in policies {
        let hit = policy["disk_hit_rate"].as_f64().expect("hit rate");
        assert!(hit > 0.0 && hit < 1.0, "{policy}");
        assert!(policy["recalls"].as_u64().expect("recalls") > 0, "{policy}");
        assert!(policy["archived_bytes"].as_u64().expect("archived") >= written / 2, "{policy}");
        assert!(policy["reclaimed_bytes"].as_u64().expect("reclaimed") > 0, "{policy}");
    }
}

#[test]
fn paper_rama_spread_draws_every_figure_and_hashing_spreads_lu_evenly() {
    let out = tempfile::tempdir().expect("tempdir");
    let output = Command::new(FLOTILLA)
        .args(["bench", "paper", "rama-spread", "--quick", "--json", "--out"])
        .arg(out.path())
        .output()
        .expect("run flotilla bench paper rama-spread");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let value: Value = serde_json::from_slice(&output.stdout).expect("json");
    let findings = value["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 6, "{value}");
    let ours = |figure: &str| {
        findings.iter().find(|f| f["paper"].as_str().unwrap().contains(figure)).expect("finding")["ours"]
            .as_f64()
            .expect("ours")
    };
    // Hashing keeps node order as fast as iteration order; 2 MiB stripes do not.
    assert!((ours("Fig. 7-14") - 1.0).abs() < 0.2, "{value}");
    assert!(ours("Fig. 7-13") > 1.5, "{value}");
    for name in [
        "rama-fig7-10-lu-striped",
        "rama-fig7-11-whole-hashed",
        "rama-fig7-12-lu-hashed",
        "rama-fig7-13-14-node-stripe-2m",
    ] {
        let png = std::fs::read(out.path().join(format!("{name}.png"))).expect("a chart");
        assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
    }
}

/// Checks a `bench meta` report: every phase in order, `ops` operations per round, one rate
/// per round with min <= median <= max, on Flotilla and (when `local`) on the local disk.
fn assert_meta_report(value: &Value, ops: u64, runs: usize, local: bool) {
    assert_meta_report_found(value, ops, runs, local, ops);
}

/// `assert_meta_report` where the directories hold `found` entries after the creates.
fn assert_meta_report_found(value: &Value, ops: u64, runs: usize, local: bool, found: u64) {
    let phases = value["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["file_create", "file_stat", "file_rename", "dir_create", "file_remove", "dir_remove"],
        "{value}"
    );
    let systems: &[&str] = if local { &["flotilla", "local"] } else { &["flotilla"] };
    for phase in phases {
        assert_eq!(phase["ops_per_round"].as_u64(), Some(ops), "{phase}");
        for system in systems {
            let rates = &phase[system];
            let median = rates["median_ops_per_s"].as_f64().expect("median");
            assert!(median > 0.0, "{phase}");
            assert!(rates["min_ops_per_s"].as_f64().unwrap() <= median, "{phase}");
            assert!(rates["max_ops_per_s"].as_f64().unwrap() >= median, "{phase}");
            assert_eq!(rates["runs_ops_per_s"].as_array().unwrap().len(), runs, "{phase}");
        }
        assert_eq!(phase["flotilla_over_local"].as_f64().is_some_and(|r| r > 0.0), local, "{phase}");
    }
    // The embedded service's usage per operation: creates write the namespace; its CPU is
    // counted in clock ticks (10 ms), which a few creates may not reach.
    let embedded = value["cluster"] == "embedded";
    let create = &phases[0];
    let written = create["service_written_bytes_per_op"].as_f64();
    assert_eq!(written.is_some_and(|w| w > 0.0), embedded, "{create}");
    let cpu = create["service_cpu_us_per_op"].as_f64();
    assert_eq!(cpu.is_some_and(|c| c >= 0.0), embedded, "{create}");
    let found_each = found;
    let found: Vec<u64> =
        value["files_found"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(found, vec![found_each; runs], "{value}");
}

#[test]
fn meta_counts_every_file_beside_the_local_disk_and_leaves_nothing_behind() {
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().to_str().unwrap();
    let args = ["meta", "--servers", "2", "--clients", "3", "--files-per-client", "7", "--runs", "2"];
    let value = bench(&[&args[..], &["--local", dir]].concat());
    assert_meta_report(&value, 21, 2, true);
    assert_eq!(value["local_files_found"], serde_json::json!([21, 21]), "{value}");
    assert_eq!(value["clients"].as_u64(), Some(3));
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0, "the local run left entries behind");
    let missing = Command::new(FLOTILLA)
        .args(["bench", "meta", "--local", "/nonexistent/flotilla-bench"])
        .output()
        .expect("run flotilla bench");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("--local /nonexistent/flotilla-bench: not a directory"));
}

#[test]
fn meta_shares_one_prefilled_directory_and_leaves_nothing_behind() {
    let local = tempfile::tempdir().unwrap();
    let dir = local.path().to_str().unwrap();
    let args = ["meta", "--servers", "2", "--clients", "2", "--files-per-client", "4", "--runs", "1"];
    let value = bench(&[&args[..], &["--shared-dir", "--prefill", "5", "--local", dir]].concat());
    // One directory: both processes' 4 files and the 5 prefilled entries.
    assert_meta_report_found(&value, 8, 1, true, 13);
    assert_eq!(value["local_files_found"], serde_json::json!([13]), "{value}");
    assert_eq!((value["shared_dir"].as_bool(), value["prefill"].as_u64()), (Some(true), Some(5)));
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0, "the local run left entries behind");
}

#[test]
fn meta_runs_on_an_attached_cluster_and_removes_its_tree() {
    let cluster = common::Cluster::start(2);
    let key = common::client_key();
    let meta = cluster.meta_addr();
    let args = ["meta", "--meta", &meta, "--clients", "2", "--files-per-client", "5", "--runs", "1"];
    let output = Command::new(FLOTILLA)
        .arg("--key")
        .arg(&key)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run flotilla bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench meta failed:\n{stderr}");
    let value: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_meta_report(&value, 10, 1, false);
    assert_eq!(value["cluster"], "attached");
    let left = cluster.client().readdir("/").unwrap();
    assert!(left.is_empty(), "bench meta left {left:?}");
}

#[test]
fn paper_group_runs_the_four_programs_and_checks_their_data() {
    let output = Command::new(FLOTILLA)
        .args(["bench", "paper", "group", "--quick", "--runs", "1", "--target-kind", "dir", "--json"])
        .env_remove("FLOTILLA_META")
        .output()
        .expect("run flotilla bench paper group");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let value: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let findings = value["findings"].as_array().expect("findings");
    assert_eq!(
        findings.len(),
        22,
        "5 comparisons × 2 directions × 2 matrices, and Table 2 per matrix: {stdout}"
    );
    let (table3, table2): (Vec<&Value>, Vec<&Value>) =
        findings.iter().partition(|finding| finding["paper"].as_str().unwrap().contains("Table 3"));
    assert_eq!(table3.len(), 20, "{stdout}");
    for finding in table3 {
        assert!(finding["ours"].as_f64().unwrap() > 0.0, "every program was timed: {finding}");
    }
    for finding in table2 {
        assert!(finding["paper"].as_str().unwrap().contains("Table 2"), "{finding}");
        assert_eq!(finding["verdict"], "MISSING", "a t-test needs two runs; this was one: {finding}");
    }
}

#[test]
fn paper_enwrich_runs_both_methods_and_checks_their_data() {
    let output = Command::new(FLOTILLA)
        .args(["bench", "paper", "enwrich", "--quick", "--runs", "1", "--target-kind", "dir", "--json"])
        .env_remove("FLOTILLA_META")
        .output()
        .expect("run flotilla bench paper enwrich");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let value: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let findings = value["findings"].as_array().expect("findings");
    assert_eq!(
        findings.len(),
        13,
        "3 comparisons × 3 record sizes, the cache sweep and Fig. 7's three: {stdout}"
    );
    for finding in findings {
        assert!(finding["ours"].as_f64().unwrap() > 0.0, "both methods were timed: {finding}");
    }
    let points = value["experiments"][0]["points"].as_array().expect("points");
    assert_eq!(points.len(), 24, "wnn, wbb, wrnnbb and wss × 3 record sizes × 2 methods: {stdout}");
}

#[test]
fn net_measures_every_byte_of_a_loopback_stream() {
    let value =
        bench(&["net", "--streams", "2", "--bytes-per-stream", "3m", "--transfer", "64k", "--runs", "2"]);
    assert_rates(&value, 1);
    assert_eq!(value["streams"], 2, "{value}");
    assert_eq!(value["runs_bytes_per_s"].as_array().map(Vec::len), Some(2), "{value}");
}

#[test]
fn stream_writes_and_reads_both_layouts_beside_the_net_baseline() {
    let value = bench(&[
        "stream",
        "--servers",
        "2",
        "--bytes-per-client",
        "2m",
        "--transfer",
        "256k",
        "--stripe-unit",
        "64k",
        "--runs",
        "1",
    ]);
    assert_rates(&value, 4);
    let net = value["net_median_bytes_per_s"].as_f64().expect("net median");
    assert!(net > 0.0, "{value}");
    for point in points(&value) {
        assert_eq!(point["clients"], 2, "{point}");
        let ratio = point["ratio_to_net"].as_f64().expect("ratio");
        let expected = point["median_bytes_per_s"].as_f64().unwrap() / net;
        assert!((ratio - expected).abs() <= 1e-9 * expected.max(1.0), "{point}");
    }
    let shared = points(&value).iter().filter(|p| p["files"] == "shared").count();
    assert_eq!(shared, 2, "{value}");
    assert_eq!(value["server_memory_within_cache_plus_64_mib"], true, "{value}");
    assert!(value["server_peak_rss_bytes"].as_u64().is_some_and(|rss| rss > 0), "{value}");
}

#[test]
fn stream_refuses_an_unknown_layout() {
    let output = Command::new(FLOTILLA)
        .args(["bench", "stream", "--files", "diagonal", "--runs", "1"])
        .env_remove("FLOTILLA_META")
        .output()
        .expect("run flotilla bench");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--files \"diagonal\""));
}
