//! Building chains from targets and choosing chains for a new file.
//!
//! Invariants kept here:
//! - every chain built has `replicas` distinct targets in `replicas` distinct failure groups;
//! - targets are loaded evenly: each new member is the least loaded target of a group not yet
//!   in the chain, ties broken by how often it already shares chains with the members picked
//!   so far (so a dead target's chains have many different survivors to rebuild from) and then
//!   by a rotation, so the result is deterministic;
//! - the chains chosen for one file have pairwise disjoint members (no target holds two
//!   subfiles of a file), healthy chains first, then the least loaded.
//!
//! Fewer failure groups than replicas is an error that says both numbers.

use crate::chain::{Chain, MEMBERS_PER_CHAIN_MAX};
use crate::error::PlacementError;
use crate::ids::{ChainId, FailureGroup};
use flotilla_types::TargetId;
use std::collections::{BTreeMap, BTreeSet};

/// Most chains one table may hold.
pub const CHAINS_MAX: usize = 1 << 16;

/// Most replicas a chain may have: one slot of [`MEMBERS_PER_CHAIN_MAX`] stays free for a
/// replacement that syncs while the member it replaces still serves (a drain).
pub const REPLICAS_MAX: usize = MEMBERS_PER_CHAIN_MAX - 1;

/// Most chains one target may be built into at once (`chains_per_target`).
pub const CHAINS_PER_TARGET_MAX: usize = 64;

/// Chains of `replicas` members in distinct groups, each target in about `chains_per_target`
/// chains (`ceil(targets × chains_per_target / replicas)` chains in all).
pub fn build_chains(
    groups: &BTreeMap<TargetId, FailureGroup>,
    replicas: usize,
    chains_per_target: usize,
) -> Result<Vec<Vec<TargetId>>, PlacementError> {
    check_counts(groups, replicas, chains_per_target)?;
    let wanted = (groups.len() * chains_per_target).div_ceil(replicas);
    if wanted > CHAINS_MAX {
        return Err(PlacementError::TooManyChains { wanted, max: CHAINS_MAX });
    }
    let mut load = Load::new(groups.keys().copied());
    let mut chains = Vec::with_capacity(wanted);
    for index in 0..wanted {
        let chain = pick_members(groups, &load, Vec::new(), replicas, index);
        load.add(&chain);
        chains.push(chain);
    }
    Ok(chains)
}

/// Chains that add `target` (already in `groups`) to the table: `chains_per_target` chains
/// headed by it, the other members picked as in [`build_chains`] against `load_by_target`.
pub(crate) fn chains_with(
    groups: &BTreeMap<TargetId, FailureGroup>,
    load_by_target: &BTreeMap<TargetId, usize>,
    target: TargetId,
    replicas: usize,
    chains_per_target: usize,
) -> Result<Vec<Vec<TargetId>>, PlacementError> {
    check_counts(groups, replicas, chains_per_target)?;
    let mut load = Load::new(groups.keys().copied());
    load.by_target.extend(load_by_target.iter().map(|(&t, &n)| (t, n)));
    let mut chains = Vec::with_capacity(chains_per_target);
    for index in 0..chains_per_target {
        let chain = pick_members(groups, &load, vec![target], replicas, index);
        load.add(&chain);
        chains.push(chain);
    }
    Ok(chains)
}

fn check_counts(
    groups: &BTreeMap<TargetId, FailureGroup>,
    replicas: usize,
    chains_per_target: usize,
) -> Result<(), PlacementError> {
    if replicas == 0 || replicas > REPLICAS_MAX {
        return Err(PlacementError::ReplicasOutOfRange { replicas, max: REPLICAS_MAX });
    }
    if chains_per_target == 0 || chains_per_target > CHAINS_PER_TARGET_MAX {
        return Err(PlacementError::ChainsPerTargetOutOfRange {
            chains: chains_per_target,
            max: CHAINS_PER_TARGET_MAX,
        });
    }
    let have = groups.values().collect::<BTreeSet<_>>().len();
    if have < replicas {
        return Err(PlacementError::NotEnoughFailureGroups { wanted: replicas, have });
    }
    Ok(())
}

/// How many chains each target is in, and how often each pair shares one.
struct Load {
    by_target: BTreeMap<TargetId, usize>,
    by_pair: BTreeMap<(TargetId, TargetId), usize>,
}

impl Load {
    fn new(targets: impl Iterator<Item = TargetId>) -> Load {
        Load { by_target: targets.map(|t| (t, 0)).collect(), by_pair: BTreeMap::new() }
    }

    fn add(&mut self, chain: &[TargetId]) {
        for (i, &a) in chain.iter().enumerate() {
            *self.by_target.entry(a).or_default() += 1;
            for &b in &chain[i + 1..] {
                *self.by_pair.entry(pair(a, b)).or_default() += 1;
            }
        }
    }

    fn shared(&self, candidate: TargetId, picked: &[TargetId]) -> usize {
        picked.iter().map(|&p| self.by_pair.get(&pair(candidate, p)).copied().unwrap_or(0)).sum()
    }
}

fn pair(a: TargetId, b: TargetId) -> (TargetId, TargetId) {
    (a.min(b), a.max(b))
}

/// Completes `picked` to `replicas` members; the caller checked there are enough groups.
fn pick_members(
    groups: &BTreeMap<TargetId, FailureGroup>,
    load: &Load,
    mut picked: Vec<TargetId>,
    replicas: usize,
    rotation: usize,
) -> Vec<TargetId> {
    let order: Vec<TargetId> = groups.keys().copied().collect();
    while picked.len() < replicas {
        let used: BTreeSet<&FailureGroup> = picked.iter().filter_map(|t| groups.get(t)).collect();
        let best = order
            .iter()
            .enumerate()
            .filter(|(_, t)| !picked.contains(t) && groups.get(t).is_some_and(|g| !used.contains(g)))
            .min_by_key(|(i, &t)| {
                let rotated = (i + order.len() - rotation % order.len()) % order.len();
                (load.by_target.get(&t).copied().unwrap_or(0), load.shared(t, &picked), rotated)
            })
            .map(|(_, &t)| t)
            .expect("the caller checked there are enough failure groups");
        picked.push(best);
    }
    picked
}

/// How many starting chains `choose_chains` tries before it gives up (each try is one
/// greedy pass over the candidates).
pub const CHOOSE_STARTS_MAX: usize = 64;

/// `count` chains with pairwise disjoint members for a new file: chains with the most
/// serving members first, then the least `load` (files or bytes already placed), then by id.
/// A greedy pass in that order can paint itself into a corner (a table grown target by
/// target need not hold a disjoint partner for every chain), so when it falls short the
/// pass starts again from the next candidate, at most `CHOOSE_STARTS_MAX` times.
pub fn choose_chains<'a>(
    chains: impl Iterator<Item = &'a Chain>,
    count: usize,
    load: impl Fn(ChainId) -> u64,
) -> Result<Vec<ChainId>, PlacementError> {
    let mut candidates: Vec<&Chain> = chains.filter(|c| c.serving_count() > 0).collect();
    candidates.sort_by_key(|c| (std::cmp::Reverse(c.serving_count()), load(c.id()), c.id()));
    let mut best: Vec<ChainId> = Vec::new();
    for start in 0..candidates.len().clamp(1, CHOOSE_STARTS_MAX) {
        let order = candidates[start..].iter().chain(&candidates[..start]);
        let chosen = greedy_disjoint(order, count);
        if chosen.len() == count {
            return Ok(chosen);
        }
        if chosen.len() > best.len() {
            best = chosen;
        }
    }
    Err(PlacementError::NotEnoughDisjointChains { wanted: count, found: best.len() })
}

/// Takes chains in `order` that share no member with those taken, up to `count`.
fn greedy_disjoint<'a>(order: impl Iterator<Item = &'a &'a Chain>, count: usize) -> Vec<ChainId> {
    let mut used: BTreeSet<TargetId> = BTreeSet::new();
    let mut chosen = Vec::new();
    for chain in order {
        if chosen.len() == count {
            break;
        }
        if chain.members().iter().any(|m| used.contains(&m.target)) {
            continue;
        }
        used.extend(chain.members().iter().map(|m| m.target));
        chosen.push(chain.id());
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_greedy_dead_end_is_left_for_another_start() {
        let chain = |id: u32, a: u64, b: u64| Chain::new(ChainId(id), &[TargetId(a), TargetId(b)]);
        let chains = [chain(0, 0, 1), chain(1, 1, 2), chain(2, 2, 3)];
        // The least loaded chain {1,2} first: no chain is disjoint from it.
        let load = |id: ChainId| if id.0 == 1 { 0 } else { 5 };
        let chosen = choose_chains(chains.iter(), 2, load).unwrap();
        assert_eq!(chosen, vec![ChainId(0), ChainId(2)]);
        let refused = choose_chains(chains.iter(), 3, load).unwrap_err();
        assert_eq!(refused, PlacementError::NotEnoughDisjointChains { wanted: 3, found: 2 });
    }
}
