//! `flotilla_handle`: a non-blocking call in flight, with test, wait and free.

use crate::error::{guard, guard_bytes, Failure};
use flotilla_client::{ClientError, Handle, RawBuffer};
use std::ffi::{c_int, c_void};

/// A non-blocking call (opaque). Freeing an unfinished handle waits for the call first, so
/// the caller's buffer is never used after `flotilla_handle_free` returns.
pub struct flotilla_handle {
    call: Option<Handle<u64>>,
    outcome: Option<Result<u64, ClientError>>,
}

pub(crate) fn start(call: Handle<u64>) -> flotilla_handle {
    flotilla_handle { call: Some(call), outcome: None }
}

/// Lends a caller buffer to a non-blocking call.
///
/// # Safety
/// `buffer` is valid for `bytes` bytes (writes too, for reads) until the call's handle has
/// finished, and the caller does not use it meanwhile.
pub(crate) unsafe fn lend(buffer: *mut c_void, bytes: usize) -> Result<RawBuffer, Failure> {
    if buffer.is_null() && bytes != 0 {
        return Err(Failure::invalid("buffer is NULL"));
    }
    // SAFETY: the caller's contract, forwarded to RawBuffer::new.
    Ok(unsafe { RawBuffer::new(buffer.cast::<u8>(), bytes) })
}

impl flotilla_handle {
    fn finish(&mut self) -> &Result<u64, ClientError> {
        if let Some(call) = self.call.take() {
            self.outcome = Some(call.wait());
        }
        self.outcome.get_or_insert(Err(ClientError::Abandoned))
    }
}

/// Returns 1 if the call has finished (its result is then ready for flotilla_handle_wait),
/// 0 if not, or a negative errno for a NULL handle. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn flotilla_handle_test(handle: *mut flotilla_handle) -> c_int {
    guard(
        |code| code,
        || {
            // SAFETY: the caller passes a live handle, used by one thread at a time.
            let handle = unsafe { handle.as_mut() }.ok_or_else(|| Failure::invalid("handle is NULL"))?;
            let finished = match handle.call.as_mut() {
                None => true,
                Some(call) => call.test(),
            };
            if finished {
                handle.finish();
            }
            Ok(c_int::from(finished))
        },
    )
}

/// Blocks until the call finishes; returns its byte count or a negative errno (and sets the
/// last error message). May be called again; the handle stays allocated until freed.
#[no_mangle]
pub unsafe extern "C" fn flotilla_handle_wait(handle: *mut flotilla_handle) -> i64 {
    guard_bytes(|| {
        // SAFETY: the caller passes a live handle, used by one thread at a time.
        let handle = unsafe { handle.as_mut() }.ok_or_else(|| Failure::invalid("handle is NULL"))?;
        handle.finish().clone().map_err(Failure::from)
    })
}

/// Frees a handle, first waiting for its call if it has not finished. NULL is accepted.
#[no_mangle]
pub unsafe extern "C" fn flotilla_handle_free(handle: *mut flotilla_handle) {
    guard(
        |_| (),
        || {
            if !handle.is_null() {
                // SAFETY: the caller passes a handle this library made, not yet freed.
                let mut handle = unsafe { Box::from_raw(handle) };
                handle.finish();
            }
            Ok(())
        },
    )
}
