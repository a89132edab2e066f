//! `flotilla bench net` and `flotilla bench stream`: what the machine's loopback carries, and
//! how much of it the library moves.
//!
//! `net` measures a plain TCP stream between two processes on loopback: this process listens,
//! starts `--streams` sender processes (`flotilla bench-net-worker`), each writes
//! `--bytes-per-stream` in `--transfer` writes, and this process reads them to the end. The
//! rate is all bytes over the time from the first accept to the last end of stream; every
//! stream must deliver exactly the bytes it was asked to send.
//!
//! `stream` is 1 MiB sequential writes then reads through the library, N client processes over
//! N servers, one file per process and one shared file (each process its own segment), with
//! the `net` baseline measured in the same run: every point reports its ratio to it.

use super::plan::{GpfsPattern, GpfsSpec, Op, PointSpec};
use super::report::{summary, Report};
use super::{base_params, emit, name_of, parse_size, run_jobs, CommonArgs, Job};
use anyhow::Context;
use clap::Args;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long `net` waits for its sender processes to connect.
const NET_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A stream that stalls this long fails the run.
const NET_READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Clone, Debug)]
pub struct NetArgs {
    /// Sender processes (one TCP stream each).
    #[arg(long, default_value_t = 1)]
    pub streams: u64,
    /// Bytes each stream carries (k, m, g suffixes).
    #[arg(long, value_parser = parse_size, default_value = "1g")]
    pub bytes_per_stream: u64,
    /// Bytes per write call.
    #[arg(long, value_parser = parse_size, default_value = "1m")]
    pub transfer: u64,
    /// Runs; median, min and max are reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Clone, Debug)]
pub struct StreamArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Bytes each client process writes and reads (files larger than the caches by default).
    #[arg(long, value_parser = parse_size, default_value = "256m")]
    pub bytes_per_client: u64,
    /// Bytes per read or write call.
    #[arg(long, value_parser = parse_size, default_value = "1m")]
    pub transfer: u64,
    /// Stripe unit of the files.
    #[arg(long, value_parser = parse_size, default_value = "256k")]
    pub stripe_unit: u64,
    /// Layouts: file-per-process, shared (one file, each process its own segment).
    #[arg(long, value_delimiter = ',', default_value = "file-per-process,shared")]
    pub files: Vec<String>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "write,read")]
    pub op: Vec<Op>,
    /// Streams of the loopback baseline measured in the same run.
    #[arg(long, default_value_t = 1)]
    pub net_streams: u64,
    /// Bytes each baseline stream carries (default: --bytes-per-client).
    #[arg(long, value_parser = parse_size)]
    pub net_bytes: Option<u64>,
}

/// One sender process of `bench net` (`flotilla bench-net-worker`).
#[derive(Args)]
pub struct NetWorkerArgs {
    #[arg(long)]
    connect: String,
    #[arg(long)]
    bytes: u64,
    #[arg(long)]
    transfer: u64,
}

/// Sends `--bytes` to `--connect` in `--transfer` writes, then closes.
pub fn net_worker(args: NetWorkerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.transfer > 0, "--transfer must be positive");
    let buffer_bytes = usize::try_from(args.transfer.min(args.bytes.max(1))).context("--transfer")?;
    let buffer: Vec<u8> = (0..buffer_bytes).map(|i| (i % 251) as u8).collect();
    let mut stream =
        TcpStream::connect(&args.connect).with_context(|| format!("connect to {}", args.connect))?;
    let mut left = args.bytes;
    while left > 0 {
        let now = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        stream.write_all(&buffer[..now]).context("send")?;
        left -= now as u64;
    }
    stream.shutdown(std::net::Shutdown::Write).context("close the stream")?;
    Ok(())
}

/// Reads one stream to its end; returns the bytes and when the last one arrived.
fn drain(mut stream: TcpStream, transfer: usize) -> anyhow::Result<(u64, Instant)> {
    stream.set_read_timeout(Some(NET_READ_TIMEOUT))?;
    let mut buffer = vec![0u8; transfer];
    let mut bytes = 0u64;
    loop {
        let got = stream.read(&mut buffer).context("receive")?;
        if got == 0 {
            return Ok((bytes, Instant::now()));
        }
        bytes += got as u64;
    }
}

fn spawn_sender(addr: &str, bytes: u64, transfer: u64) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("find the flotilla executable")?;
    Command::new(exe)
        .args(["bench-net-worker", "--connect", addr])
        .args(["--bytes", &bytes.to_string(), "--transfer", &transfer.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .context("start a bench-net-worker process")
}

fn accept_within(listener: &TcpListener, deadline: Instant) -> anyhow::Result<TcpStream> {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the senders did not connect within {NET_CONNECT_TIMEOUT:?}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).context("accept a sender"),
        }
    }
}

/// One `net` run: the aggregate rate of `streams` loopback TCP streams, bytes per second.
pub fn net_rate(streams: u64, bytes_per_stream: u64, transfer: u64) -> anyhow::Result<f64> {
    anyhow::ensure!(streams >= 1 && transfer >= 1, "--streams and --transfer must be at least 1");
    let listener = TcpListener::bind("127.0.0.1:0").context("listen on loopback")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?.to_string();
    let mut children = Vec::new();
    for _ in 0..streams {
        children.push(spawn_sender(&addr, bytes_per_stream, transfer)?);
    }
    let result = receive_all(&listener, streams, usize::try_from(transfer)?);
    for mut child in children {
        let status = child.wait().context("wait for a sender")?;
        anyhow::ensure!(status.success() || result.is_err(), "a sender failed: {status}");
    }
    let (bytes, seconds) = result?;
    let expected = streams * bytes_per_stream;
    anyhow::ensure!(bytes == expected, "the streams carried {bytes} bytes, {expected} were sent");
    Ok(bytes as f64 / seconds.max(1e-9))
}

/// Accepts `streams` senders and drains them; returns (bytes, seconds from first accept).
fn receive_all(listener: &TcpListener, streams: u64, transfer: usize) -> anyhow::Result<(u64, f64)> {
    let deadline = Instant::now() + NET_CONNECT_TIMEOUT;
    let mut started: Option<Instant> = None;
    let mut threads = Vec::new();
    for _ in 0..streams {
        let stream = accept_within(listener, deadline)?;
        started.get_or_insert_with(Instant::now);
        threads.push(std::thread::spawn(move || drain(stream, transfer)));
    }
    let started = started.context("no sender connected")?;
    let (mut bytes, mut last) = (0, started);
    for thread in threads {
        let (got, ended) = thread.join().map_err(|_| anyhow::anyhow!("a receiver thread panicked"))??;
        bytes += got;
        last = last.max(ended);
    }
    Ok((bytes, last.duration_since(started).as_secs_f64()))
}

/// The `net` report: one point, the rate of every run.
fn net_report(args: &NetArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let mut rates = Vec::new();
    for run in 0..args.runs {
        let rate = net_rate(args.streams, args.bytes_per_stream, args.transfer)?;
        eprintln!("net run {}/{}: {:.1} MB/s", run + 1, args.runs, rate / 1e6);
        rates.push(rate);
    }
    let params = vec![
        ("streams".to_string(), json!(args.streams)),
        ("bytes_per_stream".to_string(), json!(args.bytes_per_stream)),
        ("transfer_bytes".to_string(), json!(args.transfer)),
    ];
    let point = super::report::PointResult { params, rates, extras: Vec::new() };
    Ok(Report { workload: "net".to_string(), points: vec![point], facts: Vec::new() })
}

pub fn net(args: NetArgs) -> anyhow::Result<()> {
    let report = net_report(&args)?;
    report.emit(args.json, None, None)
}

fn stream_pattern(files: &str) -> anyhow::Result<GpfsPattern> {
    match files {
        "file-per-process" => Ok(GpfsPattern::FilePerProcess),
        "shared" => Ok(GpfsPattern::Segmented),
        other => anyhow::bail!("--files {other:?}: expected file-per-process or shared"),
    }
}

/// The points of `bench stream`: every server count × client count × layout × op.
pub fn stream_jobs(args: &StreamArgs) -> anyhow::Result<Vec<Job>> {
    anyhow::ensure!(args.transfer > 0, "--transfer must be positive");
    let mut jobs = Vec::new();
    for &servers in &args.common.servers {
        let counts = super::client_counts(&args.common, servers, 1);
        for (clients, ratio) in counts {
            let per_client = args.bytes_per_client.div_ceil(args.transfer).max(1) * args.transfer;
            for files in &args.files {
                let pattern = stream_pattern(files)?;
                for &op in &args.op {
                    let spec = GpfsSpec {
                        pattern,
                        op,
                        transfer_bytes: args.transfer,
                        file_bytes: per_client * clients,
                        stripe_unit_bytes: args.stripe_unit,
                        subfiles: servers as u32,
                    };
                    let mut params = base_params(servers, clients, ratio);
                    params.extend([
                        ("files".to_string(), json!(files)),
                        ("op".to_string(), json!(name_of(&op))),
                        ("bytes_per_client".to_string(), json!(per_client)),
                    ]);
                    jobs.push(Job { servers, clients, spec: PointSpec::Gpfs(spec), params, extra: None });
                }
            }
        }
    }
    Ok(jobs)
}

/// `flotilla bench stream`: the baseline, the library's points, the baseline again; each
/// point's median over the baseline's median is its `ratio_to_net`.
pub fn stream(args: StreamArgs) -> anyhow::Result<()> {
    let jobs = stream_jobs(&args)?;
    let net_bytes = args.net_bytes.unwrap_or(args.bytes_per_client);
    let half = args.common.runs.div_ceil(2);
    let mut net_rates = net_rounds(half, args.net_streams, net_bytes, args.transfer)?;
    let mut report = run_jobs(&args.common, "stream", jobs)?;
    net_rates.extend(net_rounds(args.common.runs - half, args.net_streams, net_bytes, args.transfer)?);
    let (net_median, net_min, net_max) = summary(&net_rates);
    for point in &mut report.points {
        let ratios = point.rates.iter().map(|r| r / net_median).collect();
        point.extras.push(("ratio_to_net".to_string(), ratios));
    }
    report.facts.extend([
        ("net_streams".to_string(), json!(args.net_streams)),
        ("net_median_bytes_per_s".to_string(), json!(net_median)),
        ("net_min_bytes_per_s".to_string(), json!(net_min)),
        ("net_max_bytes_per_s".to_string(), json!(net_max)),
        ("net_runs_bytes_per_s".to_string(), json!(net_rates)),
    ]);
    emit(&args.common, report)
}

fn net_rounds(runs: usize, streams: u64, bytes: u64, transfer: u64) -> anyhow::Result<Vec<f64>> {
    let mut rates = Vec::new();
    for _ in 0..runs {
        let rate = net_rate(streams, bytes, transfer)?;
        eprintln!("net baseline: {:.1} MB/s", rate / 1e6);
        rates.push(rate);
    }
    Ok(rates)
}
