//! The chain table of replication (issue 32), kept in the namespace's database: the values
//! of the `chains` and `chain_targets` tables and the `chain_replicas` counter, format
//! version 1 (see `FORMAT.md`).
//!
//! The metadata service writes a chain here before it tells anyone the chain's new version,
//! so a restarted service hands out no version lower than one a server already saw.
//! Invariants checked on decode: the checksum, the version byte, member states known, and
//! the chain as a whole ([`Chain::from_parts`]: distinct members, at most one syncing); the
//! table as a whole is checked by the service with `ChainTable::from_parts`.

use crate::codec::{Reader, Writer};
use crate::error::NamespaceError;
use crate::namespace::Namespace;
use flotilla_replica::{
    Chain, ChainId, ChainVersion, FailureGroup, Incarnation, Member, MemberState, CHAINS_MAX,
    FAILURE_GROUP_BYTES_MAX, MEMBERS_PER_CHAIN_MAX,
};
use flotilla_types::TargetId;
use redb::ReadableTable;
use std::collections::BTreeMap;

/// Format version of chain and chain-target records written by this build.
pub(crate) const CHAIN_FORMAT_VERSION: u8 = 1;
/// `counters` key holding the chain table's replica count (absent: no table yet).
pub(crate) const CHAIN_REPLICAS_KEY: &str = "chain_replicas";

const STATE_SERVING: u8 = 0;
const STATE_SYNCING: u8 = 1;
const STATE_OFFLINE: u8 = 2;
const STATE_DEAD: u8 = 3;

/// What the chain table remembers of one target: its failure group, the highest
/// incarnation heard from its server, and the operator's and the engine's marks (declared
/// dead, draining), so a restarted metadata service keeps them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainTarget {
    pub group: FailureGroup,
    pub incarnation: Option<Incarnation>,
    pub dead: bool,
    pub draining: bool,
}

/// Mark bits of a chain target record (an optional last byte; records written before it
/// existed have none: no marks).
const MARK_DEAD: u8 = 1;
const MARK_DRAINING: u8 = 2;

/// The chain table as stored: the replica count (`None` before the table is built), every
/// chain in id order, and every target's group and incarnation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredChains {
    pub replicas: Option<u32>,
    pub chains: Vec<Chain>,
    pub targets: BTreeMap<TargetId, ChainTarget>,
}

/// One durable change of the chain table: chains written whole, targets written whole.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChainChange<'a> {
    /// Set when the table is built.
    pub replicas: Option<u32>,
    pub chains: &'a [&'a Chain],
    pub targets: &'a [(TargetId, &'a ChainTarget)],
}

pub(crate) fn encode_chain(chain: &Chain) -> Vec<u8> {
    let mut writer = Writer::new(CHAIN_FORMAT_VERSION);
    writer.u64(chain.version().0);
    writer.u8(u8::try_from(chain.members().len()).expect("a chain has at most 8 members"));
    for member in chain.members() {
        writer.u64(member.target.0);
        let (tag, missed_since, full) = match member.state {
            MemberState::Serving => (STATE_SERVING, 0, false),
            MemberState::Syncing { missed_since, full } => (STATE_SYNCING, missed_since.0, full),
            MemberState::Offline { missed_since, full } => (STATE_OFFLINE, missed_since.0, full),
            MemberState::Dead => (STATE_DEAD, 0, false),
        };
        writer.u8(tag);
        writer.u64(missed_since);
        writer.u8(u8::from(full));
    }
    writer.finish()
}

pub(crate) fn decode_chain(id: u32, record: &[u8]) -> Result<Chain, NamespaceError> {
    let mut reader = Reader::open("chain", record, CHAIN_FORMAT_VERSION)?;
    let version = ChainVersion(reader.u64()?);
    let count = usize::from(reader.u8()?);
    if count == 0 || count > MEMBERS_PER_CHAIN_MAX {
        return Err(reader.error(format!("has {count} members, outside 1..={MEMBERS_PER_CHAIN_MAX}")));
    }
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        let target = TargetId(reader.u64()?);
        let (tag, missed_since, full) = (reader.u8()?, ChainVersion(reader.u64()?), reader.u8()?);
        let full = match full {
            0 => false,
            1 => true,
            other => return Err(reader.error(format!("has full flag {other}"))),
        };
        let state = match tag {
            STATE_SERVING => MemberState::Serving,
            STATE_SYNCING => MemberState::Syncing { missed_since, full },
            STATE_OFFLINE => MemberState::Offline { missed_since, full },
            STATE_DEAD => MemberState::Dead,
            other => return Err(reader.error(format!("has member state {other}"))),
        };
        members.push(Member { target, state });
    }
    reader.finish()?;
    Chain::from_parts(ChainId(id), version, members)
        .ok_or_else(|| NamespaceError::corrupt(format!("chain record {id} breaks the chain invariants")))
}

pub(crate) fn encode_chain_target(target: &ChainTarget) -> Vec<u8> {
    let group = target.group.as_str();
    assert!(!group.is_empty() && group.len() <= FAILURE_GROUP_BYTES_MAX, "failure group length");
    let mut writer = Writer::new(CHAIN_FORMAT_VERSION);
    writer.u64(target.incarnation.map_or(0, |i| i.0));
    writer.u16(group.len() as u16);
    writer.raw(group.as_bytes());
    if target.dead || target.draining {
        writer.u8((u8::from(target.dead) * MARK_DEAD) | (u8::from(target.draining) * MARK_DRAINING));
    }
    writer.finish()
}

pub(crate) fn decode_chain_target(record: &[u8]) -> Result<ChainTarget, NamespaceError> {
    let mut reader = Reader::open("chain target", record, CHAIN_FORMAT_VERSION)?;
    let incarnation = Some(reader.u64()?).filter(|&i| i != 0).map(Incarnation);
    let length = usize::from(reader.u16()?);
    if length == 0 || length > FAILURE_GROUP_BYTES_MAX {
        return Err(reader.error(format!("has a {length}-byte failure group")));
    }
    let name = std::str::from_utf8(reader.take(length)?)
        .map_err(|_| reader.error("has a failure group that is not UTF-8".into()))?;
    let group = FailureGroup::new(name).map_err(|e| reader.error(e.to_string()))?;
    let marks = if reader.is_empty() { 0 } else { reader.u8()? };
    if marks & !(MARK_DEAD | MARK_DRAINING) != 0 {
        return Err(reader.error(format!("has unknown mark bits {marks:#04x}")));
    }
    reader.finish()?;
    Ok(ChainTarget { group, incarnation, dead: marks & MARK_DEAD != 0, draining: marks & MARK_DRAINING != 0 })
}

impl Namespace {
    /// The chain table as stored (empty in a database that never had one).
    pub fn chain_table(&self) -> Result<StoredChains, NamespaceError> {
        self.write(|tables| {
            let replicas = tables.counters.get(CHAIN_REPLICAS_KEY)?.map(|v| v.value());
            let replicas = replicas.map(|r| u32::try_from(r).unwrap_or(u32::MAX));
            let mut chains = Vec::new();
            for item in tables.chains.iter()? {
                let (key, value) = item?;
                if chains.len() >= CHAINS_MAX {
                    return Err(NamespaceError::corrupt(format!("more than {CHAINS_MAX} chain records")));
                }
                chains.push(decode_chain(key.value(), value.value())?);
            }
            let mut targets = BTreeMap::new();
            for item in tables.chain_targets.iter()? {
                let (key, value) = item?;
                targets.insert(TargetId(key.value()), decode_chain_target(value.value())?);
            }
            Ok(StoredChains { replicas, chains, targets })
        })
    }

    /// Writes `change` in one durable transaction.
    pub fn record_chains(&self, change: ChainChange<'_>) -> Result<(), NamespaceError> {
        let chains: Vec<(u32, Vec<u8>)> = change.chains.iter().map(|c| (c.id().0, encode_chain(c))).collect();
        let targets: Vec<(u64, Vec<u8>)> =
            change.targets.iter().map(|(t, record)| (t.0, encode_chain_target(record))).collect();
        self.write(|tables| {
            if let Some(replicas) = change.replicas {
                tables.counters.insert(CHAIN_REPLICAS_KEY, u64::from(replicas))?;
            }
            for (id, record) in &chains {
                tables.chains.insert(*id, record.as_slice())?;
            }
            for (target, record) in &targets {
                tables.chain_targets.insert(*target, record.as_slice())?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = MemberState> {
        prop_oneof![
            Just(MemberState::Serving),
            (1u64..u64::MAX, any::<bool>())
                .prop_map(|(v, full)| MemberState::Offline { missed_since: ChainVersion(v), full }),
            Just(MemberState::Dead),
        ]
    }

    fn chain() -> impl Strategy<Value = Chain> {
        let members = proptest::collection::btree_map(any::<u64>(), state(), 1..=MEMBERS_PER_CHAIN_MAX);
        (any::<u32>(), 1u64..u64::MAX, members, any::<bool>(), 1u64..u64::MAX).prop_map(
            |(id, version, members, syncing, since)| {
                let mut members: Vec<Member> =
                    members.into_iter().map(|(t, state)| Member { target: TargetId(t), state }).collect();
                if syncing {
                    members[0].state = MemberState::Syncing { missed_since: ChainVersion(since), full: true };
                }
                Chain::from_parts(ChainId(id), ChainVersion(version), members).expect("valid by construction")
            },
        )
    }

    proptest! {
        #[test]
        fn chain_records_round_trip(chain in chain()) {
            let record = encode_chain(&chain);
            prop_assert_eq!(decode_chain(chain.id().0, &record).unwrap(), chain);
        }

        #[test]
        fn chain_target_records_round_trip(name in "[a-z0-9.-]{1,255}", incarnation in proptest::option::of(1u64..), dead: bool, draining: bool) {
            let target = ChainTarget { group: FailureGroup::new(&name).unwrap(), incarnation: incarnation.map(Incarnation), dead, draining };
            prop_assert_eq!(decode_chain_target(&encode_chain_target(&target)).unwrap(), target);
        }

        /// Damage anywhere is a typed error, never a panic or a wrong chain.
        #[test]
        fn damaged_chain_records_are_refused(chain in chain(), at in any::<prop::sample::Index>(), flip in 1u8..) {
            let mut record = encode_chain(&chain);
            let at = at.index(record.len());
            record[at] ^= flip;
            let corrupt = matches!(decode_chain(chain.id().0, &record), Err(NamespaceError::Corrupt { .. }));
            prop_assert!(corrupt);
            prop_assert!(decode_chain(chain.id().0, &record[..at]).is_err());
        }
    }

    #[test]
    fn chain_record_has_documented_bytes() {
        let members = vec![
            Member { target: TargetId(7), state: MemberState::Serving },
            Member {
                target: TargetId(9),
                state: MemberState::Offline { missed_since: ChainVersion(4), full: false },
            },
        ];
        let chain = Chain::from_parts(ChainId(2), ChainVersion(5), members).unwrap();
        let record = encode_chain(&chain);
        assert_eq!(record[0], 1, "format version");
        assert_eq!(&record[1..9], &5u64.to_le_bytes());
        assert_eq!(record[9], 2, "member count");
        assert_eq!(&record[10..18], &7u64.to_le_bytes());
        assert_eq!(record[18], STATE_SERVING);
        assert_eq!(record[36], STATE_OFFLINE);
        assert_eq!(&record[37..45], &4u64.to_le_bytes());
        assert_eq!(record.len(), 10 + 2 * 18 + 4);
        let target = ChainTarget {
            group: FailureGroup::new("rack-a").unwrap(),
            incarnation: Some(Incarnation(3)),
            dead: false,
            draining: false,
        };
        let bytes = encode_chain_target(&target);
        assert_eq!(&bytes[1..9], &3u64.to_le_bytes());
        assert_eq!(&bytes[9..11], &6u16.to_le_bytes());
        assert_eq!(&bytes[11..17], b"rack-a");
        assert_eq!(bytes.len(), 17 + 4);
        let marked = ChainTarget { dead: true, draining: true, ..target };
        let bytes = encode_chain_target(&marked);
        assert_eq!(bytes[17], 3, "mark bits: dead 1, draining 2");
        assert_eq!(bytes.len(), 18 + 4);
    }

    #[test]
    fn the_table_survives_a_reopen_of_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.redb");
        let chain = Chain::new(ChainId(0), &[TargetId(1), TargetId(2)]);
        let target = ChainTarget {
            group: FailureGroup::new("a").unwrap(),
            incarnation: None,
            dead: false,
            draining: true,
        };
        {
            let ns = Namespace::open(&path).unwrap();
            assert_eq!(ns.chain_table().unwrap(), StoredChains::default());
            let change =
                ChainChange { replicas: Some(2), chains: &[&chain], targets: &[(TargetId(1), &target)] };
            ns.record_chains(change).unwrap();
        }
        let ns = Namespace::open(&path).unwrap();
        let stored = ns.chain_table().unwrap();
        assert_eq!(stored.replicas, Some(2));
        assert_eq!(stored.chains, vec![chain]);
        assert_eq!(stored.targets.get(&TargetId(1)), Some(&target));
    }

    #[test]
    fn a_replicated_file_keeps_its_chains_and_its_removal_reaches_every_member() {
        use crate::request::{CreateFile, Owner};
        use flotilla_types::{Caller, FileId, Layout, SubfileIndex};
        let ns = Namespace::open_in_memory().unwrap();
        let chains = [
            Chain::new(ChainId(0), &[TargetId(1), TargetId(2)]),
            Chain::new(ChainId(1), &[TargetId(3), TargetId(4)]),
        ];
        ns.record_chains(ChainChange { replicas: Some(2), chains: &[&chains[0], &chains[1]], targets: &[] })
            .unwrap();
        let spec = CreateFile {
            owner: Owner { mode: 0o644, uid: 0, gid: 0 },
            subfile_count: 0,
            targets: None,
            layout: Some(Layout::Stripe { unit_bytes: 4096, count: 2 }),
            exclusive: true,
        };
        let placed = [(1, TargetId(3)), (0, TargetId(1))];
        let at = crate::walk::Place::Path("/r");
        let entry = ns.create_file_chained_in(&Caller::root(), at, &spec, 2, &placed, 1).unwrap();
        let file = entry.file.unwrap();
        assert_eq!(
            (file.replicas, file.chains.clone(), file.targets.clone()),
            (2, vec![1, 0], vec![TargetId(3), TargetId(1)])
        );
        assert_eq!(ns.lookup("/r").unwrap().file.unwrap().chains, vec![1, 0], "kept in the record");
        // Three chains for two subfiles is refused, naming the count.
        let three = [(0, TargetId(1)), (1, TargetId(3)), (2, TargetId(5))];
        let at = crate::walk::Place::Path("/s");
        let refused = ns.create_file_chained_in(&Caller::root(), at, &spec, 2, &three, 1).unwrap_err();
        assert!(refused.to_string().contains("2 subfiles, but 3 chains"), "{refused}");
        ns.unlink("/r", 2).unwrap();
        for (target, subfile) in [(3, 0), (4, 0), (1, 1), (2, 1)] {
            let pending = ns.pending_deletes(TargetId(target), 16).unwrap();
            assert_eq!(pending, vec![(FileId(file.id.0), SubfileIndex(subfile))], "target {target}");
        }
    }
}
