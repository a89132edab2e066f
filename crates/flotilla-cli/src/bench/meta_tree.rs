//! `flotilla bench meta-tree LABEL=DIR...`: metadata and small-file rates through any mounted
//! directory (Flotilla's mount, MooseFS, GlusterFS, the local disk), measured by one program
//! in one run so the sides see the same machine load.
//!
//! Every round runs each side in turn. On a side, `--processes` worker processes (this
//! binary again, `--worker`) each work in a directory of their own and in one directory all
//! share (names prefixed by the process), `--items` items in each, through plain system
//! calls: file creates (`O_CREAT|O_EXCL`, close), stats, small writes (open, write
//! `--file-bytes`, close), small reads (open, read to the end, close), removals, directory
//! creates, directory renames (within their directory), directory removals. A barrier
//! between phases (the parent releases every worker at once and waits for all) times each
//! phase on its own: its rate is the operations of all processes over (latest end −
//! earliest start). The report gives, per side and phase, the median over rounds, and each
//! side's ratio to the first side.

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The phases, in the order every worker runs them.
pub const PHASES: [&str; 8] = ["create", "stat", "write", "read", "remove", "mkdir", "dir-rename", "rmdir"];

#[derive(Args, Clone, Debug)]
pub struct MetaTreeArgs {
    /// The sides to measure, each `LABEL=DIR` (a directory on the file system under test;
    /// the benchmark works in a fresh subdirectory and removes it). Ratios are to the first.
    #[arg(required_unless_present = "worker")]
    pub sides: Vec<String>,
    /// Worker processes per side.
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// Items (files, then directories) each process handles in its own directory and again
    /// in the shared one, per phase.
    #[arg(long, default_value_t = 2000)]
    pub items: usize,
    /// Bytes each small-file write puts in a file (and each read reads back).
    #[arg(long, default_value_t = 4096)]
    pub file_bytes: usize,
    /// Rounds (every side once per round); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Longest a phase may take on one side before the run is abandoned, in seconds.
    #[arg(long, default_value_t = 600)]
    pub phase_timeout_s: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Internal: run as one worker in this directory (`--worker DIR`).
    #[arg(long, hide = true)]
    pub worker: Option<PathBuf>,
    /// Internal: the worker's index.
    #[arg(long, hide = true, default_value_t = 0)]
    pub worker_index: usize,
}

struct Side {
    label: String,
    dir: PathBuf,
    /// The device of `dir` when the run began: a mount that went away under the run (its
    /// directory now the one beneath) is caught instead of measured as the other disk.
    device: u64,
}

fn parse_side(text: &str) -> anyhow::Result<Side> {
    let (label, dir) = text.split_once('=').with_context(|| {
        format!("side {text:?} is not LABEL=DIR (like local=/tmp/x or flotilla=/mnt/flotilla)")
    })?;
    let dir = PathBuf::from(dir);
    if label.is_empty() || !dir.is_dir() {
        bail!("side {text:?}: {} is not a directory", dir.display());
    }
    let device = std::fs::metadata(&dir)?.dev();
    Ok(Side { label: label.to_string(), dir, device })
}

pub fn run(args: MetaTreeArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.worker {
        return worker(dir, &args);
    }
    if args.processes == 0 || args.items == 0 || args.rounds == 0 {
        bail!("--processes, --items and --rounds must be at least 1");
    }
    let sides = args.sides.iter().map(|s| parse_side(s)).collect::<anyhow::Result<Vec<_>>>()?;
    // rates[side][phase] over rounds, operations per second.
    let mut rates = vec![vec![Vec::new(); PHASES.len()]; sides.len()];
    for round in 0..args.rounds {
        for (index, side) in sides.iter().enumerate() {
            let measured = run_side(side, round, &args)
                .with_context(|| format!("round {round} on {} ({})", side.label, side.dir.display()))?;
            let said: Vec<String> =
                PHASES.iter().zip(&measured).map(|(p, r)| format!("{p} {r:.0}")).collect();
            eprintln!(
                "meta-tree: round {} of {} on {}: {} (ops/s)",
                round + 1,
                args.rounds,
                side.label,
                said.join(", ")
            );
            for (phase, rate) in measured.into_iter().enumerate() {
                rates[index][phase].push(rate);
            }
        }
    }
    let medians: Vec<Vec<f64>> = rates.iter().map(|side| side.iter().map(|r| median(r)).collect()).collect();
    if args.json {
        let out: Vec<_> = sides
            .iter()
            .zip(&medians)
            .zip(&rates)
            .map(|((side, medians), rates)| {
                json!({
                    "label": side.label,
                    "dir": side.dir,
                    "phases": PHASES.iter().zip(medians).zip(rates).map(|((phase, median), all)| json!({
                        "phase": phase, "ops_per_s_median": median, "ops_per_s_rounds": all,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let out = json!({
            "processes": args.processes, "items": args.items, "file_bytes": args.file_bytes,
            "rounds": args.rounds, "sides": out,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "meta-tree: {} processes, {} items each in an own and in the shared directory, {} B files, median of {} rounds (ops/s)",
        args.processes, args.items, args.file_bytes, args.rounds
    );
    print!("{:<12}", "phase");
    for side in &sides {
        print!(" {:>14}", side.label);
    }
    for side in sides.iter().skip(1) {
        print!(" {:>12}", format!("{}/{}", side.label, sides[0].label));
    }
    println!();
    for (phase, name) in PHASES.iter().enumerate() {
        print!("{name:<12}");
        for side in &medians {
            print!(" {:>14.0}", side[phase]);
        }
        for side in medians.iter().skip(1) {
            print!(" {:>12.3}", side[phase] / medians[0][phase]);
        }
        println!();
    }
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A started worker: its stdin (one line per phase releases it) and its answers.
struct Worker {
    child: Child,
    input: ChildStdin,
    output: std::sync::mpsc::Receiver<String>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_reader(stdout: ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(PHASES.len() + 1);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// One side, one round: the phases' rates (ops/s of all processes).
fn run_side(side: &Side, round: usize, args: &MetaTreeArgs) -> anyhow::Result<Vec<f64>> {
    let base = side.dir.join(format!("meta-tree-{}-{round}", std::process::id()));
    std::fs::create_dir(&base).with_context(|| format!("creating {}", base.display()))?;
    std::fs::create_dir(base.join("shared"))?;
    let exe = std::env::current_exe().context("finding this program to start workers")?;
    let mut workers = Vec::with_capacity(args.processes);
    for index in 0..args.processes {
        let mut child = Command::new(&exe)
            .args(["bench", "meta-tree", "--worker"])
            .arg(&base)
            .args(["--worker-index", &index.to_string()])
            .args(["--items", &args.items.to_string(), "--file-bytes", &args.file_bytes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a worker")?;
        let input = child.stdin.take().context("worker stdin")?;
        let output = spawn_reader(child.stdout.take().context("worker stdout")?);
        workers.push(Worker { child, input, output });
    }
    let timeout = Duration::from_secs(args.phase_timeout_s);
    // Every worker says it is ready (its directory made) before the first phase.
    for worker in &mut workers {
        let line = worker.output.recv_timeout(timeout).context("a worker did not start")?;
        if line != "ready" {
            bail!("a worker failed to start: {line}");
        }
    }
    let mut rates = Vec::with_capacity(PHASES.len());
    for phase in PHASES {
        for worker in &mut workers {
            writeln!(worker.input, "{phase}").context("releasing a worker")?;
            worker.input.flush()?;
        }
        let (mut first, mut last) = (u128::MAX, 0u128);
        let mut ops = 0u64;
        for worker in &mut workers {
            let line = worker
                .output
                .recv_timeout(timeout)
                .with_context(|| format!("phase {phase}: a worker did not answer"))?;
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [start, end, count] = fields[..] else { bail!("phase {phase}: a worker failed: {line}") };
            first = first.min(start.parse()?);
            last = last.max(end.parse()?);
            ops += count.parse::<u64>()?;
        }
        let seconds = (last.saturating_sub(first)) as f64 / 1e9;
        rates.push(if seconds > 0.0 { ops as f64 / seconds } else { 0.0 });
    }
    drop(workers);
    if std::fs::metadata(&side.dir)?.dev() != side.device {
        bail!(
            "the file system at {} changed during the run (unmounted?): its figures are not kept",
            side.dir.display()
        );
    }
    std::fs::remove_dir_all(&base).with_context(|| format!("removing {}", base.display()))?;
    Ok(rates)
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// One worker: waits for each phase's name on stdin, runs it, answers `START END OPS`
/// (nanoseconds since the epoch) or the error.
fn worker(base: &Path, args: &MetaTreeArgs) -> anyhow::Result<()> {
    let own = base.join(format!("p{}", args.worker_index));
    let shared = base.join("shared");
    let prefix = format!("p{}-", args.worker_index);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if let Err(error) = std::fs::create_dir(&own) {
        writeln!(out, "error creating {}: {error}", own.display())?;
        return Ok(());
    }
    writeln!(out, "ready")?;
    out.flush()?;
    // The items: every name in the own directory, then in the shared one.
    let files: Vec<PathBuf> = (0..args.items)
        .map(|i| own.join(format!("f{i}")))
        .chain((0..args.items).map(|i| shared.join(format!("{prefix}f{i}"))))
        .collect();
    let dirs: Vec<PathBuf> = (0..args.items)
        .map(|i| own.join(format!("d{i}")))
        .chain((0..args.items).map(|i| shared.join(format!("{prefix}d{i}"))))
        .collect();
    let moved = |path: &Path| {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".moved");
        path.with_file_name(name)
    };
    let payload = vec![0x5au8; args.file_bytes];
    let mut buffer = vec![0u8; args.file_bytes.max(1)];
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let phase = line?;
        let start = now_ns();
        let done: std::io::Result<u64> = (|| {
            match phase.as_str() {
                "create" => {
                    for path in &files {
                        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(path)?;
                    }
                }
                "stat" => {
                    for path in &files {
                        std::fs::symlink_metadata(path)?;
                    }
                }
                "write" => {
                    for path in &files {
                        std::fs::OpenOptions::new().write(true).open(path)?.write_all(&payload)?;
                    }
                }
                "read" => {
                    for path in &files {
                        let mut file = std::fs::File::open(path)?;
                        let mut total = 0;
                        loop {
                            let n = file.read(&mut buffer)?;
                            if n == 0 {
                                break;
                            }
                            total += n;
                        }
                        if total != args.file_bytes {
                            return Err(std::io::Error::other(format!(
                                "{} holds {total} bytes, {} were written",
                                path.display(),
                                args.file_bytes
                            )));
                        }
                    }
                }
                "remove" => {
                    for path in &files {
                        std::fs::remove_file(path)?;
                    }
                }
                "mkdir" => {
                    for path in &dirs {
                        std::fs::create_dir(path)?;
                    }
                }
                "dir-rename" => {
                    for path in &dirs {
                        std::fs::rename(path, moved(path))?;
                    }
                }
                "rmdir" => {
                    for path in &dirs {
                        std::fs::remove_dir(moved(path))?;
                    }
                }
                other => return Err(std::io::Error::other(format!("unknown phase {other:?}"))),
            }
            Ok(
                if phase == "create"
                    || phase == "stat"
                    || phase == "write"
                    || phase == "read"
                    || phase == "remove"
                {
                    files.len() as u64
                } else {
                    dirs.len() as u64
                },
            )
        })();
        let end = now_ns();
        match done {
            Ok(ops) => writeln!(out, "{start} {end} {ops}")?,
            Err(error) => writeln!(out, "error in {phase}: {error}")?,
        }
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn sides_need_a_label_and_a_directory() {
        assert!(parse_side("nolabel").is_err());
        assert!(parse_side("x=/nonexistent/dir/of/meta-tree").is_err());
        let dir = tempfile::tempdir().unwrap();
        let side = parse_side(&format!("local={}", dir.path().display())).unwrap();
        assert_eq!(side.label, "local");
    }
}
