//! `flotilla bench`: workloads run by client *processes*, measured as total bytes over
//! (latest end − earliest start), opens and closes included (GPFS §3.1).
//!
//! `interleaved` is Galley's interleaved read pattern (§6.2): a file with one subfile per
//! server, and each of C clients reading every C-th record of every fork, either one
//! request per record with one outstanding per fork ("traditional", §6.3) or one strided
//! request per fork ("strided", §6.4). Both modes run in every round, side by side.

use crate::cluster::LocalCluster;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use flotilla_client::{Client, CreateOptions, Fork, Handle, Layout, Shape, DEFAULT_FORK};
use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Galley's interleaved read: strided vs traditional requests.
    Interleaved(InterleavedArgs),
}

#[derive(Args, Clone)]
pub struct InterleavedArgs {
    /// Use this running cluster instead of starting an embedded one.
    #[arg(long, env = "FLOTILLA_META")]
    meta: Option<String>,
    /// I/O servers of the embedded cluster (and subfiles of the file).
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Client processes.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Record size in bytes.
    #[arg(long, default_value_t = 64)]
    record: u64,
    /// Bytes in each fork.
    #[arg(long, default_value_t = 4 << 20)]
    fork_bytes: u64,
    /// Rounds; each runs both modes.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Mode {
    Traditional,
    Strided,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    meta: String,
    #[arg(long)]
    path: String,
    #[arg(long)]
    client: u64,
    #[arg(long)]
    clients: u64,
    #[arg(long)]
    record: u64,
    #[arg(long)]
    fork_bytes: u64,
    #[arg(long, value_enum)]
    mode: Mode,
}

/// What one worker process reports on its stdout.
#[derive(Serialize, Deserialize, Debug)]
struct WorkerReport {
    start_ns: u128,
    end_ns: u128,
    bytes: u64,
    requests: u64,
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Interleaved(args) => interleaved(args),
    }
}

fn interleaved(args: InterleavedArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.record > 0 && args.clients > 0 && args.runs > 0,
        "record, clients and runs must be at least 1"
    );
    anyhow::ensure!(
        args.fork_bytes.is_multiple_of(args.record * args.clients),
        "--fork-bytes must be a multiple of record × clients"
    );
    let embedded = match &args.meta {
        Some(_) => None,
        None => Some(Embedded::start(args.servers)?),
    };
    let meta =
        args.meta.clone().or_else(|| embedded.as_ref().map(|e| e.meta_addr.clone())).unwrap_or_default();
    let client = Client::connect(&meta)?;
    let path = format!("/bench-interleaved-{}", std::process::id());
    prepare_file(&client, &path, args.servers as u32, args.fork_bytes)?;
    let mut rates: Vec<(Mode, f64)> = Vec::new();
    for round in 0..args.runs {
        for mode in [Mode::Traditional, Mode::Strided] {
            let rate = run_round(&meta, &path, &args, mode)?;
            eprintln!("round {}/{} {mode:?}: {:.1} MB/s", round + 1, args.runs, rate / 1e6);
            rates.push((mode, rate));
        }
    }
    client.remove(&path)?;
    report(&args, &rates);
    if let Some(embedded) = embedded {
        embedded.stop()?;
    }
    Ok(())
}

/// Median, min and max of one mode's rates.
fn summary(rates: &[(Mode, f64)], mode: Mode) -> (f64, f64, f64) {
    let mut values: Vec<f64> = rates.iter().filter(|(m, _)| *m == mode).map(|(_, r)| *r).collect();
    values.sort_by(|a, b| a.total_cmp(b));
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    (median, values.first().copied().unwrap_or(0.0), values.last().copied().unwrap_or(0.0))
}

fn report(args: &InterleavedArgs, rates: &[(Mode, f64)]) {
    let traditional = summary(rates, Mode::Traditional);
    let strided = summary(rates, Mode::Strided);
    let ratio = if traditional.0 > 0.0 { strided.0 / traditional.0 } else { 0.0 };
    if args.json {
        let value = serde_json::json!({
            "workload": "interleaved", "servers": args.servers, "clients": args.clients,
            "record_bytes": args.record, "fork_bytes": args.fork_bytes, "runs": args.runs,
            "traditional": {"median_bytes_per_s": traditional.0, "min_bytes_per_s": traditional.1, "max_bytes_per_s": traditional.2},
            "strided": {"median_bytes_per_s": strided.0, "min_bytes_per_s": strided.1, "max_bytes_per_s": strided.2},
            "ratio_of_medians": ratio,
        });
        println!("{value}");
        return;
    }
    println!(
        "interleaved read, {} servers, {} clients, {}-byte records, {} bytes per fork, {} runs",
        args.servers, args.clients, args.record, args.fork_bytes, args.runs
    );
    println!("{:<12} {:>14} {:>14} {:>14}", "mode", "median MB/s", "min MB/s", "max MB/s");
    for (name, (median, min, max)) in [("traditional", traditional), ("strided", strided)] {
        println!("{name:<12} {:>14.2} {:>14.2} {:>14.2}", median / 1e6, min / 1e6, max / 1e6);
    }
    println!("strided / traditional (medians): {ratio:.1}x");
}

/// The byte stored at `offset` of subfile `subfile`'s data fork.
pub fn pattern_byte(subfile: u32, offset: u64) -> u8 {
    ((offset.wrapping_mul(2_654_435_761) >> 13) as u8) ^ (subfile as u8).wrapping_mul(37)
}

fn prepare_file(client: &Client, path: &str, subfiles: u32, fork_bytes: u64) -> anyhow::Result<()> {
    let options = CreateOptions { subfiles, layout: Some(Layout::Explicit), ..CreateOptions::default() };
    let file = client.create(path, &options).context("create the benchmark file")?;
    let chunk_bytes = (4u64 << 20).min(fork_bytes);
    let mut handles = Vec::new();
    for subfile in 0..subfiles {
        let fork = file.fork(subfile, DEFAULT_FORK)?;
        let mut offset = 0;
        while offset < fork_bytes {
            let length = chunk_bytes.min(fork_bytes - offset);
            let data: Vec<u8> = (offset..offset + length).map(|o| pattern_byte(subfile, o)).collect();
            handles.push(fork.write_nb(Shape::contiguous(offset, length), data));
            offset += length;
        }
    }
    for handle in handles {
        handle.wait()?;
    }
    for subfile in 0..subfiles {
        file.fork(subfile, DEFAULT_FORK)?.sync()?;
    }
    Ok(())
}

fn run_round(meta: &str, path: &str, args: &InterleavedArgs, mode: Mode) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("find the flotilla executable")?;
    let mut children = Vec::new();
    for client in 0..args.clients {
        let mode_name = format!("{mode:?}").to_lowercase();
        let child = Command::new(&exe)
            .args(["bench-worker", "--meta", meta, "--path", path, "--mode", &mode_name])
            .args(["--client", &client.to_string(), "--clients", &args.clients.to_string()])
            .args(["--record", &args.record.to_string(), "--fork-bytes", &args.fork_bytes.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .context("start a benchmark client process")?;
        children.push(child);
    }
    let mut reports = Vec::new();
    for child in children {
        let output = child.wait_with_output().context("wait for a benchmark client")?;
        anyhow::ensure!(output.status.success(), "a benchmark client failed ({})", output.status);
        reports
            .push(serde_json::from_slice::<WorkerReport>(&output.stdout).context("read a client's report")?);
    }
    let start = reports.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = reports.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let seconds = (end.saturating_sub(start)) as f64 / 1e9;
    Ok(if seconds > 0.0 { bytes as f64 / seconds } else { 0.0 })
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// One benchmark client: opens the file, reads its records of every fork, checks every
/// byte against the pattern, and prints a JSON report.
pub fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.meta)?;
    let start_ns = now_ns();
    let file = client.open(&args.path)?;
    let count = args.fork_bytes / (args.record * args.clients);
    let forks: Vec<Fork> =
        (0..file.subfile_count()).map(|s| file.fork(s, DEFAULT_FORK)).collect::<Result<_, _>>()?;
    let buffers = match args.mode {
        Mode::Strided => read_strided(&forks, &args, count)?,
        Mode::Traditional => read_traditional(&forks, &args, count)?,
    };
    drop(file);
    let end_ns = now_ns();
    for (subfile, buffer) in buffers.iter().enumerate() {
        verify(subfile as u32, buffer, &args)?;
    }
    let requests = match args.mode {
        Mode::Strided => forks.len() as u64,
        Mode::Traditional => forks.len() as u64 * count,
    };
    let report = WorkerReport { start_ns, end_ns, bytes: count * args.record * forks.len() as u64, requests };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn read_strided(forks: &[Fork], args: &WorkerArgs, count: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let shape = Shape::Strided {
        file_offset: args.client * args.record,
        memory_offset: 0,
        record_bytes: args.record,
        file_stride: (args.clients * args.record) as i64,
        memory_stride: args.record as i64,
        count,
    };
    let handles: Vec<Handle<Vec<u8>>> = forks
        .iter()
        .map(|fork| fork.read_nb(shape.clone(), vec![0u8; (count * args.record) as usize]))
        .collect();
    handles.into_iter().map(|h| h.wait().map_err(anyhow::Error::from)).collect()
}

/// One thread per fork, each with one request outstanding at a time.
fn read_traditional(forks: &[Fork], args: &WorkerArgs, count: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let (record, clients, client) = (args.record, args.clients, args.client);
    std::thread::scope(|scope| {
        let threads: Vec<_> = forks
            .iter()
            .map(|fork| {
                scope.spawn(move || -> anyhow::Result<Vec<u8>> {
                    let mut buffer = vec![0u8; (count * record) as usize];
                    for k in 0..count {
                        let shape = Shape::Contiguous {
                            file_offset: (k * clients + client) * record,
                            memory_offset: k * record,
                            length: record,
                        };
                        fork.read(&shape, &mut buffer)?;
                    }
                    Ok(buffer)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| anyhow::anyhow!("reader thread panicked"))?)
            .collect()
    })
}

fn verify(subfile: u32, buffer: &[u8], args: &WorkerArgs) -> anyhow::Result<()> {
    for (k, record) in buffer.chunks(args.record as usize).enumerate() {
        let file_offset = (k as u64 * args.clients + args.client) * args.record;
        for (i, byte) in record.iter().enumerate() {
            let expected = pattern_byte(subfile, file_offset + i as u64);
            anyhow::ensure!(
                *byte == expected,
                "subfile {subfile} byte {} read {byte}, expected {expected}",
                file_offset + i as u64
            );
        }
    }
    Ok(())
}

/// An embedded cluster (metadata service and servers) in this process, on a temporary folder.
struct Embedded {
    meta_addr: String,
    runtime: tokio::runtime::Runtime,
    cluster: Option<LocalCluster>,
    stop: tokio::sync::watch::Sender<bool>,
    _data: TempDir,
}

impl Embedded {
    fn start(servers: usize) -> anyhow::Result<Embedded> {
        let data = TempDir::new()?;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let meta_config = flotilla_meta::MetaConfig {
            data: data.path.join("meta"),
            listen: "127.0.0.1:0".to_string(),
            ..Default::default()
        };
        let server_config = flotilla_server::ServerConfig::default();
        let cluster = runtime.block_on(LocalCluster::start(
            servers,
            &data.path,
            meta_config,
            server_config,
            stopped,
        ))?;
        Ok(Embedded {
            meta_addr: cluster.meta_addr.clone(),
            runtime,
            cluster: Some(cluster),
            stop,
            _data: data,
        })
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        if let Some(cluster) = self.cluster.take() {
            self.runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(30), cluster.join()).await })??;
        }
        Ok(())
    }
}

/// A folder removed when dropped.
struct TempDir {
    path: std::path::PathBuf,
}

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("flotilla-bench-{}-{}", std::process::id(), now_ns()));
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
