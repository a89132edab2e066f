//! A multiplexed request/reply connection: many calls in flight on one TCP stream, matched
//! to their replies by request id.
//!
//! Invariants: the outgoing queue is bounded (`queue_frames_max`), so a caller that sends
//! faster than the socket drains waits instead of growing memory; every call in flight when
//! the connection breaks completes with [`RpcError::ConnectionLost`]; a reply whose request
//! id is unknown is dropped with a warning, never matched to the wrong call. A call made with
//! [`Connection::call_into`] has its reply's data section read straight into the caller's
//! memory (see `scatter`), checked as it arrives; the call succeeds only once the whole
//! frame's tag or checksum matched.

mod admission;
mod netmodel;
mod scatter;

pub use admission::{Admission, HandshakeGate, HandshakeLimits};
pub use netmodel::{install_network_model, NetworkModel};
pub use scatter::{check_disjoint, ScatterTarget, Segment, SegmentError};

use bytes::{Bytes, BytesMut};
use flotilla_auth::wire::{check_frame, finish_stream_check, stream_check, write_frame, Opener, Sealer};
use flotilla_auth::ClientAuth;
use flotilla_proto::{
    decode_body, encode_body, read_frame_body, read_frame_header, read_frame_payload, Frame, FrameError,
    FrameHeader, PayloadOpener,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Why a call failed below the level of the messages themselves.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The peer could not be reached (refused, reset, timed out, or the stream broke during
    /// the handshake): worth trying again while it restarts.
    #[error("cannot connect to {addr}: {message}")]
    Connect { addr: String, message: String },
    /// The handshake completed its exchange and failed (a credential refused, a foreign
    /// cluster's certificate): trying again would fail the same way.
    #[error("cannot connect to {addr}: {message}")]
    Handshake { addr: String, message: String },
    #[error("connection to {addr} lost: {message}")]
    ConnectionLost { addr: String, message: String },
    #[error("bad reply from {addr}: {message}")]
    BadReply { addr: String, message: String },
    #[error("cannot encode request: {message}")]
    Encode { message: String },
    #[error("no reply from {addr} within {ms} ms (call_timeout_ms)")]
    CallTimeout { addr: String, ms: u64 },
}

/// Settings of one connection.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    pub frame_bytes_max: u32,
    pub queue_frames_max: usize,
    /// A connection not established within this long fails.
    pub connect_timeout_ms: u64,
    /// A call whose reply has not arrived this long after it was made fails (the connection
    /// stays up; a late reply is dropped).
    pub call_timeout_ms: u64,
    /// TCP keepalive: idle time before the first probe, so a vanished peer is noticed.
    pub keepalive_idle_ms: u64,
    /// The credential this side proves itself with; `None` connects without a handshake,
    /// which every Flotilla service refuses.
    pub auth: Option<ClientAuth>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            frame_bytes_max: flotilla_types::Limits::default().frame_bytes_max,
            queue_frames_max: 1024,
            connect_timeout_ms: 10_000,
            call_timeout_ms: 120_000,
            keepalive_idle_ms: 60_000,
            auth: None,
        }
    }
}

impl ConnectionConfig {
    /// The default settings with a credential.
    pub fn with_auth(auth: ClientAuth) -> Self {
        ConnectionConfig { auth: Some(auth), ..ConnectionConfig::default() }
    }
}

/// Bytes a frame adds to its body and data, as the network model counts them.
const FRAME_OVERHEAD_BYTES: usize = 32;

struct Outgoing {
    request_id: u64,
    body: Vec<u8>,
    data: Bytes,
}

/// A reply as the reader hands it to its call.
struct Received {
    frame: Frame,
    /// The data section went straight into the call's target (`frame.data` is empty).
    placed: bool,
    /// When the frame's header had arrived: the network model times the reply from here, so
    /// the real copy of its payload runs inside the modelled transfer instead of adding to it.
    header_at: std::time::Instant,
}

/// A call's target, shared with the reader while the call runs; the call takes it back
/// (under the lock) when it ends, however it ends.
type SharedTarget = Arc<Mutex<Option<ScatterTarget>>>;

/// A call waiting for its reply.
struct Waiter {
    reply: oneshot::Sender<Result<Received, RpcError>>,
    target: Option<SharedTarget>,
}

type Pending = Arc<Mutex<HashMap<u64, Waiter>>>;

/// Where the data section of a reply to [`Connection::call_into`] is.
#[derive(Debug)]
pub enum ReplyData {
    /// In the target, every byte checked.
    Placed { bytes: u64 },
    /// Not of the target's length: left in the frame, the target untouched.
    Other(Bytes),
}

/// Takes a call's target back when the call ends (also when its future is dropped), so the
/// reader never writes through it afterwards.
struct TakeBack(SharedTarget);

impl TakeBack {
    fn take(&self) -> Option<ScatterTarget> {
        self.0.lock().take()
    }
}

impl Drop for TakeBack {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// One client side of a multiplexed connection.
pub struct Connection {
    addr: String,
    outgoing: mpsc::Sender<Outgoing>,
    pending: Pending,
    next_request_id: AtomicU64,
    broken: Arc<AtomicBool>,
    call_timeout: Duration,
}

impl Connection {
    /// Connects (within `connect_timeout_ms`) and starts the reader and writer tasks on the
    /// current runtime.
    pub async fn connect(addr: &str, config: ConnectionConfig) -> Result<Connection, RpcError> {
        let failed = |message: String| RpcError::Connect { addr: addr.to_string(), message };
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms.max(1));
        let mut stream = tokio::time::timeout(connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                failed(format!("not connected within {} ms (connect_timeout_ms)", config.connect_timeout_ms))
            })?
            .map_err(|e| failed(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| failed(e.to_string()))?;
        let keepalive_idle = Duration::from_millis(config.keepalive_idle_ms.max(1000));
        set_keepalive(&stream, keepalive_idle).map_err(|e| failed(format!("set TCP keepalive: {e}")))?;
        let (sealer, opener) = match &config.auth {
            Some(auth) => {
                let secured = auth.connect(&mut stream).await.map_err(|e| handshake_failed(addr, e))?;
                (Some(secured.sealer), Some(secured.opener))
            }
            None => (None, None),
        };
        let (read_half, write_half) = stream.into_split();
        let (outgoing, queue) = mpsc::channel(config.queue_frames_max);
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let broken = Arc::new(AtomicBool::new(false));
        let writer = Writer { write_half, sealer, addr: addr.to_string() };
        tokio::spawn(write_loop(writer, queue, pending.clone(), broken.clone()));
        tokio::spawn(read_loop(
            (read_half, opener),
            config.frame_bytes_max,
            pending.clone(),
            broken.clone(),
            addr.to_string(),
        ));
        Ok(Connection {
            addr: addr.to_string(),
            outgoing,
            pending,
            next_request_id: AtomicU64::new(1),
            broken,
            call_timeout: Duration::from_millis(config.call_timeout_ms.max(1)),
        })
    }

    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection has failed; a broken connection is replaced, not reused.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Sends one request frame and waits for its reply frame, at most `call_timeout_ms`
    /// from the call to its reply (queueing and sending included).
    pub async fn call_raw(&self, body: Vec<u8>, data: Bytes) -> Result<Frame, RpcError> {
        Ok(self.call_with_target(body, data, None).await?.frame)
    }

    async fn call_with_target(
        &self,
        body: Vec<u8>,
        data: Bytes,
        target: Option<SharedTarget>,
    ) -> Result<Received, RpcError> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let waiting = self.send_and_wait(request_id, body, data, target);
        let outcome = tokio::time::timeout(self.call_timeout, waiting).await;
        outcome.unwrap_or_else(|_| {
            self.pending.lock().remove(&request_id);
            let ms = self.call_timeout.as_millis() as u64;
            Err(RpcError::CallTimeout { addr: self.addr.clone(), ms })
        })
    }

    async fn send_and_wait(
        &self,
        request_id: u64,
        body: Vec<u8>,
        data: Bytes,
        target: Option<SharedTarget>,
    ) -> Result<Received, RpcError> {
        let modelled = netmodel::model();
        let mut target_bytes = 0;
        if let Some(model) = &modelled {
            target_bytes =
                target.as_ref().and_then(|t| t.lock().as_ref().map(ScatterTarget::data_bytes)).unwrap_or(0);
            let bytes = (FRAME_OVERHEAD_BYTES + body.len() + data.len()) as u64;
            netmodel::hold_until(model.request_arrives(&self.addr, bytes, std::time::Instant::now())).await;
        }
        let (reply_tx, reply_rx) = oneshot::channel();
        self.pending.lock().insert(request_id, Waiter { reply: reply_tx, target });
        if self.is_broken() {
            self.pending.lock().remove(&request_id);
            return Err(self.lost("connection already failed"));
        }
        if self.outgoing.send(Outgoing { request_id, body, data }).await.is_err() {
            self.pending.lock().remove(&request_id);
            return Err(self.lost("writer stopped"));
        }
        let received = reply_rx.await.map_err(|_| self.lost("reply channel closed"))??;
        if let Some(model) = modelled {
            let data_bytes = if received.placed { target_bytes } else { received.frame.data.len() as u64 };
            let bytes = (FRAME_OVERHEAD_BYTES + received.frame.body.len()) as u64 + data_bytes;
            netmodel::hold_until(model.reply_arrives(&self.addr, bytes, received.header_at)).await;
        }
        Ok(received)
    }

    /// Sends a typed request and decodes the typed reply, returning it with the data bytes.
    pub async fn call<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
        &self,
        request: &Req,
        data: Bytes,
    ) -> Result<(Rep, Bytes), RpcError> {
        let body = encode_body(request).map_err(|e| RpcError::Encode { message: e.to_string() })?;
        let frame = self.call_raw(body, data).await?;
        let reply = decode_body::<Rep>(&frame.body, "reply")
            .map_err(|e| RpcError::BadReply { addr: self.addr.clone(), message: e.to_string() })?;
        Ok((reply, frame.data))
    }

    /// [`Connection::call`] whose reply data goes straight into `target` when the reply
    /// carries exactly `target.data_bytes()` of it (an encrypted reply is read whole and
    /// copied there); the target comes back with the reply. An error return may leave
    /// unchecked bytes in the target's memory.
    pub async fn call_into<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
        &self,
        request: &Req,
        data: Bytes,
        target: ScatterTarget,
    ) -> Result<(Rep, ReplyData, ScatterTarget), RpcError> {
        let body = encode_body(request).map_err(|e| RpcError::Encode { message: e.to_string() })?;
        let shared: SharedTarget = Arc::new(Mutex::new(Some(target)));
        let take_back = TakeBack(shared.clone());
        let received = self.call_with_target(body, data, Some(shared)).await?;
        let mut target = take_back.take().ok_or_else(|| self.bad_reply("the call's target vanished"))?;
        let reply = decode_body::<Rep>(&received.frame.body, "reply")
            .map_err(|e| RpcError::BadReply { addr: self.addr.clone(), message: e.to_string() })?;
        let data = match received.placed {
            true => ReplyData::Placed { bytes: target.data_bytes() },
            false if received.frame.data.len() as u64 == target.data_bytes() => {
                target.fill_from(&received.frame.data).map_err(|e| self.bad_reply(&e.to_string()))?;
                ReplyData::Placed { bytes: target.data_bytes() }
            }
            false => ReplyData::Other(received.frame.data),
        };
        Ok((reply, data, target))
    }

    fn bad_reply(&self, message: &str) -> RpcError {
        RpcError::BadReply { addr: self.addr.clone(), message: message.to_string() }
    }

    fn lost(&self, message: &str) -> RpcError {
        RpcError::ConnectionLost { addr: self.addr.clone(), message: message.to_string() }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.broken.store(true, Ordering::Release);
    }
}

/// The writing half of a connection and its tag state.
struct Writer {
    write_half: OwnedWriteHalf,
    sealer: Option<Sealer>,
    addr: String,
}

async fn write_loop(
    writer: Writer,
    mut queue: mpsc::Receiver<Outgoing>,
    pending: Pending,
    broken: Arc<AtomicBool>,
) {
    let Writer { write_half, mut sealer, addr } = writer;
    let mut writer = BufWriter::with_capacity(256 << 10, write_half);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let mut outcome = Ok(());
        // Write everything already queued, then flush once: many small calls share a syscall.
        while let Some(item) = next.take() {
            outcome =
                write_frame(sealer.as_mut(), &mut writer, item.request_id, &item.body, &item.data).await;
            if outcome.is_err() {
                break;
            }
            next = queue.try_recv().ok();
        }
        if outcome.is_ok() {
            outcome = writer.flush().await.map_err(FrameError::Io);
        }
        if let Err(error) = outcome {
            fail_all(&pending, &broken, &addr, &error.to_string());
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// The reading half of a connection, its tag state and its reusable buffers.
struct Reader {
    read_half: OwnedReadHalf,
    opener: Option<Opener>,
    frame_bytes_max: u32,
    buffer: BytesMut,
    scratch: Vec<u8>,
}

async fn read_loop(
    (read_half, opener): (OwnedReadHalf, Option<Opener>),
    frame_bytes_max: u32,
    pending: Pending,
    broken: Arc<AtomicBool>,
    addr: String,
) {
    let mut reader =
        Reader { read_half, opener, frame_bytes_max, buffer: BytesMut::new(), scratch: Vec::new() };
    loop {
        match reader.next(&pending).await {
            Ok(received) => deliver(&pending, received, &addr),
            Err(error) => {
                fail_all(&pending, &broken, &addr, &error.to_string());
                return;
            }
        }
    }
}

impl Reader {
    /// Reads and checks the next reply: its data straight into its call's target when the
    /// call has one of the data's length, else whole into the frame buffer.
    async fn next(&mut self, pending: &Pending) -> Result<Received, FrameError> {
        let header = read_frame_header(&mut self.read_half, self.frame_bytes_max).await?;
        let header_at = std::time::Instant::now();
        if let Some(target) = target_for(pending, &header) {
            if let Some(frame) = self.read_scattered(&header, &target).await? {
                return Ok(Received { frame, placed: true, header_at });
            }
        }
        let decrypt = self.opener.as_mut().map(|o| o as &mut dyn PayloadOpener);
        let frame = read_frame_payload(&mut self.read_half, &mut self.buffer, &header, decrypt).await?;
        check_frame(self.opener.as_mut(), &mut self.read_half, &frame).await?;
        Ok(Received { frame, placed: false, header_at })
    }

    /// Reads a frame's body into the buffer and its data into `target`, checking each byte as
    /// it arrives and the tag or checksum at the end; `None` (nothing read) for a frame that
    /// must be read whole (encrypted).
    async fn read_scattered(
        &mut self,
        header: &FrameHeader,
        target: &SharedTarget,
    ) -> Result<Option<Frame>, FrameError> {
        let Some(mut check) = stream_check(self.opener.as_ref(), header)? else { return Ok(None) };
        let body = read_frame_body(&mut self.read_half, &mut self.buffer, header).await?;
        check.update(&body);
        let (mut cursor, mut left) = (scatter::Cursor::default(), u64::from(header.data_bytes));
        while left > 0 {
            self.read_half.readable().await?;
            let received = {
                let mut held = target.lock();
                match held.as_mut() {
                    Some(target) => target.try_read(&self.read_half, &mut cursor, &mut check),
                    None => scatter::try_discard(&self.read_half, &mut self.scratch, left, &mut check),
                }
            };
            match received {
                Ok(0) => return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(bytes) => left -= bytes as u64,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(FrameError::Io(error)),
            }
        }
        finish_stream_check(self.opener.as_mut(), &mut self.read_half, check).await?;
        let (request_id, flags) = (header.request_id, header.flags);
        Ok(Some(Frame { request_id, flags, body, data: Bytes::new() }))
    }
}

/// The target of the call `header` answers, if it has one its data section fits exactly
/// (checked before any of the data is read) and worth scattering into (else the reply is
/// read whole and `call_into` copies it there).
fn target_for(pending: &Pending, header: &FrameHeader) -> Option<SharedTarget> {
    if header.data_bytes == 0 {
        return None;
    }
    let target = pending.lock().get(&header.request_id)?.target.clone()?;
    let fits = target
        .lock()
        .as_ref()
        .is_some_and(|t| t.data_bytes() == u64::from(header.data_bytes) && t.scatters());
    fits.then_some(target)
}

fn deliver(pending: &Pending, received: Received, addr: &str) {
    let request_id = received.frame.request_id;
    let waiter = pending.lock().remove(&request_id);
    match waiter {
        Some(waiter) => {
            let _ = waiter.reply.send(Ok(received));
        }
        None => tracing::warn!(addr, request_id, "reply for an unknown request dropped"),
    }
}

fn fail_all(pending: &Pending, broken: &AtomicBool, addr: &str, message: &str) {
    broken.store(true, Ordering::Release);
    let waiters: Vec<_> = pending.lock().drain().collect();
    for (_, waiter) in waiters {
        let lost = RpcError::ConnectionLost { addr: addr.to_string(), message: message.to_string() };
        let _ = waiter.reply.send(Err(lost));
    }
}

/// A failed handshake as an error: `Connect` when the stream broke or went silent (the peer
/// may be restarting), `Handshake` when the peer answered and the exchange failed.
fn handshake_failed(addr: &str, error: flotilla_auth::AuthError) -> RpcError {
    let (addr, message) = (addr.to_string(), error.to_string());
    match error {
        flotilla_auth::AuthError::Stream(_) | flotilla_auth::AuthError::Timeout { .. } => {
            RpcError::Connect { addr, message }
        }
        _ => RpcError::Handshake { addr, message },
    }
}

/// Limits on the connections a service accepts.
#[derive(Clone, Copy, Debug)]
pub struct AcceptLimits {
    /// Authenticated connections served at once.
    pub connections_max: usize,
    /// Authenticated connections served at once from one peer IP address.
    pub connections_per_peer_max: usize,
    /// TCP keepalive: idle time before the first probe.
    pub keepalive_idle: std::time::Duration,
    /// Connections still in their handshake: their own pool and per-address rate.
    pub handshakes: HandshakeLimits,
}

/// Accepts connections until the future is dropped, serving each with `serve` on its own
/// task; at most `connections_max` are served at once (more are accepted and closed at once,
/// with a warning). Transient accept errors (out of descriptors) pause briefly, not stop.
/// No handshake: every connection counts as authenticated.
pub async fn accept_loop<F, Fut>(listener: &tokio::net::TcpListener, connections_max: usize, serve: F)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let limits = AcceptLimits {
        connections_max,
        connections_per_peer_max: connections_max,
        keepalive_idle: std::time::Duration::from_secs(60),
        handshakes: HandshakeLimits::default(),
    };
    accept_loop_limited(listener, limits, |stream| async move { Some(stream) }, serve).await
}

type PeerCounts = Arc<Mutex<HashMap<std::net::IpAddr, usize>>>;

/// One peer address's share of the per-peer limit, given back on drop.
struct PeerSlot {
    counts: PeerCounts,
    ip: std::net::IpAddr,
}

impl PeerSlot {
    fn take(counts: &PeerCounts, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut map = counts.lock();
        let count = map.entry(ip).or_insert(0);
        if *count >= max.max(1) {
            return None;
        }
        *count += 1;
        Some(PeerSlot { counts: counts.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock();
        if let Some(count) = map.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Turns on TCP keepalive so that a vanished peer's connection is noticed.
pub fn set_keepalive(stream: &TcpStream, idle: std::time::Duration) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(idle / 4 + std::time::Duration::from_secs(1));
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

type Gate = Arc<Mutex<HandshakeGate<tokio::task::AbortHandle>>>;

/// A handshake's place in the pool, given back when its task ends however it ends (done,
/// failed, timed out, or aborted by an eviction).
struct GateEntry {
    gate: Gate,
    ip: std::net::IpAddr,
    id: u64,
}

impl Drop for GateEntry {
    fn drop(&mut self) {
        self.gate.lock().finished(self.ip, self.id);
    }
}

/// Connections closed unserved, reported at most once a second (a flood must not flood the
/// log too).
struct Refusals {
    since: std::time::Instant,
    counts: HashMap<&'static str, u64>,
}

impl Refusals {
    fn new() -> Refusals {
        Refusals { since: std::time::Instant::now(), counts: HashMap::new() }
    }

    fn note(&mut self, why: &'static str, peer: std::net::SocketAddr) {
        *self.counts.entry(why).or_insert(0) += 1;
        if self.since.elapsed() >= std::time::Duration::from_secs(1) {
            tracing::warn!(last = %peer, refused = ?self.counts, "refusing connections");
            *self = Refusals::new();
        }
    }
}

/// Accepts connections until the future is dropped. Each runs `handshake` first, in the
/// handshake pool (`limits.handshakes`: a per-address token bucket, a bounded pool, the
/// busiest address evicted for a quieter one — see `admission`); a connection it returns
/// `Some` for is then served by `serve` if one of `connections_max` and of its address's
/// `connections_per_peer_max` places is free, else closed. Connections refused before their
/// handshake are reset at once and counted in a warning at most once a second. TCP keepalive
/// is on for every connection.
pub async fn accept_loop_limited<H, HFut, T, S, SFut>(
    listener: &tokio::net::TcpListener,
    limits: AcceptLimits,
    mut handshake: H,
    serve: S,
) where
    H: FnMut(TcpStream) -> HFut,
    HFut: std::future::Future<Output = Option<T>> + Send + 'static,
    T: Send + 'static,
    S: Fn(T) -> SFut + Send + Sync + 'static,
    SFut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections_max.max(1)));
    let peers: PeerCounts = Arc::new(Mutex::new(HashMap::new()));
    let gate: Gate = Arc::new(Mutex::new(HandshakeGate::new(limits.handshakes)));
    let serve = Arc::new(serve);
    let mut refusals = Refusals::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let ip = peer.ip();
        let admission = gate.lock().admit(ip, std::time::Instant::now());
        let (id, evicted) = match admission {
            Admission::Start { id, evicted } => (id, evicted),
            refused => {
                let why = match refused {
                    Admission::OverRate => "handshakes_per_peer_per_second_max",
                    _ => "handshakes_max",
                };
                refusals.note(why, peer);
                let _ = socket2::SockRef::from(&stream).set_linger(Some(std::time::Duration::ZERO));
                continue;
            }
        };
        if let Some(victim) = evicted {
            victim.abort();
        }
        if let Err(error) = set_keepalive(&stream, limits.keepalive_idle) {
            tracing::warn!(%peer, %error, "cannot set TCP keepalive");
        }
        let entry = GateEntry { gate: gate.clone(), ip, id };
        let handshaking = handshake(stream);
        let (slots, peers, serve, per_peer_max) =
            (slots.clone(), peers.clone(), serve.clone(), limits.connections_per_peer_max);
        let task = tokio::spawn(async move {
            let authenticated = handshaking.await;
            drop(entry);
            let Some(connection) = authenticated else { return };
            let Some(peer_slot) = PeerSlot::take(&peers, ip, per_peer_max) else {
                tracing::warn!(%peer, per_peer_max, "closing an authenticated connection: connections_per_peer_max reached");
                return;
            };
            let Ok(slot) = slots.try_acquire_owned() else {
                tracing::warn!(%peer, "closing an authenticated connection: connections_max reached");
                return;
            };
            serve(connection).await;
            drop(slot);
            drop(peer_slot);
        });
        gate.lock().attach(ip, id, task.abort_handle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_call_without_a_reply_fails_naming_the_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // A peer that accepts and reads but never replies.
        let silent = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
        });
        let config = ConnectionConfig { call_timeout_ms: 200, ..ConnectionConfig::default() };
        let connection = Connection::connect(&addr, config).await.unwrap();
        let outcome = connection.call_raw(b"hello".to_vec(), Bytes::new()).await;
        match outcome {
            Err(error @ RpcError::CallTimeout { .. }) => {
                let text = error.to_string();
                assert!(text.contains(&addr) && text.contains("200 ms"), "{text}");
            }
            other => panic!("expected a call timeout, got {other:?}"),
        }
        assert!(connection.pending.lock().is_empty(), "timed-out call left its waiter behind");
        drop(connection);
        silent.abort();
    }

    #[tokio::test]
    async fn connections_past_the_per_peer_limit_are_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = AcceptLimits {
            connections_max: 16,
            connections_per_peer_max: 2,
            keepalive_idle: std::time::Duration::from_secs(60),
            handshakes: HandshakeLimits::default(),
        };
        let (release, released) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(async move {
            let handshake = |stream| async move { Some(stream) };
            accept_loop_limited(&listener, limits, handshake, move |mut stream: TcpStream| {
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|done| *done).await;
                    let _ = stream.write_all(b"x").await;
                }
            })
            .await
        });
        let mut streams = Vec::new();
        for _ in 0..3 {
            streams.push(TcpStream::connect(addr).await.unwrap());
        }
        // The third is accepted and closed at once: it reads end-of-stream.
        let mut byte = [0u8; 1];
        assert_eq!(streams[2].read(&mut byte).await.unwrap(), 0, "third connection was served");
        release.send(true).unwrap();
        for stream in &mut streams[..2] {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "an allowed connection was not served");
        }
        drop(streams);
        // Slots come back when connections end: a new one is served.
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        assert_eq!(fourth.read(&mut byte).await.unwrap(), 1, "slot not returned after close");
        server.abort();
    }

    #[tokio::test]
    async fn a_connect_that_hangs_fails_within_the_connect_timeout() {
        // A listener that never accepts, with its accept queue filled: further SYNs are
        // dropped, so a connect hangs.
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        socket.listen(0).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        let mut fillers = Vec::new();
        let config = ConnectionConfig { connect_timeout_ms: 300, ..ConnectionConfig::default() };
        for _ in 0..8 {
            match Connection::connect(&addr.to_string(), config.clone()).await {
                Ok(connection) => fillers.push(connection),
                Err(error) => {
                    let text = error.to_string();
                    assert!(
                        text.contains("connect_timeout_ms") && text.contains(&addr.to_string()),
                        "{text}"
                    );
                    return;
                }
            }
        }
        panic!("{} connects to a listener that never accepts all succeeded", fillers.len());
    }
}
