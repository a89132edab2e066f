//! One fork of one subfile: the unit every structured read and write addresses.

use crate::client::Client;
use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::handle::Handle;
use crate::replicas::{access_of, call, connect, destination};
use crate::transfer::{read_shape, write_shape, WriteSource};
use crate::transport::outage::Service;
use bytes::Bytes;
use flotilla_proto::{EntryInfo, ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_types::SubfileIndex;
use std::sync::Arc;

/// The fork every subfile is created with.
pub const DEFAULT_FORK: &str = "data";

/// One fork of one subfile: the unit every read and write addresses.
#[derive(Clone)]
pub struct Fork {
    pub(crate) client: Client,
    pub(crate) fork: ForkRef,
    /// The server's address, or the route of the chain a replicated subfile is on
    /// (`replicas.rs`).
    pub(crate) server: String,
}

impl Fork {
    pub fn fork_ref(&self) -> &ForkRef {
        &self.fork
    }

    /// Address of the I/O server holding this fork (for a replicated subfile, the address of
    /// its chain's head as this client last knew it).
    pub fn server(&self) -> String {
        match crate::replicas::route_chain(&self.server)
            .and_then(|chain| self.client.core.chains().get(chain))
        {
            Some(chain) => {
                let serving =
                    chain.members.iter().find(|m| m.state == flotilla_proto::ChainMemberState::Serving);
                serving.map(|m| m.server.clone()).unwrap_or_default()
            }
            None => self.server.clone(),
        }
    }

    /// Reads the shape's pieces into `buffer` (each piece at its memory offset).
    pub fn read(&self, shape: &Shape, buffer: &mut [u8]) -> Result<u64, ClientError> {
        self.client.block_on(read_shape(&self.client.core, &self.server, &self.fork, shape, buffer))
    }

    /// Writes the shape's pieces from `buffer` (each piece from its memory offset).
    pub fn write(&self, shape: &Shape, buffer: &[u8]) -> Result<u64, ClientError> {
        self.client.block_on(write_shape(
            &self.client.core,
            &self.server,
            &self.fork,
            shape,
            WriteSource::Borrowed(buffer),
        ))
    }

    /// Non-blocking read: the handle gives back `buffer`, filled.
    pub fn read_nb(&self, shape: Shape, mut buffer: Vec<u8>) -> Handle<Vec<u8>> {
        let (core, server, fork) = self.parts();
        self.client.spawn(async move {
            read_shape(&core, &server, &fork, &shape, &mut buffer).await?;
            Ok(buffer)
        })
    }

    /// Non-blocking write: the handle gives the number of bytes written.
    pub fn write_nb(&self, shape: Shape, buffer: Vec<u8>) -> Handle<u64> {
        let (core, server, fork) = self.parts();
        self.client.spawn(async move {
            write_shape(&core, &server, &fork, &shape, WriteSource::Borrowed(&buffer)).await
        })
    }

    fn parts(&self) -> (Arc<Core>, String, ForkRef) {
        (self.client.core.clone(), self.server.clone(), self.fork.clone())
    }

    pub(crate) fn simple(&self, request: IoRequest, what: &'static str) -> Result<IoReply, ClientError> {
        self.client.block_on(simple_call(self.client.core.clone(), self.server.clone(), request, what))
    }

    fn simple_nb(&self, request: IoRequest, what: &'static str) -> Handle<IoReply> {
        self.client.spawn(simple_call(self.client.core.clone(), self.server.clone(), request, what))
    }

    /// The fork's size in bytes.
    pub fn size(&self) -> Result<u64, ClientError> {
        match self.simple(IoRequest::ForkSize { fork: self.fork.clone() }, "fork size")? {
            IoReply::Size { bytes } => Ok(bytes),
            other => Err(unexpected("fork size", &other)),
        }
    }

    /// `flotilla hsm` on this fork (a lines target of a server with an archive): the action,
    /// then the fork's state.
    pub fn hsm(
        &self,
        action: flotilla_proto::HsmAction,
    ) -> Result<flotilla_proto::HsmForkState, ClientError> {
        match self.simple(IoRequest::Hsm { fork: self.fork.clone(), action }, "hsm")? {
            IoReply::Hsm(state) => Ok(state),
            other => Err(unexpected("hsm", &other)),
        }
    }

    /// The `flotilla hsm` state of this fork on every server holding a copy: the one server,
    /// or for a replicated subfile each serving member of its chain (each holds, archives
    /// and recalls its own copy), as (server address, state).
    pub fn hsm_states(&self) -> Result<Vec<(String, flotilla_proto::HsmForkState)>, ClientError> {
        let Some(chain) = crate::replicas::route_chain(&self.server) else {
            return Ok(vec![(self.server.clone(), self.hsm(flotilla_proto::HsmAction::State)?)]);
        };
        let core = self.client.core.clone();
        let fork = self.fork.clone();
        self.client.block_on(async move {
            core.transport.outlast(Service::Server, |_| member_states(&core, chain, &fork)).await
        })
    }

    /// Scrub (`flotilla scrub`): the checksums of `length` bytes from `offset` (at most
    /// `SCRUB_BLOCKS_MAX` checksum blocks), each block checked on disk by the member that
    /// answers; for a replicated subfile that member also asks every other serving member,
    /// compares, and bad blocks are rewritten from a member whose block verifies.
    pub fn block_checksums(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<flotilla_proto::ScrubReport, ClientError> {
        let request = IoRequest::BlockChecksums {
            fork: self.fork.clone(),
            offset,
            length,
            repair: true,
            compare: true,
        };
        match self.simple(request, "block checksums")? {
            IoReply::BlockChecksums(report) => Ok(*report),
            other => Err(unexpected("block checksums", &other)),
        }
    }

    /// Preallocates the fork to at least `size_bytes` (Galley's `gfs_extend`).
    pub fn extend(&self, size_bytes: u64) -> Result<(), ClientError> {
        self.simple(IoRequest::Extend { fork: self.fork.clone(), size_bytes }, "extend").map(|_| ())
    }

    pub fn truncate(&self, size_bytes: u64) -> Result<(), ClientError> {
        self.simple(IoRequest::Truncate { fork: self.fork.clone(), size_bytes }, "truncate").map(|_| ())
    }

    /// Makes the fork durable: this client's writes a server restart lost are sent again,
    /// then the server writes the fork's dirty blocks to disk and syncs it.
    pub fn sync(&self) -> Result<(), ClientError> {
        let core = &self.client.core;
        self.client.block_on(core.unstable.commit_fork(&core.transport, &self.fork, &self.server))
    }

    /// Non-blocking `sync`.
    pub fn sync_nb(&self) -> Handle<()> {
        let (core, server, fork) = self.parts();
        self.client.spawn(async move { core.unstable.commit_fork(&core.transport, &fork, &server).await })
    }

    /// Non-blocking `extend`.
    pub fn extend_nb(&self, size_bytes: u64) -> Handle<IoReply> {
        self.simple_nb(IoRequest::Extend { fork: self.fork.clone(), size_bytes }, "extend")
    }

    /// Non-blocking `truncate`.
    pub fn truncate_nb(&self, size_bytes: u64) -> Handle<IoReply> {
        self.simple_nb(IoRequest::Truncate { fork: self.fork.clone(), size_bytes }, "truncate")
    }
}

/// A request without data to the fork's server (or, replicated, to its chain's head for a
/// change and to a serving member for a read), tried again while it cannot be reached
/// (every such request is idempotent).
async fn simple_call(
    core: Arc<Core>,
    route: String,
    request: IoRequest,
    what: &'static str,
) -> Result<IoReply, ClientError> {
    let (core, route, request) = (&core, route.as_str(), &request);
    let reply = core
        .transport
        .outlast(Service::Server, move |_| async move {
            let (transport, chains) = (&core.transport, core.chains());
            let destination = destination(transport, chains, route, access_of(request)).await?;
            let server = connect(transport, chains, &destination).await?;
            let (reply, _) = call(transport, chains, &destination, &server, request, Bytes::new(), 0).await?;
            Ok(reply)
        })
        .await?;
    match reply {
        reply @ (IoReply::Done { .. }
        | IoReply::Size { .. }
        | IoReply::Forks(_)
        | IoReply::Hsm(_)
        | IoReply::BlockChecksums(_)) => Ok(reply),
        other => Err(unexpected(what, &other)),
    }
}

/// One `hsm state` call to each serving member of `chain` (never a fenced or syncing one),
/// under the chain's current view.
async fn member_states(
    core: &Core,
    chain: u32,
    fork: &ForkRef,
) -> Result<Vec<(String, flotilla_proto::HsmForkState)>, ClientError> {
    use crate::replicas::{chain_route, Access, Destination, Member};
    let (transport, chains) = (&core.transport, core.chains());
    // Learns (or refetches) the chain's view.
    destination(transport, chains, &chain_route(chain), Access::Read).await?;
    let view = chains
        .get(chain)
        .ok_or_else(|| ClientError::ChainUnavailable { chain, why: "its view is unknown".into() })?;
    let request = IoRequest::Hsm { fork: fork.clone(), action: flotilla_proto::HsmAction::State };
    let mut states = Vec::new();
    for member in view.members.iter().filter(|m| m.state == flotilla_proto::ChainMemberState::Serving) {
        let at = Member { chain, version: view.version, target: member.target };
        let destination = Destination { addr: member.server.clone(), chained: Some(at) };
        let server = connect(transport, chains, &destination).await?;
        match call(transport, chains, &destination, &server, &request, Bytes::new(), 0).await?.0 {
            IoReply::Hsm(state) => states.push((member.server.clone(), state)),
            other => return Err(unexpected("hsm state", &other)),
        }
    }
    Ok(states)
}

/// The fork reference of `fork` in subfile `subfile` of `entry`.
pub(crate) fn fork_ref(
    entry: &EntryInfo,
    subfile: u32,
    fork: &str,
) -> Result<(ForkRef, String), ClientError> {
    let place = entry
        .subfiles
        .get(subfile as usize)
        .ok_or(ClientError::NoSuchSubfile { subfile, count: entry.subfiles.len() })?;
    let fork = ForkRef {
        target: place.target,
        file: entry.file_id(),
        subfile: SubfileIndex(subfile),
        fork: if fork.is_empty() { DEFAULT_FORK.to_string() } else { fork.to_string() },
    };
    let route = match &place.chain {
        Some(chain) => crate::replicas::chain_route(chain.chain),
        None => place.server.clone(),
    };
    Ok((fork, route))
}

impl std::fmt::Debug for Fork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fork").field("fork", &self.fork).field("server", &self.server).finish()
    }
}
