//! Errors found while validating or expanding a request shape.

/// What was wrong with a request shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    #[error("request expands to {pieces} pieces, over the limit pieces_per_request_max = {limit}")]
    TooManyPieces { pieces: u128, limit: u64 },
    #[error("request moves {bytes} bytes, over the limit request_bytes_max = {limit}")]
    TooManyBytes { bytes: u128, limit: u64 },
    #[error("{what} overflows 64-bit arithmetic")]
    Overflow { what: &'static str },
    #[error("piece {index} starts at {side} offset {offset}, before offset 0 (a negative stride runs past the start)")]
    BeforeStart { index: u64, side: &'static str, offset: i128 },
    #[error("piece {index} ends at {side} offset {end}, past the largest offset {max}")]
    PastEnd { index: u64, side: &'static str, end: i128, max: i64 },
    #[error("nested request has {levels} levels, over the limit of {limit}")]
    TooManyLevels { levels: usize, limit: usize },
    #[error("batched request nests {depth} deep, over the limit of {limit}")]
    TooDeep { depth: usize, limit: usize },
    #[error("request walks {steps} repetitions, too many for the limit pieces_per_request_max = {limit}")]
    TooManySteps { steps: u128, limit: u64 },
    #[error("{what} is empty")]
    Empty { what: &'static str },
}
