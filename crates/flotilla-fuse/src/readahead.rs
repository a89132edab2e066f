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
//! So a program reading every 4th 4 KiB record of a shared file makes about N / depth
//! requests for N reads instead of N, and a sequential reader asks for ever larger ranges.
//! Coherence is close-to-open (NFS's): the window lives as long as the open file, and any
//! write through this mount to the file empties it (`generation`).

use std::collections::BTreeMap;

/// Deepest a pattern's prefetch gets, in records.
const DEPTH_MAX: u64 = 64;

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
        let keeps =
            stride.is_some_and(|s| Some(s) == self.stride) || (sequential && self.stride == Some(length));
        self.stride = if sequential { Some(length) } else { stride };
        if !keeps {
            self.agreeing = 0;
            self.depth = 0;
            // A sequential read needs no second witness: fetch ahead at once.
            if !sequential || length == 0 {
                return plain;
            }
        }
        self.agreeing += 1;
        self.depth = (self.depth * 2).clamp(4, DEPTH_MAX);
        let stride_bytes = self.stride.unwrap_or(length);
        let records_max = (window_bytes_max / length.max(1)).max(1);
        Fetch { offset, record_bytes: length, stride_bytes, count: 1 + self.depth.min(records_max) }
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

    proptest! {
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
