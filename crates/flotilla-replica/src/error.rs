//! Typed errors of the pure core; each names what was wrong and the bound it broke.

/// Why chains cannot be built or chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    #[error("{wanted} replicas need {wanted} distinct failure groups, but only {have} have live targets")]
    NotEnoughFailureGroups { wanted: usize, have: usize },
    #[error("replica count {replicas} is outside 1..={max}")]
    ReplicasOutOfRange { replicas: usize, max: usize },
    #[error("chains_per_target {chains} is outside 1..={max}")]
    ChainsPerTargetOutOfRange { chains: usize, max: usize },
    #[error("{wanted} chains would exceed chains_max = {max}")]
    TooManyChains { wanted: usize, max: usize },
    #[error("a file of {wanted} subfiles needs {wanted} chains with disjoint members; only {found} could be found")]
    NotEnoughDisjointChains { wanted: usize, found: usize },
    #[error("a failure group name must have 1 to {max} bytes, not {name_bytes}")]
    FailureGroupName { name_bytes: usize, max: usize },
    #[error("target {target} is already known")]
    TargetExists { target: flotilla_types::TargetId },
}

/// Why a range set cannot be used or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeError {
    #[error("range set encoding version {found} is not {expected}")]
    Version { found: u8, expected: u8 },
    #[error("range set encoding is truncated: {needed} bytes needed, {have} left")]
    Truncated { needed: usize, have: usize },
    #[error("range set encoding holds {count} ranges, over ranges_per_fork_max = {max}")]
    TooMany { count: u64, max: usize },
    #[error("range set encoding has {extra} bytes after its last range")]
    Trailing { extra: usize },
    #[error("range set encoding is not sorted, merged and non-empty at range {index}")]
    Unordered { index: usize },
    #[error("range at {offset} of {length} bytes overflows a 64-bit offset")]
    Overflow { offset: u64, length: u64 },
}

/// Why a membership configuration cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("fence_after_ms ({fence}) must exceed lease_ms ({lease}) + clock_margin_ms ({margin}), so a cut-off server's lease runs out before it is fenced")]
    FenceBeforeLease { fence: u64, lease: u64, margin: u64 },
    #[error("dead_after_ms ({dead}) must be at least fence_after_ms ({fence})")]
    DeadBeforeFence { dead: u64, fence: u64 },
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
}
