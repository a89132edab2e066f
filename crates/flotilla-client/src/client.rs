//! The client: a handle on one Flotilla cluster, with its own small async runtime so that
//! callers (the CLI, the FUSE mount, Python and C bindings) can use a blocking API.

use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::handle::Handle;
use crate::lease::renew_leases;
use crate::tokens::{ByteRange, TokenCache, TokenHolder, TokenSettings};
use crate::transport::WeakMetaLine;
use flotilla_auth::Role;
use flotilla_proto::{DirEntryInfo, EntryInfo, ErrorCode, MetaReply, MetaRequest, TargetStatus, TokenMode};
use flotilla_rpc::ConnectionConfig;
use flotilla_types::{Attributes, Layout, SetAttr, TargetId};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Default for `ClientConfig::unstable_bytes_max`. 64 MiB: a background commit starts at
/// half of it, so a writer's buffers come back to the pool (and are reused without page
/// faults) every 32 MiB; with 256 MiB a process writing 128 MiB held every byte until its
/// final sync, each buffer fresh memory (docs/performance.md, "Unstable writes held for
/// 32 MiB, not 128 MiB").
pub const UNSTABLE_BYTES_MAX_DEFAULT: u64 = 64 << 20;

/// How to reach a cluster.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The metadata service's address, or every address of its group as `a,b,c`: calls go to
    /// the node that serves them (`transport/leader.rs`).
    pub meta_addr: String,
    /// A name the servers log for this client.
    pub client_name: String,
    pub runtime_threads: usize,
    pub connection: ConnectionConfig,
    /// How often the client renews its lease on its open files at the metadata service
    /// (well under the service's `open_lease_ms`).
    pub open_renew_ms: u64,
    /// The credential file (`FLOTILLA_KEY` by default); loaded by [`Client::with_config`]
    /// unless `connection.auth` is already set.
    pub key: Option<std::path::PathBuf>,
    /// Integrity tags on this client's frames (`mac` by default; `encrypt` encrypts them; a
    /// connection uses the stronger of this and the server's setting).
    pub integrity: flotilla_auth::Integrity,
    /// Most bytes of acknowledged but not yet durable writes the client keeps a copy of (to
    /// send again if a server restarts before they are synced); past it, writes wait while
    /// the oldest are synced. The copies' buffers are reused: up to half of this more is kept
    /// idle for the next writes, and freed 5 s after writing stops.
    pub unstable_bytes_max: u64,
    /// The job this client works for, sent once on every I/O server connection so the servers
    /// count its bytes and operations under it (`flotilla jobs`); by default the first set of
    /// the environment variables named in `FLOTILLA_JOB_ENV` (default `SLURM_JOB_ID,FLOTILLA_JOB`).
    pub job: Option<String>,
    /// Serve this client's metrics (Prometheus text on `/metrics`) on this address; off by
    /// default, `FLOTILLA_METRICS_LISTEN` sets it.
    pub metrics_listen: Option<String>,
    /// Byte-range tokens on file reads, writes and size changes (on by default): a library
    /// client is then coherent with mounts and other clients byte by byte, and its writes
    /// are atomic with respect to theirs. Off: close-to-open consistency only (NFS's).
    pub tokens: bool,
    /// How long token requests may wait (`acquire_timeout_ms`: then the call fails).
    pub token_settings: TokenSettings,
    /// `stat` answers from a cache kept coherent by inode tokens (on by default): after a
    /// change by any client is acknowledged, no stat here returns what it replaced.
    pub attr_cache: bool,
    /// Bounds of that cache (`entries_max` paths, `lease_ms`).
    pub attr_settings: crate::attr_leases::AttrSettings,
    /// How long a call keeps trying an I/O server or the metadata service it cannot reach
    /// (`wait_ms`, default 60 s; `FLOTILLA_OUTAGE_WAIT_MS` sets it) and the backoff between
    /// attempts (`outage.rs`).
    pub outage: crate::transport::outage::OutageSettings,
}

impl ClientConfig {
    pub fn new(meta_addr: impl Into<String>) -> ClientConfig {
        ClientConfig {
            meta_addr: meta_addr.into(),
            client_name: format!("pid-{}", std::process::id()),
            runtime_threads: 2,
            connection: ConnectionConfig::default(),
            open_renew_ms: 1_000,
            key: std::env::var_os(crate::env::KEY_ENV).map(std::path::PathBuf::from),
            integrity: flotilla_auth::Integrity::Mac,
            unstable_bytes_max: UNSTABLE_BYTES_MAX_DEFAULT,
            job: job_from_env(),
            metrics_listen: std::env::var(crate::env::METRICS_LISTEN_ENV).ok().filter(|a| !a.is_empty()),
            tokens: true,
            token_settings: TokenSettings::default(),
            attr_cache: true,
            attr_settings: crate::attr_leases::AttrSettings::default(),
            outage: crate::transport::outage::OutageSettings::from_env(),
        }
    }
}

/// Starts counting and serves the counts on `listen`.
fn serve_metrics(
    core: &Arc<Core>,
    runtime: &Runtime,
    listen: &str,
) -> Result<flotilla_metrics::MetricsHandle, ClientError> {
    let metrics = core.transport.metrics.get_or_init(Arc::default).clone();
    let registry = Arc::new(crate::metrics::registry(&metrics));
    let config = flotilla_metrics::EndpointConfig::on(listen);
    let bound = runtime.block_on(flotilla_metrics::bind(&config, registry));
    bound.map_err(|e| ClientError::Runtime(e.to_string()))
}

/// The job id from the environment: the first nonempty variable of those `FLOTILLA_JOB_ENV`
/// names (comma-separated; default `SLURM_JOB_ID,FLOTILLA_JOB`), cut to
/// `flotilla_proto::JOB_ID_BYTES_MAX` bytes at a character boundary.
pub fn job_from_env() -> Option<String> {
    let names =
        std::env::var(crate::env::JOB_ENV_ENV).unwrap_or_else(|_| crate::env::JOB_ENV_DEFAULT.to_string());
    let value =
        names.split(',').filter_map(|name| std::env::var(name.trim()).ok()).find(|v| !v.is_empty())?;
    let mut end = value.len().min(flotilla_proto::JOB_ID_BYTES_MAX);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let job = &value[..end];
    match flotilla_proto::check_job_id(job) {
        Ok(()) => Some(job.to_string()),
        Err(message) => {
            tracing::warn!("not counting this process's I/O under a job: {message}");
            None
        }
    }
}

/// How to create a file.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub subfiles: u32,
    /// One target per subfile, or `None` to let the metadata service choose.
    pub targets: Option<Vec<TargetId>>,
    /// The layout, or `None` to inherit the parent directory's default.
    pub layout: Option<Layout>,
    pub mode: u32,
    pub exclusive: bool,
    /// The caller promises that no other client writes bytes this handle reads or writes
    /// (disjoint writers): the handle takes no byte-range tokens (`OpenOptions::no_overlap`).
    pub no_overlap: bool,
    /// Copies of every subfile (issue 32), on targets of distinct failure groups: 1 (the
    /// default) is a file of one copy, or of its directory's default count when that is set
    /// (`set_layout_replicated`); more places each subfile on a chain of that many members
    /// (the cluster's `chain_replicas`), written through its head.
    pub replicas: u32,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            subfiles: 1,
            targets: None,
            layout: None,
            mode: 0o644,
            exclusive: true,
            no_overlap: false,
            replicas: 1,
        }
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// The caller promises that its writes and other clients' never overlap (MPI-IO
    /// programs writing disjoint records): this handle takes no byte-range tokens, as for
    /// a file with the `user.flotilla.no_overlap` hint.
    pub no_overlap: bool,
}

/// A client that does not keep its connections and runtime alive (what the library's token
/// holder holds, so that a client and its token cache never keep each other).
#[derive(Clone)]
pub(crate) struct WeakClient {
    core: std::sync::Weak<Core>,
    runtime: std::sync::Weak<Runtime>,
}

impl WeakClient {
    /// The client, while some handle on it lives.
    pub fn upgrade(&self) -> Option<Client> {
        let (core, runtime) = (self.core.upgrade()?, self.runtime.upgrade()?);
        Some(Client { core, runtime, endpoint: None })
    }
}

/// What a revocation reaches in a library client: the sizes its writes gave files
/// (`library_tokens.rs`).
struct LibraryHolder {
    client: WeakClient,
}

impl TokenHolder for LibraryHolder {
    fn give_back(&self, id: u64, range: ByteRange, to: Option<TokenMode>) {
        let Some(client) = self.client.upgrade() else { return };
        // The written bytes are on the servers (a write holds its token until they are), maybe
        // only in their caches: they are committed before the size covering them is published
        // (a failed commit publishes nothing; the writes stay for the next flush).
        if let Err(error) = client.block_on(client.core.flush_file(id)) {
            tracing::warn!(%error, file = id, "publishing the size before giving a token back failed");
        }
        tracing::debug!(file = id, ?range, ?to, "library token given back");
    }
}

impl TokenCache {
    /// A token cache for `client`; `holder` writes back and drops cached bytes on demand.
    /// The cache does not keep the client: it works while the caller keeps it.
    pub fn new(
        client: Client,
        holder: std::sync::Weak<dyn TokenHolder>,
        settings: TokenSettings,
    ) -> TokenCache {
        TokenCache::over(client.meta_line(), holder, settings)
    }
}

/// A connection to one cluster. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) core: Arc<Core>,
    pub(crate) runtime: Arc<Runtime>,
    /// The metrics endpoint, when `metrics_listen` was set.
    endpoint: Option<Arc<flotilla_metrics::MetricsHandle>>,
}

impl Client {
    /// Connects to the metadata service at `meta_addr`, an address or a list `a,b,c` (lazily:
    /// the first call connects).
    pub fn connect(meta_addr: &str) -> Result<Client, ClientError> {
        Client::with_config(ClientConfig::new(meta_addr))
    }

    /// Connects to the metadata service named by `FLOTILLA_META` (an address or a list `a,b,c`).
    pub fn from_env() -> Result<Client, ClientError> {
        let addr = std::env::var(crate::env::META_ENV).map_err(|_| ClientError::NoMetaAddress)?;
        Client::connect(&addr)
    }

    pub fn with_config(mut config: ClientConfig) -> Result<Client, ClientError> {
        if config.connection.auth.is_none() {
            let credential =
                flotilla_auth::load_credential(config.key.as_deref(), "the client", Role::Client)
                    .map_err(|e| ClientError::Credential(e.to_string()))?;
            let bounds = flotilla_auth::AuthBounds { integrity: config.integrity, ..Default::default() };
            config.connection.auth = Some(flotilla_auth::ClientAuth { credential, bounds });
        }
        let meta = crate::transport::LeaderChase::parse(&config.meta_addr)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.runtime_threads.max(1))
            .thread_name("flotilla-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        let core = Arc::new(Core::new(
            meta,
            config.client_name,
            config.connection,
            config.unstable_bytes_max,
            crate::library_tokens::LibraryTokens::new(config.tokens, config.token_settings),
            crate::attr_leases::AttrLeases::new(config.attr_cache, config.attr_settings),
            config.outage,
        ));
        if let Some(job) = config.job {
            let _ = core.transport.job.set(job);
        }
        // Every replaced metadata connection reclaims the locks held here.
        let reclaimer = crate::lock_reclaim::LockReclaimer::new(&core, runtime.handle().clone());
        core.transport.set_on_meta_reconnect(Arc::new(reclaimer));
        let endpoint = match &config.metrics_listen {
            Some(listen) => Some(Arc::new(serve_metrics(&core, &runtime, listen)?)),
            None => None,
        };
        // A program acts as the user running it, as it would on a local file system (root
        // acts as the connection itself, which is root on an unrestricted connection).
        let caller = process_caller();
        if !caller.is_root() {
            core.set_caller(Some(caller));
        }
        runtime
            .spawn(renew_leases(Arc::downgrade(&core), Duration::from_millis(config.open_renew_ms.max(1))));
        Ok(Client { core, runtime: Arc::new(runtime), endpoint })
    }

    /// The metadata service's addresses as given (`a,b,c` for several).
    pub fn meta_addr(&self) -> &str {
        self.core.transport.meta_addr()
    }

    pub(crate) fn downgrade(&self) -> WeakClient {
        WeakClient { core: Arc::downgrade(&self.core), runtime: Arc::downgrade(&self.runtime) }
    }

    /// This client's line to the metadata service for poll threads (keeps nothing alive).
    pub(crate) fn meta_line(&self) -> WeakMetaLine {
        WeakMetaLine::new(&self.core.transport, &self.runtime)
    }

    /// The token cache of this client's file handles, made on first use; `None` with tokens
    /// off. A revocation reaches [`LibraryHolder`].
    pub(crate) fn token_cache(&self) -> Option<TokenCache> {
        let weak = self.downgrade();
        let holder = move || Arc::new(LibraryHolder { client: weak }) as Arc<dyn TokenHolder>;
        self.core.tokens.cache(self.meta_line(), holder)
    }

    /// Turns the byte-range tokens of this client's later opens on or off
    /// (`ClientConfig::tokens`). A front end that takes tokens itself (the mount, which
    /// caches) turns them off before its first open.
    pub fn set_tokens(&self, on: bool) {
        self.core.tokens.set_enabled(on);
    }

    /// The pool this client's write data comes from and goes back to once durable (bounded
    /// by `unstable_bytes_max / 2` of idle buffers, trimmed when writing stops). A front end
    /// that hands its write data over (`File::write_shape_bytes`) takes its buffers from
    /// here, so they are reused after the unstable log lets them go.
    pub fn write_buffers(&self) -> Arc<flotilla_proto::buffers::BufferPool> {
        self.core.buffers.clone()
    }

    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Runs `make(core)` on the runtime and returns a handle to its result.
    pub(crate) fn spawn<T, F>(&self, future: F) -> Handle<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ClientError>> + Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.runtime.spawn(async move {
            let _ = sender.send(future.await);
        });
        Handle::new(receiver)
    }

    /// Makes every later namespace call of this client on behalf of `caller` (uid, gid and
    /// groups); the metadata service checks permissions for it. `None` acts as the
    /// connection itself. A new client acts as the process's effective user and groups.
    pub fn set_caller(&self, caller: Option<flotilla_types::Caller>) {
        self.core.set_caller(caller);
    }

    pub(crate) fn meta(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        self.block_on(self.core.transport.meta_call(request))
    }

    /// Where this client serves its metrics, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.endpoint.as_ref().map(|endpoint| endpoint.local_addr())
    }

    /// The counters and busiest jobs of the I/O server at `addr` (`flotilla jobs`, `top`).
    pub fn server_stats(&self, addr: &str) -> Result<flotilla_proto::ServerStats, ClientError> {
        let request = flotilla_proto::IoRequest::Stats;
        match self.block_on(self.core.transport.io_simple(addr, request))? {
            flotilla_proto::IoReply::Stats(stats) => Ok(stats),
            other => Err(unexpected("stats", &other)),
        }
    }

    /// The tier counters of every target of the I/O server at `addr` with an archive.
    pub fn hsm_status(&self, addr: &str) -> Result<Vec<flotilla_proto::TargetTierStatus>, ClientError> {
        match self.block_on(self.core.transport.io_simple(addr, flotilla_proto::IoRequest::HsmStatus))? {
            flotilla_proto::IoReply::HsmStatus(status) => Ok(status),
            other => Err(unexpected("hsm status", &other)),
        }
    }

    /// Looks up a path.
    pub fn stat(&self, path: &str) -> Result<EntryInfo, ClientError> {
        if let Some(mut entry) = self.core.attrs.cached(path) {
            self.core.overlay(entry.id, &mut entry.attrs);
            return Ok(entry);
        }
        if self.core.attrs.enabled() {
            if let Some(found) = self.stat_cached(path) {
                return found;
            }
        }
        match self.meta(MetaRequest::Lookup { path: path.to_string() })? {
            MetaReply::Entry(mut entry) => {
                self.core.overlay(entry.id, &mut entry.attrs);
                Ok(entry)
            }
            other => Err(unexpected("lookup", &other)),
        }
    }

    /// `stat` by `LookupCached`, caching the answer under its grants; `None` when the
    /// service does not know the request (the cache is then turned off).
    fn stat_cached(&self, path: &str) -> Option<Result<EntryInfo, ClientError>> {
        let session = self.core.transport.session();
        self.core.attrs.begin(self.meta_line());
        match self.meta(MetaRequest::LookupCached { path: path.to_string(), session }) {
            Ok(MetaReply::CachedEntry { mut entry, grants }) => {
                self.core.attrs.answer(path, &entry, &grants);
                self.core.overlay(entry.id, &mut entry.attrs);
                Some(Ok(entry))
            }
            Ok(other) => {
                self.core.attrs.abandon();
                Some(Err(unexpected("lookup", &other)))
            }
            Err(ClientError::Meta(error)) if error.code == ErrorCode::BadRequest => {
                self.core.attrs.abandon();
                tracing::info!(%error, "the metadata service does not cache attributes; stat asks every time");
                self.core.attrs.disable();
                None
            }
            Err(error) => {
                self.core.attrs.abandon();
                Some(Err(error))
            }
        }
    }

    /// Looks up an entry by id (inode number).
    pub fn stat_id(&self, id: u64) -> Result<EntryInfo, ClientError> {
        // What is pending before the request counts too: a size published (no longer
        // pending) while the request was under way may be missing from its answer.
        let before = self.core.pending_of(id);
        match self.meta(MetaRequest::GetById { id })? {
            MetaReply::Entry(mut entry) => {
                self.core.overlay_since(entry.id, before, &mut entry.attrs);
                Ok(entry)
            }
            other => Err(unexpected("get by id", &other)),
        }
    }

    /// Sets a directory's default layout (`None` clears it) or an empty file's layout.
    pub fn set_layout(&self, path: &str, layout: Option<Layout>) -> Result<EntryInfo, ClientError> {
        self.set_layout_replicated(path, layout.map(flotilla_types::ReplicatedLayout::single))
    }

    /// `set_layout` with a replica count (issue 32): on a directory, files created in it
    /// without a count of their own (`CreateOptions::replicas` 1, the default) keep
    /// `replicas` copies; a file's count is chosen when it is created (only 1 is taken here).
    pub fn set_layout_replicated(
        &self,
        path: &str,
        layout: Option<flotilla_types::ReplicatedLayout>,
    ) -> Result<EntryInfo, ClientError> {
        let replicas = layout.map_or(1, |l| l.replicas);
        let layout = layout.map(|l| l.layout);
        match self.meta(MetaRequest::SetLayout { path: path.to_string(), layout, replicas })? {
            MetaReply::Entry(entry) => Ok(entry),
            other => Err(unexpected("set layout", &other)),
        }
    }

    /// Creates a symbolic link at `path` pointing to `target`.
    pub fn symlink(&self, path: &str, target: &str) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::Symlink {
            path: path.to_string(),
            target: target.to_string(),
            uid: current_uid(),
            gid: current_gid(),
        };
        match self.meta(request)? {
            MetaReply::Entry(entry) => Ok(entry),
            other => Err(unexpected("symlink", &other)),
        }
    }

    /// Creates a hard link `new` to the file at `existing`.
    pub fn link(&self, existing: &str, new: &str) -> Result<EntryInfo, ClientError> {
        match self.meta(MetaRequest::Link { existing: existing.to_string(), new: new.to_string() })? {
            MetaReply::Entry(entry) => Ok(entry),
            other => Err(unexpected("link", &other)),
        }
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<EntryInfo, ClientError> {
        let request =
            MetaRequest::Mkdir { path: path.to_string(), mode, uid: current_uid(), gid: current_gid() };
        match self.meta(request)? {
            MetaReply::Entry(entry) => Ok(entry),
            other => Err(unexpected("mkdir", &other)),
        }
    }

    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntryInfo>, ClientError> {
        match self.meta(MetaRequest::Readdir { path: path.to_string() })? {
            MetaReply::Entries(entries) => Ok(entries),
            other => Err(unexpected("readdir", &other)),
        }
    }

    /// Removes a file or symlink; its data is deleted by the servers in the background.
    pub fn remove(&self, path: &str) -> Result<(), ClientError> {
        self.expect_done(MetaRequest::Unlink { path: path.to_string() }, "unlink")
    }

    pub fn rmdir(&self, path: &str) -> Result<(), ClientError> {
        self.expect_done(MetaRequest::Rmdir { path: path.to_string() }, "rmdir")
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<(), ClientError> {
        self.expect_done(MetaRequest::Rename { from: from.to_string(), to: to.to_string() }, "rename")
    }

    /// Renames `from` to `to` only if `to` does not exist (`AlreadyExists` otherwise),
    /// atomically in the metadata service (`renameat2` with `RENAME_NOREPLACE`).
    pub fn rename_no_replace(&self, from: &str, to: &str) -> Result<(), ClientError> {
        let request = MetaRequest::RenameNoReplace { from: from.to_string(), to: to.to_string() };
        self.expect_done(request, "rename without replacing")
    }

    pub fn set_attr(&self, id: u64, change: SetAttr) -> Result<Attributes, ClientError> {
        if change.size_bytes.is_some() {
            self.core.forget_pending(id);
        }
        match self.meta(MetaRequest::SetAttr { id, change })? {
            MetaReply::Attributes(attrs) => Ok(attrs),
            other => Err(unexpected("setattr", &other)),
        }
    }

    /// One line per storage target: its server, state, space used and free.
    pub fn status(&self) -> Result<Vec<TargetStatus>, ClientError> {
        match self.meta(MetaRequest::Status)? {
            MetaReply::Status(targets) => Ok(targets),
            other => Err(unexpected("status", &other)),
        }
    }

    /// Connects now, instead of at first use, to the metadata service and to every I/O
    /// server that holds a target, so that a program's first I/O does not pay for the
    /// connection handshakes (as a DAOS program connects to its pool before its I/O).
    /// Servers whose targets the service reports down are skipped. Returns how many servers
    /// it connected to. A server that cannot be reached is an error naming it; connections
    /// already open are kept.
    pub fn connect_servers(&self) -> Result<usize, ClientError> {
        let mut servers: Vec<String> = self
            .status()?
            .into_iter()
            .filter(|target| target.state == flotilla_proto::TargetState::Up)
            .map(|target| target.server)
            .collect();
        servers.sort();
        servers.dedup();
        self.block_on(async {
            for server in &servers {
                self.core.transport.server(server).await?;
            }
            Ok::<(), ClientError>(())
        })?;
        Ok(servers.len())
    }

    fn expect_done(&self, request: MetaRequest, what: &'static str) -> Result<(), ClientError> {
        match self.meta(request)? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected(what, &other)),
        }
    }
}

pub(crate) fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

pub(crate) fn current_gid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

/// The effective uid, gid and supplementary groups of this process.
pub fn process_caller() -> flotilla_types::Caller {
    // SAFETY: geteuid, getegid and getgroups have no preconditions; getgroups writes at most
    // `groups.len()` entries into the buffer it is given.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut groups = vec![0 as libc::gid_t; flotilla_types::CALLER_GROUPS_MAX];
    let count = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(count).unwrap_or(0));
    groups.retain(|&g| g != gid);
    flotilla_types::Caller { uid, gid, groups }
}
