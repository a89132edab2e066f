//! Replication's pure core (issue 32): the logic that keeps `N` replicas of every subfile
//! identical and decides who may serve them, with no sockets, no files and no clocks of its own.
//!
//! A replicated subfile lives on a [`Chain`]: an ordered list of targets in distinct failure
//! groups, with a [`ChainVersion`] that only grows. The metadata service owns the
//! [`ChainTable`] and changes it only through [`Membership`], a synchronous engine that takes
//! [`Event`]s (heartbeats, ticks, finished resyncs, operator requests) and returns
//! [`Command`]s (a chain changed, start a resync, rebuild onto a replacement). Servers check
//! every chain request with [`admit`] (version and lease fencing) and record what an absent
//! member missed in a [`RangeSet`] per fork.
//!
//! Invariants kept by this crate (each checked by a property test or the simulation in
//! `tests/simulation.rs`):
//! - a chain's version only grows, by one per change;
//! - a chain's members are distinct targets in distinct failure groups;
//! - a member that went `Offline` is never `Serving` again without a `SyncDone` for a version
//!   in which it was `Syncing`;
//! - the last `Serving` member of a chain is never taken out (the chain is degraded, never
//!   empty of data);
//! - a server admits a request only under its own chain version, while it is a member in a
//!   state that allows the access, and while its lease is valid.

mod chain;
mod command;
mod config;
mod error;
mod event;
mod fence;
mod forward;
mod ids;
mod member;
mod membership;
mod placement;
mod ranges;
mod record;
mod table;

pub use chain::{Chain, MEMBERS_PER_CHAIN_MAX};
pub use command::{Command, ResyncScope};
pub use config::MembershipConfig;
pub use error::{ConfigError, PlacementError, RangeError};
pub use event::Event;
pub use fence::{admit, Access, Admission, MemberView};
pub use forward::{
    ChainEntry, ChainHead, ChainMemberLog, EntryKind, HeadRefusal, OrderRefusal, Progress, Receive,
    Unsettled, FORWARD_WINDOW_MAX,
};
pub use ids::{ChainId, ChainVersion, FailureGroup, Incarnation, FAILURE_GROUP_BYTES_MAX};
pub use member::{Member, MemberState};
pub use membership::{Membership, TargetHealth};
pub use placement::{build_chains, choose_chains, CHAINS_PER_TARGET_MAX, REPLICAS_MAX};
pub use ranges::{ByteRange, RangeSet, RANGES_ENCODING_VERSION, RANGES_PER_FORK_MAX};
pub use record::{pieces_within, MissedRecord, RECORD_KEY_BYTES, RECORD_RANGE_BYTES, WHOLE};
pub use table::{ChainTable, CHAINS_MAX};
