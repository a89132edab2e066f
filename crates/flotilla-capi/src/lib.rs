//! Flotilla's C API: connect, files, forks, every request shape (contiguous, strided,
//! nested-strided, nested-batched, list), blocking and non-blocking, for C, C++ and Fortran
//! callers. The header `include/flotilla.h` is generated from this crate by cbindgen (a test
//! fails when it is stale).
//!
//! Rules every function keeps:
//! - no panic crosses the boundary: each body runs under `catch_unwind`, and a panic becomes
//!   `-EIO` with a message;
//! - failures return a negative errno and set the calling thread's last error message
//!   (`flotilla_last_error_message`);
//! - every pointer from the caller is checked for NULL, every count against a limit before
//!   anything is allocated, every string for UTF-8.

#![allow(non_camel_case_types)]
// The C API is `unsafe extern "C"` functions whose safety contracts are in the header.
#![allow(clippy::missing_safety_doc)]

mod client;
mod enwrich;
mod error;
mod file;
mod fork;
mod group;
mod handle;
mod request;

pub use client::*;
pub use enwrich::*;
pub use error::*;
pub use file::*;
pub use fork::*;
pub use group::*;
pub use handle::*;
pub use request::*;
