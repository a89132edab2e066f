//! Open files and their forks.

use crate::client::{fork_ref, Client};
use crate::core::{unexpected, Core};
use crate::error::ClientError;
use crate::handle::Handle;
use crate::transfer::{read_shape, write_shape};
use crate::DEFAULT_FORK;
use flotilla_proto::{EntryInfo, ForkInfo, ForkRef, IoReply, IoRequest};
use flotilla_request::{Piece, Shape};
use flotilla_types::{Layout, SetAttr, SubfileIndex};
use std::sync::Arc;

/// An open file: its entry (id, attributes, layout, where each subfile lives).
#[derive(Clone)]
pub struct File {
    client: Client,
    path: String,
    entry: EntryInfo,
}

impl File {
    pub(crate) fn new(client: Client, path: String, entry: EntryInfo) -> File {
        File { client, path, entry }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn entry(&self) -> &EntryInfo {
        &self.entry
    }

    pub fn subfile_count(&self) -> u32 {
        self.entry.subfiles.len() as u32
    }

    /// A fork of one subfile (the fork need not exist yet; calls on it fail if it does not).
    pub fn fork(&self, subfile: u32, name: &str) -> Result<Fork, ClientError> {
        let (fork, server) = fork_ref(&self.entry, subfile, name)?;
        Ok(Fork { client: self.client.clone(), fork, server })
    }

    /// Creates a fork in one subfile.
    pub fn create_fork(&self, subfile: u32, name: &str) -> Result<Fork, ClientError> {
        let fork = self.fork(subfile, name)?;
        fork.simple(IoRequest::CreateFork { fork: fork.fork.clone() }, "create fork")?;
        Ok(fork)
    }

    pub fn remove_fork(&self, subfile: u32, name: &str) -> Result<(), ClientError> {
        let fork = self.fork(subfile, name)?;
        fork.simple(IoRequest::RemoveFork { fork: fork.fork.clone() }, "remove fork").map(|_| ())
    }

    /// The forks of one subfile with their sizes.
    pub fn list_forks(&self, subfile: u32) -> Result<Vec<ForkInfo>, ClientError> {
        let fork = self.fork(subfile, DEFAULT_FORK)?;
        let request = IoRequest::ListForks {
            target: fork.fork.target,
            file: fork.fork.file,
            subfile: SubfileIndex(subfile),
        };
        match self.client.block_on(self.client.core.io_simple(&fork.server, request))? {
            IoReply::Forks(forks) => Ok(forks),
            other => Err(unexpected("list forks", &other)),
        }
    }

    /// Records the file's linear size (and mtime) in the metadata service.
    pub fn set_size(&mut self, size_bytes: u64) -> Result<(), ClientError> {
        let now = now_ns();
        let change = SetAttr { size_bytes: Some(size_bytes), mtime_ns: Some(now), ..SetAttr::default() };
        self.entry.attrs = self.client.set_attr(self.entry.id, change)?;
        Ok(())
    }

    /// Syncs every fork of every subfile.
    pub fn sync(&self) -> Result<(), ClientError> {
        for subfile in 0..self.subfile_count() {
            for info in self.list_forks(subfile)? {
                self.fork(subfile, &info.name)?.sync()?;
            }
        }
        Ok(())
    }

    fn stripe_unit(&self) -> Result<u64, ClientError> {
        match self.entry.layout {
            Some(Layout::Stripe { unit_bytes }) if unit_bytes > 0 => Ok(unit_bytes),
            _ => Err(ClientError::ExplicitLayout),
        }
    }

    /// Writes `data` at linear `offset` of a striped file: one packed list request per
    /// subfile, all in flight at once.
    pub fn write_linear(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let per_subfile = stripe_pieces(self.stripe_unit()?, self.subfile_count(), offset, data.len() as u64);
        let handles: Vec<Handle<u64>> = per_subfile
            .into_iter()
            .enumerate()
            .filter(|(_, pieces)| !pieces.is_empty())
            .map(|(subfile, pieces)| {
                let fork = self.fork(subfile as u32, DEFAULT_FORK)?;
                let packed = pack(&pieces, data);
                Ok(fork.write_nb(Shape::List { pieces: packed_pieces(&pieces) }, packed))
            })
            .collect::<Result<_, ClientError>>()?;
        for handle in handles {
            handle.wait()?;
        }
        Ok(())
    }

    /// Reads `buffer.len()` bytes at linear `offset` of a striped file.
    pub fn read_linear(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ClientError> {
        let per_subfile =
            stripe_pieces(self.stripe_unit()?, self.subfile_count(), offset, buffer.len() as u64);
        let mut handles = Vec::new();
        for (subfile, pieces) in per_subfile.into_iter().enumerate().filter(|(_, p)| !p.is_empty()) {
            let fork = self.fork(subfile as u32, DEFAULT_FORK)?;
            let bytes: u64 = pieces.iter().map(|p| p.length).sum();
            handles.push((
                pieces.clone(),
                fork.read_nb(Shape::List { pieces: packed_pieces(&pieces) }, vec![0; bytes as usize]),
            ));
        }
        for (pieces, handle) in handles {
            let packed = handle.wait()?;
            unpack(&pieces, &packed, buffer);
        }
        Ok(())
    }
}

/// For each subfile, the pieces of linear range [offset, offset+length) it holds:
/// file offsets within the subfile's fork, memory offsets within the caller's buffer.
pub fn stripe_pieces(unit_bytes: u64, subfiles: u32, offset: u64, length: u64) -> Vec<Vec<Piece>> {
    let count = u64::from(subfiles.max(1));
    let mut out = vec![Vec::new(); count as usize];
    let mut done = 0u64;
    while done < length {
        let linear = offset + done;
        let unit = linear / unit_bytes;
        let within = linear % unit_bytes;
        let take = (unit_bytes - within).min(length - done);
        let subfile = (unit % count) as usize;
        let file_offset = (unit / count) * unit_bytes + within;
        out[subfile].push(Piece { file_offset, memory_offset: done, length: take });
        done += take;
    }
    out
}

/// The same pieces with memory offsets packed from 0, in order.
fn packed_pieces(pieces: &[Piece]) -> Vec<Piece> {
    let mut at = 0;
    pieces
        .iter()
        .map(|p| {
            let packed = Piece { file_offset: p.file_offset, memory_offset: at, length: p.length };
            at += p.length;
            packed
        })
        .collect()
}

fn pack(pieces: &[Piece], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(|p| p.length as usize).sum());
    for piece in pieces {
        let start = piece.memory_offset as usize;
        out.extend_from_slice(&data[start..start + piece.length as usize]);
    }
    out
}

fn unpack(pieces: &[Piece], packed: &[u8], buffer: &mut [u8]) {
    let mut at = 0usize;
    for piece in pieces {
        let (start, length) = (piece.memory_offset as usize, piece.length as usize);
        buffer[start..start + length].copy_from_slice(&packed[at..at + length]);
        at += length;
    }
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// One fork of one subfile: the unit every read and write addresses.
#[derive(Clone)]
pub struct Fork {
    client: Client,
    fork: ForkRef,
    server: String,
}

impl Fork {
    pub fn fork_ref(&self) -> &ForkRef {
        &self.fork
    }

    /// Address of the I/O server holding this fork.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Reads the shape's pieces into `buffer` (each piece at its memory offset).
    pub fn read(&self, shape: &Shape, buffer: &mut [u8]) -> Result<u64, ClientError> {
        self.client.block_on(read_shape(&self.client.core, &self.server, &self.fork, shape, buffer))
    }

    /// Writes the shape's pieces from `buffer` (each piece from its memory offset).
    pub fn write(&self, shape: &Shape, buffer: &[u8]) -> Result<u64, ClientError> {
        self.client.block_on(write_shape(&self.client.core, &self.server, &self.fork, shape, buffer))
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
        self.client.spawn(async move { write_shape(&core, &server, &fork, &shape, &buffer).await })
    }

    fn parts(&self) -> (Arc<Core>, String, ForkRef) {
        (self.client.core.clone(), self.server.clone(), self.fork.clone())
    }

    fn simple(&self, request: IoRequest, what: &'static str) -> Result<IoReply, ClientError> {
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

    /// Preallocates the fork to at least `size_bytes` (Galley's `gfs_extend`).
    pub fn extend(&self, size_bytes: u64) -> Result<(), ClientError> {
        self.simple(IoRequest::Extend { fork: self.fork.clone(), size_bytes }, "extend").map(|_| ())
    }

    pub fn truncate(&self, size_bytes: u64) -> Result<(), ClientError> {
        self.simple(IoRequest::Truncate { fork: self.fork.clone(), size_bytes }, "truncate").map(|_| ())
    }

    /// Writes the fork's dirty blocks to disk and syncs it.
    pub fn sync(&self) -> Result<(), ClientError> {
        self.simple(IoRequest::Sync { fork: self.fork.clone() }, "sync").map(|_| ())
    }

    /// Non-blocking `sync`.
    pub fn sync_nb(&self) -> Handle<IoReply> {
        self.simple_nb(IoRequest::Sync { fork: self.fork.clone() }, "sync")
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

async fn simple_call(
    core: Arc<Core>,
    server: String,
    request: IoRequest,
    what: &'static str,
) -> Result<IoReply, ClientError> {
    match core.io_simple(&server, request).await? {
        reply @ (IoReply::Done { .. } | IoReply::Size { .. } | IoReply::Forks(_)) => Ok(reply),
        other => Err(unexpected(what, &other)),
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("path", &self.path).field("id", &self.entry.file_id()).finish()
    }
}

impl std::fmt::Debug for Fork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fork").field("fork", &self.fork).field("server", &self.server).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_pieces_cover_every_byte_once() {
        let per_subfile = stripe_pieces(10, 3, 7, 45);
        let mut seen = [0u32; 45];
        for pieces in &per_subfile {
            for piece in pieces {
                for m in piece.memory_offset..piece.memory_offset + piece.length {
                    seen[m as usize] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        // Linear byte 7 is unit 0 -> subfile 0 at offset 7; byte 30 is unit 3 -> subfile 0, offset 10.
        assert_eq!(per_subfile[0][0], Piece { file_offset: 7, memory_offset: 0, length: 3 });
        assert_eq!(per_subfile[0][1], Piece { file_offset: 10, memory_offset: 23, length: 10 });
    }
}
