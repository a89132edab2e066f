//! `flotilla bench WORKLOAD`: the papers' experiments, re-run by one command.
//!
//! Each workload turns its options into points (every combination of the comma-separated
//! lists), runs each point `--runs` times on an embedded cluster (`--servers N
//! --target-kind dir|sim:MODEL`, one cluster per server count) or an existing one (`--meta`),
//! with client *processes* (`--clients N` or `--clients-per-server R`), and reports the
//! median, min and max aggregate rate (`runner` says how it is measured) as a table,
//! `--json`, `--csv FILE` and `--plot FILE.png`. On `sim` targets every run starts with
//! empty server caches (the servers are restarted), as in Galley §6.2; `--warm` keeps them.
//!
//! Modules: `plan` (the access patterns, pure), `data` (the byte pattern), `worker` (a client
//! process), `cluster` (the embedded cluster), `runner` (one point), `report`, `plot`,
//! `paper` (the papers' headline experiments beside their published figures), `meta` (the
//! mdtest-style metadata benchmark, with its own worker `bench-meta-worker`), `stall` and
//! `rebuild` (replication: a writer's stall when a member dies, the rebuild copy's rate) on
//! `replica_cluster`.

mod cluster;
mod data;
mod enwrich;
mod group;
mod hpf;
mod meta;
mod meta_tree;
mod migration;
mod network;
mod paper;
mod plan;
mod plot;
mod rebuild;
mod replica_cluster;
mod report;
mod runner;
mod spread;
mod stall;
mod stream;
mod ttest;
mod verdict;
mod worker;

pub use meta::{meta_worker, MetaWorkerArgs};
pub use stream::{net_worker, NetWorkerArgs};
pub use worker::{worker, WorkerArgs};

use anyhow::Context;
use clap::{Args, Subcommand};
use cluster::{Cluster, ClusterSpec, Embedded};
use plan::{
    GalleyPattern, GalleySpec, GpfsPattern, GpfsSpec, Interface, Op, PointSpec, RamaGatorSpec, RamaLuSpec,
    RamaOrder, RamaStridedSpec, RamaWholeSpec,
};
use report::{PointResult, Report};
use runner::{run_once, Point};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Extra memory a server may use beyond its cache (the target of issue 4).
pub const SERVER_MEMORY_SLACK_BYTES: u64 = 64 << 20;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Galley's interleaved read: traditional vs strided requests vs a local pread loop.
    Interleaved(InterleavedArgs),
    /// Galley §6: broadcast, partitioned, interleaved; traditional vs strided; read, overwrite, write.
    Galley(GalleyArgs),
    /// GPFS §3: segmented vs strided on one shared file, or file per process; transfer sizes; ratios.
    Gpfs(GpfsArgs),
    /// RAMA ch. 7: whole-file transfers over stripe units and hash; strided with computation; LU.
    Rama(RamaArgs),
    /// A paper's headline experiments at this machine's scale, beside the paper's figures.
    Paper(paper::PaperArgs),
    /// mdtest-style metadata rates: file creates, stats, directory creates, removes per second.
    Meta(meta::MetaArgs),
    /// The machine's baseline: a plain TCP stream between two processes on loopback, MB/s.
    Net(stream::NetArgs),
    /// 1 MiB sequential write then read through the library, file per process and one
    /// shared file, beside the loopback baseline measured in the same run.
    Stream(stream::StreamArgs),
    /// The stall a writer of a `replicas=2` file sees when a member of its chain is
    /// SIGKILLed (and restarted), over `--kills` kills: each, then median and worst.
    ReplicaStall(stall::StallArgs),
    /// The rebuild copy's MB/s and a foreground writer's MB/s alone and during it (a target
    /// holding `replicas=2` files drained), for each `resync_bytes_per_s` of `--rates`.
    Rebuild(rebuild::RebuildArgs),
    /// Metadata and small-file rates through mounted directories (`LABEL=DIR`, e.g. Flotilla's
    /// mount, MooseFS, GlusterFS, local disk), one program in one run: creates, stats, small
    /// writes and reads, removals, directory creates, renames, removals; ops/s per phase.
    MetaTree(meta_tree::MetaTreeArgs),
}

/// Options every workload takes.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Use this running cluster instead of starting an embedded one.
    #[arg(long, env = "FLOTILLA_META")]
    pub meta: Option<String>,
    /// I/O servers of the embedded cluster (a comma list sweeps, one cluster per count).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub servers: Vec<usize>,
    /// Target kind of the embedded servers: dir, or sim:MODEL (hp97560, st31200n).
    #[arg(long, default_value = "dir")]
    pub target_kind: String,
    /// Buffer cache of each embedded server (bytes; k, m, g suffixes).
    #[arg(long, value_parser = parse_size, default_value = "64m")]
    pub cache_bytes: u64,
    /// Client processes (a comma list sweeps).
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<u64>,
    /// Client processes per server instead of --clients: the client:server ratio (sweeps).
    #[arg(long, value_delimiter = ',')]
    pub clients_per_server: Vec<u64>,
    /// Runs of each point; median, min and max are reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Also write the results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw a chart (PNG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Keep server caches warm between runs (sim targets restart servers before each run).
    #[arg(long)]
    pub warm: bool,
    /// Model a 1990s network in the clients' transport (sp2, cm5, fddi, asci-blue; none: off).
    #[arg(long, env = "FLOTILLA_NETWORK")]
    pub network: Option<String>,
}

#[derive(Args, Clone, Debug)]
pub struct GalleyArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "interleaved")]
    pub pattern: Vec<GalleyPattern>,
    /// Record sizes in bytes.
    #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "64,1k,16k,64k")]
    pub record: Vec<u64>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "traditional,strided")]
    pub interface: Vec<Interface>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "read")]
    pub op: Vec<Op>,
    /// Bytes of each fork (default: 4096 records, between 256 KiB and 4 MiB).
    #[arg(long, value_parser = parse_size)]
    pub fork_bytes: Option<u64>,
}

#[derive(Args, Clone, Debug)]
pub struct GpfsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "segmented,strided")]
    pub pattern: Vec<GpfsPattern>,
    /// Bytes per read or write call.
    #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "1k,16k,256k,4m")]
    pub transfer: Vec<u64>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "read")]
    pub op: Vec<Op>,
    /// Bytes moved per server (the file is this times the servers, rounded up to a multiple
    /// of transfer × clients).
    #[arg(long, value_parser = parse_size, default_value = "8m")]
    pub bytes_per_server: u64,
    /// Stripe unit of the shared file (GPFS used 256 KiB).
    #[arg(long, value_parser = parse_size, default_value = "256k")]
    pub stripe_unit: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RamaExperiment {
    /// Whole-file transfers, iteration- or node-sequential (Fig. 7-1, 7-2).
    Whole,
    /// Strided access with computation (Fig. 5-7, 7-4).
    Strided,
    /// Out-of-core LU decomposition (Fig. 5-8, 7-6).
    Lu,
    /// The climate model skeleton GATOR (§5.2.3, Fig. 7-8): block-cyclic reads of a
    /// longitude-major snapshot each iteration, overlapped with computation.
    Gator,
}

#[derive(Args, Clone, Debug)]
pub struct RamaArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, value_enum, default_value = "whole")]
    pub experiment: RamaExperiment,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "iteration,node")]
    pub order: Vec<RamaOrder>,
    /// Layouts to compare: stripe:UNIT and hash:BLOCK[:SEQUENTIALITY].
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "stripe:16k,stripe:64k,stripe:256k,stripe:1m,stripe:4m,hash:32k"
    )]
    pub layout: Vec<String>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "read")]
    pub op: Vec<Op>,
    /// Chunk each node moves per iteration (whole-file).
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub chunk: u64,
    /// File size (whole-file).
    #[arg(long, value_parser = parse_size, default_value = "16m")]
    pub file_bytes: u64,
    /// Request size (strided).
    #[arg(long, value_parser = parse_size, default_value = "64k")]
    pub request: u64,
    /// Iterations (strided).
    #[arg(long, default_value_t = 32)]
    pub iterations: u64,
    /// Chunks per iteration (strided).
    #[arg(long, default_value_t = 1)]
    pub chunks_per_iteration: u64,
    /// Think time per iteration in µs (strided; 65536 µs for 64 KiB is RAMA's 1 MB/s per
    /// node), or per block update (LU).
    #[arg(long)]
    pub think_us: Option<u64>,
    /// Matrix order (LU; 8-byte elements).
    #[arg(long, default_value_t = 512)]
    pub lu_order: u64,
    /// Columns per block (LU).
    #[arg(long, default_value_t = 32)]
    pub lu_block: u64,
}

#[derive(Args, Clone, Debug)]
pub struct InterleavedArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Record size in bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    pub record: u64,
    /// Bytes in each fork.
    #[arg(long, value_parser = parse_size, default_value = "4m")]
    pub fork_bytes: u64,
    /// Modes to run in every round: traditional, strided, pread (pread needs an embedded
    /// cluster: it reads the fork files under the targets).
    #[arg(long, value_delimiter = ',', default_value = "traditional,strided,pread")]
    pub modes: Vec<String>,
}

/// Parses a byte count with an optional k, m or g suffix (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    flotilla_types::parse_size(text).ok_or_else(|| format!("{text:?} is not a size (like 64, 16k, 4m)"))
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Interleaved(args) => interleaved(args),
        BenchCommand::Galley(args) => emit(&args.common.clone(), galley_report(&args)?),
        BenchCommand::Gpfs(args) => emit(&args.common.clone(), gpfs_report(&args)?),
        BenchCommand::Rama(args) => emit(&args.common.clone(), rama_report(&args)?),
        BenchCommand::Paper(args) => paper::run(args),
        BenchCommand::Meta(args) => meta::run(args),
        BenchCommand::Net(args) => stream::net(args),
        BenchCommand::Stream(args) => stream::stream(args),
        BenchCommand::ReplicaStall(args) => stall::run(args),
        BenchCommand::Rebuild(args) => rebuild::run(args),
        BenchCommand::MetaTree(args) => meta_tree::run(args),
    }
}

fn emit(common: &CommonArgs, report: Report) -> anyhow::Result<()> {
    report.emit(common.json, common.csv.as_deref(), common.plot.as_deref())
}

/// One point to measure.
#[derive(Clone, Debug)]
pub struct Job {
    pub servers: usize,
    pub clients: u64,
    pub spec: PointSpec,
    pub params: Vec<(String, Value)>,
    /// Extra per-run figure to report.
    pub extra: Option<&'static str>,
}

/// Client counts for a server count: --clients, else --clients-per-server × servers, else
/// the workload's default ratio. Returns (clients, ratio if given as one).
fn client_counts(common: &CommonArgs, servers: usize, default_per_server: u64) -> Vec<(u64, Option<u64>)> {
    if !common.clients.is_empty() {
        return common.clients.iter().map(|c| (*c, None)).collect();
    }
    let ratios = if common.clients_per_server.is_empty() {
        vec![default_per_server]
    } else {
        common.clients_per_server.clone()
    };
    ratios.into_iter().map(|r| (r * servers as u64, Some(r))).collect()
}

fn base_params(servers: usize, clients: u64, ratio: Option<u64>) -> Vec<(String, Value)> {
    let mut params = vec![("servers".to_string(), json!(servers)), ("clients".to_string(), json!(clients))];
    if let Some(ratio) = ratio {
        params.push(("clients_per_server".to_string(), json!(ratio)));
    }
    params
}

pub fn galley_jobs(args: &GalleyArgs) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &servers in &args.common.servers {
        for (clients, ratio) in client_counts(&args.common, servers, 1) {
            for &op in &args.op {
                for &pattern in &args.pattern {
                    if pattern == GalleyPattern::Broadcast && op != Op::Read {
                        continue;
                    }
                    for &record in &args.record {
                        let unit = record * clients;
                        let auto = (record * 4096).clamp(256 << 10, 4 << 20);
                        let fork_bytes = args.fork_bytes.unwrap_or(auto).div_ceil(unit).max(1) * unit;
                        for &interface in &args.interface {
                            let spec = GalleySpec {
                                pattern,
                                interface,
                                op,
                                record_bytes: record,
                                fork_bytes,
                                subfiles: servers as u32,
                            };
                            let mut params = base_params(servers, clients, ratio);
                            params.extend([
                                ("op".to_string(), json!(name_of(&op))),
                                ("pattern".to_string(), json!(name_of(&pattern))),
                                ("record_bytes".to_string(), json!(record)),
                                ("interface".to_string(), json!(name_of(&interface))),
                                ("fork_bytes".to_string(), json!(fork_bytes)),
                            ]);
                            jobs.push(Job {
                                servers,
                                clients,
                                spec: PointSpec::Galley(spec),
                                params,
                                extra: None,
                            });
                        }
                    }
                }
            }
        }
    }
    jobs
}

pub fn gpfs_jobs(args: &GpfsArgs) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &servers in &args.common.servers {
        for (clients, ratio) in client_counts(&args.common, servers, 4) {
            for &op in &args.op {
                for &pattern in &args.pattern {
                    for &transfer in &args.transfer {
                        let unit = transfer * clients;
                        let file_bytes =
                            (args.bytes_per_server * servers as u64).div_ceil(unit).max(1) * unit;
                        let spec = GpfsSpec {
                            pattern,
                            op,
                            transfer_bytes: transfer,
                            file_bytes,
                            stripe_unit_bytes: args.stripe_unit,
                            subfiles: servers as u32,
                        };
                        let mut params = base_params(servers, clients, ratio);
                        params.extend([
                            ("op".to_string(), json!(name_of(&op))),
                            ("pattern".to_string(), json!(name_of(&pattern))),
                            ("transfer_bytes".to_string(), json!(transfer)),
                            ("file_bytes".to_string(), json!(file_bytes)),
                        ]);
                        jobs.push(Job { servers, clients, spec: PointSpec::Gpfs(spec), params, extra: None });
                    }
                }
            }
        }
    }
    jobs
}

fn layout_params(layout: &str) -> Vec<(String, Value)> {
    let mut params = vec![("layout".to_string(), json!(layout))];
    if let Ok(flotilla_client::Layout::Stripe { unit_bytes, .. }) = flotilla_client::Layout::parse(layout) {
        params.push(("stripe_unit_bytes".to_string(), json!(unit_bytes)));
    }
    params
}

pub fn rama_jobs(args: &RamaArgs) -> anyhow::Result<Vec<Job>> {
    let layouts: Vec<String> = args
        .layout
        .iter()
        .flat_map(|l| l.split(';'))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    for layout in &layouts {
        flotilla_client::Layout::parse(layout).map_err(|e| anyhow::anyhow!("--layout {layout}: {e}"))?;
    }
    let mut jobs = Vec::new();
    for &servers in &args.common.servers {
        for (clients, ratio) in client_counts(&args.common, servers, 1) {
            for layout in &layouts {
                let mut params = base_params(servers, clients, ratio);
                params.extend(layout_params(layout));
                let subfiles = servers as u32;
                match args.experiment {
                    RamaExperiment::Lu => {
                        let spec = RamaLuSpec {
                            layout: layout.clone(),
                            order: args.lu_order,
                            block_columns: args.lu_block,
                            think_us: args.think_us.unwrap_or(0),
                            subfiles,
                        };
                        let mut params = params.clone();
                        params.push(("matrix_order".to_string(), json!(args.lu_order)));
                        jobs.push(Job {
                            servers,
                            clients,
                            spec: PointSpec::RamaLu(spec),
                            params,
                            extra: Some("cpu_utilization"),
                        });
                    }
                    RamaExperiment::Gator => {
                        let spec = gator_spec(args, layout, subfiles, clients);
                        let mut params = params.clone();
                        params.push((
                            "grid".to_string(),
                            json!(format!("{}x{}", spec.longitudes, spec.latitudes)),
                        ));
                        jobs.push(Job {
                            servers,
                            clients,
                            spec: PointSpec::RamaGator(spec),
                            params,
                            extra: Some("cpu_utilization"),
                        });
                    }
                    RamaExperiment::Whole | RamaExperiment::Strided => {
                        for &op in &args.op {
                            for &order in &args.order {
                                let mut params = params.clone();
                                params.push(("op".to_string(), json!(name_of(&op))));
                                params.push(("order".to_string(), json!(name_of(&order))));
                                let (spec, extra) = if args.experiment == RamaExperiment::Whole {
                                    let unit = args.chunk * clients;
                                    let file_bytes = args.file_bytes.div_ceil(unit).max(1) * unit;
                                    params.push(("chunk_bytes".to_string(), json!(args.chunk)));
                                    let spec = RamaWholeSpec {
                                        order,
                                        op,
                                        layout: layout.clone(),
                                        chunk_bytes: args.chunk,
                                        file_bytes,
                                        subfiles,
                                    };
                                    (PointSpec::RamaWhole(spec), None)
                                } else {
                                    params.push(("request_bytes".to_string(), json!(args.request)));
                                    let think_us = args
                                        .think_us
                                        .unwrap_or(args.request * args.chunks_per_iteration.max(1));
                                    params.push(("think_us".to_string(), json!(think_us)));
                                    let spec = RamaStridedSpec {
                                        order,
                                        op,
                                        layout: layout.clone(),
                                        request_bytes: args.request,
                                        chunks_per_iteration: args.chunks_per_iteration,
                                        chunk_delta_bytes: 0,
                                        iterations: args.iterations,
                                        think_us,
                                        subfiles,
                                    };
                                    (PointSpec::RamaStrided(spec), Some("cpu_utilization"))
                                };
                                jobs.push(Job { servers, clients, spec, params, extra });
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(jobs)
}

/// GATOR at the thesis's load per processor: its 144 × 96 grid of 8 KiB cells on 64
/// processors is 216 cells (1.7 MB) per processor per iteration at 8 ms of computation per
/// cell (0.8 MFLOP at 100 MFLOPS); here the grid shrinks with the mesh so that each client
/// keeps 216 cells (36 × 24 on a 2 × 2 mesh), in blocks of 3 longitudes × 4 latitudes.
/// `--iterations` snapshots; `--think-us` overrides the computation per cell.
fn gator_spec(args: &RamaArgs, layout: &str, subfiles: u32, clients: u64) -> RamaGatorSpec {
    let columns = (1..=clients).rev().find(|c| clients.is_multiple_of(*c) && c * c <= clients).unwrap_or(1);
    let rows = clients / columns;
    let (block_longitudes, block_latitudes) = (3, 4);
    // 216 cells per client: 18 blocks of 12, 6 × 3 blocks per mesh position.
    RamaGatorSpec {
        layout: layout.to_string(),
        longitudes: block_longitudes * 6 * columns,
        latitudes: block_latitudes * 3 * rows,
        cell_bytes: 8 << 10,
        block_longitudes,
        block_latitudes,
        mesh_columns: columns,
        iterations: args.iterations,
        think_us_per_cell: args.think_us.unwrap_or(8_000),
        subfiles,
    }
}

fn name_of<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn galley_report(args: &GalleyArgs) -> anyhow::Result<Report> {
    run_jobs(&args.common, "galley", galley_jobs(args))
}

fn gpfs_report(args: &GpfsArgs) -> anyhow::Result<Report> {
    run_jobs(&args.common, "gpfs", gpfs_jobs(args))
}

fn rama_report(args: &RamaArgs) -> anyhow::Result<Report> {
    let name = match args.experiment {
        RamaExperiment::Whole => "rama-whole",
        RamaExperiment::Strided => "rama-strided",
        RamaExperiment::Lu => "rama-lu",
        RamaExperiment::Gator => "rama-gator",
    };
    run_jobs(&args.common, name, rama_jobs(args)?)
}

fn start_cluster(common: &CommonArgs, servers: usize) -> anyhow::Result<Cluster> {
    if common.network.is_some() {
        network::apply(common.network.as_deref())?;
    }
    Ok(match &common.meta {
        Some(meta) => Cluster::Attached { meta: meta.clone() },
        None => Cluster::Embedded(Embedded::start(ClusterSpec {
            servers,
            target_kind: common.target_kind.clone(),
            cache_bytes: common.cache_bytes,
        })?),
    })
}

fn cold_runs(common: &CommonArgs) -> bool {
    let simulated = common.target_kind.starts_with("sim") || common.target_kind.contains("+sim:");
    common.meta.is_none() && simulated && !common.warm
}

/// Runs every job, one embedded cluster per server count, and gathers the report.
pub fn run_jobs(common: &CommonArgs, workload: &str, jobs: Vec<Job>) -> anyhow::Result<Report> {
    anyhow::ensure!(common.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(!jobs.is_empty(), "nothing to run");
    for job in &jobs {
        job.spec.check(job.clients).map_err(|e| anyhow::anyhow!("{}: {e}", job.spec.name()))?;
    }
    let began = Instant::now();
    let total = jobs.len();
    let mut results: Vec<Option<PointResult>> = vec![None; total];
    let mut peak_rss: u64 = 0;
    let mut server_counts: Vec<usize> = jobs.iter().map(|j| j.servers).collect();
    server_counts.dedup();
    server_counts.sort_unstable();
    server_counts.dedup();
    let mut done = 0;
    for servers in server_counts {
        let mut cluster = start_cluster(common, servers)?;
        let client = cluster.client()?;
        for (index, job) in jobs.iter().enumerate().filter(|(_, j)| j.servers == servers) {
            done += 1;
            let label = label(&job.params);
            let point = Point {
                spec: &job.spec,
                clients: job.clients,
                path: format!("/bench-{workload}-{}-{index}", std::process::id()),
            };
            point.prepare(&client).with_context(|| format!("set up {label}"))?;
            let mut rates = Vec::new();
            let mut extras = Vec::new();
            for run in 0..common.runs {
                point.reset(&client, run == 0)?;
                if cold_runs(common) {
                    cluster.cold_start()?;
                }
                let result = run_once(&cluster, &point).with_context(|| format!("run {label}"))?;
                eprintln!(
                    "[{done}/{total} {:.0}s] {workload} {label}: run {}/{}: {:.3} MB/s in {:.2} s",
                    began.elapsed().as_secs_f64(),
                    run + 1,
                    common.runs,
                    result.bytes_per_s / 1e6,
                    result.seconds
                );
                rates.push(result.bytes_per_s);
                extras.push(result.cpu_utilization);
            }
            point.finish(&client).with_context(|| format!("check {label}"))?;
            let extras = job.extra.map(|name| vec![(name.to_string(), extras)]).unwrap_or_default();
            results[index] = Some(PointResult { params: job.params.clone(), rates, extras });
        }
        drop(client);
        peak_rss = peak_rss.max(cluster.stop().unwrap_or(0));
    }
    let mut facts = vec![
        (
            "target_kind".to_string(),
            json!(if common.meta.is_some() { "attached".to_string() } else { common.target_kind.clone() }),
        ),
        ("runs".to_string(), json!(common.runs)),
        ("cold_cache".to_string(), json!(cold_runs(common))),
    ];
    if common.meta.is_none() {
        facts.push(("cache_bytes".to_string(), json!(common.cache_bytes)));
        facts.push(("server_peak_rss_bytes".to_string(), json!(peak_rss)));
        facts.push((
            "server_memory_within_cache_plus_64_mib".to_string(),
            json!(peak_rss <= common.cache_bytes + SERVER_MEMORY_SLACK_BYTES),
        ));
    }
    Ok(Report { workload: workload.to_string(), points: results.into_iter().flatten().collect(), facts })
}

fn label(params: &[(String, Value)]) -> String {
    params
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `flotilla bench interleaved`: Galley's interleaved 64-byte read, traditional vs strided,
/// and a `pread` loop doing the same reads on the fork files under the targets, all three
/// in every round.
fn interleaved(args: InterleavedArgs) -> anyhow::Result<()> {
    let common = &args.common;
    anyhow::ensure!(common.runs >= 1, "--runs must be at least 1");
    let servers = common.servers.first().copied().unwrap_or(4);
    let clients = common.clients.first().copied().unwrap_or(4);
    let unit = args.record * clients;
    anyhow::ensure!(
        args.fork_bytes.is_multiple_of(unit),
        "--fork-bytes must be a multiple of record × clients"
    );
    let mut cluster = start_cluster(common, servers)?;
    let client = cluster.client()?;
    let galley = |interface| {
        PointSpec::Galley(GalleySpec {
            pattern: GalleyPattern::Interleaved,
            interface,
            op: Op::Read,
            record_bytes: args.record,
            fork_bytes: args.fork_bytes,
            subfiles: servers as u32,
        })
    };
    let path = format!("/bench-interleaved-{}", std::process::id());
    let (traditional, strided) = (galley(Interface::Traditional), galley(Interface::Strided));
    let setup = Point { spec: &strided, clients, path: path.clone() };
    setup.prepare(&client)?;
    for mode in &args.modes {
        anyhow::ensure!(
            ["traditional", "strided", "pread"].contains(&mode.as_str()),
            "unknown mode {mode:?}"
        );
    }
    let wants = |mode: &str| args.modes.iter().any(|m| m == mode);
    let pread = match (&cluster, wants("pread")) {
        (Cluster::Embedded(embedded), true) => Some(PointSpec::Pread {
            paths: fork_files(embedded, &client, &path, servers)?,
            record_bytes: args.record,
            fork_bytes: args.fork_bytes,
        }),
        _ => None,
    };
    let mut modes: Vec<(&str, &PointSpec)> = vec![("traditional", &traditional), ("strided", &strided)];
    modes.retain(|(name, _)| wants(name));
    if let Some(pread) = &pread {
        modes.push(("pread", pread));
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for round in 0..common.runs {
        for (index, (name, spec)) in modes.iter().enumerate() {
            let point = Point { spec, clients, path: path.clone() };
            let result = run_once(&cluster, &point)?;
            eprintln!("round {}/{} {name}: {:.2} MB/s", round + 1, common.runs, result.bytes_per_s / 1e6);
            rates[index].push(result.bytes_per_s);
        }
    }
    setup.finish(&client)?;
    drop(client);
    let peak = cluster.peak_rss_bytes();
    cluster.stop();
    let points: Vec<PointResult> = modes
        .iter()
        .zip(rates)
        .map(|((name, _), rates)| PointResult {
            params: vec![
                ("mode".to_string(), json!(name)),
                ("servers".to_string(), json!(servers)),
                ("clients".to_string(), json!(clients)),
                ("record_bytes".to_string(), json!(args.record)),
                ("fork_bytes".to_string(), json!(args.fork_bytes)),
            ],
            rates,
            extras: Vec::new(),
        })
        .collect();
    let median =
        |name: &str| points.iter().find(|p| p.param("mode") == Some(&json!(name))).map(PointResult::median);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    let mut facts = vec![
        ("target_kind".to_string(), json!(common.target_kind)),
        ("runs".to_string(), json!(common.runs)),
        ("strided_over_traditional".to_string(), ratio(median("strided"), median("traditional"))),
        ("strided_over_pread".to_string(), ratio(median("strided"), median("pread"))),
        // The first version's names, kept for scripts that read them.
        ("ratio_of_medians".to_string(), ratio(median("strided"), median("traditional"))),
    ];
    for point in &points {
        let (median, min, max) = report::summary(&point.rates);
        let mode = point.param("mode").and_then(Value::as_str).unwrap_or_default().to_string();
        let rates = json!({"median_bytes_per_s": median, "min_bytes_per_s": min, "max_bytes_per_s": max});
        facts.push((mode, rates));
    }
    if let Some(peak) = peak {
        facts.push(("cache_bytes".to_string(), json!(common.cache_bytes)));
        facts.push(("server_peak_rss_bytes".to_string(), json!(peak)));
    }
    let report = Report { workload: "interleaved".to_string(), points, facts };
    emit(common, report)
}

/// The fork files of a file's subfiles under the embedded servers' targets.
fn fork_files(
    cluster: &Embedded,
    client: &flotilla_client::Client,
    path: &str,
    servers: usize,
) -> anyhow::Result<Vec<String>> {
    let file = client.open(path)?;
    let mut paths = Vec::new();
    for subfile in 0..file.subfile_count() {
        let relative = format!("subfiles/{:016x}.{subfile}/data", file.id());
        let found = (0..servers).map(|i| cluster.target_dir(i).join(&relative)).find(|p| p.is_file());
        let found = found.with_context(|| format!("find the fork file {relative} under the targets"))?;
        paths.push(found.display().to_string());
    }
    Ok(paths)
}
