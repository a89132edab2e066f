//! The resync record against a model: a stale copy caught up from the record (its ranges
//! clipped to the source's size, then truncated to that size) holds the same bytes as a
//! full copy of the source, for any writes and truncations, with ranges coarsened by a
//! small `ranges_max`.

use flotilla_replica::{pieces_within, ByteRange, ChainVersion, MissedRecord, WHOLE};
use flotilla_types::TargetId;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Write { fork: u8, offset: u64, length: u64, fill: u8 },
    Truncate { fork: u8, size: u64 },
    Remove { fork: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u64..400, 1u64..64, any::<u8>())
            .prop_map(|(fork, offset, length, fill)| Op::Write { fork, offset, length, fill }),
        1 => (0u8..3, 0u64..300).prop_map(|(fork, size)| Op::Truncate { fork, size }),
        1 => (0u8..3).prop_map(|fork| Op::Remove { fork }),
    ]
}

/// Forks as byte vectors (None: absent), as the store keeps them.
type Forks = Vec<Option<Vec<u8>>>;

fn apply(forks: &mut Forks, op: &Op) {
    match *op {
        Op::Write { fork, offset, length, fill } => {
            let bytes = forks[fork as usize].get_or_insert_with(Vec::new);
            let end = (offset + length) as usize;
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset as usize..end].fill(fill);
        }
        Op::Truncate { fork, size } => {
            if let Some(bytes) = forks[fork as usize].as_mut() {
                bytes.resize(size as usize, 0);
            }
        }
        Op::Remove { fork } => forks[fork as usize] = None,
    }
}

/// What a serving member records of `op` (as `chain_path.rs` records a change).
fn record(rec: &mut MissedRecord<u8>, op: &Op) {
    match *op {
        Op::Write { fork, offset, length, .. } => {
            rec.record(fork, ByteRange::new(offset, length).unwrap().unwrap())
        }
        Op::Truncate { fork, size } => {
            rec.record(fork, ByteRange::new(size, u64::MAX - size).unwrap().unwrap())
        }
        Op::Remove { fork } => rec.record(fork, WHOLE),
    }
}

/// The catch-up of `stale` from `source` through the record.
fn catch_up(stale: &mut Forks, source: &Forks, rec: &MissedRecord<u8>, piece: u64) -> u64 {
    let mut copied = 0;
    for (&fork, set) in rec.keys() {
        let Some(theirs) = source[fork as usize].as_ref() else {
            stale[fork as usize] = None;
            continue;
        };
        let mine = stale[fork as usize].get_or_insert_with(Vec::new);
        for piece in pieces_within(set, theirs.len() as u64, piece) {
            let (start, end) = (piece.offset as usize, piece.end() as usize);
            if mine.len() < end {
                mine.resize(end, 0);
            }
            mine[start..end].copy_from_slice(&theirs[start..end]);
            copied += piece.length_bytes;
        }
        mine.resize(theirs.len(), 0);
    }
    copied
}

proptest! {
    #[test]
    fn catching_up_from_the_record_equals_a_full_copy(
        before in prop::collection::vec(op(), 0..20),
        missed in prop::collection::vec(op(), 0..30),
        ranges_max in 1usize..6,
        piece in 1u64..100,
    ) {
        let mut source: Forks = vec![None; 3];
        for op in &before {
            apply(&mut source, op);
        }
        let mut stale = source.clone();
        let mut rec = MissedRecord::new(ChainVersion(1), [TargetId(2)].into(), ranges_max, u64::MAX);
        for op in &missed {
            apply(&mut source, op);
            record(&mut rec, op);
        }
        let copied = catch_up(&mut stale, &source, &rec, piece);
        prop_assert_eq!(&stale, &source);
        let held: u64 = source.iter().flatten().map(|f| f.len() as u64).sum();
        prop_assert!(copied <= held, "copied {} of {} bytes held", copied, held);
    }

    /// A record taken while a copy ran, absorbed back, loses no range.
    #[test]
    fn absorbing_a_taken_record_keeps_every_range(
        ops in prop::collection::vec(op(), 0..30),
        split in 0usize..30,
    ) {
        let mut whole = MissedRecord::new(ChainVersion(1), [TargetId(2)].into(), 8, u64::MAX);
        let mut first = whole.clone();
        for (i, op) in ops.iter().enumerate() {
            record(&mut whole, op);
            if i == split {
                let taken = first.take();
                first.absorb(&taken);
            }
            record(&mut first, op);
        }
        for (key, set) in whole.keys() {
            for range in set.iter() {
                let mine = &first.keys()[key];
                prop_assert!(mine.contains(range.offset) && mine.contains(range.end() - 1));
            }
        }
    }
}
