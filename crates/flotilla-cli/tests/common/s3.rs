//! A real S3 server on loopback for the archive tier's tests: `s3s-fs` (from crates.io,
//! installed by scripts/test.sh into target/tools), serving a temporary folder. Each bucket is
//! a subfolder of the server's root, so the one bucket the tests use is made with mkdir before
//! the server starts. Clients reach it path-style over plain http, signed with the keys below.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The installed binary's name, under target/tools/bin.
const SERVER_BIN: &str = "s3s-fs";
/// How long the server may take to accept connections before a test gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

pub struct S3Server {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    port: u16,
    child: Option<Child>,
    // Holds the server's root (data/) and its log (server.log); removed on drop.
    dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts the server on a free loopback port with an empty bucket, and waits until it
    /// accepts connections. Panics when the binary is missing or the server does not come up.
    pub fn start() -> S3Server {
        let dir = tempfile::Builder::new()
            .prefix("flotilla-s3-")
            .tempdir()
            .expect("create the S3 server's temporary folder");
        let bucket = "flotilla-test".to_string();
        std::fs::create_dir_all(dir.path().join("data").join(&bucket)).expect("create the S3 bucket folder");
        // A free port: bind port 0, note the port, release it for the server.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("pick a free loopback port")
            .port();
        let mut server = S3Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
            access_key: "flotilla-access-key".to_string(),
            secret_key: "flotilla-secret-key".to_string(),
            port,
            child: None,
            dir,
        };
        server.spawn();
        server
    }

    /// Kills the server (SIGKILL) and waits for it; the data stays for `restart`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if running, then starts it again on the same port and data folder.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The AWS_* variables `object_store`'s `AmazonS3Builder::from_env()` reads to reach this
    /// server (path-style requests over plain http).
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_BUCKET", self.bucket.as_str()),
            ("AWS_ACCESS_KEY_ID", self.access_key.as_str()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn binary() -> PathBuf {
        match std::env::var_os("FLOTILLA_S3_SERVER") {
            Some(path) => PathBuf::from(path),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin").join(SERVER_BIN),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn spawn(&mut self) {
        let binary = Self::binary();
        assert!(
            binary.exists(),
            "S3 server binary {} is missing: run scripts/test.sh (it installs s3s-fs into \
             target/tools) or set FLOTILLA_S3_SERVER",
            binary.display()
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the S3 server's log");
        let child = Command::new(&binary)
            .arg("--host")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--access-key")
            .arg(&self.access_key)
            .arg("--secret-key")
            .arg(&self.secret_key)
            .arg(self.dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the S3 server's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start S3 server {}: {e}", binary.display()));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() >= deadline {
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                self.stop();
                match exited {
                    Some(status) => panic!(
                        "S3 server exited ({status}) before accepting connections on {addr}; \
                         its log:\n{log}"
                    ),
                    None => panic!(
                        "S3 server did not accept connections on {addr} within {READY_TIMEOUT:?}; \
                         its log:\n{log}"
                    ),
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
