//! Flotilla's wire protocol.
//!
//! Every message travels in a [`frame`]: a 32-byte header (magic, version, request id,
//! lengths, a CRC32C of the header and one of the payload) followed by a body (the message,
//! encoded with postcard) and raw data bytes (what a read returns or a write carries). The
//! byte-level description is `docs/protocol.md`; keep the two in step.
//!
//! Invariants: a frame is never longer than the reader's `frame_bytes_max`, checked before
//! any buffer is sized from a length field; both checksums are verified before the body is
//! decoded; decoding never panics on any input (a fuzz target in `fuzz/` checks this).

pub mod budget;
pub mod buffers;
pub mod capability;
pub mod chains;
pub mod frame;
mod frame_error;
mod group;
mod io;
mod meta;
mod not_served;
mod wire_error;

pub use budget::{with_progress, Counted, ProgressRule, Reservation};
pub use capability::{Capability, Rights, WithRef};
pub use chains::{
    ChainForward, ChainInfo, ChainMember, ChainMemberState, ChainReport, ChainView, ForwardAck, ForwardEntry,
    ForwardRefusalReason, ForwardRefused, MemberHealth, MemberInfo, TargetAction, TargetChains,
    FAILURE_GROUP_BYTES_MAX,
};
pub use frame::{
    decode_frame, read_frame, read_frame_bounded, write_frame, Frame, FrameBudget, FrameError, FrameHeader,
    ReadBounds, FLAG_TAGGED, GROWTH_BYTES_MAX, HEADER_BYTES, MAGIC, VERSION,
};
pub use frame::{
    read_frame_body, read_frame_bounded_opened, read_frame_header, read_frame_opened, read_frame_payload,
    PayloadCrc, PayloadOpener, AEAD_TAG_BYTES, FLAG_ENCRYPTED, UNRESERVED_BYTES_MAX,
};
pub use group::{GroupReply, GroupRequest};
pub use io::{
    check_job_id, FlushEntry, FlushJob, ForkInfo, ForkRef, HsmAction, HsmForkState, IoReply, IoRequest,
    JobStats, PullRange, Residency, ScrubBlock, ScrubReport, ServerStats, TargetTierStatus, JOB_ID_BYTES_MAX,
    SCRUB_BLOCKS_MAX,
};
pub use meta::{
    CreateSpec, DeleteOrder, DirEntryInfo, EntryInfo, JobEvent, MetaReply, MetaRequest, ReplicaPlace,
    SubfileChain, SubfilePlace, TargetReport, TargetState, TargetStatus, CHAINS_PER_REQUEST_MAX,
    CHAIN_SUBFILES_SCAN_MAX,
};
pub use meta::{GroupMemberInfo, GroupMembershipRequest, GroupStatus, GROUP_ADDRESS_BYTES_MAX};
pub use meta::{HeldLock, RECLAIM_LOCKS_MAX};
pub use meta::{
    InodeAsk, InodeToken, InodeTokenKind, ListedEntry, ListedEntryPlus, LockInfo, LockKind, RenameMode,
    TokenGrant, TokenMode, TokenRevoke, INODE_TOKENS_PER_REQUEST_MAX, NAME_BYTES_MAX, READDIR_ENTRIES_MAX,
    TOKEN_EVENTS_MAX,
};
pub use not_served::{NotServed, LEADER_ADDRESS_BYTES_MAX};
pub use wire_error::{ErrorCode, WireError};

/// Encodes a message body with postcard.
pub fn encode_body<T: serde::Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    postcard::to_stdvec(message).map_err(|e| FrameError::Encode { message: e.to_string() })
}

/// Decodes a message body; any malformed input is an error naming what was expected.
pub fn decode_body<'a, T: serde::Deserialize<'a>>(
    body: &'a [u8],
    what: &'static str,
) -> Result<T, FrameError> {
    flotilla_request::take_decode_refusal();
    postcard::from_bytes(body).map_err(|e| {
        // postcard drops a custom error's text; the batch decoder keeps it aside.
        let message = flotilla_request::take_decode_refusal().unwrap_or_else(|| e.to_string());
        FrameError::Decode { what, message }
    })
}
