//! `flotilla bench meta`: an mdtest-style metadata benchmark.
//!
//! `--clients` processes (`flotilla bench-meta-worker`), each in a directory of its own (or
//! all in one with `--shared-dir`), run the phases in order — file creates (create + close
//! of empty files), file stats, file renames (within the directory), directory creates,
//! file removes, directory removes — with a barrier between phases, so
//! each phase is timed on its own: its rate is the operations of all processes over (latest
//! end − earliest start). With `--local DIR` every round also runs the same phases with
//! `std::fs` in a directory under `DIR`, so the ratio to the local disk is measured side by
//! side. Each round checks that every process found all its files after the creates.
//! `--prefill N` puts N entries in every directory before the first round (many threads
//! creating at once, which the metadata service's group commit batches), so the rates are
//! measured in directories that already hold N entries.

use super::cluster::{Cluster, ClusterSpec, Embedded, ProcessUsage};
use super::report::summary;
use anyhow::Context;
use clap::Args;
use flotilla_client::{Client, CreateOptions};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The phases, in the order every process runs them.
pub const PHASES: [Phase; 6] = [
    Phase::FileCreate,
    Phase::FileStat,
    Phase::FileRename,
    Phase::DirCreate,
    Phase::FileRemove,
    Phase::DirRemove,
];

/// Threads (each with its own connection) that create the `--prefill` entries.
const PREFILL_THREADS: u64 = 16;

#[derive(Args, Clone, Debug)]
pub struct MetaArgs {
    /// Use this running cluster instead of starting an embedded one.
    #[arg(long, env = "FLOTILLA_META")]
    pub meta: Option<String>,
    /// I/O servers of the embedded cluster.
    #[arg(long, default_value_t = 4)]
    pub servers: usize,
    /// Client processes, each in its own directory (or all in one with `--shared-dir`).
    #[arg(long, default_value_t = 4)]
    pub clients: u64,
    /// All client processes work in one directory (names prefixed by the process).
    #[arg(long)]
    pub shared_dir: bool,
    /// Entries put in every directory before the first round (not timed).
    #[arg(long, default_value_t = 0)]
    pub prefill: u64,
    /// Files (and directories) each process creates, stats and removes per round.
    #[arg(long, default_value_t = 1000)]
    pub files_per_client: u64,
    /// Subfiles of each created file: 0 (as the POSIX mount creates) is the directory's
    /// layout count, else one per live target; 1 is `CreateOptions::default()`.
    #[arg(long, default_value_t = 0)]
    pub subfiles: u32,
    /// Rounds; the median, min and max of each phase's rate are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Also run every round's phases with std::fs in a new directory under DIR (the local
    /// disk baseline), side by side.
    #[arg(long)]
    pub local: Option<PathBuf>,
    /// Longest one phase of one round may take, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub phase_timeout_s: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One timed phase.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    FileCreate,
    FileStat,
    FileRename,
    DirCreate,
    FileRemove,
    DirRemove,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::FileCreate => "file_create",
            Phase::FileStat => "file_stat",
            Phase::FileRename => "file_rename",
            Phase::DirCreate => "dir_create",
            Phase::FileRemove => "file_remove",
            Phase::DirRemove => "dir_remove",
        }
    }
}

/// What one process reports after one phase.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PhaseReport {
    pub phase: Phase,
    pub start_ns: u128,
    pub end_ns: u128,
    pub ops: u64,
    /// Entries in the process's directory after the stat phase (counted after the timing;
    /// 0 after the other phases).
    pub entries: u64,
}

/// Phase rates of one system over the rounds, and entries found after the creates.
#[derive(Default, Debug)]
struct Rates {
    per_phase: Vec<Vec<f64>>,
    files_found: Vec<u64>,
    /// Per phase and round, what the embedded metadata service used per operation:
    /// load-independent figures beside the rates, which a shared machine moves.
    service: Vec<Vec<ServicePerOp>>,
}

/// CPU time and bytes written by the metadata service during a phase, per operation.
#[derive(Clone, Copy, Debug, Default)]
struct ServicePerOp {
    cpu_us: f64,
    written_bytes: f64,
}

impl ServicePerOp {
    fn of(used: ProcessUsage, ops: u64) -> ServicePerOp {
        let ops = ops.max(1) as f64;
        ServicePerOp {
            cpu_us: used.cpu_ns as f64 / 1000.0 / ops,
            written_bytes: used.written_bytes as f64 / ops,
        }
    }
}

impl Rates {
    fn new() -> Rates {
        Rates {
            per_phase: vec![Vec::new(); PHASES.len()],
            files_found: Vec::new(),
            service: vec![Vec::new(); PHASES.len()],
        }
    }

    /// Medians over the rounds of the service's CPU (µs) and bytes written per operation.
    fn service_medians(&self, index: usize) -> Option<(f64, f64)> {
        let rounds = &self.service[index];
        if rounds.is_empty() {
            return None;
        }
        let cpu: Vec<f64> = rounds.iter().map(|r| r.cpu_us).collect();
        let written: Vec<f64> = rounds.iter().map(|r| r.written_bytes).collect();
        Some((summary(&cpu).0, summary(&written).0))
    }
}

pub fn run(args: MetaArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    let cluster = match &args.meta {
        Some(meta) => Cluster::Attached { meta: meta.clone() },
        None => Cluster::Embedded(Embedded::start(ClusterSpec {
            servers: args.servers,
            target_kind: "dir".into(),
            cache_bytes: 64 << 20,
        })?),
    };
    let outcome = measure(&args, &cluster);
    cluster.stop();
    let (flotilla, local) = outcome?;
    let report = report_json(&args, &flotilla, local.as_ref());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report_text(&args, &flotilla, local.as_ref()));
    }
    Ok(())
}

fn check_args(args: &MetaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(args.files_per_client >= 1, "--files-per-client must be at least 1");
    anyhow::ensure!(args.phase_timeout_s >= 1, "--phase-timeout-s must be at least 1");
    if let Some(dir) = &args.local {
        anyhow::ensure!(dir.is_dir(), "--local {}: not a directory", dir.display());
    }
    Ok(())
}

/// Every round: the phases on the cluster, then (with `--local`) on the local directory.
fn measure(args: &MetaArgs, cluster: &Cluster) -> anyhow::Result<(Rates, Option<Rates>)> {
    let client = cluster.client()?;
    let base = format!("/bench-meta-{}", std::process::id());
    let dirs = directories(args);
    make_flotilla_dirs(&client, &base, &dirs)?;
    let local_base = args.local.as_ref().map(|d| d.join(format!("bench-meta-{}", std::process::id())));
    if let Some(local_base) = &local_base {
        make_local_dirs(local_base, &dirs)?;
    }
    prefill(args, cluster, &base, local_base.as_deref(), &dirs, false)?;
    let outcome = rounds(args, cluster, &base, local_base.as_deref());
    if outcome.is_err() {
        // Best effort: a failed round leaves its files, which a local disk would keep.
        if let Some(local_base) = &local_base {
            let _ = std::fs::remove_dir_all(local_base);
        }
        return outcome;
    }
    prefill(args, cluster, &base, local_base.as_deref(), &dirs, true)?;
    remove_flotilla_dirs(&client, &base, &dirs)?;
    if let Some(local_base) = &local_base {
        remove_local_dirs(local_base, &dirs)?;
    }
    outcome
}

fn rounds(
    args: &MetaArgs,
    cluster: &Cluster,
    base: &str,
    local_base: Option<&std::path::Path>,
) -> anyhow::Result<(Rates, Option<Rates>)> {
    let mut flotilla = Rates::new();
    let mut local = local_base.map(|_| Rates::new());
    for round in 0..args.runs {
        let started = Instant::now();
        round_on(args, Some(cluster), base, &mut flotilla).with_context(|| format!("round {}", round + 1))?;
        if let (Some(local_base), Some(local)) = (local_base, &mut local) {
            round_on(args, None, &local_base.display().to_string(), local)
                .with_context(|| format!("local round {}", round + 1))?;
        }
        eprintln!("round {}/{} done in {:.1} s", round + 1, args.runs, started.elapsed().as_secs_f64());
    }
    Ok((flotilla, local))
}

/// The client directories, relative to the benchmark's base directory (`c0`, `c1`, ...).
fn client_dirs(clients: u64) -> Vec<String> {
    (0..clients).map(|c| format!("c{c}")).collect()
}

/// The directories the round works in: one per client, or the one shared directory.
fn directories(args: &MetaArgs) -> Vec<String> {
    if args.shared_dir {
        vec!["shared".to_string()]
    } else {
        client_dirs(args.clients)
    }
}

/// The directory and name prefix of client `index`.
fn client_place(args: &MetaArgs, index: u64) -> (String, String) {
    if args.shared_dir {
        ("shared".to_string(), format!("c{index}-"))
    } else {
        (format!("c{index}"), String::new())
    }
}

/// Creates (or, with `remove`, removes) the `--prefill` entries `p{i}` of every directory,
/// on the cluster with `PREFILL_THREADS` threads at once and on the local directory.
fn prefill(
    args: &MetaArgs,
    cluster: &Cluster,
    base: &str,
    local_base: Option<&std::path::Path>,
    dirs: &[String],
    remove: bool,
) -> anyhow::Result<()> {
    if args.prefill == 0 {
        return Ok(());
    }
    let started = Instant::now();
    let paths: Vec<String> = dirs.iter().map(|dir| format!("{base}/{dir}")).collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..PREFILL_THREADS)
            .map(|thread| {
                let paths = &paths;
                scope.spawn(move || -> anyhow::Result<()> {
                    let client = cluster.client()?;
                    for index in (thread..args.prefill).step_by(PREFILL_THREADS as usize) {
                        for dir in paths {
                            let path = format!("{dir}/p{index:07}");
                            if remove {
                                client.remove(&path).with_context(|| format!("remove {path}"))?;
                            } else {
                                client.create(&path, &CreateOptions::default())?.close()?;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|thread| thread.join().map_err(|_| anyhow::anyhow!("a prefill thread panicked"))?)
    })?;
    if let Some(local_base) = local_base {
        for dir in dirs {
            for index in 0..args.prefill {
                let path = local_base.join(dir).join(format!("p{index:07}"));
                if remove {
                    std::fs::remove_file(&path)
                } else {
                    std::fs::File::create_new(&path).map(|_| ())
                }
                .with_context(|| format!("prefill {}", path.display()))?;
            }
        }
    }
    let what = if remove { "removed" } else { "created" };
    eprintln!(
        "prefill: {what} {} entries in each of {} directories in {:.1} s",
        args.prefill,
        dirs.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn make_flotilla_dirs(client: &Client, base: &str, dirs: &[String]) -> anyhow::Result<()> {
    client.mkdir(base, 0o755).with_context(|| format!("mkdir {base}"))?;
    for dir in dirs {
        client.mkdir(&format!("{base}/{dir}"), 0o755).with_context(|| format!("mkdir {base}/{dir}"))?;
    }
    Ok(())
}

fn remove_flotilla_dirs(client: &Client, base: &str, dirs: &[String]) -> anyhow::Result<()> {
    for dir in dirs {
        client.rmdir(&format!("{base}/{dir}")).with_context(|| format!("rmdir {base}/{dir}"))?;
    }
    client.rmdir(base).with_context(|| format!("rmdir {base}"))?;
    Ok(())
}

fn make_local_dirs(base: &std::path::Path, dirs: &[String]) -> anyhow::Result<()> {
    std::fs::create_dir(base).with_context(|| format!("mkdir {}", base.display()))?;
    for dir in dirs {
        std::fs::create_dir(base.join(dir)).with_context(|| format!("mkdir {}/{dir}", base.display()))?;
    }
    Ok(())
}

fn remove_local_dirs(base: &std::path::Path, dirs: &[String]) -> anyhow::Result<()> {
    for dir in dirs {
        std::fs::remove_dir(base.join(dir)).with_context(|| format!("rmdir {}/{dir}", base.display()))?;
    }
    std::fs::remove_dir(base).with_context(|| format!("rmdir {}", base.display()))?;
    Ok(())
}

/// One round on the cluster (`Some`) or the local directory (`None`): every phase, each
/// released to all processes at once, its rate recorded.
fn round_on(args: &MetaArgs, cluster: Option<&Cluster>, base: &str, rates: &mut Rates) -> anyhow::Result<()> {
    let mut workers = Workers::spawn(args, cluster, base)?;
    let outcome = run_phases(args, cluster, &mut workers, rates);
    workers.finish(outcome.is_err());
    outcome
}

fn run_phases(
    args: &MetaArgs,
    cluster: Option<&Cluster>,
    workers: &mut Workers,
    rates: &mut Rates,
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.phase_timeout_s);
    workers.await_lines("ready", timeout)?;
    for (index, phase) in PHASES.iter().enumerate() {
        let before = cluster.and_then(Cluster::meta_usage);
        workers.go()?;
        let reports = workers.collect(timeout)?;
        if let (Some(before), Some(after)) = (before, cluster.and_then(Cluster::meta_usage)) {
            let ops = args.clients * args.files_per_client;
            rates.service[index].push(ServicePerOp::of(after.since(before), ops));
        }
        anyhow::ensure!(
            reports.iter().all(|r| r.phase == *phase && r.ops == args.files_per_client),
            "{}: a process reported another phase or count: {reports:?}",
            phase.name()
        );
        if *phase == Phase::FileStat {
            let sharing = if args.shared_dir { args.clients } else { 1 };
            let expected = sharing * args.files_per_client + args.prefill;
            anyhow::ensure!(
                reports.iter().all(|r| r.entries == expected),
                "after the creates a process found another number of entries than {expected}: {reports:?}"
            );
            rates.files_found.push(reports.iter().map(|r| r.entries).sum::<u64>() / sharing);
        }
        rates.per_phase[index].push(phase_rate(&reports));
    }
    Ok(())
}

/// Operations of all processes over (latest end − earliest start), per second.
pub fn phase_rate(reports: &[PhaseReport]) -> f64 {
    let start = reports.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = reports.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let ops: u64 = reports.iter().map(|r| r.ops).sum();
    let seconds = end.saturating_sub(start) as f64 / 1e9;
    if seconds > 0.0 {
        ops as f64 / seconds
    } else {
        0.0
    }
}

enum Line {
    Text(usize, String),
    Closed(usize),
}

/// The benchmark processes of one round.
struct Workers {
    children: Vec<(Child, ChildStdin)>,
    lines: mpsc::Receiver<Line>,
}

impl Workers {
    fn spawn(args: &MetaArgs, cluster: Option<&Cluster>, base: &str) -> anyhow::Result<Workers> {
        let exe = std::env::current_exe().context("find the flotilla executable")?;
        let (sender, lines) = mpsc::channel();
        let mut children = Vec::new();
        for index in 0..args.clients as usize {
            let (dir, prefix) = client_place(args, index as u64);
            let mut command = worker_command(&exe, cluster);
            command
                .args(["--dir", &format!("{base}/{dir}")])
                .args(["--prefix", &prefix])
                .args(["--files", &args.files_per_client.to_string()])
                .args(["--subfiles", &args.subfiles.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            let mut child = command.spawn().context("start a benchmark client process")?;
            let stdout = child.stdout.take().context("no stdout")?;
            let stdin = child.stdin.take().context("no stdin")?;
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if sender.send(Line::Text(index, line)).is_err() {
                        return;
                    }
                }
                let _ = sender.send(Line::Closed(index));
            });
            children.push((child, stdin));
        }
        Ok(Workers { children, lines })
    }

    /// Waits until every process said `expected`.
    fn await_lines(&mut self, expected: &str, timeout: Duration) -> anyhow::Result<()> {
        let mut heard = vec![false; self.children.len()];
        while heard.iter().any(|h| !h) {
            let (index, line) = match self.next_line(timeout)? {
                Line::Text(index, line) => (index, line),
                Line::Closed(index) => return Err(self.exited(index)),
            };
            anyhow::ensure!(line == expected, "client {index} said {line:?}, expected {expected:?}");
            heard[index] = true;
        }
        Ok(())
    }

    /// One phase report from every process (a process may exit after its last report).
    fn collect(&mut self, timeout: Duration) -> anyhow::Result<Vec<PhaseReport>> {
        let mut reports: Vec<Option<PhaseReport>> = vec![None; self.children.len()];
        while reports.iter().any(Option::is_none) {
            let (index, line) = match self.next_line(timeout)? {
                Line::Text(index, line) => (index, line),
                Line::Closed(index) if reports[index].is_some() => continue,
                Line::Closed(index) => return Err(self.exited(index)),
            };
            let json =
                line.strip_prefix("phase ").with_context(|| format!("client {index} said {line:?}"))?;
            reports[index] = Some(serde_json::from_str(json).context("read a client's phase report")?);
        }
        Ok(reports.into_iter().flatten().collect())
    }

    fn next_line(&mut self, timeout: Duration) -> anyhow::Result<Line> {
        self.lines.recv_timeout(timeout).context("a benchmark client stopped answering")
    }

    fn exited(&mut self, index: usize) -> anyhow::Error {
        match self.children[index].0.wait() {
            Ok(status) => {
                anyhow::anyhow!("benchmark client {index} exited ({status}) in the middle of a round")
            }
            Err(error) => anyhow::anyhow!("benchmark client {index} vanished: {error}"),
        }
    }

    /// Releases every process into its next phase.
    fn go(&mut self) -> anyhow::Result<()> {
        for (_, stdin) in &mut self.children {
            writeln!(stdin, "go").and_then(|()| stdin.flush()).context("release a client")?;
        }
        Ok(())
    }

    fn finish(self, kill: bool) {
        for (mut child, stdin) in self.children {
            drop(stdin);
            if kill {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

fn worker_command(exe: &std::path::Path, cluster: Option<&Cluster>) -> Command {
    let mut command = Command::new(exe);
    let Some(cluster) = cluster else {
        command.args(["bench-meta-worker", "--local"]);
        return command;
    };
    if let Some(key) = cluster.client_key() {
        command.arg("--key").arg(key);
    }
    if let Some(config) = cluster.config_file() {
        command.arg("--config").arg(config);
    }
    command.args(["bench-meta-worker", "--meta", cluster.meta_addr()]);
    command
}

fn rates_json(rates: &[f64]) -> Value {
    let (median, min, max) = summary(rates);
    json!({"median_ops_per_s": median, "min_ops_per_s": min, "max_ops_per_s": max, "runs_ops_per_s": rates})
}

fn ratio(flotilla: &[f64], local: &[f64]) -> Value {
    let (a, b) = (summary(flotilla).0, summary(local).0);
    if b > 0.0 {
        json!(a / b)
    } else {
        Value::Null
    }
}

fn report_json(args: &MetaArgs, flotilla: &Rates, local: Option<&Rates>) -> Value {
    let phases: Vec<Value> = PHASES
        .iter()
        .enumerate()
        .map(|(index, phase)| {
            let mut object = json!({
                "phase": phase.name(),
                "ops_per_round": args.clients * args.files_per_client,
                "flotilla": rates_json(&flotilla.per_phase[index]),
            });
            if let Some((cpu_us, written_bytes)) = flotilla.service_medians(index) {
                object["service_cpu_us_per_op"] = json!(cpu_us);
                object["service_written_bytes_per_op"] = json!(written_bytes);
            }
            if let Some(local) = local {
                object["local"] = rates_json(&local.per_phase[index]);
                object["flotilla_over_local"] = ratio(&flotilla.per_phase[index], &local.per_phase[index]);
            }
            object
        })
        .collect();
    json!({
        "workload": "meta",
        "cluster": if args.meta.is_some() { "attached" } else { "embedded" },
        "servers": if args.meta.is_some() { Value::Null } else { json!(args.servers) },
        "clients": args.clients,
        "files_per_client": args.files_per_client,
        "shared_dir": args.shared_dir,
        "prefill": args.prefill,
        "subfiles": args.subfiles,
        "runs": args.runs,
        "local_dir": args.local.as_ref().map(|d| d.display().to_string()),
        "files_found": flotilla.files_found,
        "local_files_found": local.map(|l| l.files_found.clone()),
        "phases": phases,
    })
}

fn report_text(args: &MetaArgs, flotilla: &Rates, local: Option<&Rates>) -> String {
    let mut out = format!(
        "bench meta: {} clients x {} files ({} subfiles each), {}, {} entries prefilled, {} rounds (medians, ops/s; min-max in brackets; svc: the embedded metadata service's CPU time and bytes written per operation)\n",
        args.clients,
        args.files_per_client,
        args.subfiles,
        if args.shared_dir { "one shared directory" } else { "one directory each" },
        args.prefill,
        args.runs
    );
    out.push_str(&format!(
        "{:<12} {:>30} {:>30} {:>8} {:>12} {:>14}\n",
        "phase", "flotilla", "local", "ratio", "svc cpu us", "svc written B"
    ));
    for (index, phase) in PHASES.iter().enumerate() {
        let cell = |rates: &[f64]| {
            let (median, min, max) = summary(rates);
            format!("{median:.0} [{min:.0}-{max:.0}]")
        };
        let (local_cell, ratio_cell) = match local {
            Some(local) => (
                cell(&local.per_phase[index]),
                format!(
                    "{:.3}",
                    ratio(&flotilla.per_phase[index], &local.per_phase[index]).as_f64().unwrap_or(0.0)
                ),
            ),
            None => ("-".to_string(), "-".to_string()),
        };
        let (cpu_cell, written_cell) = match flotilla.service_medians(index) {
            Some((cpu_us, written_bytes)) => (format!("{cpu_us:.1}"), format!("{written_bytes:.0}")),
            None => ("-".to_string(), "-".to_string()),
        };
        out.push_str(&format!(
            "{:<12} {:>30} {:>30} {:>8} {:>12} {:>14}\n",
            phase.name(),
            cell(&flotilla.per_phase[index]),
            local_cell,
            ratio_cell,
            cpu_cell,
            written_cell
        ));
    }
    out
}

/// Options of one benchmark process (`flotilla bench-meta-worker`).
#[derive(Args)]
#[command(group(clap::ArgGroup::new("system").required(true).args(["meta", "local"])))]
pub struct MetaWorkerArgs {
    /// Run on this cluster, through the library.
    #[arg(long)]
    meta: Option<String>,
    /// Run on the local file system with std::fs.
    #[arg(long)]
    local: bool,
    /// The process's directory (it exists; its own, or shared with the other processes).
    #[arg(long)]
    dir: String,
    /// Prefix of the names this process makes (processes sharing a directory differ in it).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Files and directories per phase.
    #[arg(long)]
    files: u64,
    /// Subfiles of each created file (0: the layout's count, else every live target).
    #[arg(long, default_value_t = 0)]
    subfiles: u32,
}

/// The operations a process runs: through the library or std::fs.
trait Ops {
    /// Runs `phase` on `path`; a rename moves it to `to`.
    fn run(&self, phase: Phase, path: &str, to: &str) -> anyhow::Result<()>;
    fn entries(&self, dir: &str) -> anyhow::Result<u64>;
}

/// The library, creating files with these options.
struct Library {
    client: Client,
    create: CreateOptions,
}

impl Ops for Library {
    fn run(&self, phase: Phase, path: &str, to: &str) -> anyhow::Result<()> {
        let client = &self.client;
        match phase {
            Phase::FileCreate => client.create(path, &self.create)?.close()?,
            Phase::FileStat => client.stat(path).map(|_| ())?,
            Phase::FileRename => client.rename(path, to)?,
            Phase::DirCreate => client.mkdir(path, 0o755).map(|_| ())?,
            Phase::FileRemove => client.remove(path)?,
            Phase::DirRemove => client.rmdir(path)?,
        }
        Ok(())
    }

    fn entries(&self, dir: &str) -> anyhow::Result<u64> {
        Ok(self.client.readdir(dir)?.len() as u64)
    }
}

struct LocalFs;

impl Ops for LocalFs {
    fn run(&self, phase: Phase, path: &str, to: &str) -> anyhow::Result<()> {
        match phase {
            Phase::FileCreate => std::fs::File::create_new(path).map(|_| ())?,
            Phase::FileStat => std::fs::metadata(path).map(|_| ())?,
            Phase::FileRename => std::fs::rename(path, to)?,
            Phase::DirCreate => std::fs::create_dir(path)?,
            Phase::FileRemove => std::fs::remove_file(path)?,
            Phase::DirRemove => std::fs::remove_dir(path)?,
        }
        Ok(())
    }

    fn entries(&self, dir: &str) -> anyhow::Result<u64> {
        Ok(std::fs::read_dir(dir)?.count() as u64)
    }
}

/// The path a phase works on: files `f{i}` (renamed to `r{i}`, then removed), directories
/// `d{i}`, each name after the process's prefix.
pub fn phase_path(dir: &str, prefix: &str, phase: Phase, index: u64) -> String {
    match phase {
        Phase::FileCreate | Phase::FileStat | Phase::FileRename => format!("{dir}/{prefix}f{index:07}"),
        Phase::FileRemove => format!("{dir}/{prefix}r{index:07}"),
        Phase::DirCreate | Phase::DirRemove => format!("{dir}/{prefix}d{index:07}"),
    }
}

/// A benchmark process: says `ready`, then per phase waits for `go`, runs it and prints
/// `phase {json}`.
pub fn meta_worker(args: MetaWorkerArgs) -> anyhow::Result<()> {
    let ops: Box<dyn Ops> = match &args.meta {
        Some(meta) => Box::new(Library {
            client: crate::keys::client(meta)?,
            create: CreateOptions { subfiles: args.subfiles, ..CreateOptions::default() },
        }),
        None => Box::new(LocalFs),
    };
    super::worker::say("ready")?;
    for phase in PHASES {
        super::worker::wait_go()?;
        let start_ns = super::worker::now_ns();
        for index in 0..args.files {
            let path = phase_path(&args.dir, &args.prefix, phase, index);
            let to = phase_path(&args.dir, &args.prefix, Phase::FileRemove, index);
            ops.run(phase, &path, &to).with_context(|| format!("{} {path}", phase.name()))?;
        }
        let end_ns = super::worker::now_ns();
        let entries = match phase {
            Phase::FileStat => ops.entries(&args.dir).with_context(|| format!("list {}", args.dir))?,
            _ => 0,
        };
        let report = PhaseReport { phase, start_ns, end_ns, ops: args.files, entries };
        super::worker::say(&format!("phase {}", serde_json::to_string(&report)?))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(start_ns: u128, end_ns: u128, ops: u64) -> PhaseReport {
        PhaseReport { phase: Phase::FileCreate, start_ns, end_ns, ops, entries: 0 }
    }

    #[test]
    fn a_phase_rate_spans_the_earliest_start_to_the_latest_end() {
        let reports = [report(1_000_000_000, 2_000_000_000, 100), report(1_500_000_000, 3_000_000_000, 300)];
        assert!((phase_rate(&reports) - 200.0).abs() < 1e-9);
        assert_eq!(phase_rate(&[report(5, 5, 10)]), 0.0);
    }

    #[test]
    fn phase_paths_keep_files_and_directories_apart() {
        assert_eq!(phase_path("/b/c0", "", Phase::FileStat, 7), "/b/c0/f0000007");
        assert_eq!(phase_path("/b/c0", "", Phase::DirRemove, 7), "/b/c0/d0000007");
        assert_eq!(phase_path("/b/s", "c3-", Phase::FileCreate, 7), "/b/s/c3-f0000007");
        assert_eq!(phase_path("/b/s", "c3-", Phase::FileRemove, 7), "/b/s/c3-r0000007");
    }

    #[test]
    fn the_ratio_is_of_medians_and_absent_without_a_baseline() {
        assert_eq!(ratio(&[10.0, 30.0, 20.0], &[40.0, 40.0, 100.0]), json!(0.5));
        assert_eq!(ratio(&[10.0], &[]), Value::Null);
    }
}
