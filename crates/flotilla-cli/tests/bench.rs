//! One short end-to-end run of each `flotilla bench` workload: tiny sizes, one run each. The
//! client processes check every byte they read and the driver every byte written, so a run
//! that completes has moved the right data; speed is not asserted.

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
    assert!(stdout.contains("direction"), "{stdout}");
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
    assert_eq!(findings.len(), 20, "5 comparisons × 2 directions × 2 matrices: {stdout}");
    for finding in findings {
        assert!(finding["ours"].as_f64().unwrap() > 0.0, "every program was timed: {finding}");
        assert!(finding["paper"].as_str().unwrap().contains("Table 3"), "{finding}");
    }
}
