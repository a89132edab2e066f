//! The server-side fencing check, run before every chain request (a client's read, write or
//! sync, a forward from the predecessor, a resync copy, an acknowledgement).
//!
//! A server admits a request only if all of these hold, checked in this order:
//! 1. its lease is valid (`now_ms < lease_valid_until_ms`, both by the server's own clock):
//!    a server cut off from the metadata service stops before the service fences it;
//! 2. it is a member of the chain in the version it holds;
//! 3. the request's chain version is exactly its own: an older one is a sender that missed a
//!    change (it refetches the chain), a newer one means this server missed it (it must fetch
//!    before serving anything);
//! 4. its state allows the access: reads only while `Serving`, writes while `Serving` or
//!    `Syncing`.
//!
//! So a fenced member can never accept a write or serve a read again: the chain that fenced
//! it has a higher version, it holds the lower one until told, and once told it is not
//! `Serving`.

use crate::ids::ChainVersion;
use crate::member::MemberState;

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// A write, a sync, a forward or a resync copy.
    Write,
}

/// What a server knows of one chain: its version and its own state in it (`None` if it is
/// not a member).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub version: ChainVersion,
    pub state: Option<MemberState>,
}

/// The outcome of [`admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    Serve,
    /// The request's version is not the server's; `current` is the server's.
    Stale {
        current: ChainVersion,
    },
    /// The server's lease ran out; it serves nothing until a heartbeat reply renews it.
    NoLease,
    /// The server is not in the chain, or is in it in a state that forbids the access.
    NotMember {
        state: Option<MemberState>,
    },
}

/// Whether a server with `view` and a lease valid until `lease_valid_until_ms` may execute a
/// request carrying `request_version` for `access` at `now_ms`.
pub fn admit(
    request_version: ChainVersion,
    view: MemberView,
    access: Access,
    lease_valid_until_ms: u64,
    now_ms: u64,
) -> Admission {
    if now_ms >= lease_valid_until_ms {
        return Admission::NoLease;
    }
    let Some(state) = view.state else {
        return Admission::NotMember { state: None };
    };
    if request_version != view.version {
        return Admission::Stale { current: view.version };
    }
    let allowed = match access {
        Access::Read => state.readable(),
        Access::Write => state.in_write_path(),
    };
    if !allowed {
        return Admission::NotMember { state: Some(state) };
    }
    Admission::Serve
}
