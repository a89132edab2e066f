//! Reused large buffers. The process maps every allocation of 1 MiB or more afresh and
//! unmaps it when freed (`M_MMAP_THRESHOLD`, set by the `flotilla` binary to bound resident
//! memory), so a fresh 1 MiB buffer costs 256 page faults and the kernel zeroing each page
//! before the first byte is copied in — in a profile of 1 MiB writes through the mount, a
//! quarter of the mount's own CPU. Buffers of `POOLED_BYTES_MIN` or more are therefore
//! taken from here and given back when the last user is done (for `Bytes`, when the last
//! clone drops: a client's write data once the write is durable and the unstable log lets
//! it go, a server's request frame once the worker is done with its data).
//!
//! Bounded: at most `kept_bytes_max` bytes of buffers wait here, a buffer larger than
//! `POOLED_BYTES_MAX` is never kept, and `trim` frees those idle for longer than it is told
//! (the client calls it every lease renewal, so a process that stopped writing gives the
//! memory back within `IDLE_KEPT_MAX`).

use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Smaller buffers come from the allocator's heap. Not much smaller: glibc gives the top of
/// its heap back to the kernel once more than 128 KiB of it is free (its default trim
/// threshold), so a freed 256 KiB buffer (one server's share of a 1 MiB write striped in
/// 256 KiB units) went back and the next one was faulted in again, while this bound was
/// 512 KiB (docs/performance.md, "Unstable writes held for 32 MiB, not 128 MiB").
pub const POOLED_BYTES_MIN: usize = 128 << 10;
/// Larger buffers are not kept (one would hold the whole budget).
pub const POOLED_BYTES_MAX: usize = 16 << 20;
/// How long the client keeps an idle buffer (`trim`).
pub const IDLE_KEPT_MAX: Duration = Duration::from_secs(5);

/// A bounded free list of large buffers.
#[derive(Debug)]
pub struct BufferPool {
    free: parking_lot::Mutex<Free>,
    kept_bytes_max: usize,
}

#[derive(Debug, Default)]
struct Free {
    /// Idle buffers and when each came back.
    buffers: Vec<(Vec<u8>, Instant)>,
    bytes: usize,
}

impl BufferPool {
    /// A pool keeping at most `kept_bytes_max` bytes of idle buffers (0: none).
    pub fn new(kept_bytes_max: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool { free: parking_lot::Mutex::new(Free::default()), kept_bytes_max })
    }

    /// An empty buffer with room for at least `bytes` bytes: the smallest idle one large
    /// enough (a buffer may be kept as long as its data is, so a small request does not take
    /// a large buffer while one its size waits), else a new one.
    pub fn take(&self, bytes: usize) -> Vec<u8> {
        if bytes >= POOLED_BYTES_MIN {
            let mut free = self.free.lock();
            let fitting =
                free.buffers.iter().enumerate().filter(|(_, (buffer, _))| buffer.capacity() >= bytes);
            if let Some((at, _)) = fitting.min_by_key(|(_, (buffer, _))| buffer.capacity()) {
                let (mut buffer, _) = free.buffers.swap_remove(at);
                free.bytes -= buffer.capacity();
                buffer.clear();
                return buffer;
            }
        }
        Vec::with_capacity(bytes)
    }

    /// Keeps `buffer` for a later `take`, if it is large enough to be worth it and the pool
    /// has room; else frees it.
    pub fn give(&self, buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        if !(POOLED_BYTES_MIN..=POOLED_BYTES_MAX).contains(&capacity) {
            return;
        }
        let mut free = self.free.lock();
        if free.bytes + capacity <= self.kept_bytes_max {
            free.bytes += capacity;
            free.buffers.push((buffer, Instant::now()));
        }
    }

    /// Frees the buffers idle for longer than `idle_max`.
    pub fn trim(&self, idle_max: Duration) {
        let mut free = self.free.lock();
        let before = free.buffers.len();
        free.buffers.retain(|(_, since)| since.elapsed() <= idle_max);
        if free.buffers.len() != before {
            free.bytes = free.buffers.iter().map(|(buffer, _)| buffer.capacity()).sum();
        }
    }

    /// `buffer` as `Bytes` that give it back here when the last clone drops.
    pub fn into_bytes(self: &Arc<Self>, buffer: Vec<u8>) -> Bytes {
        if buffer.capacity() < POOLED_BYTES_MIN {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(Pooled { buffer, pool: self.clone() })
    }

    /// Bytes of idle buffers kept.
    pub fn kept_bytes(&self) -> usize {
        self.free.lock().bytes
    }
}

/// A buffer lent out as `Bytes`.
struct Pooled {
    buffer: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_and_are_reused() {
        let pool = BufferPool::new(4 << 20);
        let mut buffer = pool.take(1 << 20);
        buffer.extend_from_slice(&[7u8; 1 << 20]);
        let address = buffer.as_ptr();
        let bytes = pool.into_bytes(buffer);
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(pool.kept_bytes(), 0, "a clone still holds it");
        assert_eq!(clone[12345], 7);
        drop(clone);
        assert!(pool.kept_bytes() >= 1 << 20);
        let again = pool.take(1000 << 10);
        assert_eq!(again.as_ptr(), address, "the same memory is handed out again");
        assert!(again.is_empty());
        assert_eq!(pool.kept_bytes(), 0);
    }

    #[test]
    fn the_pool_keeps_no_more_than_its_bound_and_no_small_or_huge_buffers() {
        let pool = BufferPool::new(3 << 20);
        for _ in 0..4 {
            pool.give(Vec::with_capacity(1 << 20));
        }
        assert_eq!(pool.kept_bytes(), 3 << 20);
        let fresh = BufferPool::new(usize::MAX);
        fresh.give(Vec::with_capacity(4096));
        fresh.give(Vec::with_capacity(POOLED_BYTES_MAX + 1));
        assert_eq!(fresh.kept_bytes(), 0);
        // Idle buffers go when trimmed.
        pool.trim(Duration::from_secs(3600));
        assert_eq!(pool.kept_bytes(), 3 << 20);
        std::thread::sleep(Duration::from_millis(5));
        pool.trim(Duration::from_millis(1));
        assert_eq!(pool.kept_bytes(), 0);
        // A buffer too small for the request is not handed out.
        let pool = BufferPool::new(8 << 20);
        pool.give(Vec::with_capacity(1 << 20));
        assert!(pool.take(2 << 20).capacity() >= 2 << 20);
        assert_eq!(pool.kept_bytes(), 1 << 20);
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_handed_out() {
        let pool = BufferPool::new(64 << 20);
        for mebibytes in [8, 1, 4, 2] {
            pool.give(Vec::with_capacity(mebibytes << 20));
        }
        assert_eq!(pool.take(1 << 20).capacity(), 1 << 20);
        assert_eq!(pool.take(3 << 20).capacity(), 4 << 20);
        assert_eq!(pool.take(1 << 20).capacity(), 2 << 20);
        assert_eq!(pool.kept_bytes(), 8 << 20);
    }
}
