//! The command line: `local`, file commands, `status` and a short benchmark run.

mod common;

use common::{cli, path, random_bytes, Cluster, Process};

#[test]
fn file_commands_round_trip() {
    let cluster = Cluster::start(4);
    let meta = cluster.meta_addr();
    let local = cluster.dir.path().join("input.bin");
    let data = random_bytes(42, 5 * 1024 * 1024 + 123);
    std::fs::write(&local, &data).unwrap();

    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&["--meta", &meta]);
        let (ok, stdout, stderr) = cli(&full);
        assert!(ok, "flotilla {args:?} failed: {stderr}");
        stdout
    };
    run(&["mkdir", "/data"]);
    run(&["put", path(&local), "/data/input.bin", "--subfiles", "4", "--layout", "stripe:64k"]);
    let listing = run(&["ls", "/data"]);
    assert_eq!(listing.trim(), "input.bin");
    let stat = run(&["stat", "/data/input.bin"]);
    assert!(stat.contains(&format!("size=5.00 MiB ({} bytes)", data.len())), "{stat}");
    assert!(stat.contains("layout=stripe:64K:0"), "the layout in --layout syntax: {stat}");
    assert_eq!(stat.matches("subfile=").count(), 4, "{stat}");
    assert!(run(&["stat", "/data/input.bin", "--bytes"]).contains(&format!("size={}\n", data.len())));
    let json: serde_json::Value = serde_json::from_str(&run(&["stat", "/data/input.bin", "--json"])).unwrap();
    assert_eq!(json["size_bytes"], data.len() as u64);
    assert_eq!(json["layout"], "stripe:64K:0");
    assert_eq!(json["subfiles"].as_array().unwrap().len(), 4);
    // `stat -`: paths from stdin answered in order, a missing one named, the command failing.
    let mut batch = std::process::Command::new(common::FLOTILLA)
        .args(["stat", "--json", "--meta", &meta, "-"])
        .env("FLOTILLA_KEY", common::client_key())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = batch.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"/data/input.bin\n/data/missing\n\n/data\n").unwrap();
    drop(stdin);
    let batch = batch.wait_with_output().unwrap();
    assert!(!batch.status.success(), "a missing path fails the batch");
    let answers: Vec<serde_json::Value> =
        String::from_utf8(batch.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0]["size_bytes"], data.len() as u64);
    assert_eq!(answers[1]["path"], "/data/missing");
    assert!(answers[1]["error"].as_str().is_some_and(|e| !e.is_empty()), "{answers:?}");
    assert_eq!(answers[2]["kind"], "directory");

    // du adds up what is under a path; df and status show space per target and in total.
    run(&["mkdir", "/data/sub"]);
    run(&["put", path(&local), "/data/sub/copy.bin"]);
    let du: serde_json::Value = serde_json::from_str(&run(&["du", "/data", "--json"])).unwrap();
    assert_eq!(du["size_bytes"], 2 * data.len() as u64, "{du}");
    assert_eq!((du["files"].as_u64(), du["directories"].as_u64()), (Some(2), Some(2)), "{du}");
    let du = run(&["du", "/data"]);
    assert!(du.starts_with("10.0 MiB\t/data\t(2 files, 2 directories"), "{du}");
    let df = run(&["df"]);
    assert_eq!(df.lines().count(), 6, "a header, 4 targets and a total: {df}");
    assert!(df.lines().last().unwrap().starts_with("total") && df.contains(" up "), "{df}");
    let df: serde_json::Value = serde_json::from_str(&run(&["df", "--json"])).unwrap();
    let targets = df["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 4);
    let free: u64 = targets.iter().map(|t| t["free_bytes"].as_u64().unwrap()).sum();
    assert_eq!(df["total"]["free_bytes"].as_u64(), Some(free));
    assert!(free > 0, "{df}");
    run(&["rm", "/data/sub/copy.bin"]);
    run(&["rm", "/data/sub"]);

    let out = cluster.dir.path().join("output.bin");
    run(&["get", "/data/input.bin", path(&out)]);
    assert!(std::fs::read(&out).unwrap() == data, "get returned different bytes");

    run(&["fork", "create", "/data/input.bin", "index", "--subfile", "2"]);
    let forks = run(&["fork", "ls", "/data/input.bin"]);
    assert_eq!(forks.matches("fork=data").count(), 4, "{forks}");
    assert!(forks.contains("subfile=2 fork=index size=0"), "{forks}");
    run(&["fork", "rm", "/data/input.bin", "index", "--subfile", "2"]);
    assert!(!run(&["fork", "ls", "/data/input.bin"]).contains("index"));

    let status = run(&["status"]);
    assert_eq!(status.lines().filter(|l| l.contains("state=up")).count(), 4, "{status}");
    assert!(status.contains(" free=\"") && status.contains("iB\""), "human units: {status}");
    assert_eq!(run(&["status", "--bytes"]).matches("free_bytes=").count(), 4);
    let status: serde_json::Value = serde_json::from_str(&run(&["status", "--json"])).unwrap();
    assert!(status["targets"].as_array().unwrap().iter().all(|t| t["state"] == "up"), "{status}");

    run(&["rm", "/data/input.bin"]);
    run(&["rm", "/data"]);
    let (ok, _, stderr) = cli(&["stat", "/data", "--meta", &meta]);
    assert!(!ok && stderr.contains("no such file"), "{stderr}");
    let (ok, _, stderr) = cli(&["mkdir", "/x/../y", "--meta", &meta]);
    assert!(!ok && stderr.contains(".."), "{stderr}");
}

#[test]
fn local_runs_an_embedded_cluster_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let local = Process::start(
        &["local", "--servers", "2", "--data", path(&data), "--listen", "127.0.0.1:0"],
        "meta",
    )
    .unwrap();
    let meta = local.addr.clone();
    let key = local.credential.clone().expect("key= line");
    assert_eq!(key, data.join("keys").join("client.cred"));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "credential file mode");
    let key_bytes = std::fs::read(&key).unwrap();
    let key = path(&key).to_string();
    let (ok, _, stderr) = cli(&["status", "--meta", &meta]);
    assert!(!ok && stderr.contains("cluster's CA"), "the shared test key is not this cluster's: {stderr}");
    let (ok, status, stderr) = cli(&["--key", &key, "status", "--meta", &meta]);
    assert!(ok, "{stderr}");
    assert_eq!(status.lines().filter(|l| l.contains("state=up")).count(), 2, "{status}");
    let (ok, _, stderr) = cli(&["--key", &key, "mkdir", "/kept", "--meta", &meta]);
    assert!(ok, "{stderr}");
    let mut child = local.child;
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let exit = child.wait().unwrap();
    assert!(exit.success(), "flotilla local did not shut down cleanly: {exit}");

    // Same data folder again: the namespace is still there.
    let again = Process::start(
        &["local", "--servers", "2", "--data", path(&data), "--listen", "127.0.0.1:0"],
        "meta",
    )
    .unwrap();
    assert_eq!(std::fs::read(again.credential.as_ref().unwrap()).unwrap(), key_bytes, "keys reused");
    let (ok, listing, stderr) = cli(&["--key", &key, "ls", "/", "--meta", &again.addr]);
    assert!(ok, "{stderr}");
    assert_eq!(listing.trim(), "kept/");
    again.stop();
}

#[test]
fn interleaved_benchmark_runs_end_to_end() {
    let (ok, stdout, stderr) = cli(&[
        "bench",
        "interleaved",
        "--servers",
        "2",
        "--clients",
        "2",
        "--record",
        "64",
        "--fork-bytes",
        "65536",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(ok, "bench failed: {stderr}");
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    for mode in ["traditional", "strided"] {
        let rate = value[mode]["median_bytes_per_s"].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0, "{mode} rate missing in {stdout}");
    }
    assert!(value["ratio_of_medians"].as_f64().unwrap_or(0.0) > 0.0);
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, script, stderr) = cli(&["completions", shell]);
        assert!(ok, "completions {shell}: {stderr}");
        for command in ["status", "df", "du", "put", "mount", "keygen"] {
            assert!(script.contains(command), "{shell} completions lack {command}");
        }
    }
    let (ok, _, stderr) = cli(&["completions", "tcsh"]);
    assert!(!ok && stderr.contains("tcsh"), "an unknown shell is named: {stderr}");
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let (ok, _, stderr) = cli(&["man", path(&pages)]);
    assert!(ok, "{stderr}");
    let main = std::fs::read_to_string(pages.join("flotilla.1")).unwrap();
    assert!(main.contains(".TH flotilla") && main.contains("parallel file system"), "{main}");
    let df = std::fs::read_to_string(pages.join("flotilla-df.1")).unwrap();
    assert!(df.contains("Space per storage target") && df.contains("\\-\\-json"), "{df}");
    assert!(!pages.join("flotilla-bench-worker.1").exists(), "no page for a hidden command");
}
