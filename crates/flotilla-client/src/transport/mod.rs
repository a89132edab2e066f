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
//! metadata call here, and the I/O paths through `Transport::outlast`. The metadata service
//! is a list of addresses (a group's nodes); `leader.rs` chooses which one is called, and
//! `resend.rs` says which requests are sent again after an attempt of unknown outcome.

mod capabilities;
pub(crate) mod leader;
mod meta_line;
pub(crate) mod outage;
mod resend;
mod sequence;
mod servers;

pub use leader::{parse_meta_addresses, LeaderChase, MetaAddressError, Move, META_ADDRESSES_MAX};

pub(crate) use meta_line::{MetaLine, WeakMetaLine};
pub(crate) use servers::ServerConnection;

use crate::error::ClientError;
use bytes::Bytes;
use capabilities::CapabilityCache;
use flotilla_proto::{Capability, ErrorCode, IoRequest, MetaReply, MetaRequest, NotServed, WireError};
use flotilla_rpc::{Connection, ConnectionConfig};
use futures::future::BoxFuture;
use outage::{AfterRetry, Failure, OutageSettings, OutageWait, Service};
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
    /// The metadata addresses as given (`a,b,c`).
    meta_addr: String,
    /// Which of them is called (`leader.rs`).
    chase: parking_lot::Mutex<LeaderChase>,
    client_name: String,
    connection_config: ConnectionConfig,
    /// The metadata connection and the address it goes to.
    meta: Mutex<Option<(String, Arc<Connection>)>>,
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
    /// When a broken metadata connection was last replaced, or another metadata node taken
    /// (the service may have restarted or failed over).
    meta_reconnected: parking_lot::Mutex<Option<Instant>>,
    /// Told of every replaced metadata connection (set once, from above).
    on_meta_reconnect: std::sync::OnceLock<Arc<dyn OnMetaReconnect>>,
    /// This client's session in the metadata group's reply table (`sequence.rs`).
    group_sessions: sequence::GroupSessions,
    /// Changes go as `ChangedBy` this session (the mount's, issue 34: the service spares
    /// its own inode tokens).
    changes_carry_session: std::sync::atomic::AtomicBool,
}

/// Whether `request` (inside `Sequenced` and `As`) is a change whose own revocations
/// would wait for a lock the kernel holds while the syscall making it waits: names in a
/// directory (its lock), and `SetAttr` (the inode's lock; a directory's mode is its
/// `Names` token). The kernel takes the new state from these replies itself. Sizes
/// published at close and access times still revoke the changer's own `Attr` token: the
/// mount's kernel may hold attributes from before them, and dropping attributes takes no
/// lock.
fn is_change(request: &MetaRequest) -> bool {
    use MetaRequest as R;
    match request {
        R::Sequenced { request, .. } | R::As { request, .. } => is_change(request),
        R::CreateAt { .. }
        | R::CreateAtOpen { .. }
        | R::MkdirAt { .. }
        | R::MknodAt { .. }
        | R::SymlinkAt { .. }
        | R::LinkAt { .. }
        | R::UnlinkAt { .. }
        | R::RmdirAt { .. }
        | R::RenameAt { .. }
        | R::SetAttr { .. } => true,
        _ => false,
    }
}

impl Transport {
    pub fn new(
        chase: LeaderChase,
        client_name: String,
        connection_config: ConnectionConfig,
        outage: OutageSettings,
        on_connect: Arc<dyn OnConnect>,
    ) -> Transport {
        Transport {
            session: rand::random::<u64>(),
            meta_addr: chase.addresses().join(","),
            chase: parking_lot::Mutex::new(chase),
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
            group_sessions: sequence::GroupSessions::default(),
            changes_carry_session: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Sends every later change as `ChangedBy` this client's session (or not).
    pub fn set_changes_carry_session(&self, on: bool) {
        self.changes_carry_session.store(on, std::sync::atomic::Ordering::Relaxed);
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

    /// The connection to the metadata node at `addr`: the one held if it goes there and
    /// works, else a new one (replacing the one held).
    async fn meta_connection(&self, addr: &str) -> Result<Arc<Connection>, ClientError> {
        let mut slot = self.meta.lock().await;
        if let Some((_, connection)) = slot.as_ref().filter(|(at, c)| at == addr && !c.is_broken()) {
            return Ok(connection.clone());
        }
        let connection = Arc::new(Connection::connect(addr, self.connection_config.clone()).await?);
        let replaced = slot.is_some();
        *slot = Some((addr.to_string(), connection.clone()));
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
    /// no metadata address serves it (unreachable, broken, not the leader, no quorum) the
    /// call moves through the addresses (`leader.rs`) for up to the outage wait
    /// (`outage.rs`); a change retried after it may have been applied is judged by
    /// `outage::after_retry`.
    ///
    /// A change that must take effect once (`resend::sequenced`) goes with its identity in
    /// the client's group session (`sequence.rs`) when the service is a group: resent with
    /// the same identity, its answer is the first attempt's.
    pub async fn meta_call(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        if resend::sequenced(&request) {
            if let Some(ticket) = self.group_ticket().await {
                return self.meta_call_sequenced(&request, ticket).await;
            }
        }
        let started_ns = wall_clock_ns();
        let mut wait = OutageWait::new(self.outage);
        let outcome = self.meta_outlast(&request, &mut wait).await;
        match outcome {
            Err(ClientError::Meta(error)) if wait.maybe_applied => {
                self.after_retry(&request, error, started_ns).await
            }
            other => other,
        }
    }

    /// The next identity in this client's group session, opening the session first if
    /// needed; `None` when the service is not a group (or no session could be had: the
    /// change then goes bare and is judged as before).
    async fn group_ticket(&self) -> Option<sequence::Ticket> {
        loop {
            let session = match self.group_sessions.current() {
                Some(session) => session,
                None => self.open_group_session().await?,
            };
            if session == 0 {
                return None;
            }
            if let Some(ticket) = self.group_sessions.take(session).await {
                return Some(ticket);
            }
        }
    }

    /// Asks the group for a session (once, whoever asks first); 0 when the service is not a
    /// group; `None` when no node answered.
    async fn open_group_session(&self) -> Option<u64> {
        let _opening = self.group_sessions.opening.lock().await;
        if let Some(session) = self.group_sessions.current() {
            return Some(session);
        }
        let mut wait = OutageWait::new(self.outage);
        let session = match self.meta_outlast(&MetaRequest::OpenGroupSession, &mut wait).await {
            Ok(MetaReply::GroupSession { session }) => session,
            Ok(other) => {
                tracing::warn!(?other, "OpenGroupSession answered with something else; sending changes bare");
                0
            }
            Err(ClientError::Meta(error)) => {
                tracing::info!(%error, "no group session; sending changes bare");
                0
            }
            Err(error) => {
                tracing::info!(%error, "no group session for now");
                return None;
            }
        };
        tracing::debug!(session, "metadata group session");
        self.group_sessions.set(session);
        Some(session)
    }

    /// `request` as change `ticket` of the client's group session, resent with the same
    /// identity to whichever node leads until answered. A session the group forgot
    /// (`SessionExpired`) is replaced once: the change is resent in the new session, and if
    /// an earlier attempt may have been applied its answer is judged as without a session.
    async fn meta_call_sequenced(
        &self,
        request: &MetaRequest,
        mut ticket: sequence::Ticket,
    ) -> Result<MetaReply, ClientError> {
        let started_ns = wall_clock_ns();
        let mut wait = OutageWait::new(self.outage);
        let (mut replaced, mut judged) = (false, false);
        loop {
            let sequenced = MetaRequest::Sequenced {
                session: ticket.session,
                sequence: ticket.sequence,
                acknowledged_through: self.group_sessions.acknowledged_through(ticket.session),
                request: Box::new(request.clone()),
            };
            let outcome = self.meta_outlast(&sequenced, &mut wait).await;
            self.group_sessions.done(ticket);
            match outcome {
                Err(ClientError::Meta(error)) if error.code == ErrorCode::SessionExpired && !replaced => {
                    replaced = true;
                    judged = wait.maybe_applied;
                    tracing::info!(%error, maybe_applied = judged, "group session forgotten; opening another");
                    self.group_sessions.forget(ticket.session);
                    match self.group_ticket().await {
                        Some(next) => ticket = next,
                        None => return Err(ClientError::Meta(error)),
                    }
                }
                Err(ClientError::Meta(error)) if judged => {
                    return self.after_retry(request, error, started_ns).await
                }
                other => return other,
            }
        }
    }

    /// Attempts of `request` at the node in use, moving on after each failure, until one is
    /// answered, an error is not an outage, or `wait` is over (`Unreachable`).
    async fn meta_outlast(
        &self,
        request: &MetaRequest,
        wait: &mut OutageWait,
    ) -> Result<MetaReply, ClientError> {
        loop {
            let at = self.chase.lock().target().to_string();
            let error = match self.meta_call_at(&at, request.clone()).await {
                Ok(reply) => {
                    self.chase.lock().served(&at);
                    if wait.retrying() {
                        tracing::info!(meta = %at, waited_ms = wait.waited_ms(Instant::now()), "metadata service reached again");
                    }
                    return Ok(reply);
                }
                Err(error) => error,
            };
            let failure = match &error {
                // A node of a group that went silent (cut off by the network, not crashed):
                // another node may lead. Its answer was not seen, so the outcome is unknown.
                ClientError::Rpc(flotilla_rpc::RpcError::CallTimeout { .. })
                    if self.chase.lock().addresses().len() > 1 =>
                {
                    Failure::MaybeApplied
                }
                _ => outage::classify(&error),
            };
            if failure == Failure::Final {
                return Err(error);
            }
            let first = !wait.retrying();
            let hint = leader_hint(&error);
            let step = leader::next_step(&mut self.chase.lock(), wait, &at, hint, failure, Instant::now());
            let Some(pause) = step else {
                let (waited_ms, wait_ms) = (wait.waited_ms(Instant::now()), self.outage.wait_ms);
                let service = Service::Meta;
                return Err(ClientError::Unreachable { service, waited_ms, wait_ms, last: Box::new(error) });
            };
            let bare = !matches!(request, MetaRequest::Sequenced { .. });
            if failure == Failure::MaybeApplied
                && bare
                && resend::resend_class(request) == resend::Resend::Counted
            {
                tracing::info!(?request, %error, "resending a request that may have been applied; it may count twice");
            }
            if first {
                tracing::info!(%error, wait_ms = self.outage.wait_ms, "metadata node not serving; trying the next");
            } else {
                tracing::debug!(%error, "metadata node not serving");
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
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

    /// One attempt of a metadata call at the node in use, failing at once if it cannot be
    /// reached.
    pub async fn meta_call_once(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        let at = self.chase.lock().target().to_string();
        self.meta_call_at(&at, request).await
    }

    /// One attempt of a metadata call at the node at `addr`.
    async fn meta_call_at(&self, addr: &str, request: MetaRequest) -> Result<MetaReply, ClientError> {
        // `Sequenced` stays outermost, the caller inside it.
        let request = match (self.caller.read().clone(), request) {
            (Some(caller), MetaRequest::Sequenced { session, sequence, acknowledged_through, request }) => {
                let request = Box::new(MetaRequest::As { caller, request });
                MetaRequest::Sequenced { session, sequence, acknowledged_through, request }
            }
            (Some(caller), request) => MetaRequest::As { caller, request: Box::new(request) },
            (None, request) => request,
        };
        // `ChangedBy` outermost, around everything else.
        let carry = self.changes_carry_session.load(std::sync::atomic::Ordering::Relaxed);
        let request = if carry && is_change(&request) {
            MetaRequest::ChangedBy { request: Box::new(request), session: self.session }
        } else {
            request
        };
        let connection = self.meta_connection(addr).await?;
        let (reply, _) = connection.call::<MetaRequest, MetaReply>(&request, Bytes::new()).await?;
        match reply {
            MetaReply::Error(error) => Err(ClientError::Meta(error)),
            MetaReply::NotServed(reason) => Err(ClientError::NotServed { addr: addr.to_string(), reason }),
            MetaReply::Entry(entry) => {
                if let Some(capability) = entry.capability.clone() {
                    self.capabilities.lock().remember(capability, Instant::now());
                }
                Ok(MetaReply::Entry(entry))
            }
            MetaReply::CachedEntry { entry, grants } => {
                if let Some(capability) = entry.capability.clone() {
                    self.capabilities.lock().remember(capability, Instant::now());
                }
                Ok(MetaReply::CachedEntry { entry, grants })
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
            if self.capabilities.lock().any(file.0).is_none() {
                // Nothing to send at all (the one held was refused): wait out the outage (a
                // metadata failover) for a new one, as any metadata call does.
                tracing::debug!(file = file.0, %error, "no capability held; renewing through the outage wait");
                let _ = self.meta_call(MetaRequest::GetById { id: file.0 }).await;
            } else {
                tracing::debug!(file = file.0, %error, "capability renewal failed; using the one held");
            }
        }
        self.capabilities.lock().any(file.0)
    }
}

/// The leader a `NotLeader` refusal named.
fn leader_hint(error: &ClientError) -> Option<&str> {
    match error {
        ClientError::NotServed { reason: NotServed::NotLeader { leader }, .. } => leader.as_deref(),
        _ => None,
    }
}

/// Nanoseconds since the Unix epoch by this host's clock (0 if it is before 1970).
fn wall_clock_ns() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}
