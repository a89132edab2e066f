//! File commands: status, mkdir, ls, stat, rm, put, get, fork.

use crate::args::{MetaArg, ReportArgs};
use crate::copy::{stream, Progress, Sink, Source};
use crate::show::Output;
use anyhow::Context;
use clap::{Args, Subcommand};
use flotilla_client::{Client, CreateOptions, EntryInfo, FileKind, Layout, DEFAULT_FORK};
use std::path::PathBuf;

/// Bytes moved per round of `put` and `get`.
const COPY_CHUNK_BYTES: usize = 16 << 20;

#[derive(Args)]
pub struct PathArgs {
    #[command(flatten)]
    meta: MetaArg,
    path: String,
}

/// A report on one path, in human units, bytes or JSON.
#[derive(Args)]
pub struct PathReportArgs {
    #[command(flatten)]
    meta: MetaArg,
    path: String,
    #[command(flatten)]
    output: Output,
}

/// `stat`: one path, or `-` for paths read from stdin.
#[derive(Args)]
pub struct StatArgs {
    #[command(flatten)]
    meta: MetaArg,
    /// The path; `-` reads paths from stdin, one per line, and answers each in order with one
    /// client (whose attribute cache answers repeated stats without asking the service).
    path: String,
    #[command(flatten)]
    output: Output,
}

#[derive(Args)]
pub struct MkdirArgs {
    #[command(flatten)]
    meta: MetaArg,
    path: String,
    /// Permission bits, in octal.
    #[arg(long, default_value = "755")]
    mode: String,
}

#[derive(Args)]
pub struct PutArgs {
    #[command(flatten)]
    meta: MetaArg,
    local: PathBuf,
    path: String,
    /// Number of subfiles, each on its own target (default: the layout's count, else one
    /// per live target).
    #[arg(long, default_value_t = 0)]
    subfiles: u32,
    /// Layout: `stripe:UNIT[:COUNT]` or `hash:BLOCK[:SEQUENTIALITY[:COUNT]]` (sizes take K/M/G),
    /// optionally with `,replicas=N`; default: the directory's default layout, else stripe:1M.
    #[arg(long)]
    layout: Option<String>,
    /// Shorthand for `--layout stripe:UNIT`.
    #[arg(long)]
    stripe_unit: Option<u64>,
    /// Copies of every subfile, on targets of distinct failure groups (also `,replicas=N`
    /// after the layout); default 1.
    #[arg(long)]
    replicas: Option<u32>,
}

#[derive(Subcommand)]
pub enum LayoutCommand {
    /// Shows the layout of a file, or the default layout of a directory.
    Get {
        #[command(flatten)]
        meta: MetaArg,
        path: String,
    },
    /// Sets a directory's default layout (`none` clears it) or an empty file's layout.
    Set {
        #[command(flatten)]
        meta: MetaArg,
        path: String,
        /// `explicit`, `stripe:UNIT[:COUNT]`, `hash:BLOCK[:SEQUENTIALITY[:COUNT]]` or `none`.
        layout: String,
    },
}

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    meta: MetaArg,
    path: String,
    local: PathBuf,
}

#[derive(Subcommand)]
pub enum ForkCommand {
    /// Lists the forks of every subfile (or one).
    Ls {
        #[command(flatten)]
        meta: MetaArg,
        path: String,
        #[arg(long)]
        subfile: Option<u32>,
    },
    /// Creates a fork in one subfile (or in all).
    Create {
        #[command(flatten)]
        meta: MetaArg,
        path: String,
        name: String,
        #[arg(long)]
        subfile: Option<u32>,
    },
    /// Removes a fork from one subfile (or from all).
    Rm {
        #[command(flatten)]
        meta: MetaArg,
        path: String,
        name: String,
        #[arg(long)]
        subfile: Option<u32>,
    },
}

/// `status`: the report, and replication's chain table.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    report: ReportArgs,
    /// Also list every chain: its version and members with their states.
    #[arg(long)]
    chains: bool,
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    let meta = args.report.meta.meta.clone();
    let (client, output) = args.report.parts()?;
    let targets = client.status()?;
    // The chain report takes a connection of its own: the client's goes first.
    drop(client);
    let chains = match crate::chains::report(&meta, args.chains) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("flotilla: no chain report: {error:#}");
            None
        }
    };
    if output.json {
        let mut json = crate::show::targets_json(&targets);
        if let Some(report) = &chains {
            json["chain_table"] = crate::chains::json(report);
        }
        println!("{json}");
        return Ok(());
    }
    let fields = chains.as_ref().map(crate::chains::target_fields).unwrap_or_default();
    for (target, line) in targets.iter().zip(crate::show::status_lines(&targets, output)) {
        match fields.get(&target.target) {
            Some(extra) => println!("{line} {extra}"),
            None => println!("{line}"),
        }
    }
    for line in chains.as_ref().map(crate::chains::summary_lines).unwrap_or_default() {
        println!("{line}");
    }
    Ok(())
}

pub fn df(args: ReportArgs) -> anyhow::Result<()> {
    report_targets(args, crate::show::df_table)
}

/// Prints every target's status as JSON with `--json`, else as `text` makes it.
fn report_targets(
    args: ReportArgs,
    text: impl Fn(&[flotilla_client::TargetStatus], Output) -> String,
) -> anyhow::Result<()> {
    let targets = args.meta.client()?.status()?;
    if args.output.json {
        println!("{}", crate::show::targets_json(&targets));
    } else {
        print!("{}", text(&targets, args.output));
    }
    Ok(())
}

/// What `du` found under a path.
#[derive(Default)]
struct Usage {
    bytes: u64,
    files: u64,
    directories: u64,
    symlinks: u64,
}

/// Walks `root` (symlinks not followed), adding up file sizes.
fn usage(client: &Client, root: &str) -> anyhow::Result<Usage> {
    let mut total = Usage::default();
    let mut pending = vec![root.to_string()];
    while let Some(path) = pending.pop() {
        let entry = client.stat(&path).with_context(|| format!("stat {path}"))?;
        match entry.attrs.kind {
            FileKind::File => {
                total.files += 1;
                total.bytes = total.bytes.saturating_add(entry.attrs.size_bytes);
            }
            // Special files (FIFOs, sockets, devices) have no bytes: counted with symlinks.
            FileKind::Symlink
            | FileKind::Fifo
            | FileKind::Socket
            | FileKind::CharDevice
            | FileKind::BlockDevice => total.symlinks += 1,
            FileKind::Directory => {
                total.directories += 1;
                let base = path.trim_end_matches('/');
                for child in client.readdir(&path).with_context(|| format!("list {path}"))? {
                    pending.push(format!("{base}/{}", child.name));
                }
            }
        }
    }
    Ok(total)
}

pub fn du(args: PathReportArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    let found = usage(&client, &args.path)?;
    if args.output.json {
        let report = serde_json::json!({
            "path": args.path,
            "size_bytes": found.bytes,
            "files": found.files,
            "directories": found.directories,
            "symlinks": found.symlinks,
        });
        println!("{report}");
        return Ok(());
    }
    println!(
        "{}\t{}\t({} files, {} directories, {} symlinks)",
        args.output.size(found.bytes),
        args.path,
        found.files,
        found.directories,
        found.symlinks
    );
    Ok(())
}

pub fn mkdir(args: MkdirArgs) -> anyhow::Result<()> {
    let mode =
        u32::from_str_radix(&args.mode, 8).with_context(|| format!("mode {:?} is not octal", args.mode))?;
    args.meta.client()?.mkdir(&args.path, mode)?;
    Ok(())
}

pub fn ls(args: PathArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    for entry in client.readdir(&args.path)? {
        let suffix = match entry.kind {
            FileKind::Directory => "/",
            FileKind::Symlink => "@",
            FileKind::Fifo => "|",
            FileKind::Socket => "=",
            FileKind::File | FileKind::CharDevice | FileKind::BlockDevice => "",
        };
        println!("{}{suffix}", entry.name);
    }
    Ok(())
}

pub fn stat(args: StatArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    if args.path == "-" {
        return stat_lines_of_stdin(&client, args.output);
    }
    let entry = client.stat(&args.path)?;
    print_stat(&client, &args.path, &entry, args.output);
    Ok(())
}

fn print_stat(client: &Client, path: &str, entry: &EntryInfo, output: Output) {
    if output.json {
        println!("{}", crate::show::stat_json(entry));
        return;
    }
    for line in crate::show::stat_lines(entry, output) {
        println!("{line}");
    }
    // Which tier holds the data, when the servers have an archive.
    if entry.attrs.kind == FileKind::File {
        if let Some(line) = crate::hsm::stat_line(client, path) {
            println!("{line}");
        }
    }
}

/// `stat -`: every path on stdin, in order. A path that fails is reported (on stdout as
/// `{"path", "error"}` with `--json`, else on stderr) and the next one is answered; the
/// command fails at the end if any did.
fn stat_lines_of_stdin(client: &Client, output: Output) -> anyhow::Result<()> {
    let mut failed = 0u64;
    for line in std::io::stdin().lines() {
        let line = line.context("read a path from stdin")?;
        let path = line.trim();
        if path.is_empty() {
            continue;
        }
        match client.stat(path) {
            Ok(entry) => print_stat(client, path, &entry, output),
            Err(error) => {
                failed += 1;
                match output.json {
                    true => println!("{}", serde_json::json!({ "path": path, "error": error.to_string() })),
                    false => eprintln!("flotilla stat: {path}: {error}"),
                }
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} of the paths could not be stat'ed");
    Ok(())
}

pub fn rm(args: PathArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    let entry = client.stat(&args.path)?;
    if entry.attrs.kind == FileKind::Directory {
        client.rmdir(&args.path)?;
    } else {
        client.remove(&args.path)?;
    }
    Ok(())
}

/// The layout `put` asks for, and its replica count (1 unless asked).
fn put_layout(args: &PutArgs) -> anyhow::Result<(Option<Layout>, u32)> {
    let (layout, replicas) = match &args.layout {
        Some(text) => {
            let replicated = flotilla_types::ReplicatedLayout::parse(text)?;
            (Some(replicated.layout), replicated.replicas)
        }
        None => (None, 1),
    };
    let replicas = match (args.replicas, replicas) {
        (Some(flag), 1) => flag,
        (Some(flag), text) if flag != text => {
            anyhow::bail!("--replicas {flag} and {text} in --layout disagree")
        }
        (_, text) => text,
    };
    Ok((plain_layout(args, layout)?, replicas))
}

fn plain_layout(args: &PutArgs, parsed: Option<Layout>) -> anyhow::Result<Option<Layout>> {
    match (parsed, args.stripe_unit) {
        (Some(_), Some(_)) => anyhow::bail!("give --layout or --stripe-unit, not both"),
        (Some(layout), None) => Ok(Some(layout)),
        (None, Some(unit_bytes)) => {
            let layout = Layout::Stripe { unit_bytes, count: 0 };
            layout.validate()?;
            Ok(Some(layout))
        }
        (None, None) => Ok(None),
    }
}

pub fn put(args: PutArgs) -> anyhow::Result<()> {
    let (layout, replicas) = put_layout(&args)?;
    anyhow::ensure!(
        layout != Some(Layout::Explicit),
        "put stores a linear file: the explicit layout has no linear view"
    );
    if replicas != 1 {
        // Checked here so a bad count is named before anything is sent.
        flotilla_types::ReplicatedLayout::new(layout.unwrap_or(default_layout()), replicas)?;
    }
    let client = args.meta.client()?;
    let local = std::fs::File::open(&args.local).with_context(|| format!("open {}", args.local.display()))?;
    let options = CreateOptions { subfiles: args.subfiles, layout, replicas, ..CreateOptions::default() };
    let sink = Sink::staged(&client, &args.path, &options)?;
    let total_bytes = local.metadata().map(|m| m.len()).unwrap_or(0);
    let progress = Progress::new(total_bytes);
    let mut chunk = vec![0u8; COPY_CHUNK_BYTES];
    stream(Source::Local(local), sink, &mut chunk, &progress)
        .with_context(|| format!("copy {} to {}", args.local.display(), args.path))?;
    progress.finish(1);
    Ok(())
}

/// `flotilla get`: the source is opened and found readable before the local file is
/// created, and a local file this copy created is removed if the copy fails.
pub fn get(args: GetArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    let file = crate::copy::open_readable(&client, &args.path)?;
    let existed = args.local.symlink_metadata().is_ok();
    let local =
        std::fs::File::create(&args.local).with_context(|| format!("create {}", args.local.display()))?;
    let progress = Progress::new(file.size());
    let mut chunk = vec![0u8; COPY_CHUNK_BYTES];
    let copied = stream(Source::Cluster(file, 0), Sink::Local(local), &mut chunk, &progress)
        .with_context(|| format!("copy {} to {}", args.path, args.local.display()));
    if copied.is_err() && !existed {
        let _ = std::fs::remove_file(&args.local);
    }
    copied?;
    progress.finish(1);
    Ok(())
}

pub fn fork(command: ForkCommand) -> anyhow::Result<()> {
    match command {
        ForkCommand::Ls { meta, path, subfile } => {
            let file = meta.client()?.open(&path)?;
            for index in subfiles(&file, subfile) {
                for fork in file.list_forks(index)? {
                    println!("subfile={index} fork={} size={}", fork.name, fork.size_bytes);
                }
            }
        }
        ForkCommand::Create { meta, path, name, subfile } => {
            let file = meta.client()?.open(&path)?;
            for index in subfiles(&file, subfile) {
                file.create_fork(index, &name)?;
            }
        }
        ForkCommand::Rm { meta, path, name, subfile } => {
            anyhow::ensure!(
                name != DEFAULT_FORK || subfile.is_some(),
                "refusing to remove the {DEFAULT_FORK} fork of every subfile; name one with --subfile"
            );
            let file = meta.client()?.open(&path)?;
            for index in subfiles(&file, subfile) {
                file.remove_fork(index, &name)?;
            }
        }
    }
    Ok(())
}

fn subfiles(file: &flotilla_client::File, only: Option<u32>) -> Vec<u32> {
    match only {
        Some(index) => vec![index],
        None => (0..file.subfile_count()).collect(),
    }
}

pub fn layout(command: LayoutCommand) -> anyhow::Result<()> {
    match command {
        LayoutCommand::Get { meta, path } => {
            let entry = meta.client()?.stat(&path)?;
            match entry.replicated_layout() {
                Some(layout) => println!("{layout}"),
                None => println!("none"),
            }
        }
        LayoutCommand::Set { meta, path, layout } => {
            // `,replicas=N` on a directory: its files keep N copies (issue 32).
            let layout =
                if layout == "none" { None } else { Some(flotilla_types::ReplicatedLayout::parse(&layout)?) };
            let entry = meta.client()?.set_layout_replicated(&path, layout)?;
            println!("{}", entry.replicated_layout().map_or("none".to_string(), |l| l.to_string()));
        }
    }
    Ok(())
}

/// The layout a file gets when neither it nor its directory names one (for messages).
fn default_layout() -> Layout {
    Layout::Stripe { unit_bytes: 1 << 20, count: 0 }
}
