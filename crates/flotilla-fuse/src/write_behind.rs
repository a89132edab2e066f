//! Write-behind for small writes: the pieces written to one file through this mount are
//! gathered and sent as one `List` request per server (Galley's packing, for programs that
//! write records one `write` at a time, like four processes each writing every fourth
//! 47008-byte record of a shared file).
//!
//! A write smaller than `write_behind_piece_bytes_max` is copied into its file's buffer and
//! acknowledged at once; a buffer reaching `write_behind_bytes_max` is sent by the writer
//! that filled it. Everything a file's buffer holds is sent before this mount reads the file,
//! changes its size, and on every flush (each `close`), fsync and release, so programs see
//! POSIX semantics within the mount and close-to-open consistency across clients. A failed
//! send fails the call that made it, and every later close and fsync of the file while it
//! stays open in this mount (as NFS reports lost write-behind data).
//!
//! Invariants:
//! - pieces in one buffer never overlap (a write overlapping buffered data sends the buffer
//!   first), so one `List` request applies them in any order with the same result;
//! - buffers of one file are sent one at a time, in the order they were filled (the taker
//!   locks `send` before releasing `pending`), so a later write never lands before an
//!   earlier one it overlaps;
//! - at most `write_behind_bytes_max` bytes wait per file, and at most
//!   `write_behind_total_bytes_max` in the whole mount (beyond, writes go straight through).

use flotilla_client::{Piece, Shape};
use fuser::Errno;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bounds of the write-behind buffers.
#[derive(Clone, Copy, Debug)]
pub struct WriteBehindLimits {
    /// Writes at least this long are sent at once (they are large enough on their own).
    pub piece_bytes_max: u64,
    /// A file's buffer is sent when it holds this many bytes.
    pub file_bytes_max: u64,
    /// Bytes buffered in the whole mount; writes beyond are sent at once.
    pub total_bytes_max: u64,
}

#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    pieces: Vec<Piece>,
    /// offset → end of every buffered piece, to find overlaps.
    extents: BTreeMap<u64, u64>,
    /// The first failure of a send: every later flush of the file reports it (some writer's
    /// data was lost), until the file is no longer open in this mount.
    error: Option<Errno>,
}

impl Pending {
    fn overlaps(&self, offset: u64, end: u64) -> bool {
        let before = self.extents.range(..end).next_back();
        before.is_some_and(|(_, piece_end)| *piece_end > offset)
    }

    fn take(&mut self) -> (Vec<Piece>, Vec<u8>) {
        self.extents.clear();
        (std::mem::take(&mut self.pieces), std::mem::take(&mut self.data))
    }
}

/// The buffer of one file.
#[derive(Default)]
struct FileBuffer {
    pending: parking_lot::Mutex<Pending>,
    /// Held while a buffer is being sent.
    send: parking_lot::Mutex<()>,
}

pub struct WriteBehind {
    files: parking_lot::Mutex<HashMap<u64, Arc<FileBuffer>>>,
    buffered_bytes: AtomicU64,
    limits: WriteBehindLimits,
}

/// Sends one buffer of a file: a `List` shape over the buffer's bytes.
pub type Send<'a> = &'a dyn Fn(Shape, &[u8]) -> Result<(), Errno>;

/// What `write` did with the data.
pub enum Buffered {
    /// Copied; acknowledged now, sent later.
    Yes,
    /// Not buffered: the caller sends it (everything buffered before was sent first).
    No,
}

impl WriteBehind {
    pub fn new(limits: WriteBehindLimits) -> WriteBehind {
        assert!(limits.piece_bytes_max <= limits.file_bytes_max);
        WriteBehind {
            files: parking_lot::Mutex::new(HashMap::new()),
            buffered_bytes: AtomicU64::new(0),
            limits,
        }
    }

    fn buffer(&self, ino: u64) -> Arc<FileBuffer> {
        self.files.lock().entry(ino).or_default().clone()
    }

    fn existing(&self, ino: u64) -> Option<Arc<FileBuffer>> {
        self.files.lock().get(&ino).cloned()
    }

    /// Buffers a small write to file `ino` (sending the buffer when full), or says the caller
    /// should send it directly, after everything buffered for `ino` was sent.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8], send: Send<'_>) -> Result<Buffered, Errno> {
        let length = data.len() as u64;
        let room = self.buffered_bytes.load(Ordering::Relaxed) + length <= self.limits.total_bytes_max;
        if length >= self.limits.piece_bytes_max || !room {
            self.flush(ino, send)?;
            return Ok(Buffered::No);
        }
        let buffer = self.buffer(ino);
        let mut pending = buffer.pending.lock();
        if pending.overlaps(offset, offset + length) {
            self.send_locked(&buffer, pending, send)?;
            pending = buffer.pending.lock();
        }
        let piece = Piece { file_offset: offset, memory_offset: pending.data.len() as u64, length };
        pending.data.extend_from_slice(data);
        pending.pieces.push(piece);
        pending.extents.insert(offset, offset + length);
        self.buffered_bytes.fetch_add(length, Ordering::Relaxed);
        if pending.data.len() as u64 >= self.limits.file_bytes_max {
            self.send_locked(&buffer, pending, send)?;
        }
        Ok(Buffered::Yes)
    }

    /// Sends everything buffered for file `ino` and waits for sends in flight.
    pub fn flush(&self, ino: u64, send: Send<'_>) -> Result<(), Errno> {
        let Some(buffer) = self.existing(ino) else { return Ok(()) };
        let pending = buffer.pending.lock();
        self.send_locked(&buffer, pending, send)
    }

    /// `flush` through `file`, a handle of file `ino` (for writes made through another
    /// handle, or none: size changes, revocations).
    pub fn flush_to(&self, ino: u64, file: &flotilla_client::File) -> Result<(), Errno> {
        let send = |shape: Shape, data: &[u8]| {
            file.write_shape(&shape, data).map(|_| ()).map_err(crate::names::failed)
        };
        self.flush(ino, &send)
    }

    /// Whether writes to file `ino` wait in its buffer.
    pub fn holds(&self, ino: u64) -> bool {
        self.existing(ino).is_some_and(|buffer| !buffer.pending.lock().pieces.is_empty())
    }

    /// The first failure of any send of file `ino` since it was opened in this mount (what
    /// close and fsync report: some acknowledged write was lost).
    pub fn failure(&self, ino: u64) -> Result<(), Errno> {
        let failed = self.existing(ino).and_then(|buffer| buffer.pending.lock().error);
        failed.map_or(Ok(()), Err)
    }

    /// Takes the buffer out (under `pending`, whose guard is given), then sends it holding
    /// `send`, which is locked before `pending` is released so that buffers go out in order.
    fn send_locked(
        &self,
        buffer: &FileBuffer,
        mut pending: parking_lot::MutexGuard<'_, Pending>,
        send: Send<'_>,
    ) -> Result<(), Errno> {
        let (pieces, data) = pending.take();
        let sending = buffer.send.lock();
        drop(pending);
        if pieces.is_empty() {
            return Ok(());
        }
        let bytes = data.len() as u64;
        let sent = send(Shape::List { pieces }, &data);
        // Never `pending` while holding `send`: another writer holding `pending` may be
        // waiting for `send` (it locks them in that order).
        drop(sending);
        self.buffered_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if let Err(errno) = sent {
            buffer.pending.lock().error.get_or_insert(errno);
        }
        sent
    }

    /// Forgets file `ino` and any failure recorded for it (its last open handle was released
    /// and flushed).
    pub fn forget(&self, ino: u64) {
        let mut files = self.files.lock();
        if files.get(&ino).is_some_and(|buffer| buffer.pending.lock().pieces.is_empty()) {
            files.remove(&ino);
        }
    }

    #[cfg(test)]
    fn buffered(&self) -> u64 {
        self.buffered_bytes.load(Ordering::Relaxed)
    }
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

    #[test]
    fn small_writes_are_gathered_in_order_and_overlaps_send_first() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 20, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits);
        let sent = parking_lot::Mutex::new(Vec::new());
        let send = |shape: Shape, data: &[u8]| {
            let Shape::List { pieces } = shape else { panic!("a list") };
            sent.lock()
                .push((pieces.iter().map(|p| (p.file_offset, p.length)).collect::<Vec<_>>(), data.to_vec()));
            Ok(())
        };
        // Phase 1: two small writes wait; a large one sends them first and is not buffered.
        assert!(matches!(behind.write(1, 0, b"abc", &send).unwrap(), Buffered::Yes));
        assert!(matches!(behind.write(1, 10, b"de", &send).unwrap(), Buffered::Yes));
        assert_eq!(behind.buffered(), 5);
        assert!(sent.lock().is_empty());
        assert!(matches!(behind.write(1, 50, &[0u8; 10], &send).unwrap(), Buffered::No));
        assert_eq!(sent.lock().pop().unwrap(), (vec![(0, 3), (10, 2)], b"abcde".to_vec()));
        // Phase 2: an overlapping write sends the buffer before it is buffered itself.
        behind.write(1, 0, b"xy", &send).unwrap();
        behind.write(1, 1, b"z", &send).unwrap();
        assert_eq!(sent.lock().pop().unwrap(), (vec![(0, 2)], b"xy".to_vec()));
        // Phase 3: a full buffer is sent by the write that filled it; flush sends the rest.
        for index in 0..8 {
            behind.write(1, 100 + 10 * index, b"123", &send).unwrap();
        }
        assert_eq!(sent.lock().len(), 1);
        behind.flush(1, &send).unwrap();
        assert_eq!(sent.lock().len(), 2);
        assert_eq!(behind.buffered(), 0);
        behind.forget(1);
        assert!(behind.existing(1).is_none());
    }

    #[test]
    fn a_failed_send_is_remembered_until_forgotten() {
        let limits = WriteBehindLimits { piece_bytes_max: 10, file_bytes_max: 100, total_bytes_max: 1000 };
        let behind = WriteBehind::new(limits);
        let failing = |_: Shape, _: &[u8]| Err(Errno::EIO);
        behind.write(2, 0, b"abc", &failing).unwrap();
        assert_eq!(behind.flush(2, &failing), Err(Errno::EIO));
        assert_eq!(behind.flush(2, &|_: Shape, _: &[u8]| Ok(())), Ok(()));
        assert_eq!(behind.failure(2), Err(Errno::EIO));
        behind.forget(2);
        assert_eq!(behind.failure(2), Ok(()));
        assert_eq!(behind.buffered(), 0);
    }
}
