//! Read-ahead for one open file (GPFS §2's sequential and strided prefetch), pure: no I/O.
//!
//! [`Detector`] watches a handle's reads. A read that starts where the last one ended is
//! sequential; reads of one size whose offsets advance by one constant stride (larger than
//! the size) are strided, once two strides in a row agree. When a pattern holds, the read
//! that finds its bytes missing is widened into one request for itself and the next `depth`
//! records of the pattern (one contiguous range, or one strided request), and `depth`
//! doubles while the pattern keeps holding (up to what `window_bytes_max` allows); a read
//! that breaks the pattern resets it. [`Window`] keeps what was fetched ahead, as pieces
//! by file offset, at most `window_bytes_max` bytes.
//!
//! Random access is recognised: after `RANDOM_AFTER_READS` reads in a row that continue no
//! pattern the handle is random ([`Detector::is_random`]), and a read that happens to start
//! where the last ended is then no pattern on its own: only a second read agreeing with it
//! (two sequential reads, or two equal strides) brings the read-ahead back. So a random
//! reader never has its reads widened, and the mount serves its reads without the handle's
//! read-ahead lock (several at once, as the kernel's asynchronous direct I/O sends them).
//!
//! So a program reading every 4th 4 KiB record of a shared file makes about N / depth
//! requests for N reads instead of N, and a sequential reader asks for ever larger ranges.
//! Coherence is close-to-open (NFS's): the window lives as long as the open file, and any
//! write through this mount to the file empties it (`generation`).

use std::collections::BTreeMap;

/// Deepest a pattern's prefetch gets, in records.
const DEPTH_MAX: u64 = 64;

/// Reads in a row that continue no pattern after which a handle counts as random.
pub const RANDOM_AFTER_READS: u32 = 3;

/// What to fetch with a missing read: `count` records of `record_bytes`, the first at
/// `offset`, each `stride_bytes` after the one before (contiguous when stride == record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch {
    pub offset: u64,
    pub record_bytes: u64,
    pub stride_bytes: u64,
    pub count: u64,
}

impl Fetch {
    pub fn is_contiguous(&self) -> bool {
        self.stride_bytes == self.record_bytes
    }

    pub fn bytes(&self) -> u64 {
        self.record_bytes * self.count
    }

    /// The same fetch with only the records that end at or before `size_bytes` (at least
    /// the first, which the caller already clipped).
    pub fn clipped(self, size_bytes: u64) -> Fetch {
        let fitting = if self.offset + self.record_bytes > size_bytes {
            1
        } else {
            (size_bytes - self.offset - self.record_bytes) / self.stride_bytes + 1
        };
        Fetch { count: self.count.min(fitting).max(1), ..self }
    }
}

/// The access pattern of one handle.
#[derive(Clone, Debug, Default)]
pub struct Detector {
    last: Option<(u64, u64)>,
    stride: Option<u64>,
    /// Consecutive reads that agreed with the pattern.
    agreeing: u32,
    depth: u64,
    /// Reads in a row that continued no pattern.
    missed: u32,
    /// The last read started where the one before it ended.
    sequential: bool,
}

impl Detector {
    /// Notes a read of `length` bytes at `offset` and says what to fetch for it: just the
    /// read, or the read and the next records of the pattern it continues.
    pub fn observe(&mut self, offset: u64, length: u64, window_bytes_max: u64) -> Fetch {
        let plain = Fetch { offset, record_bytes: length, stride_bytes: length, count: 1 };
        let Some((last_offset, last_length)) = self.last.replace((offset, length)) else {
            return plain;
        };
        let stride = offset.checked_sub(last_offset).filter(|s| *s > 0 && length == last_length);
        let sequential = offset == last_offset + last_length;
        let keeps = stride.is_some_and(|s| Some(s) == self.stride)
            || (sequential && self.sequential && self.stride == Some(length));
        self.sequential = sequential;
        self.stride = if sequential { Some(length) } else { stride };
        if !keeps {
            self.agreeing = 0;
            self.depth = 0;
            if !sequential || length == 0 {
                self.missed = self.missed.saturating_add(1);
                return plain;
            }
            // A sequential read needs no second witness — unless the reads before it were
            // random: one adjacent pair among random reads is chance.
            if self.is_random() {
                return plain;
            }
        }
        self.missed = 0;
        self.agreeing += 1;
        self.depth = (self.depth * 2).clamp(4, DEPTH_MAX);
        let stride_bytes = self.stride.unwrap_or(length);
        let records_max = (window_bytes_max / length.max(1)).max(1);
        Fetch { offset, record_bytes: length, stride_bytes, count: 1 + self.depth.min(records_max) }
    }

    /// Whether the last `RANDOM_AFTER_READS` reads or more continued no pattern.
    pub fn is_random(&self) -> bool {
        self.missed >= RANDOM_AFTER_READS
    }
}

/// Bytes fetched ahead for one handle, by file offset.
#[derive(Debug, Default)]
pub struct Window {
    pieces: BTreeMap<u64, Vec<u8>>,
    bytes: u64,
    /// The file's write generation when the pieces were fetched.
    pub generation: u64,
}

impl Window {
    /// Copies `length` bytes at `offset` out of one piece, if one holds them all, and drops
    /// the pieces that end at or before `offset` (read past).
    pub fn take(&mut self, offset: u64, length: u64) -> Option<Vec<u8>> {
        let (start, piece) = self.pieces.range(..=offset).next_back()?;
        let within = (offset - start) as usize;
        let hit = (within as u64 + length <= piece.len() as u64)
            .then(|| piece[within..within + length as usize].to_vec());
        let passed: Vec<u64> = self
            .pieces
            .range(..=offset)
            .filter(|(s, p)| **s + p.len() as u64 <= offset)
            .map(|(s, _)| *s)
            .collect();
        for start in passed {
            if let Some(piece) = self.pieces.remove(&start) {
                self.bytes -= piece.len() as u64;
            }
        }
        hit
    }

    /// Keeps `piece` at `offset`, dropping the oldest (lowest) pieces beyond `bytes_max`.
    pub fn keep(&mut self, offset: u64, piece: Vec<u8>, bytes_max: u64) {
        if piece.is_empty() || piece.len() as u64 > bytes_max {
            return;
        }
        self.bytes += piece.len() as u64;
        if let Some(old) = self.pieces.insert(offset, piece) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > bytes_max {
            let Some((_, oldest)) = self.pieces.pop_first() else { break };
            self.bytes -= oldest.len() as u64;
        }
    }

    pub fn clear(&mut self) {
        self.pieces.clear();
        self.bytes = 0;
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_strided_scan_is_fetched_in_growing_batches() {
        let mut detector = Detector::default();
        let (record, stride) = (4096u64, 4 * 4096u64);
        let fetches: Vec<Fetch> = (0..6).map(|i| detector.observe(i * stride, record, 1 << 20)).collect();
        assert_eq!(fetches[0].count, 1);
        assert_eq!(fetches[1].count, 1, "one stride is not a pattern yet");
        assert_eq!(
            fetches[2],
            Fetch { offset: 2 * stride, record_bytes: record, stride_bytes: stride, count: 5 }
        );
        assert_eq!(fetches[3].count, 9, "the depth doubles while the pattern holds");
        // A read off the pattern resets it.
        assert_eq!(detector.observe(7, record, 1 << 20).count, 1);
    }

    #[test]
    fn sequential_reads_fetch_ahead_at_once_within_the_window() {
        let mut detector = Detector::default();
        assert_eq!(detector.observe(0, 131_072, 1 << 20).count, 1);
        let second = detector.observe(131_072, 131_072, 1 << 20);
        assert!(second.is_contiguous());
        assert_eq!(second.count, 1 + 4);
        for i in 2..10 {
            let fetch = detector.observe(i * 131_072, 131_072, 1 << 20);
            assert!(fetch.bytes() <= (1 << 20) + 131_072, "{fetch:?}");
        }
    }

    #[test]
    fn clipping_keeps_whole_records_before_the_end() {
        let fetch = Fetch { offset: 0, record_bytes: 10, stride_bytes: 40, count: 9 };
        assert_eq!(fetch.clipped(95).count, 3, "records at 0, 40, 80 end by 90");
        assert_eq!(fetch.clipped(5).count, 1);
        assert_eq!(fetch.clipped(10_000).count, 9);
    }

    /// A few hundred reads at offsets of a simple generator's choosing (4 KiB records of a
    /// 1 GiB file), with now and then a read that starts where the last ended.
    fn random_offsets(count: usize) -> Vec<u64> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut offsets = Vec::new();
        for index in 0..count {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let next = match (index % 7 == 6, offsets.last()) {
                (true, Some(last)) => last + 4096,
                _ => (state >> 33) % (1 << 18) * 4096,
            };
            offsets.push(next);
        }
        offsets
    }

    #[test]
    fn a_random_reader_is_recognised_within_a_few_reads_and_never_widened() {
        let mut detector = Detector::default();
        for (index, offset) in random_offsets(500).into_iter().enumerate() {
            let fetch = detector.observe(offset, 4096, 8 << 20);
            assert_eq!(fetch.count, 1, "read {index} at {offset} widened: {fetch:?}");
            if index > RANDOM_AFTER_READS as usize {
                assert!(detector.is_random(), "read {index} not yet seen as random");
            }
        }
    }

    #[test]
    fn a_pattern_after_random_reads_brings_the_read_ahead_back() {
        let mut detector = Detector::default();
        for offset in random_offsets(20) {
            detector.observe(offset, 4096, 8 << 20);
        }
        assert!(detector.is_random());
        // Sequential again: the first adjacent read is chance, the second a pattern.
        let base = 1u64 << 30;
        assert_eq!(detector.observe(base, 4096, 8 << 20).count, 1);
        assert_eq!(detector.observe(base + 4096, 4096, 8 << 20).count, 1);
        assert!(detector.observe(base + 8192, 4096, 8 << 20).count > 1);
        assert!(!detector.is_random());
        // Random again, then strided: two equal strides in a row.
        for offset in random_offsets(10) {
            detector.observe(offset, 4096, 8 << 20);
        }
        assert!(detector.is_random());
        let stride = 16_384u64;
        let counts: Vec<u64> =
            (0..3).map(|i| detector.observe(base + i * stride, 4096, 8 << 20).count).collect();
        assert_eq!(counts[..2], [1, 1]);
        assert!(counts[2] > 1, "{counts:?}");
    }

    /// Whether read `index` continues the pattern of the reads before it: it starts where
    /// the last ended, or it is the second of two equal strides between reads of one size.
    fn continues(reads: &[(u64, u64)], index: usize) -> bool {
        let Some(before) = index.checked_sub(1).map(|i| reads[i]) else { return false };
        let (offset, length) = reads[index];
        if offset == before.0 + before.1 {
            return true;
        }
        let Some(earlier) = index.checked_sub(2).map(|i| reads[i]) else { return false };
        let stride = offset.checked_sub(before.0).filter(|s| *s > 0);
        length == before.1
            && before.1 == earlier.1
            && stride.is_some()
            && stride == before.0.checked_sub(earlier.0)
    }

    proptest! {
        /// Only a read that continues a pattern is widened, and after `RANDOM_AFTER_READS`
        /// reads that continued none never a read only because it starts where the last
        /// ended (after random reads a pattern must show twice, as a stride always must); a
        /// widened fetch starts with the read itself and stays within the window.
        #[test]
        fn only_a_pattern_is_widened_and_never_right_after_random_reads(
            steps in proptest::collection::vec((0u8..4, 0u64..64, 1u64..3), 1..80),
        ) {
            let mut reads: Vec<(u64, u64)> = Vec::new();
            for (kind, slot, records) in steps {
                let length = records * 4096;
                let offset = match (kind, reads.last()) {
                    (0, Some(last)) => last.0 + last.1,
                    (1, Some(last)) => last.0 + 4 * 4096,
                    _ => slot * 4096,
                };
                reads.push((offset, length));
            }
            let mut detector = Detector::default();
            for index in 0..reads.len() {
                let (offset, length) = reads[index];
                let fetch = detector.observe(offset, length, 64 << 10);
                if fetch.count == 1 {
                    continue;
                }
                prop_assert!(continues(&reads, index), "read {index} widened: {reads:?}");
                let after_random = index > RANDOM_AFTER_READS as usize
                    && (index - RANDOM_AFTER_READS as usize..index).all(|i| !continues(&reads, i));
                let sequential = offset == reads[index - 1].0 + reads[index - 1].1;
                prop_assert!(
                    !(after_random && sequential),
                    "read {index} widened right after random reads: {reads:?}"
                );
                prop_assert_eq!((fetch.offset, fetch.record_bytes), (offset, length));
                prop_assert!(fetch.bytes() <= (64 << 10) + length);
            }
        }

        /// The window returns exactly the bytes it was given (pieces that do not overlap, as
        /// fetches make them), never holds more than its bound, and a read it cannot serve
        /// whole is a miss.
        #[test]
        fn the_window_returns_what_it_kept(
            pieces in proptest::collection::vec((0u64..8, 1usize..16), 1..12),
            reads in proptest::collection::vec((0u64..200, 1u64..8), 1..30),
        ) {
            let mut window = Window::default();
            let mut file = vec![None::<u8>; 256];
            let mut at = 0u64;
            for (index, (gap, length)) in pieces.iter().enumerate() {
                at += gap;
                let piece: Vec<u8> = (0..*length).map(|i| (index * 31 + i) as u8).collect();
                window.keep(at, piece.clone(), 40);
                prop_assert!(window.bytes() <= 40);
                for (i, byte) in piece.iter().enumerate() {
                    file[at as usize + i] = Some(*byte);
                }
                at += *length as u64;
            }
            for (offset, length) in reads {
                if let Some(bytes) = window.take(offset, length) {
                    prop_assert_eq!(bytes.len() as u64, length);
                    for (i, byte) in bytes.iter().enumerate() {
                        prop_assert_eq!(file[offset as usize + i], Some(*byte));
                    }
                }
            }
        }
    }
}
