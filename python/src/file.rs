//! `flotilla.File`: an open file. Its linear bytes (through its layout) take every request
//! shape and numpy view; its subfiles' forks are reached with `fork()`.

use crate::buffer::{Access, BufferView};
use crate::client::Session;
use crate::errors::{closed, OrRaise};
use crate::fork::PyFork;
use crate::io::Target;
use crate::methods::pymethods_with_data;
use flotilla_client::{File, Shape};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An open file.
#[pyclass(frozen, name = "File", module = "flotilla._native")]
pub struct PyFile {
    session: Arc<Session>,
    file: File,
    closed: AtomicBool,
}

impl PyFile {
    pub fn new(session: Arc<Session>, file: File) -> PyFile {
        PyFile { session, file, closed: AtomicBool::new(false) }
    }

    /// The file, or `ClosedError` once the file or its client is closed.
    fn open_file(&self, py: Python<'_>) -> PyResult<File> {
        self.session.client(py)?;
        if self.closed.load(Ordering::Acquire) {
            return Err(closed(py, "file"));
        }
        Ok(self.file.clone())
    }

    pub(crate) fn target(&self, py: Python<'_>) -> PyResult<Target> {
        self.open_file(py).map(Target::Linear)
    }

    /// The size including other clients' published writes.
    fn current_size(&self, py: Python<'_>, file: &File) -> PyResult<u64> {
        let client = self.session.client(py)?.clone();
        let id = file.id();
        let published = py.detach(|| client.stat_id(id)).or_raise(py)?;
        Ok(file.size().max(published.attrs.size_bytes))
    }
}

pymethods_with_data!(PyFile {
    #[getter]
    fn path(&self) -> &str {
        self.file.path()
    }

    /// The file's id (also its inode number).
    #[getter]
    fn id(&self) -> u64 {
        self.file.id()
    }

    /// Number of subfiles.
    #[getter]
    fn subfiles(&self) -> u32 {
        self.file.subfile_count()
    }

    /// The layout, e.g. "stripe:1M:0".
    #[getter]
    fn layout(&self) -> String {
        self.file.layout().to_string()
    }

    /// Whether reads and writes of this handle take byte-range tokens (not with
    /// `no_overlap=True` or on a file with the `user.flotilla.no_overlap` hint).
    #[getter]
    fn takes_tokens(&self) -> bool {
        self.file.takes_tokens()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The file's size in bytes (this client's writes included).
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let file = self.open_file(py)?;
        self.current_size(py, &file)
    }

    /// Up to `length` bytes at `offset` (fewer at end of file).
    fn read_at<'py>(&self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        let file = self.open_file(py)?;
        let available = self.current_size(py, &file)?.saturating_sub(offset).min(length);
        let available = usize::try_from(available).unwrap_or(usize::MAX);
        PyBytes::new_with(py, available, |bytes| {
            if bytes.is_empty() {
                return Ok(());
            }
            let shape = Shape::contiguous(offset, bytes.len() as u64);
            py.detach(|| file.read_shape(&shape, bytes)).or_raise(py).map(drop)
        })
    }

    /// Reads into `buffer` (contiguous, writable) from `offset`; returns the bytes read
    /// (fewer than the buffer holds at end of file).
    fn readinto_at(&self, py: Python<'_>, offset: u64, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
        let file = self.open_file(py)?;
        let view = BufferView::export(buffer, Access::Writable)?;
        let region = view.contiguous_region(py)?;
        let available = self.current_size(py, &file)?.saturating_sub(offset).min(region.length_bytes as u64);
        if available == 0 {
            return Ok(0);
        }
        // SAFETY: `view` (a writable export) is held until the read returns.
        let memory = unsafe { region.as_mut_slice() };
        py.detach(|| file.read_shape(&Shape::contiguous(offset, available), memory)).or_raise(py)
    }

    /// Writes `data` (any contiguous buffer) at `offset`; returns the bytes written.
    fn write_at(&self, py: Python<'_>, offset: u64, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let file = self.open_file(py)?;
        let view = BufferView::export(data, Access::ReadOnly)?;
        let region = view.contiguous_region(py)?;
        if region.length_bytes == 0 {
            return Ok(0);
        }
        // SAFETY: `view` is held until the write returns.
        let memory = unsafe { region.as_slice() };
        py.detach(|| file.write_shape(&Shape::contiguous(offset, memory.len() as u64), memory)).or_raise(py)
    }

    /// Truncates or extends the file to `size` bytes.
    fn set_size(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let file = self.open_file(py)?;
        py.detach(|| file.set_size(size)).or_raise(py).map(drop)
    }

    /// Publishes this client's writes' size and mtime to every client.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.open_file(py)?;
        py.detach(|| file.flush()).or_raise(py)
    }

    /// Writes every fork's dirty blocks to disk, then publishes the size.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.open_file(py)?;
        py.detach(|| file.sync()).or_raise(py)
    }

    /// Flushes and closes the file (later calls raise `ClosedError`). Closing twice is fine.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.session.client(py)?;
        let file = self.file.clone();
        py.detach(|| file.flush()).or_raise(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// A fork of one subfile (it need not exist yet; calls on it fail if it does not).
    #[pyo3(signature = (subfile, name = "data"))]
    fn fork(&self, py: Python<'_>, subfile: u32, name: &str) -> PyResult<PyFork> {
        let file = self.open_file(py)?;
        let fork = file.fork(subfile, name).or_raise(py)?;
        Ok(PyFork::new(self.session.clone(), fork, subfile, name))
    }

    /// Creates a fork in one subfile.
    fn create_fork(&self, py: Python<'_>, subfile: u32, name: &str) -> PyResult<PyFork> {
        let file = self.open_file(py)?;
        let fork = py.detach(|| file.create_fork(subfile, name)).or_raise(py)?;
        Ok(PyFork::new(self.session.clone(), fork, subfile, name))
    }

    /// Removes a fork of one subfile.
    fn remove_fork(&self, py: Python<'_>, subfile: u32, name: &str) -> PyResult<()> {
        let file = self.open_file(py)?;
        py.detach(|| file.remove_fork(subfile, name)).or_raise(py)
    }

    /// The forks of one subfile as (name, size) pairs.
    fn list_forks(&self, py: Python<'_>, subfile: u32) -> PyResult<Vec<(String, u64)>> {
        let file = self.open_file(py)?;
        let forks = py.detach(|| file.list_forks(subfile)).or_raise(py)?;
        Ok(forks.into_iter().map(|f| (f.name, f.size_bytes)).collect())
    }

    fn __repr__(&self) -> String {
        format!("<flotilla.File {:?} id={} subfiles={}>", self.file.path(), self.file.id(), self.file.subfile_count())
    }
});
