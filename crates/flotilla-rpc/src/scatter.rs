//! Caller memory a reply's data section is read into straight from the socket (issue 12:
//! no frame buffer and no copy out of it).
//!
//! A [`ScatterTarget`] names segments of memory the caller owns, in the order the reply's
//! data fills them. [`crate::Connection::call_into`] lends it to the connection's reader for
//! one call: the reader reads the data section into the segments only while it holds the
//! target's lock and the call still owns it (a call that ends, times out or is dropped takes
//! the target back under that lock first, and the reader reads the rest of the frame into a
//! scratch buffer), and feeds every byte to the frame's check right after receiving it, so
//! the call returns success only for verified bytes.
//!
//! Invariants: segments never overlap and lie inside the memory the creator vouched for;
//! a target is written through only by the reader holding its lock, or through `&mut self`.

use flotilla_auth::wire::PayloadCheck;
use std::io::{self, IoSliceMut};
use std::ptr::NonNull;
use tokio::net::tcp::OwnedReadHalf;

/// Most segments handed to one vectored read.
const IOVECS_MAX: usize = 64;
/// Replies with less data than this are read into the frame buffer and copied: below it the
/// copy costs less than the extra `recv` of reading body and data apart.
const SCATTER_DATA_BYTES_MIN: u64 = 16 << 10;
/// Targets whose segments are shorter than this on average are filled by copy: the frame
/// check would be fed in pieces too small for BLAKE3's many-chunk SIMD path, and `readv`
/// would move a few bytes per segment.
const SCATTER_SEGMENT_BYTES_MIN: u64 = 4 << 10;
/// Bytes of a frame read at a time when its target has been taken back.
const DISCARD_BYTES_MAX: usize = 64 << 10;

/// One run of caller memory: `length` bytes at `offset` from the target's base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: usize,
    pub length: usize,
}

/// Where one reply's data section goes: segments of caller memory, in wire order.
#[derive(Debug)]
pub struct ScatterTarget {
    base: NonNull<u8>,
    /// Non-empty, non-overlapping, adjacent runs merged.
    segments: Vec<Segment>,
    data_bytes: u64,
}

// SAFETY: a target is a pointer and its segments; its creator promised (see `new`) that the
// memory is valid and used by nothing else while the target lives, whatever thread uses it.
unsafe impl Send for ScatterTarget {}

/// Why a target cannot be made from a list of segments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    #[error("segment {offset}+{length} ends past the memory ({memory_bytes} bytes)")]
    OutOfBounds { offset: usize, length: usize, memory_bytes: usize },
    #[error("segments overlap at byte {offset}")]
    Overlap { offset: usize },
    #[error("{given} data bytes for a target of {expected}")]
    Length { given: u64, expected: u64 },
}

impl ScatterTarget {
    /// A target over `segments` (wire order) of the `memory_bytes` bytes at `base`; refuses
    /// segments outside that memory or overlapping each other.
    ///
    /// # Safety
    /// Every byte of every segment must be valid for writes, and neither read nor written by
    /// anything but this target (nor by another target), from this call until the target is
    /// dropped.
    pub unsafe fn new(
        base: NonNull<u8>,
        memory_bytes: usize,
        segments: impl IntoIterator<Item = Segment>,
    ) -> Result<ScatterTarget, SegmentError> {
        let segments = merged(segments);
        check_disjoint(&segments, memory_bytes)?;
        let data_bytes = segments.iter().map(|s| s.length as u64).sum();
        Ok(ScatterTarget { base, segments, data_bytes })
    }

    /// Bytes the reply's data section must have to land here.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Whether a reply is worth reading straight in here rather than into the frame buffer
    /// and copying: enough data, in segments long enough (see the constants).
    pub fn scatters(&self) -> bool {
        let segments = self.segments.len().max(1) as u64;
        self.data_bytes >= SCATTER_DATA_BYTES_MIN && self.data_bytes / segments >= SCATTER_SEGMENT_BYTES_MIN
    }

    /// The segments, adjacent runs merged.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Copies packed `data` (segment order) into the segments: for a reply that arrived in a
    /// frame buffer (an encrypted one).
    pub fn fill_from(&mut self, data: &[u8]) -> Result<(), SegmentError> {
        if data.len() as u64 != self.data_bytes {
            return Err(SegmentError::Length { given: data.len() as u64, expected: self.data_bytes });
        }
        let mut at = 0;
        for index in 0..self.segments.len() {
            let length = self.segments[index].length;
            self.slice_mut(index).copy_from_slice(&data[at..at + length]);
            at += length;
        }
        Ok(())
    }

    fn slice_mut(&mut self, index: usize) -> &mut [u8] {
        let segment = self.segments[index];
        // SAFETY: `new`'s contract: the segment is inside memory valid for writes that nothing
        // else uses while the target lives; `&mut self` makes this the only slice of it.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(segment.offset), segment.length) }
    }

    /// Reads what the socket has ready (at most the data left) into the segments from
    /// `cursor` on, feeding every byte received to `check`; `WouldBlock` if nothing is ready.
    pub(crate) fn try_read(
        &mut self,
        source: &OwnedReadHalf,
        cursor: &mut Cursor,
        check: &mut PayloadCheck,
    ) -> io::Result<usize> {
        let received = {
            let mut slices = self.slices_from(*cursor);
            source.try_read_vectored(&mut slices)?
        };
        let mut left = received;
        while left > 0 {
            let (index, skip) = (cursor.segment, cursor.offset_in_segment);
            let taken = (self.segments[index].length - skip).min(left);
            check.update(&self.slice_mut(index)[skip..skip + taken]);
            cursor.advance(taken, self.segments[index].length);
            left -= taken;
        }
        Ok(received)
    }

    /// Up to [`IOVECS_MAX`] slices of the memory from `cursor` on.
    fn slices_from(&mut self, cursor: Cursor) -> Vec<IoSliceMut<'_>> {
        let base = self.base.as_ptr();
        let first = cursor.segment;
        let last = self.segments.len().min(first + IOVECS_MAX);
        self.segments[first..last]
            .iter()
            .enumerate()
            .map(|(index, segment)| {
                let skip = if index == 0 { cursor.offset_in_segment } else { 0 };
                // SAFETY: `new`'s contract (valid, unshared memory); the segments do not
                // overlap, so these slices are disjoint, and they live only as long as the
                // `&mut self` borrow.
                let slice = unsafe {
                    std::slice::from_raw_parts_mut(base.add(segment.offset + skip), segment.length - skip)
                };
                IoSliceMut::new(slice)
            })
            .collect()
    }
}

/// Where a streamed read stands in a target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    segment: usize,
    offset_in_segment: usize,
}

impl Cursor {
    fn advance(&mut self, bytes: usize, segment_length: usize) {
        self.offset_in_segment += bytes;
        if self.offset_in_segment == segment_length {
            self.segment += 1;
            self.offset_in_segment = 0;
        }
    }
}

/// Reads what the socket has ready (at most `left` bytes) into a scratch buffer and feeds
/// it to `check`: the rest of a frame whose target was taken back.
pub(crate) fn try_discard(
    source: &OwnedReadHalf,
    scratch: &mut Vec<u8>,
    left: u64,
    check: &mut PayloadCheck,
) -> io::Result<usize> {
    scratch.resize(DISCARD_BYTES_MAX.min(left as usize), 0);
    let received = source.try_read(scratch)?;
    check.update(&scratch[..received]);
    Ok(received)
}

/// The segments without empty ones, runs adjacent in memory and in order merged.
fn merged(segments: impl IntoIterator<Item = Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for segment in segments.into_iter().filter(|s| s.length > 0) {
        match out.last_mut() {
            Some(last) if last.offset.checked_add(last.length) == Some(segment.offset) => {
                last.length += segment.length;
            }
            _ => out.push(segment),
        }
    }
    out
}

/// Refuses segments past `memory_bytes` or overlapping; one pass when they ascend (the usual
/// case), else a sort of their starts.
pub fn check_disjoint(segments: &[Segment], memory_bytes: usize) -> Result<(), SegmentError> {
    let mut ascending = true;
    let mut end_previous = 0usize;
    for segment in segments {
        let end = segment.offset.checked_add(segment.length).filter(|end| *end <= memory_bytes);
        let Some(end) = end else {
            let (offset, length) = (segment.offset, segment.length);
            return Err(SegmentError::OutOfBounds { offset, length, memory_bytes });
        };
        ascending &= segment.offset >= end_previous;
        end_previous = end;
    }
    if ascending {
        return Ok(());
    }
    let mut sorted: Vec<(usize, usize)> = segments.iter().map(|s| (s.offset, s.offset + s.length)).collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|pair| pair[1].0 < pair[0].1) {
        Some(pair) => Err(SegmentError::Overlap { offset: pair[1].0 }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(offset: usize, length: usize) -> Segment {
        Segment { offset, length }
    }

    #[test]
    fn adjacent_runs_merge_and_empty_ones_vanish() {
        let out = merged([segment(0, 4), segment(4, 4), segment(0, 0), segment(10, 2), segment(8, 2)]);
        assert_eq!(out, vec![segment(0, 8), segment(10, 2), segment(8, 2)]);
    }

    #[test]
    fn overlaps_and_overruns_are_refused() {
        assert_eq!(check_disjoint(&[segment(10, 2), segment(0, 10)], 12), Ok(()));
        assert_eq!(
            check_disjoint(&[segment(10, 2), segment(0, 11)], 12),
            Err(SegmentError::Overlap { offset: 10 })
        );
        assert!(matches!(
            check_disjoint(&[segment(0, 4), segment(3, 2)], 12),
            Err(SegmentError::Overlap { .. })
        ));
        assert!(matches!(check_disjoint(&[segment(8, 5)], 12), Err(SegmentError::OutOfBounds { .. })));
        assert!(matches!(
            check_disjoint(&[segment(usize::MAX, 5)], 12),
            Err(SegmentError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn fill_from_places_packed_bytes_in_segment_order() {
        let mut memory = vec![0u8; 10];
        let base = NonNull::new(memory.as_mut_ptr()).unwrap();
        // SAFETY: `memory` outlives the target and is not used while the target lives.
        let mut target = unsafe { ScatterTarget::new(base, 10, [segment(6, 3), segment(0, 2)]) }.unwrap();
        assert_eq!(target.data_bytes(), 5);
        assert!(!target.scatters(), "5 bytes are copied, not scattered");
        assert!(target.fill_from(b"abcdef").is_err(), "a wrong length was placed");
        target.fill_from(b"abcde").unwrap();
        drop(target);
        assert_eq!(&memory, b"de\0\0\0\0abc\0");
    }

    #[test]
    fn only_long_segments_scatter() {
        let mut memory = vec![0u8; 1 << 20];
        let base = NonNull::new(memory.as_mut_ptr()).unwrap();
        let target = |segments: Vec<Segment>| {
            // SAFETY: `memory` outlives every target made here, and each is dropped before the next.
            unsafe { ScatterTarget::new(base, 1 << 20, segments) }.unwrap().scatters()
        };
        assert!(target(vec![Segment { offset: 0, length: 1 << 20 }]));
        let records = |length: usize| (0..64).map(move |i| Segment { offset: i * 8192, length }).collect();
        assert!(target(records(4096)), "64 records of 4 KiB");
        assert!(!target(records(256)), "64 records of 256 bytes");
    }
}
