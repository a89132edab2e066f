//! Property tests of the layout math: every byte of a linear file maps to exactly one
//! (subfile, offset); adjacent ranges are consistent; `hash` spreads blocks evenly.

use flotilla_types::{FileId, Layout};
use proptest::prelude::*;
use std::collections::HashSet;

fn layouts() -> impl Strategy<Value = (Layout, u32)> {
    let stripe = (1u64..64, 0u32..6).prop_map(|(unit_bytes, count)| Layout::Stripe { unit_bytes, count });
    let hash = (1u64..32, 1u32..5, 0u32..6).prop_map(|(block_bytes, sequentiality, count)| Layout::Hash {
        block_bytes,
        sequentiality,
        count,
    });
    (prop_oneof![stripe, hash], 1u32..6)
}

proptest! {
    #[test]
    fn every_byte_maps_to_exactly_one_place((layout, subfiles) in layouts(), file in any::<u64>(), length in 0u64..2000) {
        let mut places = HashSet::new();
        let mut covered = 0;
        layout.for_each_extent(FileId(file), subfiles, 0, length, |extent| {
            assert!(extent.subfile < subfiles);
            assert_eq!(extent.linear_offset, covered, "extents come in order, without gaps");
            for i in 0..extent.length {
                assert!(places.insert((extent.subfile, extent.subfile_offset + i)), "two bytes share a place");
            }
            covered += extent.length;
        }).unwrap();
        prop_assert_eq!(covered, length);
    }

    #[test]
    fn adjacent_ranges_agree_with_the_whole((layout, subfiles) in layouts(), file in any::<u64>(), a in 0u64..500, b in 0u64..500) {
        let collect = |offset: u64, length: u64| {
            let mut bytes = Vec::new();
            layout.for_each_extent(FileId(file), subfiles, offset, length, |e| {
                for i in 0..e.length { bytes.push((e.subfile, e.subfile_offset + i)); }
            }).unwrap();
            bytes
        };
        let mut split = collect(0, a);
        split.extend(collect(a, b));
        prop_assert_eq!(split, collect(0, a + b));
    }
}

#[test]
fn hash_spreads_blocks_within_a_few_percent() {
    let subfiles = 8u32;
    let layout = Layout::Hash { block_bytes: 4096, sequentiality: 4, count: 0 };
    let groups = 200_000u64;
    let mut per_subfile = vec![0u64; subfiles as usize];
    for group in 0..groups {
        let (subfile, _, _) = layout.locate(FileId(0xfeed_f00d), subfiles, group * 4096 * 4).unwrap();
        per_subfile[subfile as usize] += 1;
    }
    let fair = groups as f64 / f64::from(subfiles);
    for count in per_subfile {
        let deviation = (count as f64 - fair).abs() / fair;
        assert!(deviation < 0.03, "subfile holds {count} of {groups} groups, {:.1}% off", deviation * 100.0);
    }
}

#[test]
fn hash_keeps_runs_of_sequentiality_blocks_together() {
    let layout = Layout::Hash { block_bytes: 100, sequentiality: 5, count: 0 };
    for run in 0..50u64 {
        let first = layout.locate(FileId(7), 6, run * 500).unwrap().0;
        for block in 1..5 {
            assert_eq!(layout.locate(FileId(7), 6, run * 500 + block * 100).unwrap().0, first);
        }
    }
}
