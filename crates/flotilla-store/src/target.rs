//! A storage target of kind `dir` or `sim`: its identity and its on-disk layout (both kinds
//! keep forks as files; `sim` times their I/O as a simulated disk, see `sim_target`).
//!
//! Layout (see `docs/target-format.md`):
//! - `<dir>/flotilla-target` — the id file (`target_id_file`).
//! - `<dir>/subfiles/<file id as 016x>.<subfile index>/` — one directory per subfile.
//! - `<subfile dir>/<fork name>` — one regular file per fork.
//! - `<dir>/checksums/<file id as 016x>.<subfile index>/<fork name>` — each fork's checksum
//!   file (a parallel tree, so no fork name can collide with a checksum file).
//! - `<dir>/subfiles/flotilla-content-<target id>/` and the same under `checksums/` — empty
//!   marker directories: a content directory without its marker was lost (or emptied), and
//!   the target is opened *lost* (`Target::lost`): the store serves nothing from it until
//!   `Target::accept_loss` repairs it.
//!
//! A target knows what it held: a fork whose data file or checksum file should exist and does
//! not (`open_fork`) is `StoreError::ForkFileMissing`, never zeros. Both files of a fork are
//! made when it is created; a data file of size 0 without its checksum file (a crash between
//! the two, or a target older than that rule) gets an empty one, as it has nothing to check.
//!
//! This type only touches the file system namespace (directories, fork files, statvfs); block
//! I/O goes through a [`ForkBackend`], and caching and locking live in the store. Every
//! directory change is followed by an fsync of the parent directory.

use crate::backend::ForkBackend;
use crate::error::StoreError;
use crate::file_fork::FileFork;
use crate::lines_disk::{self, LinesDisk, Reorganizer, LINES_IMAGE_NAME};
use crate::lines_fork::LinesFork;
use crate::lines_format::ForkKey;
use crate::sim_fork::SimFork;
use crate::sim_target::{LinesOptions, SimTarget, TargetKind, TargetSpec};
use crate::target_id_file::{
    self, TargetIdentity, CHECKSUM_BLOCK_BYTES_DEFAULT, TARGET_FORMAT_VERSION, TARGET_FORMAT_VERSION_UNMARKED,
};
use crate::tier::{self, TargetTier, TierConfig};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the directory holding the subfiles.
pub const SUBFILES_DIR_NAME: &str = "subfiles";
/// Name of the directory holding the forks' checksum files.
pub const CHECKSUMS_DIR_NAME: &str = "checksums";
/// The fork every new subfile starts with.
pub const DEFAULT_FORK_NAME: &str = "data";
/// Directory of a lines target's archive records (one file per archived fork).
pub const HSM_DIR_NAME: &str = "hsm";

/// Space on a target's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetUsage {
    pub used_bytes: u64,
    pub free_bytes: u64,
}

/// A target directory with a known id.
#[derive(Debug)]
pub struct Target {
    id: TargetId,
    checksum_block_bytes: u64,
    dir: PathBuf,
    subfiles_dir: PathBuf,
    checksums_dir: PathBuf,
    kind: TargetKind,
    /// Why the target counts as having lost its contents (`None`: it is whole).
    lost: Option<String>,
    sim: Option<Arc<SimTarget>>,
    /// Dropped before `lines` (fields drop in order): stops and joins the thread.
    _reorganizer: Option<Reorganizer>,
    lines: Option<Arc<LinesDisk>>,
    /// The tertiary tier of a lines target with an archive.
    tier: Option<Arc<TargetTier>>,
    #[cfg(feature = "test-support")]
    crash: Option<crate::crash_fork::CrashHandle>,
}

impl Target {
    /// Opens the target in `dir`, writing its id file first if there is none and `init`.
    /// A new target gets `CHECKSUM_BLOCK_BYTES_DEFAULT`.
    pub fn open(dir: &Path, init: bool) -> Result<Target, StoreError> {
        let spec = TargetSpec { kind: TargetKind::Dir, dir: dir.to_path_buf() };
        Target::open_spec(&spec, init, CHECKSUM_BLOCK_BYTES_DEFAULT)
    }

    /// Opens the target a spec names (`DIR`, `dir:DIR` or `sim:MODEL:DIR`). A target created
    /// here (`init`) gets checksum blocks of `new_checksum_block_bytes`; an existing one keeps
    /// what its id file says.
    pub fn open_spec(
        spec: &TargetSpec,
        init: bool,
        new_checksum_block_bytes: u64,
    ) -> Result<Target, StoreError> {
        let dir = spec.dir.as_path();
        if !dir.is_dir() {
            return Err(StoreError::TargetMissing { dir: dir.to_path_buf() });
        }
        let identity = match target_id_file::read(dir)? {
            Some(identity) => identity,
            None if init => {
                let identity = TargetIdentity {
                    id: target_id_file::random_id(),
                    checksum_block_bytes: new_checksum_block_bytes,
                    format_version: TARGET_FORMAT_VERSION,
                };
                // Markers first: a crash before the id file leaves an uninitialized target,
                // whose next `init` writes markers for its new id.
                write_content_markers(dir, identity.id)?;
                target_id_file::write(dir, identity)?;
                identity
            }
            None => return Err(StoreError::TargetNotInitialized { dir: dir.to_path_buf() }),
        };
        let lost = content_state(dir, identity)?;
        if let Some(reason) = &lost {
            tracing::error!(target = %identity.id, ?dir, reason, "target lost its contents; serving nothing from it");
        }
        let subfiles_dir = dir.join(SUBFILES_DIR_NAME);
        let checksums_dir = dir.join(CHECKSUMS_DIR_NAME);
        let sim = match &spec.kind {
            TargetKind::Sim(model) => Some(Arc::new(SimTarget::new(model.clone()))),
            _ => None,
        };
        let (lines, reorganizer) = match &spec.kind {
            TargetKind::Lines(options) => {
                let disk = open_lines(dir, options, init)?;
                let interval = std::time::Duration::from_millis(options.reorganize_interval_ms);
                // A lost target's image names forks its namespace no longer has: left alone.
                let reorganizer = if lost.is_none() { Reorganizer::start(&disk, interval) } else { None };
                (Some(disk.clone()), reorganizer)
            }
            _ => (None, None),
        };
        Ok(Target {
            id: identity.id,
            checksum_block_bytes: identity.checksum_block_bytes,
            dir: dir.to_path_buf(),
            subfiles_dir,
            checksums_dir,
            kind: spec.kind.clone(),
            lost,
            sim,
            _reorganizer: reorganizer,
            lines,
            tier: None,
            #[cfg(feature = "test-support")]
            crash: match &spec.kind {
                TargetKind::Crash => Some(crate::crash_fork::CrashHandle::attach(dir)),
                _ => None,
            },
        })
    }

    /// Why the target counts as having lost its contents, if it does: its content directories
    /// lack their markers. The store refuses every request for it (`StoreError::TargetLost`).
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// `TargetLost` if the target lost its contents.
    pub(crate) fn check_whole(&self) -> Result<(), StoreError> {
        match &self.lost {
            None => Ok(()),
            Some(reason) => {
                Err(StoreError::TargetLost { target: self.id, dir: self.dir.clone(), reason: reason.clone() })
            }
        }
    }

    /// Repairs a lost target by accepting the loss (run with no store open on it): empties
    /// `subfiles/` and `checksums/`, writes their markers again, and the target is whole and
    /// empty (what it held reads as zeros, as never-written stripes do). A target that is
    /// not lost is refused, and so is a `lines` target (reformat it). With replication, the
    /// repair would copy the subfiles back from a replica here instead.
    pub fn accept_loss(spec: &TargetSpec) -> Result<TargetId, StoreError> {
        let dir = spec.dir.as_path();
        let refuse = |reason: String| StoreError::BadConfig { name: "accept-loss", reason };
        if matches!(spec.kind, TargetKind::Lines(_)) {
            return Err(refuse(format!("{dir:?} is a lines target: format a new one instead")));
        }
        let identity = target_id_file::read(dir)?
            .ok_or_else(|| StoreError::TargetNotInitialized { dir: dir.to_path_buf() })?;
        if content_state(dir, identity)?.is_none() {
            return Err(refuse(format!("target {} at {dir:?} has not lost its contents", identity.id)));
        }
        for name in [SUBFILES_DIR_NAME, CHECKSUMS_DIR_NAME] {
            let path = dir.join(name);
            match fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(StoreError::io(format!("empty {path:?}"), error)),
            }
        }
        write_content_markers(dir, identity.id)?;
        target_id_file::write(dir, TargetIdentity { format_version: TARGET_FORMAT_VERSION, ..identity })?;
        Ok(identity.id)
    }

    /// Attaches an archive to a lines target (other kinds: an error naming the target).
    pub(crate) fn attach_tier(&mut self, config: &TierConfig) -> Result<(), StoreError> {
        let Some(disk) = &self.lines else {
            return Err(StoreError::BadConfig {
                name: "archive",
                reason: format!(
                    "target {} ({:?}) is not a lines target; only lines targets have a tier",
                    self.id, self.dir
                ),
            });
        };
        config
            .policy
            .check(u64::from(disk.geometry().block_bytes))
            .map_err(|reason| StoreError::BadConfig { name: "archive policy", reason })?;
        self.tier = Some(Arc::new(TargetTier::new(config.clone(), self.id, disk.clone())));
        Ok(())
    }

    pub(crate) fn tier(&self) -> Option<&Arc<TargetTier>> {
        self.tier.as_ref()
    }

    /// The archive record file of a fork (under the target's `hsm` directory).
    pub(crate) fn record_path(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> PathBuf {
        self.record_path_of(&self.fork_path(file, subfile, fork))
    }

    fn record_path_of(&self, fork_path: &Path) -> PathBuf {
        let hsm = self.dir.join(HSM_DIR_NAME);
        match fork_path.strip_prefix(&self.subfiles_dir) {
            Ok(relative) => tier::record_path(&hsm, relative),
            Err(_) => fork_path.with_extension("hsm"),
        }
    }

    /// The fork a lines identity names, if it exists (its name found by its CRC32C tag).
    pub(crate) fn fork_of_key(
        &self,
        key: ForkKey,
    ) -> Result<Option<(FileId, SubfileIndex, String)>, StoreError> {
        let (file, subfile) = (FileId(key.file), SubfileIndex(key.subfile));
        if !self.subfile_exists(file, subfile) {
            return Ok(None);
        }
        let forks = self.list_forks(file, subfile)?;
        Ok(forks
            .into_iter()
            .find(|(name, _)| ForkKey::new(key.file, key.subfile, name).fork_tag == key.fork_tag)
            .map(|(name, _)| (file, subfile, name)))
    }

    /// The lines identity of a fork.
    pub(crate) fn lines_key(file: FileId, subfile: SubfileIndex, fork: &str) -> ForkKey {
        ForkKey::new(file.0, subfile.0, fork)
    }

    /// Bytes covered by one checksum entry, fixed when the target was created.
    pub fn checksum_block_bytes(&self) -> u64 {
        self.checksum_block_bytes
    }

    /// The checksum file of a fork.
    pub fn checksum_path(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> PathBuf {
        self.checksum_dir(file, subfile).join(fork)
    }

    fn checksum_dir(&self, file: FileId, subfile: SubfileIndex) -> PathBuf {
        self.checksums_dir.join(format!("{:016x}.{}", file.0, subfile.0))
    }

    /// The checksum file that belongs to a fork file's path.
    fn checksum_path_of(&self, fork_path: &Path) -> PathBuf {
        match fork_path.strip_prefix(&self.subfiles_dir) {
            Ok(relative) => self.checksums_dir.join(relative),
            Err(_) => fork_path.with_extension("crc"),
        }
    }

    pub fn kind(&self) -> &TargetKind {
        &self.kind
    }

    pub fn id(&self) -> TargetId {
        self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of a subfile.
    pub fn subfile_dir(&self, file: FileId, subfile: SubfileIndex) -> PathBuf {
        self.subfiles_dir.join(format!("{:016x}.{}", file.0, subfile.0))
    }

    /// The file of a fork (the name must already be checked).
    pub fn fork_path(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> PathBuf {
        self.subfile_dir(file, subfile).join(fork)
    }

    pub(crate) fn unknown_subfile(&self, file: FileId, subfile: SubfileIndex) -> StoreError {
        StoreError::UnknownSubfile { file, subfile, target: self.id }
    }

    pub(crate) fn full(&self) -> StoreError {
        StoreError::TargetFull { target: self.id, dir: self.dir.clone() }
    }

    /// Whether the subfile's directory exists.
    pub fn subfile_exists(&self, file: FileId, subfile: SubfileIndex) -> bool {
        self.subfile_dir(file, subfile).is_dir()
    }

    /// Creates the subfile with its `data` fork; does nothing if it exists.
    pub(crate) fn create_subfile(&self, file: FileId, subfile: SubfileIndex) -> Result<(), StoreError> {
        let dir = self.subfile_dir(file, subfile);
        if dir.is_dir() {
            return Ok(());
        }
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
            Err(error) => return Err(self.namespace_error("create subfile directory", &dir, error)),
        }
        let data = dir.join(DEFAULT_FORK_NAME);
        fs::File::create(&data).map_err(|error| self.namespace_error("create fork", &data, error))?;
        self.create_checksum_dir(file, subfile)?;
        self.create_checksum_file(file, subfile, DEFAULT_FORK_NAME)?;
        target_id_file::sync_dir(&dir)?;
        target_id_file::sync_dir(&self.subfiles_dir)
    }

    /// Creates a fork's checksum file empty (all entries 0, "never written") and makes its
    /// name durable; a leftover of a crashed creation is emptied.
    fn create_checksum_file(
        &self,
        file: FileId,
        subfile: SubfileIndex,
        fork: &str,
    ) -> Result<(), StoreError> {
        let path = self.checksum_path(file, subfile, fork);
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|error| self.namespace_error("create checksum file", &path, error))?;
        target_id_file::sync_dir(&self.checksum_dir(file, subfile))
    }

    /// Creates the subfile's checksum directory (its files are created when forks open).
    fn create_checksum_dir(&self, file: FileId, subfile: SubfileIndex) -> Result<(), StoreError> {
        let dir = self.checksum_dir(file, subfile);
        match fs::create_dir(&dir) {
            Ok(()) => target_id_file::sync_dir(&self.checksums_dir),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(error) => Err(self.namespace_error("create checksum directory", &dir, error)),
        }
    }

    /// Removes the subfile's directory and every fork in it.
    pub(crate) fn remove_subfile(&self, file: FileId, subfile: SubfileIndex) -> Result<(), StoreError> {
        let dir = self.subfile_dir(file, subfile);
        if self.lines.is_some() && dir.is_dir() {
            for (fork, _) in self.list_forks(file, subfile)? {
                self.free_lines_blocks(file, subfile, &fork)?;
            }
        }
        self.forget_crash_images(&dir);
        let checksums = self.checksum_dir(file, subfile);
        match fs::remove_dir_all(&checksums) {
            Ok(()) => target_id_file::sync_dir(&self.checksums_dir)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(self.namespace_error("remove checksum directory", &checksums, error)),
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => target_id_file::sync_dir(&self.subfiles_dir),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(self.unknown_subfile(file, subfile)),
            Err(error) => Err(self.namespace_error("remove subfile directory", &dir, error)),
        }
    }

    /// Creates an empty fork file; `ForkExists` if there is one.
    pub(crate) fn create_fork(
        &self,
        file: FileId,
        subfile: SubfileIndex,
        fork: &str,
    ) -> Result<(), StoreError> {
        if !self.subfile_exists(file, subfile) {
            return Err(self.unknown_subfile(file, subfile));
        }
        self.check_lines_tag(file, subfile, fork)?;
        let path = self.fork_path(file, subfile, fork);
        match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => {
                self.create_checksum_dir(file, subfile)?;
                self.create_checksum_file(file, subfile, fork)?;
                target_id_file::sync_dir(&self.subfile_dir(file, subfile))
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                Err(StoreError::ForkExists { file, subfile, fork: fork.to_string(), target: self.id })
            }
            Err(error) => Err(self.namespace_error("create fork", &path, error)),
        }
    }

    /// Removes a fork file.
    pub(crate) fn remove_fork(
        &self,
        file: FileId,
        subfile: SubfileIndex,
        fork: &str,
    ) -> Result<(), StoreError> {
        let path = self.fork_path(file, subfile, fork);
        self.forget_crash_images(&path);
        if path.is_file() {
            self.free_lines_blocks(file, subfile, fork)?;
        }
        let checksums = self.checksum_path(file, subfile, fork);
        let had_checksums = match fs::remove_file(&checksums) {
            Ok(()) => target_id_file::sync_dir(&self.checksum_dir(file, subfile)).map(|()| true)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => false,
            Err(error) => return Err(self.namespace_error("remove checksum file", &checksums, error)),
        };
        match fs::remove_file(&path) {
            Ok(()) => target_id_file::sync_dir(&self.subfile_dir(file, subfile)),
            // A fork whose data file was lost: removing what is left of it is a removal.
            Err(error) if error.kind() == io::ErrorKind::NotFound && had_checksums => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(self.missing(file, subfile, fork)),
            Err(error) => Err(self.namespace_error("remove fork", &path, error)),
        }
    }

    /// The forks of a subfile with their sizes on disk, sorted by name.
    pub(crate) fn list_forks(
        &self,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let dir = self.subfile_dir(file, subfile);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(self.unknown_subfile(file, subfile))
            }
            Err(error) => return Err(self.namespace_error("list forks in", &dir, error)),
        };
        let mut forks = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| self.namespace_error("list forks in", &dir, error))?;
            let metadata =
                entry.metadata().map_err(|error| self.namespace_error("stat fork", &entry.path(), error))?;
            match entry.file_name().into_string() {
                Ok(name) if metadata.is_file() => forks.push((name, metadata.len())),
                _ => tracing::warn!(path = ?entry.path(), "ignoring a stray entry in a subfile"),
            }
        }
        forks.sort();
        Ok(forks)
    }

    /// Opens a fork's block I/O; `UnknownSubfile` / `UnknownFork` if it does not exist,
    /// `ForkFileMissing` if one of its two files does and the other does not (see the module
    /// documentation).
    pub(crate) fn open_fork(
        &self,
        file: FileId,
        subfile: SubfileIndex,
        fork: &str,
    ) -> Result<Arc<dyn ForkBackend>, StoreError> {
        let path = self.fork_path(file, subfile, fork);
        self.check_fork_files(file, subfile, fork, &path)?;
        match self.open_backend(&path) {
            Ok(backend) => Ok(backend),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(self.missing(file, subfile, fork)),
            Err(error) => Err(self.namespace_error("open fork", &path, error)),
        }
    }

    /// Checks that a fork's data and checksum files are both there or both absent; gives an
    /// empty data file a missing checksum file (it has no byte to check).
    fn check_fork_files(
        &self,
        file: FileId,
        subfile: SubfileIndex,
        fork: &str,
        path: &Path,
    ) -> Result<(), StoreError> {
        let checksum_path = self.checksum_path(file, subfile, fork);
        let data = self.stat(path)?;
        let checksums = self.stat(&checksum_path)?;
        let missing = |path: PathBuf| StoreError::ForkFileMissing {
            target: self.id,
            file,
            subfile,
            fork: fork.to_string(),
            path,
        };
        match (data, checksums) {
            (None, Some(_)) => Err(missing(path.to_path_buf())),
            (Some(data), None) if data.len() > 0 => Err(missing(checksum_path)),
            (Some(_), None) => {
                self.create_checksum_dir(file, subfile)?;
                self.create_checksum_file(file, subfile, fork)
            }
            (None, None) | (Some(_), Some(_)) => Ok(()),
        }
    }

    /// The metadata of `path`, `None` if it does not exist.
    fn stat(&self, path: &Path) -> Result<Option<fs::Metadata>, StoreError> {
        match fs::metadata(path) {
            Ok(metadata) => Ok(Some(metadata)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.namespace_error("stat", path, error)),
        }
    }

    /// Reopens a fork that was open before (its file handle was closed by the fd cache).
    pub(crate) fn reopen_fork(&self, path: &Path) -> io::Result<Arc<dyn ForkBackend>> {
        self.open_backend(path)
    }

    fn open_backend(&self, path: &Path) -> io::Result<Arc<dyn ForkBackend>> {
        fs::metadata(path)?;
        let checksum_path = self.checksum_path_of(path);
        #[cfg(feature = "test-support")]
        if let Some(crash) = &self.crash {
            return Ok(Arc::new(crash.open(path)));
        }
        if let Some(disk) = &self.lines {
            let key = self.lines_key_of(path)?;
            let tier = self.tier.clone().map(|tier| (tier, self.record_path_of(path)));
            return Ok(Arc::new(LinesFork::open(path, &checksum_path, key, disk.clone(), tier)?));
        }
        Ok(match &self.sim {
            None => Arc::new(FileFork::open(path, &checksum_path)?),
            Some(disk) => Arc::new(SimFork::open(path, &checksum_path, disk.clone())?),
        })
    }

    /// Forgets the in-memory images of forks at or below `path` (crash kind only).
    fn forget_crash_images(&self, _path: &Path) {
        #[cfg(feature = "test-support")]
        if let Some(crash) = &self.crash {
            crash.forget(_path);
        }
    }

    /// The image of a lines target.
    pub fn lines_disk(&self) -> Option<&Arc<LinesDisk>> {
        self.lines.as_ref()
    }

    /// The lines identity of the fork whose namespace file is `path`.
    fn lines_key_of(&self, path: &Path) -> io::Result<ForkKey> {
        let parse = || {
            let relative = path.strip_prefix(&self.subfiles_dir).ok()?;
            let mut parts = relative.iter().map(|part| part.to_str());
            let (subfile_dir, fork) = (parts.next()??, parts.next()??);
            let (file, subfile) = subfile_dir.split_once('.')?;
            Some(ForkKey::new(u64::from_str_radix(file, 16).ok()?, subfile.parse().ok()?, fork))
        };
        parse().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{path:?} is not a fork path"))
        })
    }

    /// Drops every block of a lines fork and makes that durable (nothing for other kinds).
    fn free_lines_blocks(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> Result<(), StoreError> {
        let Some(disk) = &self.lines else { return Ok(()) };
        let key = ForkKey::new(file.0, subfile.0, fork);
        let forget = || match &self.tier {
            Some(tier) => tier.forget(key, &self.record_path(file, subfile, fork)),
            None => Ok(()),
        };
        disk.truncate(key, 0).and_then(|()| disk.sync(key)).and_then(|()| forget()).map_err(|error| {
            StoreError::io(format!("free the blocks of fork {fork:?} of {file}:{subfile}"), error)
        })
    }

    /// Refuses a fork whose lines identity (name CRC32C) another fork of the subfile has.
    fn check_lines_tag(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> Result<(), StoreError> {
        if self.lines.is_none() || !self.subfile_exists(file, subfile) {
            return Ok(());
        }
        let tag = ForkKey::new(file.0, subfile.0, fork).fork_tag;
        for (other, _) in self.list_forks(file, subfile)? {
            if other != fork && ForkKey::new(file.0, subfile.0, &other).fork_tag == tag {
                return Err(StoreError::BadConfig {
                    name: "fork name",
                    reason: format!("{fork:?} has the same CRC32C as fork {other:?} of {file}:{subfile} on lines target {}", self.id),
                });
            }
        }
        Ok(())
    }

    /// Space used and free on the target's file system.
    pub fn usage(&self) -> Result<TargetUsage, StoreError> {
        if let Some(disk) = &self.lines {
            let geometry = disk.geometry();
            let total = geometry.slots() * u64::from(geometry.block_bytes);
            let free_bytes = disk.free_bytes();
            return Ok(TargetUsage { used_bytes: total - free_bytes, free_bytes });
        }
        let stats = rustix::fs::statvfs(&self.dir)
            .map_err(|errno| self.namespace_error("statvfs", &self.dir, errno.into()))?;
        let block_bytes = stats.f_frsize;
        Ok(TargetUsage {
            used_bytes: stats.f_blocks.saturating_sub(stats.f_bfree).saturating_mul(block_bytes),
            free_bytes: stats.f_bavail.saturating_mul(block_bytes),
        })
    }

    /// `UnknownSubfile` if the subfile is missing, else `UnknownFork`.
    fn missing(&self, file: FileId, subfile: SubfileIndex, fork: &str) -> StoreError {
        if !self.subfile_exists(file, subfile) {
            return self.unknown_subfile(file, subfile);
        }
        StoreError::UnknownFork { file, subfile, fork: fork.to_string(), target: self.id }
    }

    fn namespace_error(&self, action: &str, path: &Path, error: io::Error) -> StoreError {
        if crate::error::is_no_space(&error) {
            return self.full();
        }
        StoreError::io(format!("{action} {path:?} on target {}", self.id), error)
    }
}

/// Opens the image of a lines target, creating it first if `init` and it is missing.
fn open_lines(dir: &Path, options: &LinesOptions, init: bool) -> Result<Arc<LinesDisk>, StoreError> {
    let path = dir.join(LINES_IMAGE_NAME);
    if !path.exists() {
        if !init {
            return Err(StoreError::TargetNotInitialized { dir: dir.to_path_buf() });
        }
        let geometry =
            options.geometry().map_err(|reason| StoreError::BadConfig { name: "lines target", reason })?;
        lines_disk::format(&path, &geometry)
            .map_err(|error| StoreError::io(format!("format {path:?}"), error))?;
    }
    let sim = options.sim.clone().map(|model| Arc::new(SimTarget::new(model)));
    LinesDisk::open(&path, sim).map_err(|error| StoreError::io(format!("open {path:?}"), error))
}

/// Name of the marker directory inside `subfiles/` and `checksums/` of target `id`.
pub fn content_marker_name(id: TargetId) -> String {
    format!("flotilla-content-{:016x}", id.0)
}

/// Creates `subfiles/` and `checksums/` (if missing) with their markers, durably.
fn write_content_markers(dir: &Path, id: TargetId) -> Result<(), StoreError> {
    for name in [SUBFILES_DIR_NAME, CHECKSUMS_DIR_NAME] {
        let content = dir.join(name);
        create_dir_if_missing(&content, dir)?;
        create_dir_if_missing(&content.join(content_marker_name(id)), &content)?;
    }
    Ok(())
}

/// Whether the target lost its contents (`Some(why)`), upgrading a version 2 target first:
/// one whose `subfiles/` is present and not empty and whose `checksums/` is present gets its
/// markers and a version 3 id file; any other version 2 target counts as lost, as an unused
/// target cannot be told apart from an emptied one.
fn content_state(dir: &Path, identity: TargetIdentity) -> Result<Option<String>, StoreError> {
    let (subfiles, checksums) = (dir.join(SUBFILES_DIR_NAME), dir.join(CHECKSUMS_DIR_NAME));
    if identity.format_version == TARGET_FORMAT_VERSION_UNMARKED {
        let used = fs::read_dir(&subfiles).map(|mut entries| entries.next().is_some()).unwrap_or(false);
        if !used || !checksums.is_dir() {
            return Ok(Some(format!(
                "format version 2 target whose {SUBFILES_DIR_NAME}/ is missing or empty or whose \
                 {CHECKSUMS_DIR_NAME}/ is missing: an unused target cannot be told from a lost one"
            )));
        }
        write_content_markers(dir, identity.id)?;
        target_id_file::write(dir, TargetIdentity { format_version: TARGET_FORMAT_VERSION, ..identity })?;
        tracing::info!(target = %identity.id, ?dir, "upgraded the target to format version 3 (content markers)");
        return Ok(None);
    }
    let marker = content_marker_name(identity.id);
    for content in [&subfiles, &checksums] {
        let name = content.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if !content.is_dir() {
            return Ok(Some(format!("{name}/ is missing")));
        }
        if !content.join(&marker).is_dir() {
            return Ok(Some(format!("{name}/ has no marker {marker}: it was emptied or replaced")));
        }
    }
    Ok(None)
}

fn create_dir_if_missing(dir: &Path, parent: &Path) -> Result<(), StoreError> {
    match fs::create_dir(dir) {
        Ok(()) => target_id_file::sync_dir(parent),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(StoreError::io(format!("create directory {dir:?}"), error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_then_reopen_keeps_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let first = Target::open(dir.path(), true).unwrap();
        let second = Target::open(dir.path(), false).unwrap();
        assert_eq!(first.id(), second.id());
        assert_ne!(first.id().0, 0);
    }

    #[test]
    fn missing_uninitialized_and_corrupt_targets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(matches!(Target::open(&gone, true), Err(StoreError::TargetMissing { .. })));
        assert!(matches!(Target::open(dir.path(), false), Err(StoreError::TargetNotInitialized { .. })));
        fs::write(dir.path().join(target_id_file::TARGET_ID_FILE_NAME), "junk").unwrap();
        assert!(matches!(Target::open(dir.path(), true), Err(StoreError::TargetIdCorrupt { .. })));
    }

    #[test]
    fn subfile_layout_and_forks() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::open(dir.path(), true).unwrap();
        let (file, subfile) = (FileId(0xab), SubfileIndex(3));
        target.create_subfile(file, subfile).unwrap();
        target.create_subfile(file, subfile).unwrap();
        assert!(dir.path().join("subfiles/00000000000000ab.3/data").is_file());
        assert!(dir.path().join("checksums/00000000000000ab.3").is_dir());
        target.create_fork(file, subfile, "index").unwrap();
        assert!(matches!(target.create_fork(file, subfile, "index"), Err(StoreError::ForkExists { .. })));
        let names: Vec<String> =
            target.list_forks(file, subfile).unwrap().into_iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["data", "index"]);
        target.remove_fork(file, subfile, "index").unwrap();
        assert!(matches!(target.open_fork(file, subfile, "index"), Err(StoreError::UnknownFork { .. })));
        assert!(matches!(
            target.open_fork(file, SubfileIndex(9), "data"),
            Err(StoreError::UnknownSubfile { .. })
        ));
        target.remove_subfile(file, subfile).unwrap();
        assert!(!target.subfile_exists(file, subfile));
    }
}
