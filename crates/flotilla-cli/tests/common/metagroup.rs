//! A metadata group of `flotilla meta` processes for the tests (issue 33): on loopback
//! ports, or each node in its own network namespace (`netns.rs`). Each node logs to a file
//! in the group's folder (`FLOTILLA_LOG=warn,flotilla_meta=info`), so a test can read what
//! it did; every process is SIGKILLed on drop.

use super::{cli, client_key, path, server_key, test_keys, FLOTILLA};
use flotilla_proto::{MetaReply, MetaRequest};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a node takes to start, or the group to elect.
pub const GROUP_WAIT: Duration = Duration::from_secs(20);

pub struct MetaNode {
    pub id: u64,
    /// Where clients reach it.
    pub meta: String,
    /// Where its peers reach it.
    pub group: String,
    pub data: PathBuf,
    pub log: PathBuf,
    /// Extra environment of its next start.
    pub env: Vec<(String, String)>,
    /// `ip` arguments running it in its namespace (empty: this namespace).
    netns: Vec<String>,
    args: Vec<String>,
    child: Option<Child>,
}

impl MetaNode {
    /// Starts the node and waits for its `meta=ADDR` line (retrying while its port is held).
    pub fn start(&mut self) {
        let deadline = Instant::now() + GROUP_WAIT;
        loop {
            match self.spawn() {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => assert!(Instant::now() < deadline, "node {} does not start: {e}", self.id),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn spawn(&self) -> Result<Child, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let mut command = if self.netns.is_empty() {
            Command::new(FLOTILLA)
        } else {
            let mut command = Command::new("ip");
            command.args(&self.netns).arg(FLOTILLA);
            command
        };
        let mut child = command
            .args(&self.args)
            .env("FLOTILLA_KEY", client_key())
            .env("FLOTILLA_LOG", "warn,flotilla_meta=info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn node {}: {e}", self.id))?;
        let mut line = String::new();
        let read = match child.stdout.take() {
            Some(stdout) => BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string()),
            None => Err("no stdout".to_string()),
        };
        match (read, line.trim().strip_prefix("meta=")) {
            (Ok(_), Some(addr)) if addr == self.meta => Ok(child),
            (read, _) => {
                // Never left running: a node that did not start as asked is killed and reaped.
                let _ = child.kill();
                let status = child.wait().map_err(|e| e.to_string())?;
                let read = read.err().map(|e| format!(" (reading its stdout: {e})")).unwrap_or_default();
                Err(format!("node {} printed {line:?}{read} and exited with {status}", self.id))
            }
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The node's process ended by itself (reaped: `running` is false afterwards).
    pub fn exited(&mut self) -> bool {
        let ended = self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))));
        if ended {
            self.child = None;
        }
        ended
    }

    /// SIGKILL (the flotilla process itself, also in a namespace).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    /// What the node logged so far (all its starts).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for MetaNode {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct MetaGroup {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<MetaNode>,
    runtime: tokio::runtime::Runtime,
    /// Arguments every node starts with before `meta` (a `--config FILE`, or none).
    global: Vec<String>,
}

impl MetaGroup {
    /// `count` nodes on loopback ports.
    pub fn loopback(count: usize, env: &[(&str, &str)]) -> MetaGroup {
        let addrs: Vec<(String, String)> = (0..count)
            .map(|_| (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())))
            .collect();
        MetaGroup::start(addrs, |_| Vec::new(), env)
    }

    /// `loopback`, every node reading `[meta]` settings `meta_toml` (TOML lines) from a
    /// config file.
    pub fn loopback_configured(count: usize, env: &[(&str, &str)], meta_toml: &str) -> MetaGroup {
        let addrs =
            (0..count).map(|_| (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())));
        MetaGroup::start_with(addrs.collect(), |_| Vec::new(), env, Some(meta_toml))
    }

    /// Starts node `id` on fresh loopback ports with `--join` (`--peers` naming it alone):
    /// it waits, empty, to be added (`flotilla meta add`). Its index in `nodes`.
    pub fn start_joining(&mut self, id: u64) -> usize {
        let (meta, group) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
        let mut node = self.node(id, &meta, &format!("{id}={meta}/{group}"), Vec::new(), &[]);
        node.args.push("--join".into());
        node.group = group;
        node.start();
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// SIGKILLs node `index`, deletes its data (a wiped disk) and starts it again with
    /// `--join`, empty, waiting to be added again.
    pub fn wipe_and_join(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.kill();
        std::fs::remove_dir_all(&node.data).expect("wipe the node's data");
        if !node.args.iter().any(|a| a == "--join") {
            node.args.push("--join".into());
        }
        node.start();
    }

    /// One node's process description (not started), with a fresh meta credential.
    fn node(&self, id: u64, meta: &str, peers: &str, netns: Vec<String>, env: &[(&str, &str)]) -> MetaNode {
        let dir = self.dir.path();
        let ca = test_keys().join("cluster.key");
        let key = dir.join(format!("meta-{id}.cred"));
        if !key.exists() {
            let issued =
                ["keygen", "issue", "--ca", path(&ca), "--role", "meta", "--name", &format!("meta-{id}")];
            let (ok, _, stderr) = cli(&[&issued[..], &["--out", path(&key)]].concat());
            assert!(ok, "keygen issue --role meta: {stderr}");
        }
        let data = dir.join(format!("meta-{id}"));
        let mut args = self.global.clone();
        args.extend(
            [
                "--key",
                path(&server_key()),
                "meta",
                "--data",
                path(&data),
                "--listen",
                meta,
                "--node-id",
                &id.to_string(),
                "--peers",
                peers,
                "--group-key",
                path(&key),
            ]
            .map(String::from),
        );
        let log = dir.join(format!("meta-{id}.log"));
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        MetaNode {
            id,
            meta: meta.to_string(),
            group: String::new(),
            data,
            log,
            env,
            netns,
            args,
            child: None,
        }
    }

    /// One node in each namespace of `netns` (port 7770 for clients, 7771 for the group).
    pub fn in_namespaces(netns: &super::netns::Netns, count: usize, env: &[(&str, &str)]) -> MetaGroup {
        let addrs = (0..count)
            .map(|i| (format!("{}:7770", netns.address(i)), format!("{}:7771", netns.address(i))))
            .collect();
        MetaGroup::start(addrs, |i| netns.exec_prefix(i), env)
    }

    fn start(
        addrs: Vec<(String, String)>,
        netns: impl Fn(usize) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> MetaGroup {
        MetaGroup::start_with(addrs, netns, env, None)
    }

    fn start_with(
        addrs: Vec<(String, String)>,
        netns: impl Fn(usize) -> Vec<String>,
        env: &[(&str, &str)],
        meta_toml: Option<&str>,
    ) -> MetaGroup {
        let dir = tempfile::tempdir().unwrap();
        let mut global = Vec::new();
        if let Some(toml) = meta_toml {
            let config = dir.path().join("flotilla.toml");
            std::fs::write(&config, format!("[meta]\n{toml}\n")).unwrap();
            global = vec!["--config".to_string(), path(&config).to_string()];
        }
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, (meta, group))| format!("{}={meta}/{group}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut group = MetaGroup { dir, nodes: Vec::new(), runtime, global };
        for (i, (meta, group_addr)) in addrs.iter().enumerate() {
            let mut node = group.node(i as u64 + 1, meta, &peers, netns(i), env);
            node.group = group_addr.clone();
            group.nodes.push(node);
        }
        for node in &mut group.nodes {
            node.start();
        }
        group
    }

    /// Every node's client address, `a,b,c`.
    pub fn addresses(&self) -> String {
        self.nodes.iter().map(|n| n.meta.as_str()).collect::<Vec<_>>().join(",")
    }

    /// One request to one node on a fresh connection (`None`: no answer within 5 s).
    pub fn ask(&self, addr: &str, request: &MetaRequest) -> Option<MetaReply> {
        ask_on(&self.runtime, addr, request)
    }

    /// The node serving reads (the leader, its genesis applied), waiting for one.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + GROUP_WAIT;
        loop {
            for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.running()) {
                if let Some(MetaReply::Entries(_)) =
                    self.ask(&node.meta, &MetaRequest::Readdir { path: "/".into() })
                {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no node led within {GROUP_WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One request to the node at `addr` on a fresh connection (`None`: no answer within 5 s).
pub fn ask_on(runtime: &tokio::runtime::Runtime, addr: &str, request: &MetaRequest) -> Option<MetaReply> {
    runtime.block_on(async {
        let config = super::connection_config_with(&client_key());
        let call = async {
            let connection = flotilla_rpc::Connection::connect(addr, config).await.ok()?;
            connection.call::<_, MetaReply>(request, bytes::Bytes::new()).await.ok().map(|(r, _)| r)
        };
        tokio::time::timeout(Duration::from_secs(5), call).await.ok().flatten()
    })
}

/// `ask_on` with a runtime of its own (for a thread in another namespace).
pub fn ask(addr: &str, request: &MetaRequest) -> Option<MetaReply> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    ask_on(&runtime, addr, request)
}

impl Drop for MetaGroup {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Every entry of a node's stopped namespace database, as `path kind` lines in path order
/// (directories walked from the root), to compare the namespaces of the group's nodes.
pub fn dump_namespace(data: &std::path::Path) -> Vec<String> {
    let namespace =
        flotilla_namespace::Namespace::open(&data.join("namespace.redb")).expect("open the namespace");
    let mut lines = Vec::new();
    let mut dirs = vec!["/".to_string()];
    while let Some(dir) = dirs.pop() {
        for entry in namespace.readdir(&dir).expect("readdir") {
            let name = entry.name_lossy();
            let full = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
            lines.push(format!("{full} {:?} {}", entry.kind, entry.id));
            if entry.kind == flotilla_types::FileKind::Directory {
                dirs.push(full);
            }
        }
    }
    lines.sort();
    lines
}
