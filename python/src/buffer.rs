//! Python buffers (numpy arrays, bytearrays, memoryviews) exported for I/O without a copy.
//!
//! A [`BufferView`] holds one buffer export (`PyObject_GetBuffer`) for as long as the I/O
//! runs: while it is held the exporter keeps the memory where it is (numpy refuses to resize
//! an exported array, a bytearray cannot grow), and the view keeps a reference to the object.
//! The export is released (`PyBuffer_Release`) only while attached to the interpreter.

use crate::errors::invalid;
use flotilla_client::{array_request, c_order_strides, ArrayDim, ArrayRequest};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::CStr;

/// One buffer export, released on drop.
pub struct BufferView {
    // Boxed so the Py_buffer never moves while exported (some exporters point into it).
    raw: Box<ffi::Py_buffer>,
}

// SAFETY: a Py_buffer is plain data (pointers into memory its exporter keeps alive while the
// export is held). The only operation that needs the interpreter, PyBuffer_Release, is done
// in `Drop` after attaching to it, so the view may move to and be dropped on any thread.
unsafe impl Send for BufferView {}
// SAFETY: shared references only read the Py_buffer's fields, which never change.
unsafe impl Sync for BufferView {}

/// Which exports a call needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The call reads from the file into the buffer.
    Writable,
    /// The call writes the buffer's bytes to the file.
    ReadOnly,
}

impl BufferView {
    /// Exports `object`'s buffer with strides and format.
    pub fn export(object: &Bound<'_, PyAny>, access: Access) -> PyResult<BufferView> {
        let mut flags = ffi::PyBUF_STRIDES | ffi::PyBUF_FORMAT;
        if access == Access::Writable {
            flags |= ffi::PyBUF_WRITABLE;
        }
        // SAFETY: Py_buffer is a C struct for which all-zero bytes are a valid (empty) value.
        let mut raw: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `object` is a live object (we hold a reference and are attached), and `raw`
        // points to writable memory for one Py_buffer that outlives the export.
        let status = unsafe { ffi::PyObject_GetBuffer(object.as_ptr(), &mut *raw, flags) };
        if status != 0 {
            return Err(PyErr::fetch(object.py()));
        }
        let view = BufferView { raw };
        view.check_plain_data(object.py())?;
        Ok(view)
    }

    fn ndim(&self) -> usize {
        usize::try_from(self.raw.ndim).unwrap_or(0)
    }

    pub fn itemsize(&self) -> u64 {
        u64::try_from(self.raw.itemsize).unwrap_or(0)
    }

    /// Total bytes of the exported elements.
    pub fn len_bytes(&self) -> usize {
        usize::try_from(self.raw.len).unwrap_or(0)
    }

    fn counts(&self) -> Vec<u64> {
        if self.raw.shape.is_null() {
            return if self.ndim() == 0 {
                Vec::new()
            } else {
                vec![self.len_bytes() as u64 / self.itemsize().max(1)]
            };
        }
        // SAFETY: with PyBUF_STRIDES the exporter fills `shape` with `ndim` entries that stay
        // valid while the export is held.
        let shape = unsafe { std::slice::from_raw_parts(self.raw.shape, self.ndim()) };
        shape.iter().map(|&n| u64::try_from(n).unwrap_or(0)).collect()
    }

    fn strides(&self) -> Vec<i64> {
        if self.raw.strides.is_null() {
            return c_order_strides(self.itemsize(), &self.counts()).unwrap_or_default();
        }
        // SAFETY: as for `shape`: `ndim` entries, valid while the export is held.
        let strides = unsafe { std::slice::from_raw_parts(self.raw.strides, self.ndim()) };
        strides.iter().map(|&s| s as i64).collect()
    }

    /// The struct-module format of the elements ("B" when the exporter gives none).
    fn format(&self) -> String {
        if self.raw.format.is_null() {
            return "B".to_string();
        }
        // SAFETY: with PyBUF_FORMAT the exporter gives a NUL-terminated string that stays
        // valid while the export is held.
        unsafe { CStr::from_ptr(self.raw.format) }.to_string_lossy().into_owned()
    }

    /// Refuses elements that are not plain bytes: Python object pointers (numpy `object`
    /// dtype) must never be written to or read from a file.
    fn check_plain_data(&self, py: Python<'_>) -> PyResult<()> {
        let format = self.format();
        if holds_objects(&format) {
            return Err(invalid(py, format!("cannot do I/O on Python objects (buffer format {format:?}); use a numeric or bytes dtype")));
        }
        if self.itemsize() == 0 {
            return Err(invalid(py, "buffer elements have size 0"));
        }
        Ok(())
    }

    /// Whether the buffer is one dense block of memory (C- or Fortran-contiguous).
    pub fn is_contiguous(&self) -> bool {
        // SAFETY: `raw` is a filled export; PyBuffer_IsContiguous only reads it.
        unsafe { ffi::PyBuffer_IsContiguous(&*self.raw, b'A' as std::os::raw::c_char) == 1 }
    }

    /// The buffer as one dense block, for requests that address its bytes by offset.
    pub fn contiguous_region(&self, py: Python<'_>) -> PyResult<Region> {
        if !self.is_contiguous() {
            return Err(invalid(
                py,
                "buffer is not contiguous: shapes address a buffer's bytes by offset, so pass a \
                 contiguous buffer (or use read_into / write_from for strided numpy views)",
            ));
        }
        Ok(Region { start: self.raw.buf.cast::<u8>(), length_bytes: self.len_bytes() })
    }

    /// The one request moving this view's elements to or from `file_offset` (file strides in
    /// bytes, default dense C order), and the memory it addresses.
    pub fn array_request(
        &self,
        py: Python<'_>,
        file_offset: u64,
        file_strides: Option<&[i64]>,
    ) -> PyResult<(ArrayRequest, Region)> {
        let counts = self.counts();
        let memory_strides = self.strides();
        let itemsize = self.itemsize();
        let file_strides = match file_strides {
            Some(strides) if strides.len() != counts.len() => {
                return Err(invalid(
                    py,
                    format!(
                        "file_strides has {} entries but the array has {} dimensions",
                        strides.len(),
                        counts.len()
                    ),
                ))
            }
            Some(strides) => strides.to_vec(),
            None => c_order_strides(itemsize, &counts).map_err(|e| invalid(py, e.to_string()))?,
        };
        let dims: Vec<ArrayDim> = (0..counts.len())
            .map(|i| ArrayDim {
                count: counts[i],
                memory_stride_bytes: memory_strides[i],
                file_stride_bytes: file_strides[i],
            })
            .collect();
        let request = array_request(file_offset, itemsize, &dims).map_err(|e| invalid(py, e.to_string()))?;
        let first = usize::try_from(request.first_element_offset_bytes)
            .map_err(|_| invalid(py, "array too large"))?;
        // The lowest byte the view touches: `first` bytes below its first element. The
        // exporter guarantees every element the shape and strides reach lies in its memory,
        // so this address is inside the exported object's memory.
        let start = self.raw.buf.cast::<u8>().wrapping_sub(first);
        let length_bytes =
            usize::try_from(request.extent_bytes).map_err(|_| invalid(py, "array too large"))?;
        Ok((request, Region { start, length_bytes }))
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        Python::attach(|_py| {
            // SAFETY: `raw` holds a successful export that has not been released yet (this is
            // the only release), and we are attached to the interpreter.
            unsafe { ffi::PyBuffer_Release(&mut *self.raw) }
        });
    }
}

/// A span of exported memory: where a request's memory offsets start, and how long it is.
#[derive(Clone, Copy)]
pub struct Region {
    pub start: *mut u8,
    pub length_bytes: usize,
}

// SAFETY: a Region is a pointer and a length into memory kept alive by a BufferView that the
// caller holds for as long as the Region is used; it carries no thread-bound state.
unsafe impl Send for Region {}

impl Region {
    /// The region as bytes to read from.
    ///
    /// # Safety
    /// The BufferView this region came from must be held for as long as the slice lives.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        // SAFETY: the caller's contract; the region lies inside the exported memory.
        unsafe { std::slice::from_raw_parts(nonnull(self.start), self.length_bytes) }
    }

    /// The region as bytes to fill.
    ///
    /// # Safety
    /// The BufferView this region came from must be a writable export held for as long as
    /// the slice lives, and nothing else may use the slice meanwhile.
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        // SAFETY: the caller's contract; the region lies inside the exported memory.
        unsafe { std::slice::from_raw_parts_mut(nonnull(self.start), self.length_bytes) }
    }
}

/// A pointer fit for a slice: a zero-length buffer may export NULL.
fn nonnull(pointer: *mut u8) -> *mut u8 {
    if pointer.is_null() {
        std::ptr::NonNull::dangling().as_ptr()
    } else {
        pointer
    }
}

/// Whether a struct-module format holds Python objects ('O'), skipping field names
/// (":name:") of structured formats.
fn holds_objects(format: &str) -> bool {
    let mut in_name = false;
    for c in format.chars() {
        match c {
            ':' => in_name = !in_name,
            'O' if !in_name => return true,
            _ => {}
        }
    }
    false
}
