//! What can be wrong with a frame, or with the budget a frame is read under. Below both
//! `frame.rs` and `budget.rs`.

use crate::VERSION;

/// What was wrong with a frame.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame does not start with the magic bytes FLOT (found {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error("frame header checksum mismatch (computed {computed:08x}, frame says {stored:08x})")]
    HeaderChecksum { computed: u32, stored: u32 },
    #[error("frame payload checksum mismatch in request {request_id} (computed {computed:08x}, frame says {stored:08x})")]
    PayloadChecksum { request_id: u64, computed: u32, stored: u32 },
    #[error("unsupported protocol version {found}; this build speaks version {VERSION}")]
    UnsupportedVersion { found: u16 },
    #[error("frame of {bytes} bytes is over the limit frame_bytes_max = {limit}")]
    TooLarge { bytes: u64, limit: u32 },
    #[error("frame is truncated: {needed} bytes needed, {available} available")]
    Truncated { needed: u64, available: u64 },
    #[error("cannot decode {what}: {message}")]
    Decode { what: &'static str, message: String },
    #[error("cannot encode message: {message}")]
    Encode { message: String },
    #[error("connection closed")]
    Closed,
    #[error("connection idle for {ms} ms with nothing in flight (idle_timeout_ms)")]
    IdleTimeout { ms: u64 },
    #[error("frame not complete within {ms} ms of its first byte (frame_read_timeout_ms)")]
    FrameTimeout { ms: u64 },
    #[error("peer stalled: fewer than {bytes_min} bytes moved in {ms} ms (progress_bytes_min, progress_interval_ms)")]
    Stalled { ms: u64, bytes_min: u64 },
    #[error("{0}")]
    Integrity(String),
    #[error("frame memory budget is closed")]
    BudgetClosed,
    #[error("connection I/O failed: {0}")]
    Io(#[from] std::io::Error),
}
