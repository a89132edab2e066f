//! Property tests of the pure parts: placement and the inode record decoder.

use flotilla_namespace::*;
use flotilla_types::TargetId;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// Live targets with distinct ids and arbitrary usage, some of them full.
fn live_targets() -> impl Strategy<Value = Vec<TargetUsage>> {
    prop::collection::btree_map(any::<u64>(), (any::<u64>(), 0u64..1000, any::<bool>()), 1..24).prop_map(
        |targets| {
            targets
                .into_iter()
                .map(|(id, (used_bytes, free_bytes, full))| TargetUsage {
                    target: TargetId(id),
                    used_bytes,
                    free_bytes: if full { 0 } else { free_bytes.saturating_add(used_bytes) },
                })
                .collect()
        },
    )
}

fn live_and_count() -> impl Strategy<Value = (Vec<TargetUsage>, usize, u64)> {
    live_targets().prop_flat_map(|live| {
        let n = live.len();
        (Just(live), 1..=n, any::<u64>())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn placement_is_distinct_live_and_complete((live, count, cursor) in live_and_count()) {
        let chosen = choose_targets(&live, count, cursor, &mut Spread::default()).unwrap();
        prop_assert_eq!(chosen.len(), count);
        let distinct: BTreeSet<TargetId> = chosen.iter().copied().collect();
        prop_assert_eq!(distinct.len(), count);
        for target in &chosen {
            prop_assert!(live.iter().any(|usage| usage.target == *target));
        }
        prop_assert_eq!(check_targets(&live, &chosen), Ok(()));
    }

    /// The same with placement's memory kept across a run of creates (as the service keeps
    /// it), the live set changing between them.
    #[test]
    fn placement_with_memory_stays_distinct_live_and_complete(
            runs in prop::collection::vec(live_and_count(), 1..8)) {
        let mut spread = Spread::default();
        for (live, count, cursor) in runs {
            let chosen = choose_targets(&live, count, cursor, &mut spread).unwrap();
            prop_assert_eq!(check_targets(&live, &chosen), Ok(()));
            prop_assert_eq!(chosen.len(), count);
        }
    }

    #[test]
    fn placement_prefers_targets_with_room((live, count, cursor) in live_and_count()) {
        let roomy = live.iter().filter(|usage| usage.has_room()).count();
        let chosen = choose_targets(&live, count, cursor, &mut Spread::default()).unwrap();
        let has_room = |target: &TargetId| {
            live.iter().any(|usage| usage.target == *target && usage.has_room())
        };
        let chosen_roomy = chosen.iter().filter(|target| has_room(target)).count();
        prop_assert_eq!(chosen_roomy, roomy.min(count));
    }

    #[test]
    fn placement_rotates_with_the_cursor(live in live_targets(), cursor in any::<u64>()) {
        let all_roomy: Vec<TargetUsage> = live
            .iter()
            .map(|usage| TargetUsage { used_bytes: 0, free_bytes: 1, ..*usage })
            .collect();
        let mut sorted: Vec<TargetId> = all_roomy.iter().map(|usage| usage.target).collect();
        sorted.sort();
        let first = choose_targets(&all_roomy, 1, cursor, &mut Spread::default()).unwrap();
        prop_assert_eq!(first[0], sorted[(cursor % sorted.len() as u64) as usize]);
    }

    #[test]
    fn placement_refuses_counts_out_of_range(live in live_targets(), extra in 1usize..5) {
        prop_assert_eq!(choose_targets(&live, 0, 0, &mut Spread::default()).unwrap_err().errno(), EINVAL);
        prop_assert_eq!(
            choose_targets(&live, live.len() + extra, 0, &mut Spread::default()),
            Err(NamespaceError::NotEnoughTargets { wanted: live.len() + extra, live: live.len() })
        );
    }

    /// Fuzz-style: any bytes with a valid checksum decode to an entry or to `Corrupt`.
    #[test]
    fn inode_decoder_never_panics(
        kind in 0u8..5,
        attrs in prop::collection::vec(any::<u8>(), 48),
        body in prop::collection::vec(small_byte(), 0..64),
    ) {
        let mut record = vec![1u8, kind];
        record.extend_from_slice(&attrs);
        record.extend_from_slice(&body);
        let crc = crc32c_of(&record);
        record.extend_from_slice(&crc.to_le_bytes());
        match decode_inode_record(&record) {
            Ok(_) => {}
            Err(error) => {
                let corrupt = matches!(error, NamespaceError::Corrupt { .. });
                prop_assert!(corrupt, "{}", error);
            }
        }
    }
}

/// Mostly bytes that make small lengths, counts, tags and flags, so decoding gets deep.
fn small_byte() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0u8), Just(1u8), Just(2u8), any::<u8>()]
}

/// CRC32C (Castagnoli), bitwise, so the test does not share the code under test.
fn crc32c_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn reference_crc_matches_the_standard_check_value() {
    assert_eq!(crc32c_of(b"123456789"), 0xe306_9283);
}
