//! Registration with the metadata service, heartbeats, and the delete orders that come
//! back with them; and (replication, issue 32) the server's failure group and incarnation
//! sent with them and the chains and lease the replies hand back, kept in [`HeldChains`].
//! With several metadata addresses (a group), the server talks to the node that serves,
//! moving on as the client does (flotilla-client `LeaderChase`): a node that cannot be
//! reached, whose connection broke, that is not the leader (its hint is tried first) or has
//! no quorum; after a round of failures it pauses.

use crate::execute::Executor;
use crate::held_table::HeldTable;
use bytes::Bytes;
use flotilla_client::{LeaderChase, Move};
use flotilla_proto::{
    ChainInfo, ChainView, DeleteOrder, ErrorCode, MemberInfo, MetaReply, MetaRequest, NotServed, TargetReport,
};
use flotilla_rpc::{Connection, ConnectionConfig};
use flotilla_types::TargetId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the server declares about itself, and the chains the metadata service's heartbeat
/// replies gave it, never going back in a chain's version (`held_table.rs`): the chain data path (`chain_path.rs`) fences every chained request and forward
/// with `flotilla_replica::admit` against it, asks for an early heartbeat when a successor
/// fails ([`HeldChains::nudge`]) and waits for the next view ([`HeldChains::watch`]).
#[derive(Debug)]
pub struct HeldChains {
    member: MemberInfo,
    /// The chains held (monotonic in each chain's version, see `held_table.rs`) and the
    /// end of the lease.
    held: Mutex<Option<(HeldTable, Instant)>>,
    /// The origin of the millisecond clock the fencing check reads.
    base: Instant,
    /// Wakes the heartbeat loop before its period ends.
    nudge: tokio::sync::Notify,
    /// Counts the views stored, so waiters learn of each new one.
    stored: tokio::sync::watch::Sender<u64>,
    /// Where each chain member's target is served (from the service's `Status`), and
    /// whether it must be asked again (a successor could not be reached there).
    addresses: Mutex<(HashMap<TargetId, String>, bool)>,
    /// The server credential that reported each target (from the same `Status`): a forward
    /// into a chain is taken only from the credential of one of its members.
    credentials: Mutex<HashMap<TargetId, String>>,
    /// Requests of the chain data path (resync) to the metadata service, sent on the
    /// heartbeat loop's connection (at most `META_ASKS_MAX` waiting).
    asks: tokio::sync::mpsc::Sender<MetaAsk>,
    asked: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<MetaAsk>>,
}

/// A request to the metadata service and where its answer goes.
type MetaAsk = (MetaRequest, tokio::sync::oneshot::Sender<Result<MetaReply, String>>);

/// Most requests of the data path waiting for the heartbeat loop's connection.
const META_ASKS_MAX: usize = 16;

/// A copy of [`HeldChains`] at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainsSnapshot {
    pub failure_group: String,
    pub incarnation: u64,
    /// The chains of this server's targets, as of the last heartbeat reply.
    pub chains: Vec<ChainInfo>,
    /// Whether the lease of the last heartbeat still runs (by this server's clock).
    pub lease_valid: bool,
}

impl HeldChains {
    pub(crate) fn new(member: MemberInfo) -> HeldChains {
        let (asks, asked) = tokio::sync::mpsc::channel(META_ASKS_MAX);
        HeldChains {
            member,
            held: Mutex::new(None),
            base: Instant::now(),
            nudge: tokio::sync::Notify::new(),
            stored: tokio::sync::watch::channel(0).0,
            addresses: Mutex::new((HashMap::new(), false)),
            credentials: Mutex::new(HashMap::new()),
            asks,
            asked: tokio::sync::Mutex::new(asked),
        }
    }

    /// Sends `request` to the metadata service on the heartbeat loop's connection and
    /// returns its reply (an `Error` reply included), waiting at most `timeout`.
    pub(crate) async fn ask_meta(
        &self,
        request: MetaRequest,
        timeout: Duration,
    ) -> Result<MetaReply, String> {
        let (answer, reply) = tokio::sync::oneshot::channel();
        self.asks.try_send((request, answer)).map_err(|_| {
            format!("{META_ASKS_MAX} requests already wait for the metadata service's connection")
        })?;
        match tokio::time::timeout(timeout, reply).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err("the heartbeat loop dropped the request".into()),
            Err(_) => Err(format!("no answer from the metadata service within {} ms", timeout.as_millis())),
        }
    }

    /// Asks the heartbeat loop to heartbeat now (a successor failed: news are wanted).
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Changes every time a heartbeat reply brings a view.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.stored.subscribe()
    }

    /// The chain `chain` as held now (never older than it was at any earlier call).
    pub(crate) fn chain(&self, chain: u32) -> Option<ChainInfo> {
        let held = self.held.lock();
        held.as_ref().and_then(|(table, _)| table.chain(chain).cloned())
    }

    /// The ids of the chains held now.
    pub(crate) fn chain_ids(&self) -> Vec<u32> {
        let held = self.held.lock();
        held.as_ref().map(|(table, _)| table.chains().map(|c| c.chain).collect()).unwrap_or_default()
    }

    /// The address of the server of `target`, as the metadata service last told it.
    pub(crate) fn address(&self, target: TargetId) -> Option<String> {
        self.addresses.lock().0.get(&target).cloned()
    }

    /// The address of `target` failed: ask the metadata service again with the next heartbeat.
    pub(crate) fn address_failed(&self) {
        self.addresses.lock().1 = true;
    }

    /// Whether the addresses must be (re)fetched for `view`: asked to, or a member unknown.
    fn addresses_wanted(&self, view: &ChainView) -> bool {
        let addresses = self.addresses.lock();
        addresses.1
            || view.chains.iter().flat_map(|c| &c.members).any(|m| !addresses.0.contains_key(&m.target))
    }

    /// The server credential of each target, as the metadata service last told it.
    pub(crate) fn credentials(&self) -> HashMap<TargetId, String> {
        self.credentials.lock().clone()
    }

    fn store_addresses(&self, status: Vec<flotilla_proto::TargetStatus>) {
        *self.credentials.lock() = status.iter().map(|t| (t.target, t.credential.clone())).collect();
        let mut addresses = self.addresses.lock();
        addresses.0 = status.into_iter().map(|t| (t.target, t.server)).collect();
        addresses.1 = false;
    }

    /// The chains held and the lease, in ms of this server's monotonic clock, for the
    /// fencing check (no view yet: no chains and no lease).
    pub(crate) fn fence_view(&self) -> (Vec<ChainInfo>, crate::chain_write::Lease) {
        let ms = |at: Instant| {
            u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
        };
        let now_ms = ms(Instant::now());
        match self.held.lock().as_ref() {
            Some((table, until)) => {
                let chains = table.chains().cloned().collect();
                (chains, crate::chain_write::Lease { valid_until_ms: ms(*until), now_ms })
            }
            None => (Vec::new(), crate::chain_write::Lease { valid_until_ms: 0, now_ms }),
        }
    }

    /// Takes `view` into the chains held (a chain it lists older than held is ignored);
    /// its lease runs `view.lease_ms` from `sent` (when the heartbeat left).
    pub(crate) fn store(&self, view: ChainView, sent: Instant) {
        let until = sent + Duration::from_millis(view.lease_ms);
        let taken = {
            let mut held = self.held.lock();
            let (table, lease) = held.get_or_insert_with(|| (HeldTable::default(), until));
            *lease = until;
            table.take(view.chains)
        };
        if taken.stale > 0 {
            tracing::warn!(
                stale = taken.stale,
                "a heartbeat reply listed chains older than held; kept the newer"
            );
        }
        self.stored.send_modify(|count| *count = count.wrapping_add(1));
    }

    pub fn snapshot(&self) -> ChainsSnapshot {
        let held = self.held.lock();
        let (chains, lease_valid) = match held.as_ref() {
            Some((table, until)) => (table.chains().cloned().collect(), Instant::now() < *until),
            None => (Vec::new(), false),
        };
        ChainsSnapshot {
            failure_group: self.member.failure_group.clone(),
            incarnation: self.member.incarnation,
            chains,
            lease_valid,
        }
    }
}

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
    (advertise, held): (String, Arc<HeldChains>),
    executor: Arc<Executor>,
    period: Duration,
) {
    let mut acknowledged: Vec<DeleteOrder> = Vec::new();
    loop {
        let meta = chase.target().to_string();
        let config = ConnectionConfig::with_auth(auth.clone());
        let me = (advertise.as_str(), held.as_ref());
        let ended = match session((&meta, config), &mut chase, me, &executor, period, &mut acknowledged).await
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
    (advertise, held): (&str, &HeldChains),
    executor: &Arc<Executor>,
    period: Duration,
    acknowledged: &mut Vec<DeleteOrder>,
) -> Result<(), Ended> {
    let connection = Connection::connect(meta, config).await.map_err(|e| e.to_string())?;
    let (server, member) = (advertise.to_string(), held.member.clone());
    let register =
        MetaRequest::RegisterMember { server: server.clone(), targets: reports(executor).await, member };
    // A service that predates replication refuses the request as undecodable: register the
    // old way, and heartbeat the old way for the rest of this connection.
    let (reply, members) = match call_raw(&connection, &register).await? {
        MetaReply::Error(error) if error.code == ErrorCode::BadRequest => {
            let old = MetaRequest::Register { server: server.clone(), targets: reports(executor).await };
            (call(&connection, &old).await?, false)
        }
        reply => (check(reply)?, true),
    };
    let period = match reply {
        MetaReply::Registered { heartbeat_ms } if heartbeat_ms > 0 => Duration::from_millis(heartbeat_ms),
        MetaReply::Registered { .. } => period,
        other => return Err(format!("unexpected reply to register: {other:?}").into()),
    };
    chase.served(meta);
    tracing::info!(
        meta,
        advertise,
        failure_group = held.member.failure_group,
        "registered with the metadata service"
    );
    let mut asks = held.asked.lock().await;
    let mut next_heartbeat = tokio::time::Instant::now() + period;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next_heartbeat) => {}
            _ = held.nudge.notified() => {}
            ask = asks.recv() => {
                let Some((request, answer)) = ask else { continue };
                match call_raw(&connection, &request).await {
                    Ok(reply) => {
                        let _ = answer.send(Ok(reply));
                        continue;
                    }
                    Err(ended) => {
                        let _ = answer.send(Err(ended.error.clone()));
                        return Err(ended);
                    }
                }
            }
        }
        next_heartbeat = tokio::time::Instant::now() + period;
        let (targets, deleted) = (reports(executor).await, acknowledged.clone());
        let heartbeat = match members {
            true => MetaRequest::HeartbeatMember {
                server: server.clone(),
                targets,
                deleted,
                member: held.member.clone(),
            },
            false => MetaRequest::Heartbeat { server: server.clone(), targets, deleted },
        };
        let sent = Instant::now();
        let orders = match call(&connection, &heartbeat).await? {
            MetaReply::HeartbeatAck { delete } => delete,
            MetaReply::HeartbeatChains { delete, view } => {
                // Where the members are served, before the view is shown to the data path.
                if held.addresses_wanted(&view) {
                    if let Ok(MetaReply::Status(status)) = call_raw(&connection, &MetaRequest::Status).await {
                        held.store_addresses(status);
                    }
                }
                held.store(view, sent);
                delete
            }
            other => return Err(format!("unexpected reply to heartbeat: {other:?}").into()),
        };
        acknowledged.clear();
        acknowledged.extend(delete_subfiles(executor, orders).await);
    }
}

async fn call_raw(connection: &Connection, request: &MetaRequest) -> Result<MetaReply, Ended> {
    let (reply, _) =
        connection.call::<MetaRequest, MetaReply>(request, Bytes::new()).await.map_err(|e| e.to_string())?;
    Ok(reply)
}

async fn call(connection: &Connection, request: &MetaRequest) -> Result<MetaReply, Ended> {
    check(call_raw(connection, request).await?)
}

fn check(reply: MetaReply) -> Result<MetaReply, Ended> {
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
