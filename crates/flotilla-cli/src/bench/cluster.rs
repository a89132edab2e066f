//! The cluster a benchmark runs on: an embedded one — a `flotilla meta` process and one
//! `flotilla server` process per server, each with one target (`dir` or `sim:MODEL`) in a
//! temporary folder — or an existing one named by `--meta`.
//!
//! Servers run as their own processes so that their peak resident memory (`VmHWM`) can be
//! read, and so that they can be restarted between runs to start each run with an empty
//! buffer cache (Galley §6.2), which the `sim` targets need to measure their disks.

use anyhow::Context;
use flotilla_client::{Client, TargetState};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Fast heartbeats, so restarted servers are seen quickly; every process (workers too) uses
/// the client's integrity setting, so `[client] integrity = "none"` measures without tags,
/// and its `tokens`, `attr_cache` and `unstable_bytes_max` when the config file sets them;
/// the servers count for metrics unless `[server] metrics = false` (to measure the counting)
/// and take bulk pieces past their caches from `[server] bulk_bytes_min` (0: never).
/// Whether embedded clusters started from now on run their servers with the WriteFull
/// cache policy (`[server] write_full`; `paper enwrich` sets it for the paper's baseline).
static SERVER_WRITE_FULL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_server_write_full(on: bool) {
    SERVER_WRITE_FULL.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn config_text(integrity: flotilla_auth::Integrity) -> String {
    let integrity = integrity.name();
    let metrics = crate::keys::server_metrics();
    let bulk_bytes_min = crate::keys::server_bulk_bytes_min();
    let disk_threads = crate::keys::server_disk_threads();
    let parked = crate::keys::server_parked_requests_max();
    let write_full = SERVER_WRITE_FULL.load(std::sync::atomic::Ordering::Relaxed);
    // The workers' byte-range tokens as this process's `[client] tokens` says (default on).
    let mut tokens = crate::keys::tokens().map(|on| format!("tokens = {on}\n")).unwrap_or_default();
    if let Some(on) = crate::keys::attr_cache() {
        tokens.push_str(&format!("attr_cache = {on}\n"));
    }
    if let Some(bytes) = crate::keys::unstable_bytes_max() {
        tokens.push_str(&format!("unstable_bytes_max = {bytes}\n"));
    }
    format!(
        "[meta]\nheartbeat_ms = 200\ndown_after_ms = 3000\nintegrity = \"{integrity}\"\n\n\
         [server]\nheartbeat_ms = 200\nintegrity = \"{integrity}\"\nmetrics = {metrics}\n\
         write_full = {write_full}\nbulk_bytes_min = {bulk_bytes_min}\n\
         disk_threads_per_target = {disk_threads}\nparked_requests_max = {parked}\n\n\
         [client]\nintegrity = \"{integrity}\"\n{tokens}"
    )
}

struct Process {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    addr: String,
}

impl Process {
    /// Starts `flotilla ARGS` and waits for its `KEY=ADDR` line.
    fn start(exe: &Path, args: &[String], key: &str) -> anyhow::Result<Process> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start flotilla {args:?}"))?;
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line).context("read the start line")?;
        let Some(addr) = line.trim().strip_prefix(&format!("{key}=")).map(str::to_string) else {
            let status = child.wait()?;
            anyhow::bail!("flotilla {args:?} printed {line:?} and exited with {status}");
        };
        Ok(Process { child, _stdout: stdout, addr })
    }

    /// Peak resident memory so far, from /proc.
    fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }

    /// CPU time and bytes written so far, from /proc (`None` once it cannot be read).
    fn usage(&self) -> Option<ProcessUsage> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let ticks_per_s =
            u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|t| *t > 0)?;
        Some(ProcessUsage {
            cpu_ns: cpu_ticks_from_stat(&stat)? * (1_000_000_000 / ticks_per_s),
            written_bytes: written_bytes_from_io(&io)?,
        })
    }

    fn terminate(&self) {
        // SAFETY: kill() with a pid we spawned and a valid signal number has no memory-safety
        // preconditions.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
    }

    /// Waits for the process to exit, killing it after `timeout`.
    fn reap(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a process has used so far: CPU time (user and system, in clock ticks of 10 ms, so
/// meaningful over phases of a second or more) and bytes it handed to write calls (`wchar`:
/// page-cache writes included, before any `fsync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessUsage {
    pub cpu_ns: u64,
    pub written_bytes: u64,
}

impl ProcessUsage {
    /// What was used between `earlier` and `self`.
    pub fn since(self, earlier: ProcessUsage) -> ProcessUsage {
        ProcessUsage {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            written_bytes: self.written_bytes.saturating_sub(earlier.written_bytes),
        }
    }
}

/// utime + stime (clock ticks) from a `/proc/PID/stat` line. The command name is in
/// parentheses and may hold spaces or parentheses, so fields are counted after the last `)`.
fn cpu_ticks_from_stat(stat: &str) -> Option<u64> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    // After the name: state is field 3 of the line, utime field 14, stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `wchar` from a `/proc/PID/io` text.
fn written_bytes_from_io(io: &str) -> Option<u64> {
    io.lines().find_map(|line| line.strip_prefix("wchar:")).and_then(|v| v.trim().parse().ok())
}

/// How to build an embedded cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub servers: usize,
    /// `dir` or `sim:MODEL[,OPTION=VALUE]`.
    pub target_kind: String,
    pub cache_bytes: u64,
}

/// An embedded cluster of processes.
pub struct Embedded {
    exe: PathBuf,
    spec: ClusterSpec,
    servers: Vec<Process>,
    meta: Process,
    peak_rss_bytes: u64,
    /// Declared last: dropped after the processes are killed.
    data: tempfile::TempDir,
}

impl Embedded {
    pub fn start(spec: ClusterSpec) -> anyhow::Result<Embedded> {
        anyhow::ensure!(spec.servers >= 1, "at least one server is needed");
        check_kind(&spec.target_kind)?;
        let exe = std::env::current_exe().context("find the flotilla executable")?;
        let data = tempfile::Builder::new()
            .prefix("flotilla-bench-")
            .tempdir()
            .context("make a temporary folder")?;
        std::fs::write(data.path().join("flotilla.toml"), config_text(crate::keys::integrity()))?;
        let config = data.path().join("flotilla.toml").display().to_string();
        let meta_dir = data.path().join("meta").display().to_string();
        let keys = crate::keygen::create_cluster(&data.path().join("keys"))?;
        let server_key = keys.server.display().to_string();
        let args = [
            "--config",
            &config,
            "--key",
            &server_key,
            "meta",
            "--data",
            &meta_dir,
            "--listen",
            "127.0.0.1:0",
        ];
        let meta = Process::start(&exe, &args.map(String::from), "meta")?;
        let mut cluster = Embedded { exe, data, spec, meta, servers: Vec::new(), peak_rss_bytes: 0 };
        for index in 0..cluster.spec.servers {
            let process = cluster.start_server(index)?;
            cluster.servers.push(process);
        }
        cluster.wait_up()?;
        Ok(cluster)
    }

    pub fn meta_addr(&self) -> &str {
        &self.meta.addr
    }

    /// The cluster's keys (made in its temporary folder).
    pub fn keys(&self) -> crate::keygen::KeyPaths {
        crate::keygen::KeyPaths::in_dir(&self.data.path().join("keys"))
    }

    /// The directory of server `index`'s target.
    pub fn target_dir(&self, index: usize) -> PathBuf {
        self.data.path().join(format!("server-{index}"))
    }

    fn start_server(&self, index: usize) -> anyhow::Result<Process> {
        let dir = self.target_dir(index);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let target = match self.spec.target_kind.as_str() {
            "dir" => dir.display().to_string(),
            kind => format!("{kind}:{}", dir.display()),
        };
        let config = self.data.path().join("flotilla.toml").display().to_string();
        let server_key = self.keys().server.display().to_string();
        let args = [
            "--config",
            &config,
            "--key",
            &server_key,
            "server",
            "--meta",
            &self.meta.addr,
            "--target",
            &target,
            "--listen",
            "127.0.0.1:0",
            "--cache-bytes",
            &self.spec.cache_bytes.to_string(),
        ];
        Process::start(&self.exe, &args.map(String::from), "server")
    }

    /// Waits until every current server's target is registered and up.
    fn wait_up(&self) -> anyhow::Result<()> {
        let client = crate::keys::client_with(&self.meta.addr, Some(&self.keys().client))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = client.status()?;
            let up = |addr: &str| status.iter().any(|t| t.server == addr && t.state == TargetState::Up);
            if self.servers.iter().all(|server| up(&server.addr)) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the servers did not come up in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops every server cleanly and starts it again: every buffer cache starts empty.
    pub fn restart_servers(&mut self) -> anyhow::Result<()> {
        self.note_peak_rss();
        for server in &self.servers {
            server.terminate();
        }
        for server in &mut self.servers {
            server.reap(Duration::from_secs(60));
        }
        self.servers.clear();
        for index in 0..self.spec.servers {
            let process = self.start_server(index)?;
            self.servers.push(process);
        }
        self.wait_up()
    }

    fn note_peak_rss(&mut self) {
        let peak = self.servers.iter().map(Process::peak_rss_bytes).max().unwrap_or(0);
        self.peak_rss_bytes = self.peak_rss_bytes.max(peak);
    }

    /// Largest peak resident memory of any server process so far.
    pub fn peak_rss_bytes(&mut self) -> u64 {
        self.note_peak_rss();
        self.peak_rss_bytes
    }

    /// Stops everything cleanly.
    pub fn stop(mut self) -> u64 {
        let peak = self.peak_rss_bytes();
        for server in &self.servers {
            server.terminate();
        }
        for server in &mut self.servers {
            server.reap(Duration::from_secs(60));
        }
        self.meta.terminate();
        self.meta.reap(Duration::from_secs(10));
        peak
    }
}

fn check_kind(kind: &str) -> anyhow::Result<()> {
    if kind == "dir" {
        return Ok(());
    }
    if kind.starts_with("lines") {
        flotilla_store::TargetSpec::parse(std::path::Path::new(&format!("{kind}:/target")))
            .map_err(|error| anyhow::anyhow!("target kind {kind:?}: {error}"))?;
        return Ok(());
    }
    let Some(model) = kind.strip_prefix("sim:") else {
        anyhow::bail!("target kind {kind:?} must be dir, sim:MODEL, lines or lines+sim:MODEL");
    };
    flotilla_store::SimModel::parse(model)
        .map_err(|error| anyhow::anyhow!("target kind {kind:?}: {error}"))?;
    Ok(())
}

/// Where a benchmark runs.
pub enum Cluster {
    Embedded(Embedded),
    Attached { meta: String },
}

impl Cluster {
    /// What the embedded metadata service has used so far (`None` when attached).
    pub fn meta_usage(&self) -> Option<ProcessUsage> {
        match self {
            Cluster::Embedded(cluster) => cluster.meta.usage(),
            Cluster::Attached { .. } => None,
        }
    }

    pub fn meta_addr(&self) -> &str {
        match self {
            Cluster::Embedded(cluster) => cluster.meta_addr(),
            Cluster::Attached { meta } => meta,
        }
    }

    /// The client credential of the cluster (`--key`, config or `FLOTILLA_KEY` if attached).
    pub fn client_key(&self) -> Option<PathBuf> {
        match self {
            Cluster::Embedded(cluster) => Some(cluster.keys().client),
            Cluster::Attached { .. } => {
                crate::keys::resolve(crate::keys::client_key().as_deref(), None, "client")
                    .map(|(path, _)| path)
            }
        }
    }

    /// The config file of an embedded cluster (its workers read `[client]` from it).
    pub fn config_file(&self) -> Option<PathBuf> {
        match self {
            Cluster::Embedded(cluster) => Some(cluster.data.path().join("flotilla.toml")),
            Cluster::Attached { .. } => None,
        }
    }

    /// A client of the cluster with its client credential.
    pub fn client(&self) -> anyhow::Result<Client> {
        crate::keys::client_with(self.meta_addr(), self.client_key().as_deref())
    }

    /// Empties the servers' caches if it can (embedded clusters only).
    pub fn cold_start(&mut self) -> anyhow::Result<()> {
        match self {
            Cluster::Embedded(cluster) => cluster.restart_servers(),
            Cluster::Attached { .. } => Ok(()),
        }
    }

    pub fn peak_rss_bytes(&mut self) -> Option<u64> {
        match self {
            Cluster::Embedded(cluster) => Some(cluster.peak_rss_bytes()),
            Cluster::Attached { .. } => None,
        }
    }

    pub fn stop(self) -> Option<u64> {
        match self {
            Cluster::Embedded(cluster) => Some(cluster.stop()),
            Cluster::Attached { .. } => None,
        }
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "4161 (flotilla (x) y) S 4159 4161 4159 0 -1 4194560 9121 0 0 0 \
                    250 37 0 0 20 0 10 0 1234 56789 1000 18446744073709551615";
        assert_eq!(cpu_ticks_from_stat(stat), Some(287));
        assert_eq!(cpu_ticks_from_stat("12 (short) S 1 2"), None);
    }

    #[test]
    fn written_bytes_are_wchar() {
        let io = "rchar: 100\nwchar: 4096\nsyscr: 3\nsyscw: 2\nwrite_bytes: 8192\n";
        assert_eq!(written_bytes_from_io(io), Some(4096));
        assert_eq!(written_bytes_from_io("rchar: 1\n"), None);
    }

    #[test]
    fn usage_of_this_process_grows_and_differences_do_not_underflow() {
        let own = |stat: &str, io: &str| ProcessUsage {
            cpu_ns: cpu_ticks_from_stat(stat).unwrap(),
            written_bytes: written_bytes_from_io(io).unwrap(),
        };
        let read = || {
            own(
                &std::fs::read_to_string("/proc/self/stat").unwrap(),
                &std::fs::read_to_string("/proc/self/io").unwrap(),
            )
        };
        let before = read();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; 65536]).unwrap();
        let after = read();
        assert!(after.since(before).written_bytes >= 65536, "{before:?} {after:?}");
        assert_eq!(before.since(after).written_bytes, 0);
    }
}
