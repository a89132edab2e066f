//! Handles of non-blocking calls, for Python: `done()`, `wait()`, and `await handle`.
//!
//! A handle owns the buffer export of its call: the memory stays exported (so numpy will not
//! move or free it) until the call has finished. Dropping an unfinished handle waits for the
//! call first, because the client library does not cancel a call whose handle is dropped.

use crate::buffer::BufferView;
use crate::errors::client_error;
use flotilla_client::{ClientError, Handle};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

/// A call in flight.
#[pyclass(frozen, name = "Handle", module = "flotilla._native")]
pub struct PyHandle {
    state: Mutex<Inflight>,
    /// What `wait()` returns on success instead of the byte count (e.g. a new array).
    result: Option<Py<PyAny>>,
}

struct Inflight {
    call: Option<Handle<u64>>,
    outcome: Option<Result<u64, ClientError>>,
    // Declared after `call`: on drop the call is waited for before the export is released.
    view: Option<BufferView>,
}

impl Inflight {
    /// Blocks until the call has finished and records its outcome.
    fn finish(&mut self) {
        if let Some(call) = self.call.take() {
            self.outcome = Some(call.wait());
        }
    }

    /// Records the outcome if the call has finished; says whether it has.
    fn poll(&mut self) -> bool {
        let finished = match self.call.as_mut() {
            None => return true,
            Some(call) => call.test(),
        };
        if finished {
            self.finish();
        }
        finished
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // The memory of `view` is still lent to the call: wait (without holding the
            // interpreter) before the export is released below.
            Python::attach(|py| py.detach(|| drop(call.wait())));
        }
    }
}

impl PyHandle {
    pub fn new(call: Handle<u64>, view: Option<BufferView>, result: Option<Py<PyAny>>) -> PyHandle {
        PyHandle { state: Mutex::new(Inflight { call: Some(call), outcome: None, view }), result }
    }

    /// A handle whose call already finished (requests that move nothing).
    pub fn ready(outcome: Result<u64, ClientError>, result: Option<Py<PyAny>>) -> PyHandle {
        PyHandle { state: Mutex::new(Inflight { call: None, outcome: Some(outcome), view: None }), result }
    }

    fn outcome(&self, py: Python<'_>, outcome: Result<u64, ClientError>) -> PyResult<Py<PyAny>> {
        let bytes = outcome.map_err(|error| client_error(py, error))?;
        match &self.result {
            Some(result) => Ok(result.clone_ref(py)),
            None => bytes.into_py_any(py),
        }
    }
}

#[pymethods]
impl PyHandle {
    /// Whether the call has finished (successfully or not); never blocks.
    fn done(&self) -> bool {
        let Some(mut state) = self.state.try_lock() else { return false };
        let finished = state.poll();
        if finished {
            drop(state.view.take());
        }
        finished
    }

    /// Blocks (without holding the GIL) until the call finishes; returns its result (bytes
    /// moved, or the array for `read_array_nb`) or raises its error. May be called again.
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (outcome, view) = py.detach(|| {
            let mut state = self.state.lock();
            state.finish();
            let outcome = state.outcome.clone().unwrap_or(Err(ClientError::Abandoned));
            (outcome, state.view.take())
        });
        drop(view);
        self.outcome(py, outcome)
    }

    /// `await handle` in asyncio: waits in the loop's default executor.
    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
        let wait = slf.getattr("wait")?;
        let future = event_loop.call_method1("run_in_executor", (py.None(), wait))?;
        future.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let state = match self.state.try_lock() {
            Some(state) if state.call.is_none() => "finished",
            _ => "pending",
        };
        format!("<flotilla.Handle {state}>")
    }
}
