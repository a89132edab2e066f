//! The group's RPCs (append, vote, snapshot chunk) behind one small [`Transport`] trait, and the
//! adapter that turns any transport into openraft's network.
//!
//! A transport moves one [`RaftRpc`] to a node and brings back its [`RaftRpcReply`]; the
//! receiving side answers with [`serve`]. The in-process transport of the tests and the TCP
//! transport over `flotilla-rpc` frames both implement [`Transport`]; nothing else changes.
//! Invariant: a transport failure is `Unreachable` to openraft (it retries with backoff); a
//! Raft error from the remote node travels back as that node's error.

use std::future::Future;
use std::sync::Arc;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};

use crate::types::{NodeId, Raft, TypeConfig};

/// One Raft RPC.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer to one Raft RPC, including the remote node's Raft error.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpcReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
}

/// Why an RPC did not come back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("node {target} at {address} is unreachable: {reason}")]
    Unreachable { target: NodeId, address: String, reason: String },
    #[error("node {target} answered an RPC with a reply of another kind")]
    WrongReply { target: NodeId },
    /// The RPC does not fit in one frame; an append of several entries may be split into
    /// appends of `entries_hint` entries.
    #[error("RPC to node {target} does not fit in a frame: {reason}")]
    TooLarge { target: NodeId, entries_hint: Option<u64>, reason: String },
    /// The node answered, but refused the RPC (a bad frame, an RPC it cannot decode, or an
    /// RPC addressed to another node id), or its reply did not decode.
    #[error("node {target} at {address} refused an RPC: {reason}")]
    Refused { target: NodeId, address: String, reason: String },
}

/// Moves Raft RPCs between nodes.
pub trait Transport: Send + Sync + 'static {
    /// Sends `rpc` from `from` to `target` (at `address`) and waits for its reply.
    fn call(
        &self,
        from: NodeId,
        target: NodeId,
        address: &str,
        rpc: RaftRpc,
    ) -> impl Future<Output = Result<RaftRpcReply, TransportError>> + Send;
}

/// Answers one RPC on the receiving node.
pub async fn serve(raft: &Raft, rpc: RaftRpc) -> RaftRpcReply {
    match rpc {
        RaftRpc::Append(r) => RaftRpcReply::Append(raft.append_entries(r).await),
        RaftRpc::Vote(r) => RaftRpcReply::Vote(raft.vote(r).await),
        RaftRpc::Snapshot(r) => RaftRpcReply::Snapshot(raft.install_snapshot(r).await),
    }
}

/// Openraft's network factory over a [`Transport`].
pub struct GroupNetwork<T: Transport> {
    transport: Arc<T>,
    from: NodeId,
}

impl<T: Transport> GroupNetwork<T> {
    pub fn new(transport: Arc<T>, from: NodeId) -> Self {
        GroupNetwork { transport, from }
    }
}

impl<T: Transport> RaftNetworkFactory<TypeConfig> for GroupNetwork<T> {
    type Network = Connection<T>;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        let address = group_address(&node.addr).to_string();
        Connection { transport: self.transport.clone(), from: self.from, target, address }
    }
}

/// A member's address as the membership records it: `META_ADDR/GROUP_ADDR` (clients' address,
/// then the Raft peers' address), or the group address alone (members named before clients'
/// addresses were recorded). The part the Raft RPCs go to.
pub fn group_address(addr: &str) -> &str {
    addr.split_once('/').map_or(addr, |(_, group)| group)
}

/// The clients' address of a member's recorded address, if it names one.
pub fn meta_address(addr: &str) -> Option<&str> {
    addr.split_once('/').map(|(meta, _)| meta)
}

/// The recorded form of a member's addresses (see [`group_address`]).
pub fn member_address(meta_addr: &str, group_addr: &str) -> String {
    format!("{meta_addr}/{group_addr}")
}

/// Openraft's view of the link to one node.
pub struct Connection<T: Transport> {
    transport: Arc<T>,
    from: NodeId,
    target: NodeId,
    address: String,
}

type RpcResult<R, E> = Result<R, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl<T: Transport> Connection<T> {
    async fn call(&self, rpc: RaftRpc) -> Result<RaftRpcReply, TransportError> {
        self.transport.call(self.from, self.target, &self.address, rpc).await
    }

    fn unreachable<E: std::error::Error>(
        &self,
        e: TransportError,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        match e {
            TransportError::Unreachable { .. } | TransportError::Refused { .. } => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            // Only an append is split by openraft (its hint for a vote or snapshot panics).
            TransportError::TooLarge { entries_hint: Some(hint), .. } => RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint.max(1)).with_source_error(&e),
            ),
            TransportError::TooLarge { .. } | TransportError::WrongReply { .. } => {
                RPCError::Network(NetworkError::new(&e))
            }
        }
    }

    // The error type is openraft's, fixed by `RaftNetwork`.
    #[allow(clippy::result_large_err)]
    fn remote<R, E: std::error::Error>(&self, r: Result<R, RaftError<NodeId, E>>) -> RpcResult<R, E> {
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    fn wrong<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        self.unreachable(TransportError::WrongReply { target: self.target })
    }
}

impl<T: Transport> RaftNetwork<TypeConfig> for Connection<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        match self.call(RaftRpc::Append(rpc)).await.map_err(|e| self.unreachable(e))? {
            RaftRpcReply::Append(r) => self.remote(r),
            _ => Err(self.wrong()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        match self.call(RaftRpc::Snapshot(rpc)).await.map_err(|e| self.unreachable(e))? {
            RaftRpcReply::Snapshot(r) => self.remote(r),
            _ => Err(self.wrong()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        match self.call(RaftRpc::Vote(rpc)).await.map_err(|e| self.unreachable(e))? {
            RaftRpcReply::Vote(r) => self.remote(r),
            _ => Err(self.wrong()),
        }
    }
}
