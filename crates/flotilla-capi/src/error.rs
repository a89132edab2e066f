//! Error codes and the per-thread last error message, and the guard that keeps panics and
//! errors from crossing into C.

use flotilla_client::ClientError;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failure on its way to C: a (positive) errno and a message.
#[derive(Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure { errno, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(libc::EINVAL, message)
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        Failure::new(error.errno(), error.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `body`, turning its failure or panic into a negative errno and a last error message.
pub fn guard<T>(failed: impl Fn(i32) -> T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failed(-failure.errno.abs().max(1))
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error in libflotilla_c (panic): {what}"));
            failed(-libc::EIO)
        }
    }
}

/// `guard` for functions returning 0 or a negative errno.
pub fn guard_status(body: impl FnOnce() -> Result<(), Failure>) -> i32 {
    guard(|code| code, || body().map(|()| 0))
}

/// `guard` for functions returning a byte count or a negative errno.
pub fn guard_bytes(body: impl FnOnce() -> Result<u64, Failure>) -> i64 {
    guard(i64::from, || {
        body().and_then(|n| i64::try_from(n).map_err(|_| Failure::invalid("byte count overflows")))
    })
}

/// A UTF-8 string from C, or EINVAL.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string valid for the call.
pub unsafe fn c_str<'a>(text: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller's contract: a NUL-terminated string valid for the call.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A reference to a library object from C, or EINVAL for NULL.
///
/// # Safety
/// `object` is NULL or a pointer this library returned and that was not freed.
pub unsafe fn object<'a, T>(object: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller's contract.
    unsafe { object.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// Stores a new object for C in `*out`.
///
/// # Safety
/// `out` is NULL (refused) or valid for a pointer write.
pub unsafe fn put<T>(out: *mut *mut T, value: T) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid("output pointer is NULL"));
    }
    // SAFETY: checked non-NULL; the caller's contract says it is writable.
    unsafe { *out = Box::into_raw(Box::new(value)) };
    Ok(())
}

/// The message of the last failure on this thread ("" if none). The string stays valid until
/// the next call into the library on this thread.
#[no_mangle]
pub extern "C" fn flotilla_last_error_message() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}
