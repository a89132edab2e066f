//! The cluster of the replication benchmarks (`replica-stall`, `rebuild`): one `flotilla
//! meta` and `SERVERS` `flotilla server` processes on loopback, in a temporary folder with
//! its own keys, each server in a failure group of its own; every process is SIGKILLed when
//! the cluster is dropped.

use anyhow::Context;
use flotilla_client::Client;
use flotilla_proto::{ChainMemberState, ChainReport, MetaReply, MetaRequest};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Servers (and failure groups) of the cluster.
pub(super) const SERVERS: usize = 4;

/// A process of the cluster.
pub(super) struct Child {
    child: std::process::Child,
    pub(super) addr: String,
}

impl Child {
    fn start(exe: &Path, args: &[String], key: &str) -> anyhow::Result<Child> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(exe)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("start flotilla {args:?}"))?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line).context("read the start line")?;
        // The rest of its output is read (and dropped) so the process never blocks on it.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        match line.trim().strip_prefix(&format!("{key}=")) {
            Some(addr) => Ok(Child { addr: addr.to_string(), child }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("flotilla {args:?} printed {line:?}")
            }
        }
    }

    /// SIGKILL, then reap.
    pub(super) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The cluster: its folder, the metadata service, the servers (`None` while killed).
pub(super) struct Cluster {
    exe: PathBuf,
    dir: tempfile::TempDir,
    pub(super) servers: Vec<Option<Child>>,
    meta: Child,
}

impl Cluster {
    /// The metadata service (`meta_config` added to `[meta]`: two replicas, four chains a
    /// target) and `SERVERS` servers (`server_config` added to `[server]`), one per group.
    pub(super) fn start(meta_config: &str, server_config: &str) -> anyhow::Result<Cluster> {
        let exe = std::env::current_exe().context("find the flotilla executable")?;
        let dir = tempfile::Builder::new().prefix("flotilla-stall-").tempdir().context("make a folder")?;
        crate::keygen::create_cluster(&dir.path().join("keys"))?;
        let config = format!(
            "[meta]\nchain_replicas = 2\nchains_per_target = 4\n{meta_config}\n\n[server]\n{server_config}\n\n[client]\n"
        );
        std::fs::write(dir.path().join("flotilla.toml"), config)?;
        let mut args = Cluster::common_args(dir.path());
        let data = dir.path().join("meta").display().to_string();
        args.extend(["meta", "--data", &data, "--listen", "127.0.0.1:0"].map(String::from));
        let meta = Child::start(&exe, &args, "meta")?;
        let mut cluster = Cluster { exe, dir, servers: Vec::new(), meta };
        for index in 0..SERVERS {
            let server = cluster.start_server(index)?;
            cluster.servers.push(Some(server));
        }
        Ok(cluster)
    }

    fn keys(&self) -> crate::keygen::KeyPaths {
        crate::keygen::KeyPaths::in_dir(&self.dir.path().join("keys"))
    }

    fn common_args(dir: &Path) -> Vec<String> {
        let keys = crate::keygen::KeyPaths::in_dir(&dir.join("keys"));
        let config = dir.join("flotilla.toml").display().to_string();
        vec!["--config".into(), config, "--key".into(), keys.server.display().to_string()]
    }

    pub(super) fn start_server(&self, index: usize) -> anyhow::Result<Child> {
        let target = self.dir.path().join(format!("target-{index}"));
        std::fs::create_dir_all(&target).with_context(|| format!("create {}", target.display()))?;
        let mut args = Cluster::common_args(self.dir.path());
        let (target, group) = (target.display().to_string(), format!("group-{index}"));
        let server = ["server", "--meta", &self.meta.addr, "--target", &target, "--listen", "127.0.0.1:0"];
        args.extend(server.map(String::from));
        args.extend(["--failure-group".to_string(), group]);
        Child::start(&self.exe, &args, "server")
    }

    pub(super) fn client(&self) -> anyhow::Result<Client> {
        crate::keys::client_with(&self.meta.addr, Some(&self.keys().client))
    }

    /// The metadata service's reply to `request` (one connection, the client key).
    pub(super) fn call(&self, request: &MetaRequest) -> anyhow::Result<MetaReply> {
        let credential = flotilla_auth::load_credential(
            Some(&self.keys().client),
            "flotilla",
            flotilla_auth::Role::Client,
        )?;
        let bounds = flotilla_auth::AuthBounds { integrity: crate::keys::integrity(), ..Default::default() };
        let auth = flotilla_auth::ClientAuth { credential, bounds };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let config = flotilla_rpc::ConnectionConfig::with_auth(auth);
            let connection = flotilla_rpc::Connection::connect(&self.meta.addr, config).await?;
            let (reply, _) = connection.call::<MetaRequest, MetaReply>(request, bytes::Bytes::new()).await?;
            anyhow::Ok(reply)
        })
    }

    /// The chain table as the metadata service reports it.
    pub(super) fn chains(&self) -> anyhow::Result<ChainReport> {
        match self.call(&MetaRequest::ChainStatus { chains: true })? {
            MetaReply::Chains(report) => Ok(report),
            other => anyhow::bail!("unexpected reply to a chain status: {other:?}"),
        }
    }

    /// Whether every chain has all its members serving (and there is a chain).
    pub(super) fn all_serving(&self) -> bool {
        self.chains().is_ok_and(|report| {
            !report.chains.is_empty()
                && report
                    .chains
                    .iter()
                    .all(|c| c.members.iter().all(|m| m.state == ChainMemberState::Serving))
        })
    }

    /// Polls `done` every 50 ms until it holds; fails naming `what` past `wait`.
    pub(super) fn wait(
        &self,
        what: &str,
        wait: Duration,
        done: impl Fn(&Cluster) -> bool,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        while !done(self) {
            anyhow::ensure!(started.elapsed() < wait, "{what}: not within {} ms", wait.as_millis());
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(started.elapsed())
    }
}
