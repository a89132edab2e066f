//! `flotilla.Fork`: one fork of one subfile, the unit every structured request addresses.

use crate::client::Session;
use crate::errors::OrRaise;
use crate::io::Target;
use crate::methods::pymethods_with_data;
use flotilla_client::Fork;
use pyo3::prelude::*;
use std::sync::Arc;

/// One fork of one subfile.
#[pyclass(frozen, name = "Fork", module = "flotilla._native")]
pub struct PyFork {
    session: Arc<Session>,
    fork: Fork,
    subfile: u32,
    name: String,
}

impl PyFork {
    pub fn new(session: Arc<Session>, fork: Fork, subfile: u32, name: &str) -> PyFork {
        PyFork { session, fork, subfile, name: name.to_string() }
    }

    fn open_fork(&self, py: Python<'_>) -> PyResult<Fork> {
        self.session.client(py)?;
        Ok(self.fork.clone())
    }

    pub(crate) fn target(&self, py: Python<'_>) -> PyResult<Target> {
        self.open_fork(py).map(Target::Fork)
    }
}

pymethods_with_data!(PyFork {
    #[getter]
    fn subfile(&self) -> u32 {
        self.subfile
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Address of the I/O server holding the fork.
    #[getter]
    fn server(&self) -> String {
        self.fork.server()
    }

    /// The fork's size in bytes.
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let fork = self.open_fork(py)?;
        py.detach(|| fork.size()).or_raise(py)
    }

    /// Preallocates the fork to at least `size` bytes.
    fn extend(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let fork = self.open_fork(py)?;
        py.detach(|| fork.extend(size)).or_raise(py)
    }

    /// Cuts the fork to `size` bytes.
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let fork = self.open_fork(py)?;
        py.detach(|| fork.truncate(size)).or_raise(py)
    }

    /// Writes the fork's dirty blocks to disk.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let fork = self.open_fork(py)?;
        py.detach(|| fork.sync()).or_raise(py)
    }

    fn __repr__(&self) -> String {
        format!("<flotilla.Fork subfile={} name={:?} server={}>", self.subfile, self.name, self.fork.server())
    }
});
