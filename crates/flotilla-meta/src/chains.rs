//! Replication's control plane (issue 32): the chain table, kept durably in the namespace
//! and changed only by the `flotilla_replica::Membership` engine, which heartbeats and a
//! periodic tick drive.
//!
//! - Targets declare their failure group and their server's incarnation with every
//!   `RegisterMember`/`HeartbeatMember`; a new target's group is recorded durably.
//! - The table is built (`ChainTable::build`, `chain_replicas` members per chain) once the
//!   known targets span `chain_replicas` failure groups, and extended by `add_target` for
//!   every target after that.
//! - **Every chain change is written to the namespace before anyone hears of it**: the
//!   engine runs under one lock, its changed chains are committed durably under that lock,
//!   and heartbeat replies and status read the table under the same lock. A failed write
//!   reloads the engine from what is durable, so memory never runs ahead of the disk.
//! - Heartbeat replies carry the chains of the server's targets (ids, versions, members)
//!   and the lease, for the servers' fencing (`admit`); servers only keep them for now.
//! - Creating a replicated file is refused: first when fewer failure groups than replicas
//!   are live (naming both), then because the data path is not built
//!   ([`replicated_writes_supported`], the one switch to turn when it is).

use flotilla_namespace::{ChainChange, ChainTarget, Namespace, StoredChains};
use flotilla_proto::{
    ChainInfo, ChainMember, ChainMemberState, ChainReport, ChainView, ErrorCode, MemberHealth, MemberInfo,
    TargetAction, TargetChains, TargetReport, WireError,
};
use flotilla_replica::{
    Chain, ChainId, ChainTable, Command, Event, FailureGroup, Incarnation, MemberState, Membership,
    MembershipConfig, PlacementError,
};
use flotilla_types::{ReplicatedLayout, TargetId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Whether this build writes replicated files (the chain data path: clients send chained
/// requests to the head and read from serving members; servers order and forward them).
/// The one switch for it.
pub(crate) const fn replicated_writes_supported() -> bool {
    true
}

/// Where the chain table is kept: the namespace itself on the direct path; on a metadata
/// group the leader's changes are proposed to the log ([`Op::ChainChanges`]) and read back
/// from the state machine's namespace.
///
/// [`Op::ChainChanges`]: crate::replicated::Op::ChainChanges
pub(crate) trait ChainStore {
    /// The table as durably kept (on a group: as applied on this node).
    fn stored(&self) -> Result<StoredChains, WireError>;
    /// Records `change` durably (on a group: committed by a majority and applied here)
    /// before returning.
    fn record(&self, change: ChainChange<'_>) -> Result<(), WireError>;
    /// Whether `stored` holds every change `record` was ever asked for that may still take
    /// effect (on a group: everything this leader appended to its log is applied). Until it
    /// does, an engine whose write failed is not reloaded and decides nothing.
    fn settled(&self) -> bool {
        true
    }
}

impl ChainStore for Namespace {
    fn stored(&self) -> Result<StoredChains, WireError> {
        self.chain_table().map_err(crate::handle::wire)
    }

    fn record(&self, change: ChainChange<'_>) -> Result<(), WireError> {
        self.record_chains(change).map_err(crate::handle::wire)
    }
}

/// Why a replicated create is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReplicaRefusal {
    #[error("layout {layout}: {source}")]
    Groups { layout: String, source: PlacementError },
    #[error(
        "layout {layout}: replicated writes are not supported by this build yet (the chain data path is \
         not built); create the file with replicas=1"
    )]
    WritesUnsupported { layout: String },
    #[error(
        "layout {layout}: the chain table has {table} replicas per chain (`chain_replicas` when it was \
         built); a file can have only that many"
    )]
    TableReplicas { layout: String, table: usize },
    #[error("layout {layout}: the chain table is not built yet (no registered targets span enough failure groups)")]
    NoTable { layout: String },
    #[error(
        "layout {layout}: {source} (each subfile needs a chain of its own, sharing no target with another's)"
    )]
    Chains { layout: String, source: PlacementError },
}

impl ReplicaRefusal {
    pub(crate) fn wire(&self) -> WireError {
        let code = match self {
            ReplicaRefusal::Groups { .. }
            | ReplicaRefusal::TableReplicas { .. }
            | ReplicaRefusal::Chains { .. } => ErrorCode::InvalidArgument,
            ReplicaRefusal::WritesUnsupported { .. } => ErrorCode::Unsupported,
            ReplicaRefusal::NoTable { .. } => ErrorCode::Unavailable,
        };
        WireError::new(code, self.to_string())
    }
}

/// The chain settings of `[meta]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChainSettings {
    pub membership: MembershipConfig,
    /// Members per chain of the table.
    pub replicas: usize,
    pub chains_per_target: usize,
}

/// Gauges of the chain table, for the metrics endpoint.
#[derive(Debug, Default)]
pub(crate) struct ChainGauges {
    pub chains: AtomicU64,
    pub degraded: AtomicU64,
    pub unavailable: AtomicU64,
    pub targets_down: AtomicU64,
    pub targets_dead: AtomicU64,
    pub targets_draining: AtomicU64,
    /// Chains with a member being copied (`Syncing`).
    pub rebuilding: AtomicU64,
    /// The last estimate of bytes left to rebuild (updated by every `ChainStatus`).
    pub rebuild_bytes_left: AtomicU64,
}

struct Inner {
    engine: Option<Membership>,
    /// Every target ever declared, with its group and last incarnation (as persisted).
    targets: BTreeMap<TargetId, ChainTarget>,
    /// Targets declared in another group than recorded (warned about once).
    regrouped: BTreeSet<TargetId>,
    /// Files this service placed on each chain since it started (placement's load).
    placed: BTreeMap<ChainId, u64>,
    /// A write failed and what is durable was not settled yet: the engine decides nothing
    /// until it is reloaded (a group node whose proposal may still commit).
    stale: bool,
}

/// The chain table and its engine.
pub(crate) struct Chains {
    inner: Mutex<Inner>,
    settings: ChainSettings,
    /// The engine's clock: milliseconds since this service started (monotonic).
    epoch: Instant,
    pub gauges: Arc<ChainGauges>,
}

impl Chains {
    /// Loads the table kept in `namespace` (none in a new database).
    pub fn load(namespace: &dyn ChainStore, settings: ChainSettings) -> Result<Chains, WireError> {
        let invalid = |e: flotilla_replica::ConfigError| {
            WireError::new(ErrorCode::InvalidArgument, format!("[meta] {e}"))
        };
        settings.membership.validate().map_err(invalid)?;
        let chains = Chains {
            inner: Mutex::new(Inner {
                engine: None,
                targets: BTreeMap::new(),
                regrouped: BTreeSet::new(),
                placed: BTreeMap::new(),
                stale: false,
            }),
            settings,
            epoch: Instant::now(),
            gauges: Arc::default(),
        };
        let inner = chains.load_inner(namespace)?;
        *chains.inner.lock() = inner;
        chains.update_gauges(&chains.inner.lock());
        Ok(chains)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Loads the engine again from what `store` keeps, every target given a fresh lease (a
    /// new leader of a metadata group: the heartbeats went to the old one, so nobody is
    /// fenced before `fence_after_ms` passed under this one).
    pub fn reload(&self, store: &dyn ChainStore) -> Result<(), WireError> {
        let reloaded = self.load_inner(store)?;
        let mut inner = self.inner.lock();
        *inner = reloaded;
        self.update_gauges(&inner);
        tracing::info!(
            chains = inner.engine.as_ref().map_or(0, |e| e.table().chains().count()),
            targets = inner.targets.len(),
            "chain table loaded"
        );
        Ok(())
    }

    /// Reloads a stale engine if the store settled; else refuses (the caller retries).
    fn fresh(&self, store: &dyn ChainStore, inner: &mut Inner) -> Result<(), WireError> {
        if !inner.stale {
            return Ok(());
        }
        if !store.settled() {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "the chain table is settling after a change of unknown outcome; retry",
            ));
        }
        *inner = self.load_inner(store)?;
        self.update_gauges(inner);
        Ok(())
    }

    fn load_inner(&self, namespace: &dyn ChainStore) -> Result<Inner, WireError> {
        let stored = namespace.stored()?;
        let targets = stored.targets;
        let engine = match stored.replicas {
            Some(replicas) if !stored.chains.is_empty() => {
                if replicas as usize != self.settings.replicas {
                    tracing::warn!(
                        stored = replicas,
                        configured = self.settings.replicas,
                        "the chain table keeps the replica count it was built with; chain_replicas ignored"
                    );
                }
                let groups = targets.iter().map(|(&t, r)| (t, r.group.clone())).collect();
                let table = ChainTable::from_parts(replicas as usize, stored.chains, groups)
                    .ok_or_else(|| corrupt("the stored chain table breaks its invariants"))?;
                let mut engine = Membership::new(self.settings.membership, table, self.now_ms())
                    .map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
                for (&target, record) in &targets {
                    if let Some(incarnation) = record.incarnation {
                        engine.remember_incarnation(target, incarnation);
                    }
                    engine.restore_marks(target, record.dead, record.draining);
                }
                Some(engine)
            }
            _ => None,
        };
        Ok(Inner { engine, targets, regrouped: BTreeSet::new(), placed: BTreeMap::new(), stale: false })
    }

    /// A registration or heartbeat of `reports` from a server declaring `member`: records
    /// new targets and incarnations, drives the engine, builds or extends the table, and
    /// commits every change before returning.
    pub fn report(
        &self,
        namespace: &dyn ChainStore,
        reports: &[TargetReport],
        member: &MemberInfo,
    ) -> Result<(), WireError> {
        let group = failure_group(&member.failure_group)?;
        let incarnation = Incarnation(member.incarnation);
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        self.fresh(namespace, inner)?;
        let (mut changed_targets, mut commands) = (BTreeSet::new(), Vec::new());
        let now_ms = self.now_ms();
        for report in reports {
            if self.note_target(inner, report.target, (&group, incarnation)) {
                changed_targets.insert(report.target);
            }
            commands.extend(self.drive(inner, report, incarnation, now_ms));
        }
        let built = if inner.engine.is_none() { self.try_build(inner, now_ms) } else { None };
        let outcome = self.commit(namespace, inner, &commands, changed_targets, built);
        self.settle(namespace, inner, outcome)
    }

    /// Records `target`'s group (the first one declared stays) and a higher incarnation;
    /// true if its record changed.
    fn note_target(
        &self,
        inner: &mut Inner,
        target: TargetId,
        (group, incarnation): (&FailureGroup, Incarnation),
    ) -> bool {
        let mut changed = false;
        let record = inner.targets.entry(target).or_insert_with(|| {
            changed = true;
            ChainTarget { group: group.clone(), incarnation: None, dead: false, draining: false }
        });
        if record.group != *group && inner.regrouped.insert(target) {
            tracing::warn!(%target, recorded = %record.group, declared = %group,
                "a target keeps the failure group it was first declared in");
        }
        if record.incarnation.is_none_or(|known| known < incarnation) {
            record.incarnation = Some(incarnation);
            changed = true;
        }
        changed
    }

    /// The engine's part of one target's report: the target joins the table if it is new,
    /// and its heartbeat counts unless the target lost its contents.
    fn drive(
        &self,
        inner: &mut Inner,
        report: &TargetReport,
        incarnation: Incarnation,
        now_ms: u64,
    ) -> Vec<Command> {
        let target = report.target;
        let group = inner.targets.get(&target).map(|r| r.group.clone());
        let (Some(engine), Some(group)) = (inner.engine.as_mut(), group) else { return Vec::new() };
        let mut commands = Vec::new();
        if engine.table().group_of(target).is_none() {
            match engine.add_target(target, group, self.settings.chains_per_target, now_ms) {
                Ok(added) => commands.extend(added),
                Err(error) => tracing::warn!(%target, %error, "cannot add the target to the chain table"),
            }
        }
        if !report.lost {
            commands.extend(engine.handle(Event::Heartbeat { target, incarnation, at_ms: now_ms }));
        }
        commands
    }

    /// Builds the table once the known targets span `replicas` failure groups.
    fn try_build(&self, inner: &mut Inner, now_ms: u64) -> Option<u32> {
        let groups: BTreeMap<TargetId, FailureGroup> =
            inner.targets.iter().map(|(&t, r)| (t, r.group.clone())).collect();
        let distinct = groups.values().collect::<BTreeSet<_>>().len();
        if distinct < self.settings.replicas {
            return None;
        }
        let table = match ChainTable::build(groups, self.settings.replicas, self.settings.chains_per_target) {
            Ok(table) => table,
            Err(error) => {
                tracing::warn!(%error, "cannot build the chain table");
                return None;
            }
        };
        let mut engine = Membership::new(self.settings.membership, table, now_ms).ok()?;
        for (&target, record) in &inner.targets {
            if let Some(incarnation) = record.incarnation {
                engine.remember_incarnation(target, incarnation);
            }
            engine.restore_marks(target, record.dead, record.draining);
        }
        tracing::info!(
            chains = engine.table().chains().count(),
            replicas = self.settings.replicas,
            "chain table built"
        );
        inner.engine = Some(engine);
        Some(self.settings.replicas as u32)
    }

    /// A copy source reports that `target` caught up on `chain` at `version`: the engine
    /// makes it serving if that is still the chain's version (else nothing changes: the
    /// resync restarts under the new version), and the change is committed.
    pub fn sync_done(
        &self,
        namespace: &dyn ChainStore,
        chain: u32,
        target: TargetId,
        version: u64,
    ) -> Result<(), WireError> {
        let mut inner = self.inner.lock();
        self.fresh(namespace, &mut inner)?;
        let Some(engine) = inner.engine.as_mut() else {
            return Err(WireError::new(ErrorCode::NotFound, "the chain table is not built"));
        };
        let event = Event::SyncDone {
            chain: ChainId(chain),
            target,
            version: flotilla_replica::ChainVersion(version),
        };
        let commands = engine.handle(event);
        tracing::info!(chain, %target, version, changed = !commands.is_empty(), "resync reported done");
        let outcome = self.commit(namespace, &mut inner, &commands, BTreeSet::new(), None);
        self.settle(namespace, &mut inner, outcome)
    }

    /// `TargetAdmin`: the operator drains or removes `target` online; the engine's changes
    /// (replacement members, the target leaving chains) are committed before this returns.
    /// Refused: no table, a target the table does not have, and a removal where the target
    /// holds a chain's last serving copy (naming those chains).
    pub fn admin(
        &self,
        namespace: &dyn ChainStore,
        target: TargetId,
        action: TargetAction,
    ) -> Result<(), WireError> {
        let mut inner = self.inner.lock();
        self.fresh(namespace, &mut inner)?;
        let Some(engine) = inner.engine.as_mut() else {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("cannot {action} target {target}: the chain table is not built yet"),
            ));
        };
        if engine.health(target).is_none() || engine.table().group_of(target).is_none() {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!(
                    "cannot {action} target {target}: it is not in the chain table (`flotilla status` lists the targets)"
                ),
            ));
        }
        if action == TargetAction::Remove {
            let last: Vec<String> = engine
                .table()
                .chains()
                .filter(|c| c.state_of(target) == Some(MemberState::Serving) && c.serving_count() == 1)
                .map(|c| c.id().0.to_string())
                .collect();
            if !last.is_empty() {
                return Err(WireError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "cannot remove target {target}: it holds the last serving copy of chain(s) {}; \
                         drain it instead (it leaves each chain once a replacement serves) or bring those \
                         chains' other members back first",
                        last.join(",")
                    ),
                ));
            }
        }
        let event = match action {
            TargetAction::Drain => Event::Drain { target },
            TargetAction::Remove => Event::Remove { target },
        };
        let commands = engine.handle(event);
        tracing::info!(%target, %action, changes = commands.len(), "target admin");
        let outcome = self.commit(namespace, &mut inner, &commands, BTreeSet::new(), None);
        self.settle(namespace, &mut inner, outcome)
    }

    /// The chains with a member being copied (`Syncing`), for the rebuild estimate.
    pub fn rebuilding(&self) -> BTreeSet<u32> {
        let inner = self.inner.lock();
        let Some(engine) = inner.engine.as_ref() else { return BTreeSet::new() };
        engine.table().chains().filter(|c| c.syncing().is_some()).map(|c| c.id().0).collect()
    }

    /// Time passed: fences silent members, declares dead ones, and commits the changes.
    pub fn tick(&self, namespace: &dyn ChainStore) -> Result<(), WireError> {
        let mut inner = self.inner.lock();
        self.fresh(namespace, &mut inner)?;
        let now_ms = self.now_ms();
        let Some(engine) = inner.engine.as_mut() else { return Ok(()) };
        let commands = engine.handle(Event::Tick { at_ms: now_ms });
        let outcome = self.commit(namespace, &mut inner, &commands, BTreeSet::new(), None);
        self.settle(namespace, &mut inner, outcome)
    }

    /// Writes the chains `commands` changed (whole table when `built`) and the changed
    /// target records (with every dead or draining mark the engine set or cleared since
    /// the last commit), in one durable transaction.
    fn commit(
        &self,
        namespace: &dyn ChainStore,
        inner: &mut Inner,
        commands: &[Command],
        mut changed_targets: BTreeSet<TargetId>,
        built: Option<u32>,
    ) -> Result<(), WireError> {
        if let Some(engine) = inner.engine.as_ref() {
            for (&target, record) in inner.targets.iter_mut() {
                let Some(health) = engine.health(target) else { continue };
                if (record.dead, record.draining) != (health.dead, health.draining) {
                    (record.dead, record.draining) = (health.dead, health.draining);
                    changed_targets.insert(target);
                }
            }
        }
        let changed_targets = &changed_targets;
        let changed: BTreeSet<ChainId> = commands
            .iter()
            .filter_map(|c| match c {
                Command::ChainChanged { chain, .. } => Some(*chain),
                _ => None,
            })
            .collect();
        if changed.is_empty() && changed_targets.is_empty() && built.is_none() {
            return Ok(());
        }
        let chains: Vec<&Chain> = match inner.engine.as_ref() {
            Some(engine) if built.is_some() => engine.table().chains().collect(),
            Some(engine) => changed.iter().filter_map(|id| engine.table().chain(*id)).collect(),
            None => Vec::new(),
        };
        let targets: Vec<(TargetId, &ChainTarget)> =
            changed_targets.iter().filter_map(|t| inner.targets.get(t).map(|r| (*t, r))).collect();
        namespace.record(ChainChange { replicas: built, chains: &chains, targets: &targets })?;
        for command in commands {
            log_command(command);
        }
        Ok(())
    }

    /// After a commit: on failure, the engine is reloaded from what is durable.
    fn settle(
        &self,
        namespace: &dyn ChainStore,
        inner: &mut Inner,
        outcome: Result<(), WireError>,
    ) -> Result<(), WireError> {
        if let Err(error) = outcome {
            tracing::error!(%error, "cannot record a chain change; reloading the chain table");
            // What is applied may be behind a change still on its way (a group node): the
            // engine serves it, never more than is durable, and decides nothing until settled.
            let reloaded = match self.load_inner(namespace) {
                Ok(reloaded) => {
                    *inner = reloaded;
                    true
                }
                Err(reload) => {
                    tracing::error!(%reload, "cannot reload the chain table");
                    false
                }
            };
            inner.stale = !reloaded || !namespace.settled();
            self.update_gauges(inner);
            return Err(error);
        }
        self.update_gauges(inner);
        Ok(())
    }

    /// The chains of `targets` and the lease a heartbeat earns.
    pub fn view_for(&self, targets: &[TargetReport]) -> ChainView {
        let inner = self.inner.lock();
        let lease_ms = self.settings.membership.lease_ms;
        let Some(engine) = inner.engine.as_ref() else { return ChainView { lease_ms, chains: Vec::new() } };
        let mine: BTreeSet<TargetId> = targets.iter().map(|r| r.target).collect();
        let chains = engine
            .table()
            .chains()
            .filter(|c| c.members().iter().any(|m| mine.contains(&m.target)))
            .map(chain_info)
            .collect();
        ChainView { lease_ms, chains }
    }

    /// The report of `ChainStatus`.
    pub fn report_status(&self, with_chains: bool) -> ChainReport {
        let inner = self.inner.lock();
        let failure_groups = inner.targets.values().map(|r| &r.group).collect::<BTreeSet<_>>().len();
        let Some(engine) = inner.engine.as_ref() else {
            let targets = inner.targets.iter().map(|(&t, r)| unplaced(t, r)).collect();
            return ChainReport { failure_groups: failure_groups as u32, targets, ..ChainReport::default() };
        };
        let table = engine.table();
        let replicas = table.replicas();
        let degraded = |c: &Chain| c.serving_count() < replicas;
        let targets = inner
            .targets
            .iter()
            .map(|(&target, record)| {
                if table.group_of(target).is_none() {
                    return unplaced(target, record);
                }
                let mine: Vec<&Chain> = table.chains().filter(|c| c.state_of(target).is_some()).collect();
                TargetChains {
                    target,
                    failure_group: record.group.to_string(),
                    health: health_of(engine, target),
                    incarnation: record.incarnation.map_or(0, |i| i.0),
                    chains: mine.len() as u32,
                    degraded: mine.iter().filter(|c| degraded(c)).count() as u32,
                }
            })
            .collect();
        let counts = counts(engine);
        ChainReport {
            replicas: replicas as u32,
            failure_groups: failure_groups as u32,
            chains_total: counts.0,
            chains_degraded: counts.1,
            chains_unavailable: counts.2,
            targets,
            chains: if with_chains { table.chains().map(chain_info).collect() } else { Vec::new() },
            chains_rebuilding: table.chains().filter(|c| c.syncing().is_some()).count() as u32,
            rebuild_bytes_left: 0,
        }
    }

    /// Refuses a create of `layout` (with more than one replica) over the targets `live`.
    pub fn check_create(&self, layout: &ReplicatedLayout, live: &[TargetId]) -> Result<(), ReplicaRefusal> {
        if !layout.is_replicated() {
            return Ok(());
        }
        let inner = self.inner.lock();
        let have =
            live.iter().filter_map(|t| inner.targets.get(t)).map(|r| &r.group).collect::<BTreeSet<_>>().len();
        let wanted = layout.replicas as usize;
        if have < wanted {
            let source = PlacementError::NotEnoughFailureGroups { wanted, have };
            return Err(ReplicaRefusal::Groups { layout: layout.to_string(), source });
        }
        if !replicated_writes_supported() {
            return Err(ReplicaRefusal::WritesUnsupported { layout: layout.to_string() });
        }
        let table = inner.engine.as_ref().map(|engine| engine.table().replicas());
        match table {
            None => Err(ReplicaRefusal::NoTable { layout: layout.to_string() }),
            Some(table) if table != wanted => {
                Err(ReplicaRefusal::TableReplicas { layout: layout.to_string(), table })
            }
            Some(_) => Ok(()),
        }
    }

    /// The chains of a new replicated file of `layout` (checked by `check_create`): `count`
    /// subfiles, or as many pairwise disjoint chains as there are when `None`; each chain
    /// with its head (the subfile's recorded target).
    pub fn choose_for_file(
        &self,
        layout: &ReplicatedLayout,
        count: Option<usize>,
    ) -> Result<Vec<(u32, TargetId)>, ReplicaRefusal> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let text = || layout.to_string();
        let Some(engine) = inner.engine.as_ref() else {
            return Err(ReplicaRefusal::NoTable { layout: text() });
        };
        let table = engine.table();
        if table.replicas() != layout.replicas as usize {
            return Err(ReplicaRefusal::TableReplicas { layout: text(), table: table.replicas() });
        }
        let placed = &inner.placed;
        let load = |chain: ChainId| placed.get(&chain).copied().unwrap_or(0);
        let chosen = match count {
            Some(count) => table.choose_for_file(count, load),
            None => match table.choose_for_file(usize::MAX, load) {
                Err(PlacementError::NotEnoughDisjointChains { found, .. }) if found > 0 => {
                    table.choose_for_file(found, load)
                }
                other => other,
            },
        };
        let chosen = chosen.map_err(|source| match source {
            PlacementError::NotEnoughFailureGroups { .. } => {
                ReplicaRefusal::Groups { layout: text(), source }
            }
            source => ReplicaRefusal::Chains { layout: text(), source },
        })?;
        let mut out = Vec::with_capacity(chosen.len());
        for id in chosen {
            let chain = table.chain(id).expect("a chosen chain is in the table");
            let head = chain.head().expect("a chosen chain has a serving member");
            out.push((id.0, head));
        }
        for (id, _) in &out {
            *inner.placed.entry(ChainId(*id)).or_default() += 1;
        }
        Ok(out)
    }

    /// The current state of chains `ids` (`None` for one the table does not have).
    pub fn chains_by_id(&self, ids: &[u32]) -> Vec<Option<ChainInfo>> {
        let inner = self.inner.lock();
        let Some(engine) = inner.engine.as_ref() else { return ids.iter().map(|_| None).collect() };
        ids.iter().map(|id| engine.table().chain(ChainId(*id)).map(chain_info)).collect()
    }

    fn update_gauges(&self, inner: &Inner) {
        let g = &self.gauges;
        let Some(engine) = inner.engine.as_ref() else { return };
        let (total, degraded, unavailable) = counts(engine);
        g.chains.store(u64::from(total), Ordering::Relaxed);
        g.degraded.store(u64::from(degraded), Ordering::Relaxed);
        g.unavailable.store(u64::from(unavailable), Ordering::Relaxed);
        let health: Vec<MemberHealth> = inner.targets.keys().map(|&t| health_of(engine, t)).collect();
        let count = |h: MemberHealth| health.iter().filter(|&&x| x == h).count() as u64;
        g.targets_down.store(count(MemberHealth::Down), Ordering::Relaxed);
        g.targets_dead.store(count(MemberHealth::Dead), Ordering::Relaxed);
        g.targets_draining.store(count(MemberHealth::Draining), Ordering::Relaxed);
        let rebuilding = engine.table().chains().filter(|c| c.syncing().is_some()).count() as u64;
        g.rebuilding.store(rebuilding, Ordering::Relaxed);
        if rebuilding == 0 {
            g.rebuild_bytes_left.store(0, Ordering::Relaxed);
        }
    }
}

/// (chains, degraded, unavailable) of the engine's table.
fn counts(engine: &Membership) -> (u32, u32, u32) {
    let table = engine.table();
    let replicas = table.replicas();
    let reachable = |t: TargetId| engine.health(t).is_some_and(|h| !h.down && !h.dead);
    let (mut total, mut degraded, mut unavailable) = (0, 0, 0);
    for chain in table.chains() {
        total += 1;
        degraded += u32::from(chain.serving_count() < replicas);
        unavailable += u32::from(!chain.serving().any(reachable));
    }
    (total, degraded, unavailable)
}

fn health_of(engine: &Membership, target: TargetId) -> MemberHealth {
    match engine.health(target) {
        None => MemberHealth::Unplaced,
        Some(h) if h.dead => MemberHealth::Dead,
        Some(h) if h.draining => MemberHealth::Draining,
        Some(h) if h.down => MemberHealth::Down,
        Some(_) => MemberHealth::Up,
    }
}

fn unplaced(target: TargetId, record: &ChainTarget) -> TargetChains {
    TargetChains {
        target,
        failure_group: record.group.to_string(),
        health: MemberHealth::Unplaced,
        incarnation: record.incarnation.map_or(0, |i| i.0),
        chains: 0,
        degraded: 0,
    }
}

fn chain_info(chain: &Chain) -> ChainInfo {
    let members = chain
        .members()
        .iter()
        .map(|m| ChainMember {
            target: m.target,
            state: match m.state {
                MemberState::Serving => ChainMemberState::Serving,
                MemberState::Syncing { missed_since, full } => {
                    ChainMemberState::Syncing { missed_since: missed_since.0, full }
                }
                MemberState::Offline { missed_since, full } => {
                    ChainMemberState::Offline { missed_since: missed_since.0, full }
                }
                MemberState::Dead => ChainMemberState::Dead,
            },
        })
        .collect();
    ChainInfo { chain: chain.id().0, version: chain.version().0, members }
}

fn log_command(command: &Command) {
    match command {
        Command::ChainChanged { chain, version, members } => {
            tracing::info!(%chain, %version, ?members, "chain changed");
        }
        // The servers act on the chains a heartbeat reply hands them (a `Syncing` member is
        // copied by its predecessor); these commands only say why.
        other => tracing::info!(?other, "chain command"),
    }
}

/// A declared failure group: 1 to 255 bytes, no control characters (it is shown in status
/// lines and logs).
fn failure_group(name: &str) -> Result<FailureGroup, WireError> {
    let refuse =
        |why: String| WireError::new(ErrorCode::BadRequest, format!("failure group {name:?}: {why}"));
    if name.chars().any(char::is_control) {
        return Err(refuse("has a control character".into()));
    }
    FailureGroup::new(name).map_err(|e| refuse(e.to_string()))
}

fn corrupt(message: &str) -> WireError {
    WireError::new(ErrorCode::Io, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ChainSettings {
        let membership = MembershipConfig {
            lease_ms: 100,
            clock_margin_ms: 10,
            fence_after_ms: 200,
            dead_after_ms: 60_000,
        };
        ChainSettings { membership, replicas: 2, chains_per_target: 2 }
    }

    fn report(target: u64) -> TargetReport {
        TargetReport { target: TargetId(target), used_bytes: 0, free_bytes: 1, lost: false }
    }

    fn member(group: &str, incarnation: u64) -> MemberInfo {
        MemberInfo { failure_group: group.into(), incarnation }
    }

    /// A store whose writes may fail and whose settling the test decides (a group node whose
    /// proposal's outcome is unknown).
    struct Flaky {
        ns: Namespace,
        failing: std::cell::Cell<bool>,
        settled: std::cell::Cell<bool>,
    }

    impl ChainStore for Flaky {
        fn stored(&self) -> Result<StoredChains, WireError> {
            self.ns.stored()
        }

        fn record(&self, change: ChainChange<'_>) -> Result<(), WireError> {
            if self.failing.get() {
                return Err(WireError::new(ErrorCode::Unavailable, "no quorum"));
            }
            self.ns.record(change)
        }

        fn settled(&self) -> bool {
            self.settled.get()
        }
    }

    /// A failed write leaves the engine at what is durable, never ahead of it, and it
    /// decides nothing until the store settled; then it reloads and goes on.
    #[test]
    fn a_write_of_unknown_outcome_stops_decisions_until_the_store_settled() {
        let store = Flaky {
            ns: Namespace::open_in_memory().unwrap(),
            failing: std::cell::Cell::new(false),
            settled: std::cell::Cell::new(true),
        };
        let chains = Chains::load(&store, settings()).unwrap();
        chains.report(&store, &[report(1)], &member("a", 1)).unwrap();
        chains.report(&store, &[report(2)], &member("b", 1)).unwrap();
        let durable = chains.report_status(true).chains;
        store.failing.set(true);
        store.settled.set(false);
        // A restart of target 2's server changes its chains: the write fails.
        assert!(chains.report(&store, &[report(2)], &member("b", 2)).is_err());
        assert_eq!(chains.report_status(true).chains, durable, "memory is what is durable");
        let refused = chains.tick(&store).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unavailable);
        assert!(refused.message.contains("settling"), "{refused:?}");
        store.failing.set(false);
        assert!(chains.report(&store, &[report(2)], &member("b", 2)).is_err(), "still not settled");
        store.settled.set(true);
        chains.report(&store, &[report(2)], &member("b", 2)).unwrap();
        let after = chains.report_status(true).chains;
        assert!(after.iter().zip(&durable).all(|(a, d)| a.version >= d.version), "{after:?}");
        assert_ne!(after, durable, "the restart was decided once settled");
        assert_eq!(Chains::load(&store, settings()).unwrap().report_status(true).chains, after);
    }

    #[test]
    fn the_table_is_built_with_enough_groups_and_survives_a_reload() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        chains.report(&ns, &[report(1)], &member("a", 5)).unwrap();
        assert_eq!(chains.report_status(false).replicas, 0, "one group: no table yet");
        chains.report(&ns, &[report(2)], &member("b", 6)).unwrap();
        let status = chains.report_status(true);
        assert_eq!(status.replicas, 2);
        assert!(status.chains_total >= 2 && status.chains_degraded == 0, "{status:?}");
        assert!(!chains.view_for(&[report(1)]).chains.is_empty());
        let again = Chains::load(&ns, settings()).unwrap();
        assert_eq!(again.report_status(true).chains, status.chains);
        assert_eq!(again.report_status(true).targets[0].incarnation, 5);
    }

    #[test]
    fn a_silent_member_goes_offline_with_a_version_bump_that_is_durable() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        chains.report(&ns, &[report(1)], &member("a", 5)).unwrap();
        chains.report(&ns, &[report(2)], &member("b", 6)).unwrap();
        let before = chains.report_status(true).chains;
        std::thread::sleep(std::time::Duration::from_millis(250));
        chains.report(&ns, &[report(1)], &member("a", 5)).unwrap();
        chains.tick(&ns).unwrap();
        let after = chains.report_status(true);
        assert_eq!(after.targets[1].health, MemberHealth::Down);
        assert!(after.chains.iter().zip(&before).all(|(a, b)| a.version > b.version), "{after:?}");
        let reloaded = Chains::load(&ns, settings()).unwrap().report_status(true);
        assert_eq!(reloaded.chains, after.chains);
    }

    #[test]
    fn a_server_restart_during_a_meta_restart_is_still_seen_from_the_persisted_incarnation() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        chains.report(&ns, &[report(1)], &member("a", 5)).unwrap();
        chains.report(&ns, &[report(2)], &member("b", 6)).unwrap();
        let before = chains.report_status(true).chains;
        drop(chains);
        let reloaded = Chains::load(&ns, settings()).unwrap();
        reloaded.report(&ns, &[report(1)], &member("a", 5)).unwrap();
        assert_eq!(reloaded.report_status(true).chains, before, "same incarnation: nothing changes");
        reloaded.report(&ns, &[report(2)], &member("b", 7)).unwrap();
        let after = reloaded.report_status(true).chains;
        for (old, new) in before.iter().zip(&after) {
            assert_eq!(new.version, old.version + 1, "{after:?}");
            let b = new.members.iter().find(|m| m.target == TargetId(2)).unwrap();
            assert!(
                matches!(b.state, ChainMemberState::Offline { .. }),
                "restarted: left its chains {after:?}"
            );
        }
    }

    #[test]
    fn dead_and_draining_marks_survive_a_reload() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        for (target, group) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            chains.report(&ns, &[report(target)], &member(group, 1)).unwrap();
        }
        chains.admin(&ns, TargetId(3), TargetAction::Drain).unwrap();
        chains.admin(&ns, TargetId(4), TargetAction::Remove).unwrap();
        let health = |c: &Chains, t: u64| {
            c.report_status(true).targets.iter().find(|x| x.target == TargetId(t)).map(|x| x.health)
        };
        assert_eq!(health(&chains, 3), Some(MemberHealth::Draining));
        assert_eq!(health(&chains, 4), Some(MemberHealth::Dead));
        drop(chains);
        let reloaded = Chains::load(&ns, settings()).unwrap();
        assert_eq!(health(&reloaded, 3), Some(MemberHealth::Draining), "the drain mark is durable");
        assert_eq!(health(&reloaded, 4), Some(MemberHealth::Dead), "the dead mark is durable");
        // A heartbeat of the removed target does not bring it back.
        reloaded.report(&ns, &[report(4)], &member("d", 1)).unwrap();
        assert_eq!(health(&reloaded, 4), Some(MemberHealth::Dead));
        let stored = ns.chain_table().unwrap();
        assert!(stored.targets[&TargetId(3)].draining && stored.targets[&TargetId(4)].dead);
        assert!(!stored.targets[&TargetId(1)].dead && !stored.targets[&TargetId(1)].draining);
    }

    #[test]
    fn a_target_added_later_gets_chains_of_its_own_durably() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        chains.report(&ns, &[report(1)], &member("a", 1)).unwrap();
        chains.report(&ns, &[report(2)], &member("b", 1)).unwrap();
        let built = chains.report_status(false).chains_total;
        chains.report(&ns, &[report(3)], &member("c", 1)).unwrap();
        let extended = chains.report_status(true);
        assert_eq!(extended.chains_total, built + 2, "chains_per_target new chains: {extended:?}");
        assert_eq!(extended.targets[2].chains, 2);
        assert_eq!(ns.chain_table().unwrap().chains.len(), extended.chains.len());
    }

    #[test]
    fn a_bad_failure_group_is_refused_and_records_nothing() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        for bad in [String::new(), "g".repeat(256), "a\nb".into()] {
            let refused = chains.report(&ns, &[report(1)], &member(&bad, 1)).unwrap_err();
            assert_eq!(refused.code, ErrorCode::BadRequest);
            assert!(refused.message.contains("failure group"), "{refused:?}");
        }
        assert!(ns.chain_table().unwrap().targets.is_empty());
    }

    #[test]
    fn replicated_creates_name_the_group_shortfall_and_get_disjoint_chains() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        chains.report(&ns, &[report(1)], &member("a", 1)).unwrap();
        chains.report(&ns, &[report(2)], &member("b", 1)).unwrap();
        let live = [TargetId(1), TargetId(2)];
        let three = ReplicatedLayout::parse("stripe:1M,replicas=3").unwrap();
        let refused = chains.check_create(&three, &live).unwrap_err().to_string();
        assert!(refused.contains("3 replicas need 3 distinct failure groups, but only 2"), "{refused}");
        let two = ReplicatedLayout::parse("stripe:1M,replicas=2").unwrap();
        chains.check_create(&two, &live).unwrap();
        assert!(chains.check_create(&ReplicatedLayout::parse("stripe:1M").unwrap(), &live).is_ok());
        // Two targets in two groups make one disjoint pair: one subfile.
        let placed = chains.choose_for_file(&two, None).unwrap();
        assert_eq!(placed.len(), 1, "{placed:?}");
        let refused = chains.choose_for_file(&two, Some(2)).unwrap_err();
        assert!(refused.to_string().contains("chain of its own"), "{refused}");
        chains.report(&ns, &[report(3)], &member("c", 1)).unwrap();
        chains.report(&ns, &[report(4)], &member("d", 1)).unwrap();
        let placed = chains.choose_for_file(&two, Some(2)).unwrap();
        let info = chains.chains_by_id(&placed.iter().map(|(c, _)| *c).collect::<Vec<_>>());
        let mut members = BTreeSet::new();
        for ((_, head), chain) in placed.iter().zip(&info) {
            let chain = chain.as_ref().unwrap();
            assert_eq!(chain.members[0].target, *head, "the head is the first serving member");
            for m in &chain.members {
                assert!(members.insert(m.target), "chains share {}: {info:?}", m.target);
            }
        }
        assert_eq!(chains.chains_by_id(&[60_000]), vec![None]);
    }

    #[test]
    fn drain_adds_durable_replacements_and_remove_refuses_unknown_targets_and_last_copies() {
        let ns = Namespace::open_in_memory().unwrap();
        let chains = Chains::load(&ns, settings()).unwrap();
        for (target, group) in [(1, "a"), (2, "b"), (3, "c")] {
            chains.report(&ns, &[report(target)], &member(group, 1)).unwrap();
        }
        let unknown = chains.admin(&ns, TargetId(99), TargetAction::Drain).unwrap_err();
        assert_eq!(unknown.code, ErrorCode::NotFound);
        assert!(unknown.message.contains("target 0000000000000063"), "{unknown:?}");
        chains.admin(&ns, TargetId(1), TargetAction::Drain).unwrap();
        let status = chains.report_status(true);
        assert_eq!(status.targets[0].health, MemberHealth::Draining);
        let holding: Vec<&ChainInfo> =
            status.chains.iter().filter(|c| c.members.iter().any(|m| m.target == TargetId(1))).collect();
        assert!(!holding.is_empty());
        for chain in &holding {
            let syncing =
                chain.members.iter().filter(|m| matches!(m.state, ChainMemberState::Syncing { .. }));
            assert_eq!(syncing.count(), 1, "a replacement is copied: {chain:?}");
        }
        assert_eq!(status.chains_rebuilding as usize, holding.len());
        assert_eq!(
            Chains::load(&ns, settings()).unwrap().report_status(true).chains,
            status.chains,
            "durable"
        );
        // The replacement of one chain serves: the drained target leaves that chain.
        let first = holding[0];
        let joiner =
            first.members.iter().find(|m| matches!(m.state, ChainMemberState::Syncing { .. })).unwrap();
        chains.sync_done(&ns, first.chain, joiner.target, first.version).unwrap();
        let after = chains.chains_by_id(&[first.chain]).pop().flatten().unwrap();
        assert!(after.members.iter().all(|m| m.target != TargetId(1)), "{after:?}");
        assert!(after.members.iter().all(|m| m.state == ChainMemberState::Serving), "{after:?}");

        // Target 3 goes down: where it served with one other member, that member is the
        // last serving copy, and removing it is refused naming the chain.
        std::thread::sleep(std::time::Duration::from_millis(250));
        chains.report(&ns, &[report(1)], &member("a", 1)).unwrap();
        chains.report(&ns, &[report(2)], &member("b", 1)).unwrap();
        chains.tick(&ns).unwrap();
        let status = chains.report_status(true);
        let last = status
            .chains
            .iter()
            .find_map(|c| {
                let serving: Vec<_> =
                    c.members.iter().filter(|m| m.state == ChainMemberState::Serving).collect();
                (serving.len() == 1).then(|| (c.chain, serving[0].target))
            })
            .expect("a chain of target 3 left with one serving member");
        let refused = chains.admin(&ns, last.1, TargetAction::Remove).unwrap_err();
        assert_eq!(refused.code, ErrorCode::InvalidArgument);
        assert!(refused.message.contains("last serving copy"), "{refused:?}");
        assert!(refused.message.contains(&last.0.to_string()), "{refused:?}");
        chains.admin(&ns, TargetId(3), TargetAction::Remove).unwrap();
        assert_eq!(chains.report_status(false).targets[2].health, MemberHealth::Dead);
    }
}
