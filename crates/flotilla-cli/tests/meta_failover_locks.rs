//! fcntl locks survive a failover of the metadata group (issue 33, "what lives only in
//! memory … reclaimed by clients during a grace period after an election"): the locks live
//! in the leader's memory only; a node elected after the leader is SIGKILLed starts a grace
//! period (`lock_reclaim_ms`) in which only reclaimed locks are granted, and the mounts,
//! following the leader with `--meta a,b,c`, present theirs on the new connection.
//!
//! Real processes: three `flotilla meta` nodes with a group key, one I/O server and two
//! `flotilla mount` processes given every metadata address; locks taken with fcntl by this
//! process (mount A) and by Python processes (mount B). Needs root (to mount).

mod common;
mod locking;

use common::{cli, client_key, path, server_key, test_keys, Mount, Process};
use flotilla_proto::{MetaReply, MetaRequest};
use flotilla_rpc::Connection;
use locking::{check, set_lock, TEST_LOCK, TRY_LOCKF};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The grace period the nodes are configured with, in ms.
const RECLAIM_MS: u64 = 3000;
/// Longest the test waits for a node to start or a leader to be elected.
const WAIT: Duration = Duration::from_secs(15);

fn python(script: &str, file: &Path) -> String {
    let output = Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .stdout(Stdio::piped())
        .output()
        .expect("run python3");
    assert!(output.status.success(), "python3 failed: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Three metadata nodes of one group (killed when dropped).
struct Group {
    _dir: tempfile::TempDir,
    /// (client address, process) of each node.
    nodes: Vec<(String, Option<Process>)>,
    runtime: tokio::runtime::Runtime,
}

impl Group {
    fn start() -> Group {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, (meta, group))| format!("{}=127.0.0.1:{meta}/127.0.0.1:{group}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let config = dir.path().join("flotilla.toml");
        std::fs::write(&config, format!("[meta]\nlock_reclaim_ms = {RECLAIM_MS}\n")).unwrap();
        let ca = test_keys().join("cluster.key");
        let server_key = server_key();
        let mut nodes = Vec::new();
        for (i, (meta, _)) in ports.iter().enumerate() {
            let id = (i + 1).to_string();
            let key = dir.path().join(format!("meta-{id}.cred"));
            let name = format!("meta-{id}");
            let issue = [
                "keygen",
                "issue",
                "--ca",
                path(&ca),
                "--role",
                "meta",
                "--name",
                &name,
                "--out",
                path(&key),
            ];
            let (ok, _, stderr) = cli(&issue);
            assert!(ok, "keygen issue --role meta: {stderr}");
            let data = dir.path().join(&name);
            let args = [
                "--config",
                path(&config),
                "--key",
                path(&server_key),
                "meta",
                "--data",
                path(&data),
                "--node-id",
                &id,
                "--peers",
                &peers,
                "--group-key",
                path(&key),
            ];
            let process = Process::start(&args, "meta").expect("start a metadata node");
            nodes.push((format!("127.0.0.1:{meta}"), Some(process)));
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Group { _dir: dir, nodes, runtime }
    }

    /// Every node's client address, as `--meta` takes them.
    fn addresses(&self) -> String {
        self.nodes.iter().map(|(addr, _)| addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The running node that serves requests (waits for an election, bounded).
    fn leader(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            for (addr, process) in &self.nodes {
                if process.is_some() && self.serves(addr) {
                    return addr.clone();
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `addr` answers a listing (not `NotServed`).
    fn serves(&self, addr: &str) -> bool {
        self.runtime.block_on(async {
            let config = common::connection_config_with(&client_key());
            let call = async {
                let connection = Connection::connect(addr, config).await.ok()?;
                let request = MetaRequest::Readdir { path: "/".into() };
                connection.call::<_, MetaReply>(&request, bytes::Bytes::new()).await.ok().map(|(r, _)| r)
            };
            let reply = tokio::time::timeout(Duration::from_secs(5), call).await.ok().flatten();
            matches!(reply, Some(MetaReply::Entries(_)))
        })
    }

    fn kill(&mut self, addr: &str) {
        let node = self.nodes.iter_mut().find(|(a, _)| a == addr).expect("a node at addr");
        node.1.take().expect("the node runs").kill();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for (_, process) in &mut self.nodes {
            if let Some(process) = process.take() {
                process.kill();
            }
        }
    }
}

/// A process killed when dropped (also when the test fails).
struct KillOnDrop(Option<Process>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(process) = self.0.take() {
            process.kill();
        }
    }
}

fn start_server(meta: &str, target: &Path) -> KillOnDrop {
    let key = server_key();
    let args =
        ["--key", path(&key), "server", "--meta", meta, "--target", path(target), "--listen", "127.0.0.1:0"];
    KillOnDrop(Some(Process::start(&args, "server").expect("start the I/O server")))
}

/// A write lock taken through mount A outlives a SIGKILL of the group's leader: the new
/// leader grants only reclaims during its grace period, so mount B's conflicting F_SETLK
/// fails (EAGAIN) during the period and after it, and F_GETLK on B reports the lock; once A
/// unlocks, B gets it.
#[test]
fn a_held_lock_survives_a_failover_of_the_metadata_group() {
    let mut group = Group::start();
    let first = group.leader();
    let meta = group.addresses();
    let target = tempfile::tempdir().unwrap();
    let _server = start_server(&meta, &common::target_spec(target.path()));
    let (a, b) = (Mount::start(&meta), Mount::start(&meta));
    std::fs::write(a.path("locked"), b"0123456789abcdef").unwrap();
    let holder = std::fs::OpenOptions::new().read(true).write(true).open(a.path("locked")).unwrap();
    check(set_lock(holder.as_raw_fd(), libc::F_WRLCK), "F_SETLK through mount A");
    assert_eq!(python(TRY_LOCKF, &b.path("locked")), "busy", "B locked what A holds");

    let killed = Instant::now();
    group.kill(&first);
    let second = group.leader();
    assert_ne!(second, first);
    println!("{second} leads {:?} after {first} was killed", killed.elapsed());
    // Through the grace period and a while after it, B never gets A's lock.
    let until = Instant::now() + Duration::from_millis(RECLAIM_MS + 2000);
    let mut tries = 0;
    while Instant::now() < until {
        let answer = python(TRY_LOCKF, &b.path("locked"));
        assert_eq!(answer, "busy", "B got A's lock {:?} after the leader was killed", killed.elapsed());
        tries += 1;
    }
    assert!(tries >= 2, "only {tries} attempts in the window");
    assert_eq!(python(TEST_LOCK, &b.path("locked")), "held", "F_GETLK on B sees A's lock");

    check(set_lock(holder.as_raw_fd(), libc::F_UNLCK), "F_UNLCK through mount A");
    assert_eq!(python(TRY_LOCKF, &b.path("locked")), "got", "B gets the lock A let go");
}
