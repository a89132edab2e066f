//! The file system the kernel talks to: every FUSE operation, translated into client calls.
//!
//! Each operation is a method returning `Result<_, Errno>` (in `names.rs`, `io.rs`,
//! `xattr.rs`); the `Filesystem` implementation here only calls it and replies. Operations
//! block their thread until the cluster answers; the session runs `threads` such threads,
//! each reading requests from its own clone of the FUSE device, so that many requests
//! (reads and writes of different processes to one file included) are served at once.

use crate::config::MountConfig;
use crate::convert::{file_attr, is_transport};
use crate::handles::HandleTable;
use crate::open_files::{OpenFile, SizeTable};
use crate::write_behind::{WriteBehind, WriteBehindLimits};
use flotilla_client::{ClientError, EntryInfo};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Largest read or write one kernel request carries.
pub const IO_BYTES_MAX: u32 = 1 << 20;
/// Requests the kernel may have outstanding in the background (read-ahead, async direct I/O).
const BACKGROUND_REQUESTS_MAX: u16 = 64;

/// One entry of an open directory listing.
pub(crate) struct Listed {
    pub ino: u64,
    pub kind: fuser::FileType,
    pub name: std::ffi::OsString,
    /// The entry's attributes as listed (readdirplus); `None` for `.` and `..`.
    pub attr: Option<FileAttr>,
}

pub struct FlotillaFs {
    pub(crate) client: flotilla_client::Client,
    pub(crate) files: HandleTable<OpenFile>,
    pub(crate) dirs: HandleTable<Vec<Listed>>,
    pub(crate) sizes: std::sync::Arc<SizeTable>,
    pub(crate) write_behind: std::sync::Arc<WriteBehind>,
    /// Byte-range tokens (`coherence.rs`); `None` with `--tokens off`.
    pub(crate) tokens: Option<flotilla_client::TokenCache>,
    /// What revocations reach (the token cache holds it weakly).
    pub(crate) holder: std::sync::Arc<crate::coherence::MountHolder>,
    /// Read-only opens of coherent files use the kernel's page cache.
    pub(crate) kernel_cache: bool,
    /// The timeout of answers held under no inode token (`attr_timeout_ms`; 0 while inode
    /// tokens are on).
    pub(crate) ttl: Duration,
    /// Names and attributes given to the kernel under inode tokens (`meta_tokens.rs`);
    /// `None` with `metadata_timeout_ms` 0.
    pub(crate) meta_tokens: Option<std::sync::Arc<crate::meta_tokens::MetaTokens>>,
    /// The service refused `InodeCached` (an older one): answers go as without tokens,
    /// with `fallback_ttl`.
    pub(crate) meta_refused: std::sync::atomic::AtomicBool,
    pub(crate) fallback_ttl: Duration,
    /// Ends the inode token poll thread.
    pub(crate) meta_stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Most entries one open directory listing holds (`listing_entries_max`).
    pub(crate) listing_entries_max: usize,
    /// When reads update access times.
    pub(crate) atime: crate::AtimeMode,
    /// `Some(log cache bytes)` with the `enwrich` option.
    pub(crate) enwrich_cache_bytes: Option<u64>,
    /// fcntl/flock locks taken through this mount (`locks.rs`).
    pub(crate) locks: crate::locks::LockState,
    /// Threads that may wait in a blocking lock at once: half the mount's.
    pub(crate) lock_waiters_max: usize,
    /// Bytes one read-only open may fetch ahead (`readahead_bytes_max`; 0: no read-ahead).
    pub(crate) readahead_bytes_max: u64,
}

impl FlotillaFs {
    pub fn new(client: flotilla_client::Client, config: &MountConfig) -> FlotillaFs {
        // The mount takes its own tokens (it caches, the library does not): one cache per
        // session, so the library's stay off.
        client.set_tokens(false);
        let sizes = std::sync::Arc::new(SizeTable::default());
        let limits = WriteBehindLimits {
            piece_bytes_max: config.write_behind_piece_bytes_max,
            file_bytes_max: config.write_behind_bytes_max,
            total_bytes_max: config.write_behind_total_bytes_max,
        };
        let write_behind = std::sync::Arc::new(WriteBehind::new(limits, client.write_buffers()));
        let holder = std::sync::Arc::new(crate::coherence::MountHolder {
            write_behind: write_behind.clone(),
            sizes: sizes.clone(),
            notifier: std::sync::OnceLock::new(),
            kept: parking_lot::Mutex::new(crate::kept::KeptFiles::new(config.kept_files_max)),
        });
        let tokens = config.tokens.then(|| {
            let weak: std::sync::Weak<dyn flotilla_client::TokenHolder> =
                std::sync::Arc::downgrade(&holder) as std::sync::Weak<crate::coherence::MountHolder>;
            flotilla_client::TokenCache::new(client.clone(), weak, flotilla_client::TokenSettings::default())
        });
        let meta_tokens = (config.metadata_timeout_ms > 0).then(|| {
            // This mount's own changes revoke none of its tokens (`meta_tokens.rs`).
            client.set_changes_carry_session(true);
            std::sync::Arc::new(crate::meta_tokens::MetaTokens::new(crate::meta_tokens::MetaTokenSettings {
                timeout: Duration::from_millis(config.metadata_timeout_ms),
                recorded_max: config.metadata_recorded_max,
            }))
        });
        let fallback_ttl = Duration::from_millis(config.attr_timeout_ms);
        FlotillaFs {
            client,
            files: HandleTable::new(config.open_files_max),
            dirs: HandleTable::new(config.open_dirs_max),
            sizes,
            write_behind,
            tokens,
            holder,
            kernel_cache: config.kernel_cache,
            ttl: if meta_tokens.is_some() { Duration::ZERO } else { fallback_ttl },
            meta_tokens,
            meta_refused: std::sync::atomic::AtomicBool::new(false),
            fallback_ttl,
            meta_stop: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            listing_entries_max: config.listing_entries_max,
            atime: config.atime,
            enwrich_cache_bytes: config.enwrich.then_some(config.enwrich_cache_bytes),
            locks: crate::locks::LockState::default(),
            lock_waiters_max: (config.threads / 2).max(1),
            readahead_bytes_max: config.readahead_bytes_max,
        }
    }

    /// Runs an idempotent client call, once more if the connection broke (the client
    /// reconnects on the next call, e.g. after the metadata service restarted).
    pub(crate) fn retrying<T>(&self, call: impl Fn() -> Result<T, ClientError>) -> Result<T, ClientError> {
        match call() {
            Err(error) if is_transport(&error) => call(),
            other => other,
        }
    }

    /// The attributes the kernel should see for `entry`: this mount's own writes included.
    pub(crate) fn attr_of(&self, entry: &EntryInfo) -> FileAttr {
        self.listed_attr(entry.id, entry.attrs.clone())
    }

    /// The kernel's attributes of entry `id` as the service gave them, with this mount's
    /// own knowledge of sizes (open files, write-behind) applied.
    pub(crate) fn listed_attr(&self, id: u64, mut attrs: flotilla_client::Attributes) -> FileAttr {
        self.client.overlay(id, &mut attrs);
        if let Some(known) = self.sizes.known(id) {
            attrs.size_bytes = attrs.size_bytes.max(known);
        }
        file_attr(id, &attrs)
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<FileAttr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&self.untokened_ttl(), &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    /// The timeout of an answer held under no inode token.
    pub(crate) fn untokened_ttl(&self) -> Duration {
        if self.meta_refused.load(std::sync::atomic::Ordering::Relaxed) {
            self.fallback_ttl
        } else {
            self.ttl
        }
    }

    /// The inode token cache, while the service serves inode tokens.
    pub(crate) fn active_meta_tokens(&self) -> Option<&crate::meta_tokens::MetaTokens> {
        let refused = self.meta_refused.load(std::sync::atomic::Ordering::Relaxed);
        self.meta_tokens.as_deref().filter(|_| !refused)
    }

    /// What the inode token poll thread needs (`None` without inode tokens).
    #[allow(clippy::type_complexity)]
    pub(crate) fn meta_poller(
        &self,
    ) -> Option<(
        flotilla_client::Client,
        std::sync::Arc<crate::meta_tokens::MetaTokens>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    )> {
        let tokens = self.meta_tokens.clone()?;
        Some((self.client.clone(), tokens, self.meta_stop.clone()))
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

impl Filesystem for FlotillaFs {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(IO_BYTES_MAX);
        if let Err(nearest) = config.set_max_readahead(IO_BYTES_MAX) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.set_max_background(BACKGROUND_REQUESTS_MAX);
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS;
        let granted = wanted & config.capabilities();
        let _ = config.add_capabilities(granted);
        tracing::info!(?granted, "FUSE session initialised");
        Ok(())
    }

    fn destroy(&mut self) {
        self.meta_stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.flush_all();
        if let Some(tokens) = &self.tokens {
            // Other clients need not wait a lease for the tokens of files closed here.
            let kept = self.holder.kept.lock().drain();
            for id in kept {
                if let Err(error) = tokens.release_file(id) {
                    tracing::warn!(%error, ino = id, "giving a kept file's tokens back at unmount failed");
                }
            }
            tokens.stop();
        }
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_entry(parent.0, name) {
            Ok((attr, timeouts)) => {
                reply.entry_with_ttls(&timeouts.attributes, &timeouts.entry, &attr, Generation(0))
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn forget(&self, _request: &Request, _ino: INodeNo, _nlookup: u64) {
        // The mount keeps nothing per inode: the kernel's inode is the namespace's id.
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attributes_timed(ino.0) {
            Ok((attr, timeout)) => reply.attr(&timeout, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = crate::names::Change { mode, uid, gid, size, atime, mtime };
        match self.set_attributes(ino.0, change) {
            Ok(attr) => reply.attr(&self.untokened_ttl(), &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        match self.link_target(ino.0) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.make_directory(request, parent.0, name, mode));
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.make_node(request, parent.0, name, mode, rdev));
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_name(parent.0, name, false));
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_name(parent.0, name, true));
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.reply_entry(reply, self.make_symlink(request, parent.0, link_name, target));
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.rename_entry(parent.0, name, newparent.0, newname, flags));
    }

    fn link(&self, _request: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.reply_entry(reply, self.hard_link(ino.0, newparent.0, newname));
    }

    fn open(&self, request: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0, flags.0, request.pid()) {
            Ok((handle, flags)) => reply.opened(FileHandle(handle), flags),
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _request: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let started = std::time::Instant::now();
        let mut reply = Some(reply);
        let result = self.read_file((ino.0, fh.0), (offset, size), |data| {
            if let Some(reply) = reply.take() {
                reply.data(data);
            }
        });
        note_slow_read(ino.0, offset, size, started.elapsed());
        if let (Err(errno), Some(reply)) = (result, reply) {
            reply.error(errno);
        }
    }

    fn write(
        &self,
        request: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let append = flags.0 & libc::O_APPEND != 0;
        match self.write_file(request.uid(), ino.0, fh.0, (offset, append), data) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(&self, _request: &Request, ino: INodeNo, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        let unlocked = self.locks_released(ino.0, owner.0);
        reply_empty(reply, self.flush_file(fh.0).and(unlocked));
    }

    /// No ioctl applies to Flotilla files: ENOTTY, as for a regular file on a local disk
    /// (programs probe with TCGETS to ask whether a descriptor is a terminal).
    fn ioctl(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn getlk(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        match self.lock_test(ino.0, owner.0, (start, end), typ) {
            Ok(held) => reply.locked(held.start, held.end, held.typ, held.pid),
            Err(errno) => reply.error(errno),
        }
    }

    fn setlk(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.lock_set(ino.0, owner.0, (start, end), (typ, pid), sleep));
    }

    fn release(
        &self,
        _request: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // An flock owner (the open file) gives its locks up when the file is released.
        let unlocked = lock_owner.map_or(Ok(()), |owner| self.locks_released(ino.0, owner.0));
        reply_empty(reply, self.release_file(fh.0).and(unlocked));
    }

    fn fsync(&self, _request: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.sync_file(fh.0));
    }

    fn opendir(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.open_directory(ino.0) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self.dirs.get(fh.0) {
            Ok(listing) => listing,
            Err(errno) => return reply.error(errno),
        };
        for (index, entry) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(entry.ino), index as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        reply.ok();
    }

    /// The listing with attributes: the kernel fills its entry and attribute caches from it,
    /// so `ls -l` needs no lookup per entry. `.` and `..` are left to plain `readdir` rules:
    /// an entry added here counts as a lookup, which `.`/`..` must not.
    fn readdirplus(
        &self,
        _request: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listing = match self.dirs.get(fh.0) {
            Ok(listing) => listing,
            Err(errno) => return reply.error(errno),
        };
        for (index, entry) in listing.iter().enumerate().skip(offset as usize) {
            let Some(attr) = &entry.attr else { continue };
            if reply.add(
                INodeNo(entry.ino),
                index as u64 + 1,
                &entry.name,
                &self.untokened_ttl(),
                attr,
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.remove(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every namespace change is committed by the metadata service before it replies.
        reply.ok();
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.space() {
            Ok(space) => reply.statfs(
                space.blocks,
                space.blocks_free,
                space.blocks_free,
                space.files,
                space.files_free,
                IO_BYTES_MAX,
                crate::nodes::NAME_BYTES_MAX as u32,
                crate::names::STATFS_BLOCK_BYTES as u32,
            ),
            Err(errno) => reply.error(errno),
        }
    }

    fn setxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.set_xattr(ino.0, name, value, flags));
    }

    fn getxattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        crate::xattr::reply_value(reply, size, self.get_xattr(ino.0, name));
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        crate::xattr::reply_value(reply, size, self.list_xattr(ino.0));
    }

    fn removexattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_xattr(ino.0, name));
    }

    fn access(&self, _request: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Only called without `default_permissions`, where the mount owner alone may enter.
        reply.ok();
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create_file(request, parent.0, name, mode, flags) {
            Ok((attr, (handle, flags))) => {
                reply.created(&self.untokened_ttl(), &attr, Generation(0), FileHandle(handle), flags)
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn fallocate(
        &self,
        _request: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.allocate(ino.0, fh.0, offset, length, mode));
    }
}

/// A read-only open under tokens uses the kernel's page cache (`coherence.rs`; a revocation
/// drops its pages), keeping what earlier opens cached (`FOPEN_KEEP_CACHE`) when this mount
/// held the file's read token ever since and changed nothing (`kept.rs`); without it the
/// kernel drops the file's pages at the open. Every other open bypasses the page cache (so
/// sizes written elsewhere are seen after their close, and reads and writes of one file by
/// several processes reach the servers at once), and writes to one file from several
/// processes run in parallel.
pub(crate) fn open_flags(cached: bool, keep_cache: bool) -> FopenFlags {
    match (cached, keep_cache) {
        (true, true) => FopenFlags::FOPEN_KEEP_CACHE,
        (true, false) => FopenFlags::empty(),
        (false, _) => FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
    }
}

impl FlotillaFs {
    /// What revocations reach; the mount gives it the session's notifier.
    pub(crate) fn holder(&self) -> std::sync::Arc<crate::coherence::MountHolder> {
        self.holder.clone()
    }
}

/// A read that waited this long says so in the mount's log: on a cluster with an archive the
/// likely cause is a recall of released data (the servers count `recalls`).
const SLOW_READ: std::time::Duration = std::time::Duration::from_secs(1);

fn note_slow_read(ino: u64, offset: u64, size: u32, waited: std::time::Duration) {
    if waited >= SLOW_READ {
        tracing::info!(
            ino,
            offset,
            size,
            waited_ms = waited.as_millis() as u64,
            "a read waited on the servers; if the file was released to the archive it was being \
             recalled (see `flotilla hsm state` and `flotilla hsm status`)"
        );
    }
}
