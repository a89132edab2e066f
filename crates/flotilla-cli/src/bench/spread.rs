//! RAMA §7.2 (Figs. 7-10 to 7-14): how evenly a workload's bytes fall on the disks, in space
//! (bytes per disk over a whole run) and in time (bytes per disk in each iteration), under
//! striping and under RAMA's hash.
//!
//! Pure computation at the thesis's own scale (64 and 256 disks, a 32 GB file, 24,576² and
//! 32,768² LU): each workload's byte ranges go through the same `Layout::for_each_extent` the
//! client library places data with, one subfile per disk, and the bytes each disk receives are
//! counted. No disk is timed: as in the thesis, a disk's share of the bytes is its share of
//! the requests (fixed-size blocks), and the busiest disk bounds the run. The temporal model
//! assumes a barrier per iteration (the thesis's iteration structure): an iteration lasts as
//! long as its busiest disk needs, so the efficiency of a run is the bytes moved over
//! (disks × Σ busiest disk's bytes per iteration) — 1 when every disk is busy all the time.

use flotilla_client::Layout;
use flotilla_types::FileId;

/// The file every workload addresses (the thesis's experiments use one file).
const FILE: FileId = FileId(0x5241_4d41);

/// Bytes per disk, in total and per iteration (step).
#[derive(Clone, Debug, PartialEq)]
pub struct Load {
    pub disks: u32,
    pub per_disk_bytes: Vec<u64>,
    /// `per_step[s][d]`: bytes disk `d` moved in step `s`.
    pub per_step: Vec<Vec<u64>>,
}

/// One contiguous access of a workload, in its step (iteration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub step: usize,
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

impl Load {
    /// Counts the bytes each of `disks` disks moves for `accesses` placed by `layout`.
    pub fn of(layout: Layout, disks: u32, steps: usize, accesses: impl Iterator<Item = Access>) -> Load {
        let mut per_step = vec![vec![0u64; disks as usize]; steps];
        for access in accesses {
            let row = &mut per_step[access.step];
            layout
                .for_each_extent(FILE, disks, access.offset_bytes, access.length_bytes, |extent| {
                    row[extent.subfile as usize] += extent.length;
                })
                .expect("a stripe or hash layout places every byte");
        }
        let mut per_disk_bytes = vec![0u64; disks as usize];
        for row in &per_step {
            for (total, bytes) in per_disk_bytes.iter_mut().zip(row) {
                *total += bytes;
            }
        }
        Load { disks, per_disk_bytes, per_step }
    }

    pub fn total_bytes(&self) -> u64 {
        self.per_disk_bytes.iter().sum()
    }

    pub fn mean_bytes(&self) -> f64 {
        self.total_bytes() as f64 / f64::from(self.disks)
    }

    /// The busiest disk's bytes over the mean (the thesis's loss against ideal striping).
    pub fn max_over_mean(&self) -> f64 {
        self.per_disk_bytes.iter().copied().max().unwrap_or(0) as f64 / self.mean_bytes().max(1.0)
    }

    /// The idlest disk's bytes over the mean.
    pub fn min_over_mean(&self) -> f64 {
        self.per_disk_bytes.iter().copied().min().unwrap_or(0) as f64 / self.mean_bytes().max(1.0)
    }

    /// The busiest disk's bytes over the idlest's (Fig. 7-10's "factor of 2.5").
    pub fn max_over_min(&self) -> f64 {
        let min = self.per_disk_bytes.iter().copied().min().unwrap_or(0);
        let max = self.per_disk_bytes.iter().copied().max().unwrap_or(0);
        max as f64 / (min.max(1)) as f64
    }

    /// Bytes moved over (disks × Σ per step of the busiest disk's bytes): the fraction of the
    /// disks' time spent moving data when each step waits for its busiest disk.
    pub fn temporal_efficiency(&self) -> f64 {
        let busiest: u64 = self.per_step.iter().map(|row| row.iter().copied().max().unwrap_or(0)).sum();
        self.total_bytes() as f64 / (f64::from(self.disks) * busiest.max(1) as f64)
    }

    /// Mean over steps of the fraction of disks that move nothing in the step.
    pub fn idle_fraction(&self) -> f64 {
        let moving: Vec<&Vec<u64>> = self.per_step.iter().filter(|row| row.iter().any(|b| *b > 0)).collect();
        let idle: f64 = moving
            .iter()
            .map(|row| row.iter().filter(|b| **b == 0).count() as f64 / f64::from(self.disks))
            .sum();
        idle / moving.len().max(1) as f64
    }
}

/// A whole-file read in `request_bytes` requests (Fig. 7-11), one step.
pub fn whole_read(file_bytes: u64, request_bytes: u64) -> impl Iterator<Item = Access> {
    (0..file_bytes.div_ceil(request_bytes)).map(move |i| Access {
        step: 0,
        offset_bytes: i * request_bytes,
        length_bytes: request_bytes.min(file_bytes - i * request_bytes),
    })
}

/// Out-of-core LU (Fig. 5-8) on an `order`² matrix of doubles stored by columns, in segments
/// of `segment_columns` columns: for each segment, read it, read the part below the diagonal
/// of every segment to its left, write it. One step per segment.
pub fn lu(order: u64, segment_columns: u64) -> (usize, Vec<Access>) {
    let column_bytes = order * 8;
    let segments = order.div_ceil(segment_columns);
    let segment_bytes = segment_columns * column_bytes;
    let mut accesses = Vec::new();
    for segment in 0..segments {
        let step = segment as usize;
        let whole = Access { step, offset_bytes: segment * segment_bytes, length_bytes: segment_bytes };
        accesses.push(whole);
        for previous in 0..segment {
            let skip_bytes = previous * segment_columns * 8;
            for column in 0..segment_columns {
                accesses.push(Access {
                    step,
                    offset_bytes: previous * segment_bytes + column * column_bytes + skip_bytes,
                    length_bytes: column_bytes - skip_bytes,
                });
            }
        }
        accesses.push(whole);
    }
    (segments as usize, accesses)
}

/// Fig. 7-13's workload: `nodes` processors read a file, `chunk_bytes` each per iteration, in
/// iteration-sequential order (iteration i, node n reads chunk i·N + n) or node-sequential
/// order (node n reads chunk i of its own 1/N of the file). One step per iteration.
pub fn iterations(
    file_bytes: u64,
    nodes: u64,
    chunk_bytes: u64,
    node_sequential: bool,
) -> (usize, Vec<Access>) {
    let iterations = file_bytes / (nodes * chunk_bytes);
    let mut accesses = Vec::new();
    for iteration in 0..iterations {
        for node in 0..nodes {
            let offset_bytes = if node_sequential {
                node * (file_bytes / nodes) + iteration * chunk_bytes
            } else {
                (iteration * nodes + node) * chunk_bytes
            };
            accesses.push(Access { step: iteration as usize, offset_bytes, length_bytes: chunk_bytes });
        }
    }
    (iterations as usize, accesses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(text: &str) -> Layout {
        Layout::parse(text).expect("layout")
    }

    proptest! {
        /// Every byte of every access is counted once, on some disk, in its step.
        #[test]
        fn every_byte_is_counted_once(
            unit_kib in 1u64..64,
            disks in 1u32..20,
            hash in any::<bool>(),
            accesses in proptest::collection::vec((0usize..4, 0u64..1 << 22, 1u64..1 << 18), 1..40),
        ) {
            let layout = if hash { layout(&format!("hash:{unit_kib}k")) } else { layout(&format!("stripe:{unit_kib}k")) };
            let list: Vec<Access> = accesses
                .iter()
                .map(|&(step, offset_bytes, length_bytes)| Access { step, offset_bytes, length_bytes })
                .collect();
            let load = Load::of(layout, disks, 4, list.iter().copied());
            let expected: u64 = list.iter().map(|a| a.length_bytes).sum();
            prop_assert_eq!(load.total_bytes(), expected);
            for step in 0..4 {
                let in_step: u64 = list.iter().filter(|a| a.step == step).map(|a| a.length_bytes).sum();
                prop_assert_eq!(load.per_step[step].iter().sum::<u64>(), in_step);
            }
            prop_assert!(load.max_over_mean() >= 1.0 - 1e-9);
            prop_assert!(load.min_over_mean() <= 1.0 + 1e-9);
            prop_assert!(load.temporal_efficiency() <= 1.0 + 1e-9);
        }
    }

    #[test]
    fn a_whole_number_of_stripes_is_spread_evenly() {
        let load = Load::of(layout("stripe:64k"), 8, 1, whole_read(8 * 64 * 1024 * 10, 32 * 1024));
        assert!(load.per_disk_bytes.iter().all(|b| *b == 64 * 1024 * 10), "{:?}", load.per_disk_bytes);
        assert_eq!(load.max_over_min(), 1.0);
    }

    #[test]
    fn node_order_on_aligned_stripes_keeps_every_node_on_one_disk() {
        // 16 nodes, 1 MiB each per iteration, 2 MiB stripes on 16 disks: each node's region
        // starts on disk 0, so in every iteration all nodes hit the same disk (Fig. 7-13).
        let (steps, accesses) = iterations(1 << 30, 16, 1 << 20, true);
        let node = Load::of(layout("stripe:2m"), 16, steps, accesses.into_iter());
        assert!((node.idle_fraction() - 15.0 / 16.0).abs() < 1e-9, "{}", node.idle_fraction());
        let (steps, accesses) = iterations(1 << 30, 16, 1 << 20, false);
        let iteration = Load::of(layout("stripe:2m"), 16, steps, accesses.into_iter());
        // Iteration order: 16 MiB per iteration covers 8 of the 16 disks.
        assert!((iteration.idle_fraction() - 0.5).abs() < 1e-9, "{}", iteration.idle_fraction());
        assert!((iteration.temporal_efficiency() / node.temporal_efficiency() - 8.0).abs() < 1e-9);
    }

    #[test]
    fn lu_reads_the_lower_parts_of_earlier_segments() {
        let (steps, accesses) = lu(8, 2);
        assert_eq!(steps, 4);
        // Segment 1 reads segment 0's two columns from row 0 (skip 0) → 64 bytes each.
        let lower: Vec<&Access> = accesses.iter().filter(|a| a.step == 1 && a.length_bytes == 64).collect();
        assert_eq!(lower.len(), 2, "segment 0's two columns, whole");
        assert_eq!(accesses.iter().filter(|a| a.step == 1 && a.length_bytes == 128).count(), 2);
        // Segment 3 reads segment 2's columns below row 4: 4 rows of 8 bytes each.
        assert!(accesses
            .iter()
            .any(|a| a.step == 3 && a.offset_bytes == 2 * 128 + 32 && a.length_bytes == 32));
    }
}
