//! `flotilla mount` (the POSIX mount, in the foreground until Ctrl-C or SIGTERM, or until
//! someone unmounts it) and `flotilla umount` (the clean way down, also after the mount
//! process was killed).

use crate::process::shutdown_signal;
use anyhow::Context;
use clap::Args;
use flotilla_fuse::{MountConfig, Mounted};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the foreground process checks whether someone else unmounted the mount.
const UNMOUNT_POLL_MS: u64 = 100;

#[derive(Args)]
pub struct MountArgs {
    /// Address of the metadata service, or every address of its group as `a,b,c` (the
    /// node that serves is found and followed).
    #[arg(long, env = "FLOTILLA_META", default_value = flotilla_meta::config::DEFAULT_META_ADDR)]
    meta: String,
    /// Directory to mount on (created if missing).
    mountpoint: PathBuf,
    /// Threads serving kernel requests (requests served at once).
    #[arg(long)]
    threads: Option<usize>,
    /// How long the kernel may cache names and attributes, in milliseconds.
    #[arg(long)]
    attr_timeout_ms: Option<u64>,
    /// How long the kernel may cache names and attributes the mount holds inode tokens on
    /// (revoked the moment another client changes them), in milliseconds; 0: no inode
    /// tokens (names and attributes then cached for --attr-timeout-ms, not coherent).
    #[arg(long)]
    metadata_timeout_ms: Option<u64>,
    /// Bytes of writes buffered and queued per file in the background before writers send
    /// the oldest themselves (0: no write-behind; every write goes straight to the servers).
    #[arg(long)]
    write_behind_bytes: Option<u64>,
    /// When reads update access times: relatime (default), strictatime or noatime.
    #[arg(long)]
    atime: Option<flotilla_fuse::AtimeMode>,
    /// Mount read-only.
    #[arg(long)]
    read_only: bool,
    /// ENWRICH mode for POSIX programs: a file opened write-only by a process whose
    /// environment names a job (FLOTILLA_JOB_NAME and FLOTILLA_JOB_SIZE, or SLURM's or an
    /// MPI launcher's variables) is cached in the mount and flushed by the whole job at once.
    #[arg(long)]
    enwrich: bool,
    /// The log cache of each file opened in ENWRICH mode (bytes; k, m, g suffixes).
    #[arg(long, value_parser = crate::bench::parse_size)]
    enwrich_cache_bytes: Option<u64>,
    /// Serve the mount's client metrics on this address (`HOST:PORT`, path /metrics).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Bytes a read-only open may fetch ahead of sequential or strided reads (k, m, g
    /// suffixes; 0 turns read-ahead off). Default 8m.
    #[arg(long, value_parser = crate::bench::parse_size)]
    readahead_bytes: Option<u64>,
    /// Byte-range tokens keep this mount's caches coherent with every other client's: a
    /// byte written here is seen elsewhere once its `write` returns (`on`, default); `off`:
    /// only after the writer's `close` (close-to-open, as NFS).
    #[arg(long, value_parser = ["on", "off"])]
    tokens: Option<String>,
    /// Read-only opens of files under tokens use the kernel's page cache, so repeated and
    /// small reads are served by the kernel (`on`, default; `off`: every read reaches the
    /// mount).
    #[arg(long, value_parser = ["on", "off"])]
    kernel_cache: Option<String>,
    /// Closed files whose tokens (and unchanged kernel pages) the mount keeps for a later
    /// open; past it the least recently closed give theirs back (0: none kept). Default 4096.
    #[arg(long)]
    kept_files: Option<usize>,
    /// How long a file operation keeps trying an unreachable I/O server or metadata service
    /// before it fails with EIO, in milliseconds (default 60000, `[client] outage_wait_ms`).
    #[arg(long)]
    outage_wait_ms: Option<u64>,
}

#[derive(Args)]
pub struct UmountArgs {
    /// The mount point.
    mountpoint: PathBuf,
    /// Detach the mount even if files are open on it (it ends when the last one closes).
    #[arg(long, short = 'l')]
    lazy: bool,
}

pub fn mount(args: MountArgs) -> anyhow::Result<()> {
    let mut config = MountConfig::default();
    config.threads = args.threads.unwrap_or(config.threads);
    config.attr_timeout_ms = args.attr_timeout_ms.unwrap_or(config.attr_timeout_ms);
    config.metadata_timeout_ms = args.metadata_timeout_ms.unwrap_or(config.metadata_timeout_ms);
    config.atime = args.atime.unwrap_or(config.atime);
    if let Some(bytes) = args.write_behind_bytes {
        config.write_behind_bytes_max = bytes;
        config.write_behind_piece_bytes_max = config.write_behind_piece_bytes_max.min(bytes);
    }
    config.read_only = args.read_only;
    config.enwrich = args.enwrich;
    config.enwrich_cache_bytes = args.enwrich_cache_bytes.unwrap_or(config.enwrich_cache_bytes);
    config.readahead_bytes_max = args.readahead_bytes.unwrap_or(config.readahead_bytes_max);
    config.tokens = args.tokens.as_deref() != Some("off");
    config.kernel_cache = args.kernel_cache.as_deref() != Some("off");
    config.kept_files_max = args.kept_files.unwrap_or(config.kept_files_max);
    if let Some(listen) = &args.metrics_listen {
        crate::keys::set_metrics_listen(listen);
    }
    crate::keys::set_outage_wait_ms(args.outage_wait_ms);
    let mounted = mount_at((&args.meta, None), &args.mountpoint, &config)?;
    serve_until_signal(mounted)
}

/// Mounts the cluster at `meta` on `mountpoint` (blocking; not inside an async runtime) and
/// prints `mount=DIR` once the mount serves. `key` is the client credential, or `None` for
/// the one `--key`, the config file or `FLOTILLA_KEY` names.
pub fn mount_at(
    (meta, key): (&str, Option<&Path>),
    mountpoint: &Path,
    config: &MountConfig,
) -> anyhow::Result<Mounted> {
    let client = match key {
        Some(key) => crate::keys::client_with(meta, Some(key)),
        None => crate::keys::client(meta),
    };
    let client = client.context("connect to the metadata service")?;
    client.status().with_context(|| format!("reach the metadata service at {meta}"))?;
    if let Some(addr) = client.metrics_addr() {
        crate::process::announce(format!("metrics={addr}"));
    }
    prepare_mount_point(mountpoint)?;
    let mounted = flotilla_fuse::mount(client, mountpoint, config)
        .with_context(|| format!("mount on {}", mountpoint.display()))?;
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "mount={}", mountpoint.display());
    let _ = stdout.flush();
    Ok(mounted)
}

/// Makes `mountpoint` ready to mount on: created if missing, and a mount a killed mount
/// process left there (stat answers ENOTCONN) detached first, so the new mount takes its
/// place even while processes still have files or their working directory in the old one.
fn prepare_mount_point(mountpoint: &Path) -> anyhow::Result<()> {
    if dead_mount(mountpoint) {
        eprintln!(
            "{}: a mount whose process died is still there; detaching it (lazily: it goes when its last user leaves)",
            mountpoint.display()
        );
        flotilla_fuse::unmount(mountpoint, true)
            .with_context(|| format!("detach the dead mount on {}", mountpoint.display()))?;
    }
    std::fs::create_dir_all(mountpoint)
        .with_context(|| format!("create mount point {}", mountpoint.display()))
}

/// Whether `mountpoint` holds a FUSE mount whose process is gone: `statfs` answers ENOTCONN.
/// (`stat` is no test: the kernel may answer it from attributes it caches for minutes under
/// inode tokens, while `statfs` always asks the mount's process.)
fn dead_mount(mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is a valid NUL-terminated string and `buf` is large enough for the
    // `statfs` the call writes; `buf` is not read.
    let rc = unsafe { libc::statfs(path.as_ptr(), buf.as_mut_ptr()) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// Serves until a signal (then unmounts) or until someone else unmounts.
fn serve_until_signal(mounted: Mounted) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the signal runtime")?;
    let signalled = runtime.block_on(async {
        tokio::select! {
            _ = shutdown_signal() => true,
            _ = unmounted(&mounted) => false,
        }
    });
    drop(runtime);
    if signalled {
        mounted.unmount().context("unmount")
    } else {
        mounted.join().context("finish serving the mount")
    }
}

async fn unmounted(mounted: &Mounted) {
    while !mounted.is_finished() {
        tokio::time::sleep(Duration::from_millis(UNMOUNT_POLL_MS)).await;
    }
}

/// Unmounts; a busy mount (a process has a file or its working directory in it, also after
/// the mount process died) is detached lazily instead, with a message saying so.
pub fn umount(args: UmountArgs) -> anyhow::Result<()> {
    let path = &args.mountpoint;
    match flotilla_fuse::unmount(path, args.lazy) {
        Err(error) if !args.lazy && error.raw_os_error() == Some(libc::EBUSY) => {
            eprintln!(
                "{}: busy (a process has a file or its working directory in it); detaching it lazily: \
                 it goes when its last user leaves",
                path.display()
            );
            flotilla_fuse::unmount(path, true).with_context(|| format!("detach {}", path.display()))
        }
        other => other.with_context(|| format!("unmount {}", path.display())),
    }
}
