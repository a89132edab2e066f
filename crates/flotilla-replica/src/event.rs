//! What the membership engine is told: heartbeats, the passing of time, finished resyncs and
//! operator requests. Times are milliseconds of the metadata service's monotonic clock.

use crate::ids::{ChainId, ChainVersion, Incarnation};
use flotilla_types::TargetId;

/// One input of [`Membership::handle`](crate::Membership::handle).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// `target`'s server, in its `incarnation`, reported in at `at_ms`.
    Heartbeat { target: TargetId, incarnation: Incarnation, at_ms: u64 },
    /// Time passed; silences are judged against `at_ms`.
    Tick { at_ms: u64 },
    /// `target` finished copying what it missed in `chain` at `version`.
    SyncDone { chain: ChainId, target: TargetId, version: ChainVersion },
    /// Operator: move everything off `target`, keeping it serving until replaced.
    Drain { target: TargetId },
    /// Operator: `target` is gone; replace it now.
    Remove { target: TargetId },
}
