//! The connection layer, the bottom of the client: one connection to the metadata service,
//! one per I/O server (`servers.rs`), the flow-control credit for each server, the
//! capabilities attached to I/O requests, the identity calls are made as, and waiting out
//! services that cannot be reached (`outage.rs`).
//!
//! It knows nothing of files, tokens, leases or commits: what the layers above need done on
//! a new server connection comes in through [`OnConnect`], and everything else as
//! arguments. Choosing which server a request goes to, and trying another, belongs here.
//!
//! A service that cannot be reached is tried again for a while (`outage.rs`): every
//! metadata call here, and the I/O paths through `Transport::outlast`.

mod capabilities;
mod meta_line;
pub(crate) mod outage;
mod servers;

pub(crate) use meta_line::{MetaLine, WeakMetaLine};
pub(crate) use servers::ServerConnection;

use crate::error::ClientError;
use bytes::Bytes;
use capabilities::CapabilityCache;
use flotilla_proto::{Capability, IoRequest, MetaReply, MetaRequest, WireError};
use flotilla_rpc::{Connection, ConnectionConfig};
use futures::future::BoxFuture;
use outage::{AfterRetry, OutageSettings, Service};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Mutex;

/// What the layers above do on a new server connection before anything else is sent on it
/// (the commit layer resends the writes a restart of that server lost).
pub(crate) trait OnConnect: Send + Sync {
    fn connected<'a>(
        &'a self,
        transport: &'a Transport,
        server: &'a ServerConnection,
        addr: &'a str,
    ) -> BoxFuture<'a, Result<(), ClientError>>;
}

/// What the layers above do when a broken metadata connection was replaced (the service may
/// have restarted, or another node may lead): the lock layer reclaims its locks. Called with
/// the connection slot held, so it must not wait; it starts its work elsewhere.
pub(crate) trait OnMetaReconnect: Send + Sync {
    fn meta_reconnected(&self);
}

pub(crate) struct Transport {
    /// This client's session at the metadata service (random).
    session: u64,
    meta_addr: String,
    client_name: String,
    connection_config: ConnectionConfig,
    meta: Mutex<Option<Arc<Connection>>>,
    servers: parking_lot::Mutex<HashMap<String, servers::ServerSlot>>,
    /// Called on every new server connection before it is used.
    on_connect: Arc<dyn OnConnect>,
    /// The identity metadata requests are made as (`None`: the connection's own).
    caller: parking_lot::RwLock<Option<flotilla_types::Caller>>,
    /// The capabilities the metadata service handed out, attached to I/O requests.
    capabilities: parking_lot::Mutex<CapabilityCache>,
    /// The job id sent to every I/O server after `Hello` (`ClientConfig::job`).
    pub job: std::sync::OnceLock<String>,
    /// This client's counters, when it serves metrics (`ClientConfig::metrics_listen`).
    pub metrics: std::sync::OnceLock<Arc<crate::metrics::ClientMetrics>>,
    /// How long calls wait out an unreachable service (`outage.rs`).
    pub outage: OutageSettings,
    /// When a broken metadata connection was last replaced (the service may have restarted).
    meta_reconnected: parking_lot::Mutex<Option<Instant>>,
    /// Told of every replaced metadata connection (set once, from above).
    on_meta_reconnect: std::sync::OnceLock<Arc<dyn OnMetaReconnect>>,
}

impl Transport {
    pub fn new(
        meta_addr: String,
        client_name: String,
        connection_config: ConnectionConfig,
        outage: OutageSettings,
        on_connect: Arc<dyn OnConnect>,
    ) -> Transport {
        Transport {
            session: rand::random::<u64>(),
            meta_addr,
            client_name,
            connection_config,
            meta: Mutex::new(None),
            servers: parking_lot::Mutex::new(HashMap::new()),
            on_connect,
            caller: parking_lot::RwLock::new(None),
            capabilities: parking_lot::Mutex::new(CapabilityCache::default()),
            job: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
            outage,
            meta_reconnected: parking_lot::Mutex::new(None),
            on_meta_reconnect: std::sync::OnceLock::new(),
        }
    }

    /// Sets what is told of every replaced metadata connection (the first call wins).
    pub fn set_on_meta_reconnect(&self, hook: Arc<dyn OnMetaReconnect>) {
        let _ = self.on_meta_reconnect.set(hook);
    }

    /// Whether a broken metadata connection was replaced within the last `within`: what the
    /// service forgot (tokens) is then the ordinary outcome of its restart.
    pub fn meta_reconnected_within(&self, within: std::time::Duration) -> bool {
        self.meta_reconnected.lock().is_some_and(|at| at.elapsed() <= within)
    }

    /// Makes every later metadata request on behalf of `caller` (`None`: as the connection).
    pub fn set_caller(&self, caller: Option<flotilla_types::Caller>) {
        *self.caller.write() = caller;
    }

    pub fn meta_addr(&self) -> &str {
        &self.meta_addr
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    async fn meta_connection(&self) -> Result<Arc<Connection>, ClientError> {
        let mut slot = self.meta.lock().await;
        if let Some(connection) = slot.as_ref().filter(|c| !c.is_broken()) {
            return Ok(connection.clone());
        }
        let connection =
            Arc::new(Connection::connect(&self.meta_addr, self.connection_config.clone()).await?);
        let replaced = slot.is_some();
        *slot = Some(connection.clone());
        if replaced {
            *self.meta_reconnected.lock() = Some(Instant::now());
            if let Some(hook) = self.on_meta_reconnect.get() {
                hook.meta_reconnected();
            }
        }
        Ok(connection)
    }

    /// Runs `attempt` until it succeeds, fails with an error that is not an outage, or
    /// `service` stayed unreachable for the outage wait (`outage::outlast`).
    pub async fn outlast<T, F, Fut>(&self, service: Service, attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(bool) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        outage::outlast(self.outage, service, attempt).await
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
        let (lookup, claim, resend) = match outage::after_retry(request, error.code) {
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
}

/// Nanoseconds since the Unix epoch by this host's clock (0 if it is before 1970).
fn wall_clock_ns() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}
