//! Property tests of the pure parts: placement, the membership engine's invariants, fencing,
//! and range sets against a naive bitmap model.

use flotilla_replica::{
    admit, build_chains, Access, Admission, ByteRange, ChainId, ChainTable, ChainVersion, Command, Event,
    FailureGroup, Incarnation, MemberState, MemberView, Membership, MembershipConfig, PlacementError,
    RangeError, RangeSet, RANGES_ENCODING_VERSION,
};
use flotilla_types::TargetId;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn groups(group_of: &[u8]) -> BTreeMap<TargetId, FailureGroup> {
    group_of
        .iter()
        .enumerate()
        .map(|(i, g)| (TargetId(i as u64 + 1), FailureGroup::new(&format!("host{g}")).unwrap()))
        .collect()
}

fn distinct_groups(table: &ChainTable) -> bool {
    table.chains().all(|c| {
        let gs: BTreeSet<_> = c.members().iter().map(|m| table.group_of(m.target).unwrap()).collect();
        gs.len() == c.members().len()
    })
}

proptest! {
    #[test]
    fn built_chains_keep_distinct_groups_and_balance(
        group_of in prop::collection::vec(0u8..6, 1..12),
        replicas in 1usize..4,
        per_target in 1usize..5,
    ) {
        let groups = groups(&group_of);
        let have = groups.values().collect::<BTreeSet<_>>().len();
        match ChainTable::build(groups.clone(), replicas, per_target) {
            Err(PlacementError::NotEnoughFailureGroups { wanted, have: h }) => {
                prop_assert!(have < replicas);
                prop_assert_eq!((wanted, h), (replicas, have));
            }
            Err(other) => prop_assert!(false, "unexpected {other}"),
            Ok(table) => {
                prop_assert!(have >= replicas);
                prop_assert!(table.check() && distinct_groups(&table));
                prop_assert_eq!(table.chains().count(), (groups.len() * per_target).div_ceil(replicas));
                prop_assert!(table.chains().all(|c| c.members().len() == replicas));
                if have == groups.len() {
                    let load = table.load_by_target();
                    let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
                    prop_assert!(max - min <= 1, "unbalanced {load:?}");
                }
            }
        }
    }

    #[test]
    fn chosen_chains_are_disjoint(group_count in 3usize..10, replicas in 1usize..4, count in 1usize..4) {
        let table = ChainTable::build(groups(&(0..group_count as u8).collect::<Vec<_>>()), replicas, 2).unwrap();
        match table.choose_for_file(count, |id| u64::from(id.0 % 3)) {
            Ok(chosen) => {
                prop_assert_eq!(chosen.len(), count);
                let mut seen = BTreeSet::new();
                for id in chosen {
                    for m in table.chain(id).unwrap().members() {
                        prop_assert!(seen.insert(m.target), "target {} twice", m.target);
                    }
                }
            }
            Err(PlacementError::NotEnoughDisjointChains { wanted, found }) => {
                prop_assert!(found < wanted);
            }
            Err(other) => prop_assert!(false, "unexpected {other}"),
        }
    }

    #[test]
    fn added_target_gets_chains_in_distinct_groups(group_count in 3usize..8, new_group in 0u8..10) {
        let mut table = ChainTable::build(groups(&(0..group_count as u8).collect::<Vec<_>>()), 3, 2).unwrap();
        let target = TargetId(1000);
        let added = table.add_target(target, FailureGroup::new(&format!("host{new_group}")).unwrap(), 2).unwrap();
        prop_assert_eq!(added.len(), 2);
        prop_assert!(added.iter().all(|&id| table.chain(id).unwrap().state_of(target).is_some()));
        prop_assert!(table.check() && distinct_groups(&table));
    }
}

/// One step of a membership run, drawn by proptest.
#[derive(Clone, Debug)]
enum Step {
    Heartbeat { target: usize, restart: bool },
    Advance { ms: u64 },
    SyncDone { chain: usize, target: usize, stale: bool },
    Drain { target: usize },
    Remove { target: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..8, prop::bool::weighted(0.1)).prop_map(|(target, restart)| Step::Heartbeat { target, restart }),
        4 => prop_oneof![Just(500u64), Just(3_000), Just(7_000), Just(40_000)].prop_map(|ms| Step::Advance { ms }),
        4 => (0usize..16, 0usize..8, prop::bool::weighted(0.2))
            .prop_map(|(chain, target, stale)| Step::SyncDone { chain, target, stale }),
        1 => (0usize..8).prop_map(|target| Step::Drain { target }),
        1 => (0usize..8).prop_map(|target| Step::Remove { target }),
    ]
}

/// Runs `steps` on an engine over 8 targets in 6 groups and checks, after every event:
/// versions only grow (by one per announced change), a member never becomes `Serving` except
/// by a current `SyncDone` while `Syncing`, chains keep distinct groups and at least one
/// serving member.
fn run_membership(steps: Vec<Step>, replicas: usize) -> Result<(), TestCaseError> {
    let table = ChainTable::build(groups(&[0, 1, 2, 3, 4, 5, 0, 1]), replicas, 2).unwrap();
    let config = MembershipConfig {
        lease_ms: 2_000,
        clock_margin_ms: 500,
        fence_after_ms: 5_000,
        dead_after_ms: 30_000,
    };
    let mut engine = Membership::new(config, table, 0).unwrap();
    let targets: Vec<TargetId> = engine.table().targets().map(|(t, _)| t).collect();
    let mut incarnations = vec![1u64; targets.len()];
    let mut now_ms = 0;
    for step in steps {
        let before = engine.table().clone();
        let event = match step {
            Step::Heartbeat { target, restart } => {
                incarnations[target] += u64::from(restart);
                Event::Heartbeat {
                    target: targets[target],
                    incarnation: Incarnation(incarnations[target]),
                    at_ms: now_ms,
                }
            }
            Step::Advance { ms } => {
                now_ms += ms;
                Event::Tick { at_ms: now_ms }
            }
            Step::SyncDone { chain, target, stale } => {
                let chain = ChainId((chain % before.chains().count()) as u32);
                let version = before.chain(chain).unwrap().version();
                let version = if stale { ChainVersion(version.0.saturating_sub(1)) } else { version };
                Event::SyncDone { chain, target: targets[target], version }
            }
            Step::Drain { target } => Event::Drain { target: targets[target] },
            Step::Remove { target } => Event::Remove { target: targets[target] },
        };
        let commands = engine.handle(event.clone());
        check_step(&before, engine.table(), &event, &commands)?;
    }
    Ok(())
}

fn check_step(
    before: &ChainTable,
    after: &ChainTable,
    event: &Event,
    commands: &[Command],
) -> Result<(), TestCaseError> {
    prop_assert!(after.check() && distinct_groups(after));
    for chain in after.chains() {
        let old = before.chain(chain.id()).unwrap();
        prop_assert!(chain.version() >= old.version(), "version went back in {}", chain.id());
        prop_assert!(chain.serving_count() >= 1, "{} has no serving member", chain.id());
        if chain.members() != old.members() {
            prop_assert_eq!(chain.version(), old.version().next());
        }
        for member in chain.members() {
            let was = old.state_of(member.target);
            if member.state == MemberState::Serving && was != Some(MemberState::Serving) {
                let synced = matches!(was, Some(MemberState::Syncing { .. }))
                    && *event
                        == Event::SyncDone {
                            chain: chain.id(),
                            target: member.target,
                            version: old.version(),
                        };
                prop_assert!(
                    synced,
                    "{} became serving in {} from {was:?} on {event:?}",
                    member.target,
                    chain.id()
                );
            }
        }
    }
    for command in commands {
        if let Command::ChainChanged { chain, version, members } = command {
            let current = after.chain(*chain).unwrap();
            prop_assert_eq!((current.version(), current.members()), (*version, members.as_slice()));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn membership_keeps_its_invariants(steps in prop::collection::vec(step(), 1..120), replicas in 2usize..4) {
        run_membership(steps, replicas)?;
    }
}

// Phase 1: a member falls silent and is fenced; phase 2: it returns and syncs;
// phase 3: only a SyncDone for the current version makes it serve again.
#[test]
fn fenced_member_serves_again_only_after_sync_done() {
    let table = ChainTable::build(groups(&[0, 1, 2]), 3, 1).unwrap();
    let config = MembershipConfig::default();
    let mut engine = Membership::new(config, table, 0).unwrap();
    let (a, b, c) = (TargetId(1), TargetId(2), TargetId(3));
    let chain = ChainId(0);
    // Phase 1: b and c report, a stays silent past fence_after_ms.
    for t in [b, c] {
        engine.handle(Event::Heartbeat { target: t, incarnation: Incarnation(1), at_ms: 5_500 });
    }
    let commands = engine.handle(Event::Tick { at_ms: 5_500 });
    let state = engine.table().chain(chain).unwrap().state_of(a).unwrap();
    assert_eq!(state, MemberState::Offline { missed_since: ChainVersion(2), full: false });
    assert!(matches!(&commands[0], Command::ChainChanged { version: ChainVersion(2), .. }), "{commands:?}");
    // Phase 2: a returns; it syncs at the tail from the last serving member.
    let commands = engine.handle(Event::Heartbeat { target: a, incarnation: Incarnation(1), at_ms: 6_000 });
    let v3 = engine.table().chain(chain).unwrap();
    assert_eq!(v3.write_path().last(), Some(&a));
    assert!(commands.iter().any(|c| matches!(c, Command::StartResync { from, to, .. } if *to == a && *from == v3.predecessor(a).unwrap())));
    // Phase 3: a stale SyncDone does nothing; the current one makes a serve.
    engine.handle(Event::SyncDone { chain, target: a, version: ChainVersion(2) });
    assert!(matches!(engine.table().chain(chain).unwrap().state_of(a), Some(MemberState::Syncing { .. })));
    engine.handle(Event::SyncDone { chain, target: a, version: ChainVersion(3) });
    assert_eq!(engine.table().chain(chain).unwrap().state_of(a), Some(MemberState::Serving));
}

// A dead member is replaced by a target of another failure group, which gets a full copy;
// the last serving member is never declared dead.
#[test]
fn dead_member_is_replaced_and_last_copy_kept() {
    let table = ChainTable::build(groups(&[0, 1, 2]), 2, 1).unwrap();
    let config = MembershipConfig { dead_after_ms: 20_000, ..MembershipConfig::default() };
    let mut engine = Membership::new(config, table, 0).unwrap();
    let chain = engine.table().chain(ChainId(0)).unwrap().clone();
    let (first, second) = (chain.members()[0].target, chain.members()[1].target);
    let spare = engine.table().targets().map(|(t, _)| t).find(|t| chain.state_of(*t).is_none()).unwrap();
    let mut commands = Vec::new();
    for at_ms in (0..=25_000).step_by(1_000) {
        for t in [first, spare] {
            engine.handle(Event::Heartbeat { target: t, incarnation: Incarnation(1), at_ms });
        }
        commands.extend(engine.handle(Event::Tick { at_ms }));
    }
    assert!(
        commands.iter().any(|c| matches!(c, Command::Rebuild { chain: ChainId(0), replaced, replacement }
        if replaced == &vec![second] && *replacement == spare)),
        "{commands:?}"
    );
    let now = engine.table().chain(ChainId(0)).unwrap();
    assert_eq!(now.state_of(spare), Some(MemberState::Syncing { missed_since: now.version(), full: true }));
    // Everyone else goes silent: `first` is the last copy and stays serving.
    commands.clear();
    commands.extend(engine.handle(Event::Tick { at_ms: 200_000 }));
    let now = engine.table().chain(ChainId(0)).unwrap();
    assert_eq!(now.state_of(first), Some(MemberState::Serving));
    assert_eq!(now.serving_count(), 1);
}

#[test]
fn too_few_failure_groups_is_named() {
    let error = ChainTable::build(groups(&[0, 0, 1, 1]), 3, 1).unwrap_err();
    assert_eq!(error, PlacementError::NotEnoughFailureGroups { wanted: 3, have: 2 });
    assert_eq!(error.to_string(), "3 replicas need 3 distinct failure groups, but only 2 have live targets");
    assert!(build_chains(&groups(&[0, 1]), 0, 1).is_err());
}

#[test]
fn admit_checks_lease_membership_version_and_state() {
    let v = ChainVersion(7);
    let serving = MemberView { version: v, state: Some(MemberState::Serving) };
    let syncing =
        MemberView { version: v, state: Some(MemberState::Syncing { missed_since: v, full: false }) };
    let offline =
        MemberView { version: v, state: Some(MemberState::Offline { missed_since: v, full: false }) };
    assert_eq!(admit(v, serving, Access::Read, 100, 99), Admission::Serve);
    assert_eq!(admit(v, serving, Access::Read, 100, 100), Admission::NoLease);
    assert_eq!(admit(ChainVersion(6), serving, Access::Write, 100, 0), Admission::Stale { current: v });
    assert_eq!(admit(ChainVersion(8), serving, Access::Write, 100, 0), Admission::Stale { current: v });
    assert_eq!(admit(v, syncing, Access::Write, 100, 0), Admission::Serve);
    assert!(matches!(admit(v, syncing, Access::Read, 100, 0), Admission::NotMember { .. }));
    assert!(matches!(admit(v, offline, Access::Write, 100, 0), Admission::NotMember { .. }));
    let stranger = MemberView { version: v, state: None };
    assert_eq!(admit(v, stranger, Access::Read, 100, 0), Admission::NotMember { state: None });
}

#[test]
fn config_refuses_fence_inside_lease() {
    let config = MembershipConfig {
        lease_ms: 3_000,
        clock_margin_ms: 1_000,
        fence_after_ms: 4_000,
        dead_after_ms: 10_000,
    };
    assert!(config.validate().is_err());
    assert!(MembershipConfig::default().validate().is_ok());
}

/// A range operation on a universe of 256 bytes.
#[derive(Clone, Debug)]
enum RangeOp {
    Insert(u64, u64),
    Subtract(u64, u64),
}

fn range_op() -> impl Strategy<Value = RangeOp> {
    prop_oneof![
        3 => (0u64..256, 1u64..40).prop_map(|(o, l)| RangeOp::Insert(o, l)),
        1 => (0u64..256, 1u64..40).prop_map(|(o, l)| RangeOp::Subtract(o, l)),
    ]
}

fn apply(set: &mut RangeSet, bitmap: &mut [bool; 300], op: &RangeOp) {
    let (RangeOp::Insert(o, l) | RangeOp::Subtract(o, l)) = *op;
    let range = ByteRange::new(o, l).unwrap().unwrap();
    let insert = matches!(op, RangeOp::Insert(..));
    if insert {
        set.insert(range);
    } else {
        set.subtract(range);
    }
    bitmap[o as usize..(o + l) as usize].iter_mut().for_each(|b| *b = insert);
}

proptest! {
    #[test]
    fn range_set_equals_bitmap(ops in prop::collection::vec(range_op(), 0..60)) {
        let mut set = RangeSet::new(1 << 10);
        let mut bitmap = [false; 300];
        for op in &ops {
            apply(&mut set, &mut bitmap, op);
            for (i, &b) in bitmap.iter().enumerate() {
                prop_assert_eq!(set.contains(i as u64), b, "byte {} after {:?}", i, op);
            }
        }
        prop_assert_eq!(set.covered_bytes(), bitmap.iter().filter(|&&b| b).count() as u64);
    }

    #[test]
    fn bounded_range_set_is_a_superset(ops in prop::collection::vec(range_op(), 0..60), ranges_max in 1usize..5) {
        let mut set = RangeSet::new(ranges_max);
        let mut bitmap = [false; 300];
        for op in &ops {
            apply(&mut set, &mut bitmap, op);
            prop_assert!(set.len() <= ranges_max);
            for (i, &b) in bitmap.iter().enumerate() {
                prop_assert!(!b || set.contains(i as u64), "byte {} lost after {:?}", i, op);
            }
        }
    }

    #[test]
    fn encoding_round_trips(ops in prop::collection::vec(range_op(), 0..40)) {
        let mut set = RangeSet::new(64);
        let mut bitmap = [false; 300];
        for op in &ops {
            apply(&mut set, &mut bitmap, op);
        }
        let bytes = set.encode();
        prop_assert_eq!(bytes[0], RANGES_ENCODING_VERSION);
        prop_assert_eq!(RangeSet::decode(&bytes, 64).unwrap(), set);
    }

    #[test]
    fn decoding_garbage_is_an_error_or_canonical(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        if let Ok(set) = RangeSet::decode(&bytes, 4) {
            prop_assert!(set.len() <= 4);
            prop_assert_eq!(set.encode(), bytes);
        }
    }
}

#[test]
fn decoding_refuses_each_kind_of_garbage() {
    let mut set = RangeSet::new(8);
    set.insert(ByteRange::new(10, 5).unwrap().unwrap());
    set.insert(ByteRange::new(30, 5).unwrap().unwrap());
    let good = set.encode();
    let mut version = good.clone();
    version[0] = 9;
    assert_eq!(RangeSet::decode(&version, 8), Err(RangeError::Version { found: 9, expected: 1 }));
    assert!(matches!(RangeSet::decode(&good[..good.len() - 1], 8), Err(RangeError::Truncated { .. })));
    assert!(matches!(
        RangeSet::decode(&[&good[..], &[0]].concat(), 8),
        Err(RangeError::Trailing { extra: 1 })
    ));
    assert!(matches!(RangeSet::decode(&good, 1), Err(RangeError::TooMany { count: 2, max: 1 })));
    let mut huge = vec![1u8];
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(RangeSet::decode(&huge, 1 << 20), Err(RangeError::TooMany { .. })));
    let mut unordered = good.clone();
    unordered.swap(5, 21);
    assert!(matches!(RangeSet::decode(&unordered, 8), Err(RangeError::Unordered { .. })));
    let mut overflow = vec![1u8, 1, 0, 0, 0];
    overflow.extend_from_slice(&u64::MAX.to_le_bytes());
    overflow.extend_from_slice(&2u64.to_le_bytes());
    assert!(matches!(RangeSet::decode(&overflow, 8), Err(RangeError::Overflow { .. })));
}

// A restart (higher incarnation) is a departure even without silence; a late heartbeat of an
// older incarnation changes nothing; the last serving member stays, with a version bump.
#[test]
fn restart_is_leaving_and_late_heartbeats_are_ignored() {
    let table = ChainTable::build(groups(&[0, 1]), 2, 1).unwrap();
    let mut engine = Membership::new(MembershipConfig::default(), table, 0).unwrap();
    let (a, b, chain) = (TargetId(1), TargetId(2), ChainId(0));
    for t in [a, b] {
        engine.handle(Event::Heartbeat { target: t, incarnation: Incarnation(5), at_ms: 100 });
    }
    engine.handle(Event::Heartbeat { target: a, incarnation: Incarnation(6), at_ms: 200 });
    let now = engine.table().chain(chain).unwrap();
    assert!(matches!(now.state_of(a), Some(MemberState::Offline { .. })));
    let version = now.version();
    assert!(engine
        .handle(Event::Heartbeat { target: a, incarnation: Incarnation(5), at_ms: 300 })
        .is_empty());
    assert_eq!(engine.table().chain(chain).unwrap().version(), version);
    // b is now the last serving member: its restart keeps it serving, at a new version.
    engine.handle(Event::Heartbeat { target: b, incarnation: Incarnation(6), at_ms: 400 });
    let now = engine.table().chain(chain).unwrap();
    assert_eq!(now.state_of(b), Some(MemberState::Serving));
    assert_eq!(now.version(), version.next());
}

// Phase 1: a drained member keeps serving while its replacement syncs; phase 2: the
// replacement's SyncDone makes it serve and the drained member leaves; removing the last
// serving member of a chain is deferred to a drain.
#[test]
fn drain_keeps_serving_until_replaced_and_remove_of_last_copy_is_deferred() {
    let table = ChainTable::build(groups(&[0, 1, 2]), 2, 1).unwrap();
    let mut engine = Membership::new(MembershipConfig::default(), table, 0).unwrap();
    let chain = ChainId(0);
    let drained = engine.table().chain(chain).unwrap().members()[0].target;
    // Phase 1.
    let commands = engine.handle(Event::Drain { target: drained });
    let now = engine.table().chain(chain).unwrap().clone();
    let replacement = now.syncing().expect("a replacement syncs").target;
    assert_eq!(now.state_of(drained), Some(MemberState::Serving));
    assert!(commands.iter().any(|c| matches!(c, Command::Rebuild { replaced, .. } if replaced.is_empty())));
    // Phase 2.
    engine.handle(Event::SyncDone { chain, target: replacement, version: now.version() });
    let now = engine.table().chain(chain).unwrap();
    assert_eq!(now.state_of(drained), None);
    assert_eq!(now.state_of(replacement), Some(MemberState::Serving));
    assert_eq!(now.members().len(), 2);
    // Removing a chain's last serving member: deferred (drained first).
    let table = ChainTable::build(groups(&[0, 1, 2]), 2, 1).unwrap();
    let mut engine = Membership::new(MembershipConfig::default(), table, 0).unwrap();
    let members: Vec<TargetId> =
        engine.table().chain(chain).unwrap().members().iter().map(|m| m.target).collect();
    engine.handle(Event::Remove { target: members[1] });
    let commands = engine.handle(Event::Remove { target: members[0] });
    assert!(
        commands.iter().any(|c| *c == Command::RemoveDeferred { chain, target: members[0] }),
        "{commands:?}"
    );
    assert_eq!(engine.table().chain(chain).unwrap().state_of(members[0]), Some(MemberState::Serving));
}
