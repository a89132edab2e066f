//! `flotilla cp [-r] SRC DST` between local paths and Flotilla paths (`flotilla:/PATH`), and
//! the progress display it shares with `put` and `get`: a bar on a terminal (indicatif,
//! stderr), and a final throughput line on stderr.
//!
//! A copy is planned first (directories in creation order, then files and symlinks), then the
//! files are copied by `--jobs` threads taking the next file from one list.

use crate::publish::Staged;
use anyhow::Context;
use clap::Args;
use flotilla_client::{Client, CreateOptions, FileKind};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The prefix naming a path inside Flotilla.
pub const CLUSTER_PREFIX: &str = "flotilla:";

/// Bytes one copy thread moves per round.
const CHUNK_BYTES: usize = 8 << 20;

#[derive(Args)]
pub struct CpArgs {
    #[command(flatten)]
    meta: crate::args::MetaArg,
    /// Copy directories and everything under them.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Files copied at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Source: a local path, or `flotilla:/PATH`.
    source: String,
    /// Destination: a local path, or `flotilla:/PATH` (an existing directory receives the
    /// source under its own name).
    destination: String,
}

/// A path on this machine or in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Local(PathBuf),
    Cluster(String),
}

impl Place {
    /// `flotilla:/a/b` is in the cluster (absolute path required); anything else is local.
    pub fn parse(text: &str) -> anyhow::Result<Place> {
        match text.strip_prefix(CLUSTER_PREFIX) {
            Some(path) => {
                anyhow::ensure!(
                    path.starts_with('/'),
                    "{text}: a Flotilla path must be absolute (flotilla:/...)"
                );
                Ok(Place::Cluster(normalize(path)))
            }
            None => Ok(Place::Local(PathBuf::from(text))),
        }
    }

    pub fn join(&self, name: &str) -> Place {
        match self {
            Place::Local(path) => Place::Local(path.join(name)),
            Place::Cluster(path) if path == "/" => Place::Cluster(format!("/{name}")),
            Place::Cluster(path) => Place::Cluster(format!("{path}/{name}")),
        }
    }

    /// The last component (`None` for `/`).
    pub fn name(&self) -> Option<String> {
        match self {
            Place::Local(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()),
            Place::Cluster(path) => path.rsplit('/').next().filter(|n| !n.is_empty()).map(String::from),
        }
    }

    fn show(&self) -> String {
        match self {
            Place::Local(path) => path.display().to_string(),
            Place::Cluster(path) => format!("{CLUSTER_PREFIX}{path}"),
        }
    }
}

/// `/a//b/` as `/a/b`.
fn normalize(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    format!("/{}", parts.join("/"))
}

/// What is at a place.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Found {
    File { bytes: u64 },
    Directory,
    Symlink { target: String },
}

fn found(client: &Client, place: &Place) -> anyhow::Result<Option<Found>> {
    match place {
        Place::Local(path) => match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(Some(Found::Directory)),
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(path)?.to_string_lossy().into_owned();
                Ok(Some(Found::Symlink { target }))
            }
            Ok(meta) if meta.is_file() => Ok(Some(Found::File { bytes: meta.len() })),
            Ok(_) => anyhow::bail!("cannot copy {}: it is a special file", path.display()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error).with_context(|| format!("stat {}", path.display())),
        },
        Place::Cluster(path) => match client.stat(path) {
            Ok(entry) => Ok(Some(match entry.attrs.kind {
                FileKind::Directory => Found::Directory,
                FileKind::Symlink => Found::Symlink { target: entry.symlink.unwrap_or_default() },
                FileKind::File => Found::File { bytes: entry.attrs.size_bytes },
                special => anyhow::bail!("cannot copy {}: it is a special file ({special:?})", place.show()),
            })),
            Err(error) if error.errno() == libc::ENOENT => Ok(None),
            Err(error) => Err(error).with_context(|| format!("stat {}", place.show())),
        },
    }
}

fn children(client: &Client, place: &Place) -> anyhow::Result<Vec<String>> {
    let mut names = match place {
        Place::Local(path) => std::fs::read_dir(path)
            .with_context(|| format!("list {}", path.display()))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<Vec<_>, _>>()?,
        Place::Cluster(path) => client.readdir(path)?.into_iter().map(|e| e.name).collect(),
    };
    names.sort();
    Ok(names)
}

/// Everything one copy does, in order.
#[derive(Debug, Default)]
pub struct Plan {
    pub directories: Vec<Place>,
    pub files: Vec<(Place, Place, u64)>,
    pub symlinks: Vec<(String, Place)>,
}

impl Plan {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, _, bytes)| bytes).sum()
    }
}

/// Plans copying `source` to `destination` (into it, when it is an existing directory).
fn plan(client: &Client, source: &Place, destination: &Place, recursive: bool) -> anyhow::Result<Plan> {
    let what =
        found(client, source)?.with_context(|| format!("{}: no such file or directory", source.show()))?;
    let target = match (found(client, destination)?, source.name()) {
        (Some(Found::Directory), Some(name)) => destination.join(&name),
        _ => destination.clone(),
    };
    let mut plan = Plan::default();
    let mut pending = vec![(source.clone(), target, what)];
    while let Some((from, to, what)) = pending.pop() {
        match what {
            Found::File { bytes } => plan.files.push((from, to, bytes)),
            Found::Symlink { target } => plan.symlinks.push((target, to)),
            Found::Directory => {
                anyhow::ensure!(recursive, "{} is a directory (use -r)", from.show());
                for name in children(client, &from)? {
                    let child = from.join(&name);
                    let found =
                        found(client, &child)?.with_context(|| format!("{} vanished", child.show()))?;
                    pending.push((child, to.join(&name), found));
                }
                plan.directories.push(to);
            }
        }
    }
    Ok(plan)
}

/// `flotilla cp`.
pub fn cp(args: CpArgs) -> anyhow::Result<()> {
    let (source, destination) = (Place::parse(&args.source)?, Place::parse(&args.destination)?);
    anyhow::ensure!(
        matches!(source, Place::Cluster(_)) || matches!(destination, Place::Cluster(_)),
        "neither {} nor {} is a Flotilla path (flotilla:/...); use cp(1) for local copies",
        args.source,
        args.destination
    );
    let client = args.meta.client()?;
    let plan = plan(&client, &source, &destination, args.recursive)?;
    for directory in &plan.directories {
        make_directory(&client, directory)?;
    }
    for (target, link) in &plan.symlinks {
        make_symlink(&client, target, link)?;
    }
    let progress = Progress::new(plan.bytes());
    copy_files(&client, &plan.files, args.jobs.max(1), &progress)?;
    progress.finish(plan.files.len());
    Ok(())
}

fn make_directory(client: &Client, place: &Place) -> anyhow::Result<()> {
    match place {
        Place::Local(path) => {
            std::fs::create_dir_all(path).with_context(|| format!("create {}", path.display()))
        }
        Place::Cluster(path) => match client.mkdir(path, 0o755) {
            Err(error) if error.errno() == libc::EEXIST => Ok(()),
            other => other.map(|_| ()).with_context(|| format!("mkdir {}", place.show())),
        },
    }
}

fn make_symlink(client: &Client, target: &str, place: &Place) -> anyhow::Result<()> {
    match place {
        Place::Local(path) => std::os::unix::fs::symlink(target, path),
        Place::Cluster(path) => {
            return client
                .symlink(path, target)
                .map(|_| ())
                .with_context(|| format!("symlink {}", place.show()))
        }
    }
    .with_context(|| format!("symlink {}", place.show()))
}

/// Copies every file with `jobs` threads; the first error stops the others.
fn copy_files(
    client: &Client,
    files: &[(Place, Place, u64)],
    jobs: usize,
    progress: &Progress,
) -> anyhow::Result<()> {
    let next = AtomicUsize::new(0);
    let failed = parking_lot::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(files.len()) {
            scope.spawn(|| {
                let mut buffer = vec![0u8; CHUNK_BYTES];
                while failed.lock().is_none() {
                    let Some((from, to, _)) = files.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                    if let Err(error) = copy_one(client, (from, to), &mut buffer, progress) {
                        failed.lock().get_or_insert(error);
                    }
                }
            });
        }
    });
    match failed.into_inner() {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn copy_one(
    client: &Client,
    (from, to): (&Place, &Place),
    buffer: &mut [u8],
    progress: &Progress,
) -> anyhow::Result<()> {
    let reader = Source::open(client, from)?;
    let writer = Sink::create(client, to)?;
    stream(reader, writer, buffer, progress).with_context(|| format!("copy {} to {}", from.show(), to.show()))
}

/// Where bytes come from.
pub enum Source {
    Local(std::fs::File),
    Cluster(flotilla_client::File, u64),
}

impl Source {
    fn open(client: &Client, place: &Place) -> anyhow::Result<Source> {
        Ok(match place {
            Place::Local(path) => {
                Source::Local(std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?)
            }
            Place::Cluster(path) => Source::Cluster(open_readable(client, path)?, 0),
        })
    }

    fn read(&mut self, buffer: &mut [u8]) -> anyhow::Result<usize> {
        match self {
            Source::Local(file) => Ok(fill(file, buffer)?),
            Source::Cluster(file, offset) => {
                let read = file.read_at(*offset, buffer)?;
                *offset += read as u64;
                Ok(read)
            }
        }
    }
}

/// Opens cluster file `path` for reading: refused with EACCES (permission denied) when the
/// caller may not read it, before anything is read or created.
pub fn open_readable(client: &Client, path: &str) -> anyhow::Result<flotilla_client::File> {
    let file = client.open(path).with_context(|| format!("open {CLUSTER_PREFIX}{path}"))?;
    if !file.may_read() {
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        return Err(denied).with_context(|| format!("read {CLUSTER_PREFIX}{path}"));
    }
    Ok(file)
}

/// Where bytes go: a local file, or a file staged under a temporary name in the cluster
/// (`publish.rs`: published whole at the end, or not at all).
pub enum Sink {
    Local(std::fs::File),
    Cluster(Staged, u64),
}

impl Sink {
    fn create(client: &Client, place: &Place) -> anyhow::Result<Sink> {
        Ok(match place {
            Place::Local(path) => Sink::Local(
                std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
            ),
            Place::Cluster(path) => {
                let options = CreateOptions { subfiles: 0, ..CreateOptions::default() };
                Sink::staged(client, path, &options)?
            }
        })
    }

    /// A cluster file at `path` (which must not exist) with the layout of `options`.
    pub fn staged(client: &Client, path: &str, options: &CreateOptions) -> anyhow::Result<Sink> {
        Ok(Sink::Cluster(Staged::create(client, path, options)?, 0))
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        match self {
            Sink::Local(file) => file.write_all(bytes)?,
            Sink::Cluster(staged, offset) => {
                staged.file().write_at(*offset, bytes)?;
                *offset += bytes.len() as u64;
            }
        }
        Ok(())
    }

    /// Makes what was written durable (and publishes a cluster file under its name).
    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Local(file) => file.sync_all()?,
            Sink::Cluster(staged, _) => staged.publish()?,
        }
        Ok(())
    }

    /// The copy failed: a cluster file is not published (its temporary is removed).
    fn abandon(self) {
        match self {
            Sink::Local(_) => {}
            Sink::Cluster(staged, _) => staged.abandon(),
        }
    }
}

/// Moves everything from `reader` to `writer` through `buffer`, counting on `progress`; a
/// cluster destination appears only when every byte arrived and is durable.
pub fn stream(
    mut reader: Source,
    mut writer: Sink,
    buffer: &mut [u8],
    progress: &Progress,
) -> anyhow::Result<()> {
    match pump(&mut reader, &mut writer, buffer, progress) {
        Ok(()) => writer.finish(),
        Err(error) => {
            writer.abandon();
            Err(error)
        }
    }
}

fn pump(
    reader: &mut Source,
    writer: &mut Sink,
    buffer: &mut [u8],
    progress: &Progress,
) -> anyhow::Result<()> {
    loop {
        let filled = reader.read(buffer)?;
        if filled == 0 {
            return Ok(());
        }
        writer.write(&buffer[..filled])?;
        progress.add(filled as u64);
    }
}

fn fill(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// A progress bar on stderr when it is a terminal, and the final throughput line.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
}

impl Progress {
    pub fn new(total_bytes: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total_bytes), draw_target());
        let style = ProgressStyle::with_template(
            "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        );
        if let Ok(style) = style {
            bar.set_style(style);
        }
        Progress { bar, started: Instant::now() }
    }

    pub fn add(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    /// Clears the bar and prints `copied N files, SIZE in S s (RATE/s)` on stderr.
    pub fn finish(&self, files: usize) {
        self.bar.finish_and_clear();
        eprintln!("{}", throughput_line(files, self.bar.position(), self.started.elapsed()));
    }
}

fn draw_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// The final line of a copy.
pub fn throughput_line(files: usize, bytes: u64, elapsed: std::time::Duration) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-6);
    let rate = crate::show::human_bytes((bytes as f64 / seconds) as u64);
    let noun = if files == 1 { "file" } else { "files" };
    format!("copied {files} {noun}, {} in {seconds:.2} s ({rate}/s)", crate::show::human_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_parse_and_join() {
        assert_eq!(Place::parse("flotilla://a//b/").unwrap(), Place::Cluster("/a/b".into()));
        assert_eq!(Place::parse("dir/x").unwrap(), Place::Local("dir/x".into()));
        assert!(Place::parse("flotilla:rel").is_err(), "cluster paths are absolute");
        assert_eq!(Place::Cluster("/".into()).join("a"), Place::Cluster("/a".into()));
        assert_eq!(Place::Cluster("/a".into()).join("b").name().as_deref(), Some("b"));
        assert_eq!(Place::Cluster("/".into()).name(), None);
    }

    #[test]
    fn the_throughput_line_names_files_bytes_and_rate() {
        let line = throughput_line(2, 2 << 20, std::time::Duration::from_secs(2));
        assert_eq!(line, "copied 2 files, 2.00 MiB in 2.00 s (1.00 MiB/s)");
    }
}
