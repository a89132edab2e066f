//! The chain table a server holds (issue 32): the chains of its targets as heartbeat
//! replies told them, kept **monotonic in each chain's version**.
//!
//! Why: everything the chain data path decides under a chain's lock (`follow`, `observe`,
//! `resync_pass`) reads the chain from here, and the locks serialize those reads; so if this
//! table never goes back, no holder of a chain's lock ever sees an older view of the chain
//! than an earlier holder saw. Replies normally come in order (one heartbeat loop), but a
//! metadata node that lost its leadership without knowing may still answer with an older
//! table; a chain it lists at a version older than the one held is ignored.
//!
//! Invariants:
//! - a chain held at version `v` is only ever replaced by the same chain at `v' >= v`;
//! - a chain missing from a reply is dropped (the service lists every chain the server is a
//!   member of: it was taken out), and its version kept as a floor: a later reply listing it
//!   again at an older version is ignored (one at the same version or newer is taken, so a
//!   reply that left it out by mistake costs one heartbeat, never the chain);
//! - bounded: at most [`CHAINS_MAX`] chains and as many floors (chain ids are below it).

use flotilla_proto::ChainInfo;
use flotilla_replica::CHAINS_MAX;
use std::collections::BTreeMap;

/// The chains held, by chain id, and the versions of those dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HeldTable {
    chains: BTreeMap<u32, ChainInfo>,
    /// The version each dropped chain was held at when a reply left it out.
    floors: BTreeMap<u32, u64>,
}

/// What taking one reply did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Taken {
    /// Chains the reply listed at an older version than held (or dropped at): kept as held.
    pub stale: usize,
    /// Chains dropped (held before, not in the reply).
    pub dropped: usize,
}

impl HeldTable {
    /// Takes the chains of one heartbeat reply (see the module's invariants).
    pub(crate) fn take(&mut self, incoming: Vec<ChainInfo>) -> Taken {
        let mut taken = Taken::default();
        let mut next = BTreeMap::new();
        for info in incoming.into_iter().take(CHAINS_MAX) {
            let newest =
                self.chains.get(&info.chain).map(|c| c.version).or(self.floors.get(&info.chain).copied());
            match newest {
                Some(version) if version > info.version => {
                    taken.stale += 1;
                    if let Some(held) = self.chains.get(&info.chain) {
                        next.insert(info.chain, held.clone());
                    }
                }
                _ => {
                    next.insert(info.chain, info);
                }
            }
        }
        for (chain, gone) in std::mem::take(&mut self.chains) {
            if !next.contains_key(&chain) {
                taken.dropped += 1;
                // Ids the service hands out are below CHAINS_MAX; none other gets a floor.
                if usize::try_from(chain).is_ok_and(|id| id < CHAINS_MAX) {
                    self.floors.insert(chain, gone.version);
                }
            }
        }
        self.floors.retain(|chain, _| !next.contains_key(chain));
        self.chains = next;
        debug_assert!(self.chains.len() <= CHAINS_MAX && self.floors.len() <= CHAINS_MAX);
        taken
    }

    /// The chain `chain` as held.
    pub(crate) fn chain(&self, chain: u32) -> Option<&ChainInfo> {
        self.chains.get(&chain)
    }

    /// Every chain held, by chain id.
    pub(crate) fn chains(&self) -> impl Iterator<Item = &ChainInfo> {
        self.chains.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::{ChainMember, ChainMemberState};
    use flotilla_types::TargetId;
    use proptest::prelude::*;

    fn info(chain: u32, version: u64) -> ChainInfo {
        let member = |t| ChainMember { target: TargetId(t), state: ChainMemberState::Serving };
        ChainInfo { chain, version, members: vec![member(version), member(100)] }
    }

    fn versions(table: &HeldTable) -> Vec<(u32, u64)> {
        table.chains().map(|c| (c.chain, c.version)).collect()
    }

    #[test]
    fn an_older_view_of_a_chain_never_replaces_a_newer_one() {
        let mut table = HeldTable::default();
        // Phase 1: chains 0 and 1 at v2 and v1.
        assert_eq!(table.take(vec![info(0, 2), info(1, 1)]), Taken::default());
        // Phase 2: a late reply has chain 0 at v1 and chain 1 at v3: 0 stays at v2.
        assert_eq!(table.take(vec![info(0, 1), info(1, 3)]), Taken { stale: 1, dropped: 0 });
        assert_eq!(versions(&table), vec![(0, 2), (1, 3)]);
        assert_eq!(table.chain(0), Some(&info(0, 2)), "the held members, not the late ones");
        // Phase 3: the same version again is taken (it is the same chain).
        assert_eq!(table.take(vec![info(0, 2), info(1, 3)]), Taken::default());
    }

    #[test]
    fn a_dropped_chain_comes_back_only_at_its_version_or_newer() {
        let mut table = HeldTable::default();
        table.take(vec![info(0, 4), info(1, 1)]);
        // Phase 1: the server is out of chain 0.
        assert_eq!(table.take(vec![info(1, 1)]), Taken { stale: 0, dropped: 1 });
        assert_eq!(table.chain(0), None);
        // Phase 2: a late reply lists it at v3: ignored.
        assert_eq!(table.take(vec![info(0, 3), info(1, 1)]), Taken { stale: 1, dropped: 0 });
        assert_eq!(table.chain(0), None);
        // Phase 3: listed at v4 again (a reply had left it out): taken, the floor goes.
        table.take(vec![info(0, 4), info(1, 1)]);
        assert_eq!(versions(&table), vec![(0, 4), (1, 1)]);
        assert!(table.floors.is_empty());
    }

    proptest! {
        /// For any replies in any order: each chain held is at the newest version any reply
        /// listed it at, or absent because the last reply left it out.
        #[test]
        fn the_table_is_monotonic_per_chain(
            replies in prop::collection::vec(prop::collection::btree_map(0u32..6, 1u64..8, 0..6), 1..40)
        ) {
            let mut table = HeldTable::default();
            let mut newest: BTreeMap<u32, u64> = BTreeMap::new();
            for reply in &replies {
                let before: BTreeMap<u32, u64> = versions(&table).into_iter().collect();
                table.take(reply.iter().map(|(&c, &v)| info(c, v)).collect());
                for (&chain, &version) in reply {
                    let top = newest.entry(chain).or_insert(version);
                    *top = (*top).max(version);
                }
                for (chain, version) in versions(&table) {
                    prop_assert!(reply.contains_key(&chain), "chain {} kept though the reply left it out", chain);
                    prop_assert!(version >= reply[&chain], "chain {} held older than the reply", chain);
                    prop_assert!(before.get(&chain).is_none_or(|&b| version >= b), "chain {} went back", chain);
                    prop_assert!(version <= newest[&chain]);
                    prop_assert_eq!(table.chain(chain), Some(&info(chain, version)));
                }
                for (&chain, &version) in reply {
                    // Left out of the table only at a version older than one seen.
                    if table.chain(chain).is_none() {
                        prop_assert!(version < newest[&chain]);
                    }
                }
            }
        }
    }
}
