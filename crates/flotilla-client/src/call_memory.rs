//! The caller's buffer of one read call, lent piece by piece to the scatter targets of the
//! call's requests, so that each reply's data is read from the socket straight to where the
//! caller wants it (issue 12: no frame buffer, no scatter copy).
//!
//! Invariant: a `CallMemory` exists only for a call whose pieces do not overlap in memory and
//! lie inside the buffer; its targets are made from disjoint subsets of those pieces, so no
//! two targets (on this or another server's connection) ever share a byte. While it lives,
//! the buffer is borrowed exclusively and touched only through targets.

use flotilla_request::{Piece, Shape};
use flotilla_rpc::{check_disjoint, ScatterTarget, Segment};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// The buffer of one read call, whose pieces are known not to overlap.
pub(crate) struct CallMemory<'a> {
    base: NonNull<u8>,
    bytes: usize,
    _buffer: PhantomData<&'a mut [u8]>,
}

// SAFETY: a CallMemory is the exclusive borrow of a byte buffer; it writes through it only by
// the targets it makes, whose contract (`target`) keeps them on disjoint bytes.
unsafe impl Send for CallMemory<'_> {}
// SAFETY: shared use only makes targets (an `unsafe fn` whose callers keep them disjoint);
// nothing reads or writes the memory through `&CallMemory` itself.
unsafe impl Sync for CallMemory<'_> {}

impl<'a> CallMemory<'a> {
    /// Lends `buffer` to a call whose memory pieces are `pieces`: `None` if two of them
    /// overlap (or one lies past the buffer), and the call must copy instead.
    pub fn new(buffer: &'a mut [u8], pieces: impl Iterator<Item = Piece>) -> Option<CallMemory<'a>> {
        disjoint(pieces, buffer.len()).then(|| CallMemory::lend(buffer))
    }

    fn lend(buffer: &'a mut [u8]) -> CallMemory<'a> {
        CallMemory {
            base: NonNull::new(buffer.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            bytes: buffer.len(),
            _buffer: PhantomData,
        }
    }

    /// A call over a shape's pieces (already checked to lie inside `buffer`): contiguous
    /// and strided shapes are judged from their fields, others by their pieces.
    pub fn for_shape(buffer: &'a mut [u8], shape: &Shape) -> Option<CallMemory<'a>> {
        if let Some(disjoint) = disjoint_by_fields(shape) {
            return disjoint.then(|| CallMemory::lend(buffer));
        }
        let mut pieces = Vec::new();
        shape
            .for_each_piece(|piece| {
                pieces.push(piece);
                Ok::<(), flotilla_request::ShapeError>(())
            })
            .ok()?;
        CallMemory::new(buffer, pieces.into_iter())
    }

    /// The target for one request of the call: its pieces, in wire order.
    ///
    /// # Safety
    /// `pieces` must be pieces (or parts of pieces) of the call this memory was made for, and
    /// no other live target of this memory may cover any of them.
    pub unsafe fn target(&self, pieces: impl Iterator<Item = Piece>) -> Option<ScatterTarget> {
        let segments = pieces.map(segment).collect::<Option<Vec<Segment>>>()?;
        // SAFETY: the buffer is borrowed exclusively for 'a and used only through targets; the
        // pieces are inside it (checked in `new`) and shared with no other target (our
        // caller's promise), so every segment is valid, unshared memory while the target lives.
        unsafe { ScatterTarget::new(self.base, self.bytes, segments) }.ok()
    }
}

/// Whether a contiguous or strided shape's records are disjoint in memory (records a memory
/// stride apart, at least a record long, never overlap); `None` for other shapes.
fn disjoint_by_fields(shape: &Shape) -> Option<bool> {
    match shape {
        Shape::Contiguous { .. } => Some(true),
        Shape::Strided { record_bytes, memory_stride, count, .. } => {
            Some(*count <= 1 || memory_stride.unsigned_abs() >= *record_bytes)
        }
        _ => None,
    }
}

fn segment(piece: Piece) -> Option<Segment> {
    let offset = usize::try_from(piece.memory_offset).ok()?;
    let length = usize::try_from(piece.length).ok()?;
    Some(Segment { offset, length })
}

/// Whether the pieces lie inside `bytes` and do not overlap in memory.
fn disjoint(pieces: impl Iterator<Item = Piece>, bytes: usize) -> bool {
    let segments: Option<Vec<Segment>> = pieces.filter(|p| p.length > 0).map(segment).collect();
    segments.is_some_and(|segments| check_disjoint(&segments, bytes).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(memory_offset: u64, length: u64) -> Piece {
        Piece { file_offset: 0, memory_offset, length }
    }

    #[test]
    fn overlapping_pieces_get_no_memory() {
        let mut buffer = vec![0u8; 16];
        assert!(CallMemory::new(&mut buffer, [piece(0, 8), piece(8, 8)].into_iter()).is_some());
        assert!(CallMemory::new(&mut buffer, [piece(8, 8), piece(0, 8)].into_iter()).is_some());
        assert!(CallMemory::new(&mut buffer, [piece(0, 9), piece(8, 8)].into_iter()).is_none());
        assert!(CallMemory::new(&mut buffer, [piece(12, 8)].into_iter()).is_none());
        let overlapping_records = Shape::Strided {
            file_offset: 0,
            memory_offset: 0,
            record_bytes: 4,
            file_stride: 8,
            memory_stride: 2,
            count: 3,
        };
        assert!(CallMemory::for_shape(&mut buffer, &overlapping_records).is_none());
        let listed = Shape::List { pieces: vec![piece(4, 4), piece(0, 5)] };
        assert!(CallMemory::for_shape(&mut buffer, &listed).is_none());
        let backwards = Shape::Strided {
            file_offset: 0,
            memory_offset: 12,
            record_bytes: 4,
            file_stride: 4,
            memory_stride: -4,
            count: 4,
        };
        assert!(CallMemory::for_shape(&mut buffer, &backwards).is_some());
    }
}
