//! The async core of the client: one connection to the metadata service, one per I/O
//! server, the flow-control credit for each server, and the log of unstable writes.
//!
//! Connections live in per-server slots: the map of slots is locked only to find a slot, never
//! across network I/O; a slot's own lock is held while its connection is (re)opened, so calls
//! to one server wait for that server's connect (bounded by the connect timeout) and calls to
//! every other server go on.
//!
//! A service that cannot be reached is tried again for a while (`outage.rs`): every
//! metadata call here, and the I/O paths through `Core::outlast`.

use crate::capabilities::CapabilityCache;
use crate::error::ClientError;
use crate::library_tokens::LibraryTokens;
use crate::outage::{AfterRetry, OutageSettings, Service};
use crate::unstable::UnstableLog;
use bytes::Bytes;
use flotilla_proto::{
    Capability, EntryInfo, ErrorCode, IoReply, IoRequest, MetaReply, MetaRequest, WireError, WithRef,
};
use flotilla_rpc::{Connection, ConnectionConfig, ReplyData, RpcError, ScatterTarget};
use flotilla_types::Limits;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{Mutex, Semaphore};

/// Credit is counted in units of this many bytes, so a semaphore's u32 permits suffice.
const CREDIT_UNIT_BYTES: u64 = 1024;

/// A connected I/O server: the connection, the limits it announced, and the credit left.
pub(crate) struct ServerConnection {
    pub connection: Connection,
    pub limits: Limits,
    /// The server's boot epoch, from its `Welcome`: every reply on this connection is from it.
    pub epoch: u64,
    credit: Semaphore,
    credit_units_max: u32,
}

impl ServerConnection {
    fn units_for(&self, bytes: u64) -> u32 {
        let units = bytes.div_ceil(CREDIT_UNIT_BYTES).max(1);
        u32::try_from(units).unwrap_or(u32::MAX).min(self.credit_units_max)
    }
}

/// Size and mtime this client's writes gave a file, not yet published.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    pub size_bytes: u64,
    pub mtime_ns: i64,
}

/// One server's connection slot.
type ServerSlot = Arc<Mutex<Option<Arc<ServerConnection>>>>;

pub(crate) struct Core {
    pending: parking_lot::Mutex<HashMap<u64, Pending>>,
    /// Writes acknowledged from a server's cache and not yet synced (see `unstable.rs`).
    pub unstable: parking_lot::Mutex<UnstableLog>,
    /// Most bytes of unstable writes kept before new writes wait for a sync.
    pub unstable_bytes_max: u64,
    /// Held while the unstable log is being drained, so one drain runs at a time.
    pub drain: Mutex<()>,
    /// Whether a background drain is running (see `commit::start_background_drain`).
    pub draining: std::sync::atomic::AtomicBool,
    /// This client's session at the metadata service (random), and its open handles per file.
    session: u64,
    opens: parking_lot::Mutex<HashMap<u64, u32>>,
    meta_addr: String,
    client_name: String,
    connection_config: ConnectionConfig,
    meta: Mutex<Option<Arc<Connection>>>,
    servers: parking_lot::Mutex<HashMap<String, ServerSlot>>,
    /// The identity metadata requests are made as (`None`: the connection's own).
    caller: parking_lot::RwLock<Option<flotilla_types::Caller>>,
    /// The capabilities the metadata service handed out, attached to I/O requests.
    capabilities: parking_lot::Mutex<CapabilityCache>,
    /// The job id sent to every I/O server after `Hello` (`ClientConfig::job`).
    pub job: std::sync::OnceLock<String>,
    /// This client's counters, when it serves metrics (`ClientConfig::metrics_listen`).
    pub metrics: std::sync::OnceLock<Arc<crate::metrics::ClientMetrics>>,
    /// The byte-range tokens its file handles take (`library_tokens.rs`).
    pub tokens: LibraryTokens,
    /// The coherent attribute cache `stat` answers from (`attr_leases.rs`).
    pub attrs: crate::attr_leases::AttrLeases,
    /// The metadata service refused `CreateAtOpen` (older than it): `create_at` sends
    /// `CreateAt` and `Opened`.
    pub create_at_open_refused: std::sync::atomic::AtomicBool,
    /// The metadata service refused `OpenPath` (older than it): `open` sends a lookup and
    /// `Opened`.
    pub open_path_refused: std::sync::atomic::AtomicBool,
    /// Reused buffers for the data of write requests (`buffers.rs`).
    pub buffers: Arc<flotilla_proto::buffers::BufferPool>,
    /// How long calls wait out an unreachable service (`outage.rs`).
    pub outage: OutageSettings,
    /// When a broken metadata connection was last replaced (the service may have restarted).
    meta_reconnected: parking_lot::Mutex<Option<Instant>>,
}

impl Core {
    pub fn new(
        meta_addr: String,
        client_name: String,
        connection_config: ConnectionConfig,
        unstable_bytes_max: u64,
        tokens: LibraryTokens,
        attrs: crate::attr_leases::AttrLeases,
        outage: OutageSettings,
    ) -> Core {
        Core {
            pending: parking_lot::Mutex::new(HashMap::new()),
            unstable: parking_lot::Mutex::new(UnstableLog::default()),
            unstable_bytes_max,
            drain: Mutex::new(()),
            draining: std::sync::atomic::AtomicBool::new(false),
            session: rand::random::<u64>(),
            opens: parking_lot::Mutex::new(HashMap::new()),
            meta_addr,
            client_name,
            connection_config,
            meta: Mutex::new(None),
            servers: parking_lot::Mutex::new(HashMap::new()),
            caller: parking_lot::RwLock::new(None),
            capabilities: parking_lot::Mutex::new(CapabilityCache::default()),
            job: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
            tokens,
            attrs,
            create_at_open_refused: std::sync::atomic::AtomicBool::new(false),
            open_path_refused: std::sync::atomic::AtomicBool::new(false),
            // Half of what the unstable log may hold, what one background commit lets go at
            // once (`commit.rs`): a streaming writer then takes every buffer again.
            buffers: flotilla_proto::buffers::BufferPool::new(
                (unstable_bytes_max / 2).min(usize::MAX as u64) as usize,
            ),
            outage,
            meta_reconnected: parking_lot::Mutex::new(None),
        }
    }

    /// Whether a broken metadata connection was replaced within the last `within`: what the
    /// service forgot (tokens) is then the ordinary outcome of its restart.
    pub fn meta_reconnected_within(&self, within: std::time::Duration) -> bool {
        self.meta_reconnected.lock().is_some_and(|at| at.elapsed() <= within)
    }

    /// Makes every later metadata request on behalf of `caller` (`None`: as the connection).
    pub fn set_caller(&self, caller: Option<flotilla_types::Caller>) {
        *self.caller.write() = caller;
        // What was cached was looked up with the old caller's permissions.
        self.attrs.clear();
    }

    pub fn meta_addr(&self) -> &str {
        &self.meta_addr
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    /// Counts one more open handle on file `id`.
    pub fn note_opened(&self, id: u64) {
        *self.opens.lock().entry(id).or_insert(0) += 1;
    }

    /// Counts one handle on file `id` fewer; whether it was the last.
    pub fn note_closed(&self, id: u64) -> bool {
        let mut opens = self.opens.lock();
        let Some(count) = opens.get_mut(&id) else { return false };
        *count -= 1;
        if *count > 0 {
            return false;
        }
        opens.remove(&id);
        true
    }

    /// Every file this client has open.
    pub fn open_files(&self) -> Vec<u64> {
        self.opens.lock().keys().copied().collect()
    }

    /// Records that this client wrote file `id` up to `end_bytes` at `mtime_ns`.
    pub fn note_write(&self, id: u64, end_bytes: u64, mtime_ns: i64) {
        let mut pending = self.pending.lock();
        let entry = pending.entry(id).or_insert(Pending { size_bytes: 0, mtime_ns });
        entry.size_bytes = entry.size_bytes.max(end_bytes);
        entry.mtime_ns = entry.mtime_ns.max(mtime_ns);
    }

    pub fn take_pending(&self, id: u64) -> Option<Pending> {
        self.pending.lock().remove(&id)
    }

    pub fn forget_pending(&self, id: u64) {
        self.pending.lock().remove(&id);
    }

    pub fn pending_size(&self, id: u64) -> Option<u64> {
        self.pending.lock().get(&id).map(|p| p.size_bytes)
    }

    /// Raises attributes by this client's unpublished writes (a client always sees its own).
    pub fn overlay(&self, id: u64, attrs: &mut flotilla_types::Attributes) {
        if let Some(pending) = self.pending.lock().get(&id) {
            attrs.size_bytes = attrs.size_bytes.max(pending.size_bytes);
            attrs.mtime_ns = attrs.mtime_ns.max(pending.mtime_ns);
        }
    }

    async fn meta_connection(&self) -> Result<Arc<Connection>, ClientError> {
        let mut slot = self.meta.lock().await;
        if let Some(connection) = slot.as_ref().filter(|c| !c.is_broken()) {
            return Ok(connection.clone());
        }
        let connection =
            Arc::new(Connection::connect(&self.meta_addr, self.connection_config.clone()).await?);
        if slot.is_some() {
            *self.meta_reconnected.lock() = Some(Instant::now());
        }
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not an outage, or
    /// `service` stayed unreachable for the outage wait (`outage::outlast`).
    pub async fn outlast<T, F, Fut>(&self, service: Service, attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(bool) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        crate::outage::outlast(self.outage, service, attempt).await
    }

    /// One call to the metadata service; an error reply becomes `ClientError::Meta`. While
    /// the service cannot be reached the call is tried again (`outage.rs`); a change retried
    /// after it may have been applied is judged by `outage::after_retry`.
    pub async fn meta_call(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        let started_ns = wall_clock_ns();
        let maybe_applied = std::sync::atomic::AtomicBool::new(false);
        let (request, flag) = (&request, &maybe_applied);
        let outcome = self
            .outlast(Service::Meta, move |applied| {
                flag.store(applied, std::sync::atomic::Ordering::Relaxed);
                self.meta_call_once(request.clone())
            })
            .await;
        match outcome {
            Err(ClientError::Meta(error)) if maybe_applied.load(std::sync::atomic::Ordering::Relaxed) => {
                self.after_retry(request, error, started_ns).await
            }
            other => other,
        }
    }

    /// The answer to `request`, retried after an attempt that may have been applied and now
    /// refused with `error`: the earlier attempt's result when it can be told, else `error`.
    async fn after_retry(
        &self,
        request: &MetaRequest,
        error: WireError,
        started_ns: i64,
    ) -> Result<MetaReply, ClientError> {
        let (lookup, claim, resend) = match crate::outage::after_retry(request, error.code) {
            AfterRetry::Stands => return Err(ClientError::Meta(error)),
            AfterRetry::Done => {
                tracing::info!(%error, "a retried change had been applied before the connection broke");
                return Ok(MetaReply::Done);
            }
            AfterRetry::Claim { lookup, claim, resend } => (lookup, claim, resend),
        };
        let entry = match self.meta_call_once(lookup).await {
            Ok(MetaReply::Entry(entry)) => entry,
            _ => return Err(ClientError::Meta(error)),
        };
        let caller_uid = self.caller.read().as_ref().map(|caller| caller.uid);
        if !claim.matches(&entry, started_ns, caller_uid) {
            return Err(ClientError::Meta(error));
        }
        tracing::info!(
            id = entry.id,
            "a retried create had been applied before the connection broke; taking its entry"
        );
        match resend {
            Some(resend) => self.meta_call_once(*resend).await,
            None => Ok(MetaReply::Entry(entry)),
        }
    }

    /// One attempt of a metadata call, failing at once if the service cannot be reached.
    pub async fn meta_call_once(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        let request = match self.caller.read().clone() {
            Some(caller) => MetaRequest::As { caller, request: Box::new(request) },
            None => request,
        };
        let connection = self.meta_connection().await?;
        let (reply, _) = connection.call::<MetaRequest, MetaReply>(&request, Bytes::new()).await?;
        match reply {
            MetaReply::Error(error) => Err(ClientError::Meta(error)),
            MetaReply::Entry(entry) => {
                if let Some(capability) = entry.capability.clone() {
                    self.capabilities.lock().remember(capability, Instant::now());
                }
                Ok(MetaReply::Entry(entry))
            }
            other => Ok(other),
        }
    }

    /// The capability to send with `request`: a fresh one held, else one renewed from the
    /// metadata service (a lookup by id as the current caller), else whatever is held (the
    /// service may be unreachable; the server judges the expiry). `None` for requests no
    /// capability covers, or when none was ever given (the server then says why).
    async fn capability_for(&self, request: &IoRequest) -> Option<Arc<Capability>> {
        let (file, _, wanted) = flotilla_proto::capability::needs(request)?;
        if let Some(fresh) = self.capabilities.lock().fresh(file.0, wanted, Instant::now()) {
            return Some(fresh);
        }
        // One attempt: while the service is down, the capability held is sent as it is.
        let renewed = self.meta_call_once(MetaRequest::GetById { id: file.0 }).await;
        if let Err(error) = renewed {
            tracing::debug!(file = file.0, %error, "capability renewal failed; using the one held");
        }
        self.capabilities.lock().any(file.0)
    }

    /// The connection to the server at `addr`, opened (and greeted) on first use or after
    /// the previous one broke. A new connection whose server is in another boot epoch than
    /// some of this client's unstable writes to it first gets those writes again, oldest
    /// first, so nothing else sent to that server can see what its restart lost.
    pub async fn server(&self, addr: &str) -> Result<Arc<ServerConnection>, ClientError> {
        let slot = self.servers.lock().entry(addr.to_string()).or_default().clone();
        let mut current = slot.lock().await;
        if let Some(server) = current.as_ref().filter(|s| !s.connection.is_broken()) {
            return Ok(server.clone());
        }
        let server = Arc::new(self.open_server(addr).await?);
        crate::commit::resend_stale(self, &server, addr, None).await?;
        *current = Some(server.clone());
        Ok(server)
    }

    async fn open_server(&self, addr: &str) -> Result<ServerConnection, ClientError> {
        let connection = Connection::connect(addr, self.connection_config.clone()).await?;
        let hello = IoRequest::Hello { client: self.client_name.clone() };
        let (reply, _) = connection.call::<IoRequest, IoReply>(&hello, Bytes::new()).await?;
        let (limits, epoch) = match reply {
            IoReply::Welcome { limits, boot_epoch, .. } => (limits, boot_epoch),
            IoReply::Error(error) => return Err(ClientError::Server { server: addr.to_string(), error }),
            other => return Err(unexpected("hello", &other)),
        };
        if let Some(id) = self.job.get() {
            // A server that predates job statistics refuses it; the connection still serves.
            let job = IoRequest::Job { id: id.clone() };
            let (reply, _) = connection.call::<IoRequest, IoReply>(&job, Bytes::new()).await?;
            if let IoReply::Error(error) = reply {
                tracing::debug!(server = addr, %error, "the server did not take the job id");
            }
        }
        let credit_units_max =
            u32::try_from((limits.in_flight_bytes_max / CREDIT_UNIT_BYTES).max(1)).unwrap_or(u32::MAX >> 4);
        let credit = Semaphore::new(credit_units_max as usize);
        Ok(ServerConnection { connection, limits, epoch, credit, credit_units_max })
    }

    /// One call to an I/O server, holding credit for `data_bytes` while it is in flight.
    pub async fn io_call(
        &self,
        server: &ServerConnection,
        request: &IoRequest,
        data: Bytes,
        data_bytes: u64,
    ) -> Result<(IoReply, Bytes), ClientError> {
        let mut payload = Payload { data, target: None };
        let (reply, out) = self.io_call_with(server, request, &mut payload, data_bytes).await?;
        match out {
            ReplyData::Other(bytes) => Ok((reply, bytes)),
            ReplyData::Placed { .. } => Err(unexpected("call without a target", &"data placed")),
        }
    }

    /// A read whose reply data goes straight into `target` (see flotilla-rpc `call_into`),
    /// holding credit for the target's bytes while it is in flight.
    pub async fn io_call_into(
        &self,
        server: &ServerConnection,
        request: &IoRequest,
        target: ScatterTarget,
    ) -> Result<(IoReply, ReplyData), ClientError> {
        let data_bytes = target.data_bytes();
        let mut payload = Payload { data: Bytes::new(), target: Some(target) };
        self.io_call_with(server, request, &mut payload, data_bytes).await
    }

    async fn io_call_with(
        &self,
        server: &ServerConnection,
        request: &IoRequest,
        payload: &mut Payload,
        data_bytes: u64,
    ) -> Result<(IoReply, ReplyData), ClientError> {
        let units = server.units_for(data_bytes);
        let metrics = self.metrics.get();
        // The clock is read only for a client that counts.
        let started = metrics.map(|_| Instant::now());
        if let Some(metrics) = metrics.filter(|_| server.credit.available_permits() < units as usize) {
            metrics.credit_wait();
        }
        let _credit = server.credit.acquire_many(units).await.map_err(|_| ClientError::Abandoned)?;
        let mut renewed = false;
        loop {
            let capability = self.capability_for(request).await;
            let (reply, out) = match &capability {
                Some(capability) => {
                    payload.send(&server.connection, &WithRef { capability, request }).await?
                }
                None => payload.send(&server.connection, request).await?,
            };
            match reply {
                // The server's clock says it ran out: renew once and send again.
                IoReply::Error(error) if error.code == ErrorCode::CapabilityExpired && !renewed => {
                    if let Some(capability) = capability {
                        self.capabilities.lock().forget(capability.file.0);
                    }
                    renewed = true;
                }
                IoReply::Error(error) => {
                    if let Some(metrics) = metrics {
                        metrics.errors.add(error.code);
                    }
                    return Err(ClientError::Server { server: server.connection.addr().to_string(), error });
                }
                other => {
                    if let (Some(metrics), Some(started)) = (metrics, started) {
                        metrics.observed(request, data_bytes, started.elapsed());
                    }
                    return Ok((other, out));
                }
            }
        }
    }

    /// A metadata-only call to the server at `addr`.
    /// Tried again while the server cannot be reached (every such request is idempotent).
    pub async fn io_simple(&self, addr: &str, request: IoRequest) -> Result<IoReply, ClientError> {
        let request = &request;
        self.outlast(Service::Server, move |_| async move {
            let server = self.server(addr).await?;
            let (reply, _) = self.io_call(&server, request, Bytes::new(), 0).await?;
            Ok(reply)
        })
        .await
    }
}

/// What a call sends, and where its reply data goes: kept across the capability renewal's
/// second attempt.
struct Payload {
    data: Bytes,
    target: Option<ScatterTarget>,
}

impl Payload {
    async fn send<Req: serde::Serialize>(
        &mut self,
        connection: &Connection,
        request: &Req,
    ) -> Result<(IoReply, ReplyData), RpcError> {
        let Some(target) = self.target.take() else {
            let (reply, out) = connection.call::<Req, IoReply>(request, self.data.clone()).await?;
            return Ok((reply, ReplyData::Other(out)));
        };
        let (reply, out, target) =
            connection.call_into::<Req, IoReply>(request, self.data.clone(), target).await?;
        self.target = Some(target);
        Ok((reply, out))
    }
}

/// Nanoseconds since the Unix epoch by this host's clock (0 if it is before 1970).
fn wall_clock_ns() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

pub(crate) fn unexpected(request: &'static str, reply: &impl std::fmt::Debug) -> ClientError {
    ClientError::UnexpectedReply { request, reply: format!("{reply:?}").chars().take(200).collect() }
}

/// The entry of an `Entry` reply to request `what`.
pub(crate) fn entry_reply(reply: MetaReply, what: &'static str) -> Result<EntryInfo, ClientError> {
    match reply {
        MetaReply::Entry(entry) => Ok(entry),
        other => Err(unexpected(what, &other)),
    }
}

/// A `Done` reply to request `what`.
pub(crate) fn done_reply(reply: MetaReply, what: &'static str) -> Result<(), ClientError> {
    match reply {
        MetaReply::Done => Ok(()),
        other => Err(unexpected(what, &other)),
    }
}
