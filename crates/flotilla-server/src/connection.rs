//! One client connection: a reader that checks and queues requests, a writer that sends
//! replies. Errors in one request become error replies; only a frame that breaks the byte
//! stream (bad magic, header checksum, version, oversize) ends the connection, and then
//! only this one.

use crate::authorize::{authorize, Principal};
use crate::execute::{shape_error, Executor, Reply};
use crate::metrics::ServerMetrics;
use crate::scheduler::{ConnectionId, Scheduler};
use bytes::{Bytes, BytesMut};
use flotilla_auth::{Acceptor, Opener, Secured};
use flotilla_metrics::JobCounters;
use flotilla_proto::{
    decode_body, read_frame_bounded_opened, ErrorCode, FrameBudget, FrameError, IoReply, IoRequest,
    ProgressRule, ReadBounds, Reservation, WireError,
};
use flotilla_types::Limits;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// A request queued for a worker, with what it holds while it waits: a queue slot of its
/// connection and its share of the connection's in-flight credit.
pub(crate) struct Job {
    pub request_id: u64,
    pub request: IoRequest,
    pub data: Bytes,
    pub replies: mpsc::Sender<Reply>,
    pub _slot: OwnedSemaphorePermit,
    pub credit: Credit,
    /// The request's share of the server-wide data budget (and of its connection's share
    /// of it), held until its reply is written.
    pub memory: Reservation,
    /// When the request's frame was read (for the latency metrics).
    pub started: Instant,
    /// The counters of the job the connection named, if it named one.
    pub job: Option<Arc<JobCounters>>,
    /// The request came under a client's capability: a missing subfile of the file it
    /// names is made on demand (lazy subfile creation).
    pub by_capability: bool,
    /// It was parked once while its blocks were loaded; it runs when taken again.
    pub parked_once: bool,
    /// A client's read of a replicated subfile, on this chain: a checksum mismatch is
    /// repaired from another replica and the read run again (`chain_path::repair`).
    pub repair_chain: Option<u32>,
}

/// Bytes a request holds of its connection's credit, given back on drop.
pub(crate) struct Credit {
    in_flight_bytes: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for Credit {
    fn drop(&mut self) {
        self.in_flight_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What every connection shares.
pub(crate) struct Shared {
    pub executor: Arc<Executor>,
    /// ENWRICH flush sessions (flush messages bypass the workers).
    pub flush: Arc<crate::flush::Sessions>,
    pub scheduler: Arc<Scheduler<Job>>,
    pub limits: Limits,
    pub server_name: String,
    /// This process's boot epoch (random, nonzero), sent in every `Welcome`.
    pub boot_epoch: u64,
    pub connection_queue_max: usize,
    pub reply_queue_max: usize,
    /// Server-wide budget for request and reply data held in memory, in KiB
    /// (`ServerConfig::data_bytes_in_memory_max`): many connections together cannot make the
    /// server hold more than this, whatever each one's credit.
    pub memory: Arc<Semaphore>,
    pub memory_units_max: u32,
    /// `memory` as frames and requests take it, with its overdraft lane.
    pub budget: FrameBudget,
    /// KiB units of the budget one connection's requests may hold at once
    /// (`connection_data_bytes_max`).
    pub connection_units_max: u32,
    /// Buffers large request payloads are read into, reused once their data is done with
    /// (`flotilla_proto::buffers`); at most `FRAME_POOL_KEPT_BYTES_MAX` of them idle.
    pub frame_pool: Arc<flotilla_proto::buffers::BufferPool>,
    /// Frame size, idle and frame-read timeouts for every incoming frame.
    pub read_bounds: ReadBounds,
    /// A reply not written within this long drops the connection (`reply_stall_ms_max`).
    pub reply_stall: Duration,
    /// How slowly a peer may take its replies (`progress_interval_ms`, `progress_bytes_min`).
    pub progress: ProgressRule,
    /// Runs the handshake every connection starts with, and counts failures.
    pub acceptor: Acceptor,
    /// This server's credential towards the metadata service.
    pub meta_auth: flotilla_auth::ClientAuth,
    /// Checks the capabilities client requests carry.
    pub capabilities: flotilla_auth::CapabilityKey,
    /// Counters for the metrics and `IoRequest::Stats`; `None` when `metrics` is off.
    pub metrics: Option<ServerMetrics>,
    /// The chains of this server's targets as the last heartbeat reply told them.
    pub chains: Arc<crate::membership::HeldChains>,
    /// Every chain's data path on this server (heads, members, forwarding).
    pub chain_paths: Arc<crate::chain_path::ChainPaths>,
    /// The runtime read repairs run on (workers are plain threads).
    pub runtime: tokio::runtime::Handle,
}

/// Most bytes of idle request buffers the server keeps for reuse (beyond the data budget
/// `data_bytes_in_memory_max`, inside the 64 MiB its memory bound allows over the cache).
pub(crate) const FRAME_POOL_KEPT_BYTES_MAX: usize = 16 << 20;

/// Runs the handshake a new connection starts with (in the accept loop's handshake pool).
pub(crate) async fn handshake(mut stream: TcpStream, shared: Arc<Shared>) -> Option<(TcpStream, Secured)> {
    let _ = stream.set_nodelay(true);
    let peer_addr = stream.peer_addr().ok();
    let secured = shared.acceptor.accept(&mut stream, peer_addr).await?;
    Some((stream, secured))
}

/// Serves one authenticated connection until the client goes away or sends a
/// stream-breaking frame.
pub(crate) async fn serve(stream: TcpStream, secured: Secured, id: ConnectionId, shared: Arc<Shared>) {
    tracing::debug!(connection = id, peer = %secured.peer.name, "client authenticated");
    let (read_half, write_half) = stream.into_split();
    let (replies, reply_queue) = mpsc::channel(shared.reply_queue_max);
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let mut writer = tokio::spawn(crate::reply_writer::write_replies(
        (write_half, secured.sealer),
        reply_queue,
        shared.executor.clone(),
        (shared.reply_stall, shared.progress),
    ));
    let reader = Reader {
        shared: shared.clone(),
        id,
        principal: Principal::from(&secured.peer),
        replies,
        slots: Arc::new(Semaphore::new(shared.connection_queue_max)),
        own: Arc::new(Semaphore::new(shared.connection_units_max as usize)),
        in_flight_bytes: Arc::new(AtomicU64::new(0)),
        closed,
        job: None,
    };
    if let Some(metrics) = &shared.metrics {
        metrics.connection_opened();
    }
    // A writer that gives up (peer not reading) ends the reader too, releasing its budget.
    let writer_done = tokio::select! {
        _ = reader.run(read_half, secured.opener) => false,
        _ = &mut writer => true,
    };
    shared.scheduler.close(id);
    // Flushes this connection takes part in learn that its member is gone.
    let _ = closed_tx.send(true);
    if !writer_done {
        let _ = writer.await;
    }
    if let Some(metrics) = &shared.metrics {
        metrics.connection_closed();
    }
}

struct Reader {
    shared: Arc<Shared>,
    id: ConnectionId,
    /// The peer's credential: whose capabilities count, and whether it may change data.
    principal: Principal,
    replies: mpsc::Sender<Reply>,
    slots: Arc<Semaphore>,
    /// The connection's share of the data budget (`connection_data_bytes_max`): past it,
    /// this reader waits, not the server.
    own: Arc<Semaphore>,
    in_flight_bytes: Arc<AtomicU64>,
    /// Turns true when this connection ends.
    closed: tokio::sync::watch::Receiver<bool>,
    /// The counters of the job this connection named (`IoRequest::Job`).
    job: Option<Arc<JobCounters>>,
}

impl Reader {
    async fn run(mut self, mut read_half: OwnedReadHalf, mut opener: Opener) {
        let mut buffer = BytesMut::new();
        let budget = FrameBudget { pool: Some(self.shared.frame_pool.clone()), ..self.shared.budget.clone() };
        let (slots, queue_max) = (self.slots.clone(), self.shared.connection_queue_max);
        let busy = move || slots.available_permits() < queue_max;
        loop {
            self.shared.frame_pool.trim(flotilla_proto::buffers::IDLE_KEPT_MAX);
            let bounds = self.shared.read_bounds;
            let read = read_frame_bounded_opened(
                &mut read_half,
                &mut buffer,
                bounds,
                &budget,
                &busy,
                Some(&mut opener),
            )
            .await;
            let checked = match read {
                Ok((frame, held)) => opener.check(&mut read_half, &frame).await.map(|()| (frame, held)),
                Err(error) => Err(error),
            };
            match checked {
                Ok((frame, held)) => {
                    if !self.accept(frame.request_id, &frame.body, frame.data, held).await {
                        return;
                    }
                }
                Err(FrameError::Closed) => return,
                Err(FrameError::IdleTimeout { ms }) => {
                    tracing::debug!(connection = self.id, ms, "closing an idle connection");
                    return;
                }
                // The tag after a bad payload was not read: the stream is off its frame
                // boundary, so the connection ends after the reply.
                Err(error @ FrameError::PayloadChecksum { request_id, .. }) => {
                    tracing::warn!(connection = self.id, %error, "closing connection after a bad payload");
                    self.refuse(request_id, ErrorCode::Protocol, error.to_string()).await;
                    return;
                }
                Err(error) => {
                    tracing::warn!(connection = self.id, %error, "closing connection after a bad frame");
                    self.refuse(0, ErrorCode::Protocol, error.to_string()).await;
                    return;
                }
            }
        }
    }

    /// Checks one request and queues it; returns false when the connection should end.
    /// `held` is the frame's share of the memory budget; it grows to the request's data
    /// length and travels with the request until its reply is written.
    async fn accept(&mut self, request_id: u64, body: &[u8], data: Bytes, held: Reservation) -> bool {
        let request = match decode_body::<IoRequest>(body, "I/O request") {
            Ok(request) => request,
            Err(error) => return self.refuse(request_id, ErrorCode::BadRequest, error.to_string()).await,
        };
        let now_unix_ms = flotilla_auth::now_unix_ms();
        let by_capability = matches!(request, IoRequest::With { .. });
        let request = match authorize(request, &self.principal, &self.shared.capabilities, now_unix_ms) {
            Ok(request) => request,
            Err(refused) => return self.refuse(request_id, refused.code, refused.message).await,
        };
        if let Some(message) = self.answer_inline(&request) {
            return self
                .replies
                .send(Reply { request_id, message, data: Vec::new(), memory: None })
                .await
                .is_ok();
        }
        if crate::flush::is_flush(&request) {
            return self.flush(request_id, request, data, held).await;
        }
        let credit = match self.take_credit(&request) {
            Ok(credit) => credit,
            Err(error) => return self.refuse(request_id, error.code, error.message).await,
        };
        if let IoRequest::Forward { forward } = request {
            return self.forward(request_id, forward, data, (held, credit)).await;
        }
        // Replication (issue 32): a read is fenced here and runs as any read; a change goes
        // to the chain's data path (the head applies it and sends it down the chain).
        let mut repair_chain = None;
        let request = match request {
            IoRequest::Chained { chain, version, request } => match crate::chain_write::access_of(&request) {
                Err(error) => return self.refuse(request_id, error.code, error.message).await,
                Ok(flotilla_replica::Access::Write) => {
                    let change = (chain, version, *request);
                    return self.chained(request_id, change, data, (held, credit)).await;
                }
                Ok(flotilla_replica::Access::Read) => {
                    match self.shared.chain_paths.admit_read(chain, version, &request) {
                        Ok(request @ IoRequest::BlockChecksums { .. }) => {
                            return self
                                .block_checksums(request_id, (chain, version, request), (held, credit))
                                .await;
                        }
                        Ok(request) => {
                            // A server's read (another member's repair) never repairs here.
                            if self.principal.role != flotilla_auth::Role::Server {
                                repair_chain = Some(chain);
                            }
                            request
                        }
                        Err(refused) => {
                            let message = IoReply::ForwardRefused(refused);
                            let reply = Reply { request_id, message, data: Vec::new(), memory: None };
                            return self.replies.send(reply).await.is_ok();
                        }
                    }
                }
            },
            request => request,
        };
        let Ok(slot) = self.slots.clone().acquire_owned().await else { return false };
        let units = memory_units(credit.bytes, self.shared.memory_units_max);
        let Some(memory) = self.reserve(held, units).await else { return false };
        let (replies, job) = (self.replies.clone(), self.job.clone());
        let started = Instant::now();
        let job = Job {
            request_id,
            request,
            data,
            replies,
            _slot: slot,
            credit,
            memory,
            started,
            job,
            by_capability,
            parked_once: false,
            repair_chain,
        };
        if let Some(metrics) = &self.shared.metrics {
            metrics.queued(1);
        }
        self.shared.scheduler.push(self.id, job);
        true
    }

    /// Grows a request's reservation to `units`: first from the connection's own share (this
    /// reader waits while the connection's earlier requests hold it: their replies not yet
    /// taken), then from the server's budget. `None` when the server is stopping.
    async fn reserve(&self, mut memory: Reservation, units: u32) -> Option<Reservation> {
        let own_units = units.min(self.shared.connection_units_max);
        let own = self.own.clone().acquire_many_owned(own_units).await.ok()?;
        memory.hold(own);
        let extra = units.saturating_sub(memory.units());
        if extra > 0 {
            if let Some(metrics) = self
                .shared
                .metrics
                .as_ref()
                .filter(|_| self.shared.memory.available_permits() < extra as usize)
            {
                metrics.memory_wait();
            }
            self.shared.budget.grow(&mut memory, units).await.ok()?;
        }
        Some(memory)
    }

    /// Hands a flush message to the flush sessions on its own task (its answer may wait for
    /// other members), holding one of the connection's queue slots until it is answered.
    async fn flush(&self, request_id: u64, request: IoRequest, data: Bytes, held: Reservation) -> bool {
        let Ok(slot) = self.slots.clone().acquire_owned().await else { return false };
        let (sessions, replies, closed) =
            (self.shared.flush.clone(), self.replies.clone(), self.closed.clone());
        tokio::spawn(async move {
            let message = sessions.handle(request, data, held, closed).await;
            let _ = replies.send(Reply { request_id, message, data: Vec::new(), memory: None }).await;
            drop(slot);
        });
        true
    }

    /// Fences, orders, applies and sends on a chain forward on its own task (it waits for
    /// the successor), holding a queue slot, its credit and its data until it is answered.
    async fn forward(
        &self,
        request_id: u64,
        forward: flotilla_proto::ChainForward,
        data: Bytes,
        held: (Reservation, Credit),
    ) -> bool {
        let Ok(slot) = self.slots.clone().acquire_owned().await else { return false };
        let (shared, replies) = (self.shared.clone(), self.replies.clone());
        let sender = self.principal.name.clone();
        tokio::spawn(async move {
            let message = shared.chain_paths.forward(request_id, forward, data, &sender).await;
            drop(held);
            let _ = replies.send(Reply { request_id, message, data: Vec::new(), memory: None }).await;
            drop(slot);
        });
        true
    }

    /// Hands a chained change to the chain's data path on its own task (its answer waits
    /// for the chain's acknowledgement), holding a queue slot, its credit and its data.
    async fn chained(
        &self,
        request_id: u64,
        (chain, version, request): (u32, u64, IoRequest),
        data: Bytes,
        held: (Reservation, Credit),
    ) -> bool {
        let Ok(slot) = self.slots.clone().acquire_owned().await else { return false };
        let (shared, replies) = (self.shared.clone(), self.replies.clone());
        tokio::spawn(async move {
            let reply = shared.chain_paths.change(request_id, (chain, version), request, data).await;
            drop(held);
            let _ = replies.send(reply).await;
            drop(slot);
        });
        true
    }

    /// Scrub: a chained `BlockChecksums` (fenced as a read) on its own task: it may repair
    /// and ask the other members, holding a queue slot and its credit meanwhile.
    async fn block_checksums(
        &self,
        request_id: u64,
        (chain, version, request): (u32, u64, IoRequest),
        held: (Reservation, Credit),
    ) -> bool {
        let Ok(slot) = self.slots.clone().acquire_owned().await else { return false };
        let (shared, replies) = (self.shared.clone(), self.replies.clone());
        tokio::spawn(async move {
            let message = shared.chain_paths.block_checksums(chain, version, &request).await;
            drop(held);
            let _ = replies.send(Reply { request_id, message, data: Vec::new(), memory: None }).await;
            drop(slot);
        });
        true
    }

    /// Refuses a request over `request_bytes_max` or over the connection's credit, before
    /// anything is executed or allocated for it.
    fn take_credit(&self, request: &IoRequest) -> Result<Credit, WireError> {
        let bytes = request.data_bytes().map_err(shape_error)?;
        let limits = &self.shared.limits;
        if bytes > limits.request_bytes_max {
            let message = format!(
                "request moves {bytes} bytes, over the limit request_bytes_max = {}",
                limits.request_bytes_max
            );
            return Err(WireError::new(ErrorCode::OverLimit, message));
        }
        let before = self.in_flight_bytes.fetch_add(bytes, Ordering::AcqRel);
        let credit = Credit { in_flight_bytes: self.in_flight_bytes.clone(), bytes };
        if before + bytes > limits.in_flight_bytes_max {
            let message = format!(
                "connection would have {} bytes in flight, over the limit in_flight_bytes_max = {}",
                before + bytes,
                limits.in_flight_bytes_max
            );
            return Err(WireError::new(ErrorCode::OverLimit, message));
        }
        Ok(credit)
    }

    /// The reply to a request answered by the reader itself (`Hello`, `Job`, `Stats`).
    fn answer_inline(&mut self, request: &IoRequest) -> Option<IoReply> {
        Some(match request {
            IoRequest::Hello { client } => {
                tracing::debug!(connection = self.id, client, "hello");
                IoReply::Welcome {
                    server: self.shared.server_name.clone(),
                    limits: self.shared.limits,
                    boot_epoch: self.shared.boot_epoch,
                }
            }
            IoRequest::Job { id } => self.name_job(id),
            IoRequest::Stats => match &self.shared.metrics {
                Some(metrics) => IoReply::Stats(metrics.stats(&self.shared.server_name)),
                None => IoReply::Error(WireError::new(
                    ErrorCode::Unavailable,
                    "this server counts nothing (metrics = false)",
                )),
            },
            _ => return None,
        })
    }

    /// Counts the rest of the connection under job `id`.
    fn name_job(&mut self, id: &str) -> IoReply {
        if let Err(message) = flotilla_proto::check_job_id(id) {
            return IoReply::Error(WireError::new(ErrorCode::InvalidArgument, message));
        }
        if let Some(metrics) = &self.shared.metrics {
            self.job = Some(metrics.jobs.counters(id));
        }
        IoReply::Done { bytes: 0 }
    }

    async fn refuse(&self, request_id: u64, code: ErrorCode, message: String) -> bool {
        if let Some(metrics) = &self.shared.metrics {
            metrics.refused(code);
        }
        let message = IoReply::Error(WireError::new(code, message));
        self.replies.send(Reply { request_id, message, data: Vec::new(), memory: None }).await.is_ok()
    }
}

/// KiB units of the memory budget a request of `bytes` holds (at least one, at most all).
pub(crate) fn memory_units(bytes: u64, units_max: u32) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX).min(units_max)
}

#[cfg(test)]
mod tests {
    use super::memory_units;

    #[test]
    fn memory_units_are_bounded_both_ways() {
        assert_eq!(memory_units(0, 100), 1, "even an empty request holds one unit");
        assert_eq!(memory_units(1025, 100), 2);
        assert_eq!(
            memory_units(1 << 40, 100),
            100,
            "a request larger than the budget takes all of it, not more"
        );
    }
}
