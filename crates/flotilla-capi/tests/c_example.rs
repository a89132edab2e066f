//! Compiles `examples/strided.c` and `examples/group.c` with gcc against the shared library
//! and runs each against a real cluster (a metadata service and two I/O servers in this process, on loopback).

use flotilla_meta::{MetaConfig, MetaService};
use flotilla_server::{Server, ServerConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A cluster on a runtime of its own; stopped when dropped.
struct Cluster {
    meta: String,
    /// The client credential the C program gets through FLOTILLA_KEY.
    client_key: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
    stop: tokio::sync::watch::Sender<bool>,
    _data: tempfile::TempDir,
}

/// A cluster CA with a server and a client credential in `dir`.
fn make_keys(dir: &Path) -> (PathBuf, PathBuf) {
    use flotilla_auth::{ClusterCa, IssueRequest, Limits, Role};
    let ca = ClusterCa::generate();
    let issue = |role, name: &str, path: PathBuf| {
        let request =
            IssueRequest { role, name: name.into(), limits: Limits::default(), expires_unix_secs: None };
        ca.issue(request).expect("issue credential").save(&path).expect("save credential");
        path
    };
    (
        issue(Role::Server, "server", dir.join("server.cred")),
        issue(Role::Client, "client", dir.join("client.cred")),
    )
}

impl Cluster {
    fn start(servers: usize) -> Cluster {
        let data = tempfile::tempdir().expect("temporary folder");
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (server_key, client_key) = make_keys(data.path());
        let meta = runtime.block_on(async {
            let config = MetaConfig {
                data: data.path().join("meta"),
                listen: "127.0.0.1:0".to_string(),
                heartbeat_ms: 200,
                key: Some(server_key.clone()),
                ..MetaConfig::default()
            };
            let service = MetaService::bind(config).await.expect("bind meta");
            let meta = service.local_addr().to_string();
            tokio::spawn(service.serve(until(stopped.clone())));
            for index in 0..servers {
                let target = data.path().join(format!("target-{index}"));
                std::fs::create_dir_all(&target).expect("target directory");
                let config = ServerConfig {
                    meta: meta.clone(),
                    listen: "127.0.0.1:0".to_string(),
                    targets: vec![target],
                    heartbeat_ms: 200,
                    key: Some(server_key.clone()),
                    ..ServerConfig::default()
                };
                let server = Server::bind(config).await.expect("bind server");
                tokio::spawn(server.serve(until(stopped.clone())));
            }
            meta
        });
        let cluster = Cluster { meta, client_key, runtime: Some(runtime), stop, _data: data };
        cluster.wait_up(servers);
        cluster
    }

    fn wait_up(&self, servers: usize) {
        let mut config = flotilla_client::ClientConfig::new(&self.meta);
        config.key = Some(self.client_key.clone());
        let client = flotilla_client::Client::with_config(config).expect("client");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = client.status().map(|targets| targets.len()).unwrap_or(0);
            if up >= servers {
                return;
            }
            assert!(Instant::now() < deadline, "servers did not register");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

async fn until(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The folder holding libflotilla_c.so for this build (target/<profile>).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps folder");
    let profile = deps.parent().expect("profile folder");
    // `cargo test` refreshes the copy in deps/ but not the one `cargo build` put in the
    // profile folder: take the newer, so a stale library is never tested.
    let modified =
        |dir: &Path| std::fs::metadata(dir.join("libflotilla_c.so")).and_then(|m| m.modified()).ok();
    [profile, deps]
        .into_iter()
        .filter_map(|dir| modified(dir).map(|time| (time, dir)))
        .max_by_key(|(time, _)| *time)
        .map(|(_, dir)| dir.to_path_buf())
        .unwrap_or_else(|| panic!("libflotilla_c.so not found next to {}", exe.display()))
}

fn compile(crate_dir: &Path, example: &str, out: &Path) {
    let lib = library_dir();
    let status = Command::new("gcc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples").join(example))
        .arg("-L")
        .arg(&lib)
        .arg("-lflotilla_c")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(out)
        .status()
        .expect("run gcc (is it installed?)");
    assert!(status.success(), "gcc failed to build the C example {example}");
}

#[test]
fn c_example_runs_against_a_live_cluster() {
    run_example("strided.c");
}

#[test]
fn c_group_example_runs_against_a_live_cluster() {
    run_example("group.c");
}

fn run_example(example: &str) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let build = tempfile::tempdir().expect("build folder");
    let program = build.path().join(example.trim_end_matches(".c"));
    compile(crate_dir, example, &program);
    let cluster = Cluster::start(2);
    let output = Command::new(&program)
        // cargo's LD_LIBRARY_PATH would win over the rpath and could load a stale copy.
        .env_remove("LD_LIBRARY_PATH")
        .env("FLOTILLA_META", &cluster.meta)
        .env("FLOTILLA_KEY", &cluster.client_key)
        .output()
        .expect("run the C example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "C example {example} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[test]
fn c_enwrich_example_runs_against_a_live_cluster() {
    run_example("enwrich.c");
}
