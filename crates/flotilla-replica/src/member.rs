//! A chain member: a target and its state in the chain.
//!
//! States and what they allow:
//! - `Serving`: in the write path, readable.
//! - `Syncing`: in the write path behind every serving member (it receives new writes from
//!   its predecessor) while that predecessor copies it what it missed; not readable.
//! - `Offline`: out of the write path since `since`; serving members record what it misses.
//! - `Dead`: declared after `dead_after_ms` down; a replacement takes its place and gets a
//!   full copy. A dead member is kept in the chain only until its replacement is `Serving`.
//!
//! `missed_since` is the version at which the member last left the write path (or was added
//! empty): the key under which serving members keep its missing-update ranges.

use crate::ids::ChainVersion;
use flotilla_types::TargetId;
use serde::{Deserialize, Serialize};

/// A member's state in one chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    Serving,
    /// Being filled with what it missed since `missed_since`; `full` for a replacement that
    /// holds nothing yet.
    Syncing {
        missed_since: ChainVersion,
        full: bool,
    },
    /// Out of the write path; `full` if it still needs a full copy when it returns.
    Offline {
        missed_since: ChainVersion,
        full: bool,
    },
    Dead,
}

impl MemberState {
    /// Whether the member receives writes down the chain.
    pub fn in_write_path(self) -> bool {
        matches!(self, MemberState::Serving | MemberState::Syncing { .. })
    }

    /// Whether reads may be sent to the member.
    pub fn readable(self) -> bool {
        self == MemberState::Serving
    }

    /// The version since which the member misses writes, if it is not serving.
    pub fn missed_since(self) -> Option<ChainVersion> {
        match self {
            MemberState::Syncing { missed_since, .. } | MemberState::Offline { missed_since, .. } => {
                Some(missed_since)
            }
            MemberState::Serving | MemberState::Dead => None,
        }
    }
}

/// One target of a chain and its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub target: TargetId,
    pub state: MemberState,
}
