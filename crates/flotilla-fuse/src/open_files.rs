//! Open files: reads, writes, flush, fsync, release, fallocate, and the size the mount
//! knows for each open file.
//!
//! Sizes. The metadata service learns a file's size when a writer flushes (close, fsync);
//! the client library overlays its own unpublished writes. Reads must stop at the true end
//! of file, so the mount keeps, per open inode, the largest size it knows (from the metadata
//! service at open and `getattr`, raised by its own writes, set by its own truncates) and asks
//! the metadata service again only when a read reaches past it.
//!
//! Data. Small writes wait in the file's write-behind buffer (`write_behind.rs`) and travel
//! packed; everything buffered is sent before a read, a size change, a flush, an fsync and a
//! release of the file. A failure to reach a server (it restarted, maybe on another address)
//! is retried once with the file's placement asked anew; a server still down gives EIO for
//! this file only. Files opened with O_SYNC or O_DSYNC write through and sync every write.

use crate::convert::is_transport;
use crate::fs::FlotillaFs;
use crate::names::failed;
use crate::readahead::{Detector, Window};
use crate::write_behind::Buffered;
use flotilla_client::{ByteRange, Bytes, ClientError, EnwrichFile, File, Shape, TokenMode, TokenUse};
use fuser::{Errno, FopenFlags};
use std::collections::HashMap;

thread_local! {
    /// Each serving thread's buffer for reads sent to the servers: reused, so that a 1 MiB
    /// read does not fault in and zero fresh memory every time (at most `IO_BYTES_MAX` per
    /// thread: the kernel asks no more at once).
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `read` on the first `length` bytes of this thread's read buffer, zeroed first: a
/// read fills every byte it is given (the servers answer with exactly the bytes asked), but
/// bytes of an earlier read — maybe another user's file — must never show through even if
/// one did not (zeroing warm memory costs a fraction of faulting in fresh memory).
fn with_read_buffer<T>(length: usize, read: impl FnOnce(&mut [u8]) -> T) -> T {
    assert!(length <= crate::fs::IO_BYTES_MAX as usize, "a read longer than the kernel sends");
    READ_BUFFER.with(|cell| {
        let mut buffer = cell.borrow_mut();
        if buffer.len() < length {
            buffer.resize(length, 0);
        }
        let buffer = &mut buffer[..length];
        buffer.fill(0);
        read(buffer)
    })
}

/// Largest file the mount creates: 16 TiB, the largest file ext4 holds, so that no fork is
/// asked to grow past what its target's file system can store.
pub const FILE_BYTES_MAX: u64 = 1 << 44;

/// One open file (one `open` or `create` of the kernel).
pub struct OpenFile {
    pub ino: u64,
    file: parking_lot::RwLock<File>,
    /// Opened with O_SYNC or O_DSYNC: every write is sent and synced before it is answered.
    sync_writes: bool,
    /// The file had setuid (or setgid with group execute) when opened: the first write by
    /// a user other than root clears them (see `privileges.rs`).
    setid: std::sync::atomic::AtomicBool,
    /// A read went through this handle already (relatime looks at the first only).
    read_once: std::sync::atomic::AtomicBool,
    /// Opened in ENWRICH mode (`enwrich.rs`): writes go to this log cache; taken at release.
    enwrich: parking_lot::Mutex<Option<EnwrichFile>>,
    /// Read-only opens: the access pattern and what was fetched ahead (`readahead.rs`).
    readahead: Option<parking_lot::Mutex<(Detector, Window)>>,
    /// Reads and writes take byte-range tokens (`coherence.rs`): the mount has them on, the
    /// file has no no-overlap hint, and the open is not in ENWRICH mode.
    coherent: bool,
    /// A coherent read-only open served through the kernel's page cache.
    pub cached: bool,
}

impl OpenFile {
    fn file(&self) -> File {
        self.file.read().clone()
    }
}

/// Whether trying `error`'s call again through `fresh` may help: the server was waited for
/// already (`Unreachable`), so only if the file's places changed (a server came back on
/// another address); any other transport failure, always.
fn moved(old: &File, fresh: &File, error: &ClientError) -> bool {
    !matches!(error, ClientError::Unreachable { .. }) || old.entry().subfiles != fresh.entry().subfiles
}

/// The size and mtime a handle's open found (`kept.rs`).
fn stamp_of(file: &File) -> crate::kept::Stamp {
    let attrs = &file.entry().attrs;
    (attrs.size_bytes, attrs.mtime_ns)
}

#[derive(Default)]
pub struct SizeTable {
    sizes: parking_lot::Mutex<HashMap<u64, Tracked>>,
}

struct Tracked {
    size_bytes: u64,
    /// Another client may have changed the size (a token was given back): ask again.
    stale: bool,
    opens: u64,
    /// Opens served through the kernel's page cache.
    cached_opens: u64,
    /// A handle of the file, for writing back and publishing when a token is revoked.
    file: File,
    /// Bumped by every write and truncate through this mount (read-ahead windows filled
    /// under an older one are stale).
    generation: u64,
}

impl SizeTable {
    /// An open of `ino` found `size_bytes` (the service's, with this client's unpublished
    /// writes); `unsent` says whether writes through this mount wait in the write-behind
    /// buffer (asked under this table's lock: a write is buffered before its `wrote`).
    fn opened(&self, ino: u64, size_bytes: u64, file: &File, cached: bool, unsent: impl Fn() -> bool) {
        let mut sizes = self.sizes.lock();
        let fresh = || Tracked {
            size_bytes,
            stale: false,
            opens: 0,
            cached_opens: 0,
            file: file.clone(),
            generation: 0,
        };
        let tracked = sizes.entry(ino).or_insert_with(fresh);
        tracked.size_bytes = settled(tracked.size_bytes, size_bytes, unsent);
        tracked.stale = false;
        tracked.opens += 1;
        tracked.cached_opens += u64::from(cached);
    }

    /// Opens of `ino` served through the kernel's page cache.
    pub fn cached_opens(&self, ino: u64) -> u64 {
        self.sizes.lock().get(&ino).map_or(0, |tracked| tracked.cached_opens)
    }

    /// A handle of open file `ino`.
    pub fn file(&self, ino: u64) -> Option<File> {
        self.sizes.lock().get(&ino).map(|tracked| tracked.file.clone())
    }

    /// Another client may change `ino` now: read-ahead windows are stale and the size must
    /// be asked again.
    pub fn invalidate(&self, ino: u64) {
        if let Some(tracked) = self.sizes.lock().get_mut(&ino) {
            tracked.stale = true;
            tracked.generation += 1;
        }
    }

    /// Whether the size of `ino` must be asked again (and, from now on, not).
    fn take_stale(&self, ino: u64) -> bool {
        self.sizes.lock().get_mut(&ino).is_some_and(|tracked| std::mem::take(&mut tracked.stale))
    }

    /// One open handle of `ino` fewer; whether it was the last.
    fn released(&self, ino: u64, cached: bool) -> bool {
        self.released_last(ino, cached).is_some()
    }

    /// One open handle of `ino` fewer; if it was the last, whether the file went through
    /// its opens here unchanged: nothing written or truncated through this mount, no token
    /// given back.
    fn released_last(&self, ino: u64, cached: bool) -> Option<bool> {
        let mut sizes = self.sizes.lock();
        let Some(tracked) = sizes.get_mut(&ino) else { return Some(false) };
        tracked.opens -= 1;
        tracked.cached_opens -= u64::from(cached);
        if tracked.opens > 0 {
            return None;
        }
        let unchanged = tracked.generation == 0;
        sizes.remove(&ino);
        Some(unchanged)
    }

    pub fn known(&self, ino: u64) -> Option<u64> {
        self.sizes.lock().get(&ino).map(|tracked| tracked.size_bytes)
    }

    /// The metadata service's size (with this client's writes) for a tracked inode; `unsent`
    /// as for `opened`.
    pub fn observed(&self, ino: u64, size_bytes: u64, unsent: impl Fn() -> bool) {
        if let Some(tracked) = self.sizes.lock().get_mut(&ino) {
            tracked.size_bytes = settled(tracked.size_bytes, size_bytes, unsent);
        }
    }

    /// Raises the known size to `end_bytes` (a size learned, not a change of the bytes).
    fn grew(&self, ino: u64, end_bytes: u64) {
        if let Some(tracked) = self.sizes.lock().get_mut(&ino) {
            tracked.size_bytes = tracked.size_bytes.max(end_bytes);
        }
    }

    /// This mount wrote bytes of `ino` up to `end_bytes`.
    fn wrote(&self, ino: u64, end_bytes: u64) {
        if let Some(tracked) = self.sizes.lock().get_mut(&ino) {
            tracked.size_bytes = tracked.size_bytes.max(end_bytes);
            tracked.generation += 1;
        }
    }

    pub fn truncated(&self, ino: u64, size_bytes: u64) {
        if let Some(tracked) = self.sizes.lock().get_mut(&ino) {
            tracked.size_bytes = size_bytes;
            tracked.generation += 1;
        }
    }

    /// How many times this mount changed `ino`'s bytes while it was open here.
    fn generation(&self, ino: u64) -> u64 {
        self.sizes.lock().get(&ino).map_or(0, |tracked| tracked.generation)
    }
}

/// The size to know once the service said `service_bytes`: the service's (another client may
/// have truncated the file), but never less than `known_bytes` while writes through this
/// mount wait unsent in the write-behind buffer — they are in neither the service's size nor
/// the client's unpublished ones, and a size answered without them would make the kernel
/// shrink its own (a `getattr` while another handle's writes are buffered; issue 34).
fn settled(known_bytes: u64, service_bytes: u64, unsent: impl Fn() -> bool) -> u64 {
    match unsent() {
        true => known_bytes.max(service_bytes),
        false => service_bytes,
    }
}

impl FlotillaFs {
    pub(crate) fn open_file(&self, ino: u64, flags: i32, pid: u32) -> Result<(u64, FopenFlags), Errno> {
        let file = self.retrying(|| self.client.open_id(ino)).map_err(failed)?;
        self.insert_open(file, flags, pid)
    }

    /// Registers an open of `file` by process `pid`: in ENWRICH mode if the mount has the
    /// option, the open is write-only and the process's environment names a job; otherwise
    /// after flushing the mount's ENWRICH handles on the file (flush-on-read). Returns the
    /// handle and how the kernel may cache the file's pages for it.
    pub(crate) fn insert_open(&self, file: File, flags: i32, pid: u32) -> Result<(u64, FopenFlags), Errno> {
        let (ino, size) = (file.id(), file.size());
        let job = match self.enwrich_cache_bytes {
            Some(cache_bytes) if flags & libc::O_ACCMODE == libc::O_WRONLY => {
                crate::enwrich::job_of_process(pid, cache_bytes)
            }
            _ => None,
        };
        let enwrich = match job {
            Some(options) => {
                tracing::info!(ino, pid, job = %options.job_name, size = options.job_size, "opened in ENWRICH mode");
                Some(self.client.enwrich_file(file.clone(), &options).map_err(failed)?)
            }
            None => {
                // Only a mount with the option holds ENWRICH handles to flush.
                if self.enwrich_cache_bytes.is_some() {
                    self.client.flush_enwrich(ino).map_err(failed)?;
                }
                None
            }
        };
        let sync_writes = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let setid = crate::privileges::killed_mode(file.entry().attrs.mode).is_some().into();
        let read_once = false.into();
        let enwrich = parking_lot::Mutex::new(enwrich);
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
        let coherent = self.tokens.is_some() && !file.entry().no_overlap && enwrich.lock().is_none();
        let cached = coherent && read_only && self.kernel_cache && flags & libc::O_DIRECT == 0;
        // A page-cache open has the kernel's read-ahead (shared by every open of the file);
        // windows of its own per open would fetch the same bytes once per open.
        let readahead = (read_only && !cached && self.readahead_bytes_max > 0).then(Default::default);
        self.sizes.opened(ino, size, &file, cached, || self.write_behind.holds(ino));
        // Registered first: a revocation from here on drops the kernel's pages through the
        // open (`caches_outside`), whatever is decided below.
        let pages_kept = self.holder.kept.lock().opened(ino, stamp_of(&file));
        let mut keep_cache = false;
        if cached {
            match self.refresh_for_kernel(ino) {
                Ok(fresh) => keep_cache = pages_kept && !fresh,
                Err(errno) => {
                    self.abandon_open(ino, (cached, coherent));
                    return Err(errno);
                }
            }
        }
        let file = parking_lot::RwLock::new(file);
        let open =
            OpenFile { ino, file, sync_writes, setid, read_once, enwrich, readahead, coherent, cached };
        match self.files.insert(open) {
            Ok(handle) => Ok((handle, crate::fs::open_flags(cached, keep_cache))),
            Err(errno) => {
                self.abandon_open(ino, (cached, coherent));
                Err(errno)
            }
        }
    }

    /// An open that failed after it was registered: unregistered, and if it was the file's
    /// only one here, its tokens kept without pages (as a last close would), so they stay
    /// under `kept_files_max` instead of held with no record.
    fn abandon_open(&self, ino: u64, (cached, coherent): (bool, bool)) {
        if self.sizes.released(ino, cached) {
            self.keep_tokens(ino, coherent, None);
        }
    }

    /// Before the kernel reads a page-cache open: a read token on the whole file (other
    /// clients' cached writes written back) and, if it had to be asked for, the size the
    /// kernel knows dropped so that it asks again. Whether the token had to be asked for
    /// (this mount did not hold it all along).
    fn refresh_for_kernel(&self, ino: u64) -> Result<bool, Errno> {
        let used = self.token_cover(ino, true, TokenMode::Read, flotilla_client::WHOLE_FILE)?;
        let fresh = used.as_ref().is_none_or(|used| used.fresh);
        if fresh {
            self.size_from_service(ino)?;
            self.holder.invalidate_attributes(ino);
        }
        Ok(fresh)
    }

    /// The file's size as the metadata service has it, with this client's own unpublished
    /// writes, made the size this mount knows (after another client may have changed it,
    /// truncated it too, while this mount held no token).
    fn size_from_service(&self, ino: u64) -> Result<u64, Errno> {
        let mut attrs = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?.attrs;
        self.client.overlay(ino, &mut attrs);
        self.sizes.observed(ino, attrs.size_bytes, || self.write_behind.holds(ino));
        Ok(self.sizes.known(ino).unwrap_or(attrs.size_bytes).max(attrs.size_bytes))
    }

    /// The read token of a read of `size` bytes at `offset`, from the offset to the end of
    /// the file; for a page-cache open a read may pass without one during a revocation
    /// (`true`: it must not use what was fetched ahead either).
    fn read_token(&self, open: &OpenFile, offset: u64, size: u32) -> Result<(Option<TokenUse>, bool), Errno> {
        let Some(tokens) = self.tokens.as_ref().filter(|_| open.coherent) else { return Ok((None, false)) };
        if !open.cached {
            return Ok((self.token_use(open, TokenMode::Read, (offset, u64::MAX))?, false));
        }
        let pages = (offset, offset.saturating_add(u64::from(size.max(1)) - 1));
        let used = tokens.cover_or_pass(open.ino, (offset, u64::MAX), pages).map_err(failed)?;
        let passing = used.is_none();
        Ok((used, passing))
    }

    /// A use of the tokens `mode` on `range` of the open file, when it takes tokens.
    fn token_use(
        &self,
        open: &OpenFile,
        mode: TokenMode,
        range: ByteRange,
    ) -> Result<Option<TokenUse>, Errno> {
        self.token_cover(open.ino, open.coherent, mode, range)
    }

    /// A use of the tokens `mode` on `range` of file `ino` when the mount has tokens on and
    /// `wanted` (the file takes them).
    pub(crate) fn token_cover(
        &self,
        ino: u64,
        wanted: bool,
        mode: TokenMode,
        range: ByteRange,
    ) -> Result<Option<TokenUse>, Errno> {
        match (&self.tokens, wanted) {
            (Some(tokens), true) => tokens.cover(ino, mode, range).map(Some).map_err(failed),
            _ => Ok(None),
        }
    }

    /// Sends write-behind batches of the file `open` is a handle of from the background:
    /// after a transport failure, once more through a handle whose placement was asked anew
    /// (as `with_file`).
    fn background_sender(&self, open: &OpenFile) -> crate::write_behind::Sender {
        let (file, client, ino) = (open.file(), self.client.clone(), open.ino);
        std::sync::Arc::new(move |shape: Shape, data: Bytes| {
            let error = match file.write_shape_bytes(&shape, data.clone()) {
                Err(error) if is_transport(&error) => error,
                other => return other.map(|_| ()).map_err(failed),
            };
            let fresh = client.open_id(ino).map_err(failed)?;
            if !moved(&file, &fresh, &error) {
                return Err(failed(error));
            }
            tracing::info!(%error, ino, "write-behind: retrying with a fresh placement");
            fresh.write_shape_bytes(&shape, data).map(|_| ()).map_err(failed)
        })
    }

    /// Sends what the write-behind buffer holds for the file `open` is a handle of.
    fn send_buffered(&self, open: &OpenFile) -> Result<(), Errno> {
        self.write_behind.flush(open.ino, &|shape, data| self.send_shape(open, shape, data))
    }

    fn send_shape(&self, open: &OpenFile, shape: Shape, data: Bytes) -> Result<(), Errno> {
        self.with_file(open, |file| file.write_shape_bytes(&shape, data.clone()).map(|_| ()))
    }

    /// Runs `call` on the open file; after a transport failure, once more on a handle whose
    /// placement was asked anew.
    fn with_file<T>(
        &self,
        open: &OpenFile,
        mut call: impl FnMut(&File) -> Result<T, ClientError>,
    ) -> Result<T, Errno> {
        let error = match call(&open.file()) {
            Err(error) if is_transport(&error) => error,
            other => return other.map_err(failed),
        };
        let fresh = self.client.open_id(open.ino).map_err(failed)?;
        if !moved(&open.file(), &fresh, &error) {
            return Err(failed(error));
        }
        tracing::info!(%error, ino = open.ino, "retrying with a fresh placement");
        *open.file.write() = fresh.clone();
        call(&fresh).map_err(failed)
    }

    /// A read of `size` bytes at `offset`, handed to `deliver` (straight from a reused
    /// buffer of the serving thread, or from what was fetched ahead).
    pub(crate) fn read_file(
        &self,
        (ino, handle): (u64, u64),
        (offset, size): (u64, u32),
        deliver: impl FnOnce(&[u8]),
    ) -> Result<(), Errno> {
        let open = self.files.get(handle)?;
        self.send_buffered(&open)?;
        let (token, passing) = self.read_token(&open, offset, size)?;
        let fresh = token.as_ref().is_some_and(|token| token.fresh) | self.sizes.take_stale(ino);
        let end = offset.saturating_add(u64::from(size));
        let mut known = self.sizes.known(ino).unwrap_or(0);
        if fresh {
            known = self.size_from_service(ino)?;
        } else if end > known {
            // Maybe another client made the file longer (this mount's writes are all known).
            let entry = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?;
            known = known.max(entry.attrs.size_bytes);
            self.sizes.grew(ino, known);
        }
        let length = known.saturating_sub(offset).min(u64::from(size));
        // The atime is updated before the bytes are handed back, so a `stat` made once the
        // read returned sees it (a round trip only on reads the atime rule updates).
        let first_read = !open.read_once.swap(true, std::sync::atomic::Ordering::AcqRel);
        self.note_read(ino, &open.file.read().entry().attrs, first_read);
        if let Some(readahead) = open.readahead.as_ref().filter(|_| length > 0 && !passing) {
            if let Some(bytes) = self.read_ahead(&open, readahead, (offset, length), known)? {
                deliver(&bytes);
                return Ok(());
            }
        }
        with_read_buffer(length as usize, |buffer| {
            if length > 0 {
                self.with_file(&open, |file| file.read_shape(&Shape::contiguous(offset, length), buffer))?;
            }
            deliver(buffer);
            Ok::<(), Errno>(())
        })
    }

    /// A read of a read-only open: served from what was fetched ahead if it holds the bytes;
    /// else, when it continues the handle's access pattern, fetched together with the next
    /// records of the pattern in one request (contiguous or strided), the records after this
    /// one kept for later reads. `None`: a read of its own bytes only (a random reader's),
    /// which the caller sends without holding the handle's read-ahead lock, so that the
    /// reads the kernel sends at once (asynchronous direct I/O, queue depth 16) reach the
    /// servers at once instead of one after the other.
    fn read_ahead(
        &self,
        open: &OpenFile,
        readahead: &parking_lot::Mutex<(Detector, Window)>,
        (offset, length): (u64, u64),
        known: u64,
    ) -> Result<Option<Vec<u8>>, Errno> {
        let generation = self.sizes.generation(open.ino);
        let mut state = readahead.lock();
        let (detector, window) = &mut *state;
        if window.generation != generation {
            window.clear();
            window.generation = generation;
        }
        let fetch = detector.observe(offset, length, self.readahead_bytes_max).clipped(known);
        if let Some(bytes) = window.take(offset, length) {
            return Ok(Some(bytes));
        }
        if fetch.count == 1 {
            return Ok(None);
        }
        // Held while the widened fetch runs: the reads that follow wait for its records
        // instead of asking the servers for them a second time.
        let mut buffer = vec![0u8; fetch.bytes() as usize];
        let shape = match fetch.is_contiguous() {
            true => Shape::contiguous(offset, fetch.bytes()),
            false => Shape::Strided {
                file_offset: offset,
                memory_offset: 0,
                record_bytes: length,
                file_stride: fetch.stride_bytes as i64,
                memory_stride: length as i64,
                count: fetch.count,
            },
        };
        self.with_file(open, |file| file.read_shape(&shape, &mut buffer))?;
        let rest = buffer.split_off(length as usize);
        match fetch.is_contiguous() {
            true => window.keep(offset + length, rest, self.readahead_bytes_max),
            false => {
                for (index, record) in rest.chunks(length as usize).enumerate() {
                    let at = offset + (index as u64 + 1) * fetch.stride_bytes;
                    window.keep(at, record.to_vec(), self.readahead_bytes_max);
                }
            }
        }
        Ok(Some(buffer))
    }

    pub(crate) fn write_file(
        &self,
        writer_uid: u32,
        ino: u64,
        handle: u64,
        (offset, append): (u64, bool),
        data: &[u8],
    ) -> Result<u32, Errno> {
        let open = self.files.get(handle)?;
        if writer_uid != 0 && open.setid.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.drop_privileges(ino)?;
        }
        if append && open.enwrich.lock().is_none() && !data.is_empty() {
            return self.append_file(&open, ino, data);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > FILE_BYTES_MAX {
            return Err(Errno::EFBIG);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let _token = self.token_use(&open, TokenMode::Write, (offset, end - 1))?;
        // The ENWRICH handle's lock is held by ENWRICH writes only: in an `if let ... else`
        // it would be held through the other branches too, serializing every write of the
        // handle behind one that waits for write-behind room.
        let enwrich_wrote = match open.enwrich.lock().as_ref() {
            Some(enwrich) => {
                enwrich.write_at(offset, data).map_err(failed)?;
                if open.sync_writes {
                    enwrich.sync().map_err(failed)?;
                }
                true
            }
            None => false,
        };
        if !enwrich_wrote {
            self.write_to_servers(&open, ino, (offset, data))?;
        }
        self.sizes.wrote(ino, end);
        if self.sizes.cached_opens(ino) > 0 {
            // This mount's page-cache opens of the file must not keep the old bytes.
            self.holder.invalidate_kernel(ino, (offset, end - 1));
        }
        Ok(written)
    }

    /// A write of an open that is not ENWRICH: sent at once with `O_SYNC`, else through the
    /// write-behind buffers (or directly, when they have no room).
    fn write_to_servers(&self, open: &OpenFile, ino: u64, (offset, data): (u64, &[u8])) -> Result<(), Errno> {
        if open.sync_writes {
            self.send_buffered(open)?;
            return self.with_file(open, |file| file.write_at(offset, data).and_then(|()| file.sync()));
        }
        let send = |shape: Shape, bytes: Bytes| self.send_shape(open, shape, bytes);
        let background = self.background_sender(open);
        if let Buffered::No = self.write_behind.write(ino, (offset, data), &send, &background)? {
            self.with_file(open, |file| file.write_at(offset, data))?;
        }
        Ok(())
    }

    /// An `O_APPEND` write, atomic across clients: under the file's append lock, at the end
    /// of the file as the metadata service knows it (every appender publishes its new size
    /// before letting go) or as this mount's own writes made it, whichever is larger; the
    /// data is on the servers and the size published before the lock goes. The kernel's
    /// offset (its cached size) is not used.
    fn append_file(&self, open: &OpenFile, ino: u64, data: &[u8]) -> Result<u32, Errno> {
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        self.send_buffered(open)?;
        // The append publishes the size: not over a lost write-behind batch (see `publish`).
        self.write_behind.failure(ino)?;
        self.with_append_lock(ino, || {
            let published = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?.attrs.size_bytes;
            let offset = published.max(self.sizes.known(ino).unwrap_or(0));
            let end = offset
                .checked_add(data.len() as u64)
                .filter(|end| *end <= FILE_BYTES_MAX)
                .ok_or(Errno::EFBIG)?;
            let _token = self.token_use(open, TokenMode::Write, (offset, u64::MAX))?;
            self.with_file(open, |file| file.write_at(offset, data))?;
            if open.sync_writes {
                self.with_file(open, |file| file.sync())?;
            }
            self.with_file(open, |file| file.flush())?;
            self.sizes.wrote(ino, end);
            Ok(written)
        })
    }

    /// Publishes this mount's writes' size and mtime (close-to-open consistency).
    pub(crate) fn flush_file(&self, handle: u64) -> Result<(), Errno> {
        let open = self.files.get(handle)?;
        self.publish(&open)
    }

    /// Sends the buffered writes, then publishes the size and mtime they gave the file. In
    /// ENWRICH mode: flushes the job durably (which publishes the size).
    fn publish(&self, open: &OpenFile) -> Result<(), Errno> {
        if let Some(enwrich) = open.enwrich.lock().as_ref() {
            return enwrich.sync().map_err(failed);
        }
        self.send_buffered(open)?;
        // A write-behind batch of the file was lost (a send failed since it was opened here):
        // the size of the writes around it must not be published over its bytes.
        self.write_behind.failure(open.ino)?;
        let file = open.file();
        self.retrying(|| file.flush()).map_err(failed)
    }

    pub(crate) fn release_file(&self, handle: u64) -> Result<(), Errno> {
        let Some(open) = self.files.remove(handle) else { return Ok(()) };
        let enwrich = open.enwrich.lock().take();
        let published = match enwrich {
            // Flushes what is left, leaves the job and stops its watcher.
            Some(enwrich) => enwrich.close().map_err(failed),
            None => self.publish(&open),
        };
        if let Some(unchanged) = self.sizes.released_last(open.ino, open.cached) {
            self.write_behind.forget(open.ino);
            if published.is_err() {
                self.give_up_unpublished(open.ino);
            }
            let pages = (unchanged && published.is_ok()).then(|| stamp_of(&open.file()));
            self.keep_tokens(open.ino, open.coherent, pages);
        }
        published
    }

    /// The last handle of `ino` here was released and its writes could not be made durable
    /// (the close said so): the mount drops them and the size they would have published, so
    /// that it reports the metadata service's size (durable bytes only) from now on, never a
    /// size it holds no bytes for and will not retry. While any handle stays open, a failed
    /// fsync or flush keeps both, and the next fsync or close sends them again.
    fn give_up_unpublished(&self, ino: u64) {
        tracing::warn!(ino, "the last close of a file failed: its unsynced writes are dropped");
        self.client.discard_unpublished(ino);
        self.holder.invalidate_attributes(ino);
    }

    /// The last close of `ino` here: its tokens are kept for a later open (`kept.rs`), or
    /// given back when it takes none or no longer fits.
    fn keep_tokens(&self, ino: u64, coherent: bool, pages: Option<crate::kept::Stamp>) {
        let Some(tokens) = &self.tokens else { return };
        let give_back = match coherent {
            true => self.holder.kept.lock().closed(ino, pages),
            false => vec![ino],
        };
        for id in give_back {
            if let Err(error) = tokens.release_file(id) {
                tracing::warn!(%error, ino = id, "giving the file's tokens back failed");
            }
        }
    }

    pub(crate) fn sync_file(&self, handle: u64) -> Result<(), Errno> {
        let open = self.files.get(handle)?;
        if let Some(enwrich) = open.enwrich.lock().as_ref() {
            return enwrich.sync().map_err(failed);
        }
        self.send_buffered(&open)?;
        // Checked before the sync, which publishes the size (see `publish`).
        self.write_behind.failure(open.ino)?;
        self.with_file(&open, |file| file.sync())
    }

    /// `fallocate` mode 0 (what `posix_fallocate` asks): the file is at least this long.
    pub(crate) fn allocate(
        &self,
        ino: u64,
        handle: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if end > FILE_BYTES_MAX {
            return Err(Errno::EFBIG);
        }
        let open = self.files.get(handle)?;
        self.send_buffered(&open)?;
        // Raise the size, never lower it: several processes may allocate parts of one file
        // at once (GrowSize keeps the largest).
        self.retrying(|| self.client.grow_size(ino, end)).map_err(failed)?;
        self.sizes.wrote(ino, end);
        Ok(())
    }

    /// Sends the buffered writes and publishes the sizes of every file still open (at
    /// unmount).
    pub(crate) fn flush_all(&self) {
        for open in self.files.all() {
            if let Err(errno) = self.publish(&open) {
                tracing::warn!(?errno, ino = open.ino, "writing a file's last data at unmount failed");
            }
        }
    }
}
