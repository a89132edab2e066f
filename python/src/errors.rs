//! Client errors as Python exceptions. The exception classes live in Python
//! (`flotilla/errors.py`) so that each can derive from both `flotilla.Error` and the built-in
//! it corresponds to (`FileNotFoundError`, `ValueError`, ...); this module only picks the
//! errno and asks `flotilla.errors._from_errno` for the instance.

use flotilla_client::ClientError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// errno for bad input: shapes, strides, dtypes, buffers (→ `flotilla.InvalidRequestError`).
pub const EINVAL: i32 = 22;
/// errno for a closed client or file (→ `flotilla.ClosedError`).
pub const EBADF: i32 = 9;

static FROM_ERRNO: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The `flotilla` exception for `errno` with `message`.
pub fn errno_error(py: Python<'_>, errno: i32, message: impl Into<String>) -> PyErr {
    let message = message.into();
    let maker = match FROM_ERRNO.import(py, "flotilla.errors", "_from_errno") {
        Ok(maker) => maker,
        Err(error) => return error,
    };
    match maker.call1((errno, message)) {
        Ok(exception) => PyErr::from_value(exception),
        Err(error) => error,
    }
}

/// The exception for a failed client call.
pub fn client_error(py: Python<'_>, error: ClientError) -> PyErr {
    errno_error(py, error.errno(), error.to_string())
}

/// `ValueError`-derived `flotilla.InvalidRequestError`.
pub fn invalid(py: Python<'_>, message: impl Into<String>) -> PyErr {
    errno_error(py, EINVAL, message)
}

/// `flotilla.ClosedError`.
pub fn closed(py: Python<'_>, what: &str) -> PyErr {
    errno_error(py, EBADF, format!("{what} is closed"))
}

/// Converts a client result, raising the matching exception.
pub trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, ClientError> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|error| client_error(py, error))
    }
}
