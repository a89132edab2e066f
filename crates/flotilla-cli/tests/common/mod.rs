//! A real cluster for integration tests: one `flotilla meta` process and N `flotilla
//! server` processes on loopback ports they pick themselves, data in a temporary folder.
//! Everything is killed and removed when the `Cluster` is dropped.
#![allow(dead_code)]

pub mod enwrich_member;
pub mod metagroup;
pub mod netns;
pub mod replication;
pub mod s3;

use flotilla_client::{Client, TargetState};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const FLOTILLA: &str = env!("CARGO_BIN_EXE_flotilla");

/// Fast heartbeats so that down servers are noticed quickly; `meta_extra` adds lines to the
/// `[meta]` table, `server_extra` to the `[server]` table. Every process gets the shared
/// test keys.
fn config_text(meta_extra: &str, server_extra: &str) -> String {
    let (server, client) = (server_key(), client_key());
    format!(
        "[meta]\nheartbeat_ms = 200\ndown_after_ms = 1000\nkey = {server:?}\n{meta_extra}\n\n\
         [server]\nheartbeat_ms = 200\nkey = {server:?}\n{server_extra}\n\n[client]\nkey = {client:?}\n"
    )
}

/// The keys every cluster of the tests shares (made once by `flotilla keygen`, kept in
/// cargo's target tmp folder and reused by later runs).
pub fn test_keys() -> &'static Path {
    static KEYS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flotilla-test-keys");
        if !dir.join("client.cred").exists() {
            // Made aside and renamed into place, so concurrent test binaries agree on one set.
            let fresh = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("flotilla-test-keys-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&fresh);
            let (ok, _, stderr) = cli_without_key(&["keygen", "--out", path(&fresh)]);
            assert!(ok, "flotilla keygen: {stderr}");
            if std::fs::rename(&fresh, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&fresh);
            }
        }
        dir
    })
}

/// A client of the metadata service at `meta` with the shared test client credential.
pub fn client_at(meta: &str) -> Client {
    let mut config = flotilla_client::ClientConfig::new(meta);
    config.key = Some(client_key());
    Client::with_config(config).expect("client")
}

/// A copy of the shared client credential that user `uid` can read (in a new folder under
/// `dir`), for tests that run commands as another user.
pub fn client_key_for(dir: &Path, uid: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let folder = dir.join(format!("key-for-{uid}"));
    std::fs::create_dir_all(&folder).expect("key folder");
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).expect("key folder mode");
    let copy = folder.join("client.cred");
    std::fs::copy(client_key(), &copy).expect("copy the client credential");
    std::os::unix::fs::chown(&copy, Some(uid), Some(uid)).expect("chown the credential copy");
    copy
}

/// The shared test client credential.
pub fn client_key() -> PathBuf {
    test_keys().join("client.cred")
}

/// The shared test server credential.
pub fn server_key() -> PathBuf {
    test_keys().join("server.cred")
}

pub struct Process {
    pub child: Child,
    pub addr: String,
    /// The `key=PATH` line `flotilla local` prints after its `meta=` line.
    pub credential: Option<PathBuf>,
}

impl Process {
    /// Starts `flotilla ARGS` and waits for its `KEY=ADDR` line.
    pub fn start(args: &[&str], key: &str) -> Result<Process, String> {
        Process::start_with_env(args, key, &[])
    }

    /// `start` with extra environment variables.
    pub fn start_with_env(args: &[&str], key: &str, env: &[(String, String)]) -> Result<Process, String> {
        let mut child = Command::new(FLOTILLA)
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .env("FLOTILLA_KEY", client_key())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn flotilla {args:?}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        let prefix = format!("{key}=");
        let mut credential = None;
        if args.first() == Some(&"local") {
            let mut next = String::new();
            stdout.read_line(&mut next).map_err(|e| e.to_string())?;
            let key =
                next.trim().strip_prefix("key=").ok_or(format!("no key= line after meta=: {next:?}"))?;
            credential = Some(PathBuf::from(key));
        }
        match line.trim().strip_prefix(&prefix) {
            Some(addr) => Ok(Process { child, addr: addr.to_string(), credential }),
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
    /// Environment variables every I/O server started from now on gets.
    pub server_env: Vec<(String, String)>,
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
        let mut cluster = Cluster { dir, meta: None, servers: Vec::new(), server_env: Vec::new() };
        cluster.start_meta("127.0.0.1:0");
        for index in 0..servers {
            let process = cluster.start_server(index);
            cluster.servers.push(Some(process));
        }
        cluster.wait_up(servers);
        cluster
    }

    /// A metadata service and `servers` I/O servers, server `i` on the target spec
    /// `spec(target_dir(i))` (e.g. a lines target with options), `server_extra` added to
    /// `[server]` and `env` given to every server.
    pub fn start_on_specs(
        servers: usize,
        spec: impl Fn(&Path) -> PathBuf,
        server_extra: &str,
        env: Vec<(String, String)>,
    ) -> Cluster {
        let mut cluster = Cluster::start_configured(0, "", server_extra);
        cluster.server_env = env;
        for index in 0..servers {
            let dir = cluster.target_dir(index);
            std::fs::create_dir_all(&dir).expect("create target dir");
            let process = cluster.start_server_on(&spec(&dir));
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
        self.start_server_advertising(target, listen, None)
    }

    /// `start_server_listening`, telling the metadata service to send clients to `advertise`
    /// (e.g. a relay in front of the server) instead of the listening address.
    pub fn start_server_advertising(&self, target: &Path, listen: &str, advertise: Option<&str>) -> Process {
        let config = self.config();
        let meta = self.meta_addr();
        let target = &target_spec(target);
        let mut args = vec!["--config", path(&config), "server", "--meta", &meta, "--target", path(target)];
        args.extend_from_slice(&["--listen", listen]);
        if let Some(advertise) = advertise {
            args.extend_from_slice(&["--advertise", advertise]);
        }
        Process::start_with_env(&args, "server", &self.server_env).expect("start server")
    }

    /// Starts I/O server `index` on its own target folder, declaring failure group `group`.
    pub fn start_server_in_group(&self, index: usize, group: &str) -> Process {
        self.start_server_in_group_with(index, group, &[])
    }

    /// [`Cluster::start_server_in_group`] with `extra` arguments for `flotilla server`
    /// (e.g. `--metrics-listen ADDR`).
    pub fn start_server_in_group_with(&self, index: usize, group: &str, extra: &[&str]) -> Process {
        let dir = self.target_dir(index);
        std::fs::create_dir_all(&dir).expect("target folder");
        let (config, meta) = (self.config(), self.meta_addr());
        let mut args = server_args(&config, &meta, &dir, "127.0.0.1:0", group);
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Process::start_with_env(&args, "server", &self.server_env).expect("start server")
    }

    pub fn client(&self) -> Client {
        client_at(&self.meta_addr())
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

/// A server's target: the folder itself, or, when `FLOTILLA_TEST_TARGET_KIND` names a kind
/// (`lines`, `lines+sim:st31200n`, ...), that kind on the folder, so a whole test file can
/// run against another target kind (scripts/test.sh runs the service tests on `lines`).
pub fn target_spec(target: &Path) -> PathBuf {
    match std::env::var("FLOTILLA_TEST_TARGET_KIND") {
        Ok(kind) if !kind.is_empty() && kind != "dir" && target.is_dir() => {
            PathBuf::from(format!("{kind}:{}", target.display()))
        }
        _ => target.to_path_buf(),
    }
}

/// The arguments of `flotilla server` on target folder `dir` (as `target_spec` names it),
/// listening on `listen`, in failure group `group`.
pub fn server_args(config: &Path, meta: &str, dir: &Path, listen: &str, group: &str) -> Vec<String> {
    let target = target_spec(dir);
    let args = ["--config", path(config), "server", "--meta", meta, "--target", path(&target)];
    let rest = ["--listen", listen, "--failure-group", group];
    args.iter().chain(rest.iter()).map(|arg| arg.to_string()).collect()
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs the flotilla CLI with the shared test client credential and returns (success,
/// stdout, stderr).
pub fn cli(args: &[&str]) -> (bool, String, String) {
    run_cli(Command::new(FLOTILLA).args(args).env("FLOTILLA_KEY", client_key()))
}

/// Runs the flotilla CLI with the shared test client credential; fails the test if it
/// fails (naming its arguments and stderr); returns its stdout.
pub fn cli_ok(args: &[&str]) -> String {
    let (ok, stdout, stderr) = cli(args);
    assert!(ok, "flotilla {args:?} failed: {stderr}");
    stdout
}

/// Runs the flotilla CLI without any credential in its environment.
pub fn cli_without_key(args: &[&str]) -> (bool, String, String) {
    run_cli(Command::new(FLOTILLA).args(args).env_remove("FLOTILLA_KEY"))
}

fn run_cli(command: &mut Command) -> (bool, String, String) {
    let output = command.output().expect("run flotilla");
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

/// A raw connection after a completed handshake: tests write frames made by `sealer`
/// (or any bytes) to `stream` and read replies from it.
pub struct RawConnection {
    pub stream: std::net::TcpStream,
    pub sealer: flotilla_auth::Sealer,
    pub opener: flotilla_auth::Opener,
    pub peer: flotilla_auth::Peer,
}

impl RawConnection {
    /// A frame with its integrity tag, ready to write.
    pub fn frame(&mut self, request_id: u64, body: &[u8], data: &[u8]) -> Vec<u8> {
        self.sealer.seal_frame(request_id, body, data).expect("seal frame")
    }
}

/// Connects to `addr` and completes the handshake with the credential at `key`.
pub fn raw_connect(addr: &str, key: &Path) -> Result<RawConnection, String> {
    let credential = flotilla_auth::load_credential(Some(key), "the test", flotilla_auth::Role::Client)
        .or_else(|_| flotilla_auth::load_credential(Some(key), "the test", flotilla_auth::Role::Server))
        .map_err(|e| e.to_string())?;
    let auth = flotilla_auth::ClientAuth { credential, bounds: flotilla_auth::AuthBounds::default() };
    let stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    authenticate(stream, auth)
}

/// Runs the client side of the handshake on an already connected `stream`.
pub fn authenticate(
    stream: std::net::TcpStream,
    auth: flotilla_auth::ClientAuth,
) -> Result<RawConnection, String> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (stream, secured) = runtime.block_on(async {
        let mut stream = tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())?;
        let secured = auth.connect(&mut stream).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((stream, secured))
    })?;
    let stream = stream.into_std().map_err(|e| e.to_string())?;
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    Ok(RawConnection { stream, sealer: secured.sealer, opener: secured.opener, peer: secured.peer })
}

/// Connection settings with the shared test client credential.
pub fn connection_config() -> flotilla_rpc::ConnectionConfig {
    connection_config_with(&client_key())
}

/// Connection settings with the credential at `key`.
pub fn connection_config_with(key: &Path) -> flotilla_rpc::ConnectionConfig {
    let credential = flotilla_auth::load_credential(Some(key), "the test", flotilla_auth::Role::Client)
        .or_else(|_| flotilla_auth::load_credential(Some(key), "the test", flotilla_auth::Role::Server))
        .expect("load test credential");
    let auth = flotilla_auth::ClientAuth { credential, bounds: flotilla_auth::AuthBounds::default() };
    flotilla_rpc::ConnectionConfig::with_auth(auth)
}

/// Asserts that a legitimate client still creates, writes and reads a file on `cluster`
/// (after an attack or a refusal).
pub fn assert_still_serving(cluster: &Cluster) {
    use flotilla_client::{CreateOptions, Shape};
    let client = cluster.client();
    let name = format!("/canary-{}", rand::random::<u64>());
    let file = client.create(&name, &CreateOptions::default()).unwrap();
    let fork = file.fork(0, "data").unwrap();
    fork.write(&Shape::contiguous(0, 6), b"canary").unwrap();
    let mut back = [0u8; 6];
    fork.read(&Shape::contiguous(0, 6), &mut back).unwrap();
    assert_eq!(&back, b"canary");
}

/// Whether `dir` is a mount point now (per /proc/self/mounts).
pub fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let wanted = dir.to_string_lossy();
    mounts.lines().any(|line| line.split(' ').nth(1) == Some(&*wanted))
}

/// A `flotilla local` process and what it printed: `meta=`, `key=`, `metrics=`.
pub struct Local {
    pub child: Child,
    pub meta: String,
    pub key: PathBuf,
    pub metrics: Option<String>,
    _dir: tempfile::TempDir,
}

impl Local {
    /// The sum of the metadata service's counter `name` over its labels (its metrics
    /// endpoint; 0 if it is not listed).
    pub fn meta_counter(&self, name: &str) -> u64 {
        let addr = self.metrics.as_deref().expect("a metrics endpoint");
        let text = http_get(addr, "/metrics").expect("scrape the metrics");
        text.lines()
            .filter(|line| line.split(['{', ' ']).next() == Some(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

impl Local {
    pub fn start(servers: usize, metrics: bool) -> Local {
        let servers = servers.to_string();
        Local::start_with(&[], &["--servers", &servers], metrics)
    }

    /// `flotilla GLOBAL… local LOCAL… --listen 127.0.0.1:0 --data DIR/data` in a new
    /// temporary folder DIR.
    pub fn start_with(global: &[&str], local: &[&str], metrics: bool) -> Local {
        let dir = tempfile::tempdir().expect("temporary folder");
        let data = dir.path().join("data");
        let mut args: Vec<&str> = global.to_vec();
        args.push("local");
        args.extend(local);
        args.extend(["--listen", "127.0.0.1:0", "--data", path(&data)]);
        if metrics {
            args.extend(["--metrics-listen", "127.0.0.1:0"]);
        }
        let mut child = Command::new(FLOTILLA)
            .args(&args)
            .env_remove("FLOTILLA_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flotilla local");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut next = |name: &str| {
            let line = lines.next().expect("a line from flotilla local").expect("utf-8 line");
            line.strip_prefix(&format!("{name}="))
                .unwrap_or_else(|| panic!("expected {name}=, got {line:?}"))
                .to_string()
        };
        let (meta, key) = (next("meta"), PathBuf::from(next("key")));
        let metrics = metrics.then(|| next("metrics"));
        // Keep reading stdout so the process never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Local { child, meta, key, metrics, _dir: dir }
    }

    /// Requests of `kind` (a `MetaRequest` variant in snake case) the metadata service
    /// answered so far, from its metrics endpoint (`start(_, true)`).
    pub fn meta_requests(&self, kind: &str) -> u64 {
        let addr = self.metrics.as_deref().expect("a metrics endpoint");
        let text = http_get(addr, "/metrics").expect("scrape the metrics");
        let label = format!("kind=\"{kind}\"");
        text.lines()
            .filter(|line| line.starts_with("flotilla_meta_request_duration_seconds_count"))
            .filter(|line| line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// `flotilla ARGS` against this cluster, with `env` set; (success, stdout, stderr).
    pub fn cli(&self, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
        let mut command = Command::new(FLOTILLA);
        command.arg("--key").arg(&self.key).args(args).env("FLOTILLA_META", &self.meta);
        command.env_remove("SLURM_JOB_ID").env_remove("FLOTILLA_JOB");
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().expect("run flotilla");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (output.status.success(), text(&output.stdout), text(&output.stderr))
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Local {
    /// A library client of this cluster with its credential.
    pub fn client(&self) -> Client {
        let mut config = flotilla_client::ClientConfig::new(&self.meta);
        config.key = Some(self.key.clone());
        Client::with_config(config).expect("client")
    }
}

/// A plain HTTP GET; returns the body of a 200 reply.
pub fn http_get(addr: &str, target: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let request = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    // Prometheus answers small queries in one piece, without chunked encoding.
    Ok(body.to_string())
}

/// The seed of a randomized test: `FLOTILLA_CRASH_SEED` if set, else the clock; printed so
/// a failure can be repeated.
pub fn seed_for(test: &str) -> u64 {
    let seed = std::env::var("FLOTILLA_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("{test}: seed {seed} (FLOTILLA_CRASH_SEED={seed} repeats it)");
    seed
}

/// Kills the metadata service with SIGKILL and starts it again on the same data and address.
pub fn kill_and_restart_meta(cluster: &mut Cluster) {
    let process = cluster.meta.take().expect("meta running");
    let addr = process.addr.clone();
    process.kill();
    cluster.start_meta(&addr);
}

/// A `flotilla mount` process with the kernel's name and attribute caching off (so a change
/// made through another mount is seen at once, not after a timeout); unmounted when dropped.
pub struct Mount {
    pub process: Option<Process>,
    pub dir: PathBuf,
    _holder: tempfile::TempDir,
}

impl Mount {
    pub fn start(meta: &str) -> Mount {
        Mount::start_with(meta, &[])
    }

    /// A mount with extra `flotilla mount` arguments (`--key` for a `flotilla local`
    /// cluster's credential, `--tokens off`, ...).
    pub fn start_with(meta: &str, extra: &[&str]) -> Mount {
        let mut args = vec!["--attr-timeout-ms", "0"];
        args.extend_from_slice(extra);
        Mount::start_default_timeouts(meta, &args)
    }

    /// A mount with `flotilla mount`'s own timeouts (the kernel caches names and attributes
    /// as on a user's mount), and extra arguments.
    pub fn start_default_timeouts(meta: &str, extra: &[&str]) -> Mount {
        use std::os::unix::fs::PermissionsExt;
        let holder = tempfile::tempdir().expect("temporary folder");
        std::fs::set_permissions(holder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = holder.path().join("mnt");
        let mut args = vec!["mount", "--meta", meta];
        args.extend_from_slice(extra);
        args.push(path(&dir));
        let process = Process::start(&args, "mount").expect("start flotilla mount");
        assert!(is_mounted(&dir), "{} is not mounted", dir.display());
        Mount { process: Some(process), dir, _holder: holder }
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
            unsafe { libc::kill(process.child.id() as i32, libc::SIGTERM) };
            let _ = process.child.wait();
        }
        if is_mounted(&self.dir) {
            let _ = Command::new(FLOTILLA).args(["umount", "--lazy", path(&self.dir)]).status();
        }
    }
}

// ---- sparse (issue 31 item 1) ----

impl Local {
    /// The cluster's `--data` directory (servers' targets under `server-N/`).
    pub fn data_dir(&self) -> PathBuf {
        self._dir.path().join("data")
    }
}

/// Bytes allocated on disk (`st_blocks` × 512) to every file under `dir`, recursively.
pub fn allocated_bytes_under(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => allocated_bytes_under(&entry.path()),
            Ok(metadata) => metadata.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The value of `key=` in a line `flotilla status` prints.
pub fn status_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// A target id as `flotilla status` prints it (hex).
pub fn hex_target(text: &str) -> flotilla_types::TargetId {
    flotilla_types::TargetId(u64::from_str_radix(text, 16).expect("a target id in hex"))
}
