//! The native half of the `flotilla` Python package (`flotilla._native`): the client, files,
//! forks, request shapes and non-blocking handles, over the Rust client library.
//!
//! Data calls release the interpreter while they run, and read into / write from the memory
//! of the caller's buffer (numpy arrays included) without copying it first: a numpy view of
//! any strides becomes one nested-strided request (see `flotilla_client::array_request`).

mod buffer;
mod client;
mod enwrich;
mod errors;
mod file;
mod fork;
mod group;
mod handle;
mod io;
mod methods;
mod shape;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<client::PyClient>()?;
    module.add_class::<client::PyStat>()?;
    module.add_class::<client::PyDirEntry>()?;
    module.add_class::<file::PyFile>()?;
    module.add_class::<fork::PyFork>()?;
    module.add_class::<handle::PyHandle>()?;
    module.add_class::<group::PyGroup>()?;
    module.add_class::<enwrich::PyEnwrichFile>()?;
    module.add_class::<shape::PyShape>()?;
    module.add_class::<shape::PyBatchNode>()?;
    module.add("STRIDE_LEVELS_MAX", flotilla_request::STRIDE_LEVELS_MAX)?;
    Ok(())
}
