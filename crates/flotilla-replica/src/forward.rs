//! The chain write path's ordering (the design's "writes go down the chain"), as plain state
//! machines the server drives and the tests check: no sockets, no store, no clock.
//!
//! - [`ChainHead`] gives each write and sync of a chain its position in the chain's one order
//!   (positions only grow, one per entry), keeps at most `forward_window_max` entries in
//!   flight (assigned, not yet acknowledged by the tail), and knows which client request is
//!   answered when: once the cumulative acknowledgement from down the chain covers its
//!   position, so every member has applied it.
//! - [`ChainMemberLog`] is what every member (the head too) keeps: it applies entries in
//!   order — the next position is applied, a duplicate is re-acknowledged, a gap is dropped
//!   and reported so the predecessor retransmits — keeps what it forwarded until its
//!   successor acknowledges it, and passes the cumulative acknowledgement up. Everything is
//!   bound to one chain version: an entry or acknowledgement of another version is refused.
//! - [`Unsettled`]: the ranges applied since the last *settled* sync (a sync whose
//!   acknowledgement came back from the tail), the set a resync copies. A sync settles every
//!   range applied before it.
//!
//! The caller does the I/O: [`ChainMemberLog::receive`] decides, the caller writes the bytes,
//! then [`ChainMemberLog::applied`] records it (a failed write records nothing: the entry is
//! retransmitted). On a chain version change ([`ChainMemberLog::change_version`]) a member that
//! is no longer `Serving` drops every entry it applied but nobody acknowledged and forgets the
//! syncs it had not seen settled: the next head may reuse those positions, so settling by them
//! would drop unsettled ranges of the new stream (the ranges stay unsettled and its resync
//! overwrites them).

use crate::ids::{ChainId, ChainVersion};
use crate::ranges::{ByteRange, RangeSet};
use std::collections::{BTreeMap, VecDeque};

/// Default bound on entries a head keeps in flight (`forward_window_max`).
pub const FORWARD_WINDOW_MAX: usize = 64;

/// One entry of a chain's order: a write of one fork's range (its bytes in `payload`), or a
/// sync (every member makes everything it applied before it durable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainEntry<K, P> {
    pub position: u64,
    pub kind: EntryKind<K, P>,
}

/// What an entry does. `K` names a fork (subfile and fork name), `P` carries the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind<K, P> {
    Write {
        fork: K,
        range: ByteRange,
        payload: P,
    },
    /// Makes everything applied before it durable.
    Sync,
    /// Makes only `fork`'s writes applied before it durable (a store syncs one fork at a
    /// time): it settles that fork's ranges, never another's.
    SyncFork {
        fork: K,
    },
}

/// Why a forward or an acknowledgement was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OrderRefusal {
    #[error("{chain} is at {mine} here; the message is for {theirs}")]
    OtherVersion { chain: ChainId, mine: ChainVersion, theirs: ChainVersion },
    #[error(
        "{chain} {version}: position {got} arrived before {expected}; dropped, retransmit from {expected}"
    )]
    Gap { chain: ChainId, version: ChainVersion, expected: u64, got: u64 },
}

/// Why a head cannot take a new entry now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadRefusal {
    #[error("{chain} {version}: {in_flight} entries in flight, at forward_window_max = {max}; retry once acknowledgements return")]
    WindowFull { chain: ChainId, version: ChainVersion, in_flight: usize, max: usize },
    #[error("{chain} is at {mine} at the head; the request is for {theirs}")]
    OtherVersion { chain: ChainId, mine: ChainVersion, theirs: ChainVersion },
}

/// What [`ChainMemberLog::receive`] decided about an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receive {
    /// The next position: apply it (then call [`ChainMemberLog::applied`]).
    Apply,
    /// Already applied: answer with this cumulative acknowledgement again.
    Duplicate { ack: u64 },
}

/// What to do after [`ChainMemberLog::applied`] or an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The cumulative acknowledgement to send up (every member from here to the tail has
    /// applied every position up to it).
    pub ack_up: u64,
    /// A sync position settled by this step, if any: ranges applied before it are settled.
    pub settled_sync: Option<u64>,
}

/// Ranges applied since the last settled sync, per fork, in order of position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsettled<K> {
    entries: Vec<(u64, K, ByteRange)>,
}

impl<K: Ord + Clone> Default for Unsettled<K> {
    fn default() -> Self {
        Unsettled { entries: Vec::new() }
    }
}

impl<K: Ord + Clone> Unsettled<K> {
    /// Records a write applied at `position`.
    pub fn record(&mut self, position: u64, fork: K, range: ByteRange) {
        self.entries.push((position, fork, range));
    }

    /// A sync at `sync_position` was settled: drops every range applied before it (of
    /// `fork` only, when the sync made only that fork durable).
    pub fn settle(&mut self, sync_position: u64, fork: Option<&K>) {
        self.entries.retain(|(p, k, _)| *p > sync_position || fork.is_some_and(|f| f != k));
    }

    /// The unsettled ranges of every fork, each bounded to `ranges_max` ranges (a superset
    /// when coarsened: a resync copies a few extra bytes, never misses one).
    pub fn ranges(&self, ranges_max: usize) -> BTreeMap<K, RangeSet> {
        let mut out: BTreeMap<K, RangeSet> = BTreeMap::new();
        for (_, fork, range) in &self.entries {
            out.entry(fork.clone()).or_insert_with(|| RangeSet::new(ranges_max)).insert(*range);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds another member's unsettled ranges (a resync copy carries the source's).
    pub fn extend(&mut self, other: &Unsettled<K>) {
        self.entries.extend(other.entries.iter().cloned());
    }
}

/// One member's view of its chain's order: what it applied, what it forwarded and its
/// successor has not acknowledged, the syncs not yet settled, its unsettled ranges.
#[derive(Clone, Debug)]
pub struct ChainMemberLog<K, P> {
    chain: ChainId,
    version: ChainVersion,
    has_successor: bool,
    applied: u64,
    /// Cumulative acknowledgement from the successor (meaningless without one).
    acked_down: u64,
    /// Entries applied and forwarded, not yet acknowledged by the successor.
    outbox: VecDeque<ChainEntry<K, P>>,
    /// Syncs applied and not yet settled, by position (`None`: of every fork).
    syncs: BTreeMap<u64, Option<K>>,
    unsettled: Unsettled<K>,
}

impl<K: Ord + Clone, P: Clone> ChainMemberLog<K, P> {
    /// A member of `chain` at `version` that has applied every position up to `applied`.
    pub fn new(chain: ChainId, version: ChainVersion, applied: u64, has_successor: bool) -> Self {
        ChainMemberLog {
            chain,
            version,
            has_successor,
            applied,
            acked_down: applied,
            outbox: VecDeque::new(),
            syncs: BTreeMap::new(),
            unsettled: Unsettled::default(),
        }
    }

    pub fn chain(&self) -> ChainId {
        self.chain
    }

    pub fn version(&self) -> ChainVersion {
        self.version
    }

    /// The last position applied here.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Whether this member forwards what it applies (and waits for acknowledgements).
    pub fn has_successor(&self) -> bool {
        self.has_successor
    }

    pub fn unsettled(&self) -> &Unsettled<K> {
        &self.unsettled
    }

    /// The cumulative acknowledgement this member sends up: at the tail what it applied,
    /// elsewhere what its successor acknowledged of it.
    pub fn ack_up(&self) -> u64 {
        match self.has_successor {
            true => self.acked_down.min(self.applied),
            false => self.applied,
        }
    }

    fn check_version(&self, theirs: ChainVersion) -> Result<(), OrderRefusal> {
        if theirs != self.version {
            return Err(OrderRefusal::OtherVersion { chain: self.chain, mine: self.version, theirs });
        }
        Ok(())
    }

    /// Decides about an entry forwarded under `version` at `position`, changing nothing.
    pub fn receive(&self, version: ChainVersion, position: u64) -> Result<Receive, OrderRefusal> {
        self.check_version(version)?;
        if position <= self.applied {
            return Ok(Receive::Duplicate { ack: self.ack_up() });
        }
        let expected = self.applied + 1;
        if position != expected {
            return Err(OrderRefusal::Gap { chain: self.chain, version, expected, got: position });
        }
        Ok(Receive::Apply)
    }

    /// Records that `entry` (the next position) was applied: it joins the outbox if there is
    /// a successor to forward it to; at the tail it is acknowledged at once.
    ///
    /// Panics if `entry` is not the next position: the caller applies only what
    /// [`receive`](Self::receive) (or the head) said to apply.
    pub fn applied_entry(&mut self, entry: ChainEntry<K, P>) -> Progress {
        assert_eq!(entry.position, self.applied + 1, "{} applied out of order", self.chain);
        self.applied = entry.position;
        match &entry.kind {
            EntryKind::Write { fork, range, .. } => {
                self.unsettled.record(entry.position, fork.clone(), *range)
            }
            EntryKind::Sync => {
                self.syncs.insert(entry.position, None);
            }
            EntryKind::SyncFork { fork } => {
                self.syncs.insert(entry.position, Some(fork.clone()));
            }
        }
        if self.has_successor {
            self.outbox.push_back(entry);
            return Progress { ack_up: self.ack_up(), settled_sync: None };
        }
        let position = self.applied;
        self.settle_to(position)
    }

    /// The successor acknowledged every position up to `acked` under `version` (counted only
    /// up to what this member applied: a successor ahead of it acknowledges no more).
    pub fn successor_acked(&mut self, version: ChainVersion, acked: u64) -> Result<Progress, OrderRefusal> {
        self.check_version(version)?;
        let acked = acked.min(self.applied);
        self.acked_down = self.acked_down.max(acked);
        while self.outbox.front().is_some_and(|e| e.position <= acked) {
            self.outbox.pop_front();
        }
        Ok(self.settle_to(self.ack_up()))
    }

    /// Everything up to `position` is applied from here to the tail: the latest sync at or
    /// before it settles the ranges applied before that sync.
    fn settle_to(&mut self, position: u64) -> Progress {
        let settled_sync = self.syncs.range(..=position).next_back().map(|(p, _)| *p);
        if let Some(sync) = settled_sync {
            let later = self.syncs.split_off(&(sync + 1));
            for (at, fork) in std::mem::replace(&mut self.syncs, later) {
                self.unsettled.settle(at, fork.as_ref());
            }
        }
        Progress { ack_up: position, settled_sync }
    }

    /// The entries to send (again) to the successor: at most `entries_max`, oldest first.
    pub fn retransmit(&self, entries_max: usize) -> impl Iterator<Item = &ChainEntry<K, P>> {
        self.outbox.iter().take(entries_max)
    }

    /// Entries forwarded and not yet acknowledged by the successor.
    pub fn in_flight(&self) -> usize {
        self.outbox.len()
    }

    /// The chain changed to `version`; `serving`: this member is `Serving` in it;
    /// `has_successor`: it has a successor in the new write path.
    ///
    /// A member that is not `Serving` drops what it applied but nobody acknowledged and the
    /// syncs it had not seen settled (positions the next head may reuse). A tail that
    /// stays serving acknowledges everything it applied.
    ///
    /// The same version again (a member that restarted learns the version it held) changes
    /// nothing but the roles.
    pub fn change_version(&mut self, version: ChainVersion, serving: bool, has_successor: bool) -> Progress {
        assert!(version >= self.version, "{} went back from {} to {version}", self.chain, self.version);
        self.version = version;
        self.has_successor = has_successor;
        if !serving {
            self.outbox.clear();
            self.syncs.clear();
            self.acked_down = self.applied;
            return Progress { ack_up: self.applied, settled_sync: None };
        }
        if !has_successor {
            self.outbox.clear();
            let applied = self.applied;
            return self.settle_to(applied);
        }
        // The outbox goes (again) to whoever is the successor now. What the old one
        // acknowledged, the new one has applied: acknowledgements are cumulative from the
        // tail, and a joiner starts from a copy at this member's position.
        Progress { ack_up: self.ack_up(), settled_sync: None }
    }

    /// After a restart from durable state: what was applied and unsettled stays, nothing is
    /// in flight and no sync is pending (they are retransmitted or resynced).
    pub fn restarted(&mut self) {
        self.outbox.clear();
        self.syncs.clear();
        self.acked_down = self.applied;
    }

    /// A resync copy brought this member to `position` (made durable by the caller before
    /// acknowledging), with the source's unsettled ranges.
    pub fn copied_to(&mut self, position: u64, source_unsettled: &Unsettled<K>) {
        self.applied = position;
        self.acked_down = position;
        self.outbox.clear();
        self.syncs.clear();
        self.unsettled.extend(source_unsettled);
    }
}

/// The head of a chain: positions, the in-flight window, and the client requests waiting
/// for the chain's acknowledgement. `C` identifies a client request. The head's own
/// [`ChainMemberLog`] (durable state, kept with the data) is passed in; the head role itself
/// is volatile: a member that stops being head drops it, and its waiting clients retry.
#[derive(Clone, Debug)]
pub struct ChainHead<C> {
    /// The last position given out.
    assigned: u64,
    window_max: usize,
    waiting: BTreeMap<u64, C>,
}

impl<C> ChainHead<C> {
    /// Becomes the head of `log`'s chain (positions continue from what it applied), keeping
    /// at most `forward_window_max` entries in flight.
    pub fn new<K: Ord + Clone, P: Clone>(log: &ChainMemberLog<K, P>, forward_window_max: usize) -> Self {
        ChainHead { assigned: log.applied(), window_max: forward_window_max.max(1), waiting: BTreeMap::new() }
    }

    /// Entries given a position and not yet acknowledged by the tail.
    pub fn in_flight<K: Ord + Clone, P: Clone>(&self, log: &ChainMemberLog<K, P>) -> usize {
        usize::try_from(self.assigned.saturating_sub(log.ack_up())).unwrap_or(usize::MAX)
    }

    /// Gives a client's write or sync under `version` the next position; the caller applies
    /// it in position order (`log.applied_entry`) and forwards it. `client` is answered once
    /// the chain acknowledges the position ([`answer`](Self::answer)).
    pub fn submit<K: Ord + Clone, P: Clone>(
        &mut self,
        log: &ChainMemberLog<K, P>,
        version: ChainVersion,
        kind: EntryKind<K, P>,
        client: C,
    ) -> Result<ChainEntry<K, P>, HeadRefusal> {
        let (chain, mine) = (log.chain(), log.version());
        if version != mine {
            return Err(HeadRefusal::OtherVersion { chain, mine, theirs: version });
        }
        let in_flight = self.in_flight(log);
        if in_flight >= self.window_max {
            return Err(HeadRefusal::WindowFull { chain, version, in_flight, max: self.window_max });
        }
        self.assigned += 1;
        self.waiting.insert(self.assigned, client);
        Ok(ChainEntry { position: self.assigned, kind })
    }

    /// Every member applied every position up to `acked` (a [`Progress::ack_up`] of the
    /// head's log): the client requests now answered, in position order.
    pub fn answer(&mut self, acked: u64) -> Vec<(u64, C)> {
        let later = self.waiting.split_off(&(acked.saturating_add(1)));
        std::mem::replace(&mut self.waiting, later).into_iter().collect()
    }

    /// The chain changed and this member is still its head (`log` already changed): the
    /// clients whose entries it never applied are dropped (they retry under the new
    /// version); the others stay waiting, answered once the new write path acknowledges.
    pub fn change_version<K: Ord + Clone, P: Clone>(&mut self, log: &ChainMemberLog<K, P>) -> Vec<C> {
        let never_applied = self.waiting.split_off(&(log.applied() + 1));
        self.assigned = log.applied();
        never_applied.into_values().collect()
    }
}
