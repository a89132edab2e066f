//! Moving a shape's data: planning how a request travels (whole, or split into packed list
//! chunks that fit the server's limits), gathering write data and scattering read data.
//!
//! A read whose pieces do not overlap in memory has each reply's data read from the socket
//! straight into the caller's buffer (`call_memory`, flotilla-rpc `call_into`); one whose
//! pieces overlap gets its replies in frame buffers and copies them, in completion order.
//!
//! A write request's bytes come from one place, `request_data`: a slice of the caller's
//! `Bytes` when the caller handed its data over and the request's pieces are one run of that
//! memory (no copy: the slice is both what is sent and the copy kept until the write is
//! durable), else gathered into a pooled buffer.

use crate::call_memory::CallMemory;
use crate::core::Core;
use crate::error::{unexpected, ClientError};
use crate::replicas::{call, call_into, connect, destination, route_chain, Access, Destination};
use crate::transport::outage::Service;
use crate::transport::ServerConnection;
use crate::unstable::UnstableWrite;
use bytes::Bytes;
use flotilla_proto::buffers::BufferPool;
use flotilla_proto::{encode_body, ForkRef, IoReply, IoRequest};
use flotilla_request::{Piece, Shape, ShapeLimits, Summary};
use flotilla_rpc::{ReplyData, ScatterTarget};
use flotilla_types::Limits;
use futures::stream::{self, StreamExt, TryStreamExt};
use std::ops::Range;
use std::sync::Arc;

/// Most pieces one client call may expand to, however it is split for the wire.
pub const CALL_PIECES_MAX: u64 = 1 << 30;
/// Upper bound on the encoded size of one list piece (three varint u64s).
const PIECE_ENCODED_BYTES_MAX: u64 = 30;
/// Room kept in every frame for the header and the rest of the request.
const FRAME_SLACK_BYTES: u64 = 4096;
/// Chunks of one call in flight at once (credit bounds the bytes further).
const CHUNKS_IN_FLIGHT_MAX: usize = 16;

/// How one call travels: the shape as it is, or lists of pieces.
enum Plan {
    Whole,
    Chunks(Vec<Vec<Piece>>),
}

/// Checks the shape against the caller's buffer and summarizes it.
pub(crate) fn check_call(shape: &Shape, buffer_bytes: usize) -> Result<Summary, ClientError> {
    let summary = shape.validate(&ShapeLimits { pieces_max: CALL_PIECES_MAX, bytes_max: u64::MAX })?;
    if summary.memory_end > buffer_bytes as u64 {
        return Err(ClientError::BufferTooSmall { needed: summary.memory_end, length: buffer_bytes as u64 });
    }
    Ok(summary)
}

fn plan(shape: &Shape, summary: &Summary, limits: &Limits) -> Result<Plan, ClientError> {
    let body_bytes = encode_body(shape).map(|b| b.len() as u64).unwrap_or(u64::MAX);
    let fits = summary.piece_count <= limits.pieces_per_request_max
        && summary.total_bytes <= limits.request_bytes_max
        && body_bytes + summary.total_bytes + FRAME_SLACK_BYTES <= u64::from(limits.frame_bytes_max);
    if fits {
        return Ok(Plan::Whole);
    }
    Ok(Plan::Chunks(split_into_chunks(shape, limits)?))
}

/// Splits a shape's pieces into lists that each fit the limits, cutting pieces larger
/// than a request into several.
fn split_into_chunks(shape: &Shape, limits: &Limits) -> Result<Vec<Vec<Piece>>, ClientError> {
    let frame_room = u64::from(limits.frame_bytes_max).saturating_sub(FRAME_SLACK_BYTES);
    let piece_bytes_max = limits.request_bytes_max.min(frame_room / 2).max(1);
    let mut chunks = Vec::new();
    let mut current: Vec<Piece> = Vec::new();
    let mut current_bytes = 0u64;
    shape.for_each_piece(|piece| {
        for part in cut_piece(piece, piece_bytes_max) {
            let after_bytes = current_bytes + part.length;
            let after_frame = after_bytes + (current.len() as u64 + 1) * PIECE_ENCODED_BYTES_MAX;
            let full = current.len() as u64 >= limits.pieces_per_request_max
                || after_bytes > limits.request_bytes_max
                || after_frame > frame_room;
            if full && !current.is_empty() {
                chunks.push(std::mem::take(&mut current));
                current_bytes = 0;
            }
            current_bytes += part.length;
            current.push(part);
        }
        Ok::<(), ClientError>(())
    })?;
    if !current.is_empty() {
        chunks.push(current);
    }
    Ok(chunks)
}

fn cut_piece(piece: Piece, bytes_max: u64) -> impl Iterator<Item = Piece> {
    let parts = piece.length.div_ceil(bytes_max).max(1);
    (0..parts).map(move |i| {
        let start = i * bytes_max;
        Piece {
            file_offset: piece.file_offset + start,
            memory_offset: piece.memory_offset + start,
            length: piece.length.saturating_sub(start).min(bytes_max),
        }
    })
}

/// Reads `shape` of `fork` at `route` (a server's address, or a replicated subfile's
/// chain: `replicas.rs`) into `buffer`; returns bytes read.
pub(crate) async fn read_shape(
    core: &Core,
    route: &str,
    fork: &ForkRef,
    shape: &Shape,
    buffer: &mut [u8],
) -> Result<u64, ClientError> {
    let summary = check_call(shape, buffer.len())?;
    let buffer_bytes = buffer.len();
    let Some(memory) = CallMemory::for_shape(buffer, shape) else {
        return read_shape_copying(core, route, fork, shape, buffer).await;
    };
    let memory = &memory;
    // A read changes nothing: the whole of it is sent again while the server is away (a
    // replicated subfile's goes to the next serving member).
    core.transport
        .outlast(Service::Server, move |_| async move {
            let destination = destination(&core.transport, core.chains(), route, Access::Read).await?;
            read_into(core, &destination, fork, shape, buffer_bytes, memory).await
        })
        .await?;
    Ok(summary.total_bytes)
}

/// Reads `shape` (whose pieces are pieces of `memory`'s call, covered by no other target)
/// from `destination` into `memory`, each reply's data placed straight where it belongs.
pub(crate) async fn read_into(
    core: &Core,
    destination: &Destination,
    fork: &ForkRef,
    shape: &Shape,
    buffer_bytes: usize,
    memory: &CallMemory<'_>,
) -> Result<(), ClientError> {
    let summary = check_call(shape, buffer_bytes)?;
    let server = &*connect(&core.transport, core.chains(), destination).await?;
    let requests = match plan(shape, &summary, &server.limits)? {
        Plan::Whole => vec![(shape.clone(), memory_runs(shape, summary.total_bytes)?)],
        Plan::Chunks(chunks) => {
            chunks.into_iter().map(|pieces| (Shape::List { pieces: pieces.clone() }, pieces)).collect()
        }
    };
    stream::iter(requests)
        .map(|(shape, pieces)| async move {
            // SAFETY: the requests' pieces (or runs of them) partition the call's (whole, or
            // cut into chunks), so no two targets share a byte.
            let target = unsafe { memory.target(pieces.into_iter()) };
            let target = target.ok_or_else(|| unexpected("read", &"pieces outside the call's memory"))?;
            fetch_into(core, destination, server, fork, shape, target).await
        })
        .buffer_unordered(CHUNKS_IN_FLIGHT_MAX)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Where a whole shape's reply data goes, in wire order: a strided shape whose records
/// follow each other in memory (the usual strided read into a packed buffer) is one run of
/// memory, so the target is made without a piece per record; any other shape, its pieces.
fn memory_runs(shape: &Shape, total_bytes: u64) -> Result<Vec<Piece>, ClientError> {
    if let Shape::Strided { file_offset, memory_offset, record_bytes, memory_stride, .. } = *shape {
        if u64::try_from(memory_stride) == Ok(record_bytes) {
            return Ok(vec![Piece { file_offset, memory_offset, length: total_bytes }]);
        }
    }
    pieces_of(shape)
}

fn pieces_of(shape: &Shape) -> Result<Vec<Piece>, ClientError> {
    let mut pieces = Vec::new();
    shape.for_each_piece(|piece| {
        pieces.push(piece);
        Ok::<(), ClientError>(())
    })?;
    Ok(pieces)
}

/// One read request whose reply data goes straight into `target`.
async fn fetch_into(
    core: &Core,
    destination: &Destination,
    server: &ServerConnection,
    fork: &ForkRef,
    shape: Shape,
    target: ScatterTarget,
) -> Result<(), ClientError> {
    let bytes = target.data_bytes();
    let request = IoRequest::Read { fork: fork.clone(), shape };
    match call_into(&core.transport, core.chains(), destination, server, &request, target).await? {
        (IoReply::Data, ReplyData::Placed { .. }) => Ok(()),
        (IoReply::Data, ReplyData::Other(data)) => Err(ClientError::UnexpectedReply {
            request: "read",
            reply: format!("{} data bytes where {bytes} were asked for", data.len()),
        }),
        (other, _) => Err(unexpected("read", &other)),
    }
}

/// [`read_shape`] for a shape whose pieces overlap in memory: each reply arrives in a frame
/// buffer and is copied to its pieces' places, later replies over earlier ones.
async fn read_shape_copying(
    core: &Core,
    route: &str,
    fork: &ForkRef,
    shape: &Shape,
    buffer: &mut [u8],
) -> Result<u64, ClientError> {
    let summary = check_call(shape, buffer.len())?;
    // Attempts run one after another; the lock only lends the buffer to each in turn.
    let buffer = tokio::sync::Mutex::new(buffer);
    let (summary_ref, buffer) = (&summary, &buffer);
    core.transport
        .outlast(Service::Server, move |_| async move {
            let destination = destination(&core.transport, core.chains(), route, Access::Read).await?;
            let server = connect(&core.transport, core.chains(), &destination).await?;
            let mut buffer = buffer.lock().await;
            let at = (&destination, &*server);
            read_copying_once(core, at, fork, shape, summary_ref, &mut buffer).await
        })
        .await?;
    Ok(summary.total_bytes)
}

/// One attempt of [`read_shape_copying`] on `server`.
async fn read_copying_once(
    core: &Core,
    at: (&Destination, &ServerConnection),
    fork: &ForkRef,
    shape: &Shape,
    summary: &Summary,
    buffer: &mut [u8],
) -> Result<(), ClientError> {
    let server = at.1;
    match plan(shape, summary, &server.limits)? {
        Plan::Whole => {
            let data = fetch(core, at, fork, shape.clone(), summary.total_bytes).await?;
            scatter(shape, &data, buffer)?;
        }
        Plan::Chunks(chunks) => {
            let mut replies = stream::iter(chunks)
                .map(|pieces| async move {
                    let bytes = pieces.iter().map(|p| p.length).sum();
                    let shape = Shape::List { pieces };
                    let data = fetch(core, at, fork, shape.clone(), bytes).await?;
                    Ok::<_, ClientError>((shape, data))
                })
                .buffer_unordered(CHUNKS_IN_FLIGHT_MAX);
            while let Some((shape, data)) = replies.try_next().await? {
                scatter(&shape, &data, buffer)?;
            }
        }
    }
    Ok(())
}

async fn fetch(
    core: &Core,
    (destination, server): (&Destination, &ServerConnection),
    fork: &ForkRef,
    shape: Shape,
    bytes: u64,
) -> Result<Bytes, ClientError> {
    let request = IoRequest::Read { fork: fork.clone(), shape };
    match call(&core.transport, core.chains(), destination, server, &request, Bytes::new(), bytes).await? {
        (IoReply::Data, data) if data.len() as u64 == bytes => Ok(data),
        (IoReply::Data, data) => Err(ClientError::UnexpectedReply {
            request: "read",
            reply: format!("{} data bytes where {bytes} were asked for", data.len()),
        }),
        (other, _) => Err(unexpected("read", &other)),
    }
}

/// Copies packed reply data to each piece's place in the buffer.
fn scatter(shape: &Shape, data: &[u8], buffer: &mut [u8]) -> Result<(), ClientError> {
    let mut at = 0usize;
    shape.for_each_piece(|piece| {
        let length = piece.length as usize;
        let start = piece.memory_offset as usize;
        buffer[start..start + length].copy_from_slice(&data[at..at + length]);
        at += length;
        Ok::<(), ClientError>(())
    })
}

/// Where a write's bytes come from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WriteSource<'a> {
    /// The caller's memory, lent for the call: each request's bytes are gathered (copied)
    /// into a pooled buffer, which is sent and kept until the write is durable.
    Borrowed(&'a [u8]),
    /// Bytes the caller handed over: a request whose pieces are one run of them sends and
    /// keeps a slice (no copy), which holds all of the caller's memory until it is durable.
    Owned(&'a Bytes),
}

impl WriteSource<'_> {
    /// The memory the shape's memory offsets point into.
    pub(crate) fn memory(&self) -> &[u8] {
        match self {
            WriteSource::Borrowed(buffer) => buffer,
            WriteSource::Owned(bytes) => bytes,
        }
    }
}

/// The bytes one write request of `shape` (`total_bytes` of data) sends, packed in piece
/// order, which the client also keeps until they are durable: a slice of owned data when the
/// pieces are one run of it, else gathered. (Bytes are immutable, so a resend after a server
/// restart sends exactly what was acknowledged either way.)
pub(crate) fn request_data(
    pool: &Arc<BufferPool>,
    shape: &Shape,
    total_bytes: u64,
    source: WriteSource<'_>,
) -> Result<Bytes, ClientError> {
    if let WriteSource::Owned(bytes) = source {
        if let Some(run) = one_run(shape, total_bytes)? {
            return Ok(bytes.slice(run));
        }
    }
    gather(pool, shape, total_bytes, source.memory())
}

/// The memory `shape`'s pieces cover when, in wire order, each starts where the one before
/// ends (its packed data is then exactly that range); `None` when they are scattered.
fn one_run(shape: &Shape, total_bytes: u64) -> Result<Option<Range<usize>>, ClientError> {
    let runs = memory_runs(shape, total_bytes)?;
    let mut filled = runs.iter().filter(|run| run.length > 0);
    let Some(first) = filled.next() else { return Ok(None) };
    let mut end = first.memory_offset + first.length;
    for run in filled {
        if run.memory_offset != end {
            return Ok(None);
        }
        end += run.length;
    }
    Ok(Some(first.memory_offset as usize..end as usize))
}

/// Packs each piece's bytes from the buffer, in piece order, into a pooled buffer (it is
/// kept until the write is durable, then goes back to the pool).
fn gather(
    pool: &Arc<BufferPool>,
    shape: &Shape,
    total_bytes: u64,
    buffer: &[u8],
) -> Result<Bytes, ClientError> {
    let mut data = pool.take(total_bytes as usize);
    shape.for_each_piece(|piece| {
        let start = piece.memory_offset as usize;
        data.extend_from_slice(&buffer[start..start + piece.length as usize]);
        Ok::<(), ClientError>(())
    })?;
    Ok(pool.into_bytes(data))
}

/// The requests a write of `shape` travels in: each one's shape and data bytes.
pub(crate) fn write_requests(
    shape: &Shape,
    summary: &Summary,
    limits: &Limits,
) -> Result<Vec<(Shape, u64)>, ClientError> {
    Ok(match plan(shape, summary, limits)? {
        Plan::Whole => vec![(shape.clone(), summary.total_bytes)],
        Plan::Chunks(chunks) => chunks
            .into_iter()
            .map(|pieces| {
                let bytes = pieces.iter().map(|p| p.length).sum();
                (Shape::List { pieces }, bytes)
            })
            .collect(),
    })
}

/// Writes `shape` of `fork` at `route` (a server's address, or a replicated subfile's
/// chain, whose head orders it: `replicas.rs`) from `source`; returns bytes written.
pub(crate) async fn write_shape(
    core: &Arc<Core>,
    addr: &str,
    fork: &ForkRef,
    shape: &Shape,
    source: WriteSource<'_>,
) -> Result<u64, ClientError> {
    let summary = check_call(shape, source.memory().len())?;
    let transport = &core.transport;
    let server = transport
        .outlast(Service::Server, move |_| async move {
            let destination = destination(transport, core.chains(), addr, Access::Change).await?;
            connect(transport, core.chains(), &destination).await
        })
        .await?;
    let requests = write_requests(shape, &summary, &server.limits)?;
    core.unstable.make_room(transport, summary.total_bytes).await?;
    stream::iter(requests)
        .map(|(shape, bytes)| async move {
            let data = request_data(&core.buffers, &shape, bytes, source)?;
            let (shape, data) = (&shape, &data);
            // A write is idempotent by offset: sent again, on a new connection, until the
            // server is back (which first gets the writes its restart lost, `resend_stale`).
            transport.outlast(Service::Server, move |_| write_once(core, addr, fork, shape, data)).await
        })
        .buffer_unordered(CHUNKS_IN_FLIGHT_MAX)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(summary.total_bytes)
}

/// Sends one write request to the server at `addr` and records it as unstable in the boot
/// epoch of the connection that acknowledged it.
async fn write_once(
    core: &Arc<Core>,
    addr: &str,
    fork: &ForkRef,
    shape: &Shape,
    data: &Bytes,
) -> Result<(), ClientError> {
    let (transport, chains) = (&core.transport, core.chains());
    // A chained write is not acknowledged while older writes of its fork are resent through
    // its chain (they would land over it): held until it is recorded (`commit.rs`).
    let _recording = match route_chain(addr) {
        Some(_) => Some(core.unstable.resend_lock(fork).read().await),
        None => None,
    };
    let destination = destination(transport, chains, addr, Access::Change).await?;
    let server = connect(transport, chains, &destination).await?;
    let bytes = data.len() as u64;
    let request = IoRequest::Write { fork: fork.clone(), shape: shape.clone() };
    match call(transport, chains, &destination, &server, &request, data.clone(), bytes).await? {
        (IoReply::Done { bytes: written }, _) if written == bytes => {
            let (fork, addr, shape, data) = (fork.clone(), addr.to_string(), shape.clone(), data.clone());
            // A chained write is recorded in the head's boot epoch: a head that restarted
            // before the Sync may have lost it with every member (`commit.rs`).
            let write = UnstableWrite { fork, addr, shape, data, epoch: server.epoch };
            let held_bytes = core.unstable.log.lock().record(write);
            core.unstable.start_background_drain(&core.transport, held_bytes);
            Ok(())
        }
        (other, _) => Err(unexpected("write", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_every_limit_and_keep_every_byte() {
        let limits = Limits {
            frame_bytes_max: 64 << 10,
            request_bytes_max: 1000,
            pieces_per_request_max: 7,
            in_flight_bytes_max: 1 << 20,
        };
        let shape = Shape::Strided {
            file_offset: 0,
            memory_offset: 0,
            record_bytes: 300,
            file_stride: 500,
            memory_stride: 300,
            count: 40,
        };
        let chunks = split_into_chunks(&shape, &limits).unwrap();
        let mut total = 0;
        for chunk in &chunks {
            assert!(chunk.len() as u64 <= limits.pieces_per_request_max);
            let bytes: u64 = chunk.iter().map(|p| p.length).sum();
            assert!(bytes <= limits.request_bytes_max);
            total += bytes;
        }
        assert_eq!(total, 300 * 40);
        assert!(chunks.len() >= 12, "12000 bytes in requests of at most 1000 need at least 12 chunks");
    }

    /// Memory runs, adjacent ones joined, as `(offset, length)`.
    fn joined(pieces: &[Piece]) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for piece in pieces.iter().filter(|p| p.length > 0) {
            match out.last_mut() {
                Some(last) if last.0 + last.1 == piece.memory_offset => last.1 += piece.length,
                _ => out.push((piece.memory_offset, piece.length)),
            }
        }
        out
    }

    proptest::proptest! {
        /// The runs a whole read's target is made of cover the same memory, in the same wire
        /// order, as the shape's pieces one by one.
        #[test]
        fn memory_runs_cover_what_the_pieces_cover(
            file_offset in 0u64..10_000, memory_offset in 0u64..10_000, record_bytes in 0u64..100,
            file_stride in -200i64..200, memory_stride in -100i64..200, count in 0u64..300,
        ) {
            let shape = Shape::Strided { file_offset, memory_offset, record_bytes, file_stride, memory_stride, count };
            let Ok(summary) = check_call(&shape, usize::MAX) else { return Ok(()) };
            let runs = memory_runs(&shape, summary.total_bytes).unwrap();
            proptest::prop_assert_eq!(joined(&runs), joined(&pieces_of(&shape).unwrap()));
        }
    }

    /// Limits that cut a request after `request_bytes_max` bytes or `pieces_max` pieces.
    fn small_limits(request_bytes_max: u64, pieces_max: u64) -> Limits {
        Limits {
            frame_bytes_max: 1 << 20,
            request_bytes_max,
            pieces_per_request_max: pieces_max,
            in_flight_bytes_max: 1 << 20,
        }
    }

    /// A list shape from `(length, gap)` pairs: each piece's memory starts `gap` bytes after
    /// the one before ends (0: the same run); file offsets go backwards, so the wire order
    /// is the pieces' order and not the file's.
    fn list_from(memory_offset: u64, runs: &[(u64, u64)]) -> Shape {
        let mut at = memory_offset;
        let pieces = runs
            .iter()
            .enumerate()
            .map(|(index, &(length, gap))| {
                at += gap;
                let piece = Piece { file_offset: 1_000_000 - 1000 * index as u64, memory_offset: at, length };
                at += length;
                piece
            })
            .collect();
        Shape::List { pieces }
    }

    /// What each request of a write of `shape` sends from `memory` handed over as `Bytes`,
    /// and what the gather of lent memory (the path every write took before) sends.
    fn sent_both_ways(shape: &Shape, memory: &Bytes, limits: &Limits) -> Vec<(Shape, Bytes, Bytes)> {
        let pool = BufferPool::new(0);
        let summary = check_call(shape, memory.len()).unwrap();
        let requests = write_requests(shape, &summary, limits).unwrap();
        let send = |(shape, bytes): (Shape, u64)| {
            let owned = request_data(&pool, &shape, bytes, WriteSource::Owned(memory)).unwrap();
            let lent = request_data(&pool, &shape, bytes, WriteSource::Borrowed(memory)).unwrap();
            (shape, owned, lent)
        };
        requests.into_iter().map(send).collect()
    }

    /// Whether `part` lies inside `whole`'s memory (a slice of it, not a copy).
    fn inside(part: &Bytes, whole: &Bytes) -> bool {
        let range = whole.as_ptr_range();
        part.is_empty() || (range.start <= part.as_ptr() && part.as_ptr_range().end <= range.end)
    }

    proptest::proptest! {
        /// For any list shape, cut into requests by any limits, each request sends from
        /// handed-over bytes exactly what the gather sends; a slice of the caller's memory
        /// when its pieces are one run, a copy otherwise.
        #[test]
        fn owned_data_sends_what_the_gather_sends(
            memory_offset in 0u64..64,
            runs in proptest::collection::vec((0u64..300, proptest::prop_oneof![3 => proptest::strategy::Just(0u64), 1 => 1u64..50]), 1..40),
            request_bytes_max in 1u64..2000, pieces_max in 1u64..20,
        ) {
            let shape = list_from(memory_offset, &runs);
            let memory_bytes = memory_offset + runs.iter().map(|(length, gap)| length + gap).sum::<u64>();
            let memory = Bytes::from((0..memory_bytes).map(|i| (i * 7 + i / 251) as u8).collect::<Vec<u8>>());
            for (request, owned, lent) in sent_both_ways(&shape, &memory, &small_limits(request_bytes_max, pieces_max)) {
                proptest::prop_assert_eq!(&owned, &lent);
                let pieces = pieces_of(&request).unwrap();
                let filled: Vec<&Piece> = pieces.iter().filter(|p| p.length > 0).collect();
                let one_run = filled.windows(2).all(|w| w[0].memory_offset + w[0].length == w[1].memory_offset);
                proptest::prop_assert_eq!(inside(&owned, &memory), one_run || filled.is_empty());
                proptest::prop_assert!(!inside(&lent, &memory) || lent.is_empty());
            }
        }

        /// The same for strided shapes (records packed in memory are one run).
        #[test]
        fn owned_strided_data_sends_what_the_gather_sends(
            memory_offset in 0u64..64, record_bytes in 1u64..50, file_stride in 50i64..200,
            gap in 0u64..3, count in 1u64..60,
        ) {
            let memory_stride = (record_bytes + gap) as i64;
            let shape = Shape::Strided { file_offset: 0, memory_offset, record_bytes, file_stride, memory_stride, count };
            let memory = Bytes::from(vec![9u8; (memory_offset + count * (record_bytes + gap)) as usize]);
            for (_, owned, lent) in sent_both_ways(&shape, &memory, &small_limits(1 << 20, 1 << 20)) {
                proptest::prop_assert_eq!(&owned, &lent);
                proptest::prop_assert_eq!(inside(&owned, &memory), gap == 0 || count == 1);
            }
        }
    }

    #[test]
    fn a_contiguous_write_sends_slices_of_the_callers_bytes() {
        // 1 MiB handed over, cut into four requests of 256 KiB: each sends a slice.
        let memory = Bytes::from(vec![3u8; 1 << 20]);
        let shape = Shape::List { pieces: vec![Piece { file_offset: 0, memory_offset: 0, length: 1 << 20 }] };
        let sent = sent_both_ways(&shape, &memory, &small_limits(256 << 10, 16));
        assert_eq!(sent.len(), 4);
        for (index, (_, owned, _)) in sent.iter().enumerate() {
            assert_eq!(owned.as_ptr(), memory[index << 18..].as_ptr(), "request {index} is not a slice");
            assert_eq!(owned.len(), 256 << 10);
        }
    }

    #[test]
    fn large_pieces_are_cut() {
        let parts: Vec<Piece> =
            cut_piece(Piece { file_offset: 10, memory_offset: 20, length: 25 }, 10).collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2], Piece { file_offset: 30, memory_offset: 40, length: 5 });
    }
}
