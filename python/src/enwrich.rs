//! `flotilla.EnwrichFile`: a file open for writing in ENWRICH mode (`Client.open(path,
//! enwrich=True, ...)`): writes go to this process's log cache and reach the servers in
//! collective flushes of the whole job. A context manager: leaving the block closes it
//! (flush, leave the job).

use crate::buffer::{Access, BufferView};
use crate::errors::{closed, invalid, OrRaise};
use flotilla_client::{Client, EnwrichFile, EnwrichOptions};
use parking_lot::Mutex;
use pyo3::prelude::*;

/// A file open for writing in ENWRICH mode.
#[pyclass(frozen, name = "EnwrichFile", module = "flotilla._native")]
pub struct PyEnwrichFile {
    file: Mutex<Option<EnwrichFile>>,
}

/// The job settings from Python's keywords, the rest from the environment.
pub struct EnwrichArgs {
    pub job: Option<String>,
    pub job_size: Option<u32>,
    pub cache_bytes: Option<u64>,
    pub directory_fraction: Option<f64>,
    pub flush_timeout_ms: Option<u64>,
}

impl EnwrichArgs {
    fn options(self, py: Python<'_>) -> PyResult<EnwrichOptions> {
        let mut options = match (self.job, self.job_size) {
            (Some(job), Some(size)) => EnwrichOptions::new(job, size),
            (job, size) => {
                let mut from_env = EnwrichOptions::from_env().ok_or_else(|| {
                    invalid(py, "no job given: pass job= and job_size= or set FLOTILLA_JOB_NAME and FLOTILLA_JOB_SIZE")
                })?;
                from_env.job_name = job.unwrap_or(from_env.job_name);
                from_env.job_size = size.unwrap_or(from_env.job_size);
                from_env
            }
        };
        options.cache_bytes = self.cache_bytes.unwrap_or(options.cache_bytes);
        options.directory_fraction = self.directory_fraction.unwrap_or(options.directory_fraction);
        options.flush_timeout_ms = self.flush_timeout_ms.unwrap_or(options.flush_timeout_ms);
        Ok(options)
    }
}

impl PyEnwrichFile {
    pub fn open(py: Python<'_>, client: Client, path: &str, args: EnwrichArgs) -> PyResult<PyEnwrichFile> {
        let options = args.options(py)?;
        let file = py.detach(|| client.open_enwrich(path, &options)).or_raise(py)?;
        Ok(PyEnwrichFile { file: Mutex::new(Some(file)) })
    }

    fn with<T: Send>(&self, py: Python<'_>, call: impl FnOnce(&EnwrichFile) -> T + Send) -> PyResult<T> {
        let guard = self.file.lock();
        let file = guard.as_ref().ok_or_else(|| closed(py, "ENWRICH file"))?;
        Ok(py.detach(|| call(file)))
    }
}

#[pymethods]
impl PyEnwrichFile {
    /// This process's index in the job.
    #[getter]
    fn member(&self, py: Python<'_>) -> PyResult<u32> {
        self.with(py, |f| f.member())
    }

    /// Flushes this process took part in.
    #[getter]
    fn flushes(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |f| f.flushes())
    }

    /// Logs the buffer's bytes (bytes, bytearray, a contiguous numpy array) at `offset`;
    /// returns the write's hybrid-logical-clock stamp.
    fn write(&self, py: Python<'_>, offset: u64, buffer: &Bound<'_, PyAny>) -> PyResult<u64> {
        let view = BufferView::export(buffer, Access::ReadOnly)?;
        let region = view.contiguous_region(py)?;
        // SAFETY: `view` is held until the bytes are copied into the log cache.
        let data = unsafe { region.as_slice() };
        self.with(py, |f| f.write_at(offset, data))?.or_raise(py)
    }

    /// Flushes the whole job now; returns once this process's writes are durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |f| f.sync())?.or_raise(py)
    }

    /// Flushes and leaves the job. Closing twice is allowed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(file) = self.file.lock().take() else { return Ok(()) };
        py.detach(|| file.close()).or_raise(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<&Bound<'_, PyAny>>,
        _error: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}
