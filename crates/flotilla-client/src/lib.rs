//! Flotilla's client library.
//!
//! A [`Client`] talks to the metadata service for the namespace and directly to the I/O
//! servers for data, over one multiplexed connection per server. Every read and write takes
//! a [`Shape`](flotilla_request::Shape), the one request type that carries contiguous,
//! strided, nested-strided, nested-batched and list requests (Galley §5). All pieces bound
//! for one server travel in as few frames as the server's limits allow, and no client has
//! more bytes in flight to a server than the credit the server granted at connect time.
//!
//! Every data call has a blocking form and a non-blocking form that returns a [`Handle`]
//! with `test` and `wait`. The blocking calls must not be made from inside an async runtime.

mod array;
mod attr_cache;
mod attr_leases;
mod call_memory;
mod client;
mod commit;
mod core;
mod env;
pub mod enwrich;
mod error;
mod file;
mod fork;
mod group;
mod group_plan;
mod handle;
mod inode_cached;
mod lease;
mod library_tokens;
mod lock_reclaim;
mod lock_record;
mod locks;
mod metrics;
mod nonblocking;
mod opens;
mod posix;
mod posix_at;
mod raw;
mod read_split;
mod replicas;
mod tokens;
mod transfer;
mod transport;
mod unstable;

pub use array::{array_request, c_order_strides, ArrayDim, ArrayRequest};
pub use attr_leases::AttrSettings;
pub use bytes::Bytes;
pub use client::{job_from_env, process_caller, Client, ClientConfig, CreateOptions, OpenOptions};
pub use env::{JOB_ENV_DEFAULT, JOB_ENV_ENV, KEY_ENV, META_ENV, METRICS_LISTEN_ENV};
pub use enwrich::{EnwrichFile, EnwrichOptions};
pub use error::ClientError;
pub use file::{subfile_lengths, File, ForkHsm, ForkScrub};
pub use flotilla_proto::buffers::{BufferPool, POOLED_BYTES_MIN};
pub use flotilla_proto::TokenMode;
pub use flotilla_proto::{
    DirEntryInfo, EntryInfo, ErrorCode, ForkInfo, TargetState, TargetStatus, WireError,
};
pub use flotilla_proto::{
    InodeToken, InodeTokenKind, ListedEntry, LockInfo, LockKind, RenameMode, NAME_BYTES_MAX,
};
pub use flotilla_request::{BatchNode, BatchSub, Piece, Shape, StrideLevel};
pub use flotilla_types::{
    Attributes, FileId, FileKind, Layout, LayoutError, ReplicatedLayout, SetAttr, SubfileIndex, TargetId,
};
pub use fork::{Fork, DEFAULT_FORK};
pub use group::{Group, GroupError, GroupStats, GroupTarget, RequestFailure};
pub use group_plan::{Admission, Direction, GroupConfig, GroupMode, Mixed, Planner};
pub use handle::Handle;
pub use inode_cached::CachedLookup;
pub use posix::Owner;
pub use posix_at::At;
pub use raw::RawBuffer;
pub use tokens::{ByteRange, TokenCache, TokenHolder, TokenSettings, TokenUse, WHOLE_FILE};
pub use transport::outage::{OutageSettings, Service, OUTAGE_WAIT_ENV, OUTAGE_WAIT_MS_DEFAULT};
pub use transport::{parse_meta_addresses, LeaderChase, MetaAddressError, Move, META_ADDRESSES_MAX};
