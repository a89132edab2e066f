//! `flotilla_fork`: one fork of one subfile, and I/O on it.

use crate::error::{c_str, guard_bytes, guard_status, object, put, Failure};
use crate::file::{buffer_mut, buffer_ref, flotilla_file};
use crate::handle::{flotilla_handle, lend, start};
use crate::request::{flotilla_request, request_shape};
use flotilla_client::{Fork, DEFAULT_FORK};
use std::ffi::{c_char, c_int, c_void};

/// One fork of one subfile (opaque).
pub struct flotilla_fork {
    pub(crate) fork: Fork,
}

/// The fork name from C (NULL: "data").
unsafe fn fork_name<'a>(name: *const c_char) -> Result<&'a str, Failure> {
    if name.is_null() {
        return Ok(DEFAULT_FORK);
    }
    // SAFETY: the caller passes a NUL-terminated name.
    unsafe { c_str(name, "fork name") }
}

/// Stores in `*out` the fork `name` (NULL: "data") of subfile `subfile`. The fork need not
/// exist: calls on it then fail with -ENOENT.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_open(
    file: *const flotilla_file,
    subfile: u32,
    name: *const c_char,
    out: *mut *mut flotilla_fork,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live file and NULL or a NUL-terminated name.
        let (file, name) = unsafe { (object(file, "file")?, fork_name(name)?) };
        let fork = file.file.fork(subfile, name)?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_fork { fork }) }
    })
}

/// Creates the fork `name` in subfile `subfile` and stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_create(
    file: *const flotilla_file,
    subfile: u32,
    name: *const c_char,
    out: *mut *mut flotilla_fork,
) -> c_int {
    guard_status(|| {
        // SAFETY: as for flotilla_fork_open.
        let (file, name) = unsafe { (object(file, "file")?, fork_name(name)?) };
        let fork = file.file.create_fork(subfile, name)?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_fork { fork }) }
    })
}

/// Removes the fork `name` of subfile `subfile`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_remove(
    file: *const flotilla_file,
    subfile: u32,
    name: *const c_char,
) -> c_int {
    guard_status(|| {
        // SAFETY: as for flotilla_fork_open.
        let (file, name) = unsafe { (object(file, "file")?, fork_name(name)?) };
        file.file.remove_fork(subfile, name).map_err(Failure::from)
    })
}

/// Frees a fork. NULL is accepted.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_close(fork: *mut flotilla_fork) -> c_int {
    guard_status(|| {
        if !fork.is_null() {
            // SAFETY: the caller passes a fork this library made, not yet freed.
            drop(unsafe { Box::from_raw(fork) });
        }
        Ok(())
    })
}

/// Runs `call` on the fork given by C.
unsafe fn with_fork(fork: *const flotilla_fork, call: impl FnOnce(&Fork) -> Result<(), Failure>) -> c_int {
    // SAFETY: the caller passes a live fork.
    guard_status(|| call(&unsafe { object(fork, "fork")? }.fork))
}

/// Stores the fork's size in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_size(fork: *const flotilla_fork, out: *mut u64) -> c_int {
    // SAFETY: forwarded; `out` is checked.
    unsafe {
        with_fork(fork, |f| {
            let out = out.as_mut().ok_or_else(|| Failure::invalid("size output is NULL"))?;
            *out = f.size()?;
            Ok(())
        })
    }
}

/// Preallocates the fork to at least `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_extend(fork: *const flotilla_fork, size: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_fork(fork, |f| f.extend(size).map_err(Failure::from)) }
}

/// Cuts the fork to `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_truncate(fork: *const flotilla_fork, size: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_fork(fork, |f| f.truncate(size).map_err(Failure::from)) }
}

/// Writes the fork's dirty blocks to disk.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_sync(fork: *const flotilla_fork) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_fork(fork, |f| f.sync().map_err(Failure::from)) }
}

/// Reads `request` of the fork into `buffer`. Returns the bytes read or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_read(
    fork: *const flotilla_fork,
    request: *const flotilla_request,
    buffer: *mut c_void,
    buffer_bytes: usize,
) -> i64 {
    guard_bytes(|| {
        // SAFETY: the caller passes a live fork, a valid request and `buffer_bytes` bytes.
        let (fork, shape, memory) =
            unsafe { (object(fork, "fork")?, request_shape(request)?, buffer_mut(buffer, buffer_bytes)?) };
        fork.fork.read(&shape, memory).map_err(Failure::from)
    })
}

/// Writes `request` of the fork from `buffer`. Returns the bytes written or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_write(
    fork: *const flotilla_fork,
    request: *const flotilla_request,
    buffer: *const c_void,
    buffer_bytes: usize,
) -> i64 {
    guard_bytes(|| {
        // SAFETY: as for flotilla_fork_read.
        let (fork, shape, memory) =
            unsafe { (object(fork, "fork")?, request_shape(request)?, buffer_ref(buffer, buffer_bytes)?) };
        fork.fork.write(&shape, memory).map_err(Failure::from)
    })
}

/// Starts a read of the fork and stores its handle in `*out`. `buffer` must stay valid and
/// unused until the handle has finished.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_read_nb(
    fork: *const flotilla_fork,
    request: *const flotilla_request,
    buffer: *mut c_void,
    buffer_bytes: usize,
    out: *mut *mut flotilla_handle,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live fork and a valid request, and lends the buffer
        // until the handle finished.
        let (fork, shape, raw) =
            unsafe { (object(fork, "fork")?, request_shape(request)?, lend(buffer, buffer_bytes)?) };
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, start(fork.fork.read_raw_nb(shape, raw))) }
    })
}

/// Starts a write of the fork and stores its handle in `*out`. `buffer` must stay valid and
/// unchanged until the handle has finished.
#[no_mangle]
pub unsafe extern "C" fn flotilla_fork_write_nb(
    fork: *const flotilla_fork,
    request: *const flotilla_request,
    buffer: *const c_void,
    buffer_bytes: usize,
    out: *mut *mut flotilla_handle,
) -> c_int {
    guard_status(|| {
        // SAFETY: as for flotilla_fork_read_nb; the buffer is only read.
        let (fork, shape, raw) = unsafe {
            (object(fork, "fork")?, request_shape(request)?, lend(buffer.cast_mut(), buffer_bytes)?)
        };
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, start(fork.fork.write_raw_nb(shape, raw))) }
    })
}
