//! The metadata service's replication engine: a Raft group built on `openraft`, with the log
//! and Raft's own records (vote, committed, purged) in redb, a state machine trait the metadata
//! service implements, an exactly-once reply table as pure logic, and a network trait with an
//! in-process implementation for tests and a TCP one over authenticated Flotilla frames.
//!
//! Layers, each depending only on those above it:
//! - [`limits`], [`record`], [`types`]: bounds, the checked on-disk record, the type config;
//! - [`reply_table`]: exactly-once (no I/O);
//! - [`log_store`], [`state_machine`], [`snapshot_buffer`], [`sm_store`], [`kv`]: storage;
//! - [`network`], [`local_network`], [`tcp`], [`identity`]: RPCs and the group id they carry;
//! - [`group`]: a node started from its files; [`membership`]: adding and removing nodes.

pub mod group;
pub mod identity;
pub mod kv;
pub mod limits;
pub mod local_network;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod record;
pub mod reply_table;
pub mod sm_store;
pub mod snapshot_buffer;
pub mod state_machine;
pub mod tcp;
pub mod types;

pub use group::{raft_config, Committed, GroupError, GroupNode, GroupTiming};
pub use identity::{ForeignGroup, GroupIdentity, IdentityError};
pub use limits::GroupLimits;
pub use log_store::{LogStoreError, RedbLogStore};
pub use membership::{GroupView, Member, MembershipError};
pub use network::{
    group_address, member_address, meta_address, serve, GroupNetwork, RaftRpc, RaftRpcReply, Transport,
    TransportError,
};
pub use reply_table::{Lookup, ReplyError, ReplyLimits, ReplyTable};
pub use sm_store::StateMachineStore;
pub use state_machine::{AppliedMark, BoundedWriter, RunEntry, StateMachine, StateMachineError};
pub use tcp::listener::GroupListener;
pub use tcp::{TcpConfig, TcpError, TcpTransport};
pub use types::{Batch, BatchError, Change, NodeId, Raft, Reply, TypeConfig, BATCH_VERSION};
