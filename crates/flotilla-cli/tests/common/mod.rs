//! A real cluster for integration tests: one `flotilla meta` process and N `flotilla
//! server` processes on loopback ports they pick themselves, data in a temporary folder.
//! Everything is killed and removed when the `Cluster` is dropped.
#![allow(dead_code)]

use flotilla_client::{Client, TargetState};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const FLOTILLA: &str = env!("CARGO_BIN_EXE_flotilla");

/// Fast heartbeats so that down servers are noticed quickly; `meta_extra` adds lines to the
/// `[meta]` table.
fn config_text(meta_extra: &str, server_extra: &str) -> String {
    format!(
        "[meta]\nheartbeat_ms = 200\ndown_after_ms = 1000\n{meta_extra}\n\n[server]\nheartbeat_ms = 200\n{server_extra}\n"
    )
}

pub struct Process {
    pub child: Child,
    pub addr: String,
}

impl Process {
    /// Starts `flotilla ARGS` and waits for its `KEY=ADDR` line.
    pub fn start(args: &[&str], key: &str) -> Result<Process, String> {
        let mut child = Command::new(FLOTILLA)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn flotilla {args:?}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
        let prefix = format!("{key}=");
        match line.trim().strip_prefix(&prefix) {
            Some(addr) => Ok(Process { child, addr: addr.to_string() }),
            None => {
                let status = child.wait().map_err(|e| e.to_string())?;
                Err(format!("flotilla {args:?} printed {line:?} and exited with {status}"))
            }
        }
    }

    /// SIGTERM, then wait: the clean shutdown path.
    pub fn stop(mut self) {
        // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }

    /// SIGKILL: the server disappears.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub meta: Option<Process>,
    pub servers: Vec<Option<Process>>,
}

impl Cluster {
    pub fn start(servers: usize) -> Cluster {
        Cluster::start_with(servers, "")
    }

    /// A cluster whose metadata service also gets the settings in `meta_extra` (TOML lines).
    pub fn start_with(servers: usize, meta_extra: &str) -> Cluster {
        Cluster::start_configured(servers, meta_extra, "")
    }

    /// A cluster whose `[meta]` and `[server]` tables also get these settings (TOML lines).
    pub fn start_configured(servers: usize, meta_extra: &str, server_extra: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary folder");
        let text = config_text(meta_extra, server_extra);
        std::fs::write(dir.path().join("flotilla.toml"), text).expect("write config");
        let mut cluster = Cluster { dir, meta: None, servers: Vec::new() };
        cluster.start_meta("127.0.0.1:0");
        for index in 0..servers {
            let process = cluster.start_server(index);
            cluster.servers.push(Some(process));
        }
        cluster.wait_up(servers);
        cluster
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("flotilla.toml")
    }

    pub fn target_dir(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("target-{index}"))
    }

    pub fn meta_addr(&self) -> String {
        self.meta.as_ref().expect("meta running").addr.clone()
    }

    pub fn start_meta(&mut self, listen: &str) {
        let data = self.dir.path().join("meta");
        let config = self.config();
        let args = ["--config", path(&config), "meta", "--data", path(&data), "--listen", listen];
        self.meta = Some(Process::start(&args, "meta").expect("start meta"));
    }

    pub fn start_server(&self, index: usize) -> Process {
        let target = self.target_dir(index);
        std::fs::create_dir_all(&target).expect("create target dir");
        self.start_server_on(&target)
    }

    /// Starts an I/O server of this cluster whose one target is `target` (an existing folder).
    pub fn start_server_on(&self, target: &Path) -> Process {
        self.start_server_listening(target, "127.0.0.1:0")
    }

    /// Starts an I/O server on `target` listening on `listen` (e.g. the address of a server
    /// that was killed, so clients find it again where they left it).
    pub fn start_server_listening(&self, target: &Path, listen: &str) -> Process {
        let config = self.config();
        let meta = self.meta_addr();
        let args = [
            "--config",
            path(&config),
            "server",
            "--meta",
            &meta,
            "--target",
            path(target),
            "--listen",
            listen,
        ];
        Process::start(&args, "server").expect("start server")
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.meta_addr()).expect("client")
    }

    /// Waits until `count` targets are up.
    pub fn wait_up(&self, count: usize) {
        self.wait_for(|up, _| up >= count, &format!("{count} targets up"));
    }

    /// Waits until `count` targets are down.
    pub fn wait_down(&self, count: usize) {
        self.wait_for(|_, down| down >= count, &format!("{count} targets down"));
    }

    fn wait_for(&self, done: impl Fn(usize, usize) -> bool, what: &str) {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = client.status() {
                let up = status.iter().filter(|t| t.state == TargetState::Up).count();
                if done(up, status.len() - up) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops every process cleanly and starts them again on the same folders.
    pub fn restart(&mut self) {
        for server in self.servers.iter_mut() {
            if let Some(process) = server.take() {
                process.stop();
            }
        }
        let listen = self.meta_addr();
        if let Some(meta) = self.meta.take() {
            meta.stop();
        }
        self.start_meta(&listen);
        let count = self.servers.len();
        for index in 0..count {
            self.servers[index] = Some(self.start_server(index));
        }
        self.wait_up(count);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for server in self.servers.iter_mut() {
            if let Some(process) = server.take() {
                process.kill();
            }
        }
        if let Some(meta) = self.meta.take() {
            meta.kill();
        }
    }
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs the flotilla CLI and returns (success, stdout, stderr).
pub fn cli(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(FLOTILLA).args(args).output().expect("run flotilla");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}
