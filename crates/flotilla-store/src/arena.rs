//! The cache's block memory as one anonymous mapping, asked for in transparent huge pages.
//!
//! Why: a request copying small records out of the cache touches a new 4 KiB page every few
//! records, and each of those pages was a TLB miss (a page walk through tables the rest of
//! the machine's work had pushed out of the caches). Slots carved out of one mapping in
//! 2 MiB pages cover a 64 MiB cache in 32 TLB entries; separately allocated slots could not
//! be (issue 12; measured in docs/performance.md).
//!
//! The kernel gives the pages on first touch, zero-filled, so memory is taken as slots are
//! first used, as before; huge pages are a hint (a kernel without them, or with them off,
//! gives small pages and the cache works the same).
//!
//! Invariants: the mapping lives exactly as long as the arena; `slice`/`slice_mut` hand out
//! ranges inside it, and their callers (the slot pool) keep shared and exclusive access to
//! each range apart with one lock per range.

use rustix::mm::{self, Advice, MapFlags, ProtFlags};
use std::io;
use std::ptr::NonNull;

/// One private anonymous mapping of memory.
#[derive(Debug)]
pub(crate) struct Arena {
    base: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the arena is a pointer to memory it owns; what threads may do with which part of
// it is the callers' discipline (`slice`, `slice_mut`).
unsafe impl Send for Arena {}
// SAFETY: as for `Send`; the arena itself has no interior state.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `bytes` bytes (at least one page), read-write, zero-filled on first touch.
    pub(crate) fn new(bytes: usize, huge_pages: bool) -> io::Result<Arena> {
        let bytes = bytes.max(1);
        let protection = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a new private anonymous mapping at an address the kernel picks; nothing
        // else refers to that memory.
        let base = unsafe { mm::mmap_anonymous(std::ptr::null_mut(), bytes, protection, MapFlags::PRIVATE) }?;
        if huge_pages {
            // A hint only: refused where transparent huge pages are not built in.
            // SAFETY: advice on the whole of the mapping just made; it changes no contents.
            let _ = unsafe { mm::madvise(base, bytes, Advice::LinuxHugepage) };
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arena { base, bytes })
    }

    /// The `length` bytes at `offset`.
    ///
    /// # Safety
    /// Nothing may write these bytes while the returned slice lives.
    pub(crate) unsafe fn slice(&self, offset: usize, length: usize) -> &[u8] {
        assert!(offset.checked_add(length).is_some_and(|end| end <= self.bytes), "range past the arena");
        // SAFETY: inside the mapping (checked), which lives as long as `self`; the caller
        // promises no writer.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), length) }
    }

    /// The `length` bytes at `offset`, for writing.
    ///
    /// # Safety
    /// Nothing else may read or write these bytes while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: usize, length: usize) -> &mut [u8] {
        assert!(offset.checked_add(length).is_some_and(|end| end <= self.bytes), "range past the arena");
        // SAFETY: inside the mapping (checked), which lives as long as `self`; the caller
        // promises exclusive access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), length) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of that length; no slice of it outlives `self`.
        if let Err(error) = unsafe { mm::munmap(self.base.as_ptr().cast(), self.bytes) } {
            tracing::error!(%error, "unmapping the cache's memory failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_starts_zeroed_and_keeps_what_is_written_in_each_range() {
        for huge_pages in [false, true] {
            let arena = Arena::new(3 << 20, huge_pages).unwrap();
            // SAFETY: one range at a time in this test.
            unsafe {
                assert!(arena.slice(0, 3 << 20).iter().all(|&byte| byte == 0));
                arena.slice_mut(1 << 20, 4096).fill(7);
                assert!(arena.slice((1 << 20) - 1, 4098).starts_with(&[0, 7]));
                assert_eq!(arena.slice((1 << 20) + 4095, 2), &[7, 0]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "range past the arena")]
    fn a_range_past_the_end_is_refused() {
        let arena = Arena::new(4096, false).unwrap();
        // SAFETY: the call panics before making a slice.
        let _ = unsafe { arena.slice(4000, 97) };
    }
}
