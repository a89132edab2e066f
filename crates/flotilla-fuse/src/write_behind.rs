//! Write-behind: writes to a file through this mount are acknowledged once copied, and
//! sent in the background. Small pieces are gathered and sent as one `List` request per
//! server (Galley's packing, for programs that write records one `write` at a time, like
//! four processes each writing every fourth 47008-byte record of a shared file); a write of
//! at least `write_behind_piece_bytes_max` is queued on its own.
//!
//! A write smaller than `write_behind_piece_bytes_max` is copied into its file's buffer; a
//! buffer reaching `write_behind_bytes_max` joins the file's queue, and so does a large
//! write (after the buffer before it). One background thread per file with a queue sends
//! it in order (GPFS's write-behind: the writer goes on while the data travels); a writer
//! finding more than `write_behind_bytes_max` bytes queued for its file sends the oldest
//! batch itself. The thread only speeds things up: writers past the limit and flushes take
//! batches off the queue themselves, so nothing waits on a thread that is gone. Everything
//! written to a file before this mount reads it, changes its size, or flushes it (each
//! `close`), fsyncs or releases it is sent first, so programs see POSIX semantics within
//! the mount and the durability contract holds at `close` and `fsync`. A failed send fails
//! every later close and fsync of the file while it stays open in this mount (as NFS
//! reports lost write-behind data), and the call that made it when it was not in the
//! background.
//!
//! Invariants:
//! - one lock, `pending`, let go while a batch is sent;
//! - pieces in one buffer never overlap (a write overlapping buffered data queues the buffer
//!   first), so one `List` request applies them in any order with the same result;
//! - a file's batches are taken off its queue in the order they were filled (first in,
//!   first out, and a flush queues the buffer behind it and sends or waits for every batch
//!   numbered before its own), and a batch is taken only when its span (first byte to last
//!   of its pieces) overlaps no batch being sent: so a later write never lands before an
//!   earlier one it overlaps, while batches of disjoint parts of the file (several
//!   processes each writing its own segment of one shared file, as IOR and MPI-IO do) are
//!   sent at the same time by the background thread and the writers past the limit;
//! - at most `write_behind_bytes_max` bytes wait per file beyond the batch being sent, and
//!   at most `write_behind_total_bytes_max` in the whole mount (beyond, writes go straight
//!   through).
//!
//! Memory: a batch is the one copy the mount makes of the data (the FUSE request's bytes
//! are the kernel's). It is handed to the client library as `Bytes`
//! (`File::write_shape_bytes`), which sends each server's run of it as a slice and keeps
//! that slice as its copy of the unstable write (no second copy; scattered pieces are
//! gathered). So a batch counts against `write_behind_total_bytes_max` until its send
//! returns, and its buffer then lives on in the client's unstable log until the write is
//! durable, bounded there by the client's `unstable_bytes_max` (which counts the slices'
//! bytes; a buffer is held whole while any slice of it is, so up to its capacity — at most
//! `write_behind_bytes_max + write_behind_piece_bytes_max` for a batch of small writes — per
//! batch). Batch buffers come from the client's pool (`Client::write_buffers`) and go back
//! there when the last slice is let go, so a streaming writer reuses them.

use flotilla_client::{BufferPool, Bytes, Piece, Shape, POOLED_BYTES_MIN};
use fuser::Errno;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bounds of the write-behind buffers.
#[derive(Clone, Copy, Debug)]
pub struct WriteBehindLimits {
    /// Writes at least this long are queued on their own (they are large enough to travel
    /// alone); longer than `file_bytes_max`, the writer sends them itself.
    pub piece_bytes_max: u64,
    /// A file's buffer is queued when it holds this many bytes; a writer finding more than
    /// this many bytes of the file queued sends the oldest batch itself (0: no write-behind).
    pub file_bytes_max: u64,
    /// Bytes buffered and queued in the whole mount; writes beyond are sent at once.
    pub total_bytes_max: u64,
}

/// A batch taken out of a buffer: the pieces and their bytes.
type Batch = (Vec<Piece>, Vec<u8>);

/// A batch in a file's queue, numbered in the order it was queued.
struct Queued {
    seq: u64,
    /// The span of the batch's pieces, found once when it is queued.
    span: Span,
    batch: Batch,
}

#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    pieces: Vec<Piece>,
    /// offset → end of every buffered piece, to find overlaps.
    extents: BTreeMap<u64, u64>,
    /// Batches waiting to be sent, oldest first.
    queued: VecDeque<Queued>,
    /// The number the next queued batch gets.
    next_seq: u64,
    /// The batches taken off the queue and not yet sent: at most one per thread sending
    /// (the background thread, writers past the limit, flushes).
    in_flight: Vec<InFlight>,
    /// Bytes of the queued batches and of those being sent.
    queued_bytes: u64,
    /// A background thread sends the queue (it only speeds things up: writers past the
    /// limit and flushes send queued batches themselves, so nothing waits on the thread).
    draining: bool,
    /// The first failure of a send: every later flush of the file reports it (some writer's
    /// data was lost), until the file is no longer open in this mount.
    error: Option<Errno>,
}

impl Pending {
    fn overlaps(&self, offset: u64, end: u64) -> bool {
        let before = self.extents.range(..end).next_back();
        before.is_some_and(|(_, piece_end)| *piece_end > offset)
    }

    fn take(&mut self) -> Batch {
        self.extents.clear();
        (std::mem::take(&mut self.pieces), std::mem::take(&mut self.data))
    }
}

/// A batch being sent: its number and span.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    seq: u64,
    span: Span,
}

/// First byte and end of a batch's pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u64,
    end: u64,
}

impl Span {
    fn of(pieces: &[Piece]) -> Span {
        let start = pieces.iter().map(|p| p.file_offset).min().unwrap_or(0);
        let end = pieces.iter().map(|p| p.file_offset.saturating_add(p.length)).max().unwrap_or(0);
        Span { start, end }
    }

    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The buffer of one file.
#[derive(Default)]
struct FileBuffer {
    pending: parking_lot::Mutex<Pending>,
    /// Signalled whenever a queued batch was sent and when the background thread ends.
    sent: parking_lot::Condvar,
}

pub struct WriteBehind {
    files: parking_lot::Mutex<HashMap<u64, Arc<FileBuffer>>>,
    accounts: Arc<Accounts>,
    limits: WriteBehindLimits,
}

/// What every file's sends share: the bytes buffered and queued in the whole mount, and the
/// pool batches are copied into (given back once the client lets the sent batch go: fresh
/// 1 MiB buffers cost a page fault and a zeroed page per 4 KiB, see
/// `flotilla_client::BufferPool`).
struct Accounts {
    buffered_bytes: AtomicU64,
    pool: Arc<BufferPool>,
}

/// Sends one buffer of a file: a `List` shape over the buffer's bytes (handed over: the
/// client keeps what it needs of them until they are durable).
pub type Send<'a> = &'a dyn Fn(Shape, Bytes) -> Result<(), Errno>;

/// Sends one buffer of a file from the background thread.
pub type Sender = Arc<dyn Fn(Shape, Bytes) -> Result<(), Errno> + std::marker::Send + Sync>;

/// What `write` did with the data.
pub enum Buffered {
    /// Copied; acknowledged now, sent later.
    Yes,
    /// Not buffered: the caller sends it (everything buffered before was sent first).
    No,
}

impl WriteBehind {
    /// Write-behind within `limits`, its batches copied into buffers from `pool` (the
    /// client's, `Client::write_buffers`: the buffers go back there once durable).
    pub fn new(limits: WriteBehindLimits, pool: Arc<BufferPool>) -> WriteBehind {
        assert!(limits.piece_bytes_max <= limits.file_bytes_max);
        WriteBehind {
            files: parking_lot::Mutex::new(HashMap::new()),
            accounts: Arc::new(Accounts { buffered_bytes: AtomicU64::new(0), pool }),
            limits,
        }
    }

    fn buffer(&self, ino: u64) -> Arc<FileBuffer> {
        self.files.lock().entry(ino).or_default().clone()
    }

    fn existing(&self, ino: u64) -> Option<Arc<FileBuffer>> {
        self.files.lock().get(&ino).cloned()
    }

    /// Buffers or queues a write to file `ino` (queueing the buffer when full), or says the
    /// caller should send it directly (larger than a file's queue, or no room left), after
    /// everything buffered for `ino` was sent. `background` sends the queue from the file's
    /// thread; `send` is what the writer uses when it sends itself.
    pub fn write(
        &self,
        ino: u64,
        (offset, data): (u64, &[u8]),
        send: Send<'_>,
        background: &Sender,
    ) -> Result<Buffered, Errno> {
        let length = data.len() as u64;
        let room =
            self.accounts.buffered_bytes.load(Ordering::Relaxed) + length <= self.limits.total_bytes_max;
        if length >= self.limits.piece_bytes_max || !room {
            return match room && length <= self.limits.file_bytes_max {
                true => self.queue_large(ino, (offset, data), send, background),
                false => self.flush(ino, send).map(|()| Buffered::No),
            };
        }
        let buffer = self.buffer(ino);
        let mut pending = buffer.pending.lock();
        if pending.overlaps(offset, offset + length) {
            pending = self.pass_on(&buffer, pending, send, background);
        }
        let piece = Piece { file_offset: offset, memory_offset: pending.data.len() as u64, length };
        self.grow(&mut pending.data, data.len());
        pending.data.extend_from_slice(data);
        pending.pieces.push(piece);
        pending.extents.insert(offset, offset + length);
        self.accounts.buffered_bytes.fetch_add(length, Ordering::Relaxed);
        if pending.data.len() as u64 >= self.limits.file_bytes_max {
            drop(self.pass_on(&buffer, pending, send, background));
        }
        Ok(Buffered::Yes)
    }

    /// Makes room for `more` bytes in a file's buffer: past `POOLED_BYTES_MIN` it moves into
    /// a pooled buffer that holds a whole batch (instead of doubling into fresh memory).
    fn grow(&self, data: &mut Vec<u8>, more: usize) {
        let needed = data.len() + more;
        if needed <= data.capacity() || needed < POOLED_BYTES_MIN {
            return;
        }
        // A buffer is queued once it holds `file_bytes_max`; the write that got it there
        // is shorter than `piece_bytes_max`.
        let batch_bytes_max = self.limits.file_bytes_max.saturating_add(self.limits.piece_bytes_max);
        let mut larger = self.accounts.pool.take(needed.max(batch_bytes_max as usize));
        larger.extend_from_slice(data);
        self.accounts.pool.give(std::mem::replace(data, larger));
    }

    /// A write of at least `piece_bytes_max`: queued on its own, after the buffer.
    fn queue_large(
        &self,
        ino: u64,
        (offset, data): (u64, &[u8]),
        send: Send<'_>,
        sender: &Sender,
    ) -> Result<Buffered, Errno> {
        let buffer = self.buffer(ino);
        let pending = buffer.pending.lock();
        let mut pending = self.pass_on(&buffer, pending, send, sender);
        let length = data.len() as u64;
        let piece = Piece { file_offset: offset, memory_offset: 0, length };
        self.accounts.buffered_bytes.fetch_add(length, Ordering::Relaxed);
        let mut copy = self.accounts.pool.take(data.len());
        copy.extend_from_slice(data);
        self.enqueue(&buffer, &mut pending, (vec![piece], copy), (send, sender));
        drop(pending);
        Ok(Buffered::Yes)
    }

    /// Hands the buffer on to the file's queue (the writer sending the oldest batches itself
    /// while the queue is full). Returns the buffer's lock.
    fn pass_on<'b>(
        &self,
        buffer: &'b Arc<FileBuffer>,
        mut pending: parking_lot::MutexGuard<'b, Pending>,
        send: Send<'_>,
        sender: &Sender,
    ) -> parking_lot::MutexGuard<'b, Pending> {
        let batch = pending.take();
        if !batch.0.is_empty() {
            self.enqueue(buffer, &mut pending, batch, (send, sender));
        }
        pending
    }

    /// Puts `batch` at the end of the file's queue and starts its background thread if none
    /// runs; then, while more than `file_bytes_max` bytes of the file are queued, sends the
    /// oldest queued batch itself with `send` (or waits for one in flight), so a writer
    /// never depends on the background thread being alive to go on.
    fn enqueue(
        &self,
        buffer: &Arc<FileBuffer>,
        pending: &mut parking_lot::MutexGuard<'_, Pending>,
        batch: Batch,
        (send, sender): (Send<'_>, &Sender),
    ) {
        Self::push(pending, batch);
        if !pending.draining {
            pending.draining = true;
            let (buffer, sender, accounts) = (buffer.clone(), sender.clone(), self.accounts.clone());
            let spawned = std::thread::Builder::new()
                .name("flotilla-write-behind".into())
                .spawn(move || drain(&buffer, &sender, &accounts));
            if let Err(error) = spawned {
                tracing::warn!(%error, "cannot start a write-behind thread; writers and flushes send the queue");
                pending.draining = false;
            }
        }
        while pending.queued_bytes > self.limits.file_bytes_max {
            if !send_front(buffer, pending, send, &self.accounts) {
                wait_for_sends(buffer, pending);
            }
        }
    }

    /// Appends `batch` to the queue with the next number.
    fn push(pending: &mut Pending, batch: Batch) {
        pending.queued_bytes += batch.1.len() as u64;
        let seq = pending.next_seq;
        pending.next_seq += 1;
        pending.queued.push_back(Queued { seq, span: Span::of(&batch.0), batch });
    }

    /// Sends everything written to file `ino` before this call (its buffer is queued behind
    /// the batches before it, so they go out in order), sending queued batches itself and
    /// waiting for those in flight; fails if a send of the file failed while it ran (a failure
    /// before is reported by `failure`, at close and fsync). Batches queued by writers after
    /// the call started are left to them and the background thread.
    pub fn flush(&self, ino: u64, send: Send<'_>) -> Result<(), Errno> {
        let Some(buffer) = self.existing(ino) else { return Ok(()) };
        let mut pending = buffer.pending.lock();
        let failed_before = pending.error.is_some();
        let batch = pending.take();
        if !batch.0.is_empty() {
            Self::push(&mut pending, batch);
        }
        let before = pending.next_seq;
        loop {
            let queued_before = pending.queued.front().is_some_and(|queued| queued.seq < before);
            if queued_before && send_front(&buffer, &mut pending, send, &self.accounts) {
                continue;
            }
            if queued_before || pending.in_flight.iter().any(|sending| sending.seq < before) {
                wait_for_sends(&buffer, &mut pending);
            } else {
                break;
            }
        }
        match pending.error {
            Some(errno) if !failed_before => Err(errno),
            _ => Ok(()),
        }
    }

    /// `flush` through `file`, a handle of file `ino` (for writes made through another
    /// handle, or none: size changes, revocations).
    pub fn flush_to(&self, ino: u64, file: &flotilla_client::File) -> Result<(), Errno> {
        let send = |shape: Shape, data: Bytes| {
            file.write_shape_bytes(&shape, data).map(|_| ()).map_err(crate::names::failed)
        };
        self.flush(ino, &send)
    }

    /// Whether writes to file `ino` wait in its buffer or queue.
    pub fn holds(&self, ino: u64) -> bool {
        self.existing(ino).is_some_and(|buffer| {
            let pending = buffer.pending.lock();
            !pending.pieces.is_empty() || pending.queued_bytes > 0
        })
    }

    /// The first failure of any send of file `ino` since it was opened in this mount (what
    /// close and fsync report: some acknowledged write was lost).
    pub fn failure(&self, ino: u64) -> Result<(), Errno> {
        let failed = self.existing(ino).and_then(|buffer| buffer.pending.lock().error);
        failed.map_or(Ok(()), Err)
    }

    /// Forgets file `ino` and any failure recorded for it (its last open handle was released
    /// and flushed).
    pub fn forget(&self, ino: u64) {
        let mut files = self.files.lock();
        let idle = |buffer: &Arc<FileBuffer>| {
            let pending = buffer.pending.lock();
            pending.pieces.is_empty() && pending.queued_bytes == 0 && !pending.draining
        };
        if files.get(&ino).is_some_and(idle) {
            files.remove(&ino);
        }
    }

    #[cfg(test)]
    fn buffered(&self) -> u64 {
        self.accounts.buffered_bytes.load(Ordering::Relaxed)
    }
}

/// How long a writer or flush waits for a send in flight before it logs that it is still
/// waiting (each send is bounded by the client's socket timeouts; this names a stall).
const SEND_WAIT_WARN: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until some batch in flight is sent (logging every `SEND_WAIT_WARN` while none is).
fn wait_for_sends(buffer: &FileBuffer, pending: &mut parking_lot::MutexGuard<'_, Pending>) {
    while buffer.sent.wait_for(pending, SEND_WAIT_WARN).timed_out() {
        tracing::warn!(
            in_flight = ?pending.in_flight,
            queued = pending.queued.len(),
            queued_bytes = pending.queued_bytes,
            draining = pending.draining,
            "write-behind: still waiting for a send in flight"
        );
    }
}

/// Whether the oldest queued batch may be sent now: there is one, and it overlaps no batch
/// being sent (else it must wait for that one to land first).
fn front_may_go(pending: &Pending) -> Option<Span> {
    let span = pending.queued.front()?.span;
    let clear = pending.in_flight.iter().all(|sending| !sending.span.overlaps(&span));
    clear.then_some(span)
}

/// Takes the oldest queued batch off the queue and sends it with `send` (with `pending`
/// let go meanwhile), if it overlaps no batch being sent; returns whether it did (else the
/// caller waits for a send to end). Books the batch as sent, a failure in `pending.error`
/// (which the next close or fsync reports), and wakes every waiter. A panic in `send` is
/// booked as a failure (EIO), so nobody waits for that batch forever. The batch's buffer is
/// handed over as `Bytes` and goes back to the pool when the client drops the last of it.
fn send_front(
    buffer: &FileBuffer,
    pending: &mut parking_lot::MutexGuard<'_, Pending>,
    send: Send<'_>,
    accounts: &Accounts,
) -> bool {
    let Some(span) = front_may_go(pending) else { return false };
    let Some(Queued { seq, batch: (pieces, data), .. }) = pending.queued.pop_front() else { return false };
    pending.in_flight.push(InFlight { seq, span });
    let bytes = data.len() as u64;
    let data = accounts.pool.into_bytes(data);
    let sent = parking_lot::MutexGuard::unlocked(pending, || {
        let call = std::panic::AssertUnwindSafe(|| send(Shape::List { pieces }, data));
        std::panic::catch_unwind(call).unwrap_or(Err(Errno::EIO))
    });
    pending.in_flight.retain(|sending| sending.seq != seq);
    pending.queued_bytes -= bytes;
    accounts.buffered_bytes.fetch_sub(bytes, Ordering::Relaxed);
    if let Err(errno) = sent {
        tracing::warn!(?errno, bytes, "a write-behind send failed; the next close or fsync reports it");
        pending.error.get_or_insert(errno);
    }
    buffer.sent.notify_all();
    true
}

/// The background thread of one file: sends its queue in order until it is empty.
fn drain(buffer: &FileBuffer, sender: &Sender, accounts: &Accounts) {
    let mut pending = buffer.pending.lock();
    while !pending.queued.is_empty() {
        if !send_front(buffer, &mut pending, &**sender, accounts) {
            wait_for_sends(buffer, &mut pending);
        }
    }
    pending.draining = false;
    buffer.sent.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_detection_covers_neighbours_only_when_they_intersect() {
        let mut pending = Pending::default();
        pending.extents.insert(100, 200);
        pending.extents.insert(300, 400);
        assert!(!pending.overlaps(0, 100));
        assert!(pending.overlaps(0, 101));
        assert!(pending.overlaps(199, 250));
        assert!(!pending.overlaps(200, 300));
        assert!(pending.overlaps(250, 301));
        assert!(!pending.overlaps(400, 500));
        let (pieces, data) = pending.take();
        assert!(pieces.is_empty() && data.is_empty() && pending.extents.is_empty());
    }

    type Lists = Arc<parking_lot::Mutex<Vec<(Vec<(u64, u64)>, Vec<u8>)>>>;

    /// A sender that records each list it sent: (offset, length) of its pieces, and its data.
    fn recording(lists: Lists) -> Sender {
        Arc::new(move |shape: Shape, data: Bytes| {
            let Shape::List { pieces } = shape else { panic!("a list") };
            lists.lock().push((pieces.iter().map(|p| (p.file_offset, p.length)).collect(), data.to_vec()));
            Ok(())
        })
    }

    #[test]
    fn small_writes_are_gathered_in_order_and_overlaps_send_first() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 20, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
        let lists = Lists::default();
        let sender = recording(lists.clone());
        let send = |shape: Shape, data: Bytes| sender(shape, data);
        // Phase 1: two small writes wait in the buffer; a large one is queued behind them.
        assert!(matches!(behind.write(1, (0, b"abc"), &send, &sender).unwrap(), Buffered::Yes));
        assert!(matches!(behind.write(1, (10, b"de"), &send, &sender).unwrap(), Buffered::Yes));
        assert_eq!(behind.buffered(), 5);
        assert!(lists.lock().is_empty());
        assert!(matches!(behind.write(1, (50, &[0u8; 10]), &send, &sender).unwrap(), Buffered::Yes));
        behind.flush(1, &send).unwrap();
        let sent = std::mem::take(&mut *lists.lock());
        assert_eq!(sent, [(vec![(0, 3), (10, 2)], b"abcde".to_vec()), (vec![(50, 10)], vec![0u8; 10])]);
        // Phase 2: an overlapping write passes the buffer on before it is buffered itself.
        behind.write(1, (0, b"xy"), &send, &sender).unwrap();
        behind.write(1, (1, b"z"), &send, &sender).unwrap();
        behind.flush(1, &send).unwrap();
        let sent = std::mem::take(&mut *lists.lock());
        assert_eq!(sent, [(vec![(0, 2)], b"xy".to_vec()), (vec![(1, 1)], b"z".to_vec())]);
        // Phase 3: the write that fills the buffer queues it; flush sends the rest after it.
        for index in 0..8 {
            behind.write(1, (100 + 10 * index, b"123"), &send, &sender).unwrap();
        }
        behind.flush(1, &send).unwrap();
        let sent = std::mem::take(&mut *lists.lock());
        let offsets: Vec<Vec<u64>> =
            sent.iter().map(|(pieces, _)| pieces.iter().map(|p| p.0).collect()).collect();
        assert_eq!(offsets, [(100..=160).step_by(10).collect::<Vec<u64>>(), vec![170]]);
        // Phase 4: a write larger than a file's queue is the caller's to send, after the rest.
        behind.write(1, (300, b"q"), &send, &sender).unwrap();
        assert!(matches!(behind.write(1, (400, &[5u8; 21]), &send, &sender).unwrap(), Buffered::No));
        assert_eq!(std::mem::take(&mut *lists.lock()), [(vec![(300, 1)], b"q".to_vec())]);
        assert_eq!(behind.buffered(), 0);
        // Forgotten once its background thread has ended (it ends when the queue is empty).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while {
            behind.forget(1);
            behind.existing(1).is_some()
        } {
            assert!(std::time::Instant::now() < deadline, "the file's background thread never ended");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_batch_is_handed_over_and_its_buffer_comes_back_once_the_client_lets_go() {
        let limits = WriteBehindLimits {
            piece_bytes_max: 512 << 10,
            file_bytes_max: 4 << 20,
            total_bytes_max: 64 << 20,
        };
        let pool = BufferPool::new(64 << 20);
        let behind = WriteBehind::new(limits, pool.clone());
        // The client keeps a slice of what it was sent until the write is durable.
        let kept: Arc<parking_lot::Mutex<Vec<Bytes>>> = Arc::default();
        let keeping = kept.clone();
        let sender: Sender = Arc::new(move |_: Shape, data: Bytes| {
            keeping.lock().push(data.slice(..));
            Ok(())
        });
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        behind.write(1, (0, &data), &*sender, &sender).unwrap();
        behind.flush(1, &*sender).unwrap();
        let address = {
            let kept = kept.lock();
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0][..], data[..]);
            kept[0].as_ptr()
        };
        assert_eq!(behind.buffered(), 0, "the mount's count lets go once the send returns");
        assert_eq!(pool.kept_bytes(), 0, "the batch's buffer is the client's kept copy");
        kept.lock().clear();
        assert!(pool.kept_bytes() >= 1 << 20, "back in the pool once the client lets go");
        let again = pool.take(1 << 20);
        assert_eq!(again.as_ptr(), address, "the kept copy was the batch itself");
    }

    #[test]
    fn a_failed_send_is_remembered_until_forgotten() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 100, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
        let failing: Sender = Arc::new(|_: Shape, _: Bytes| Err(Errno::EIO));
        let send = |shape: Shape, data: Bytes| failing(shape, data);
        behind.write(2, (0, b"abc"), &send, &failing).unwrap();
        assert_eq!(behind.flush(2, &send), Err(Errno::EIO));
        assert_eq!(behind.flush(2, &|_: Shape, _: Bytes| Ok(())), Ok(()));
        assert_eq!(behind.failure(2), Err(Errno::EIO));
        behind.forget(2);
        assert_eq!(behind.failure(2), Ok(()));
        assert_eq!(behind.buffered(), 0);
    }

    type Sent = Arc<parking_lot::Mutex<Vec<(u64, usize)>>>;
    type Gate = Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>;

    /// A sender that records what it sent and waits for `gate` to open before each send.
    fn gated(sent: Sent, gate: Gate) -> Sender {
        Arc::new(move |shape: Shape, data: Bytes| {
            let (open, opened) = &*gate;
            let mut is_open = open.lock();
            while !*is_open {
                opened.wait(&mut is_open);
            }
            let Shape::List { pieces } = shape else { panic!("a list") };
            sent.lock().push((pieces[0].file_offset, data.len()));
            Ok(())
        })
    }

    #[test]
    fn writes_of_every_size_return_before_they_are_sent_and_go_out_in_order() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 40, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
        let sent = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let gate = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let sender = gated(sent.clone(), gate.clone());
        let direct = |_: Shape, _: Bytes| -> Result<(), Errno> { panic!("nothing is sent by the writer") };
        // A small piece, then a large write (queued after it), then a small one again.
        assert!(matches!(behind.write(1, (0, b"abc"), &direct, &sender).unwrap(), Buffered::Yes));
        assert!(matches!(behind.write(1, (3, &[1u8; 20]), &direct, &sender).unwrap(), Buffered::Yes));
        assert!(matches!(behind.write(1, (23, b"de"), &direct, &sender).unwrap(), Buffered::Yes));
        assert!(sent.lock().is_empty(), "nothing went out while the gate was shut");
        assert!(behind.holds(1));
        *gate.0.lock() = true;
        gate.1.notify_all();
        let flushed = |shape: Shape, data: Bytes| {
            let Shape::List { pieces } = shape else { panic!("a list") };
            sent.lock().push((pieces[0].file_offset, data.len()));
            Ok(())
        };
        behind.flush(1, &flushed).unwrap();
        assert_eq!(*sent.lock(), vec![(0, 3), (3, 20), (23, 2)], "in the order written");
        assert_eq!(behind.buffered(), 0);
        assert!(!behind.holds(1));
    }

    /// Queues two 10-byte batches of file 1, at 0 and at `second`, and waits until the
    /// background thread holds the first at the shut gate; then a writer thread writes 10
    /// bytes at 20, which finds 30 bytes queued (over the 20 allowed) and must send the second
    /// batch itself or wait. Returns the mount, the gate and what was sent, and the writer.
    fn third_write_past_a_full_queue(
        second: u64,
    ) -> (Arc<WriteBehind>, Gate, Sent, Arc<std::sync::atomic::AtomicBool>) {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 20, total_bytes_max: 1000 };
        let behind = Arc::new(WriteBehind::new(limits, BufferPool::new(16 << 20)));
        let sent: Sent = Arc::default();
        let gate: Gate = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let sender = gated(sent.clone(), gate.clone());
        let direct = recorder(sent.clone());
        behind.write(1, (0, &[0u8; 10]), &*direct, &sender).unwrap();
        behind.write(1, (second, &[0u8; 10]), &*direct, &sender).unwrap();
        while behind.existing(1).unwrap().pending.lock().in_flight.is_empty() {
            std::thread::yield_now(); // the background thread took the first to the gate
        }
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (writer, finished) = (behind.clone(), done.clone());
        std::thread::spawn(move || {
            writer.write(1, (20, &[0u8; 10]), &*direct, &sender).unwrap();
            finished.store(true, Ordering::SeqCst);
        });
        (behind, gate, sent, done)
    }

    /// A sender that records the first offset and length of what it sent, at once.
    fn recorder(sent: Sent) -> Sender {
        Arc::new(move |shape: Shape, data: Bytes| {
            let Shape::List { pieces } = shape else { panic!("a list") };
            sent.lock().push((pieces[0].file_offset, data.len()));
            Ok(())
        })
    }

    fn open_gate(gate: &Gate) {
        *gate.0.lock() = true;
        gate.1.notify_all();
    }

    #[test]
    fn a_writer_waits_while_its_file_queue_is_full_of_batches_it_overlaps() {
        // The second batch (5..15) overlaps the first, held at the gate: the writer may not
        // send it before the first lands, so it waits.
        let (behind, gate, sent, done) = third_write_past_a_full_queue(5);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!done.load(Ordering::SeqCst), "the writer went on past a full queue");
        assert!(sent.lock().is_empty(), "an overlapping batch went out before the one it overlaps");
        open_gate(&gate);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "the writer never went on");
            std::thread::yield_now();
        }
        behind.flush(1, &*recorder(sent.clone())).unwrap();
        assert_eq!(*sent.lock(), vec![(0, 10), (5, 10), (20, 10)], "in the order written");
    }

    #[test]
    fn disjoint_batches_of_one_file_are_sent_at_the_same_time() {
        // The second batch (10..20) is disjoint from the first, held at the gate: the writer
        // sends it itself while the first is still on its way, and goes on.
        let (behind, gate, sent, done) = third_write_past_a_full_queue(10);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "the writer waited for a disjoint batch");
            std::thread::yield_now();
        }
        assert_eq!(*sent.lock(), vec![(10, 10)], "the second batch went out beside the first");
        open_gate(&gate);
        behind.flush(1, &*recorder(sent.clone())).unwrap();
        let mut landed = sent.lock().clone();
        assert_eq!(landed[0], (10, 10));
        landed.sort_unstable();
        assert_eq!(landed, vec![(0, 10), (10, 10), (20, 10)], "every batch once");
        assert_eq!(behind.buffered(), 0);
    }

    #[test]
    fn spans_overlap_only_when_they_share_a_byte() {
        let piece = |file_offset, length| Piece { file_offset, memory_offset: 0, length };
        let span = Span::of(&[piece(100, 10), piece(40, 5)]);
        assert_eq!(span, Span { start: 40, end: 110 });
        assert!(span.overlaps(&Span { start: 109, end: 200 }));
        assert!(span.overlaps(&Span { start: 0, end: 41 }));
        assert!(span.overlaps(&Span { start: 60, end: 70 }), "a gap inside a span still counts");
        assert!(!span.overlaps(&Span { start: 110, end: 200 }));
        assert!(!span.overlaps(&Span { start: 0, end: 40 }));
    }

    #[test]
    fn a_failed_background_send_is_reported_by_the_flush_after_it() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 100, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
        let failing: Sender = Arc::new(|_: Shape, _: Bytes| Err(Errno::EIO));
        let direct = |_: Shape, _: Bytes| Ok(());
        behind.write(3, (0, &[7u8; 50]), &direct, &failing).unwrap();
        // Wait for the background thread (the flush would otherwise send the batch itself).
        while behind.holds(3) {
            std::thread::yield_now();
        }
        behind.flush(3, &direct).unwrap();
        assert_eq!(behind.failure(3), Err(Errno::EIO), "the lost write is reported");
        assert_eq!(behind.buffered(), 0);
        behind.forget(3);
        assert_eq!(behind.failure(3), Ok(()));
    }

    #[test]
    fn concurrent_writers_and_flushes_send_every_byte_once() {
        let limits =
            WriteBehindLimits { piece_bytes_max: 500, file_bytes_max: 4000, total_bytes_max: 1 << 20 };
        let behind = Arc::new(WriteBehind::new(limits, BufferPool::new(16 << 20)));
        let sent_bytes = Arc::new(AtomicU64::new(0));
        let counted = sent_bytes.clone();
        let sender: Sender = Arc::new(move |_: Shape, data: Bytes| {
            std::thread::sleep(std::time::Duration::from_micros(50));
            counted.fetch_add(data.len() as u64, Ordering::SeqCst);
            Ok(())
        });
        let writers: Vec<_> = (0..4u64)
            .map(|writer| {
                let (behind, sender, sent_bytes) = (behind.clone(), sender.clone(), sent_bytes.clone());
                std::thread::spawn(move || {
                    let direct = move |_: Shape, data: Bytes| {
                        sent_bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
                        Ok(())
                    };
                    for index in 0..300u64 {
                        let length = if index % 3 == 0 { 100 } else { 1000 };
                        let offset = (writer * 300 + index) * 1000;
                        behind.write(9, (offset, &vec![1u8; length][..]), &direct, &sender).unwrap();
                        if index % 50 == 49 {
                            behind.flush(9, &direct).unwrap();
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let direct = |_: Shape, data: Bytes| {
            sent_bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
            Ok(())
        };
        behind.flush(9, &direct).unwrap();
        let expected: u64 = 4 * (100 * 100 + 200 * 1000);
        assert_eq!(sent_bytes.load(Ordering::SeqCst), expected);
        assert_eq!(behind.buffered(), 0);
    }

    /// Applies a sent `List` batch to `file` (a model of the servers' bytes).
    fn apply(file: &parking_lot::Mutex<Vec<u8>>, shape: Shape, data: &[u8]) {
        let Shape::List { pieces } = shape else { panic!("a list") };
        let mut file = file.lock();
        for piece in pieces {
            let (at, from) = (piece.file_offset as usize, piece.memory_offset as usize);
            let length = piece.length as usize;
            if file.len() < at + length {
                file.resize(at + length, 0);
            }
            file[at..at + length].copy_from_slice(&data[from..from + length]);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever mix of small, large and overlapping writes and flushes one writer makes,
        /// with the background thread and the writer both sending, the servers end up with
        /// the bytes of the writes applied in the order they were made.
        #[test]
        fn overlapping_writes_land_in_the_order_made(
            writes in proptest::collection::vec((0u64..200, 1usize..60, proptest::prelude::any::<bool>()), 1..60)
        ) {
            let limits = WriteBehindLimits { piece_bytes_max: 20, file_bytes_max: 50, total_bytes_max: 10_000 };
            let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
            let file = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let background = file.clone();
            let sender: Sender = Arc::new(move |shape: Shape, data: Bytes| {
                std::thread::yield_now();
                apply(&background, shape, &data);
                Ok(())
            });
            let direct = |shape: Shape, data: Bytes| {
                apply(&file, shape, &data);
                Ok(())
            };
            let mut model = Vec::new();
            for (index, (offset, length, flush)) in writes.into_iter().enumerate() {
                let data = vec![index as u8 + 1; length];
                if let Buffered::No = behind.write(5, (offset, &data), &direct, &sender).unwrap() {
                    direct(Shape::List { pieces: vec![Piece { file_offset: offset, memory_offset: 0, length: length as u64 }] }, Bytes::from(data.clone())).unwrap();
                }
                let end = offset as usize + length;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(&data);
                if flush {
                    behind.flush(5, &direct).unwrap();
                }
            }
            behind.flush(5, &direct).unwrap();
            proptest::prop_assert_eq!(&*file.lock(), &model);
            proptest::prop_assert_eq!(behind.buffered(), 0);
        }
    }

    #[test]
    fn a_panicking_background_sender_fails_the_file_instead_of_hanging_it() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 100, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits, BufferPool::new(16 << 20));
        let panicking: Sender = Arc::new(|_: Shape, _: Bytes| panic!("a bug in a send"));
        let direct =
            |_: Shape, _: Bytes| -> Result<(), Errno> { panic!("below the limit the writer sends nothing") };
        for index in 0..6u64 {
            behind.write(4, (index * 10, &[1u8; 10]), &direct, &panicking).unwrap();
        }
        while behind.existing(4).is_some_and(|buffer| buffer.pending.lock().draining) {
            std::thread::yield_now();
        }
        assert!(!behind.holds(4), "every batch was booked, none left for a thread that is gone");
        behind.flush(4, &direct).unwrap();
        assert_eq!(behind.failure(4), Err(Errno::EIO), "the panicked send is reported as lost");
        assert_eq!(behind.buffered(), 0);
    }

    #[test]
    fn a_flush_returns_while_another_writer_keeps_writing() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 40, total_bytes_max: 1 << 20 };
        let behind = Arc::new(WriteBehind::new(limits, BufferPool::new(16 << 20)));
        let sender: Sender = Arc::new(|_: Shape, _: Bytes| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (behind, sender, stop) = (behind.clone(), sender.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut offset = 0;
                while !stop.load(Ordering::SeqCst) {
                    behind.write(6, (offset, &[2u8; 10]), &|_: Shape, _: Bytes| Ok(()), &sender).unwrap();
                    offset += 10;
                }
            })
        };
        while !behind.holds(6) {
            std::thread::yield_now();
        }
        // Before, a flush waited for the queue to be empty, which a busy writer never let it be.
        for _ in 0..20 {
            behind.flush(6, &|_: Shape, _: Bytes| Ok(())).unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        behind.flush(6, &|_: Shape, _: Bytes| Ok(())).unwrap();
        assert_eq!(behind.buffered(), 0);
    }
}
