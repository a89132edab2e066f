//! The membership engine: the metadata service's synchronous state machine over the chain
//! table (openraft's engine shape: events in, commands out, no I/O, no clock of its own).
//!
//! Rules, in the order they matter:
//! - **Versions only grow**: every event bumps each chain it changed exactly once.
//! - **The last serving member stays.** A silent, restarted or removed member is taken out of
//!   the write path only if another member is `Serving`; the last one stays `Serving` (the
//!   chain is degraded, and unavailable while it is down), since it is the only copy.
//! - **Fencing**: a member silent for `fence_after_ms` goes `Offline` (see
//!   [`MembershipConfig`] for why that is safe against a member still serving).
//! - **Restart is leaving**: a heartbeat with a higher incarnation means the server lost its
//!   unsynced state, so its chains treat it as having left (it goes `Offline`, or stays the
//!   last serving member with a version bump so every link restarts). A lower incarnation is
//!   a late message and is ignored.
//! - **Rejoin through `Syncing`**: an `Offline` member that heartbeats becomes `Syncing` at the
//!   tail, one per chain at a time, and `Serving` only on a `SyncDone` for the chain's current
//!   version; any change of the chain meanwhile restarts its resync.
//! - **Dead and replaced**: a target silent for `dead_after_ms` (or removed by the operator)
//!   is `Dead` in its chains (except where it is the last serving member); a chain with fewer
//!   than `replicas` live members gets the least loaded usable target of a new failure group
//!   as a `Syncing` member with a full copy. A draining member stays `Serving` until its
//!   replacement is, then leaves.

use crate::chain::{Chain, MEMBERS_PER_CHAIN_MAX};
use crate::command::{Command, ResyncScope};
use crate::config::MembershipConfig;
use crate::error::{ConfigError, PlacementError};
use crate::event::Event;
use crate::ids::{ChainId, FailureGroup, Incarnation};
use crate::member::{Member, MemberState};
use crate::table::{needs_full, ChainTable};
use flotilla_types::TargetId;
use std::collections::{BTreeMap, BTreeSet};

/// What the engine knows of one target's liveness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetHealth {
    /// The highest incarnation heard (persisted with the table, so a restart of the metadata
    /// service still recognises a server restart).
    pub incarnation: Option<Incarnation>,
    pub last_heard_ms: u64,
    /// Silent past `fence_after_ms`.
    pub down: bool,
    /// Declared dead: never re-admitted to the chains it left.
    pub dead: bool,
    pub draining: bool,
}

/// The metadata service's membership state machine.
#[derive(Clone, Debug)]
pub struct Membership {
    config: MembershipConfig,
    table: ChainTable,
    health: BTreeMap<TargetId, TargetHealth>,
    now_ms: u64,
}

/// The changes one event makes, gathered so each chain is bumped once.
#[derive(Default)]
struct Changes {
    chains: BTreeSet<ChainId>,
    commands: Vec<Command>,
}

impl Membership {
    /// An engine over `table` at `now_ms`; every target counts as heard at `now_ms`, so a
    /// restarted metadata service gives servers a full `fence_after_ms` to report in.
    pub fn new(config: MembershipConfig, table: ChainTable, now_ms: u64) -> Result<Membership, ConfigError> {
        config.validate()?;
        let health = table.targets().map(|(t, _)| (t, TargetHealth::heard_at(now_ms))).collect();
        Ok(Membership { config, table, health, now_ms })
    }

    /// Remembers `target`'s last incarnation as persisted, so that after a restart of the
    /// metadata service a server that restarted meanwhile is still seen as restarted.
    pub fn remember_incarnation(&mut self, target: TargetId, incarnation: Incarnation) {
        if let Some(health) = self.health.get_mut(&target) {
            health.incarnation = Some(health.incarnation.map_or(incarnation, |known| known.max(incarnation)));
        }
    }

    /// Restores `target`'s marks as persisted (declared dead, draining), so a restarted
    /// metadata service neither forgets a drain nor re-admits a dead target.
    pub fn restore_marks(&mut self, target: TargetId, dead: bool, draining: bool) {
        if let Some(health) = self.health.get_mut(&target) {
            health.dead |= dead;
            health.draining |= draining;
        }
    }

    pub fn table(&self) -> &ChainTable {
        &self.table
    }

    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    pub fn health(&self, target: TargetId) -> Option<&TargetHealth> {
        self.health.get(&target)
    }

    /// Registers a new target in `group` with `chains_per_target` new chains that use it.
    pub fn add_target(
        &mut self,
        target: TargetId,
        group: FailureGroup,
        chains_per_target: usize,
        at_ms: u64,
    ) -> Result<Vec<Command>, PlacementError> {
        let added = self.table.add_target(target, group, chains_per_target)?;
        self.health.insert(target, TargetHealth::heard_at(at_ms.max(self.now_ms)));
        Ok(added.into_iter().filter_map(|id| self.table.chain(id)).map(changed).collect())
    }

    /// Applies one event; returns what to persist and announce, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Command> {
        let mut changes = Changes::default();
        match event {
            Event::Heartbeat { target, incarnation, at_ms } => {
                self.heartbeat(target, incarnation, at_ms, &mut changes)
            }
            Event::Tick { at_ms } => self.tick(at_ms, &mut changes),
            Event::SyncDone { chain, target, version } => {
                let current = self.table.chain(chain).map(Chain::version);
                if current == Some(version) {
                    self.sync_done(chain, target, &mut changes);
                }
            }
            Event::Drain { target } => self.drain(target, &mut changes),
            Event::Remove { target } => self.remove(target, &mut changes),
        }
        self.restore_replicas(&mut changes);
        self.finish(changes)
    }

    fn heartbeat(&mut self, target: TargetId, incarnation: Incarnation, at_ms: u64, changes: &mut Changes) {
        let Some(health) = self.health.get_mut(&target) else { return };
        if health.incarnation.is_some_and(|known| incarnation < known) {
            return;
        }
        let restarted = health.incarnation.is_some_and(|known| incarnation > known);
        health.incarnation = Some(incarnation);
        health.last_heard_ms = health.last_heard_ms.max(at_ms);
        health.down = false;
        self.now_ms = self.now_ms.max(at_ms);
        if restarted {
            self.leave(target, changes);
        } else if !health.dead && !health.draining {
            self.rejoin(target, changes);
        }
    }

    fn tick(&mut self, at_ms: u64, changes: &mut Changes) {
        self.now_ms = self.now_ms.max(at_ms);
        let silent_ms = |h: &TargetHealth| self.now_ms.saturating_sub(h.last_heard_ms);
        let fenced: Vec<TargetId> = self
            .health
            .iter()
            .filter(|(_, h)| !h.down && silent_ms(h) > self.config.fence_after_ms)
            .map(|(&t, _)| t)
            .collect();
        let dead: Vec<TargetId> = self
            .health
            .iter()
            .filter(|(_, h)| !h.dead && silent_ms(h) > self.config.dead_after_ms)
            .map(|(&t, _)| t)
            .collect();
        for target in fenced {
            self.health.get_mut(&target).expect("listed above").down = true;
            self.leave(target, changes);
        }
        for target in dead {
            self.declare_dead(target, changes);
        }
    }

    /// `target` left the write path (silent or restarted): `Offline` wherever another member
    /// serves; where it is the last serving member it stays, with a version bump.
    fn leave(&mut self, target: TargetId, changes: &mut Changes) {
        for id in self.table.chains_of(target) {
            let chain = self.table.chain_mut(id).expect("listed by chains_of");
            let next = chain.version().next();
            let state = chain.state_of(target).expect("listed by chains_of");
            let new_state = match state {
                MemberState::Serving if chain.serving_count() == 1 => None,
                MemberState::Serving => Some(MemberState::Offline { missed_since: next, full: false }),
                MemberState::Syncing { missed_since, full } => {
                    Some(MemberState::Offline { missed_since, full })
                }
                MemberState::Offline { .. } | MemberState::Dead => continue,
            };
            if let Some(new_state) = new_state {
                chain.set_state(target, new_state);
            }
            changes.chains.insert(id);
        }
    }

    /// `target` is back: where it is `Offline` and nobody syncs, it starts syncing.
    fn rejoin(&mut self, target: TargetId, changes: &mut Changes) {
        for id in self.table.chains_of(target) {
            let chain = self.table.chain_mut(id).expect("listed by chains_of");
            let Some(MemberState::Offline { missed_since, full }) = chain.state_of(target) else { continue };
            if chain.syncing().is_some() || chain.serving_count() == 0 {
                continue;
            }
            chain.set_state(target, MemberState::Syncing { missed_since, full });
            chain.move_to_tail(target);
            changes.chains.insert(id);
        }
    }

    fn sync_done(&mut self, id: ChainId, target: TargetId, changes: &mut Changes) {
        let Some(chain) = self.table.chain_mut(id) else { return };
        if !matches!(chain.state_of(target), Some(MemberState::Syncing { .. })) {
            return;
        }
        chain.set_state(target, MemberState::Serving);
        changes.chains.insert(id);
        self.finish_drains(id);
    }

    /// Draining members leave once the chain has its replicas without them.
    fn finish_drains(&mut self, id: ChainId) {
        let replicas = self.table.replicas();
        let draining: BTreeSet<TargetId> =
            self.health.iter().filter(|(_, h)| h.draining).map(|(&t, _)| t).collect();
        let Some(chain) = self.table.chain_mut(id) else { return };
        let staying_serving = chain.serving().filter(|t| !draining.contains(t)).count();
        let staying = chain
            .members()
            .iter()
            .filter(|m| !draining.contains(&m.target) && m.state != MemberState::Dead)
            .count();
        if staying_serving == 0 || staying < replicas {
            return;
        }
        let leaving: Vec<TargetId> =
            chain.members().iter().map(|m| m.target).filter(|t| draining.contains(t)).collect();
        for target in leaving {
            chain.remove(target);
        }
    }

    fn drain(&mut self, target: TargetId, changes: &mut Changes) {
        let Some(health) = self.health.get_mut(&target) else { return };
        health.draining = true;
        for id in self.table.chains_of(target) {
            self.finish_drains(id);
            changes.chains.insert(id);
        }
    }

    fn remove(&mut self, target: TargetId, changes: &mut Changes) {
        if !self.health.contains_key(&target) {
            return;
        }
        for id in self.table.chains_of(target) {
            let chain = self.table.chain(id).expect("listed by chains_of");
            if chain.state_of(target) == Some(MemberState::Serving) && chain.serving_count() == 1 {
                changes.commands.push(Command::RemoveDeferred { chain: id, target });
            }
        }
        self.declare_dead(target, changes);
        let health = self.health.get_mut(&target).expect("checked above");
        health.draining = true;
    }

    /// `Dead` in every chain where it is not the last serving member.
    fn declare_dead(&mut self, target: TargetId, changes: &mut Changes) {
        let Some(health) = self.health.get_mut(&target) else { return };
        health.dead = true;
        for id in self.table.chains_of(target) {
            let chain = self.table.chain_mut(id).expect("listed by chains_of");
            let state = chain.state_of(target).expect("listed by chains_of");
            let last_copy = state == MemberState::Serving && chain.serving_count() == 1;
            if !last_copy && chain.set_state(target, MemberState::Dead) {
                changes.chains.insert(id);
            }
        }
    }

    /// Every chain short of `replicas` live members, with nobody syncing, gets a replacement.
    fn restore_replicas(&mut self, changes: &mut Changes) {
        let unusable: BTreeSet<TargetId> =
            self.health.iter().filter(|(_, h)| h.down || h.dead || h.draining).map(|(&t, _)| t).collect();
        for id in self.table.chain_ids() {
            let chain = self.table.chain(id).expect("listed");
            let live = chain
                .members()
                .iter()
                .filter(|m| m.state != MemberState::Dead && !self.is_draining(m.target))
                .count();
            let full = chain.members().len() >= MEMBERS_PER_CHAIN_MAX
                && !chain.members().iter().any(|m| m.state == MemberState::Dead);
            if live >= self.table.replicas()
                || chain.syncing().is_some()
                || chain.serving_count() == 0
                || full
            {
                continue;
            }
            let Some(replacement) = self.table.replacement_for(id, &unusable) else { continue };
            let chain = self.table.chain_mut(id).expect("listed");
            let next = chain.version().next();
            let replaced: Vec<TargetId> =
                chain.members().iter().filter(|m| m.state == MemberState::Dead).map(|m| m.target).collect();
            for &dead in &replaced {
                chain.remove(dead);
            }
            chain.push(Member {
                target: replacement,
                state: MemberState::Syncing { missed_since: next, full: true },
            });
            changes.chains.insert(id);
            changes.commands.push(Command::Rebuild { chain: id, replaced, replacement });
        }
    }

    fn is_draining(&self, target: TargetId) -> bool {
        self.health.get(&target).is_some_and(|h| h.draining)
    }

    /// Bumps each changed chain once and announces it (and its resync, if one runs).
    fn finish(&mut self, changes: Changes) -> Vec<Command> {
        let mut commands = Vec::with_capacity(changes.chains.len() * 2 + changes.commands.len());
        for id in changes.chains {
            let chain = self.table.chain_mut(id).expect("changed chains exist");
            chain.bump();
            let chain = self.table.chain(id).expect("changed chains exist");
            commands.push(changed(chain));
            commands.extend(resync(chain));
        }
        commands.extend(changes.commands);
        assert!(self.table.check(), "membership broke the chain table's invariants");
        commands
    }
}

impl TargetHealth {
    fn heard_at(at_ms: u64) -> TargetHealth {
        TargetHealth { incarnation: None, last_heard_ms: at_ms, down: false, dead: false, draining: false }
    }
}

fn changed(chain: &Chain) -> Command {
    Command::ChainChanged { chain: chain.id(), version: chain.version(), members: chain.members().to_vec() }
}

/// The resync a chain with a syncing member runs at its current version: the last serving
/// member (the syncing member's predecessor) copies it what it needs.
fn resync(chain: &Chain) -> Option<Command> {
    let syncing = chain.syncing()?;
    let from = chain.predecessor(syncing.target)?;
    let scope = match syncing.state.missed_since() {
        Some(since) if !needs_full(syncing.state) => ResyncScope::MissedSince(since),
        _ => ResyncScope::Full,
    };
    Some(Command::StartResync {
        chain: chain.id(),
        version: chain.version(),
        from,
        to: syncing.target,
        scope,
    })
}
