//! The client's error type: what failed, where, and the errno that matches it.

use flotilla_proto::{EntryInfo, ErrorCode, MetaReply, WireError};
use flotilla_request::ShapeError;
use flotilla_rpc::RpcError;

/// Everything a client call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("metadata service: {0}")]
    Meta(WireError),
    #[error("I/O server {server}: {error}")]
    Server { server: String, error: WireError },
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error("invalid request: {0}")]
    Shape(#[from] ShapeError),
    #[error("buffer of {length} bytes is too small: the request reaches byte {needed}")]
    BufferTooSmall { needed: u64, length: u64 },
    #[error("{path} is not a regular file")]
    NotAFile { path: String },
    #[error("file has {count} subfiles; subfile {subfile} does not exist")]
    NoSuchSubfile { subfile: u32, count: usize },
    #[error(transparent)]
    Layout(#[from] flotilla_types::LayoutError),
    #[error("unexpected reply to {request}: {reply}")]
    UnexpectedReply { request: &'static str, reply: String },
    #[error("no metadata address: pass one or set {}", crate::env::META_ENV)]
    NoMetaAddress,
    /// A metadata group node did not handle the request: not the leader, or no quorum.
    #[error("metadata node {addr}: {reason}")]
    NotServed { addr: String, reason: flotilla_proto::NotServed },
    /// The metadata address list (`FLOTILLA_META`, `--meta`) is malformed.
    #[error(transparent)]
    MetaAddresses(#[from] MetaAddressError),
    #[error("{0}")]
    Credential(String),
    #[error("cannot start the client runtime: {0}")]
    Runtime(String),
    #[error("the operation was abandoned before it finished")]
    Abandoned,
    #[error("local I/O failed: {0}")]
    Local(String),
    /// An ENWRICH write, flush or close failed (the message names the member or server).
    #[error("ENWRICH: {0}")]
    Enwrich(String),
    /// A byte-range token could not be had in time (the message names the file and range).
    #[error("byte-range token: {0}")]
    Token(String),
    /// A service stayed unreachable for the whole outage wait (`OutageSettings::wait_ms`);
    /// `last` is the last attempt's error, which names its address.
    /// Replication (issue 32): a chain member refused a chained request (the client
    /// refetches the chain and tries again within the outage wait).
    #[error("I/O server {server}: {refused}")]
    ChainRefused { server: String, refused: flotilla_proto::chains::ForwardRefused },
    /// A replicated subfile's chain has no member to send the request to (`why`).
    #[error("chain {chain}: {why}")]
    ChainUnavailable { chain: u32, why: String },
    /// A chained request got no answer from a member in time (a read tries the next serving
    /// member, a change the chain's head after a refetch).
    #[error("I/O server {server}: no answer to a replicated request in {waited_ms} ms")]
    ReplicaTimeout { server: String, waited_ms: u64 },
    #[error("{service} stayed unreachable for {waited_ms} ms (outage_wait_ms = {wait_ms}): {last}")]
    Unreachable { service: Service, waited_ms: u64, wait_ms: u64, last: Box<ClientError> },
}

impl ClientError {
    /// The wire error code, when the failure came from a server or the metadata service.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Meta(e) | ClientError::Server { error: e, .. } => Some(e.code),
            _ => None,
        }
    }

    /// The Linux errno that best describes the failure.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Meta(e) | ClientError::Server { error: e, .. } => e.code.errno(),
            ClientError::Shape(_)
            | ClientError::BufferTooSmall { .. }
            | ClientError::NoSuchSubfile { .. } => 22,
            ClientError::NotAFile { .. } => 21,
            ClientError::Layout(_) => 22,
            ClientError::MetaAddresses(_) => 22,
            _ => 5,
        }
    }
}

/// What is wrong with a metadata address list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaAddressError {
    #[error("no metadata address given (a list is HOST:PORT[,HOST:PORT...])")]
    Empty,
    #[error("metadata address list {list:?}: entry {position} is empty")]
    EmptyEntry { list: String, position: usize },
    #[error("metadata address list of {count} addresses; at most {max} are taken")]
    TooMany { count: usize, max: usize },
    #[error("metadata address {address:?} is longer than {max} bytes")]
    TooLong { address: String, max: usize },
}

/// A reply of the wrong kind to `request` (the reply's first 200 characters name it).
pub(crate) fn unexpected(request: &'static str, reply: &impl std::fmt::Debug) -> ClientError {
    ClientError::UnexpectedReply { request, reply: format!("{reply:?}").chars().take(200).collect() }
}

/// The entry of an `Entry` reply to request `what`.
pub(crate) fn entry_reply(reply: MetaReply, what: &'static str) -> Result<EntryInfo, ClientError> {
    match reply {
        MetaReply::Entry(entry) => Ok(entry),
        other => Err(unexpected(what, &other)),
    }
}

/// A `Done` reply to request `what`.
pub(crate) fn done_reply(reply: MetaReply, what: &'static str) -> Result<(), ClientError> {
    match reply {
        MetaReply::Done => Ok(()),
        other => Err(unexpected(what, &other)),
    }
}

/// Which service a call could not reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Service {
    Meta,
    Server,
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Service::Meta => "the metadata service",
            Service::Server => "an I/O server",
        })
    }
}
