//! The group's network transport: Raft RPCs in `flotilla-proto` frames over authenticated
//! `flotilla-rpc` connections, one per peer, reused and reconnected.
//!
//! [`TcpTransport`] is the sending side ([`Transport`]); [`listener::GroupListener`] the
//! receiving side, answering each RPC with [`crate::network::serve`]; [`codec`] puts RPCs in
//! frames and takes them out (no sockets). Both sides hold a credential of role `meta` and
//! accept only peers with one (flotilla-auth's handshake, unchanged).
//!
//! Invariants: at most one connection per peer is in use or being opened at a time; a
//! connect runs in a task of its own, so openraft's short RPC deadlines (a heartbeat
//! interval) never cut a handshake short; every call ends within `call_timeout_ms`; a
//! connection with calls in flight and no reply for `call_timeout_ms` is replaced; every
//! bound is a field of [`TcpConfig`].

pub mod codec;
pub mod listener;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flotilla_auth::{AuthBounds, ClientAuth, Credential, Integrity, Role};
use flotilla_rpc::{Connection, ConnectionConfig, RpcError};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::identity::GroupIdentity;
use crate::limits::GroupLimits;
use crate::network::{RaftRpc, RaftRpcReply, Transport, TransportError};
use crate::types::NodeId;
use codec::{CodecError, FRAME_OVERHEAD_BYTES};

/// Settings of the group's connections, both sides; every bound is one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Largest frame sent or accepted: one log entry (`record_bytes_max`) or one snapshot
    /// chunk (`snapshot_chunk_bytes`) must fit; a larger append is split into several.
    pub frame_bytes_max: u32,
    /// A connection (TCP and handshake) not established within this long fails.
    pub connect_timeout_ms: u64,
    /// A call not answered within this long (connecting included) fails as unreachable.
    pub call_timeout_ms: u64,
    /// TCP keepalive: idle time before the first probe.
    pub keepalive_idle_ms: u64,
    /// RPCs one connection may have in flight (and being handled by the receiver).
    pub requests_per_connection_max: usize,
    /// Authenticated peer connections a node serves at once.
    pub connections_max: usize,
    /// ... of which from one IP address.
    pub connections_per_peer_max: usize,
    /// Handshakes in progress at once on the listener.
    pub handshakes_max: usize,
    /// Memory the listener's frames may hold at once, all connections together.
    pub frame_bytes_in_memory_max: u64,
    /// A served connection silent this long with nothing in flight is closed.
    pub idle_timeout_ms: u64,
    /// A frame must arrive within this long of its first byte ...
    pub frame_read_timeout_ms: u64,
    /// ... and at least `progress_bytes_min` bytes of it (or the rest) in every
    /// `progress_interval_ms`; replies are taken at the same rate.
    pub progress_interval_ms: u64,
    pub progress_bytes_min: u64,
    /// A reply not written within this long closes the connection.
    pub reply_stall_ms_max: u64,
    /// A handshake not finished within this long fails.
    pub handshake_timeout_ms: u64,
    /// Frame protection (both sides use the stronger of their two settings).
    pub integrity: Integrity,
}

impl Default for TcpConfig {
    fn default() -> Self {
        let limits = GroupLimits::default();
        TcpConfig {
            frame_bytes_max: (limits.record_bytes_max + (64 << 10)) as u32,
            connect_timeout_ms: 2_000,
            call_timeout_ms: 5_000,
            keepalive_idle_ms: 10_000,
            requests_per_connection_max: 64,
            connections_max: 64,
            connections_per_peer_max: 8,
            handshakes_max: 64,
            frame_bytes_in_memory_max: 64 << 20,
            idle_timeout_ms: 60_000,
            frame_read_timeout_ms: 10_000,
            progress_interval_ms: 500,
            progress_bytes_min: 64 << 10,
            reply_stall_ms_max: 5_000,
            handshake_timeout_ms: 3_000,
            integrity: Integrity::Mac,
        }
    }
}

/// Why a transport or listener cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    #[error("the metadata group's credential {name:?} has role {role}; peer links need a meta credential (flotilla keygen --role meta)")]
    CredentialRole { name: String, role: Role },
    #[error("frame_bytes_max ({frame_bytes_max}) must hold {what} ({bytes} bytes) plus {FRAME_OVERHEAD_BYTES} bytes of framing")]
    FrameTooSmall { frame_bytes_max: u32, what: &'static str, bytes: u64 },
    #[error("cannot read the listener's address: {0}")]
    Io(#[from] std::io::Error),
}

impl TcpConfig {
    /// Checks that one log entry and one snapshot chunk fit in a frame.
    pub fn check(&self, limits: &GroupLimits) -> Result<(), TcpError> {
        let needs = [
            ("record_bytes_max", limits.record_bytes_max as u64),
            ("snapshot_chunk_bytes", limits.snapshot_chunk_bytes),
        ];
        for (what, bytes) in needs {
            if bytes + FRAME_OVERHEAD_BYTES as u64 + 64 > u64::from(self.frame_bytes_max) {
                return Err(TcpError::FrameTooSmall { frame_bytes_max: self.frame_bytes_max, what, bytes });
            }
        }
        Ok(())
    }

    fn auth_bounds(&self) -> AuthBounds {
        AuthBounds {
            integrity: self.integrity,
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms.max(1)),
            tag_timeout: Duration::from_millis(self.progress_interval_ms.max(1)),
        }
    }

    fn connection(&self, auth: &ClientAuth) -> ConnectionConfig {
        ConnectionConfig {
            frame_bytes_max: self.frame_bytes_max,
            queue_frames_max: self.requests_per_connection_max.max(1),
            connect_timeout_ms: self.connect_timeout_ms,
            call_timeout_ms: self.call_timeout_ms,
            keepalive_idle_ms: self.keepalive_idle_ms,
            auth: Some(auth.clone()),
        }
    }
}

/// Refuses a credential that is not of role meta.
fn check_meta(credential: &Credential) -> Result<(), TcpError> {
    let cert = credential.certificate();
    if cert.role != Role::Meta {
        return Err(TcpError::CredentialRole { name: cert.name.clone(), role: cert.role });
    }
    Ok(())
}

/// A connection and how it is doing: one whose oldest call not followed by any reply was
/// made more than `call_timeout_ms` ago (a peer that stopped answering without closing: a
/// stopped process, a lost route) is replaced, not reused. Calls openraft gives up on
/// count too: they are dropped, not answered.
struct Live {
    connection: Connection,
    opened: Instant,
    /// Milliseconds from `opened` to that oldest unanswered call, plus one (0: none).
    unanswered_since_ms: AtomicU64,
}

impl Live {
    fn new(connection: Connection) -> Live {
        Live { connection, opened: Instant::now(), unanswered_since_ms: AtomicU64::new(0) }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Whether the connection can carry the next call.
    fn usable(&self, call_timeout_ms: u64) -> bool {
        let since = self.unanswered_since_ms.load(Ordering::Relaxed);
        let stalled = since != 0 && (self.elapsed_ms() + 1).saturating_sub(since) > call_timeout_ms;
        !self.connection.is_broken() && !stalled
    }

    /// One call; any reply shows the peer is answering.
    async fn call(&self, body: Vec<u8>, data: Vec<u8>) -> Result<flotilla_proto::Frame, RpcError> {
        let now = self.elapsed_ms() + 1;
        let _ = self.unanswered_since_ms.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        let frame = self.connection.call_raw(body, Bytes::from(data)).await?;
        self.unanswered_since_ms.store(0, Ordering::Relaxed);
        Ok(frame)
    }
}

/// The outcome of one connection attempt, shared by the calls waiting for it.
type Attempt = watch::Receiver<Option<Result<Arc<Live>, RpcError>>>;

/// The link to one peer: its address and its current (or last) connection attempt.
struct Link {
    address: String,
    attempt: Mutex<Option<Attempt>>,
}

impl Link {
    /// The attempt to wait on: the current one if it is under way or its connection works,
    /// else a new one started in a task of its own.
    fn attempt(&self, config: &ConnectionConfig) -> Attempt {
        let mut slot = self.attempt.lock();
        if let Some(current) = slot.as_ref() {
            let usable = match &*current.borrow() {
                None => true,
                Some(Ok(live)) => live.usable(config.call_timeout_ms),
                Some(Err(_)) => false,
            };
            if usable {
                return current.clone();
            }
        }
        let (done, attempt) = watch::channel(None);
        let (address, config) = (self.address.clone(), config.clone());
        tokio::spawn(async move {
            let outcome = Connection::connect(&address, config).await.map(|c| Arc::new(Live::new(c)));
            if let Err(error) = &outcome {
                tracing::debug!(%address, %error, "metadata group peer not connected");
            }
            let _ = done.send(Some(outcome));
        });
        *slot = Some(attempt.clone());
        attempt
    }
}

/// The sending side: one reused connection per peer.
pub struct TcpTransport {
    config: TcpConfig,
    connection: ConnectionConfig,
    links: Mutex<HashMap<NodeId, Arc<Link>>>,
    /// The group id every request carries.
    identity: Arc<GroupIdentity>,
}

impl TcpTransport {
    /// A transport proving itself with `credential` (role meta).
    pub fn new(credential: Arc<Credential>, config: TcpConfig) -> Result<TcpTransport, TcpError> {
        check_meta(&credential)?;
        let auth = ClientAuth { credential, bounds: config.auth_bounds() };
        let connection = config.connection(&auth);
        let identity = Arc::new(GroupIdentity::in_memory(0));
        Ok(TcpTransport { config, connection, links: Mutex::new(HashMap::new()), identity })
    }

    /// The same transport stamping its requests with `identity`'s group id (share it with
    /// the node's [`listener::GroupListener`], which may learn the id).
    pub fn with_identity(mut self, identity: Arc<GroupIdentity>) -> TcpTransport {
        self.identity = identity;
        self
    }

    /// The link to `target` at `address` (a new one if the address changed).
    fn link(&self, target: NodeId, address: &str) -> Arc<Link> {
        let mut links = self.links.lock();
        let link = links.entry(target).or_insert_with(|| new_link(address));
        if link.address != address {
            *link = new_link(address);
        }
        link.clone()
    }

    /// Connects (or reuses the connection) and makes one call, without the overall deadline.
    async fn exchange(&self, link: &Link, body: Vec<u8>, data: Vec<u8>) -> Result<RaftRpcReply, Failure> {
        let mut attempt = link.attempt(&self.connection);
        let live = {
            let outcome = attempt.wait_for(Option::is_some).await.map_err(|_| Failure::Rpc(closed()))?;
            match outcome.as_ref() {
                Some(Ok(live)) => live.clone(),
                Some(Err(error)) => return Err(Failure::Rpc(error.clone())),
                None => return Err(Failure::Rpc(closed())),
            }
        };
        let frame = live.call(body, data).await.map_err(Failure::Rpc)?;
        codec::decode_reply(&frame.body, &frame.data).map_err(Failure::Codec)
    }
}

fn new_link(address: &str) -> Arc<Link> {
    Arc::new(Link { address: address.to_string(), attempt: Mutex::new(None) })
}

fn closed() -> RpcError {
    RpcError::ConnectionLost { addr: String::new(), message: "the connection attempt was abandoned".into() }
}

/// Why one exchange failed.
enum Failure {
    Rpc(RpcError),
    Codec(CodecError),
}

impl Transport for TcpTransport {
    async fn call(
        &self,
        from: NodeId,
        target: NodeId,
        address: &str,
        rpc: RaftRpc,
    ) -> Result<RaftRpcReply, TransportError> {
        let group = self.identity.id();
        let (body, data) = codec::encode_request(from, target, group, &rpc, self.config.frame_bytes_max)
            .map_err(|e| transport_error(target, address, Failure::Codec(e)))?;
        let link = self.link(target, address);
        let call_timeout = Duration::from_millis(self.config.call_timeout_ms.max(1));
        match tokio::time::timeout(call_timeout, self.exchange(&link, body, data)).await {
            Ok(outcome) => outcome.map_err(|failure| transport_error(target, address, failure)),
            Err(_) => Err(TransportError::Unreachable {
                target,
                address: address.to_string(),
                reason: format!("no reply within {} ms (call_timeout_ms)", self.config.call_timeout_ms),
            }),
        }
    }
}

fn transport_error(target: NodeId, address: &str, failure: Failure) -> TransportError {
    let address = address.to_string();
    match failure {
        Failure::Rpc(error) => TransportError::Unreachable { target, address, reason: error.to_string() },
        Failure::Codec(CodecError::TooLarge { what, bytes, frame_bytes_max, entries_hint }) => {
            let reason = format!("{what} of {bytes} bytes is over frame_bytes_max ({frame_bytes_max})");
            TransportError::TooLarge { target, entries_hint, reason }
        }
        Failure::Codec(error) => TransportError::Refused { target, address, reason: error.to_string() },
    }
}
