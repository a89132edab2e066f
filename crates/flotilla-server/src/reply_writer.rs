//! Writing a connection's replies.
//!
//! Replies are sent in batches (everything already queued, up to [`BATCH_REPLIES_MAX`]
//! replies and about [`BATCH_DATA_BYTES_MAX`] data bytes) with vectored writes straight
//! from the buffers they were made in: each frame's header, body, data and tag, never copied
//! into a write buffer, so a batch of small replies still shares one `writev` and a large one
//! goes out without a tiny write for its header before it (issue 12). With
//! `integrity = encrypt` a frame's payload is a new ciphertext anyway: those connections
//! write through a buffered writer as before.
//!
//! Invariants: frames are sealed (sequence numbers, tags) in queue order and written in that
//! order; a reply (its data buffer and its share of the server's data budget) is released
//! only after its bytes were handed to the socket; a batch not written within
//! `reply_stall_ms_max`, or moving fewer than `progress_bytes_min` bytes in a window of
//! `progress_interval_ms` (the peer does not read), ends the connection, so a peer that
//! stops reading holds its replies' memory for one window, not for the whole stall limit.

use crate::execute::{BufferPool, Executor, Reply};
use flotilla_auth::wire::FrameParts;
use flotilla_auth::{Integrity, Sealer};
use flotilla_proto::{encode_body, with_progress, Counted, FrameError, ProgressRule};
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Most replies sent in one batch.
const BATCH_REPLIES_MAX: usize = 64;
/// A batch takes no further reply once it holds this many data bytes.
const BATCH_DATA_BYTES_MAX: usize = 4 << 20;

/// How long a batch may take, and how slowly it may move.
type Pace = (Duration, ProgressRule);

/// Writes the replies of one connection until its queue closes or a write fails or stalls.
pub(crate) async fn write_replies(
    (write_half, sealer): (OwnedWriteHalf, Sealer),
    queue: mpsc::Receiver<Reply>,
    executor: Arc<Executor>,
    pace: Pace,
) {
    let write_half = Counted::new(write_half);
    match sealer.integrity() {
        Integrity::Encrypt => write_buffered((write_half, sealer), queue, executor, pace).await,
        Integrity::None | Integrity::Mac => write_vectored((write_half, sealer), queue, executor, pace).await,
    }
}

/// Runs one batch's writing within the stall limit and the progress rule.
async fn paced<F: std::future::Future<Output = Result<(), E>>, E>(
    (reply_stall, progress): Pace,
    moved: &std::sync::atomic::AtomicU64,
    write: F,
) -> bool {
    let limited = tokio::time::timeout(reply_stall, write);
    match with_progress(progress, moved, limited).await {
        Ok(Ok(Ok(()))) => true,
        Ok(Ok(Err(_))) => false,
        Ok(Err(_)) => {
            tracing::warn!(
                ?reply_stall,
                "dropping connection: replies not written within reply_stall_ms_max"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, "dropping connection: the peer does not take its replies");
            false
        }
    }
}

/// A reply with its encoded body and the header and tag that go around it.
struct Sealed {
    reply: Reply,
    body: Vec<u8>,
    parts: FrameParts,
}

impl Sealed {
    fn new(sealer: &mut Sealer, reply: Reply) -> Result<Sealed, FrameError> {
        let body = encode_body(&reply.message)?;
        let parts = sealer.seal_parts(reply.request_id, &body, &reply.data)?;
        Ok(Sealed { reply, body, parts })
    }

    /// The frame's bytes in wire order, empty parts left out.
    fn slices(&self) -> impl Iterator<Item = IoSlice<'_>> {
        let tag = self.parts.tag.as_ref().map_or(&[][..], |tag| &tag[..]);
        [&self.parts.header[..], &self.body[..], &self.reply.data[..], tag]
            .into_iter()
            .filter(|bytes| !bytes.is_empty())
            .map(IoSlice::new)
    }
}

async fn write_vectored(
    (mut write_half, mut sealer): (Counted<OwnedWriteHalf>, Sealer),
    mut queue: mpsc::Receiver<Reply>,
    executor: Arc<Executor>,
    pace: Pace,
) {
    let moved = write_half.moved();
    while let Some(first) = queue.recv().await {
        let batch = match seal_batch(&mut sealer, first, &mut queue) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, "dropping connection: cannot seal a reply");
                return;
            }
        };
        let written = paced(pace, &moved, write_batch(&mut write_half, &batch)).await;
        release(batch, &executor.pool);
        if !written {
            return;
        }
    }
    let _ = write_half.shutdown().await;
}

/// `first` and whatever else is queued already, within the batch bounds, sealed in order.
fn seal_batch(
    sealer: &mut Sealer,
    first: Reply,
    queue: &mut mpsc::Receiver<Reply>,
) -> Result<Vec<Sealed>, FrameError> {
    let mut data_bytes = first.data.len();
    let mut batch = vec![Sealed::new(sealer, first)?];
    while batch.len() < BATCH_REPLIES_MAX && data_bytes < BATCH_DATA_BYTES_MAX {
        let Ok(reply) = queue.try_recv() else { break };
        data_bytes += reply.data.len();
        batch.push(Sealed::new(sealer, reply)?);
    }
    Ok(batch)
}

/// Writes every frame of the batch, as few `writev`s as the socket takes.
async fn write_batch(writer: &mut Counted<OwnedWriteHalf>, batch: &[Sealed]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = batch.iter().flat_map(Sealed::slices).collect();
    let mut remaining = &mut slices[..];
    while !remaining.is_empty() {
        let written = writer.write_vectored(remaining).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, written);
    }
    Ok(())
}

/// Gives the batch's data buffers back to the pool; each reply's share of the data budget
/// is released as it is dropped here, after its bytes were written.
fn release(batch: Vec<Sealed>, pool: &BufferPool) {
    for sealed in batch {
        pool.give(sealed.reply.data);
    }
}

/// The writer of an encrypted connection: each frame is sealed into the sealer's buffer and
/// written through a buffered writer, flushed once the queue is empty.
async fn write_buffered(
    (write_half, mut sealer): (Counted<OwnedWriteHalf>, Sealer),
    mut queue: mpsc::Receiver<Reply>,
    executor: Arc<Executor>,
    pace: Pace,
) {
    let moved = write_half.moved();
    let mut writer = BufWriter::with_capacity(256 << 10, write_half);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(reply) = next.take() {
            let write = write_reply((&mut writer, &mut sealer), reply, &executor.pool);
            if !paced(pace, &moved, write).await {
                return;
            }
            next = queue.try_recv().ok();
        }
        if !paced(pace, &moved, writer.flush()).await {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn write_reply(
    (writer, sealer): (&mut BufWriter<Counted<OwnedWriteHalf>>, &mut Sealer),
    reply: Reply,
    pool: &BufferPool,
) -> Result<(), FrameError> {
    let body = encode_body(&reply.message)?;
    let outcome = sealer.write_frame(writer, reply.request_id, &body, &reply.data).await;
    pool.give(reply.data);
    outcome
}
