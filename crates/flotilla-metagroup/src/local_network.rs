//! An in-process [`Transport`] for tests and simulations: every node's Raft handle in one
//! table, with injectable message loss, delay and partitions, driven by a seeded generator.
//!
//! Invariants: a message between two nodes on different sides of a cut, or to a node that is
//! down, never arrives; loss may drop a request before it arrives or its reply after it was
//! handled (as a real network does); delays are bounded by `delay_ms_max`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::network::{serve, RaftRpc, RaftRpcReply, Transport, TransportError};
use crate::types::{NodeId, Raft};

/// The faults in force.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Chance in a thousand that a request (and, separately, its reply) is lost.
    pub loss_per_mille: u32,
    /// Each message waits a random time up to this.
    pub delay_ms_max: u64,
}

struct Links {
    nodes: BTreeMap<NodeId, Raft>,
    /// Pairs (a, b), a < b, that cannot talk.
    cuts: BTreeSet<(NodeId, NodeId)>,
    faults: Faults,
    rng: StdRng,
}

/// The in-process network.
pub struct LocalNetwork {
    links: Mutex<Links>,
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl LocalNetwork {
    /// An empty network whose faults draw from `seed`.
    pub fn new(seed: u64) -> Self {
        LocalNetwork {
            links: Mutex::new(Links {
                nodes: BTreeMap::new(),
                cuts: BTreeSet::new(),
                faults: Faults::default(),
                rng: StdRng::seed_from_u64(seed),
            }),
        }
    }

    /// Makes `node` reachable through `raft`.
    pub fn attach(&self, node: NodeId, raft: Raft) {
        self.links.lock().nodes.insert(node, raft);
    }

    /// Makes `node` unreachable (it is down).
    pub fn detach(&self, node: NodeId) -> Option<Raft> {
        self.links.lock().nodes.remove(&node)
    }

    /// Cuts every link between `side` and the other nodes in `all`.
    pub fn partition(&self, side: &[NodeId], all: &[NodeId]) {
        let mut links = self.links.lock();
        for a in side {
            for b in all.iter().filter(|b| !side.contains(b)) {
                links.cuts.insert(pair(*a, *b));
            }
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.links.lock().cuts.clear();
    }

    /// Sets loss and delay.
    pub fn set_faults(&self, faults: Faults) {
        self.links.lock().faults = faults;
    }

    /// Draws (lost, delay) for one message.
    fn draw(&self) -> (bool, Duration) {
        let mut links = self.links.lock();
        let faults = links.faults.clone();
        let lost = faults.loss_per_mille > 0 && links.rng.random_range(0..1000) < faults.loss_per_mille;
        let delay_ms =
            if faults.delay_ms_max == 0 { 0 } else { links.rng.random_range(0..=faults.delay_ms_max) };
        (lost, Duration::from_millis(delay_ms))
    }

    fn route(&self, from: NodeId, target: NodeId) -> Option<Raft> {
        let links = self.links.lock();
        if links.cuts.contains(&pair(from, target)) || !links.nodes.contains_key(&from) {
            return None;
        }
        links.nodes.get(&target).cloned()
    }
}

impl Transport for LocalNetwork {
    async fn call(
        &self,
        from: NodeId,
        target: NodeId,
        address: &str,
        rpc: RaftRpc,
    ) -> Result<RaftRpcReply, TransportError> {
        let unreachable = |reason: &str| TransportError::Unreachable {
            target,
            address: address.to_string(),
            reason: reason.to_string(),
        };
        let (lost, delay) = self.draw();
        tokio::time::sleep(delay).await;
        if lost {
            return Err(unreachable("request lost"));
        }
        let raft = self.route(from, target).ok_or_else(|| unreachable("down or cut off"))?;
        let reply = serve(&raft, rpc).await;
        let (lost, delay) = self.draw();
        tokio::time::sleep(delay).await;
        if lost || self.route(target, from).is_none() {
            return Err(unreachable("reply lost"));
        }
        Ok(reply)
    }
}
