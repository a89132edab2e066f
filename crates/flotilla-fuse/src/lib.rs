//! Flotilla's POSIX mount: a FUSE file system over the client library, so that unmodified
//! programs (`cp`, `tar`, `rsync`, `sqlite3`, `git`, MPI-IO through ROMIO's POSIX driver)
//! read and write Flotilla files.
//!
//! The kernel names entries by inode number; Flotilla's inode numbers are its entry ids, and
//! the root is inode 1 in both. Directories are addressed by path (rebuilt from the names the
//! kernel looked up, [`nodes`]), files by id. Open files bypass the page cache
//! (`FOPEN_DIRECT_IO`) so that a size written by another client is seen after its close, and
//! writes by several processes to one file run in parallel (`FOPEN_PARALLEL_DIRECT_WRITES`);
//! each kernel request moves up to 1 MiB. Read-only opens fetch ahead of sequential and
//! strided reads (`readahead.rs`); fcntl and flock locks and `O_APPEND` writes are kept
//! coherent across mounts through the metadata service (`locks.rs`). Permissions are the kernel's
//! (`default_permissions`), from the mode, owner and group the metadata service keeps.
//!
//! The mount uses fuser's own mount code (no libfuse, no fusermount when root).

mod atime;
mod coherence;
mod config;
mod convert;
mod enwrich;
mod fs;
mod handles;
mod kept;
mod locks;
mod meta_tokens;
mod names;
pub mod nodes;
mod open_files;
mod privileges;
mod readahead;
mod write_behind;
mod xattr;

pub use atime::AtimeMode;
pub use config::MountConfig;
pub use fs::{FlotillaFs, IO_BYTES_MAX};
pub use open_files::FILE_BYTES_MAX;
pub use xattr::{LAYOUT_XATTR, NO_OVERLAP_XATTR};

use flotilla_client::Client;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A live mount served by background threads.
pub struct Mounted {
    session: fuser::BackgroundSession,
    mountpoint: PathBuf,
}

/// Mounts the cluster `client` talks to at `mountpoint` and serves it in the background.
/// Blocking: call it outside any async runtime.
pub fn mount(client: Client, mountpoint: &Path, config: &MountConfig) -> io::Result<Mounted> {
    let filesystem = FlotillaFs::new(client, config);
    let holder = filesystem.holder();
    let poller = filesystem.meta_poller();
    let session = fuser::Session::new(filesystem, mountpoint, &session_config(config))?;
    let _ = holder.notifier.set(session.notifier());
    if let Some((client, tokens, stop)) = poller {
        let notifier = session.notifier();
        std::thread::Builder::new()
            .name("inode-token-poll".into())
            .spawn(move || meta_tokens::poll(client, tokens, notifier, stop))?;
    }
    let session = session.spawn()?;
    if config.kernel_cache {
        // After the session serves: finding the mount's device asks the mount itself.
        set_kernel_readahead(mountpoint, config.kernel_readahead_bytes);
    }
    Ok(Mounted { session, mountpoint: mountpoint.to_path_buf() })
}

/// Sets how far the kernel reads ahead of page-cache reads on this mount (its backing
/// device's `read_ahead_kb`; the kernel starts FUSE mounts at 128 KiB). Best effort: needs
/// root and sysfs; without it the kernel's default stays.
fn set_kernel_readahead(mountpoint: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(metadata) = std::fs::metadata(mountpoint) else { return };
    let device = metadata.dev();
    let (major, minor) = (libc::major(device), libc::minor(device));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&knob, format!("{}", bytes >> 10)) {
        Ok(()) => tracing::debug!(knob, kib = bytes >> 10, "kernel read-ahead set"),
        Err(error) => tracing::debug!(knob, %error, "kernel read-ahead left as it was"),
    }
}

fn session_config(config: &MountConfig) -> fuser::Config {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let allow_other = config.allow_other.unwrap_or(root);
    let mut session = fuser::Config::default();
    session.mount_options = vec![
        fuser::MountOption::FSName("flotilla".to_string()),
        fuser::MountOption::Subtype("flotilla".to_string()),
        fuser::MountOption::DefaultPermissions,
        if config.read_only { fuser::MountOption::RO } else { fuser::MountOption::RW },
        // The kernel leaves a FUSE file's atime to the file system (see `atime.rs`); the flag
        // only tells what the mount does.
        if config.atime == crate::AtimeMode::NoAtime {
            fuser::MountOption::NoAtime
        } else {
            fuser::MountOption::Atime
        },
    ];
    session.acl = if allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    session.n_threads = Some(config.threads.max(1));
    session.clone_fd = true;
    session
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the session ended (someone unmounted the file system).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Unmounts and waits for the serving threads. A busy mount (files still open) is
    /// detached instead: it disappears from the tree now and ends when the last file closes.
    pub fn unmount(self) -> io::Result<()> {
        match unmount(&self.mountpoint, false) {
            Ok(()) => self.session.join(),
            Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(mountpoint = %self.mountpoint.display(), "mount busy; detaching it");
                unmount(&self.mountpoint, true)
            }
            Err(error) => Err(error),
        }
    }

    /// Waits until someone else unmounts the file system.
    pub fn join(self) -> io::Result<()> {
        self.session.join()
    }
}

/// Unmounts the file system at `mountpoint`; `lazy` detaches it even while busy. Works after
/// the serving process died. As root this is umount(2); otherwise `fusermount3 -u` (or
/// `fusermount -u`), the setuid helper that lets users unmount their own FUSE mounts.
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount_unmount(mountpoint, lazy);
    }
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point contains a NUL byte"))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fusermount3 -u` (or `fusermount -u`); a refusal because the mount is busy is EBUSY, so
/// callers can fall back to a lazy unmount as with umount(2).
fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "neither fusermount3 nor fusermount is installed");
    for helper in ["fusermount3", "fusermount"] {
        let mut command = std::process::Command::new(helper);
        command.arg(if lazy { "-uz" } else { "-u" }).arg(mountpoint);
        match command.output() {
            Ok(output) if output.status.success() => return Ok(()),
            Ok(output) => {
                let said = String::from_utf8_lossy(&output.stderr);
                if said.contains("busy") {
                    return Err(io::Error::from_raw_os_error(libc::EBUSY));
                }
                return Err(io::Error::other(format!(
                    "{helper} -u exited with {}: {}",
                    output.status,
                    said.trim()
                )));
            }
            Err(error) => last = error,
        }
    }
    Err(last)
}
