//! The one request type that carries every shape, and its validation and expansion.

use crate::batch::{self, BatchNode};
use crate::error::ShapeError;
use serde::{Deserialize, Serialize};

/// Most levels a nested-strided request may have.
pub const STRIDE_LEVELS_MAX: usize = 32;
/// Deepest a batched request's tree may nest.
pub const BATCH_DEPTH_MAX: usize = 32;

/// One contiguous transfer: `length` bytes between `file_offset` in the fork and
/// `memory_offset` in the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Piece {
    pub file_offset: u64,
    pub memory_offset: u64,
    pub length: u64,
}

/// One level of a nested-strided request: repeat the inner pattern `count` times, moving
/// `file_stride` bytes in the file and `memory_stride` bytes in memory each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrideLevel {
    pub file_stride: i64,
    pub memory_stride: i64,
    pub count: u64,
}

/// A structured request on one fork (Galley §5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shape {
    /// `length` bytes at `file_offset`, to or from `memory_offset`.
    Contiguous { file_offset: u64, memory_offset: u64, length: u64 },
    /// `count` records of `record_bytes`; file and memory offsets move by their strides
    /// (either may be negative) after each record (`gfs_read_strided`).
    Strided {
        file_offset: u64,
        memory_offset: u64,
        record_bytes: u64,
        file_stride: i64,
        memory_stride: i64,
        count: u64,
    },
    /// Records of `record_bytes` repeated by `levels`, innermost level first
    /// (`gfs_read_nested`).
    Nested { file_offset: u64, memory_offset: u64, record_bytes: u64, levels: Vec<StrideLevel> },
    /// A vector of batch trees (`gfs_read_batched`, Galley §5.3).
    Batched { nodes: Vec<BatchNode> },
    /// Explicit (file offset, memory offset, length) triples (Galley §5.4).
    List { pieces: Vec<Piece> },
}

/// Limits applied when a shape is validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeLimits {
    pub pieces_max: u64,
    pub bytes_max: u64,
}

/// What a validated shape moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub piece_count: u64,
    pub total_bytes: u64,
    /// The lowest file byte touched (0 when nothing is moved).
    pub file_start: u64,
    /// One past the highest file byte touched (0 when nothing is moved).
    pub file_end: u64,
    /// One past the highest memory byte touched: the buffer must be at least this long.
    pub memory_end: u64,
}

/// Offsets as they are computed during a walk: wide enough that no sum of a few products of
/// 64-bit values can overflow silently.
pub(crate) type Wide = i128;

/// Pieces, bytes and walk steps (repetitions visited) of a shape or part of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Count {
    pub pieces: u128,
    pub bytes: u128,
    pub steps: u128,
}

impl Count {
    pub(crate) fn add(&self, other: &Count) -> Result<Count, ShapeError> {
        Ok(Count {
            pieces: checked(self.pieces.checked_add(other.pieces), "piece count")?,
            bytes: checked(self.bytes.checked_add(other.bytes), "byte count")?,
            steps: checked(self.steps.checked_add(other.steps), "step count")?,
        })
    }

    /// The count of `times` repetitions of `self`, each one step more.
    pub(crate) fn repeat(&self, times: u64) -> Result<Count, ShapeError> {
        let times = u128::from(times);
        let per_repetition = checked(self.steps.checked_add(1), "step count")?;
        Ok(Count {
            pieces: checked(self.pieces.checked_mul(times), "piece count")?,
            bytes: checked(self.bytes.checked_mul(times), "byte count")?,
            steps: checked(per_repetition.checked_mul(times), "step count")?,
        })
    }
}

fn checked(value: Option<u128>, what: &'static str) -> Result<u128, ShapeError> {
    value.ok_or(ShapeError::Overflow { what })
}

/// `base + repetition * stride`, refusing overflow.
pub(crate) fn step(base: Wide, repetition: u64, stride: i64) -> Result<Wide, ShapeError> {
    Wide::from(repetition)
        .checked_mul(Wide::from(stride))
        .and_then(|delta| base.checked_add(delta))
        .ok_or(ShapeError::Overflow { what: "strided offset" })
}

/// Walk steps allowed per piece allowed: a legitimate shape visits at most one node per
/// level of nesting for each piece it yields.
const STEPS_PER_PIECE_MAX: u64 = (BATCH_DEPTH_MAX as u64) + 2;

impl Shape {
    /// A plain contiguous transfer into or out of the start of a buffer.
    pub fn contiguous(file_offset: u64, length: u64) -> Shape {
        Shape::Contiguous { file_offset, memory_offset: 0, length }
    }

    /// Number of pieces, bytes and walk steps, computed without walking the shape.
    pub(crate) fn count(&self) -> Result<Count, ShapeError> {
        match self {
            Shape::Contiguous { length, .. } => Ok(Count { pieces: 1, bytes: u128::from(*length), steps: 1 }),
            Shape::Strided { record_bytes, count, .. } => {
                let record = Count { pieces: 1, bytes: u128::from(*record_bytes), steps: 0 };
                record.repeat(*count)
            }
            Shape::Nested { record_bytes, levels, .. } => nested_count(*record_bytes, levels),
            Shape::Batched { nodes } => batch::count_vector(nodes, 1),
            Shape::List { pieces } => list_count(pieces),
        }
    }

    /// Number of pieces and bytes the shape moves, computed without walking it.
    pub fn piece_and_byte_count(&self) -> Result<(u128, u128), ShapeError> {
        self.count().map(|count| (count.pieces, count.bytes))
    }

    /// Checks the shape against `limits` and every piece's offsets, and summarizes it.
    pub fn validate(&self, limits: &ShapeLimits) -> Result<Summary, ShapeError> {
        let count = self.count()?;
        if count.pieces > u128::from(limits.pieces_max) {
            return Err(ShapeError::TooManyPieces { pieces: count.pieces, limit: limits.pieces_max });
        }
        if count.bytes > u128::from(limits.bytes_max) {
            return Err(ShapeError::TooManyBytes { bytes: count.bytes, limit: limits.bytes_max });
        }
        let steps_max = u128::from(limits.pieces_max) * u128::from(STEPS_PER_PIECE_MAX) + 1;
        if count.steps > steps_max {
            return Err(ShapeError::TooManySteps { steps: count.steps, limit: limits.pieces_max });
        }
        if let Some(run) = self.checked_run() {
            return Ok(run.summary());
        }
        let mut summary = Summary::default();
        self.walk(&mut |file, memory, length| {
            let index = summary.piece_count;
            let file_end = check_side(index, "file", file, length)?;
            let memory_end = check_side(index, "memory", memory, length)?;
            if length > 0 {
                let first = summary.total_bytes == 0;
                summary.file_start = if first { file as u64 } else { summary.file_start.min(file as u64) };
            }
            summary.piece_count += 1;
            summary.total_bytes += length;
            summary.file_end = summary.file_end.max(file_end);
            summary.memory_end = summary.memory_end.max(memory_end);
            Ok(())
        })?;
        Ok(summary)
    }

    /// Calls `visit` for every piece in request order. Only meaningful after
    /// [`Shape::validate`] succeeded; before that, pieces with bad offsets are reported as
    /// errors rather than passed on.
    pub fn for_each_piece<E: From<ShapeError>>(
        &self,
        mut visit: impl FnMut(Piece) -> Result<(), E>,
    ) -> Result<(), E> {
        if let Some(run) = self.checked_run() {
            return run.for_each_piece(visit);
        }
        let mut index = 0u64;
        let mut outcome: Result<(), E> = Ok(());
        let walked = self.walk(&mut |file, memory, length| {
            check_side(index, "file", file, length)?;
            check_side(index, "memory", memory, length)?;
            index += 1;
            let piece = Piece { file_offset: file as u64, memory_offset: memory as u64, length };
            if let Err(error) = visit(piece) {
                outcome = Err(error);
                return Err(ShapeError::Empty { what: "stopped by visitor" });
            }
            Ok(())
        });
        outcome?;
        walked.map_err(E::from)
    }

    /// A strided shape whose first and last records lie inside both sides' bounds: every
    /// record between them does too (offsets move linearly), so it is summarized and walked
    /// without a check or an indirect call per record. `None` for other shapes, for no
    /// records, and when an end record is out of bounds (the general walk then names the
    /// first bad piece).
    fn checked_run(&self) -> Option<StridedRun> {
        let Shape::Strided { file_offset, memory_offset, record_bytes, file_stride, memory_stride, count } =
            *self
        else {
            return None;
        };
        let last = count.checked_sub(1)?;
        let (file, memory) = (Wide::from(file_offset), Wide::from(memory_offset));
        let file_last = step(file, last, file_stride).ok()?;
        let memory_last = step(memory, last, memory_stride).ok()?;
        for (offset, side) in
            [(file, "file"), (file_last, "file"), (memory, "memory"), (memory_last, "memory")]
        {
            check_side(0, side, offset, record_bytes).ok()?;
        }
        Some(StridedRun {
            file: file_offset,
            memory: memory_offset,
            file_last: file_last as u64,
            memory_last: memory_last as u64,
            record_bytes,
            file_stride,
            memory_stride,
            count,
        })
    }

    /// Collects every piece (for tests and small requests).
    pub fn pieces(&self) -> Result<Vec<Piece>, ShapeError> {
        let mut out = Vec::new();
        self.for_each_piece(|piece| {
            out.push(piece);
            Ok::<(), ShapeError>(())
        })?;
        Ok(out)
    }

    fn walk(
        &self,
        visit: &mut dyn FnMut(Wide, Wide, u64) -> Result<(), ShapeError>,
    ) -> Result<(), ShapeError> {
        match self {
            Shape::Contiguous { file_offset, memory_offset, length } => {
                visit(Wide::from(*file_offset), Wide::from(*memory_offset), *length)
            }
            Shape::Strided {
                file_offset,
                memory_offset,
                record_bytes,
                file_stride,
                memory_stride,
                count,
            } => {
                let level =
                    StrideLevel { file_stride: *file_stride, memory_stride: *memory_stride, count: *count };
                walk_nested(*file_offset, *memory_offset, *record_bytes, &[level], visit)
            }
            Shape::Nested { file_offset, memory_offset, record_bytes, levels } => {
                walk_nested(*file_offset, *memory_offset, *record_bytes, levels, visit)
            }
            Shape::Batched { nodes } => batch::walk_vector(nodes, 0, 0, 1, visit),
            Shape::List { pieces } => {
                for piece in pieces {
                    visit(Wide::from(piece.file_offset), Wide::from(piece.memory_offset), piece.length)?;
                }
                Ok(())
            }
        }
    }
}

/// A strided shape's records, both end records checked to lie in `0..=i64::MAX` on both
/// sides (so every record between them does).
struct StridedRun {
    file: u64,
    memory: u64,
    file_last: u64,
    memory_last: u64,
    record_bytes: u64,
    file_stride: i64,
    memory_stride: i64,
    count: u64,
}

impl StridedRun {
    fn summary(&self) -> Summary {
        let moves_bytes = self.record_bytes > 0;
        Summary {
            piece_count: self.count,
            // Within the limits already checked, so it fits.
            total_bytes: self.count * self.record_bytes,
            file_start: if moves_bytes { self.file.min(self.file_last) } else { 0 },
            file_end: self.file.max(self.file_last) + self.record_bytes,
            memory_end: self.memory.max(self.memory_last) + self.record_bytes,
        }
    }

    fn for_each_piece<E>(&self, mut visit: impl FnMut(Piece) -> Result<(), E>) -> Result<(), E> {
        // Every offset visited lies between the checked end records; the step after the last
        // record is never used, so it may wrap.
        let (mut file, mut memory) = (self.file, self.memory);
        for _ in 0..self.count {
            visit(Piece { file_offset: file, memory_offset: memory, length: self.record_bytes })?;
            file = file.wrapping_add_signed(self.file_stride);
            memory = memory.wrapping_add_signed(self.memory_stride);
        }
        Ok(())
    }
}

/// Checks one side of a piece and returns its end offset.
fn check_side(index: u64, side: &'static str, offset: Wide, length: u64) -> Result<u64, ShapeError> {
    if offset < 0 {
        return Err(ShapeError::BeforeStart { index, side, offset });
    }
    let end = offset + Wide::from(length);
    if end > Wide::from(i64::MAX) {
        return Err(ShapeError::PastEnd { index, side, end, max: i64::MAX });
    }
    Ok(end as u64)
}

fn nested_count(record_bytes: u64, levels: &[StrideLevel]) -> Result<Count, ShapeError> {
    if levels.len() > STRIDE_LEVELS_MAX {
        return Err(ShapeError::TooManyLevels { levels: levels.len(), limit: STRIDE_LEVELS_MAX });
    }
    let mut count = Count { pieces: 1, bytes: u128::from(record_bytes), steps: 0 };
    for level in levels {
        count = count.repeat(level.count)?;
    }
    Ok(count)
}

fn list_count(pieces: &[Piece]) -> Result<Count, ShapeError> {
    let bytes = pieces.iter().map(|p| u128::from(p.length)).sum();
    let pieces = pieces.len() as u128;
    Ok(Count { pieces, bytes, steps: pieces })
}

/// Walks nested strides, outermost level slowest, innermost fastest.
fn walk_nested(
    file_offset: u64,
    memory_offset: u64,
    record_bytes: u64,
    levels: &[StrideLevel],
    visit: &mut dyn FnMut(Wide, Wide, u64) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    walk_levels(Wide::from(file_offset), Wide::from(memory_offset), record_bytes, levels, visit)
}

fn walk_levels(
    file: Wide,
    memory: Wide,
    record_bytes: u64,
    levels: &[StrideLevel],
    visit: &mut dyn FnMut(Wide, Wide, u64) -> Result<(), ShapeError>,
) -> Result<(), ShapeError> {
    let Some((outer, inner)) = levels.split_last() else {
        return visit(file, memory, record_bytes);
    };
    for repetition in 0..outer.count {
        let f = step(file, repetition, outer.file_stride)?;
        let m = step(memory, repetition, outer.memory_stride)?;
        walk_levels(f, m, record_bytes, inner, visit)?;
    }
    Ok(())
}
