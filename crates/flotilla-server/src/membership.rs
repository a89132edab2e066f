//! Registration with the metadata service, heartbeats, and the delete orders that come
//! back with them. With several metadata addresses (a group), the server talks to the node
//! that serves, moving on as the client does (flotilla-client `LeaderChase`): a node that
//! cannot be reached, whose connection broke, that is not the leader (its hint is tried
//! first) or has no quorum; after a round of failures it pauses.

use crate::execute::Executor;
use bytes::Bytes;
use flotilla_client::{LeaderChase, Move};
use flotilla_proto::{DeleteOrder, MetaReply, MetaRequest, NotServed, TargetReport};
use flotilla_rpc::{Connection, ConnectionConfig};
use std::sync::Arc;
use std::time::Duration;

/// Why a session with a metadata node ended.
struct Ended {
    error: String,
    /// The leader a `NotLeader` reply named.
    leader: Option<String>,
}

impl From<String> for Ended {
    fn from(error: String) -> Ended {
        Ended { error, leader: None }
    }
}

/// Keeps the server registered and heard from until the task is dropped.
pub(crate) async fn heartbeat_loop(
    (mut chase, auth): (LeaderChase, flotilla_auth::ClientAuth),
    advertise: String,
    executor: Arc<Executor>,
    period: Duration,
) {
    let mut acknowledged: Vec<DeleteOrder> = Vec::new();
    loop {
        let meta = chase.target().to_string();
        let config = ConnectionConfig::with_auth(auth.clone());
        let ended = match session(
            (&meta, config),
            &mut chase,
            &advertise,
            &executor,
            period,
            &mut acknowledged,
        )
        .await
        {
            Ok(()) => return,
            Err(ended) => ended,
        };
        let step = chase.failed(&meta, ended.leader.as_deref());
        let next = chase.target();
        tracing::warn!(meta, error = %ended.error, next, "metadata node not serving; moving on");
        if step == Move::Pause {
            tokio::time::sleep(period.min(Duration::from_millis(500))).await;
        }
    }
}

/// One connection's worth of registration and heartbeats; returns on a failure.
async fn session(
    (meta, config): (&str, ConnectionConfig),
    chase: &mut LeaderChase,
    advertise: &str,
    executor: &Arc<Executor>,
    period: Duration,
    acknowledged: &mut Vec<DeleteOrder>,
) -> Result<(), Ended> {
    let connection = Connection::connect(meta, config).await.map_err(|e| e.to_string())?;
    let register = MetaRequest::Register { server: advertise.to_string(), targets: reports(executor).await };
    let period = match call(&connection, &register).await? {
        MetaReply::Registered { heartbeat_ms } if heartbeat_ms > 0 => Duration::from_millis(heartbeat_ms),
        MetaReply::Registered { .. } => period,
        other => return Err(format!("unexpected reply to register: {other:?}").into()),
    };
    chase.served(meta);
    tracing::info!(meta, advertise, "registered with the metadata service");
    loop {
        tokio::time::sleep(period).await;
        let heartbeat = MetaRequest::Heartbeat {
            server: advertise.to_string(),
            targets: reports(executor).await,
            deleted: acknowledged.clone(),
        };
        let orders = match call(&connection, &heartbeat).await? {
            MetaReply::HeartbeatAck { delete } => delete,
            other => return Err(format!("unexpected reply to heartbeat: {other:?}").into()),
        };
        acknowledged.clear();
        acknowledged.extend(delete_subfiles(executor, orders).await);
    }
}

async fn call(connection: &Connection, request: &MetaRequest) -> Result<MetaReply, Ended> {
    let (reply, _) =
        connection.call::<MetaRequest, MetaReply>(request, Bytes::new()).await.map_err(|e| e.to_string())?;
    match reply {
        MetaReply::Error(error) => Err(error.to_string().into()),
        MetaReply::NotServed(reason) => {
            let leader = match &reason {
                NotServed::NotLeader { leader } => leader.clone(),
                NotServed::NoQuorum => None,
            };
            Err(Ended { error: reason.to_string(), leader })
        }
        other => Ok(other),
    }
}

/// Usage of every target (statvfs runs on a blocking thread).
async fn reports(executor: &Arc<Executor>) -> Vec<TargetReport> {
    let executor = executor.clone();
    let gathered = tokio::task::spawn_blocking(move || {
        executor
            .store
            .target_ids()
            .into_iter()
            .map(|target| {
                let lost = !matches!(executor.store.target_lost(target), Ok(None));
                match executor.store.usage(target) {
                    Ok(usage) => TargetReport {
                        target,
                        used_bytes: usage.used_bytes,
                        free_bytes: usage.free_bytes,
                        lost,
                    },
                    Err(error) => {
                        tracing::warn!(%target, %error, "cannot read target usage");
                        TargetReport { target, used_bytes: 0, free_bytes: 0, lost }
                    }
                }
            })
            .collect()
    })
    .await;
    gathered.unwrap_or_default()
}

/// Deletes the ordered subfiles; returns the orders done (or already done).
async fn delete_subfiles(executor: &Arc<Executor>, orders: Vec<DeleteOrder>) -> Vec<DeleteOrder> {
    if orders.is_empty() {
        return Vec::new();
    }
    let executor = executor.clone();
    let done = tokio::task::spawn_blocking(move || {
        orders
            .into_iter()
            .filter(|order| match executor.store.remove_subfile(order.target, order.file, order.subfile) {
                Ok(()) => true,
                Err(flotilla_store::StoreError::UnknownSubfile { .. }) => true,
                Err(error) => {
                    tracing::warn!(%error, "cannot delete subfile; will retry");
                    false
                }
            })
            .collect()
    })
    .await;
    done.unwrap_or_default()
}
