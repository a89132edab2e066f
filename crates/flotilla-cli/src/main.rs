//! `flotilla`: one binary for the local cluster, the metadata service, the I/O server, the
//! file commands and the benchmarks.

mod args;
mod bench;
mod chains;
mod cluster;
mod config;
mod copy;
mod enwrich;
mod files;
mod format_target;
mod hsm;
mod keygen;
mod keys;
mod log_limit;
mod meta_admin;
mod mount;
mod mount_helper;
mod ops;
mod process;
mod publish;
mod scrub;
mod show;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "flotilla", version, about = "Flotilla, a parallel file system for scientific computing")]
struct Cli {
    /// TOML file whose [meta], [server], [local] and [client] tables replace the defaults; flags win.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Credential file (a client credential for file commands, mount and bench; a server
    /// credential for `meta` and `server`); else `key` in the config file, else FLOTILLA_KEY.
    #[arg(long, global = true)]
    key: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a metadata service and N I/O servers on loopback (the embedded default).
    Local(cluster::LocalArgs),
    /// Runs the metadata service.
    Meta(cluster::MetaArgs),
    /// Runs an I/O server.
    Server(cluster::ServerArgs),
    /// One line per storage target: server, state, space used and free, credential.
    Status(files::StatusArgs),
    /// Space per storage target and in total.
    Df(args::ReportArgs),
    /// Bytes, files and directories under a path.
    Du(files::PathReportArgs),
    /// Creates a directory.
    Mkdir(files::MkdirArgs),
    /// Lists a directory.
    Ls(files::PathArgs),
    /// Shows an entry's attributes, layout and placement.
    Stat(files::StatArgs),
    /// Removes a file, a symlink or an empty directory.
    Rm(files::PathArgs),
    /// Stores a local file, striped round robin over its subfiles; the file appears under its
    /// name only once every byte is durable (a failed put leaves none).
    Put(files::PutArgs),
    /// Copies a file out to a local file.
    Get(files::GetArgs),
    /// Copies files and trees (-r) between local paths and flotilla:/PATHs, in parallel.
    Cp(copy::CpArgs),
    /// The busiest jobs (by job id from SLURM_JOB_ID or FLOTILLA_JOB) over all I/O servers.
    Jobs(args::ReportArgs),
    /// Throughput, IOPS and latency per server and per job, refreshed every second.
    Top(ops::TopArgs),
    /// Links DIR/mount.flotilla (default /sbin) to this binary, for mount -t flotilla and fstab.
    Install {
        /// Where mount(8) looks for helpers.
        #[arg(long, default_value = "/sbin")]
        dir: PathBuf,
        /// Remove the link instead.
        #[arg(long)]
        remove: bool,
    },
    /// Shows or sets layouts.
    #[command(subcommand)]
    Layout(files::LayoutCommand),
    /// Lists, creates or removes forks.
    #[command(subcommand)]
    Fork(files::ForkCommand),
    /// The tertiary tier, in the spirit of Lustre's lfs hsm_*: where a file's data is, and
    /// moving it between the disks and the archive.
    #[command(subcommand)]
    Hsm(hsm::HsmCommand),
    /// Checks every block of the files under PATH against its checksum; replicated files'
    /// replicas are compared and bad blocks repaired from a good replica.
    Scrub(scrub::ScrubArgs),
    /// Mounts the file system (POSIX, through FUSE) and serves it until Ctrl-C or SIGTERM.
    Mount(mount::MountArgs),
    /// Unmounts a mount (also after the mount process was killed).
    Umount(mount::UmountArgs),
    /// Creates a cluster CA and its first credentials (`--out DIR`), or issues one more.
    Keygen(keygen::KeygenArgs),
    /// Runs a benchmark.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Formats a lines target (RAMA disk lines), or reports its recovery (--recover).
    FormatTarget(format_target::FormatTargetArgs),
    /// Repairs a storage target (run with its server stopped).
    #[command(subcommand)]
    Target(format_target::TargetCommand),
    /// Prints a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Writes man pages (flotilla.1 and one per command) into a directory.
    Man {
        /// Directory to write the pages into (created if missing).
        dir: PathBuf,
    },
    /// One benchmark client process (started by `flotilla bench`).
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
    /// One metadata benchmark process (started by `flotilla bench meta`).
    #[command(hide = true)]
    BenchMetaWorker(bench::MetaWorkerArgs),
    /// One sender of `flotilla bench net`.
    #[command(hide = true)]
    BenchNetWorker(bench::NetWorkerArgs),
    /// One ENWRICH job member driven by commands on stdin (see `enwrich.rs`).
    #[command(hide = true)]
    EnwrichMember(enwrich::MemberArgs),
}

fn main() -> std::process::ExitCode {
    bound_allocator_memory();
    init_logging();
    let argv: Vec<String> = std::env::args().collect();
    if argv.first().is_some_and(|name| name.ends_with(mount_helper::HELPER_NAME)) {
        return match mount_helper::run(&argv[1..]) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("{}: {error:#}", mount_helper::HELPER_NAME);
                std::process::ExitCode::from(32) // mount(8)'s "mount failure"
            }
        };
    }
    let cli = Cli::parse();
    if !cli.command.is_service() {
        quiet_on_closed_stdout();
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

impl Command {
    /// A long-running process (a service, a mount, a benchmark and its workers): it writes
    /// to sockets with vectored writes, which raise SIGPIPE when a peer goes, so it keeps
    /// SIGPIPE ignored and meets EPIPE as an error.
    fn is_service(&self) -> bool {
        matches!(
            self,
            Command::Local(_)
                | Command::Meta(cluster::MetaArgs { action: None, .. })
                | Command::Server(_)
                | Command::Mount(_)
                | Command::Bench(_)
                | Command::BenchWorker(_)
                | Command::BenchMetaWorker(_)
                | Command::BenchNetWorker(_)
                | Command::EnwrichMember(_)
        )
    }
}

/// Every command that answers on stdout ends quietly when its reader goes (`flotilla stat
/// … | head`): SIGPIPE back to its default, so the process ends as `cat` would (status 141
/// in a shell), where Rust's ignored SIGPIPE would make `println!` panic with a backtrace.
/// Its socket writes are not vectored and pass MSG_NOSIGNAL (std's `send`), so a server
/// going away is still an error, not a signal.
fn quiet_on_closed_stdout() {
    // SAFETY: restoring a signal's default disposition has no memory-safety preconditions;
    // this runs before the client starts any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut file = config::FileConfig::load(cli.config.as_deref())?;
    let flag = cli.key.as_deref();
    keys::set_client_key(flag, file.client.key.as_deref(), file.client.integrity);
    keys::set_unstable_bytes_max(file.client.unstable_bytes_max);
    keys::set_tokens(file.client.tokens);
    keys::set_attr_cache(file.client.attr_cache);
    keys::set_outage_wait_ms(file.client.outage_wait_ms);
    keys::set_server_metrics(file.server.metrics);
    keys::set_server_bulk_bytes_min(file.server.bulk_bytes_min);
    keys::set_server_disk_threads(file.server.disk_threads_per_target);
    keys::set_server_parked_requests_max(file.server.parked_requests_max);
    match cli.command {
        Command::Local(args) => cluster::local(args, &file),
        Command::Meta(cluster::MetaArgs { action: Some(action), .. }) => meta_admin::run(action),
        Command::Meta(args) => {
            let key = keys::server_key(flag, file.meta.key.as_deref(), "meta", "the metadata service")?;
            file.meta.key = Some(key);
            cluster::meta(args, &file)
        }
        Command::Server(args) => {
            let key = keys::server_key(flag, file.server.key.as_deref(), "server", "the I/O server")?;
            file.server.key = Some(key);
            cluster::server(args, &file)
        }
        Command::Keygen(args) => keygen::run(args),
        Command::Status(args) => files::status(args),
        Command::Df(args) => files::df(args),
        Command::Du(args) => files::du(args),
        Command::Mkdir(args) => files::mkdir(args),
        Command::Ls(args) => files::ls(args),
        Command::Stat(args) => files::stat(args),
        Command::Rm(args) => files::rm(args),
        Command::Put(args) => files::put(args),
        Command::Get(args) => files::get(args),
        Command::Cp(args) => copy::cp(args),
        Command::Jobs(args) => ops::jobs(args),
        Command::Top(args) => ops::top(args),
        Command::Install { dir, remove } => mount_helper::install(&dir, remove),
        Command::Fork(command) => files::fork(command),
        Command::Hsm(command) => hsm::run(command),
        Command::Scrub(args) => scrub::scrub(args),
        Command::Layout(command) => files::layout(command),
        Command::Mount(args) => mount::mount(args),
        Command::Umount(args) => mount::umount(args),
        Command::Bench(command) => bench::run(command),
        Command::FormatTarget(args) => format_target::run(args),
        Command::Target(command) => format_target::target(command),
        Command::Completions { shell } => print_completions(shell),
        Command::Man { dir } => write_man_pages(&dir),
        Command::BenchWorker(args) => bench::worker(args),
        Command::BenchMetaWorker(args) => bench::meta_worker(args),
        Command::BenchNetWorker(args) => bench::net_worker(args),
        Command::EnwrichMember(args) => enwrich::member(args),
    }
}

/// Prints the completion script for `shell`; a reader that stops early (`| head`) is fine.
fn print_completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "flotilla", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
        _ => Ok(()),
    }
}

/// Writes `flotilla.1` and `flotilla-COMMAND.1` for every visible command into `dir`.
fn write_man_pages(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let command = <Cli as clap::CommandFactory>::command();
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("write man pages into {}", dir.display()))?;
    Ok(())
}

/// Keeps glibc's allocator from holding freed request buffers: buffers of 1 MiB and more are
/// always mapped (and unmapped when freed) instead of the threshold rising after the first
/// large free, and threads share at most two arenas. Without this a server's resident memory
/// grows past its cache by the sum of every arena's high-water mark.
fn bound_allocator_memory() {
    // SAFETY: mallopt only adjusts allocator parameters; it is called before any other thread
    // exists and has no memory-safety preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Openraft's per-heartbeat errors about a peer that is down are held back after the
    // first (log_limit.rs).
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .finish()
        .with(log_limit::RepeatLayer::new())
        .init();
}
