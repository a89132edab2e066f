//! The chain table the metadata service keeps: every chain, and every target's failure group.
//!
//! Invariants kept here (checked by [`ChainTable::check`]):
//! - every chain is valid ([`Chain::check`]) and lists only known targets;
//! - no chain lists two targets of one failure group, whatever their states;
//! - chain ids are dense from 0 and never reused.
//!
//! Only [`Membership`](crate::Membership) changes chains after they are built.

use crate::chain::Chain;
use crate::error::PlacementError;
use crate::ids::{ChainId, FailureGroup};
use crate::member::{Member, MemberState};
pub use crate::placement::CHAINS_MAX;
use crate::placement::{build_chains, chains_with, choose_chains};
use flotilla_types::TargetId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Every chain and every target's failure group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTable {
    replicas: usize,
    chains: BTreeMap<ChainId, Chain>,
    groups: BTreeMap<TargetId, FailureGroup>,
}

impl ChainTable {
    /// A table of chains of `replicas` members over `groups` (see [`build_chains`]).
    pub fn build(
        groups: BTreeMap<TargetId, FailureGroup>,
        replicas: usize,
        chains_per_target: usize,
    ) -> Result<ChainTable, PlacementError> {
        let built = build_chains(&groups, replicas, chains_per_target)?;
        let chains = built
            .iter()
            .enumerate()
            .map(|(i, targets)| {
                let id = ChainId(u32::try_from(i).expect("chains_max fits in u32"));
                (id, Chain::new(id, targets))
            })
            .collect();
        let table = ChainTable { replicas, chains, groups };
        assert!(table.check(), "built chain table breaks its invariants");
        Ok(table)
    }

    /// A table as persisted (`chains` in id order, every target's group), checked against
    /// the invariants of this module; `None` if they do not hold.
    pub fn from_parts(
        replicas: usize,
        chains: Vec<Chain>,
        groups: BTreeMap<TargetId, FailureGroup>,
    ) -> Option<ChainTable> {
        if replicas == 0 || replicas > crate::placement::REPLICAS_MAX || chains.len() > CHAINS_MAX {
            return None;
        }
        let chains = chains.into_iter().map(|c| (c.id(), c)).collect();
        let table = ChainTable { replicas, chains, groups };
        table.check().then_some(table)
    }

    pub fn replicas(&self) -> usize {
        self.replicas
    }

    pub fn chain(&self, id: ChainId) -> Option<&Chain> {
        self.chains.get(&id)
    }

    pub fn chains(&self) -> impl Iterator<Item = &Chain> {
        self.chains.values()
    }

    pub fn group_of(&self, target: TargetId) -> Option<&FailureGroup> {
        self.groups.get(&target)
    }

    pub fn targets(&self) -> impl Iterator<Item = (TargetId, &FailureGroup)> {
        self.groups.iter().map(|(&t, g)| (t, g))
    }

    /// Chains that list `target`, in any state.
    pub fn chains_of(&self, target: TargetId) -> Vec<ChainId> {
        self.chains.values().filter(|c| c.state_of(target).is_some()).map(|c| c.id()).collect()
    }

    /// How many chains list each target.
    pub fn load_by_target(&self) -> BTreeMap<TargetId, usize> {
        let mut load: BTreeMap<TargetId, usize> = self.groups.keys().map(|&t| (t, 0)).collect();
        for member in self.chains.values().flat_map(|c| c.members()) {
            *load.entry(member.target).or_default() += 1;
        }
        load
    }

    /// Adds `target` in `group` and `chains_per_target` new chains that use it.
    pub fn add_target(
        &mut self,
        target: TargetId,
        group: FailureGroup,
        chains_per_target: usize,
    ) -> Result<Vec<ChainId>, PlacementError> {
        if self.groups.contains_key(&target) {
            return Err(PlacementError::TargetExists { target });
        }
        let wanted = self.chains.len() + chains_per_target;
        if wanted > CHAINS_MAX {
            return Err(PlacementError::TooManyChains { wanted, max: CHAINS_MAX });
        }
        let mut groups = self.groups.clone();
        groups.insert(target, group);
        let built = chains_with(&groups, &self.load_by_target(), target, self.replicas, chains_per_target)?;
        self.groups = groups;
        let mut added = Vec::with_capacity(built.len());
        for targets in built {
            let id = ChainId(u32::try_from(self.chains.len()).expect("chains_max fits in u32"));
            self.chains.insert(id, Chain::new(id, &targets));
            added.push(id);
        }
        assert!(self.check(), "adding {target} broke the chain table's invariants");
        Ok(added)
    }

    /// `count` chains with disjoint members for a new file of `count` subfiles.
    pub fn choose_for_file(
        &self,
        count: usize,
        load: impl Fn(ChainId) -> u64,
    ) -> Result<Vec<ChainId>, PlacementError> {
        let have = self.groups.values().collect::<BTreeSet<_>>().len();
        if have < self.replicas {
            return Err(PlacementError::NotEnoughFailureGroups { wanted: self.replicas, have });
        }
        choose_chains(self.chains.values(), count, load)
    }

    /// A target to add to `chain`: not `unusable`, not listed in the chain, in a failure
    /// group no live (non-`Dead`) member has, least loaded first. The caller removes the
    /// chain's `Dead` members when it adds the replacement.
    pub(crate) fn replacement_for(&self, chain: ChainId, unusable: &BTreeSet<TargetId>) -> Option<TargetId> {
        let chain = self.chains.get(&chain)?;
        let taken: BTreeSet<&FailureGroup> = chain
            .members()
            .iter()
            .filter(|m| m.state != MemberState::Dead)
            .filter_map(|m| self.groups.get(&m.target))
            .collect();
        let load = self.load_by_target();
        self.groups
            .iter()
            .filter(|(t, g)| chain.state_of(**t).is_none() && !unusable.contains(t) && !taken.contains(g))
            .min_by_key(|(t, _)| (load.get(t).copied().unwrap_or(0), **t))
            .map(|(&t, _)| t)
    }

    pub(crate) fn chain_mut(&mut self, id: ChainId) -> Option<&mut Chain> {
        self.chains.get_mut(&id)
    }

    pub(crate) fn chain_ids(&self) -> Vec<ChainId> {
        self.chains.keys().copied().collect()
    }

    /// Whether the invariants of this module hold.
    pub fn check(&self) -> bool {
        self.chains.iter().enumerate().all(|(i, (id, chain))| {
            id.0 as usize == i && chain.id() == *id && chain.check() && self.groups_distinct(chain.members())
        })
    }

    fn groups_distinct(&self, members: &[Member]) -> bool {
        let groups: Option<BTreeSet<&FailureGroup>> =
            members.iter().map(|m| self.groups.get(&m.target)).collect();
        groups.is_some_and(|g| g.len() == members.len())
    }
}

/// Whether `state` still needs a full copy when it syncs.
pub(crate) fn needs_full(state: MemberState) -> bool {
    matches!(state, MemberState::Syncing { full: true, .. } | MemberState::Offline { full: true, .. })
}
