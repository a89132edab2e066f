//! The receiving side of the group's transport: accepts authenticated peer connections
//! (role meta only) and answers each Raft RPC with [`crate::network::serve`].
//!
//! Bounded like the metadata service's own listener: handshakes in their own pool
//! (`handshakes_max`, `handshake_timeout_ms`), `connections_max` and
//! `connections_per_peer_max` authenticated connections, `requests_per_connection_max` RPCs
//! handled at once per connection, frames of at most `frame_bytes_max` read as their bytes
//! arrive within `frame_read_timeout_ms` and the progress rule, their memory from one
//! budget of `frame_bytes_in_memory_max`. A bad frame gets `GroupReply::Error(Protocol)`
//! and closes its connection only; a request that does not decode gets `BadRequest` and the
//! connection stays. Shutting the listener down closes every connection it serves.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use flotilla_auth::{Acceptor, Credential, Opener, Role, Sealer, Secured};
use flotilla_proto::{
    read_frame_bounded_opened, with_progress, Counted, ErrorCode, FrameBudget, FrameError, ProgressRule,
    ReadBounds, Reservation, WireError,
};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use super::{check_meta, codec, TcpConfig, TcpError};
use crate::identity::GroupIdentity;
use crate::network::serve;
use crate::types::{NodeId, Raft};

/// A reply frame (request id, body, data) and the memory its request held.
type Outgoing = (u64, Vec<u8>, Vec<u8>, Option<Reservation>);

/// What every served connection shares.
struct Shared {
    node: NodeId,
    raft: Raft,
    /// This node's group id: requests of another group are refused.
    identity: Arc<GroupIdentity>,
    requests_max: usize,
    read_bounds: ReadBounds,
    budget: FrameBudget,
    reply_stall: Duration,
    progress: ProgressRule,
    /// Frames refused as bad (the connection closed) or undecodable since start.
    frames_refused: AtomicU64,
}

/// A running listener; dropping it (or [`GroupListener::shutdown`]) stops it.
pub struct GroupListener {
    local_addr: SocketAddr,
    acceptor: Arc<Acceptor>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl GroupListener {
    /// Serves node `node`'s `raft` on `listener`, proving itself with `credential` (role
    /// meta) and admitting only peers with a meta credential.
    pub fn start(
        listener: TcpListener,
        node: NodeId,
        raft: Raft,
        credential: Arc<Credential>,
        config: &TcpConfig,
    ) -> Result<GroupListener, TcpError> {
        let identity = Arc::new(GroupIdentity::in_memory(0));
        GroupListener::start_in_group(listener, node, raft, credential, config, identity)
    }

    /// [`GroupListener::start`] for a node of the group `identity` names: requests carrying
    /// another group's id are refused; a node with no id yet takes the first one it hears.
    pub fn start_in_group(
        listener: TcpListener,
        node: NodeId,
        raft: Raft,
        credential: Arc<Credential>,
        config: &TcpConfig,
        identity: Arc<GroupIdentity>,
    ) -> Result<GroupListener, TcpError> {
        check_meta(&credential)?;
        let local_addr = listener.local_addr()?;
        let acceptor = Arc::new(Acceptor::new(credential, vec![Role::Meta], config.auth_bounds()));
        let shared = Arc::new(shared(node, raft, config, identity));
        let (stop, stopped) = watch::channel(false);
        let limits = accept_limits(config);
        let (accepting, serving) = (acceptor.clone(), shared.clone());
        let task = tokio::spawn(async move {
            accept(listener, limits, accepting, serving, stopped).await;
        });
        Ok(GroupListener { local_addr, acceptor, shared, stop, task })
    }

    /// The address peers reach this node at (the node's address in the membership).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Handshakes refused since start (wrong role, wrong cluster, garbage, too slow).
    pub fn handshake_failures(&self) -> u64 {
        self.acceptor.failures()
    }

    /// Frames refused since start (bad frames and requests that did not decode).
    pub fn frames_refused(&self) -> u64 {
        self.shared.frames_refused.load(Ordering::Relaxed)
    }

    /// Stops accepting and closes every connection; returns once the accept task ended.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for GroupListener {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

fn shared(node: NodeId, raft: Raft, config: &TcpConfig, identity: Arc<GroupIdentity>) -> Shared {
    let progress = ProgressRule {
        interval: Duration::from_millis(config.progress_interval_ms.max(1)),
        bytes_min: config.progress_bytes_min,
    };
    Shared {
        node,
        raft,
        identity,
        requests_max: config.requests_per_connection_max.max(1),
        read_bounds: ReadBounds {
            frame_bytes_max: config.frame_bytes_max,
            idle_timeout: Duration::from_millis(config.idle_timeout_ms.max(1)),
            frame_timeout: Duration::from_millis(config.frame_read_timeout_ms.max(1)),
            progress,
        },
        budget: FrameBudget::new(config.frame_bytes_in_memory_max),
        reply_stall: Duration::from_millis(config.reply_stall_ms_max.max(1)),
        progress,
        frames_refused: AtomicU64::new(0),
    }
}

fn accept_limits(config: &TcpConfig) -> flotilla_rpc::AcceptLimits {
    flotilla_rpc::AcceptLimits {
        connections_max: config.connections_max.max(1),
        connections_per_peer_max: config.connections_per_peer_max.max(1),
        keepalive_idle: Duration::from_millis(config.keepalive_idle_ms.max(1000)),
        handshakes: flotilla_rpc::HandshakeLimits {
            handshakes_max: config.handshakes_max.max(1),
            ..flotilla_rpc::HandshakeLimits::default()
        },
    }
}

async fn accept(
    listener: TcpListener,
    limits: flotilla_rpc::AcceptLimits,
    acceptor: Arc<Acceptor>,
    shared: Arc<Shared>,
    stopped: watch::Receiver<bool>,
) {
    let handshake = |mut stream: TcpStream| {
        let acceptor = acceptor.clone();
        async move {
            let peer_addr = stream.peer_addr().ok();
            let secured = acceptor.accept(&mut stream, peer_addr).await?;
            Some((stream, secured))
        }
    };
    flotilla_rpc::accept_loop_limited(&listener, limits, handshake, move |(stream, secured)| {
        let (shared, mut stopped) = (shared.clone(), stopped.clone());
        async move {
            tokio::select! {
                _ = serve_connection(stream, secured, shared) => {}
                _ = stopped.wait_for(|stop| *stop) => {}
            }
        }
    })
    .await
}

async fn serve_connection(stream: TcpStream, secured: Secured, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Secured { peer, sealer, opener } = secured;
    tracing::debug!(peer = %peer.name, "metadata group peer connected");
    let (read_half, write_half) = stream.into_split();
    let (replies, queue) = mpsc::channel::<Outgoing>(shared.requests_max);
    let mut writer =
        tokio::spawn(write_replies((write_half, sealer), queue, (shared.reply_stall, shared.progress)));
    // A writer that gives up (peer not reading) ends the reader too, and the other way round.
    tokio::select! {
        _ = read_requests((read_half, opener), &shared, replies) => { let _ = writer.await; }
        _ = &mut writer => {}
    }
}

/// Reads requests until the peer closes or sends a bad frame, handling at most
/// `requests_max` at once; the handlers end with this future.
async fn read_requests(
    (mut read_half, mut opener): (OwnedReadHalf, Opener),
    shared: &Arc<Shared>,
    replies: mpsc::Sender<Outgoing>,
) {
    let in_progress = Arc::new(Semaphore::new(shared.requests_max));
    let (counted, requests_max) = (in_progress.clone(), shared.requests_max);
    let busy = move || counted.available_permits() < requests_max;
    let mut handlers = JoinSet::new();
    let mut buffer = BytesMut::new();
    loop {
        while handlers.try_join_next().is_some() {}
        let (bounds, budget) = (shared.read_bounds, &shared.budget);
        let read =
            read_frame_bounded_opened(&mut read_half, &mut buffer, bounds, budget, &busy, Some(&mut opener));
        let read = match read.await {
            Ok((frame, memory)) => opener.check(&mut read_half, &frame).await.map(|()| (frame, memory)),
            Err(error) => Err(error),
        };
        let (frame, memory) = match read {
            Ok(read) => read,
            Err(FrameError::Closed) | Err(FrameError::IdleTimeout { .. }) => break,
            Err(error) => {
                refuse_frame(shared, &replies, error).await;
                break;
            }
        };
        let (from, rpc) = match codec::decode_request(shared.node, &frame.body, &frame.data) {
            Ok(request) => match shared.identity.admit(request.from, request.group) {
                Ok(()) => (request.from, request.rpc),
                // Another group's request: refused (logged by the identity, rate-limited).
                Err(refusal) => {
                    shared.frames_refused.fetch_add(1, Ordering::Relaxed);
                    let error = WireError::new(ErrorCode::InvalidArgument, refusal.to_string());
                    let _ = replies
                        .send((frame.request_id, codec::encode_error(&error), Vec::new(), Some(memory)))
                        .await;
                    continue;
                }
            },
            Err(error) => {
                shared.frames_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "refusing a metadata group request");
                let _ = replies
                    .send((frame.request_id, codec::encode_error(&error), Vec::new(), Some(memory)))
                    .await;
                continue;
            }
        };
        let request_id = frame.request_id;
        drop(frame);
        let Ok(permit) = in_progress.clone().acquire_owned().await else { break };
        let (raft, replies) = (shared.raft.clone(), replies.clone());
        handlers.spawn(async move {
            let reply = serve(&raft, rpc).await;
            let (body, data) = codec::encode_reply(&reply).unwrap_or_else(|error| {
                let error = WireError::new(ErrorCode::Io, format!("reply to node {from}: {error}"));
                (codec::encode_error(&error), Vec::new())
            });
            let _ = replies.send((request_id, body, data, Some(memory))).await;
            drop(permit);
        });
    }
    // Answer what is in flight before closing (bounded by the writer's stall limit).
    while handlers.join_next().await.is_some() {}
}

/// Answers a bad frame with a `Protocol` error; the caller closes the connection (the byte
/// stream can no longer be trusted).
async fn refuse_frame(shared: &Shared, replies: &mpsc::Sender<Outgoing>, error: FrameError) {
    shared.frames_refused.fetch_add(1, Ordering::Relaxed);
    let request_id = match &error {
        FrameError::PayloadChecksum { request_id, .. } => *request_id,
        _ => 0,
    };
    tracing::warn!(%error, "bad or late frame on a metadata group connection; closing it");
    let refusal = WireError::new(ErrorCode::Protocol, error.to_string());
    let _ = replies.send((request_id, codec::encode_error(&refusal), Vec::new(), None)).await;
}

/// Writes replies until the queue closes, a write fails, or the peer stops taking them.
async fn write_replies(
    (write_half, mut sealer): (OwnedWriteHalf, Sealer),
    mut queue: mpsc::Receiver<Outgoing>,
    (reply_stall, progress): (Duration, ProgressRule),
) {
    let write_half = Counted::new(write_half);
    let moved = write_half.moved();
    let mut writer = BufWriter::new(write_half);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some((request_id, body, data, _memory)) = next.take() {
            let write = sealer.write_frame(&mut writer, request_id, &body, &data);
            let written = with_progress(progress, &moved, tokio::time::timeout(reply_stall, write)).await;
            if !matches!(written, Ok(Ok(Ok(())))) {
                tracing::warn!(
                    ?reply_stall,
                    "dropping a metadata group connection: reply not written in time"
                );
                return;
            }
            next = queue.try_recv().ok();
        }
        let flushed =
            with_progress(progress, &moved, tokio::time::timeout(reply_stall, writer.flush())).await;
        if !matches!(flushed, Ok(Ok(Ok(())))) {
            tracing::debug!("metadata group connection closed before its replies were flushed");
            return;
        }
    }
    let _ = writer.shutdown().await;
}
