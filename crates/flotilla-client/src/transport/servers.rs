//! The connections to the I/O servers: one per server, opened (and greeted) on first use,
//! with the flow-control credit the server granted.
//!
//! Connections live in per-server slots: the map of slots is locked only to find a slot, never
//! across network I/O; a slot's own lock is held while its connection is (re)opened, so calls
//! to one server wait for that server's connect (bounded by the connect timeout) and calls to
//! every other server go on.

use super::outage::Service;
use super::Transport;
use crate::error::{unexpected, ClientError};
use bytes::Bytes;
use flotilla_proto::{ErrorCode, IoReply, IoRequest, WithRef};
use flotilla_rpc::{Connection, ReplyData, RpcError, ScatterTarget};
use flotilla_types::Limits;
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

/// One server's connection slot.
pub(super) type ServerSlot = Arc<Mutex<Option<Arc<ServerConnection>>>>;

impl Transport {
    /// The connection to the server at `addr`, opened (and greeted) on first use or after
    /// the previous one broke. A new connection is handed to the layers above (`OnConnect`:
    /// the writes a restart of that server lost go again, oldest first) before anything
    /// else is sent on it, so nothing else sent to that server can see what its restart lost.
    pub async fn server(&self, addr: &str) -> Result<Arc<ServerConnection>, ClientError> {
        let slot = self.servers.lock().entry(addr.to_string()).or_default().clone();
        let mut current = slot.lock().await;
        if let Some(server) = current.as_ref().filter(|s| !s.connection.is_broken()) {
            return Ok(server.clone());
        }
        let server = Arc::new(self.open_server(addr).await?);
        self.on_connect.connected(self, &server, addr).await?;
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
