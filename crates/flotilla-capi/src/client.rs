//! `flotilla_client`: connecting, and the namespace calls.

use crate::error::{c_str, guard_status, object, put, Failure};
use ::flotilla_client::{Client, FileKind};
use std::ffi::{c_char, c_int, c_void};

/// A connection to a cluster (opaque).
pub struct flotilla_client {
    pub(crate) client: Client,
}

/// A regular file.
pub const FLOTILLA_KIND_FILE: u32 = 1;
/// A directory.
pub const FLOTILLA_KIND_DIRECTORY: u32 = 2;
/// A symbolic link.
pub const FLOTILLA_KIND_SYMLINK: u32 = 3;
/// A FIFO, socket or device node (made through the mount).
pub const FLOTILLA_KIND_SPECIAL: u32 = 4;

/// Attributes of a namespace entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct flotilla_attributes {
    pub id: u64,
    /// FLOTILLA_KIND_*.
    pub kind: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub subfiles: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

pub(crate) fn kind_code(kind: FileKind) -> u32 {
    match kind {
        FileKind::File => FLOTILLA_KIND_FILE,
        FileKind::Directory => FLOTILLA_KIND_DIRECTORY,
        FileKind::Symlink => FLOTILLA_KIND_SYMLINK,
        FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => {
            FLOTILLA_KIND_SPECIAL
        }
    }
}

/// Connects to the metadata service at `meta` ("HOST:PORT"; NULL: the FLOTILLA_META
/// environment variable) and stores the client in `*out`. Connections open lazily.
#[no_mangle]
pub unsafe extern "C" fn flotilla_connect(meta: *const c_char, out: *mut *mut flotilla_client) -> c_int {
    guard_status(|| {
        let client = if meta.is_null() {
            Client::from_env()?
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            Client::connect(unsafe { c_str(meta, "meta")? })?
        };
        // SAFETY: the caller passes a writable `out`.
        unsafe { put(out, flotilla_client { client }) }
    })
}

/// Frees the client. Files and forks opened through it stay usable until closed. NULL is
/// accepted.
#[no_mangle]
pub unsafe extern "C" fn flotilla_disconnect(client: *mut flotilla_client) -> c_int {
    guard_status(|| {
        if !client.is_null() {
            // SAFETY: the caller passes a client this library made, not yet freed.
            drop(unsafe { Box::from_raw(client) });
        }
        Ok(())
    })
}

/// Runs `call` on the client and path given by C.
unsafe fn with_path(
    client: *const flotilla_client,
    path: *const c_char,
    call: impl FnOnce(&Client, &str) -> Result<(), Failure>,
) -> c_int {
    guard_status(|| {
        // SAFETY: the caller passes a live client and a NUL-terminated path.
        let (client, path) = unsafe { (object(client, "client")?, c_str(path, "path")?) };
        call(&client.client, path)
    })
}

/// Creates a directory.
#[no_mangle]
pub unsafe extern "C" fn flotilla_mkdir(
    client: *const flotilla_client,
    path: *const c_char,
    mode: u32,
) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { with_path(client, path, |c, p| c.mkdir(p, mode).map(drop).map_err(Failure::from)) }
}

/// Removes a file or symlink.
#[no_mangle]
pub unsafe extern "C" fn flotilla_remove(client: *const flotilla_client, path: *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { with_path(client, path, |c, p| c.remove(p).map_err(Failure::from)) }
}

/// Removes an empty directory.
#[no_mangle]
pub unsafe extern "C" fn flotilla_rmdir(client: *const flotilla_client, path: *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { with_path(client, path, |c, p| c.rmdir(p).map_err(Failure::from)) }
}

/// Renames `from` to `to`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_rename(
    client: *const flotilla_client,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: the caller passes a NUL-terminated `to`; the rest is forwarded.
    unsafe {
        with_path(client, from, |c, from| {
            let to = c_str(to, "to")?;
            c.rename(from, to).map_err(Failure::from)
        })
    }
}

/// Fills `*out` with the attributes of the entry at `path`.
#[no_mangle]
pub unsafe extern "C" fn flotilla_stat(
    client: *const flotilla_client,
    path: *const c_char,
    out: *mut flotilla_attributes,
) -> c_int {
    // SAFETY: forwarded caller contract; `out` is checked and written once.
    unsafe {
        with_path(client, path, |c, p| {
            let out = out.as_mut().ok_or_else(|| Failure::invalid("stat output is NULL"))?;
            let entry = c.stat(p)?;
            let a = &entry.attrs;
            *out = flotilla_attributes {
                id: entry.id,
                kind: kind_code(a.kind),
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                size: a.size_bytes,
                nlink: a.nlink,
                subfiles: entry.subfiles.len() as u32,
                atime_ns: a.atime_ns,
                mtime_ns: a.mtime_ns,
                ctime_ns: a.ctime_ns,
            };
            Ok(())
        })
    }
}

/// Called once per directory entry by `flotilla_readdir`; a nonzero return stops the listing.
pub type flotilla_readdir_callback =
    Option<unsafe extern "C" fn(name: *const c_char, id: u64, kind: u32, context: *mut c_void) -> c_int>;

/// Lists the directory at `path`, calling `callback(name, id, kind, context)` per entry
/// (`name` is valid during the callback only).
#[no_mangle]
pub unsafe extern "C" fn flotilla_readdir(
    client: *const flotilla_client,
    path: *const c_char,
    callback: flotilla_readdir_callback,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded caller contract; the callback is the caller's.
    unsafe {
        with_path(client, path, |c, p| {
            let callback = callback.ok_or_else(|| Failure::invalid("callback is NULL"))?;
            for entry in c.readdir(p)? {
                let name =
                    std::ffi::CString::new(entry.name).map_err(|_| Failure::invalid("name holds NUL"))?;
                if callback(name.as_ptr(), entry.id, kind_code(entry.kind), context) != 0 {
                    break;
                }
            }
            Ok(())
        })
    }
}
