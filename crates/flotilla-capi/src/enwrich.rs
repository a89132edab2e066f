//! `flotilla_enwrich`: a file open for writing in ENWRICH mode (compute-node write caching
//! with collective flushes; see docs/c-api.md "ENWRICH").

use crate::client::flotilla_client;
use crate::error::{c_str, guard_bytes, guard_status, object, put, Failure};
use crate::file::buffer_ref;
use ::flotilla_client::{EnwrichFile, EnwrichOptions};
use std::ffi::{c_char, c_int, c_void};

/// A file open for writing in ENWRICH mode (opaque). One thread at a time.
pub struct flotilla_enwrich {
    pub(crate) file: Option<EnwrichFile>,
}

/// How to open a file in ENWRICH mode. NULL options, or a NULL `job_name` / zero
/// `job_size`, take the job from FLOTILLA_JOB_NAME / FLOTILLA_JOB_SIZE (or SLURM, Open MPI,
/// MPICH). Zeros elsewhere mean the defaults (4 MiB cache, directory fraction 0.1, flush
/// after 30 s).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_enwrich_options {
    pub job_name: *const c_char,
    pub job_size: u32,
    pub cache_bytes: u64,
    pub directory_fraction: f64,
    pub flush_timeout_ms: u64,
}

/// The options from C, completed from the environment where they leave the job out.
unsafe fn enwrich_options(given: Option<&flotilla_enwrich_options>) -> Result<EnwrichOptions, Failure> {
    let job_name = match given.filter(|g| !g.job_name.is_null()) {
        // SAFETY: the caller passes a NUL-terminated job name.
        Some(g) => Some(unsafe { c_str(g.job_name, "job name")? }.to_string()),
        None => None,
    };
    let job_size = given.map(|g| g.job_size).filter(|s| *s > 0);
    let mut options = match (job_name, job_size) {
        (Some(name), Some(size)) => EnwrichOptions::new(name, size),
        (name, size) => {
            let mut from_env = EnwrichOptions::from_env().ok_or_else(|| {
                Failure::invalid("no job given: set FLOTILLA_JOB_NAME and FLOTILLA_JOB_SIZE")
            })?;
            from_env.job_name = name.unwrap_or(from_env.job_name);
            from_env.job_size = size.unwrap_or(from_env.job_size);
            from_env
        }
    };
    if let Some(g) = given {
        if g.cache_bytes > 0 {
            options.cache_bytes = g.cache_bytes;
        }
        if g.directory_fraction > 0.0 {
            options.directory_fraction = g.directory_fraction;
        }
        if g.flush_timeout_ms > 0 {
            options.flush_timeout_ms = g.flush_timeout_ms;
        }
    }
    Ok(options)
}

/// Opens `path` (an existing file) for writing in ENWRICH mode as a member of a job and
/// stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_enwrich_open(
    client: *const flotilla_client,
    path: *const c_char,
    options: *const flotilla_enwrich_options,
    out: *mut *mut flotilla_enwrich,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live client, a NUL-terminated path and NULL or valid
        // options.
        let (client, path, given) =
            unsafe { (object(client, "client")?, c_str(path, "path")?, options.as_ref()) };
        // SAFETY: as above.
        let options = unsafe { enwrich_options(given)? };
        let file = client.client.open_enwrich(path, &options)?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_enwrich { file: Some(file) }) }
    })
}

fn open_file(file: &flotilla_enwrich) -> Result<&EnwrichFile, Failure> {
    file.file.as_ref().ok_or_else(|| Failure::invalid("ENWRICH file already closed"))
}

/// Logs `buffer_bytes` bytes at `offset` in this process's cache (a full cache flushes the
/// job first). Returns the bytes written or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_enwrich_write(
    file: *const flotilla_enwrich,
    offset: u64,
    buffer: *const c_void,
    buffer_bytes: usize,
) -> i64 {
    guard_bytes(|| {
        // SAFETY: the caller passes a live file and a buffer of `buffer_bytes` bytes.
        let (file, data) = unsafe { (object(file, "ENWRICH file")?, buffer_ref(buffer, buffer_bytes)?) };
        open_file(file)?.write_at(offset, data)?;
        Ok(data.len() as u64)
    })
}

/// Flushes the whole job now; returns once this process's writes are durable and the
/// file's size published.
#[no_mangle]
pub unsafe extern "C" fn flotilla_enwrich_sync(file: *const flotilla_enwrich) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live file.
        let file = unsafe { object(file, "ENWRICH file")? };
        open_file(file)?.sync().map_err(Failure::from)
    })
}

/// This process's member index in the job, or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_enwrich_member(file: *const flotilla_enwrich) -> i64 {
    // SAFETY: the caller passes a live file.
    guard_bytes(|| Ok(u64::from(open_file(unsafe { object(file, "ENWRICH file")? })?.member())))
}

/// Flushes, leaves the job and frees the file. NULL is accepted. The file is freed even when
/// the flush fails (the error is returned).
#[no_mangle]
pub unsafe extern "C" fn flotilla_enwrich_close(file: *mut flotilla_enwrich) -> c_int {
    guard_status(|| {
        if file.is_null() {
            return Ok(());
        }
        // SAFETY: the caller passes a file this library made, not yet freed.
        let mut file = unsafe { Box::from_raw(file) };
        match file.file.take() {
            Some(open) => open.close().map_err(Failure::from),
            None => Ok(()),
        }
    })
}
