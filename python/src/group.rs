//! `flotilla.Group`: GFS-GROUP's split-phase grouped reads and writes, over
//! `flotilla_client::Group`. A context manager: leaving the `with` block calls `doneio` and
//! then `waitio`, so the read buffers are filled after it.
//!
//! Buffers: `write` copies the caller's bytes before it returns (the one copy into the packed
//! request). `read` exports the caller's buffer (a numpy array: no copy, its memory is
//! filled directly) and keeps the export until `waitio` returned or `testio` returned True,
//! so numpy cannot move or free the memory meanwhile.

use crate::buffer::{Access, BufferView};
use crate::errors::{errno_error, invalid};
use crate::file::PyFile;
use crate::fork::PyFork;
use crate::io::Target;
use flotilla_client::{Group, GroupConfig, GroupError, GroupMode, GroupTarget, RawBuffer};
use parking_lot::Mutex;
use pyo3::prelude::*;

/// A group and the buffer exports its unfinished reads write into.
struct State {
    group: Group<'static>,
    // Declared after `group`: dropped after it, so no export ends while a read may fill it.
    views: Vec<BufferView>,
}

/// A split-phase group of reads or writes (GFS-GROUP).
#[pyclass(frozen, name = "Group", module = "flotilla._native")]
pub struct PyGroup {
    state: Mutex<State>,
}

fn group_error(py: Python<'_>, error: GroupError) -> PyErr {
    errno_error(py, error.errno(), error.to_string())
}

fn mode(py: Python<'_>, name: &str) -> PyResult<GroupMode> {
    match name {
        "nosend" => Ok(GroupMode::NoSend),
        "send" => Ok(GroupMode::Send),
        other => Err(invalid(py, format!("group mode {other:?} is neither \"nosend\" nor \"send\""))),
    }
}

fn target_of(py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<Target> {
    if let Ok(file) = target.cast::<PyFile>() {
        return file.get().target(py);
    }
    if let Ok(fork) = target.cast::<PyFork>() {
        return fork.get().target(py);
    }
    Err(invalid(py, "a group request's target must be a flotilla.File or a flotilla.Fork"))
}

fn as_group_target(target: &Target) -> GroupTarget<'_> {
    match target {
        Target::Linear(file) => GroupTarget::File(file),
        Target::Fork(fork) => GroupTarget::Fork(fork),
    }
}

#[pymethods]
impl PyGroup {
    #[new]
    #[pyo3(signature = (mode="nosend", pending_requests_max=1024, pending_bytes_max=16<<20, submitted_bytes_max=256<<20, batch_across_forks=false))]
    fn new(
        py: Python<'_>,
        mode: &str,
        pending_requests_max: usize,
        pending_bytes_max: u64,
        submitted_bytes_max: u64,
        batch_across_forks: bool,
    ) -> PyResult<PyGroup> {
        let config = GroupConfig {
            mode: self::mode(py, mode)?,
            pending_requests_max,
            pending_bytes_max,
            submitted_bytes_max,
            batch_across_forks,
        };
        Ok(PyGroup { state: Mutex::new(State { group: Group::new(config), views: Vec::new() }) })
    }

    /// "nosend" or "send"; may be changed between calls.
    #[getter]
    fn get_mode(&self) -> &'static str {
        match self.state.lock().group.config().mode {
            GroupMode::Send => "send",
            _ => "nosend",
        }
    }

    #[setter]
    fn set_mode(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let mode = mode(py, name)?;
        let mut state = self.state.lock();
        let config = GroupConfig { mode, ..state.group.config().clone() };
        state.group.set_config(config);
        Ok(())
    }

    /// Queues a read of `len(buffer)` bytes at `offset` of `target` (a File or a Fork) into
    /// `buffer` (contiguous and writable: a numpy array, bytearray, memoryview), which holds
    /// them once `waitio()` returned. Raises InvalidRequestError when the group is writing.
    fn read(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        offset: u64,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let target = target_of(py, target)?;
        let view = BufferView::export(buffer, Access::Writable)?;
        let region = view.contiguous_region(py)?;
        let mut state = self.state.lock();
        // SAFETY: the export is kept in `views` until waitio returned or testio said done (or
        // the group is dropped, after the group itself), so the memory stays valid and put.
        let raw = unsafe { RawBuffer::new(region.start, region.length_bytes) };
        // SAFETY: as above; the group writes into the memory only inside testio/waitio.
        unsafe { state.group.group_read_raw(as_group_target(&target), offset, raw) }
            .map_err(|e| group_error(py, e))?;
        state.views.push(view);
        Ok(())
    }

    /// Queues a write of `buffer`'s bytes (any contiguous buffer) at `offset` of `target`; the
    /// bytes are copied before this returns.
    fn write(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        offset: u64,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let target = target_of(py, target)?;
        let view = BufferView::export(buffer, Access::ReadOnly)?;
        let region = view.contiguous_region(py)?;
        // SAFETY: `view` is held until after the bytes are copied.
        let data = unsafe { region.as_slice() };
        self.state
            .lock()
            .group
            .group_write(as_group_target(&target), offset, data)
            .map_err(|e| group_error(py, e))
    }

    /// Submits what is pending; the next request may go the other way. Does not wait.
    fn doneio(&self, py: Python<'_>) -> PyResult<()> {
        self.state.lock().group.doneio().map_err(|e| group_error(py, e))
    }

    /// True when everything submitted has finished (read buffers are filled); submits pending
    /// requests only when nothing is outstanding. Raises a failed request's error, naming it.
    fn testio(&self, py: Python<'_>) -> PyResult<bool> {
        let mut state = self.state.lock();
        let done = state.group.testio().map_err(|e| group_error(py, e))?;
        if done {
            state.views.clear();
        }
        Ok(done)
    }

    /// Submits everything and waits (without holding the GIL); raises the first failed
    /// request's error, naming it (index, fork or file, offset, size).
    fn waitio(&self, py: Python<'_>) -> PyResult<()> {
        let (outcome, views) = py.detach(|| {
            let mut state = self.state.lock();
            (state.group.waitio(), std::mem::take(&mut state.views))
        });
        drop(views);
        outcome.map_err(|e| group_error(py, e))
    }

    /// (requests, submissions, lists) so far.
    fn stats(&self) -> (u64, u64, u64) {
        let stats = self.state.lock().group.stats();
        (stats.requests, stats.submissions, stats.lists)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the block: doneio, then waitio (the buffers are then filled). An error inside
    /// the block still waits, so no export ends under a running read, and is re-raised.
    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<&Bound<'_, PyAny>>,
        error: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let done = self.doneio(py);
        let waited = self.waitio(py);
        if error.is_none() {
            done?;
            waited?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = self.state.lock();
        let stats = state.group.stats();
        format!("<flotilla.Group mode={} requests={}>", self.get_mode_locked(&state), stats.requests)
    }
}

impl PyGroup {
    fn get_mode_locked(&self, state: &State) -> &'static str {
        match state.group.config().mode {
            GroupMode::Send => "send",
            _ => "nosend",
        }
    }
}
