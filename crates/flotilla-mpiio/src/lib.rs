//! The Rust core of `libflotilla_mpiio`: MPI datatypes flattened into nested-strided runs
//! ([`layout`]), one access of a file view turned into one structured request ([`access`]),
//! and the files themselves, behind a C interface of plain C types (`fmpi_*`).
//!
//! The MPI side lives in `c/flotilla_mpiio.c`, compiled once against each MPI's `mpi.h`
//! (Open MPI and MPICH differ in ABI): it intercepts `MPI_File_*` through the profiling
//! interface, decodes datatypes with `MPI_Type_get_envelope`/`get_contents`, does what is
//! collective (communicator-wide open, barriers) and maps the `FMPI_ERR_*` codes returned here
//! to MPI error classes. See `docs/mpi-io.md`.
//!
//! Rules every `fmpi_*` function keeps: no panic crosses the boundary (a panic is
//! `FMPI_ERR_IO`); every failure returns a nonzero `FMPI_ERR_*` and leaves a message for
//! `fmpi_last_error`; pointers are checked for NULL and counts for sign before use.

#![allow(clippy::missing_safety_doc)]

pub mod access;
pub mod layout;

use access::{plan, View};
use flotilla_client::{Client, ClientError, CreateOptions, File, OpenOptions, ReplicatedLayout};
use layout::{Layout, LayoutError};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub const FMPI_OK: c_int = 0;
pub const FMPI_ERR_IO: c_int = 1;
pub const FMPI_ERR_NO_SUCH_FILE: c_int = 2;
pub const FMPI_ERR_FILE_EXISTS: c_int = 3;
pub const FMPI_ERR_ACCESS: c_int = 4;
pub const FMPI_ERR_TYPE: c_int = 5;
pub const FMPI_ERR_ARG: c_int = 6;
pub const FMPI_ERR_UNSUPPORTED: c_int = 7;
pub const FMPI_ERR_NO_SPACE: c_int = 8;
pub const FMPI_ERR_READ_ONLY: c_int = 9;
pub const FMPI_ERR_BAD_FILE: c_int = 10;
pub const FMPI_ERR_QUOTA: c_int = 11;
pub const FMPI_ERR_AMODE: c_int = 12;

/// Access modes (`fmpi_open`'s `amode`), the C shim's translation of `MPI_MODE_*`.
pub const FMPI_MODE_RDONLY: u32 = 1;
pub const FMPI_MODE_WRONLY: u32 = 2;
pub const FMPI_MODE_RDWR: u32 = 4;
pub const FMPI_MODE_CREATE: u32 = 8;
pub const FMPI_MODE_EXCL: u32 = 16;

/// Datatype constructors (`fmpi_type_build`'s `kind`), from MPI's combiners.
pub const FMPI_TYPE_DUP: u32 = 1;
pub const FMPI_TYPE_CONTIGUOUS: u32 = 2;
pub const FMPI_TYPE_VECTOR: u32 = 3;
pub const FMPI_TYPE_HVECTOR: u32 = 4;
pub const FMPI_TYPE_INDEXED: u32 = 5;
pub const FMPI_TYPE_HINDEXED: u32 = 6;
pub const FMPI_TYPE_INDEXED_BLOCK: u32 = 7;
pub const FMPI_TYPE_HINDEXED_BLOCK: u32 = 8;
pub const FMPI_TYPE_STRUCT: u32 = 9;
pub const FMPI_TYPE_SUBARRAY: u32 = 10;
pub const FMPI_TYPE_RESIZED: u32 = 11;

/// A failure: an `FMPI_ERR_*` class and a message.
struct Failure {
    class: c_int,
    message: String,
}

impl Failure {
    fn new(class: c_int, message: impl Into<String>) -> Failure {
        Failure { class, message: message.into() }
    }
}

impl From<LayoutError> for Failure {
    fn from(error: LayoutError) -> Failure {
        let class = match error {
            LayoutError::Unsupported(_) => FMPI_ERR_UNSUPPORTED,
            LayoutError::Invalid(_) | LayoutError::TooLarge(_) => FMPI_ERR_TYPE,
        };
        Failure::new(class, error.to_string())
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        let class = match error.errno() {
            2 => FMPI_ERR_NO_SUCH_FILE, // ENOENT
            17 => FMPI_ERR_FILE_EXISTS, // EEXIST
            1 | 13 => FMPI_ERR_ACCESS,  // EPERM, EACCES
            28 => FMPI_ERR_NO_SPACE,    // ENOSPC
            30 => FMPI_ERR_READ_ONLY,   // EROFS
            122 => FMPI_ERR_QUOTA,      // EDQUOT
            22 => FMPI_ERR_ARG,         // EINVAL
            _ => FMPI_ERR_IO,
        };
        Failure::new(class, error.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `body`, turning a failure or a panic into a class and a message.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
        .unwrap_or_else(|_| Err(Failure::new(FMPI_ERR_IO, "internal error (a panic) in libflotilla_mpiio")));
    match outcome {
        Ok(()) => FMPI_OK,
        Err(failure) => {
            let message = CString::new(failure.message.replace('\0', " ")).unwrap_or_default();
            LAST_ERROR.with(|last| *last.borrow_mut() = message);
            failure.class
        }
    }
}

/// The message of this thread's last failure (valid until its next failure).
#[no_mangle]
pub extern "C" fn fmpi_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn types() -> &'static Mutex<HashMap<u64, Arc<Layout>>> {
    static TYPES: OnceLock<Mutex<HashMap<u64, Arc<Layout>>>> = OnceLock::new();
    TYPES.get_or_init(Default::default)
}

fn layout(id: u64) -> Result<Arc<Layout>, Failure> {
    types().lock().get(&id).cloned().ok_or_else(|| Failure::new(FMPI_ERR_TYPE, format!("no datatype {id}")))
}

fn register_type(layout: Layout, out: *mut u64) -> Result<(), Failure> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    types().lock().insert(id, Arc::new(layout));
    // SAFETY: the caller passes a writable `out` (checked for NULL).
    unsafe { *out.as_mut().ok_or_else(|| Failure::new(FMPI_ERR_ARG, "output is NULL"))? = id };
    Ok(())
}

/// A C array as a slice (NULL only with a count of 0).
unsafe fn slice<'a, T>(items: *const T, count: usize) -> Result<&'a [T], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if items.is_null() {
        return Err(Failure::new(FMPI_ERR_ARG, "array is NULL but its count is not 0"));
    }
    // SAFETY: non-NULL, and the caller's contract gives `count` items.
    Ok(unsafe { std::slice::from_raw_parts(items, count) })
}

/// Registers a predefined type of `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn fmpi_type_named(size: u64, lb: i64, extent: i64, out: *mut u64) -> c_int {
    guard(|| register_type(Layout::named(size, lb, extent)?, out))
}

/// Registers a derived type: `kind` (FMPI_TYPE_*) and the integers, addresses and
/// (registered) types `MPI_Type_get_contents` gave, integers widened to 64 bits.
#[no_mangle]
pub unsafe extern "C" fn fmpi_type_build(
    kind: u32,
    ints: *const i64,
    int_count: usize,
    addresses: *const i64,
    address_count: usize,
    children: *const u64,
    child_count: usize,
    out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller passes arrays of the given counts.
        let (ints, addresses, children) = unsafe {
            (slice(ints, int_count)?, slice(addresses, address_count)?, slice(children, child_count)?)
        };
        let children: Vec<Arc<Layout>> = children.iter().map(|&id| layout(id)).collect::<Result<_, _>>()?;
        let layout = build(kind, ints, addresses, &children)?;
        register_type(layout, out)
    })
}

fn arg<T: Copy>(items: &[T], index: usize) -> Result<T, Failure> {
    items
        .get(index)
        .copied()
        .ok_or_else(|| Failure::new(FMPI_ERR_TYPE, "datatype contents shorter than the combiner needs"))
}

fn counts(values: &[i64]) -> Result<Vec<u64>, Failure> {
    values
        .iter()
        .map(|&v| {
            u64::try_from(v).map_err(|_| Failure::new(FMPI_ERR_TYPE, format!("negative block length {v}")))
        })
        .collect()
}

/// A derived type from its constructor's arguments (the layout of `MPI_Type_get_contents`).
fn build(kind: u32, ints: &[i64], addresses: &[i64], children: &[Arc<Layout>]) -> Result<Layout, Failure> {
    let old =
        children.first().ok_or_else(|| Failure::new(FMPI_ERR_TYPE, "derived type without an old type"))?;
    let count = || -> Result<usize, Failure> {
        usize::try_from(arg(ints, 0)?).map_err(|_| Failure::new(FMPI_ERR_TYPE, "negative count"))
    };
    let range = |items: &[i64], from: usize, n: usize| -> Result<Vec<i64>, Failure> {
        items
            .get(from..from + n)
            .map(<[i64]>::to_vec)
            .ok_or_else(|| Failure::new(FMPI_ERR_TYPE, "datatype contents shorter than the combiner needs"))
    };
    let scaled = |displacements: Vec<i64>, scale: i64| -> Result<Vec<i64>, Failure> {
        displacements
            .into_iter()
            .map(|d| {
                d.checked_mul(scale).ok_or_else(|| Failure::new(FMPI_ERR_TYPE, "displacement overflows"))
            })
            .collect()
    };
    let layout = match kind {
        FMPI_TYPE_DUP => (**old).clone(),
        FMPI_TYPE_CONTIGUOUS => Layout::contiguous(arg(ints, 0)?, old)?,
        FMPI_TYPE_VECTOR => Layout::vector(arg(ints, 0)?, arg(ints, 1)?, arg(ints, 2)?, false, old)?,
        FMPI_TYPE_HVECTOR => Layout::vector(arg(ints, 0)?, arg(ints, 1)?, arg(addresses, 0)?, true, old)?,
        FMPI_TYPE_INDEXED | FMPI_TYPE_HINDEXED | FMPI_TYPE_INDEXED_BLOCK | FMPI_TYPE_HINDEXED_BLOCK => {
            let n = count()?;
            let lengths = match kind {
                FMPI_TYPE_INDEXED | FMPI_TYPE_HINDEXED => counts(&range(ints, 1, n)?)?,
                _ => vec![counts(&[arg(ints, 1)?])?[0]; n],
            };
            let displacements = match kind {
                FMPI_TYPE_INDEXED => scaled(range(ints, 1 + n, n)?, old.extent)?,
                FMPI_TYPE_INDEXED_BLOCK => scaled(range(ints, 2, n)?, old.extent)?,
                _ => range(addresses, 0, n)?,
            };
            let blocks: Vec<(i64, u64)> = displacements.into_iter().zip(lengths).collect();
            Layout::blocks(&blocks, old)?
        }
        FMPI_TYPE_STRUCT => {
            let n = count()?;
            let lengths = counts(&range(ints, 1, n)?)?;
            let displacements = range(addresses, 0, n)?;
            if children.len() < n {
                return Err(Failure::new(FMPI_ERR_TYPE, "struct with fewer types than blocks"));
            }
            let blocks: Vec<(i64, u64, &Layout)> =
                (0..n).map(|i| (displacements[i], lengths[i], &*children[i])).collect();
            Layout::structure(&blocks)?
        }
        FMPI_TYPE_SUBARRAY => {
            let n = count()?;
            let sizes = range(ints, 1, n)?;
            let subsizes = range(ints, 1 + n, n)?;
            let starts = range(ints, 1 + 2 * n, n)?;
            // The shim passes the order as 0 for C, 1 for Fortran.
            let order_c = arg(ints, 1 + 3 * n)? == 0;
            Layout::subarray(&sizes, &subsizes, &starts, order_c, old)?
        }
        FMPI_TYPE_RESIZED => Layout::resized(arg(addresses, 0)?, arg(addresses, 1)?, old),
        other => return Err(Failure::new(FMPI_ERR_UNSUPPORTED, format!("datatype constructor {other}"))),
    };
    Ok(layout)
}

/// Forgets a registered type.
#[no_mangle]
pub extern "C" fn fmpi_type_free(id: u64) {
    types().lock().remove(&id);
}

/// The size, lower bound and extent of a registered type.
#[no_mangle]
pub unsafe extern "C" fn fmpi_type_info(id: u64, size: *mut u64, lb: *mut i64, extent: *mut i64) -> c_int {
    guard(|| {
        let layout = layout(id)?;
        // SAFETY: the caller passes NULL or writable outputs.
        unsafe {
            if let Some(out) = size.as_mut() {
                *out = layout.size;
            }
            if let Some(out) = lb.as_mut() {
                *out = layout.lb;
            }
            if let Some(out) = extent.as_mut() {
                *out = layout.extent;
            }
        }
        Ok(())
    })
}

/// One open file of this process.
struct OpenFile {
    file: File,
    amode: u32,
    state: Mutex<FileState>,
}

struct FileState {
    view: View,
    /// The individual file pointer, in etypes of the view.
    pointer: u64,
}

fn files() -> &'static Mutex<HashMap<u64, Arc<OpenFile>>> {
    static FILES: OnceLock<Mutex<HashMap<u64, Arc<OpenFile>>>> = OnceLock::new();
    FILES.get_or_init(Default::default)
}

fn open_file(id: u64) -> Result<Arc<OpenFile>, Failure> {
    files()
        .lock()
        .get(&id)
        .cloned()
        .ok_or_else(|| Failure::new(FMPI_ERR_BAD_FILE, format!("no open file {id}")))
}

/// The process's client, connected on first use to `FLOTILLA_META` with `FLOTILLA_KEY`.
fn client() -> Result<&'static Client, Failure> {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client);
    }
    let client = Client::from_env().map_err(|e| {
        Failure::new(FMPI_ERR_IO, format!("cannot connect to Flotilla (FLOTILLA_META, FLOTILLA_KEY): {e}"))
    })?;
    Ok(CLIENT.get_or_init(|| client))
}

unsafe fn path_of(path: *const c_char) -> Result<String, Failure> {
    if path.is_null() {
        return Err(Failure::new(FMPI_ERR_ARG, "path is NULL"));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(path) }
        .to_str()
        .map_err(|_| Failure::new(FMPI_ERR_ARG, "path is not UTF-8"))?;
    let path = text.strip_prefix("flotilla:").unwrap_or(text);
    if !path.starts_with('/') {
        return Err(Failure::new(
            FMPI_ERR_ARG,
            format!("`{text}`: a Flotilla path is absolute (flotilla:/dir/file)"),
        ));
    }
    Ok(path.to_string())
}

/// Opens (and with `FMPI_MODE_CREATE` creates; exclusively with `FMPI_MODE_EXCL`) the file
/// `path` (`flotilla:/...` or `/...`). A new file gets `striping_factor` subfiles of
/// `striping_unit` bytes when both are nonzero, else its directory's layout.
#[no_mangle]
pub unsafe extern "C" fn fmpi_open(
    path: *const c_char,
    amode: u32,
    striping_factor: u32,
    striping_unit: u64,
    out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a NUL-terminated path.
        let path = unsafe { path_of(path)? };
        let access = amode & (FMPI_MODE_RDONLY | FMPI_MODE_WRONLY | FMPI_MODE_RDWR);
        if access.count_ones() != 1
            || (access == FMPI_MODE_RDONLY && amode & (FMPI_MODE_CREATE | FMPI_MODE_EXCL) != 0)
        {
            return Err(Failure::new(FMPI_ERR_AMODE, format!("access mode {amode:#x}: exactly one of RDONLY, WRONLY, RDWR, and no CREATE or EXCL with RDONLY")));
        }
        let client = client()?;
        let file = if amode & FMPI_MODE_CREATE != 0 {
            let mut options = CreateOptions {
                exclusive: amode & FMPI_MODE_EXCL != 0,
                no_overlap: true,
                ..CreateOptions::default()
            };
            if striping_factor > 0 && striping_unit > 0 {
                let text = format!("stripe:{striping_unit}:{striping_factor}");
                let parsed = ReplicatedLayout::parse(&text)
                    .map_err(|e| Failure::new(FMPI_ERR_ARG, format!("striping hints: {e}")))?;
                options.layout = Some(parsed.layout);
                options.subfiles = striping_factor;
            }
            match client.create(&path, &options) {
                Err(error) if !options.exclusive && error.errno() == 17 => {
                    client.open_with(&path, &OpenOptions { no_overlap: true })?
                }
                other => other?,
            }
        } else {
            client.open_with(&path, &OpenOptions { no_overlap: true })?
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let state = Mutex::new(FileState { view: View::bytes(), pointer: 0 });
        files().lock().insert(id, Arc::new(OpenFile { file, amode, state }));
        // SAFETY: the caller passes a writable `out`.
        unsafe { *out.as_mut().ok_or_else(|| Failure::new(FMPI_ERR_ARG, "output is NULL"))? = id };
        Ok(())
    })
}

/// Makes this process's writes durable and visible, and forgets the file.
#[no_mangle]
pub extern "C" fn fmpi_close(id: u64) -> c_int {
    guard(|| {
        let file = files()
            .lock()
            .remove(&id)
            .ok_or_else(|| Failure::new(FMPI_ERR_BAD_FILE, format!("no open file {id}")))?;
        file.file.flush()?;
        Ok(())
    })
}

/// Removes the file `path`.
#[no_mangle]
pub unsafe extern "C" fn fmpi_delete(path: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a NUL-terminated path.
        let path = unsafe { path_of(path)? };
        client()?.remove(&path)?;
        Ok(())
    })
}

/// Sets the view: displacement in bytes, etype and filetype (registered types). The
/// individual file pointer goes back to 0.
#[no_mangle]
pub extern "C" fn fmpi_set_view(id: u64, disp: i64, etype: u64, filetype: u64) -> c_int {
    guard(|| {
        let file = open_file(id)?;
        let disp = u64::try_from(disp)
            .map_err(|_| Failure::new(FMPI_ERR_ARG, format!("negative displacement {disp}")))?;
        let view = View::new(disp, &*layout(etype)?, &*layout(filetype)?)?;
        *file.state.lock() = FileState { view, pointer: 0 };
        Ok(())
    })
}

/// Reads (`write` 0) or writes `count` items of `memtype` at `buffer` through the view, at
/// `offset` etypes when `explicit` is nonzero, else at the individual file pointer (which
/// then moves past the data). One structured request; `*bytes` gets the data bytes moved.
#[no_mangle]
pub unsafe extern "C" fn fmpi_io(
    id: u64,
    write: c_int,
    explicit: c_int,
    offset: i64,
    buffer: *mut c_void,
    count: i64,
    memtype: u64,
    bytes: *mut u64,
) -> c_int {
    guard(|| {
        let file = open_file(id)?;
        let write = write != 0;
        let access = file.amode & (FMPI_MODE_RDONLY | FMPI_MODE_WRONLY | FMPI_MODE_RDWR);
        if write && access == FMPI_MODE_RDONLY {
            return Err(Failure::new(FMPI_ERR_READ_ONLY, "the file was opened MPI_MODE_RDONLY"));
        }
        if !write && access == FMPI_MODE_WRONLY {
            return Err(Failure::new(FMPI_ERR_ACCESS, "the file was opened MPI_MODE_WRONLY"));
        }
        let count = u64::try_from(count)
            .map_err(|_| Failure::new(FMPI_ERR_ARG, format!("negative count {count}")))?;
        let memtype = layout(memtype)?;
        let mut state = file.state.lock();
        let position = if explicit != 0 {
            u64::try_from(offset)
                .map_err(|_| Failure::new(FMPI_ERR_ARG, format!("negative offset {offset}")))?
        } else {
            state.pointer
        };
        let moved = match plan(&state.view, position, count, &memtype)? {
            None => 0,
            Some(request) => {
                if buffer.is_null() {
                    return Err(Failure::new(FMPI_ERR_ARG, "buffer is NULL"));
                }
                let span = usize::try_from(request.memory_span)
                    .map_err(|_| Failure::new(FMPI_ERR_ARG, "buffer too large"))?;
                // SAFETY: MPI's contract: `count` items of `memtype` are valid at `buffer`, so
                // every byte from the lowest to the highest the type touches is in one object.
                let base = unsafe { buffer.cast::<u8>().offset(request.memory_base as isize) };
                if write {
                    // SAFETY: as above; only read.
                    let memory = unsafe { std::slice::from_raw_parts(base, span) };
                    file.file.write_shape(&request.shape, memory)?;
                } else {
                    // SAFETY: as above; MPI lends the buffer to the call.
                    let memory = unsafe { std::slice::from_raw_parts_mut(base, span) };
                    file.file.read_shape(&request.shape, memory)?;
                }
                request.bytes
            }
        };
        if explicit == 0 {
            state.pointer = position + moved / state.view.etype_size;
        }
        // SAFETY: NULL or writable.
        if let Some(out) = unsafe { bytes.as_mut() } {
            *out = moved;
        }
        Ok(())
    })
}

/// The file's size in bytes: the largest of what the metadata service knows (asked by id, past
/// the client's attribute cache, so that a size another rank published before a barrier is
/// seen) and what this process wrote.
fn size_of(file: &OpenFile) -> Result<u64, Failure> {
    let published = client()?.stat_id(file.file.id())?.attrs.size_bytes;
    Ok(published.max(file.file.size()))
}

/// Stores the file's size in `*out`.
#[no_mangle]
pub unsafe extern "C" fn fmpi_get_size(id: u64, out: *mut u64) -> c_int {
    guard(|| {
        let size = size_of(&*open_file(id)?)?;
        // SAFETY: writable by the caller's contract.
        unsafe { *out.as_mut().ok_or_else(|| Failure::new(FMPI_ERR_ARG, "output is NULL"))? = size };
        Ok(())
    })
}

/// Truncates or extends the file.
#[no_mangle]
pub extern "C" fn fmpi_set_size(id: u64, size: i64) -> c_int {
    guard(|| {
        let size =
            u64::try_from(size).map_err(|_| Failure::new(FMPI_ERR_ARG, format!("negative size {size}")))?;
        let file = open_file(id)?;
        file.file.flush()?;
        file.file.set_size(size)?;
        Ok(())
    })
}

/// Makes this process's writes durable and their size visible to every process.
#[no_mangle]
pub extern "C" fn fmpi_sync(id: u64) -> c_int {
    guard(|| {
        open_file(id)?.file.sync()?;
        Ok(())
    })
}

/// Moves the individual file pointer: `whence` 0 set, 1 current, 2 end of file (in etypes of
/// the view).
#[no_mangle]
pub extern "C" fn fmpi_seek(id: u64, offset: i64, whence: c_int) -> c_int {
    guard(|| {
        let file = open_file(id)?;
        let end = if whence == 2 { Some(size_of(&file)?) } else { None };
        let mut state = file.state.lock();
        let base = match (whence, end) {
            (0, _) => 0,
            (1, _) => state.pointer as i64,
            (2, Some(size)) => view_end(&state.view, size) as i64,
            _ => return Err(Failure::new(FMPI_ERR_ARG, format!("seek whence {whence}"))),
        };
        let target = base.checked_add(offset).filter(|t| *t >= 0).ok_or_else(|| {
            Failure::new(FMPI_ERR_ARG, format!("seek to a negative position ({base} + {offset})"))
        })?;
        state.pointer = target as u64;
        Ok(())
    })
}

/// The view's position (in etypes) of the end of a file of `size` bytes: the etypes of the
/// view that lie wholly before it.
fn view_end(view: &View, size: u64) -> u64 {
    if size <= view.disp {
        return 0;
    }
    let tile = &view.filetype;
    let extent = tile.extent as u64;
    let full = (size - view.disp) / extent;
    let tile_start = view.disp + full * extent;
    let mut partial = 0u64;
    for nest in &tile.nests {
        nest.for_each_record(&mut |disp, _, length| {
            let start = tile_start as i64 + disp;
            let end = start + length as i64;
            partial += (end.min(size as i64) - start).max(0) as u64;
        });
    }
    (full * tile.size + partial) / view.etype_size
}

/// The individual file pointer, in etypes.
#[no_mangle]
pub unsafe extern "C" fn fmpi_position(id: u64, out: *mut i64) -> c_int {
    guard(|| {
        let pointer = open_file(id)?.state.lock().pointer;
        // SAFETY: writable by the caller's contract.
        unsafe {
            *out.as_mut().ok_or_else(|| Failure::new(FMPI_ERR_ARG, "output is NULL"))? = pointer as i64
        };
        Ok(())
    })
}

/// The absolute byte offset of view position `offset` (etypes).
#[no_mangle]
pub unsafe extern "C" fn fmpi_byte_offset(id: u64, offset: i64, out: *mut i64) -> c_int {
    guard(|| {
        let file = open_file(id)?;
        let state = file.state.lock();
        let offset = u64::try_from(offset).map_err(|_| Failure::new(FMPI_ERR_ARG, "negative offset"))?;
        let byte = match plan(&state.view, offset, state.view.etype_size, &Layout::named(1, 0, 1)?)? {
            Some(access) => first_file_byte(&access.shape),
            None => state.view.disp,
        };
        // SAFETY: writable by the caller's contract.
        unsafe { *out.as_mut().ok_or_else(|| Failure::new(FMPI_ERR_ARG, "output is NULL"))? = byte as i64 };
        Ok(())
    })
}

fn first_file_byte(shape: &flotilla_client::Shape) -> u64 {
    let mut first = u64::MAX;
    let _ = shape.for_each_piece(|piece| {
        first = first.min(piece.file_offset);
        Ok::<(), flotilla_request::ShapeError>(())
    });
    first
}
