//! `flotilla_group`: GFS-GROUP's split-phase grouped reads and writes (gfs_group_read,
//! gfs_group_write, gfs_group_doneio, gfs_group_testio, gfs_group_waitio), on forks and on
//! linear files.
//!
//! Buffers: a write's bytes are copied before `flotilla_group_write_*` returns (the buffer
//! may be reused at once); a read's buffer must stay valid and unused until
//! `flotilla_group_waitio` returned, `flotilla_group_testio` returned 1, or the group was
//! freed. Read data is copied into the buffers only inside those calls, on the caller's thread.

use crate::error::{guard, guard_status, object, put, Failure};
use crate::file::flotilla_file;
use crate::fork::flotilla_fork;
use crate::handle::lend;
use flotilla_client::{Group, GroupConfig, GroupError, GroupMode, GroupTarget};
use std::ffi::{c_int, c_void};

/// Submission mode *nosend* (the paper's group-nosend; the default).
pub const FLOTILLA_GROUP_NOSEND: c_int = 0;
/// Submission mode *send* (also submit whenever nothing submitted is outstanding).
pub const FLOTILLA_GROUP_SEND: c_int = 1;

/// A group of split-phase requests (opaque). One thread at a time.
pub struct flotilla_group {
    group: Group<'static>,
}

impl From<GroupError> for Failure {
    fn from(error: GroupError) -> Failure {
        Failure::new(error.errno(), error.to_string())
    }
}

/// Settings of a group. Zeros mean the defaults (1024 requests, 16 MiB, 256 MiB).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct flotilla_group_options {
    /// FLOTILLA_GROUP_NOSEND or FLOTILLA_GROUP_SEND.
    pub mode: c_int,
    /// Pending requests that trigger a submission.
    pub pending_requests_max: u64,
    /// Pending bytes that trigger a submission.
    pub pending_bytes_max: u64,
    /// Most bytes of submitted, unfinished requests.
    pub submitted_bytes_max: u64,
    /// Nonzero: requests to other forks do not submit what is pending; every fork's list goes
    /// out at the next submission, all lists to one server together.
    pub batch_across_forks: c_int,
}

fn config(options: Option<&flotilla_group_options>) -> Result<GroupConfig, Failure> {
    let defaults = GroupConfig::default();
    let Some(options) = options else { return Ok(defaults) };
    let mode = match options.mode {
        FLOTILLA_GROUP_NOSEND => GroupMode::NoSend,
        FLOTILLA_GROUP_SEND => GroupMode::Send,
        other => {
            return Err(Failure::invalid(format!("group mode {other} is neither NOSEND (0) nor SEND (1)")))
        }
    };
    let or = |value: u64, default: u64| if value == 0 { default } else { value };
    let requests = or(options.pending_requests_max, defaults.pending_requests_max as u64);
    Ok(GroupConfig {
        mode,
        pending_requests_max: usize::try_from(requests).unwrap_or(usize::MAX),
        pending_bytes_max: or(options.pending_bytes_max, defaults.pending_bytes_max),
        submitted_bytes_max: or(options.submitted_bytes_max, defaults.submitted_bytes_max),
        batch_across_forks: options.batch_across_forks != 0,
    })
}

/// Makes a group with `options` (NULL: the defaults) and stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_new(
    options: *const flotilla_group_options,
    out: *mut *mut flotilla_group,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes NULL or valid options.
        let config = config(unsafe { options.as_ref() })?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_group { group: Group::new(config) }) }
    })
}

/// Changes a group's settings for the calls that follow (NULL options: the defaults).
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_configure(
    group: *mut flotilla_group,
    options: *const flotilla_group_options,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        with_group(group, |g| {
            g.set_config(config(options.as_ref())?);
            Ok(0)
        })
    }
}

/// Runs `call` on the group, returning its value or a negative errno.
///
/// # Safety
/// As for `group_mut`.
unsafe fn with_group(
    group: *mut flotilla_group,
    call: impl FnOnce(&mut Group<'static>) -> Result<c_int, Failure>,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|code| code, || call(unsafe { group_mut(group)? }))
}

/// The group from C, or EINVAL for NULL.
///
/// # Safety
/// `group` is NULL or a live group, used by one thread at a time.
unsafe fn group_mut<'a>(group: *mut flotilla_group) -> Result<&'a mut Group<'static>, Failure> {
    // SAFETY: the caller's contract.
    let group = unsafe { group.as_mut() }.ok_or_else(|| Failure::invalid("group is NULL"))?;
    Ok(&mut group.group)
}

/// Queues a read into lent memory.
///
/// # Safety
/// `group` as for `group_mut`; `buffer` is lent until waitio (see the module docs).
unsafe fn read(
    group: *mut flotilla_group,
    target: GroupTarget<'_>,
    offset: u64,
    buffer: *mut c_void,
    size: usize,
) -> Result<(), Failure> {
    // SAFETY: the caller's contract.
    let (group, raw) = unsafe { (group_mut(group)?, lend(buffer, size)?) };
    // SAFETY: the caller lends `buffer` until waitio.
    unsafe { group.group_read_raw(target, offset, raw) }.map_err(Failure::from)
}

/// Queues a write, copying `size` bytes from `buffer`.
///
/// # Safety
/// `group` as for `group_mut`; `buffer` holds `size` readable bytes for the call.
unsafe fn write(
    group: *mut flotilla_group,
    target: GroupTarget<'_>,
    offset: u64,
    buffer: *const c_void,
    size: usize,
) -> Result<(), Failure> {
    // SAFETY: the caller's contract.
    let (group, data) = unsafe { (group_mut(group)?, crate::file::buffer_ref(buffer, size)?) };
    group.group_write(target, offset, data).map_err(Failure::from)
}

/// Queues a read of `size` bytes at `offset` of the fork into `buffer`, which holds them after
/// `flotilla_group_waitio`. Returns 0 or a negative errno (-EINVAL when the group is writing:
/// call flotilla_group_doneio first).
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_read_fork(
    group: *mut flotilla_group,
    fork: *const flotilla_fork,
    offset: u64,
    buffer: *mut c_void,
    size: usize,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live fork; the rest is forwarded.
        let fork = unsafe { object(fork, "fork")? };
        // SAFETY: forwarded.
        unsafe { read(group, GroupTarget::Fork(&fork.fork), offset, buffer, size) }
    })
}

/// Queues a write of `size` bytes from `buffer` at `offset` of the fork; the bytes are copied
/// before this returns. Returns 0 or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_write_fork(
    group: *mut flotilla_group,
    fork: *const flotilla_fork,
    offset: u64,
    buffer: *const c_void,
    size: usize,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live fork; the rest is forwarded.
        let fork = unsafe { object(fork, "fork")? };
        // SAFETY: forwarded.
        unsafe { write(group, GroupTarget::Fork(&fork.fork), offset, buffer, size) }
    })
}

/// `flotilla_group_read_fork` on the linear bytes of a file (any layout).
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_read_file(
    group: *mut flotilla_group,
    file: *const flotilla_file,
    offset: u64,
    buffer: *mut c_void,
    size: usize,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live file; the rest is forwarded.
        let file = unsafe { object(file, "file")? };
        // SAFETY: forwarded.
        unsafe { read(group, GroupTarget::File(&file.file), offset, buffer, size) }
    })
}

/// `flotilla_group_write_fork` on the linear bytes of a file (any layout).
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_write_file(
    group: *mut flotilla_group,
    file: *const flotilla_file,
    offset: u64,
    buffer: *const c_void,
    size: usize,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live file; the rest is forwarded.
        let file = unsafe { object(file, "file")? };
        // SAFETY: forwarded.
        unsafe { write(group, GroupTarget::File(&file.file), offset, buffer, size) }
    })
}

/// Ends one group of requests: submits everything pending; the next request may go the other
/// way. Does not wait. Returns 0 or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_doneio(group: *mut flotilla_group) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_group(group, |g| g.doneio().map(|()| 0).map_err(Failure::from)) }
}

/// Returns 1 if everything submitted has finished (read buffers are then filled), 0 if not,
/// or a negative errno for a failed request (the message names it). Submits pending requests
/// only when nothing submitted is still outstanding.
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_testio(group: *mut flotilla_group) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_group(group, |g| g.testio().map(c_int::from).map_err(Failure::from)) }
}

/// Submits everything pending and waits for every request. Returns 0, or a negative errno
/// whose message names the first failed request (index, fork or file, offset, size).
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_waitio(group: *mut flotilla_group) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_group(group, |g| g.waitio().map(|()| 0).map_err(Failure::from)) }
}

/// Submits what is pending, waits for everything, and frees the group. Returns 0 or the
/// negative errno of a failed request. NULL is accepted.
#[no_mangle]
pub unsafe extern "C" fn flotilla_group_free(group: *mut flotilla_group) -> c_int {
    guard_status(|| {
        if group.is_null() {
            return Ok(());
        }
        // SAFETY: the caller passes a group this library made, not yet freed.
        let group = unsafe { Box::from_raw(group) };
        group.group.finish().map(|_| ()).map_err(Failure::from)
    })
}
