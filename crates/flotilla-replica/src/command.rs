//! What the membership engine asks the metadata service to do: persist and announce a chain
//! change, tell a copy source to start a resync, start a rebuild onto a replacement. The
//! service persists every `ChainChanged` before it answers anyone with the new version.

use crate::ids::{ChainId, ChainVersion};
use crate::member::Member;
use flotilla_types::TargetId;

/// What a resync copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncScope {
    /// The ranges serving members recorded since the member left at this version, plus the
    /// ranges the member itself holds unsettled (see `docs/architecture-log.md`,
    /// "What a returning member misses").
    MissedSince(ChainVersion),
    /// Every fork of every subfile on the chain (a replacement).
    Full,
}

/// One output of [`Membership::handle`](crate::Membership::handle).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `chain` is now at `version` with `members`: persist, then announce.
    ChainChanged { chain: ChainId, version: ChainVersion, members: Vec<Member> },
    /// `from` (the last serving member) copies `to` what it needs, at `version`.
    StartResync { chain: ChainId, version: ChainVersion, from: TargetId, to: TargetId, scope: ResyncScope },
    /// `replacement` joins `chain` to restore its replica count (it gets a full resync);
    /// `replaced` are the dead members it takes the place of (none for a drain).
    Rebuild { chain: ChainId, replaced: Vec<TargetId>, replacement: TargetId },
    /// `target` is the last serving member of `chain`: it cannot leave before a replacement
    /// holds its data, so it is drained instead.
    RemoveDeferred { chain: ChainId, target: TargetId },
}
