//! Running points: setting up their files, launching the client processes, the start and
//! iteration barriers, collecting reports, and checking what was written.
//!
//! The rate of one run is total bytes over (latest end − earliest start) across the client
//! processes, opens and closes included (GPFS §3.1); process start-up is not (every client
//! is connected and waiting before `go`), nor is the time clients spend making and checking
//! data (`excluded_ns`). Clients stay up after their report until every client has reported:
//! then each checks the reads it kept for after the run and exits (`release`), so that
//! neither takes CPU from a client still being timed.

use super::cluster::Cluster;
use super::data::{fill, first_mismatch, pattern_key};
use super::plan::{client_path, file_layout, Place, PointSpec, SEED_INITIAL, SEED_WRITTEN};
use super::worker::WorkerReport;
use anyhow::Context;
use flotilla_client::{Client, CreateOptions, File, Layout, Shape, DEFAULT_FORK};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes moved per setup or check request.
const CHUNK_BYTES: u64 = 4 << 20;
/// Longest a run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub bytes_per_s: f64,
    /// Mean over clients of think time over elapsed time (RAMA's CPU utilization).
    pub cpu_utilization: f64,
    pub seconds: f64,
}

/// A point on a cluster: its spec, its clients and its file's path.
pub struct Point<'a> {
    pub spec: &'a PointSpec,
    pub clients: u64,
    pub path: String,
}

impl Point<'_> {
    fn paths(&self) -> Vec<String> {
        let own =
            matches!(self.spec, PointSpec::Gpfs(s) if s.pattern == super::plan::GpfsPattern::FilePerProcess);
        if own {
            (0..self.clients).map(|c| client_path(self.spec, &self.path, c)).collect()
        } else {
            vec![self.path.clone()]
        }
    }

    /// Bytes of each file: shared ones hold everything, per-process ones their share.
    fn bytes_per_file(&self) -> u64 {
        let total = self.spec.file_bytes(self.clients);
        if self.paths().len() > 1 {
            total / self.clients
        } else {
            total
        }
    }

    fn remove_files(&self, client: &Client) {
        for path in self.paths() {
            let _ = client.remove(&path);
        }
    }

    /// Creates the point's files: filled with the initial data, or empty when the clients
    /// write them (GPFS clients create their own).
    pub fn prepare(&self, client: &Client) -> anyhow::Result<()> {
        self.remove_files(client);
        if self.spec.needs_initial_data() {
            for path in self.paths() {
                let file = create(client, self.spec, &path)?;
                write_pattern(&file, self.spec, self.bytes_per_file(), SEED_INITIAL)?;
            }
        } else if !matches!(self.spec, PointSpec::Gpfs(_)) {
            create(client, self.spec, &self.path)?.close()?;
        }
        Ok(())
    }

    /// Before a run: write-new runs start from no file (or an empty one); LU starts from the
    /// initial matrix.
    pub fn reset(&self, client: &Client, first_run: bool) -> anyhow::Result<()> {
        let rewrite = matches!(self.spec, PointSpec::RamaLu(_))
            || (self.spec.writes() && !self.spec.needs_initial_data());
        if rewrite && !first_run {
            self.prepare(client)?;
        }
        Ok(())
    }

    /// After the runs: every byte written is checked, then the files are removed.
    pub fn finish(&self, client: &Client) -> anyhow::Result<()> {
        if self.spec.writes() {
            for path in self.paths() {
                let file = client.open(&path)?;
                check_pattern(&file, self.spec, self.bytes_per_file(), SEED_WRITTEN)
                    .with_context(|| format!("check what was written to {path}"))?;
            }
        }
        self.remove_files(client);
        Ok(())
    }
}

fn create(client: &Client, spec: &PointSpec, path: &str) -> anyhow::Result<File> {
    let (subfiles, layout) = file_layout(spec)?;
    let options = CreateOptions { subfiles, layout: Some(layout), ..CreateOptions::default() };
    client.create(path, &options).with_context(|| format!("create {path}"))
}

/// Places of a file's data: each fork for explicit files, the linear file otherwise.
fn places(file: &File) -> Vec<Place> {
    match file.layout() {
        Layout::Explicit => (0..file.subfile_count()).map(Place::Fork).collect(),
        _ => vec![Place::Linear],
    }
}

fn write_pattern(file: &File, spec: &PointSpec, bytes: u64, seed: u64) -> anyhow::Result<()> {
    let _ = spec;
    let mut handles = Vec::new();
    for place in places(file) {
        let key = pattern_key(seed, place);
        let mut offset = 0;
        while offset < bytes {
            let length = CHUNK_BYTES.min(bytes - offset);
            let mut data = vec![0u8; length as usize];
            fill(key, offset, &mut data);
            let shape = Shape::contiguous(offset, length);
            handles.push(match place {
                Place::Fork(subfile) => file.fork(subfile, DEFAULT_FORK)?.write_nb(shape, data),
                _ => file.write_shape_nb(shape, data),
            });
            if handles.len() >= 8 {
                handles.remove(0).wait()?;
            }
            offset += length;
        }
    }
    for handle in handles {
        handle.wait()?;
    }
    file.sync()?;
    file.clone().close()?;
    Ok(())
}

fn check_pattern(file: &File, spec: &PointSpec, bytes: u64, seed: u64) -> anyhow::Result<()> {
    let _ = spec;
    for place in places(file) {
        let key = pattern_key(seed, place);
        let mut offset = 0;
        while offset < bytes {
            let length = CHUNK_BYTES.min(bytes - offset);
            let mut data = vec![0u8; length as usize];
            let shape = Shape::contiguous(offset, length);
            match place {
                Place::Fork(subfile) => file.fork(subfile, DEFAULT_FORK)?.read(&shape, &mut data)?,
                _ => file.read_shape(&shape, &mut data)?,
            };
            if let Some(bad) = first_mismatch(key, offset, &data) {
                anyhow::bail!("{place:?} byte {bad} does not hold the written data");
            }
            offset += length;
        }
    }
    Ok(())
}

/// One client process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
}

enum Line {
    Text(usize, String),
    Closed(usize),
}

/// Runs the point once: spawns the clients, releases them together, serves their barriers,
/// and computes the rate from their reports.
pub fn run_once(cluster: &Cluster, point: &Point<'_>) -> anyhow::Result<RunResult> {
    let exe = std::env::current_exe().context("find the flotilla executable")?;
    let spec_json = serde_json::to_string(point.spec)?;
    let (lines, receiver) = mpsc::channel();
    let mut workers = Vec::new();
    for client in 0..point.clients {
        let mut command = Command::new(&exe);
        if let Some(key) = cluster.client_key() {
            command.arg("--key").arg(key);
        }
        if let Some(config) = cluster.config_file() {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .args(["bench-worker", "--meta", cluster.meta_addr(), "--path", &point.path])
            .args(["--client", &client.to_string(), "--clients", &point.clients.to_string()])
            .args(["--spec", &spec_json])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start a benchmark client process")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let index = workers.len();
        let sender = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(Line::Text(index, line)).is_err() {
                    return;
                }
            }
            let _ = sender.send(Line::Closed(index));
        });
        workers.push(Worker { child, stdin });
    }
    drop(lines);
    let outcome =
        conduct(&mut workers, &receiver).and_then(|reports| release(&mut workers).map(|()| reports));
    for worker in &mut workers {
        if outcome.is_err() {
            let _ = worker.child.kill();
        }
        let _ = worker.child.wait();
    }
    rate(&outcome?)
}

/// Lets every client, all of them having reported, check the reads it kept for after the
/// run and exit; fails if one of them fails (its checks did not hold).
fn release(workers: &mut [Worker]) -> anyhow::Result<()> {
    for worker in workers.iter_mut() {
        // A client that already exited fails below, by its status.
        let _ = writeln!(worker.stdin, "go").and_then(|()| worker.stdin.flush());
    }
    for (index, worker) in workers.iter_mut().enumerate() {
        let status = worker.child.wait()?;
        anyhow::ensure!(status.success(), "benchmark client {index} failed after its run ({status})");
    }
    Ok(())
}

/// Serves the start barrier, the iteration barriers and collects the reports.
fn conduct(workers: &mut [Worker], receiver: &mpsc::Receiver<Line>) -> anyhow::Result<Vec<WorkerReport>> {
    let count = workers.len();
    let mut reports: Vec<Option<WorkerReport>> = vec![None; count];
    let mut waiting = vec![false; count];
    let deadline = Instant::now() + RUN_TIMEOUT;
    while reports.iter().any(Option::is_none) {
        let timeout = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(timeout).context("a benchmark client stopped answering")? {
            Line::Text(index, line) if line == "ready" || line == "barrier" => waiting[index] = true,
            Line::Text(index, line) => {
                let json = line.strip_prefix("report ").with_context(|| format!("client said {line:?}"))?;
                reports[index] = Some(serde_json::from_str(json).context("read a client's report")?);
            }
            Line::Closed(index) if reports[index].is_none() => {
                let status = workers[index].child.wait()?;
                anyhow::bail!("benchmark client {index} failed ({status})");
            }
            Line::Closed(_) => {}
        }
        let running: Vec<usize> = (0..count).filter(|i| reports[*i].is_none()).collect();
        if !running.is_empty() && running.iter().all(|i| waiting[*i]) {
            for index in running {
                waiting[index] = false;
                writeln!(workers[index].stdin, "go").and_then(|()| workers[index].stdin.flush())?;
            }
        }
    }
    Ok(reports.into_iter().flatten().collect())
}

fn rate(reports: &[WorkerReport]) -> anyhow::Result<RunResult> {
    anyhow::ensure!(!reports.is_empty(), "no client reported");
    let start = reports.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = reports.iter().map(|r| r.end_ns.saturating_sub(r.excluded_ns)).max().unwrap_or(0);
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let seconds = end.saturating_sub(start) as f64 / 1e9;
    let cpu_utilization = reports
        .iter()
        .map(|r| {
            let elapsed = r.end_ns.saturating_sub(r.start_ns).saturating_sub(r.excluded_ns) as f64;
            if elapsed > 0.0 {
                r.think_ns as f64 / elapsed
            } else {
                0.0
            }
        })
        .sum::<f64>()
        / reports.len() as f64;
    let bytes_per_s = if seconds > 0.0 { bytes as f64 / seconds } else { 0.0 };
    Ok(RunResult { bytes_per_s, cpu_utilization, seconds })
}
