//! Non-blocking calls on memory the caller owns (a numpy array, a C buffer), without the copy
//! into an owned `Vec` that the `_nb` calls of [`Fork`] and [`File`] make.
//!
//! The caller promises, once, in [`RawBuffer::new`], that the memory stays valid and untouched
//! until the call's [`Handle`] has finished; the calls themselves are then safe. A handle has
//! finished when `test` returned true or `wait` returned. Dropping a handle does not cancel
//! the call: a binding that lets go of the memory early must wait first.

use crate::file::{read_linear, write_linear, File};
use crate::fork::Fork;
use crate::handle::Handle;
use crate::transfer::{read_shape, write_shape, WriteSource};
use flotilla_request::Shape;
use std::ptr::NonNull;

/// A span of caller memory lent to one non-blocking call.
#[derive(Debug)]
pub struct RawBuffer {
    pointer: NonNull<u8>,
    length_bytes: usize,
}

// SAFETY: a RawBuffer is only a pointer and a length; whoever created it promised (see `new`)
// that the memory stays valid and is used by nobody else while the call runs, on whatever
// thread the client's runtime polls it.
unsafe impl Send for RawBuffer {}

impl RawBuffer {
    /// Lends `length_bytes` bytes at `pointer` to one call.
    ///
    /// # Safety
    /// `pointer` must be valid for reads and writes of `length_bytes` bytes (reads only, if the
    /// buffer is only passed to write calls), and must stay valid, and be neither read nor
    /// written by anyone else (nor, for write calls, written), until the handle of the call it
    /// is passed to has finished. A null pointer is allowed only with a length of 0.
    pub unsafe fn new(pointer: *mut u8, length_bytes: usize) -> RawBuffer {
        debug_assert!(!pointer.is_null() || length_bytes == 0);
        let pointer = NonNull::new(pointer).unwrap_or(NonNull::dangling());
        RawBuffer { pointer, length_bytes }
    }

    pub fn len(&self) -> usize {
        self.length_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.length_bytes == 0
    }

    /// The memory as a slice living for `'a`.
    ///
    /// # Safety
    /// The promise of `new` must hold for all of `'a`.
    pub(crate) unsafe fn into_slice<'a>(self) -> &'a mut [u8] {
        // SAFETY: `new`'s contract, extended by the caller to `'a`.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length_bytes) }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `new`'s contract: the memory is valid for reads for the buffer's lifetime;
        // a zero-length buffer uses a dangling, well-aligned, non-null pointer.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length_bytes) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `new`'s contract: the memory is valid for writes and used by nobody else
        // while the call that owns this buffer runs.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length_bytes) }
    }
}

impl Fork {
    /// Non-blocking read into caller memory; the handle gives the bytes read.
    pub fn read_raw_nb(&self, shape: Shape, mut buffer: RawBuffer) -> Handle<u64> {
        let (core, server, fork) = (self.client.core.clone(), self.server.clone(), self.fork.clone());
        self.client
            .spawn(async move { read_shape(&core, &server, &fork, &shape, buffer.as_mut_slice()).await })
    }

    /// Non-blocking write from caller memory; the handle gives the bytes written.
    pub fn write_raw_nb(&self, shape: Shape, buffer: RawBuffer) -> Handle<u64> {
        let (core, server, fork) = (self.client.core.clone(), self.server.clone(), self.fork.clone());
        self.client.spawn(async move {
            write_shape(&core, &server, &fork, &shape, WriteSource::Borrowed(buffer.as_slice())).await
        })
    }
}

impl File {
    /// Non-blocking read of the linear file into caller memory; the handle gives the bytes.
    pub fn read_shape_raw_nb(&self, shape: Shape, mut buffer: RawBuffer) -> Handle<u64> {
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        self.client.spawn(async move { read_linear(&core, &entry, &shape, buffer.as_mut_slice()).await })
    }

    /// Non-blocking write of the linear file from caller memory; the handle gives the bytes.
    pub fn write_shape_raw_nb(&self, shape: Shape, buffer: RawBuffer) -> Handle<u64> {
        let (core, entry) = (self.client.core.clone(), self.entry.clone());
        self.client.spawn(async move {
            write_linear(&core, &entry, &shape, WriteSource::Borrowed(buffer.as_slice())).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_buffers_need_no_memory() {
        // SAFETY: a null pointer with length 0 is allowed and never dereferenced.
        let mut buffer = unsafe { RawBuffer::new(std::ptr::null_mut(), 0) };
        assert!(buffer.is_empty());
        assert!(buffer.as_mut_slice().is_empty());
    }

    #[test]
    fn slices_cover_exactly_the_lent_memory() {
        let mut memory = vec![7u8; 16];
        {
            // SAFETY: `memory` outlives `buffer` and is not used while `buffer` is.
            let mut buffer = unsafe { RawBuffer::new(memory.as_mut_ptr().add(4), 8) };
            buffer.as_mut_slice().fill(1);
            assert_eq!(buffer.as_slice().len(), 8);
        }
        assert_eq!(&memory[..4], &[7; 4]);
        assert_eq!(&memory[4..12], &[1; 8]);
        assert_eq!(&memory[12..], &[7; 4]);
    }
}
