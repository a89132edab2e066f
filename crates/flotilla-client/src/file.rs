//! Open files: their subfiles and forks (the explicit model), and their linear view through
//! the file's layout (stripe or hash), where every request shape also works.

use crate::call_memory::CallMemory;
use crate::client::Client;
use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::fork::{fork_ref, Fork, DEFAULT_FORK};
use crate::handle::Handle;
use crate::lease::OpenGuard;
use crate::library_tokens::{cover, cover_async, read_range, write_range};
use crate::read_split::{read_parts, split_pieces, READ_PART_BYTES_MIN};
use crate::replicas::{destination, route_chain, Access};
use crate::tokens::{ByteRange, TokenCache, TokenUse, WHOLE_FILE};
use crate::transfer::{check_call, read_into, read_shape, write_shape, WriteSource};
use crate::transport::outage::Service;
use bytes::Bytes;
use flotilla_proto::{EntryInfo, ForkInfo, IoReply, IoRequest, MetaReply, MetaRequest, TokenMode};
use flotilla_request::{Piece, Shape};
use flotilla_types::{Attributes, Layout, SetAttr, SubfileIndex};
use std::sync::Arc;

/// An open file: its entry (id, attributes, layout, where each subfile lives).
///
/// Reads, writes and size changes of its linear bytes take byte-range tokens
/// (`library_tokens.rs`) unless the client's tokens are off, the file has the no-overlap
/// hint, or it was opened with `no_overlap`. Fork-level I/O (`File::fork`) takes none: a
/// fork's bytes are outside the file's POSIX byte space.
#[derive(Clone)]
pub struct File {
    /// The open's registration at the metadata service; the last clone's drop closes it
    /// (and gives the client's tokens on the file back). First, so it goes while `client`
    /// still lives.
    _open: Arc<OpenGuard>,
    pub(crate) client: Client,
    path: String,
    pub(crate) entry: Arc<EntryInfo>,
    /// The client's token cache, when this handle takes tokens.
    tokens: Option<TokenCache>,
}

impl File {
    pub(crate) fn opened(client: Client, path: String, entry: EntryInfo, open: Arc<OpenGuard>) -> File {
        let tokens = if entry.no_overlap { None } else { client.token_cache() };
        client.core.chains().learn_entry(&entry);
        File { client, path, entry: Arc::new(entry), _open: open, tokens }
    }

    /// This handle without tokens when `no_overlap` (the open flag).
    pub(crate) fn with_no_overlap(mut self, no_overlap: bool) -> File {
        if no_overlap {
            self.tokens = None;
        }
        self
    }

    /// Whether this handle takes byte-range tokens.
    pub fn takes_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn entry(&self) -> &EntryInfo {
        &self.entry
    }

    pub fn id(&self) -> u64 {
        self.entry.id
    }

    pub fn subfile_count(&self) -> u32 {
        self.entry.subfiles.len() as u32
    }

    pub fn layout(&self) -> Layout {
        self.entry.layout.unwrap_or(Layout::Explicit)
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
        fork.simple(IoRequest::RemoveFork { fork: fork.fork.clone() }, "remove fork")?;
        self.client.core.unstable.log.lock().forget_fork(&fork.fork);
        Ok(())
    }

    /// The forks of one subfile with their sizes.
    pub fn list_forks(&self, subfile: u32) -> Result<Vec<ForkInfo>, ClientError> {
        let fork = self.fork(subfile, DEFAULT_FORK)?;
        let request = IoRequest::ListForks {
            target: fork.fork.target,
            file: fork.fork.file,
            subfile: SubfileIndex(subfile),
        };
        match fork.simple(request, "list forks")? {
            IoReply::Forks(forks) => Ok(forks),
            other => Err(unexpected("list forks", &other)),
        }
    }

    /// Each subfile with its forks; a subfile not yet created on its server (created on first
    /// write) is left out.
    fn forks_of_every_subfile(&self) -> Result<Vec<(u32, Vec<ForkInfo>)>, ClientError> {
        let mut every = Vec::new();
        for subfile in 0..self.subfile_count() {
            match self.list_forks(subfile) {
                Ok(forks) => every.push((subfile, forks)),
                Err(error) if error.code() == Some(flotilla_proto::ErrorCode::NotFound) => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(every)
    }

    /// `flotilla scrub` on every fork of every subfile: each range's checksums checked on
    /// disk and, for a replicated subfile, compared across its serving members and bad
    /// blocks repaired from a member whose block verifies (`Fork::block_checksums`). A
    /// subfile not yet created on its server has no forks.
    pub fn scrub(&self) -> Result<Vec<ForkScrub>, ClientError> {
        let mut found = Vec::new();
        for (subfile, forks) in self.forks_of_every_subfile()? {
            for info in forks {
                let fork = self.fork(subfile, &info.name)?;
                let mut offset = 0u64;
                // At most SCRUB_BLOCKS_MAX blocks of 256 bytes or more per request.
                let step = (flotilla_proto::SCRUB_BLOCKS_MAX * 256).max(1);
                loop {
                    let report = fork.block_checksums(offset, step)?;
                    found.push(ForkScrub { subfile, fork: info.name.clone(), report });
                    offset += step;
                    if offset >= info.size_bytes {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }

    /// `flotilla hsm` on every fork of every subfile: the action, then each fork's state on
    /// every server holding a copy (one per serving member of a replicated subfile's chain).
    /// A subfile not yet created on its server (created on first write) has no forks.
    /// A release is refused whole, before any fork is released, if some copy's archive
    /// object does not hold all of its bytes. On a replicated subfile an archive, release or
    /// recall is a chained change: the head applies it to its copy and forwards it, and
    /// every member applies it to its own.
    pub fn hsm(&self, action: flotilla_proto::HsmAction) -> Result<Vec<ForkHsm>, ClientError> {
        use flotilla_proto::{HsmAction, Residency};
        if action == HsmAction::Release {
            let states = self.hsm_states()?;
            let unready = states
                .iter()
                .find(|fork| matches!(fork.state.residency, Residency::Resident | Residency::Modified));
            if let Some(fork) = unready {
                let why = match fork.state.residency {
                    Residency::Resident => "has no archive copy (run `flotilla hsm archive` first)",
                    _ => "changed since its archive copy was made (archive it again first)",
                };
                return Err(ClientError::Server {
                    server: fork.server.clone(),
                    error: flotilla_proto::WireError::new(
                        flotilla_proto::ErrorCode::InvalidArgument,
                        format!(
                            "release of {} refused: fork {:?} of subfile {} {why}",
                            self.path(),
                            fork.fork,
                            fork.subfile
                        ),
                    ),
                });
            }
        }
        if action != HsmAction::State {
            for (subfile, forks) in self.forks_of_every_subfile()? {
                for info in forks {
                    self.fork(subfile, &info.name)?.hsm(action)?;
                }
            }
        }
        self.hsm_states()
    }

    /// Each fork's state on every server holding a copy of it.
    fn hsm_states(&self) -> Result<Vec<ForkHsm>, ClientError> {
        let mut states = Vec::new();
        for (subfile, forks) in self.forks_of_every_subfile()? {
            for info in forks {
                for (server, state) in self.fork(subfile, &info.name)?.hsm_states()? {
                    states.push(ForkHsm { subfile, fork: info.name.clone(), server, state });
                }
            }
        }
        Ok(states)
    }

    /// Sets the file's size in the metadata service (truncate or extend), shrinking the
    /// subfiles' `data` forks when the file shrinks; under a write token on the whole file.
    pub fn set_size(&self, size_bytes: u64) -> Result<Attributes, ClientError> {
        let _token = self.token(TokenMode::Write, Some(WHOLE_FILE))?;
        if size_bytes < self.size() && self.layout() != Layout::Explicit {
            self.shrink_forks(size_bytes)?;
        }
        self.client.core.forget_pending(self.entry.id);
        let change = SetAttr { size_bytes: Some(size_bytes), mtime_ns: Some(now_ns()), ..SetAttr::default() };
        self.client.set_attr(self.entry.id, change)
    }

    fn shrink_forks(&self, size_bytes: u64) -> Result<(), ClientError> {
        let lengths = subfile_lengths(self.layout(), &self.entry, size_bytes)?;
        for (subfile, length) in lengths.into_iter().enumerate() {
            let fork = self.fork(subfile as u32, DEFAULT_FORK)?;
            if fork.size()? > length {
                fork.truncate(length)?;
            }
        }
        Ok(())
    }

    /// Makes every byte this client wrote to the file durable (see `flush`), then publishes
    /// the size and mtime.
    pub fn sync(&self) -> Result<(), ClientError> {
        self.commit()?;
        self.publish()
    }

    /// Makes this client's writes durable: every fork it wrote is committed (writes a server
    /// restart lost are sent again, then a Sync; all forks at once across servers), and only
    /// then are their size and mtime published to the metadata service, so every client sees
    /// them (close-to-open consistency). The size is never published before the data it covers
    /// is on disk, so a crash cannot leave a file whose acknowledged size reads as zeros. A
    /// handle with nothing to commit sends nothing.
    pub fn flush(&self) -> Result<(), ClientError> {
        let core = &self.client.core;
        let forks = core.unstable.log.lock().forks(Some(self.entry.file_id()));
        if forks.is_empty() && core.pending_size(self.entry.id).is_none() {
            return Ok(());
        }
        self.client.block_on(core.unstable.commit_forks(&core.transport, forks))?;
        self.publish()
    }

    fn commit(&self) -> Result<(), ClientError> {
        let core = &self.client.core;
        self.client.block_on(core.unstable.commit_file(&core.transport, self.entry.file_id()))
    }

    /// Makes the size and mtime this client's writes gave the file known to the metadata
    /// service (what a byte-range token's holder does before giving the token back): the
    /// bytes are committed first (`flush`), so the size never covers bytes a server restart
    /// could still lose.
    pub fn publish_size(&self) -> Result<(), ClientError> {
        self.flush()
    }

    fn publish(&self) -> Result<(), ClientError> {
        self.client.block_on(self.client.core.publish_pending(self.entry.id))
    }

    /// Drops the handle and what this client has not made durable of the file (its unstable
    /// writes and unpublished size): after a write or flush that failed and will not be
    /// retried. The file keeps the size last published, which covers only durable bytes.
    pub fn discard(self) {
        self.client.discard_unpublished(self.entry.id);
    }

    /// Whether the metadata service let this handle read the file: a caller that may not
    /// read it gets no capability with the read right, and the servers refuse every read.
    pub fn may_read(&self) -> bool {
        let rights = self.entry.capability.as_ref().map(|capability| capability.rights);
        rights.is_some_and(|rights| rights.contains(flotilla_proto::Rights::READ))
    }

    /// Flushes the size and mtime and drops the handle.
    pub fn close(self) -> Result<(), ClientError> {
        self.flush()
    }

    /// The file's size as this client knows it: the metadata service's at open, raised by
    /// this client's own writes since.
    pub fn size(&self) -> u64 {
        let pending = self.client.core.pending_size(self.entry.id).unwrap_or(0);
        self.entry.attrs.size_bytes.max(pending)
    }

    /// Truncates or extends the file to `size_bytes` (`set_size`).
    pub fn truncate(&self, size_bytes: u64) -> Result<Attributes, ClientError> {
        self.set_size(size_bytes)
    }

    /// Reads up to `buffer.len()` bytes at linear `offset`; returns the bytes read (short at
    /// end of file). The read token (offset to the end of any file) is taken before the size
    /// is asked, so the size includes every token holder's writes.
    pub fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<usize, ClientError> {
        if buffer.is_empty() {
            return Ok(0);
        }
        let _token = self.token(TokenMode::Read, Some((offset, u64::MAX)))?;
        let size = self.current_size()?;
        let length = size.saturating_sub(offset).min(buffer.len() as u64);
        if length == 0 {
            return Ok(0);
        }
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        let shape = Shape::contiguous(offset, length);
        self.client.block_on(read_linear(&core, &entry, &shape, buffer))?;
        Ok(length as usize)
    }

    /// Writes `data` at linear `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.write_shape(&Shape::contiguous(offset, data.len() as u64), data).map(|_| ())
    }

    /// Reads any shape of the linear file (bytes past the end read as zeros), under a read
    /// token from its lowest byte on.
    pub fn read_shape(&self, shape: &Shape, buffer: &mut [u8]) -> Result<u64, ClientError> {
        let range = self.touched(shape, buffer.len(), read_range)?;
        let _token = self.token(TokenMode::Read, range)?;
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        self.client.block_on(read_linear(&core, &entry, shape, buffer))
    }

    /// Writes any shape of the linear file: one packed request per server, all in flight,
    /// under a write token on its lowest to highest byte (so the write is atomic with
    /// respect to every other token holder).
    pub fn write_shape(&self, shape: &Shape, buffer: &[u8]) -> Result<u64, ClientError> {
        self.write_from(shape, WriteSource::Borrowed(buffer))
    }

    /// [`File::write_shape`] from data handed over as `Bytes`: each request whose pieces are
    /// one run of `data` sends a slice of it and keeps that slice (no copy) until the write
    /// is durable, so `data`'s memory stays alive until then (and goes when the last slice
    /// does); requests whose pieces are scattered in `data` are gathered as `write_shape`'s.
    pub fn write_shape_bytes(&self, shape: &Shape, data: Bytes) -> Result<u64, ClientError> {
        self.write_from(shape, WriteSource::Owned(&data))
    }

    fn write_from(&self, shape: &Shape, source: WriteSource<'_>) -> Result<u64, ClientError> {
        let range = self.touched(shape, source.memory().len(), write_range)?;
        let _token = self.token(TokenMode::Write, range)?;
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        self.client.block_on(write_linear(&core, &entry, shape, source))
    }

    /// Non-blocking `read_shape`: the handle gives back `buffer`, filled.
    pub fn read_shape_nb(&self, shape: Shape, mut buffer: Vec<u8>) -> Handle<Vec<u8>> {
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        let token = self.token_later(TokenMode::Read, self.touched(&shape, buffer.len(), read_range));
        self.client.spawn(async move {
            let _token = token.await?;
            read_linear(&core, &entry, &shape, &mut buffer).await?;
            Ok(buffer)
        })
    }

    /// Non-blocking `write_shape`.
    pub fn write_shape_nb(&self, shape: Shape, buffer: Vec<u8>) -> Handle<u64> {
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        let token = self.token_later(TokenMode::Write, self.touched(&shape, buffer.len(), write_range));
        self.client.spawn(async move {
            let _token = token.await?;
            write_linear(&core, &entry, &shape, WriteSource::Borrowed(&buffer)).await
        })
    }

    /// The bytes `shape` touches as `range_of` counts them (`None`: no token needed).
    fn touched(
        &self,
        shape: &Shape,
        buffer_bytes: usize,
        range_of: fn(&flotilla_request::Summary) -> Option<ByteRange>,
    ) -> Result<Option<ByteRange>, ClientError> {
        match &self.tokens {
            Some(_) => Ok(range_of(&check_call(shape, buffer_bytes)?)),
            None => Ok(None),
        }
    }

    /// A use of `mode` on `range` when this handle takes tokens, held by the caller for
    /// the operation's whole length.
    fn token(&self, mode: TokenMode, range: Option<ByteRange>) -> Result<Option<TokenUse>, ClientError> {
        match (&self.tokens, range) {
            (Some(cache), Some(range)) => cover(cache, &self.path, self.entry.id, mode, range).map(Some),
            _ => Ok(None),
        }
    }

    /// `token` for a call that runs on the client's runtime.
    fn token_later(
        &self,
        mode: TokenMode,
        range: Result<Option<ByteRange>, ClientError>,
    ) -> impl std::future::Future<Output = Result<Option<TokenUse>, ClientError>> + Send + 'static {
        let (cache, path, id) = (self.tokens.clone(), self.path.clone(), self.entry.id);
        async move {
            match (cache, range?) {
                (Some(cache), Some(range)) => cover_async(cache, path, id, mode, range).await.map(Some),
                _ => Ok(None),
            }
        }
    }

    /// The size including other clients' flushed writes (asks the metadata service only when
    /// the read might be past what this handle knows).
    fn current_size(&self) -> Result<u64, ClientError> {
        let known = self.size();
        let request = MetaRequest::GetById { id: self.entry.id };
        match self.client.block_on(self.client.core.transport.meta_call(request))? {
            MetaReply::Entry(entry) => Ok(known.max(entry.attrs.size_bytes)),
            other => Err(unexpected("get by id", &other)),
        }
    }
}

/// Splits a linear shape into one list of pieces per subfile (file offsets in the subfile's
/// `data` fork, memory offsets in the caller's buffer).
fn split_by_subfile(entry: &EntryInfo, shape: &Shape) -> Result<Vec<Vec<Piece>>, ClientError> {
    let layout = entry.layout.unwrap_or(Layout::Explicit);
    let subfiles = entry.subfiles.len() as u32;
    let mut lists: Vec<Vec<Piece>> = vec![Vec::new(); subfiles as usize];
    let mut outcome = Ok(());
    shape.for_each_piece(|piece| {
        let placed =
            layout.for_each_extent(entry.file_id(), subfiles, piece.file_offset, piece.length, |extent| {
                lists[extent.subfile as usize].push(Piece {
                    file_offset: extent.subfile_offset,
                    memory_offset: piece.memory_offset + (extent.linear_offset - piece.file_offset),
                    length: extent.length,
                })
            });
        if let Err(error) = placed {
            outcome = Err(ClientError::Layout(error));
        }
        Ok::<(), ClientError>(())
    })?;
    outcome.map(|()| lists)
}

pub(crate) async fn write_linear(
    core: &Arc<Core>,
    entry: &EntryInfo,
    shape: &Shape,
    source: WriteSource<'_>,
) -> Result<u64, ClientError> {
    let summary = check_call(shape, source.memory().len())?;
    let lists = split_by_subfile(entry, shape)?;
    let writes =
        lists.into_iter().enumerate().filter(|(_, pieces)| !pieces.is_empty()).map(|(subfile, pieces)| {
            let place = fork_ref(entry, subfile as u32, DEFAULT_FORK);
            async move {
                let (fork, server) = place?;
                write_shape(core, &server, &fork, &Shape::List { pieces }, source).await
            }
        });
    futures::future::try_join_all(writes).await?;
    core.note_write(entry.id, summary.file_end, now_ns());
    Ok(summary.total_bytes)
}

pub(crate) async fn read_linear(
    core: &Core,
    entry: &EntryInfo,
    shape: &Shape,
    buffer: &mut [u8],
) -> Result<u64, ClientError> {
    let summary = check_call(shape, buffer.len())?;
    let lists = split_by_subfile(entry, shape)?;
    let buffer_bytes = buffer.len();
    let Some(memory) = CallMemory::new(buffer, lists.iter().flatten().copied()) else {
        return read_linear_copying(core, entry, lists, buffer).await.map(|()| summary.total_bytes);
    };
    let memory = &memory;
    // A replicated subfile's pieces are cut into one part per healthy serving member of its
    // chain (`read_split.rs`), each part read, and failed over, on its own.
    let mut parts = Vec::new();
    for (subfile, pieces) in lists.into_iter().enumerate().filter(|(_, pieces)| !pieces.is_empty()) {
        let (fork, addr) = fork_ref(entry, subfile as u32, DEFAULT_FORK)?;
        let split = match route_chain(&addr) {
            Some(chain) => {
                let bytes = pieces.iter().map(|p| p.length).sum();
                split_pieces(&pieces, read_parts(bytes, core.chains().readers(chain), READ_PART_BYTES_MIN))
            }
            None => vec![pieces],
        };
        let fork = Arc::new(fork);
        parts.extend(split.into_iter().map(|pieces| (fork.clone(), addr.clone(), Shape::List { pieces })));
    }
    let reads = parts.iter().map(|(fork, addr, shape)| async move {
        let (fork, addr) = (&**fork, addr.as_str());
        // A read changes nothing: sent again while the server is away. Each part's pieces
        // are its own: no two parts share a byte.
        core.transport
            .outlast(Service::Server, move |_| async move {
                let destination = destination(&core.transport, core.chains(), addr, Access::Read).await?;
                read_into(core, &destination, fork, shape, buffer_bytes, memory).await
            })
            .await
    });
    futures::future::try_join_all(reads).await?;
    Ok(summary.total_bytes)
}

/// [`read_linear`] for a shape whose pieces overlap in memory: each subfile's bytes are read
/// packed, then copied to their places.
async fn read_linear_copying(
    core: &Core,
    entry: &EntryInfo,
    lists: Vec<Vec<Piece>>,
    buffer: &mut [u8],
) -> Result<(), ClientError> {
    let reads =
        lists.into_iter().enumerate().filter(|(_, pieces)| !pieces.is_empty()).map(|(subfile, pieces)| {
            let place = fork_ref(entry, subfile as u32, DEFAULT_FORK);
            async move {
                let (fork, server) = place?;
                let (packed_shape, bytes) = packed(&pieces);
                let mut packed_buffer = vec![0u8; bytes as usize];
                read_shape(core, &server, &fork, &packed_shape, &mut packed_buffer).await?;
                Ok::<_, ClientError>((pieces, packed_buffer))
            }
        });
    for (pieces, data) in futures::future::try_join_all(reads).await? {
        unpack(&pieces, &data, buffer);
    }
    Ok(())
}

/// The same pieces with memory offsets packed from 0, and their total length.
fn packed(pieces: &[Piece]) -> (Shape, u64) {
    let mut at = 0;
    let packed = pieces
        .iter()
        .map(|p| {
            let piece = Piece { file_offset: p.file_offset, memory_offset: at, length: p.length };
            at += p.length;
            piece
        })
        .collect();
    (Shape::List { pieces: packed }, at)
}

fn unpack(pieces: &[Piece], packed: &[u8], buffer: &mut [u8]) {
    let mut at = 0usize;
    for piece in pieces {
        let (start, length) = (piece.memory_offset as usize, piece.length as usize);
        buffer[start..start + length].copy_from_slice(&packed[at..at + length]);
        at += length;
    }
}

/// For a linear size, how long each subfile's `data` fork must be to hold its bytes.
/// One fork's place in the storage hierarchy (`File::hsm`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkHsm {
    pub subfile: u32,
    pub fork: String,
    pub server: String,
    pub state: flotilla_proto::HsmForkState,
}

/// One range of one fork as `File::scrub` found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkScrub {
    pub subfile: u32,
    pub fork: String,
    pub report: flotilla_proto::ScrubReport,
}

pub fn subfile_lengths(layout: Layout, entry: &EntryInfo, size_bytes: u64) -> Result<Vec<u64>, ClientError> {
    let subfiles = entry.subfiles.len();
    match layout {
        Layout::Explicit => Err(ClientError::Layout(flotilla_types::LayoutError::Explicit)),
        // A hash-placed block keeps its linear offset in its fork: no fork goes past `size`.
        Layout::Hash { .. } => Ok(vec![size_bytes; subfiles]),
        Layout::Stripe { unit_bytes, count } => {
            let width = if count == 0 { subfiles as u64 } else { u64::from(count).min(subfiles as u64) };
            let (units, rest) = (size_bytes / unit_bytes, size_bytes % unit_bytes);
            Ok((0..subfiles as u64)
                .map(|s| {
                    let whole = if s < width { units / width + u64::from(s < units % width) } else { 0 };
                    let partial = if rest > 0 && s == units % width { rest } else { 0 };
                    whole * unit_bytes + partial
                })
                .collect())
        }
    }
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("path", &self.path).field("id", &self.entry.file_id()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::SubfilePlace;
    use flotilla_types::{FileKind, TargetId};

    fn entry(layout: Layout, subfiles: usize) -> EntryInfo {
        let attrs = Attributes {
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size_bytes: 0,
            nlink: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            rdev: 0,
        };
        let subfiles = (0..subfiles)
            .map(|i| SubfilePlace {
                target: TargetId(i as u64),
                server: String::new(),
                up: true,
                chain: None,
            })
            .collect();
        EntryInfo {
            id: 99,
            attrs,
            layout: Some(layout),
            subfiles,
            symlink: None,
            capability: None,
            no_overlap: false,
            replicas: 1,
        }
    }

    #[test]
    fn split_covers_every_byte_once_with_memory_offsets() {
        let entry = entry(Layout::Stripe { unit_bytes: 10, count: 0 }, 3);
        let lists =
            split_by_subfile(&entry, &Shape::Contiguous { file_offset: 7, memory_offset: 100, length: 45 })
                .unwrap();
        let mut seen = [0u32; 45];
        for piece in lists.iter().flatten() {
            for m in piece.memory_offset..piece.memory_offset + piece.length {
                seen[(m - 100) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        assert_eq!(lists[0][0], Piece { file_offset: 7, memory_offset: 100, length: 3 });
        assert_eq!(lists[0][1], Piece { file_offset: 10, memory_offset: 123, length: 10 });
    }

    #[test]
    fn subfile_lengths_hold_exactly_the_file() {
        let layout = Layout::Stripe { unit_bytes: 10, count: 0 };
        let entry = entry(layout, 3);
        // 45 bytes: units 0..4 (+5 bytes of unit 4). Subfile 0: units 0,3 = 20; 1: units 1,4(5) = 15; 2: unit 2 = 10.
        assert_eq!(subfile_lengths(layout, &entry, 45).unwrap(), vec![20, 15, 10]);
    }
}
