//! The data calls shared by `File` (its linear view) and `Fork`: generic shapes on buffers,
//! numpy views as one nested-strided request, blocking and non-blocking. The interpreter is
//! released (`Python::detach`, PyO3's `allow_threads`) for the whole transfer.

use crate::buffer::{Access, BufferView, Region};
use crate::errors::{invalid, OrRaise};
use crate::handle::PyHandle;
use crate::shape::PyShape;
use flotilla_client::{ClientError, File, Fork, Handle, RawBuffer, Shape};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// What a data call addresses: a file's linear bytes, or one fork.
#[derive(Clone)]
pub enum Target {
    Linear(File),
    Fork(Fork),
}

impl Target {
    fn read(&self, shape: &Shape, buffer: &mut [u8]) -> Result<u64, ClientError> {
        match self {
            Target::Linear(file) => file.read_shape(shape, buffer),
            Target::Fork(fork) => fork.read(shape, buffer),
        }
    }

    fn write(&self, shape: &Shape, buffer: &[u8]) -> Result<u64, ClientError> {
        match self {
            Target::Linear(file) => file.write_shape(shape, buffer),
            Target::Fork(fork) => fork.write(shape, buffer),
        }
    }

    fn read_nb(&self, shape: Shape, buffer: RawBuffer) -> Handle<u64> {
        match self {
            Target::Linear(file) => file.read_shape_raw_nb(shape, buffer),
            Target::Fork(fork) => fork.read_raw_nb(shape, buffer),
        }
    }

    fn write_nb(&self, shape: Shape, buffer: RawBuffer) -> Handle<u64> {
        match self {
            Target::Linear(file) => file.write_shape_raw_nb(shape, buffer),
            Target::Fork(fork) => fork.write_raw_nb(shape, buffer),
        }
    }
}

/// Reads `shape` into a contiguous writable buffer; returns the bytes read.
pub fn read(py: Python<'_>, target: Target, shape: &PyShape, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
    let view = BufferView::export(buffer, Access::Writable)?;
    let region = view.contiguous_region(py)?;
    // SAFETY: `view` (a writable export) is held until after the transfer returns, and the
    // slice is used by this call only; Python code running meanwhile must not use the buffer,
    // exactly as for any numpy operation that releases the interpreter.
    let memory = unsafe { region.as_mut_slice() };
    py.detach(|| target.read(&shape.shape, memory)).or_raise(py)
}

/// Writes `shape` from a contiguous buffer; returns the bytes written.
pub fn write(py: Python<'_>, target: Target, shape: &PyShape, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
    let view = BufferView::export(buffer, Access::ReadOnly)?;
    let region = view.contiguous_region(py)?;
    // SAFETY: `view` is held until after the transfer returns.
    let memory = unsafe { region.as_slice() };
    py.detach(|| target.write(&shape.shape, memory)).or_raise(py)
}

/// Non-blocking `read`: the handle keeps the buffer exported until the call finished.
pub fn read_nb(
    py: Python<'_>,
    target: Target,
    shape: &PyShape,
    buffer: &Bound<'_, PyAny>,
) -> PyResult<PyHandle> {
    let view = BufferView::export(buffer, Access::Writable)?;
    let region = view.contiguous_region(py)?;
    start(target, shape.shape.clone(), view, region, Access::Writable, None)
}

/// Non-blocking `write`.
pub fn write_nb(
    py: Python<'_>,
    target: Target,
    shape: &PyShape,
    buffer: &Bound<'_, PyAny>,
) -> PyResult<PyHandle> {
    let view = BufferView::export(buffer, Access::ReadOnly)?;
    let region = view.contiguous_region(py)?;
    start(target, shape.shape.clone(), view, region, Access::ReadOnly, None)
}

/// Fills `array` (any strided view) from `offset`, file strides in bytes (default: the
/// array stored densely in C order); returns the bytes read.
pub fn read_into(
    py: Python<'_>,
    target: Target,
    array: &Bound<'_, PyAny>,
    offset: u64,
    file_strides: Option<Vec<i64>>,
) -> PyResult<u64> {
    let view = BufferView::export(array, Access::Writable)?;
    let (request, region) = view.array_request(py, offset, file_strides.as_deref())?;
    if request.total_bytes == 0 {
        return Ok(0);
    }
    // SAFETY: `region` spans from the lowest to the highest byte the writable export `view`
    // reaches, and `view` is held until the transfer returns. The transfer writes only the
    // view's own elements (the request's pieces); bytes of the span between them (other
    // columns of a sliced array) are neither read nor written.
    let memory = unsafe { region.as_mut_slice() };
    py.detach(|| target.read(&request.shape, memory)).or_raise(py)
}

/// Writes `array` (any strided view) to `offset`; returns the bytes written.
pub fn write_from(
    py: Python<'_>,
    target: Target,
    array: &Bound<'_, PyAny>,
    offset: u64,
    file_strides: Option<Vec<i64>>,
) -> PyResult<u64> {
    let view = BufferView::export(array, Access::ReadOnly)?;
    let (request, region) = view.array_request(py, offset, file_strides.as_deref())?;
    if request.total_bytes == 0 {
        return Ok(0);
    }
    // SAFETY: `region` lies inside the memory exported by `view`, held until the transfer
    // returns; only the view's own elements are read.
    let memory = unsafe { region.as_slice() };
    py.detach(|| target.write(&request.shape, memory)).or_raise(py)
}

/// Non-blocking `read_into`; `result` is what the handle's `wait()` returns (default: bytes).
pub fn read_into_nb(
    py: Python<'_>,
    target: Target,
    array: &Bound<'_, PyAny>,
    offset: u64,
    file_strides: Option<Vec<i64>>,
    result: Option<Py<PyAny>>,
) -> PyResult<PyHandle> {
    let view = BufferView::export(array, Access::Writable)?;
    let (request, region) = view.array_request(py, offset, file_strides.as_deref())?;
    if request.total_bytes == 0 {
        return Ok(PyHandle::ready(Ok(0), result));
    }
    start(target, request.shape, view, region, Access::Writable, result)
}

/// Non-blocking `write_from`.
pub fn write_from_nb(
    py: Python<'_>,
    target: Target,
    array: &Bound<'_, PyAny>,
    offset: u64,
    file_strides: Option<Vec<i64>>,
) -> PyResult<PyHandle> {
    let view = BufferView::export(array, Access::ReadOnly)?;
    let (request, region) = view.array_request(py, offset, file_strides.as_deref())?;
    if request.total_bytes == 0 {
        return Ok(PyHandle::ready(Ok(0), None));
    }
    start(target, request.shape, view, region, Access::ReadOnly, None)
}

/// Allocates a numpy array of `shape` and `dtype` (in `order`, "C" or "F").
pub fn empty_array<'py>(
    py: Python<'py>,
    shape: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
    order: &str,
) -> PyResult<Bound<'py, PyAny>> {
    if order != "C" && order != "F" {
        return Err(invalid(py, format!("order must be 'C' or 'F', not {order:?}")));
    }
    let numpy = py.import("numpy")?;
    let dtype = match numpy.call_method1("dtype", (dtype,)) {
        Ok(dtype) => dtype,
        Err(error) => return Err(invalid(py, format!("not a numpy dtype: {}", error.value(py)))),
    };
    if dtype.getattr("hasobject")?.is_truthy()? {
        return Err(invalid(py, format!("cannot read Python objects (dtype {dtype}); use a numeric dtype")));
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    kwargs.set_item("order", order)?;
    numpy
        .call_method("empty", (shape,), Some(&kwargs))
        .map_err(|error| invalid(py, format!("bad array shape: {}", error.value(py))))
}

/// Starts a non-blocking transfer on `region` of `view`; the handle owns the export.
fn start(
    target: Target,
    shape: Shape,
    view: BufferView,
    region: Region,
    access: Access,
    result: Option<Py<PyAny>>,
) -> PyResult<PyHandle> {
    // SAFETY: `region` lies in the memory exported by `view`, which moves into the handle and
    // is released only after the call has finished (the handle waits for it on `wait()`,
    // when `done()` sees it finish, or on drop). For reads the export is writable.
    let buffer = unsafe { RawBuffer::new(region.start, region.length_bytes) };
    let call = match access {
        Access::Writable => target.read_nb(shape, buffer),
        Access::ReadOnly => target.write_nb(shape, buffer),
    };
    Ok(PyHandle::new(call, Some(view), result))
}
