//! `flotilla_file`: creating, opening and closing files, and I/O on their linear bytes.

use crate::client::flotilla_client;
use crate::error::{c_str, guard_bytes, guard_status, object, put, Failure};
use crate::handle::{flotilla_handle, start};
use crate::request::{flotilla_request, request_shape};
use ::flotilla_client::{CreateOptions, File, OpenOptions, ReplicatedLayout};
use std::ffi::{c_char, c_int, c_void};

/// An open file (opaque).
pub struct flotilla_file {
    pub(crate) file: File,
}

/// How to create a file. NULL options mean: 1 subfile, mode 0644, exclusive, the directory's
/// default layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flotilla_create_options {
    /// Number of subfiles (0 means 1).
    pub subfiles: u32,
    pub mode: u32,
    /// Nonzero: fail with -EEXIST if the file exists; zero: open it.
    pub exclusive: u8,
    /// "stripe:UNIT[:COUNT]", "hash:BLOCK[:SEQ[:COUNT]]", "explicit", or NULL to inherit.
    pub layout: *const c_char,
}

/// Creates a file and stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_create(
    client: *const flotilla_client,
    path: *const c_char,
    options: *const flotilla_create_options,
    out: *mut *mut flotilla_file,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live client, a NUL-terminated path, and NULL or valid
        // options whose `layout` is NULL or NUL-terminated.
        let (client, path, given) =
            unsafe { (object(client, "client")?, c_str(path, "path")?, options.as_ref()) };
        let mut create = CreateOptions::default();
        if let Some(given) = given {
            create.subfiles = given.subfiles.max(1);
            create.mode = given.mode;
            create.exclusive = given.exclusive != 0;
            if !given.layout.is_null() {
                // SAFETY: see above.
                let text = unsafe { c_str(given.layout, "layout")? };
                // The text may end in `,replicas=N` (issue 32: a replicated file).
                let replicated =
                    ReplicatedLayout::parse(text).map_err(|e| Failure::invalid(e.to_string()))?;
                create.layout = Some(replicated.layout);
                create.replicas = replicated.replicas;
            }
        }
        let file = match client.client.create(path, &create) {
            Err(error) if !create.exclusive && error.errno() == libc::EEXIST => client.client.open(path)?,
            other => other?,
        };
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_file { file }) }
    })
}

/// Opens an existing file and stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_open(
    client: *const flotilla_client,
    path: *const c_char,
    out: *mut *mut flotilla_file,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live client and a NUL-terminated path.
        let (client, path) = unsafe { (object(client, "client")?, c_str(path, "path")?) };
        let file = client.client.open(path)?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_file { file }) }
    })
}

/// `flotilla_open_flags`: the caller promises that no other client writes the bytes this
/// handle reads or writes (disjoint writers), so the handle takes no byte-range tokens.
pub const FLOTILLA_OPEN_NO_OVERLAP: u32 = 1;

/// Opens an existing file with `flags` (0 or `FLOTILLA_OPEN_NO_OVERLAP`; others: -EINVAL)
/// and stores it in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_open_flags(
    client: *const flotilla_client,
    path: *const c_char,
    flags: u32,
    out: *mut *mut flotilla_file,
) -> c_int {
    guard_status(|| {
        if flags & !FLOTILLA_OPEN_NO_OVERLAP != 0 {
            return Err(Failure::invalid(format!("unknown open flags {flags:#x}")));
        }
        // SAFETY: the caller passes a live client and a NUL-terminated path.
        let (client, path) = unsafe { (object(client, "client")?, c_str(path, "path")?) };
        let options = OpenOptions { no_overlap: flags & FLOTILLA_OPEN_NO_OVERLAP != 0 };
        let file = client.client.open_with(path, &options)?;
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_file { file }) }
    })
}

/// Publishes the file's size and frees it. NULL is accepted. The file is freed even when
/// publishing fails (the error is returned).
#[no_mangle]
pub unsafe extern "C" fn flotilla_close(file: *mut flotilla_file) -> c_int {
    guard_status(|| {
        if file.is_null() {
            return Ok(());
        }
        // SAFETY: the caller passes a file this library made, not yet freed.
        let file = unsafe { Box::from_raw(file) };
        file.file.close().map_err(Failure::from)
    })
}

/// Runs `call` on the file given by C.
unsafe fn with_file(file: *const flotilla_file, call: impl FnOnce(&File) -> Result<(), Failure>) -> c_int {
    // SAFETY: the caller passes a live file.
    guard_status(|| call(&unsafe { object(file, "file")? }.file))
}

/// Stores the file's size (as this client knows it) in `*out`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_size(file: *const flotilla_file, out: *mut u64) -> c_int {
    // SAFETY: forwarded; `out` is checked.
    unsafe {
        with_file(file, |f| {
            *out.as_mut().ok_or_else(|| Failure::invalid("size output is NULL"))? = f.size();
            Ok(())
        })
    }
}

/// The number of subfiles, or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_subfiles(file: *const flotilla_file) -> i64 {
    // SAFETY: the caller passes a live file.
    guard_bytes(|| Ok(u64::from(unsafe { object(file, "file")? }.file.subfile_count())))
}

/// Truncates or extends the file to `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_set_size(file: *const flotilla_file, size: u64) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_file(file, |f| f.set_size(size).map(drop).map_err(Failure::from)) }
}

/// Publishes this client's writes (size, mtime) to every client.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_flush(file: *const flotilla_file) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_file(file, |f| f.flush().map_err(Failure::from)) }
}

/// Syncs every fork of the file to disk, then publishes its size.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_sync(file: *const flotilla_file) -> c_int {
    // SAFETY: forwarded.
    unsafe { with_file(file, |f| f.sync().map_err(Failure::from)) }
}

/// A caller buffer as a slice (`buffer` may be NULL only with 0 bytes).
///
/// # Safety
/// `buffer` is valid for `bytes` bytes of reads and writes during the call.
pub(crate) unsafe fn buffer_mut<'a>(buffer: *mut c_void, bytes: usize) -> Result<&'a mut [u8], Failure> {
    if bytes == 0 {
        return Ok(&mut []);
    }
    if buffer.is_null() {
        return Err(Failure::invalid("buffer is NULL"));
    }
    // SAFETY: non-NULL; the caller's contract gives `bytes` valid bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(buffer.cast::<u8>(), bytes) })
}

/// A caller buffer as a read-only slice.
///
/// # Safety
/// `buffer` is valid for `bytes` bytes of reads during the call.
pub(crate) unsafe fn buffer_ref<'a>(buffer: *const c_void, bytes: usize) -> Result<&'a [u8], Failure> {
    if bytes == 0 {
        return Ok(&[]);
    }
    if buffer.is_null() {
        return Err(Failure::invalid("buffer is NULL"));
    }
    // SAFETY: non-NULL; the caller's contract gives `bytes` valid bytes.
    Ok(unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), bytes) })
}

/// Reads `request` of the file's linear bytes into `buffer` (`buffer_bytes` long; bytes past
/// the end of the file read as zeros). Returns the bytes read or a negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_read(
    file: *const flotilla_file,
    request: *const flotilla_request,
    buffer: *mut c_void,
    buffer_bytes: usize,
) -> i64 {
    guard_bytes(|| {
        // SAFETY: the caller passes a live file, a valid request and a buffer of
        // `buffer_bytes` bytes.
        let (file, shape, memory) =
            unsafe { (object(file, "file")?, request_shape(request)?, buffer_mut(buffer, buffer_bytes)?) };
        file.file.read_shape(&shape, memory).map_err(Failure::from)
    })
}

/// Writes `request` of the file's linear bytes from `buffer`. Returns the bytes written or a
/// negative errno.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_write(
    file: *const flotilla_file,
    request: *const flotilla_request,
    buffer: *const c_void,
    buffer_bytes: usize,
) -> i64 {
    guard_bytes(|| {
        // SAFETY: as for flotilla_file_read.
        let (file, shape, memory) =
            unsafe { (object(file, "file")?, request_shape(request)?, buffer_ref(buffer, buffer_bytes)?) };
        file.file.write_shape(&shape, memory).map_err(Failure::from)
    })
}

/// Starts a read of the file's linear bytes and stores its handle in `*out`. `buffer` must
/// stay valid and unused until the handle has finished (test returned 1, wait returned, or
/// free returned).
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_read_nb(
    file: *const flotilla_file,
    request: *const flotilla_request,
    buffer: *mut c_void,
    buffer_bytes: usize,
    out: *mut *mut flotilla_handle,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live file and a valid request, and lends the buffer
        // until the handle finished (the header says so).
        let (file, shape) = unsafe { (object(file, "file")?, request_shape(request)?) };
        let raw = unsafe { crate::handle::lend(buffer, buffer_bytes)? };
        let handle = start(file.file.read_shape_raw_nb(shape, raw));
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, handle) }
    })
}

/// Starts a write of the file's linear bytes and stores its handle in `*out`. `buffer` must
/// stay valid and unchanged until the handle has finished.
#[no_mangle]
pub unsafe extern "C" fn flotilla_file_write_nb(
    file: *const flotilla_file,
    request: *const flotilla_request,
    buffer: *const c_void,
    buffer_bytes: usize,
    out: *mut *mut flotilla_handle,
) -> c_int {
    guard_status(|| {
        // SAFETY: as for flotilla_file_read_nb; the buffer is only read.
        let (file, shape) = unsafe { (object(file, "file")?, request_shape(request)?) };
        let raw = unsafe { crate::handle::lend(buffer.cast_mut(), buffer_bytes)? };
        let handle = start(file.file.write_shape_raw_nb(shape, raw));
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, handle) }
    })
}
