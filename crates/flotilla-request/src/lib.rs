//! Galley's structured requests (§5 of the Galley paper) as one type, [`Shape`], and their
//! expansion into [`Piece`]s: (file offset, memory offset, length) triples.
//!
//! Invariants kept here:
//! - [`Shape::validate`] refuses a shape whose piece count or byte count exceeds the given
//!   [`ShapeLimits`] *before* walking it, computing both with checked arithmetic, so a request
//!   for 2^60 records costs nothing but an error.
//! - After a shape validated, [`Shape::for_each_piece`] yields only pieces with
//!   `0 <= offset` and `offset + length <= i64::MAX` on both the file and the memory side.
//! - Relative offsets in batched requests follow Galley §5.3: the first element of a vector is
//!   relative to its parent's offset (the current repetition of the parent), every other
//!   element is relative to the offset of the element before it in the same vector.

mod batch;
mod error;
mod shape;

pub use batch::{take_decode_refusal, BatchNode, BatchSub, BATCH_DECODE_DEPTH_MAX};
pub use error::ShapeError;
pub use shape::{Piece, Shape, ShapeLimits, StrideLevel, Summary, BATCH_DEPTH_MAX, STRIDE_LEVELS_MAX};
