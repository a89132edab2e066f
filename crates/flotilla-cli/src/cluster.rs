//! `flotilla local`, `flotilla meta` and `flotilla server`.

use crate::config::FileConfig;
use crate::process::{announce, shutdown_signal};
use anyhow::Context;
use clap::Args;
use flotilla_meta::{MetaConfig, MetaService};
use flotilla_proto::{MetaReply, MetaRequest};
use flotilla_rpc::{Connection, ConnectionConfig};
use flotilla_server::{Server, ServerConfig};
use flotilla_types::Layout;
use readiness::wait_for_targets;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Args)]
pub struct LocalArgs {
    /// Number of I/O servers (each with one target).
    #[arg(long)]
    servers: Option<usize>,
    /// Folder holding all data (namespace and targets).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address of the metadata service.
    #[arg(long)]
    listen: Option<String>,
    /// Buffer cache of each I/O server, in bytes.
    #[arg(long)]
    cache_bytes: Option<u64>,
    /// Kind of every server's target: dir, or sim:MODEL for a simulated 1990s disk
    /// (hp97560, st31200n; data still kept in the folder), or lines[,OPTIONS] for RAMA disk
    /// lines in one preallocated image (lines+sim:MODEL: on a simulated disk).
    #[arg(long)]
    target_kind: Option<String>,
    /// Also mount the cluster (POSIX, through FUSE) on this directory; unmounted on shutdown.
    #[arg(long)]
    mount: Option<PathBuf>,
    /// Metadata nodes: 1 (default) is one service on the direct path; 3 or 5 start a
    /// metadata group on loopback (data in DATA/meta-N; see `flotilla meta --node-id`).
    #[arg(long, default_value_t = 1)]
    meta_replicas: u64,
    /// Protection of every connection's frames: mac (default), encrypt, or none (for
    /// measuring). Sets [meta] and [server] integrity; clients are raised to it in the
    /// handshake.
    #[arg(long)]
    integrity: Option<flotilla_auth::Integrity>,
    /// Serve the metrics of every service of the cluster on this address, each labelled
    /// `service="meta"` or `service="server-N"`; off by default.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Attach a tertiary archive to every server: a directory (absolute path) or
    /// s3://BUCKET/PREFIX (endpoint and credentials from AWS_* variables). Needs lines
    /// targets, so it makes `lines` the default target kind; the policy is [server.archive].
    #[arg(long)]
    archive: Option<String>,
    /// Copies of every file created without a count of its own (issue 32): sets the root
    /// directory's default layout to keep this many (its layout kept, else stripe:1M), and
    /// puts each server in its own failure group (`local-N`: they share this host, so this
    /// guards against a lost target folder, not a lost host). Needs at least that many
    /// servers. Default: the root's default as it is (1 on a new cluster).
    #[arg(long)]
    replicas: Option<u32>,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MetaArgs {
    /// Change or show a metadata group's members (without one: run a metadata service).
    #[command(subcommand)]
    pub action: Option<crate::meta_admin::MetaAction>,
    /// Folder holding the namespace database.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long)]
    listen: Option<String>,
    /// Serve Prometheus metrics on this address (`HOST:PORT`, path /metrics); off by default.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Run as node N of a metadata group (issue 33); needs --peers and --group-key.
    #[arg(long)]
    node_id: Option<u64>,
    /// The group's members, `ID=META_ADDR[/GROUP_ADDR],…` (group address default: the
    /// metadata port plus one). This node listens for clients on its META_ADDR unless
    /// --listen says otherwise, and for its peers on its GROUP_ADDR.
    #[arg(long)]
    peers: Option<String>,
    /// The meta-role credential for the group's peer links (`flotilla keygen issue --role meta`).
    #[arg(long)]
    group_key: Option<PathBuf>,
    /// Join a group that runs already: never form a group; start empty and wait until the
    /// leader adds this node (`flotilla meta add`), then catch up from its log or a snapshot.
    #[arg(long)]
    join: bool,
}

#[derive(Args)]
pub struct ServerArgs {
    /// Address of the metadata service, or every address of its group as `a,b,c` (the
    /// node that serves is found and followed).
    #[arg(long, env = "FLOTILLA_META")]
    meta: Option<String>,
    /// A target directory (repeat for several); `sim:MODEL:DIR` times it as a 1990s disk
    /// (hp97560, st31200n).
    #[arg(long = "target")]
    targets: Vec<PathBuf>,
    #[arg(long)]
    listen: Option<String>,
    /// Address clients should use, if not the listen address.
    #[arg(long)]
    advertise: Option<String>,
    /// What fails together with this server (a host, rack or power feed): replicas of a
    /// subfile go to distinct failure groups. Default: the host name.
    #[arg(long)]
    failure_group: Option<String>,
    /// Buffer cache in bytes.
    #[arg(long)]
    cache_bytes: Option<u64>,
    /// Cache block size in bytes.
    #[arg(long)]
    block_bytes: Option<u64>,
    /// Worker threads executing requests.
    #[arg(long)]
    workers: Option<usize>,
    /// Serve Prometheus metrics on this address (`HOST:PORT`, path /metrics); off by default.
    #[arg(long)]
    metrics_listen: Option<String>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the async runtime")
}

pub fn meta(args: MetaArgs, file: &FileConfig) -> anyhow::Result<()> {
    let mut config = file.meta.clone();
    config.data = args.data.unwrap_or(config.data);
    config.node_id = args.node_id.unwrap_or(config.node_id);
    config.peers = args.peers.unwrap_or(config.peers);
    config.group_key = args.group_key.or(config.group_key);
    config.join = args.join || config.join;
    let own = own_meta_addr(&config)?;
    config.listen = args.listen.or(own).unwrap_or(config.listen);
    runtime()?.block_on(async {
        let service = MetaService::bind(config).await?;
        announce(format!("meta={}", service.local_addr()));
        let _metrics = match &args.metrics_listen {
            Some(listen) => {
                Some(crate::ops::serve_metrics(listen, vec![(None, service.metrics_collector())]).await?)
            }
            None => None,
        };
        service.serve(shutdown_signal()).await
    })
}

/// A group node's client address from `peers` (the default of its `listen`).
fn own_meta_addr(config: &flotilla_meta::MetaConfig) -> anyhow::Result<Option<String>> {
    if config.node_id == 0 {
        anyhow::ensure!(config.peers.is_empty(), "--peers needs --node-id (this node's id among them)");
        return Ok(None);
    }
    let peers = flotilla_meta::grouped::parse_peers(&config.peers)
        .map_err(|e| anyhow::anyhow!("--peers {:?}: {e}", config.peers))?;
    let own = peers.into_iter().find(|p| p.id == config.node_id);
    let own = own.with_context(|| format!("--node-id {} is not among --peers", config.node_id))?;
    Ok(Some(own.meta_addr))
}

pub fn server(args: ServerArgs, file: &FileConfig) -> anyhow::Result<()> {
    let mut config = file.server.clone();
    config.meta = args.meta.unwrap_or(config.meta);
    if !args.targets.is_empty() {
        config.targets = args.targets;
    }
    anyhow::ensure!(!config.targets.is_empty(), "an I/O server needs at least one --target DIR");
    config.listen = args.listen.unwrap_or(config.listen);
    config.advertise = args.advertise.or(config.advertise);
    config.failure_group = args.failure_group.or(config.failure_group);
    config.cache_capacity_bytes = args.cache_bytes.unwrap_or(config.cache_capacity_bytes);
    config.block_bytes = args.block_bytes.unwrap_or(config.block_bytes);
    config.workers = args.workers.unwrap_or(config.workers);
    runtime()?.block_on(async {
        let server = Server::bind(config).await?;
        announce(format!("server={}", server.advertise()));
        let _metrics = match &args.metrics_listen {
            Some(listen) => {
                Some(crate::ops::serve_metrics(listen, vec![(None, server.metrics_collector())]).await?)
            }
            None => None,
        };
        server.serve(shutdown_signal()).await
    })
}

pub fn local(args: LocalArgs, file: &FileConfig) -> anyhow::Result<()> {
    let mut local = file.local.clone();
    local.servers = args.servers.unwrap_or(local.servers);
    local.data = args.data.unwrap_or(local.data);
    local.listen = args.listen.unwrap_or(local.listen);
    let explicit_kind = args.target_kind.is_some();
    local.target_kind = args.target_kind.unwrap_or(local.target_kind);
    anyhow::ensure!(local.servers >= 1, "--servers must be at least 1");
    let mut server_config = file.server.clone();
    if let Some(url) = args.archive {
        if !local.target_kind.starts_with("lines") {
            anyhow::ensure!(
                !explicit_kind,
                "--archive needs lines targets (RAMA disk lines), not --target-kind {}",
                local.target_kind
            );
            local.target_kind = "lines".to_string();
        }
        let settings = server_config.archive.take().unwrap_or_default();
        server_config.archive = Some(flotilla_server::ArchiveSettings { url, ..settings });
    }
    let keys = crate::keygen::ensure_cluster(&local.data.join("keys"))
        .with_context(|| format!("create or reuse the keys in {}", local.data.join("keys").display()))?;
    server_config.cache_capacity_bytes = args.cache_bytes.unwrap_or(server_config.cache_capacity_bytes);
    server_config.key = Some(keys.server.clone());
    server_config.integrity = args.integrity.unwrap_or(server_config.integrity);
    let meta_config = MetaConfig {
        data: local.data.join("meta"),
        listen: local.listen.clone(),
        key: Some(keys.server.clone()),
        integrity: args.integrity.unwrap_or(file.meta.integrity),
        ..file.meta.clone()
    };
    let target_kind = local.target_kind.clone();
    anyhow::ensure!(
        matches!(args.meta_replicas, 1 | 3 | 5),
        "--meta-replicas must be 1, 3 or 5 (a group needs a majority), not {}",
        args.meta_replicas
    );
    if let Some(replicas) = args.replicas {
        flotilla_types::ReplicatedLayout::new(Layout::Stripe { unit_bytes: 1 << 20, count: 0 }, replicas)?;
        anyhow::ensure!(
            replicas as usize <= local.servers,
            "--replicas {replicas} needs at least {replicas} servers (one failure group each), not --servers {}",
            local.servers
        );
    }
    let meta_config = match args.replicas {
        Some(replicas) if replicas > 1 => MetaConfig { chain_replicas: replicas as usize, ..meta_config },
        _ => meta_config,
    };
    let meta_configs = match args.meta_replicas {
        1 => vec![meta_config],
        replicas => group_configs(&meta_config, &local.data, replicas)?,
    };
    runtime()?.block_on(run_local(
        (local.servers, args.replicas),
        (local.data, keys.client),
        target_kind,
        meta_configs,
        server_config,
        (args.mount, args.metrics_listen),
    ))
}

/// The settings of `replicas` metadata group nodes on loopback, data in `DATA/meta-N`,
/// credentials in `DATA/keys/meta-N.cred`; the ports (client and group port of each) are
/// picked at the first start and kept in `DATA/meta-peers` (the group's log names them).
fn group_configs(
    template: &MetaConfig,
    data: &std::path::Path,
    replicas: u64,
) -> anyhow::Result<Vec<MetaConfig>> {
    let kept = data.join("meta-peers");
    let peers: Vec<String> = match std::fs::read_to_string(&kept) {
        Ok(text) => text.trim().split(',').map(String::from).collect(),
        Err(_) => {
            let peers = pick_peers(replicas)?;
            std::fs::create_dir_all(data).with_context(|| format!("create {}", data.display()))?;
            std::fs::write(&kept, peers.join(",")).with_context(|| format!("write {}", kept.display()))?;
            peers
        }
    };
    anyhow::ensure!(
        peers.len() as u64 == replicas,
        "{} names a group of {} nodes, not --meta-replicas {replicas}",
        kept.display(),
        peers.len()
    );
    let mut configs = Vec::new();
    for id in 1..=replicas {
        let peer = &peers[id as usize - 1];
        let listen = peer.split_once('=').and_then(|(_, a)| a.split_once('/')).map(|(m, _)| m.to_string());
        configs.push(MetaConfig {
            data: data.join(format!("meta-{id}")),
            listen: listen.context("a peer's address")?,
            node_id: id,
            peers: peers.join(","),
            group_key: Some(crate::keygen::ensure_meta(&data.join("keys"), id)?),
            ..template.clone()
        });
    }
    Ok(configs)
}

/// Runs an embedded cluster until a signal; prints `meta=HOST:PORT` once it serves, and
/// `key=PATH` (its client credential) on the next line.
async fn run_local(
    (servers, replicas): (usize, Option<u32>),
    (data, client_key): (PathBuf, PathBuf),
    target_kind: String,
    meta_configs: Vec<MetaConfig>,
    server_template: ServerConfig,
    (mount, metrics_listen): (Option<PathBuf>, Option<String>),
) -> anyhow::Result<()> {
    let (stop, stopped) = watch::channel(false);
    let grouped = replicas.is_some_and(|r| r > 1);
    let mut cluster = LocalCluster::start_grouped(
        (servers, grouped),
        (&data, &client_key),
        &target_kind,
        meta_configs,
        server_template,
        stopped,
    )
    .await?;
    if let Some(replicas) = replicas {
        set_root_replicas((&cluster.meta_addr, &client_key), replicas, Duration::from_secs(30)).await?;
    }
    announce(format!("meta={}", cluster.meta_addr));
    announce(format!("key={}", client_key.display()));
    let collectors = std::mem::take(&mut cluster.collectors);
    let _metrics = match &metrics_listen {
        Some(listen) => Some(crate::ops::serve_metrics(listen, collectors).await?),
        None => None,
    };
    let mounted = match mount {
        // The mount's client blocks on its own runtime: start and stop it off this one.
        Some(dir) => {
            let meta = cluster.meta_addr.clone();
            let config = flotilla_fuse::MountConfig::default();
            let mounting = move || crate::mount::mount_at((&meta, Some(&client_key)), &dir, &config);
            Some(tokio::task::spawn_blocking(mounting).await.context("join the mount task")??)
        }
        None => None,
    };
    shutdown_signal().await;
    if let Some(mounted) = mounted {
        let unmounted = tokio::task::spawn_blocking(move || mounted.unmount()).await;
        if let Err(error) = unmounted.context("join the unmount task").and_then(|r| Ok(r?)) {
            tracing::error!("unmount failed: {error:#}");
        }
    }
    let _ = stop.send(true);
    cluster.join().await
}

/// A metadata service and N I/O servers in this process.
pub struct LocalCluster {
    pub meta_addr: String,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Each service's metrics, named `meta` and `server-N`.
    pub collectors: Vec<(Option<String>, Box<dyn prometheus_client::collector::Collector>)>,
}

impl LocalCluster {
    /// Starts everything, every target of kind `target_kind` (`dir` or `sim:MODEL`), and
    /// waits until every server's target is up. Several metadata configurations are the
    /// nodes of a metadata group; servers and clients are given the leader's address.
    /// Each server in its own failure group (`local-N`) when `grouped` (`--replicas`).
    pub async fn start_grouped(
        (servers, grouped): (usize, bool),
        (data, client_key): (&std::path::Path, &std::path::Path),
        target_kind: &str,
        meta_configs: Vec<MetaConfig>,
        server_template: ServerConfig,
        stopped: watch::Receiver<bool>,
    ) -> anyhow::Result<LocalCluster> {
        let mut metas = Vec::new();
        for config in meta_configs {
            metas.push(MetaService::bind(config).await?);
        }
        let meta_addr = leader_addr(&metas).await?;
        let mut collectors = Vec::new();
        let mut tasks = Vec::new();
        for (i, meta) in metas.into_iter().enumerate() {
            let name = if i == 0 { "meta".to_string() } else { format!("meta-{}", i + 1) };
            collectors.push((Some(name), meta.metrics_collector()));
            tasks.push(tokio::spawn(meta.serve(wait_stop(stopped.clone()))));
        }
        for index in 0..servers {
            let dir = data.join(format!("server-{index}")).join("target-0");
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("create target directory {}", dir.display()))?;
            let config = ServerConfig {
                meta: meta_addr.clone(),
                listen: "127.0.0.1:0".to_string(),
                targets: vec![target_spec(target_kind, &dir)],
                failure_group: if grouped {
                    Some(format!("local-{index}"))
                } else {
                    server_template.failure_group.clone()
                },
                ..server_template.clone()
            };
            let server = Server::bind(config).await.with_context(|| format!("start I/O server {index}"))?;
            collectors.push((Some(format!("server-{index}")), server.metrics_collector()));
            tasks.push(tokio::spawn(server.serve(wait_stop(stopped.clone()))));
        }
        wait_for_targets((&meta_addr, client_key), servers, Duration::from_secs(20)).await?;
        Ok(LocalCluster { meta_addr, tasks, collectors })
    }

    /// Waits for every service to stop (after the stop signal was sent).
    pub async fn join(self) -> anyhow::Result<()> {
        for task in self.tasks {
            task.await.context("join a service task")??;
        }
        Ok(())
    }
}

/// `flotilla local --replicas N`: the root directory's default layout keeps `replicas`
/// copies (its layout kept, else stripe:1M); for more than one, waits (bounded by
/// `timeout`) until the chain table is built so that the first create finds chains.
async fn set_root_replicas(
    (meta, key): (&str, &std::path::Path),
    replicas: u32,
    timeout: Duration,
) -> anyhow::Result<()> {
    let credential =
        flotilla_auth::load_credential(Some(key), "flotilla local", flotilla_auth::Role::Client)?;
    let auth = flotilla_auth::ClientAuth { credential, bounds: flotilla_auth::AuthBounds::default() };
    let connection =
        Connection::connect(meta, ConnectionConfig::with_auth(auth)).await.context("connect to meta")?;
    let call = |request: MetaRequest| {
        let connection = &connection;
        async move {
            let (reply, _) = connection.call::<MetaRequest, MetaReply>(&request, bytes::Bytes::new()).await?;
            match reply {
                MetaReply::Error(error) => Err(anyhow::anyhow!("{error}")),
                reply => Ok(reply),
            }
        }
    };
    let root = match call(MetaRequest::Lookup { path: "/".into() }).await? {
        MetaReply::Entry(entry) => entry,
        other => anyhow::bail!("the root directory's lookup answered {other:?}"),
    };
    let layout = root.layout.unwrap_or(Layout::Stripe { unit_bytes: 1 << 20, count: 0 });
    let set = MetaRequest::SetLayout { path: "/".into(), layout: Some(layout), replicas };
    call(set).await.context("set the root directory's default replica count")?;
    if replicas <= 1 {
        return Ok(());
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let MetaReply::Chains(report) = call(MetaRequest::ChainStatus { chains: false }).await? {
            if report.chains_total > 0 {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the chain table of {replicas} replicas was not built in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `ID=127.0.0.1:PORT/127.0.0.1:PORT` for each node, on ports free now.
fn pick_peers(replicas: u64) -> anyhow::Result<Vec<String>> {
    let mut ports = Vec::new();
    for _ in 0..replicas * 2 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").context("pick a loopback port")?;
        ports.push(probe.local_addr()?.port());
    }
    Ok((0..replicas as usize)
        .map(|i| format!("{}=127.0.0.1:{}/127.0.0.1:{}", i + 1, ports[2 * i], ports[2 * i + 1]))
        .collect())
}

/// The one metadata service's address, or the group leader's once one is elected and its
/// namespace has had its genesis (bounded wait).
async fn leader_addr(metas: &[MetaService]) -> anyhow::Result<String> {
    if let [only] = metas {
        return Ok(only.local_addr().to_string());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(leader) = metas.iter().find(|m| m.group_ready()) {
            return Ok(leader.local_addr().to_string());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the metadata group elected no leader in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The target spec of a directory for a kind: `DIR` for `dir`, `KIND:DIR` otherwise.
fn target_spec(kind: &str, dir: &std::path::Path) -> PathBuf {
    match kind {
        "dir" => dir.to_path_buf(),
        kind => PathBuf::from(format!("{kind}:{}", dir.display())),
    }
}

async fn wait_stop(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

mod readiness {
    //! Waiting for registration, over a raw connection (the blocking client cannot run
    //! inside this runtime).

    use anyhow::Context;
    use flotilla_proto::{MetaReply, MetaRequest, TargetState};
    use flotilla_rpc::{Connection, ConnectionConfig};
    use std::time::{Duration, Instant};

    pub async fn wait_for_targets(
        (meta, key): (&str, &std::path::Path),
        wanted: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let credential =
            flotilla_auth::load_credential(Some(key), "flotilla local", flotilla_auth::Role::Client)?;
        let auth = flotilla_auth::ClientAuth { credential, bounds: flotilla_auth::AuthBounds::default() };
        let connection =
            Connection::connect(meta, ConnectionConfig::with_auth(auth)).await.context("connect to meta")?;
        loop {
            let (reply, _) =
                connection.call::<MetaRequest, MetaReply>(&MetaRequest::Status, bytes::Bytes::new()).await?;
            if let MetaReply::Status(targets) = reply {
                if targets.iter().filter(|t| t.state == TargetState::Up).count() >= wanted {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only some of the {wanted} targets came up in {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
