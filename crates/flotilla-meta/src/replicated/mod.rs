//! The namespace on the metadata group (issue 33): the changes that go through the log
//! ([`change`]), the state machine that applies them ([`NamespaceMachine`]) and its
//! snapshot format ([`image`]), and which change a request becomes ([`propose`]). A
//! metadata service started with `node_id` runs its handlers on it (`crate::grouped`).

pub mod change;
pub mod image;
mod machine;
pub mod propose;

pub use change::{
    Applied, BatchReply, ChainRow, ChainTargetRow, ChangeError, ChangeResult, LayoutOn, NamespaceChange,
    NewOwner, Op, OpenHint, Outcome, Place, RenameMode, ReplyEntry, TouchedInode, CHANGE_BYTES_MAX,
    CHANGE_VERSION,
};
pub use machine::{stored_session, MachineLimits, NamespaceMachine, SharedNamespace};
