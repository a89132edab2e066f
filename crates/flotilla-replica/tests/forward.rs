//! Property tests of the chain write path's ordering (`ChainHead`, `ChainMemberLog`,
//! `Unsettled`): a head and two members exchange forwards and cumulative acknowledgements
//! over a network that loses, duplicates and reorders any message; after retransmission
//! every member has applied exactly the head's order, no position twice, and a client is
//! answered only once every member applied its entry — also when the middle member leaves
//! at a random point (version 2: the head retransmits to the last member, messages of
//! version 1 are refused, the clients the head was holding are dropped to retry).

use flotilla_replica::{
    ByteRange, ChainEntry, ChainHead, ChainId, ChainMemberLog, ChainVersion, EntryKind, HeadRefusal,
    MissedRecord, OrderRefusal, RangeSet, Receive,
};
use flotilla_types::TargetId;
use proptest::prelude::*;
use std::collections::BTreeMap;

type Entry = ChainEntry<u8, u64>;
const V1: ChainVersion = ChainVersion(1);
const CHAIN: ChainId = ChainId(7);
const RETRANSMIT_MAX: usize = 8;

#[derive(Clone, Debug)]
enum Msg {
    /// To member `to` (1 or 2).
    Forward { to: usize, version: ChainVersion, entry: Entry },
    /// To node `to` (0 head, 1 first member).
    Ack { to: usize, version: ChainVersion, acked: u64 },
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Submit { sync: bool, lo: u8, len: u8 },
    Deliver(usize),
    Drop(usize),
    Duplicate(usize),
    Retransmit(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), 0u8..32, 1u8..8).prop_map(|(s, lo, len)| Op::Submit { sync: s && lo % 4 == 0, lo, len }),
        6 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Duplicate),
        2 => (0usize..2).prop_map(Op::Retransmit),
    ]
}

/// A head (node 0) and two members (nodes 1, 2) of one chain; the middle member may leave
/// (the chain goes to version 2: head, then node 2).
struct Net {
    head: ChainHead<u64>,
    head_log: ChainMemberLog<u8, u64>,
    members: [ChainMemberLog<u8, u64>; 2],
    version: ChainVersion,
    middle_gone: bool,
    /// Positions each node applied, in the order it applied them, with the entry's tag.
    applied: [Vec<(u64, u64)>; 3],
    /// The head's order: position → tag.
    order: BTreeMap<u64, u64>,
    answered: Vec<u64>,
    /// Clients the head dropped at the version change (they retry under the new version).
    dropped: Vec<u64>,
    /// Each client request's position.
    clients: BTreeMap<u64, u64>,
    flight: Vec<Msg>,
    next_tag: u64,
    writes: Vec<(u64, ByteRange)>,
}

impl Net {
    fn new(window_max: usize) -> Net {
        Net {
            head: ChainHead::new(&ChainMemberLog::<u8, u64>::new(CHAIN, V1, 0, true), window_max),
            head_log: ChainMemberLog::new(CHAIN, V1, 0, true),
            members: [ChainMemberLog::new(CHAIN, V1, 0, true), ChainMemberLog::new(CHAIN, V1, 0, false)],
            version: V1,
            middle_gone: false,
            applied: [Vec::new(), Vec::new(), Vec::new()],
            order: BTreeMap::new(),
            answered: Vec::new(),
            dropped: Vec::new(),
            clients: BTreeMap::new(),
            flight: Vec::new(),
            next_tag: 1,
            writes: Vec::new(),
        }
    }

    fn successor(&self, node: usize) -> usize {
        if node == 0 && !self.middle_gone {
            1
        } else {
            2
        }
    }

    fn predecessor(&self, node: usize) -> usize {
        if node == 2 && !self.middle_gone {
            1
        } else {
            0
        }
    }

    fn tag_of(entry: &Entry) -> u64 {
        match &entry.kind {
            EntryKind::Write { payload, .. } => *payload,
            EntryKind::Sync | EntryKind::SyncFork { .. } => 0,
        }
    }

    fn answer(&mut self, answered: Vec<(u64, u64)>) {
        for (position, client) in answered {
            assert_eq!(self.clients.get(&client), Some(&position), "answered the wrong request");
            for (m, member) in self.members.iter().enumerate() {
                if m == 0 && self.middle_gone {
                    continue;
                }
                assert!(
                    member.applied() >= position,
                    "answered {position} before member {} applied it",
                    m + 1
                );
            }
            self.answered.push(position);
        }
    }

    fn submit(&mut self, sync: bool, lo: u8, len: u8) {
        let tag = self.next_tag;
        let range = ByteRange::new(u64::from(lo), u64::from(len)).unwrap().unwrap();
        let kind = match sync {
            true => EntryKind::Sync,
            false => EntryKind::Write { fork: 0, range, payload: tag },
        };
        let entry = match self.head.submit(&self.head_log, self.version, kind, tag) {
            Ok(entry) => entry,
            Err(HeadRefusal::WindowFull { in_flight, max, .. }) => {
                assert!(in_flight >= max);
                return;
            }
            Err(other) => panic!("{other}"),
        };
        self.next_tag += 1;
        self.clients.insert(tag, entry.position);
        let tag = Self::tag_of(&entry);
        self.order.insert(entry.position, tag);
        if !sync {
            self.writes.push((entry.position, range));
        }
        self.applied[0].push((entry.position, tag));
        let (to, version) = (self.successor(0), self.version);
        self.flight.push(Msg::Forward { to, version, entry: entry.clone() });
        let progress = self.head_log.applied_entry(entry);
        let answered = self.head.answer(progress.ack_up);
        self.answer(answered);
    }

    fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::Forward { to: 1, .. } | Msg::Ack { to: 1, .. } if self.middle_gone => {}
            Msg::Forward { to, version, entry } => self.forward_in(to, version, entry),
            Msg::Ack { to: 0, version, acked } => match self.head_log.successor_acked(version, acked) {
                Ok(progress) => {
                    let answered = self.head.answer(progress.ack_up);
                    self.answer(answered);
                }
                Err(refused) => {
                    assert!(version != self.version, "{refused}");
                    assert!(matches!(refused, OrderRefusal::OtherVersion { .. }));
                }
            },
            Msg::Ack { to, version, acked } => match self.members[to - 1].successor_acked(version, acked) {
                Ok(progress) => {
                    let up = self.predecessor(to);
                    self.flight.push(Msg::Ack { to: up, version, acked: progress.ack_up });
                }
                Err(refused) => assert!(version != self.version, "{refused}"),
            },
        }
    }

    fn forward_in(&mut self, to: usize, version: ChainVersion, entry: Entry) {
        let log = &mut self.members[to - 1];
        match log.receive(version, entry.position) {
            Ok(Receive::Apply) => {
                self.applied[to].push((entry.position, Self::tag_of(&entry)));
                if to == 1 {
                    self.flight.push(Msg::Forward { to: 2, version, entry: entry.clone() });
                }
                let progress = self.members[to - 1].applied_entry(entry);
                if to == 2 {
                    let up = self.predecessor(2);
                    self.flight.push(Msg::Ack { to: up, version, acked: progress.ack_up });
                }
            }
            Ok(Receive::Duplicate { ack }) => {
                let up = self.predecessor(to);
                self.flight.push(Msg::Ack { to: up, version, acked: ack });
            }
            Err(OrderRefusal::Gap { expected, got, .. }) => {
                assert!(got > expected && expected == log.applied() + 1);
            }
            Err(OrderRefusal::OtherVersion { mine, theirs, .. }) => {
                assert!(mine == self.version && theirs != mine, "refused its own version");
            }
            Err(other) => panic!("{other}"),
        }
    }

    fn retransmit(&mut self, node: usize) {
        if node == 1 && self.middle_gone {
            return;
        }
        let entries: Vec<Entry> = match node {
            0 => self.head_log.retransmit(RETRANSMIT_MAX).cloned().collect(),
            _ => self.members[0].retransmit(RETRANSMIT_MAX).cloned().collect(),
        };
        let (to, version) = (self.successor(node), self.version);
        for entry in entries {
            self.flight.push(Msg::Forward { to, version, entry });
        }
    }

    fn dropped_positions(&self) -> Vec<u64> {
        self.dropped.iter().map(|c| self.clients[c]).collect()
    }

    /// The middle member leaves: version 2, the head forwards to the last member.
    fn remove_middle(&mut self) {
        if self.middle_gone {
            return;
        }
        self.version = ChainVersion(2);
        self.middle_gone = true;
        let progress = self.head_log.change_version(self.version, true, true);
        let dropped = self.head.change_version(&self.head_log);
        let answered = self.head.answer(progress.ack_up);
        self.answer(answered);
        self.dropped.extend(dropped);
        let progress = self.members[1].change_version(self.version, true, false);
        self.flight.push(Msg::Ack { to: 0, version: self.version, acked: progress.ack_up });
    }

    fn step(&mut self, op: Op) {
        let pick = |n: usize, len: usize| n % len;
        match op {
            Op::Submit { sync, lo, len } => self.submit(sync, lo, len),
            Op::Retransmit(node) => self.retransmit(node),
            _ if self.flight.is_empty() => {}
            Op::Deliver(n) => {
                let msg = self.flight.swap_remove(pick(n, self.flight.len()));
                self.deliver(msg);
            }
            Op::Drop(n) => {
                self.flight.swap_remove(pick(n, self.flight.len()));
            }
            Op::Duplicate(n) => {
                let msg = self.flight[pick(n, self.flight.len())].clone();
                self.flight.push(msg);
            }
        }
    }

    /// No more loss: deliver everything, retransmitting until the chain is quiet.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            while let Some(msg) = self.flight.pop() {
                self.deliver(msg);
            }
            if self.head.in_flight(&self.head_log) == 0 {
                return;
            }
            self.retransmit(0);
            self.retransmit(1);
        }
        panic!("the chain never quiesced: {} in flight", self.head.in_flight(&self.head_log));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lossy_forwarding_ends_with_every_member_applying_the_heads_order(
        ops in prop::collection::vec(op(), 1..300),
        window_max in 1usize..12,
        middle_leaves_at in prop::option::of(0usize..300),
    ) {
        let mut net = Net::new(window_max);
        for (index, op) in ops.into_iter().enumerate() {
            if middle_leaves_at == Some(index) {
                net.remove_middle();
            }
            net.step(op);
            prop_assert!(net.head.in_flight(&net.head_log) <= window_max);
        }
        net.settle();
        let expected: Vec<(u64, u64)> = net.order.iter().map(|(&p, &t)| (p, t)).collect();
        for (node, applied) in net.applied.iter().enumerate() {
            if node == 1 && net.middle_gone {
                prop_assert!(expected.starts_with(applied), "the departed member applied another order");
                continue;
            }
            prop_assert_eq!(applied, &expected, "node {} applied another order", node);
        }
        let mut answered = net.answered.clone();
        answered.sort_unstable();
        answered.dedup();
        prop_assert_eq!(answered.len(), net.answered.len(), "a client was answered twice");
        let mut done = answered.clone();
        done.extend(&net.dropped_positions());
        done.sort_unstable();
        prop_assert_eq!(done, net.order.keys().copied().collect::<Vec<_>>(), "a client went unanswered (or was answered and dropped)");
        // Every member settled by the last sync: what is left unsettled is exactly the
        // writes after it.
        let last_sync = net.order.iter().filter(|(_, &t)| t == 0).map(|(&p, _)| p).next_back().unwrap_or(0);
        let mut left = RangeSet::new(usize::MAX);
        for &(p, range) in &net.writes {
            if p > last_sync {
                left.insert(range);
            }
        }
        let mut logs = vec![&net.head_log, &net.members[1]];
        if !net.middle_gone {
            logs.push(&net.members[0]);
        }
        for log in logs {
            let ranges = log.unsettled().ranges(usize::MAX);
            prop_assert_eq!(ranges.get(&0).cloned().unwrap_or(RangeSet::new(usize::MAX)), left.clone());
        }
    }
}

fn write(position: u64, tag: u64) -> Entry {
    let range = ByteRange::new(position * 10, 5).unwrap().unwrap();
    ChainEntry { position, kind: EntryKind::Write { fork: 0, range, payload: tag } }
}

#[test]
fn an_entry_of_another_version_is_refused_and_a_gap_named() {
    let log: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, ChainVersion(3), 4, false);
    assert_eq!(
        log.receive(ChainVersion(2), 5),
        Err(OrderRefusal::OtherVersion { chain: CHAIN, mine: ChainVersion(3), theirs: ChainVersion(2) })
    );
    assert_eq!(
        log.receive(ChainVersion(4), 5),
        Err(OrderRefusal::OtherVersion { chain: CHAIN, mine: ChainVersion(3), theirs: ChainVersion(4) })
    );
    assert_eq!(log.receive(ChainVersion(3), 5), Ok(Receive::Apply));
    assert_eq!(log.receive(ChainVersion(3), 4), Ok(Receive::Duplicate { ack: 4 }));
    let gap = log.receive(ChainVersion(3), 7).unwrap_err();
    assert_eq!(gap, OrderRefusal::Gap { chain: CHAIN, version: ChainVersion(3), expected: 5, got: 7 });
    assert!(gap.to_string().contains("chain 7") && gap.to_string().contains("v3"), "{gap}");
}

#[test]
fn a_member_leaving_the_path_drops_unacknowledged_entries_and_unsettled_syncs() {
    let mut log: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, V1, 0, true);
    log.applied_entry(write(1, 11));
    log.applied_entry(ChainEntry { position: 2, kind: EntryKind::Sync });
    log.applied_entry(write(3, 13));
    assert_eq!(log.in_flight(), 3);
    let progress = log.change_version(ChainVersion(2), false, false);
    assert_eq!(log.in_flight(), 0, "nothing it applied unacknowledged is forwarded again");
    assert_eq!(progress.settled_sync, None, "a sync it never saw settled settles nothing");
    assert_eq!(log.unsettled().ranges(8)[&0].len(), 2, "its ranges stay unsettled for its resync");
    assert!(log.receive(V1, 4).is_err(), "the old version is refused after the change");
}

#[test]
fn a_tail_settles_by_a_sync_and_a_new_tail_acknowledges_what_it_applied() {
    let mut log: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, V1, 0, true);
    log.applied_entry(write(1, 11));
    log.applied_entry(ChainEntry { position: 2, kind: EntryKind::Sync });
    log.applied_entry(write(3, 13));
    let progress = log.successor_acked(V1, 1).unwrap();
    assert_eq!((progress.ack_up, progress.settled_sync), (1, None));
    let progress = log.change_version(ChainVersion(2), true, false);
    assert_eq!((progress.ack_up, progress.settled_sync), (3, Some(2)), "its successor left: it is the tail");
    assert_eq!(log.unsettled().ranges(8)[&0].iter().collect::<Vec<_>>(), vec![write_range(3)]);
}

/// A store syncs one fork at a time: a settled sync of fork 1 must leave fork 0's ranges
/// unsettled (a member killed before fork 0 was synced lost them; a resync must copy them).
#[test]
fn a_sync_of_one_fork_settles_only_that_forks_ranges() {
    let mut log: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, V1, 0, false);
    log.applied_entry(write(1, 11));
    let other = ByteRange::new(200, 5).unwrap().unwrap();
    log.applied_entry(ChainEntry {
        position: 2,
        kind: EntryKind::Write { fork: 1, range: other, payload: 12 },
    });
    let progress = log.applied_entry(ChainEntry { position: 3, kind: EntryKind::SyncFork { fork: 1 } });
    assert_eq!(progress.settled_sync, Some(3), "the tail settles the sync at once");
    let unsettled = log.unsettled().ranges(8);
    assert!(!unsettled.contains_key(&1), "fork 1 was synced: {unsettled:?}");
    assert_eq!(unsettled[&0].iter().collect::<Vec<_>>(), vec![write_range(1)], "fork 0 was not synced");
    log.applied_entry(ChainEntry { position: 4, kind: EntryKind::Sync });
    assert!(log.unsettled().is_empty(), "a sync of everything settles every fork");
}

/// A member that joins by a resync copy starts its log at the source's position; it must
/// take the source's unsettled ranges with it (`copied_to`): another member may still hold
/// them unsynced, and when that member is killed and returns, a resync record this joiner
/// started (seeded from its unsettled ranges) is all it is copied. A joiner that started
/// with an empty set (the crash checker's lost file on t-resync) seeds a record that misses
/// them.
#[test]
fn a_joiner_takes_the_sources_unsettled_ranges_into_its_log() {
    // The old member: a write at 1, not yet synced by anyone.
    let mut old: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, V1, 0, false);
    old.applied_entry(write(1, 11));
    // The joiner's log as the copy's end starts it, with and without the source's ranges.
    let fresh: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, ChainVersion(2), old.applied(), false);
    let mut joined: ChainMemberLog<u8, u64> =
        ChainMemberLog::new(CHAIN, ChainVersion(2), old.applied(), false);
    joined.copied_to(old.applied(), old.unsettled());
    // The old member is killed (its unsynced write lost); the joiner seeds its record.
    let seed = |log: &ChainMemberLog<u8, u64>| {
        let mut record: MissedRecord<u8> =
            MissedRecord::new(ChainVersion(3), [TargetId(1)].into(), 8, 1 << 20);
        for (fork, set) in log.unsettled().ranges(8) {
            set.iter().for_each(|range| record.record(fork, range));
        }
        record
    };
    assert!(seed(&fresh).keys().is_empty(), "the bug: a fresh log seeds nothing");
    let record = seed(&joined);
    assert_eq!(record.keys()[&0].iter().collect::<Vec<_>>(), vec![write_range(1)]);
    // A sync after the copy's position, settled, makes it durable everywhere: it goes.
    joined.applied_entry(ChainEntry { position: 2, kind: EntryKind::SyncFork { fork: 0 } });
    assert!(joined.unsettled().is_empty(), "a later settled sync of the fork settles the inherited range");
}

fn write_range(position: u64) -> ByteRange {
    ByteRange::new(position * 10, 5).unwrap().unwrap()
}

#[test]
fn the_head_bounds_its_window_and_answers_in_order() {
    let mut log: ChainMemberLog<u8, u64> = ChainMemberLog::new(CHAIN, V1, 0, true);
    let mut head: ChainHead<&str> = ChainHead::new(&log, 2);
    let a = head.submit(&log, V1, EntryKind::Sync, "a").unwrap();
    let b = head.submit(&log, V1, EntryKind::Sync, "b").unwrap();
    assert!(matches!(
        head.submit(&log, V1, EntryKind::Sync, "c"),
        Err(HeadRefusal::WindowFull { in_flight: 2, max: 2, .. })
    ));
    assert!(matches!(
        head.submit(&log, ChainVersion(2), EntryKind::Sync, "c"),
        Err(HeadRefusal::OtherVersion { .. })
    ));
    log.applied_entry(a);
    log.applied_entry(b);
    assert!(head.answer(log.ack_up()).is_empty(), "nothing is answered before the successor acknowledges");
    let progress = log.successor_acked(V1, 1).unwrap();
    assert_eq!(head.answer(progress.ack_up), vec![(1, "a")]);
    let c = head.submit(&log, V1, EntryKind::Sync, "c").unwrap();
    assert_eq!(c.position, 3);
    // The chain changes before "c" was applied: it is dropped, "b" (applied) keeps waiting.
    log.change_version(ChainVersion(2), true, true);
    assert_eq!(head.change_version(&log), vec!["c"]);
    assert_eq!(head.submit(&log, ChainVersion(2), EntryKind::Sync, "d").unwrap().position, 3);
    log.applied_entry(ChainEntry { position: 3, kind: EntryKind::Sync });
    let progress = log.successor_acked(ChainVersion(2), 3).unwrap();
    assert_eq!(head.answer(progress.ack_up), vec![(2, "b"), (3, "d")]);
}
