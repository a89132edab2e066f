//! `flotilla bench paper galley|gpfs|rama|group`: each paper's headline experiments at a scale
//! this machine runs in minutes, printed beside the paper's own figure, with whether the
//! direction and the order of magnitude agree.
//!
//! "Direction" compares the sign of the effect (which of two configurations is faster, or
//! whether throughput rises or falls); "order of magnitude" compares the size of a ratio on
//! a log scale (within a factor of 10 of the paper's). Absolute rates are not compared: the
//! papers ran on 1990s machines with real or simulated disks at other scales.

use super::plan::{GalleyPattern, GpfsPattern, Interface, Op, RamaOrder};
use super::report::{PointResult, Report};
use super::spread;
use super::verdict::{Rule, Tolerance, Verdict};
use super::{
    galley_jobs, gpfs_jobs, rama_jobs, run_jobs, CommonArgs, GalleyArgs, GpfsArgs, RamaArgs, RamaExperiment,
};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Paper {
    Galley,
    Gpfs,
    Rama,
    /// GFS-GROUP (Khanna & Kotz, PCS-TR97-312): Tables 1 and 3.
    Group,
    /// ENWRICH (Purakayastha, Ellis & Kotz): ENWRICH vs traditional caching, Figs. 4 and 5.
    Enwrich,
    /// RAMA Figs. 7-10 to 7-14: the spread of each disk's load in space and time, striped vs
    /// hashed, computed through the client's placement at the thesis's scale.
    RamaSpread,
    /// RAMA chapter 3 and §4.2.3: a synthetic month of file references replayed on a small
    /// lines target with a directory archive, one run per migration policy.
    RamaMigration,
    /// The network model's presets checked against the papers' stated network figures
    /// (Galley Fig. 5, GPFS §2), in the model and measured through the transport.
    Network,
    /// Every paper above, one after another (`--quick`: in minutes).
    All,
}

/// What `all` runs, in order.
const ALL: [Paper; 8] = [
    Paper::Network,
    Paper::Galley,
    Paper::Gpfs,
    Paper::Rama,
    Paper::Group,
    Paper::Enwrich,
    Paper::RamaSpread,
    Paper::RamaMigration,
];

impl Paper {
    fn name(self) -> String {
        self.to_possible_value().map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }

    /// The network a paper ran on, modelled by default (`--network` overrides it).
    fn network(self) -> Option<&'static str> {
        match self {
            Paper::Galley => Some("sp2"),
            Paper::Gpfs => Some("asci-blue"),
            Paper::Group => Some("fddi"),
            Paper::Enwrich => Some("cm5"),
            _ => None,
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct PaperArgs {
    #[arg(value_enum)]
    pub name: Paper,
    /// Runs of each point.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Target kind (default: the paper's disk, sim:hp97560 for Galley and GPFS, sim:st31200n
    /// for RAMA).
    #[arg(long)]
    pub target_kind: Option<String>,
    /// Smallest sizes only (for tests).
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub json: bool,
    /// Directory for CSV files and charts, one per experiment.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Network model of the clients' transport: sp2, cm5, fddi, asci-blue, or none (default:
    /// the paper's machine; none for RAMA, which modelled only its disks here).
    #[arg(long)]
    pub network: Option<String>,
    /// Fail when a finding whose rule is marked checked does not hold its direction (CI).
    #[arg(long)]
    pub check: bool,
}

/// One comparison with the paper.
#[derive(Clone, Debug)]
struct Finding {
    what: String,
    paper: String,
    paper_ratio: f64,
    rule: Rule,
    ours: f64,
}

impl Finding {
    fn verdict(&self) -> Verdict {
        self.rule.judge(self.paper_ratio, self.ours)
    }
}

/// Prints the findings, each with its rule and verdict.
fn print_findings(findings: &[Finding]) {
    println!("{:<60} {:>30} {:>9} {:>18} {:>15}", "finding", "paper", "ours", "rule", "verdict");
    for f in findings {
        let check = if f.rule.checked { " (CI)" } else { "" };
        println!(
            "{:<60} {:>30} {:>9.2} {:>18} {:>15}",
            f.what,
            f.paper,
            f.ours,
            f.rule.to_string(),
            format!("{}{check}", f.verdict().label())
        );
    }
}

fn common(args: &PaperArgs, kind: &str, servers: Vec<usize>) -> CommonArgs {
    CommonArgs {
        meta: None,
        servers,
        target_kind: args.target_kind.clone().unwrap_or_else(|| kind.to_string()),
        cache_bytes: 64 << 20,
        clients: Vec::new(),
        clients_per_server: Vec::new(),
        runs: args.runs,
        csv: None,
        json: false,
        plot: None,
        warm: false,
        network: None,
    }
}

pub fn run(args: PaperArgs) -> anyhow::Result<()> {
    let papers = if args.name == Paper::All { ALL.to_vec() } else { vec![args.name] };
    let mut broken = Vec::new();
    for paper in papers {
        // rama-migration states no finding to check (its own test replays the month), and
        // is half of `all --quick`'s time: `all --check` leaves it out.
        if args.check && args.name == Paper::All && paper == Paper::RamaMigration {
            continue;
        }
        let network = match args.network.as_deref() {
            Some(given) => Some(given),
            None => paper.network(),
        };
        super::network::apply(network)?;
        let findings = run_one(&args, paper, network.unwrap_or("none"))?;
        super::network::apply(None)?;
        broken.extend(findings.iter().filter(|f| f.rule.checked && !f.verdict().direction_holds()).map(
            |f| {
                format!(
                    "{}: {} (paper {}, ours {:.2}, {})",
                    paper.name(),
                    f.what,
                    f.paper,
                    f.ours,
                    f.verdict().label()
                )
            },
        ));
    }
    if args.check {
        anyhow::ensure!(
            broken.is_empty(),
            "findings whose direction no longer holds:\n{}",
            broken.join("\n")
        );
    }
    Ok(())
}

fn run_one(args: &PaperArgs, paper: Paper, network: &str) -> anyhow::Result<Vec<Finding>> {
    let began = std::time::Instant::now();
    if !args.json {
        println!("######## {} (network model: {network})", paper.name());
    }
    let (reports, findings) = match paper {
        Paper::Galley => galley(args)?,
        Paper::Gpfs => gpfs(args)?,
        Paper::Rama => rama(args)?,
        Paper::Group => group(args)?,
        Paper::Enwrich => enwrich(args)?,
        Paper::RamaSpread => rama_spread(args)?,
        Paper::RamaMigration => {
            super::migration::run(args.quick, args.json)?;
            return Ok(Vec::new());
        }
        Paper::Network => network_checks(args)?,
        Paper::All => anyhow::bail!("all is not one paper"),
    };
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        for report in &reports {
            let name = report.workload.replace(' ', "-");
            std::fs::write(dir.join(format!("{name}.csv")), report.csv())?;
            super::plot::draw(report, &dir.join(format!("{name}.png")))?;
        }
    }
    if args.json {
        let found: Vec<Value> = findings
            .iter()
            .map(|f| {
                let verdict = f.verdict();
                json!({"what": f.what, "paper": f.paper, "paper_ratio": f.paper_ratio, "ours": f.ours,
                       "rule": f.rule.to_string(), "checked": f.rule.checked, "verdict": verdict.label(),
                       "direction_agrees": verdict.direction_holds(),
                       "magnitude_agrees": verdict == Verdict::Agrees})
            })
            .collect();
        let reports: Vec<Value> = reports.iter().map(Report::json).collect();
        println!(
            "{}",
            json!({"paper": paper.name(), "network": network, "findings": found, "experiments": reports})
        );
        return Ok(findings);
    }
    for report in &reports {
        println!("== {}", report.workload);
        print!("{}", report.table());
        println!();
    }
    print_findings(&findings);
    println!("({} took {:.0} s)\n", paper.name(), began.elapsed().as_secs_f64());
    Ok(findings)
}

/// The network model against the papers' stated network figures: in the model (Galley
/// Fig. 5's sources × sinks, the SP switches' point-to-point rates), and measured through
/// the transport of a cluster (one client reading 1 MiB requests from one server over the
/// model of the paper's machine; the servers on `dir` targets so the network is the limit).
fn network_checks(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    use super::network::{checks, preset, sources_to_sinks_mb_s, PRESETS};
    let mut findings = Vec::new();
    if !args.json {
        println!("== network presets");
        for p in PRESETS {
            println!(
                "{:<10} latency {:>6.1} us, per message {:>6.1} us, link {:>5.1} MB/s, fan-in {:>5.2} MB/s{}  [{}]",
                p.name,
                p.latency_us,
                p.per_message_us,
                p.link_bytes_per_s / 1e6,
                p.fan_in_bytes_per_s / 1e6,
                if p.shared { ", shared medium" } else { "" },
                p.source
            );
        }
        println!();
        println!("== Galley Fig. 5 in the model: aggregate MB/s, 16 sinks, 64 KiB messages");
        let sp2 = preset("sp2")?;
        for sources in [4, 8, 16, 32, 64] {
            println!(
                "{sources:>3} sources {:>8.1}",
                sources_to_sinks_mb_s(sp2, sources, 16, 64 << 10, 1 << 20)
            );
        }
        println!();
    }
    findings.extend(fig5_shape());
    for check in checks() {
        findings.push(Finding {
            what: format!("model: {}", check.what),
            paper: format!("{:.1} MB/s", check.paper_mb_s),
            paper_ratio: 1.0,
            rule: Rule::near(0.1).checked(),
            ours: ratio(check.model_mb_s, check.paper_mb_s),
        });
    }
    let bytes: u64 = if args.quick { 8 << 20 } else { 32 << 20 };
    for (name, paper_mb_s, source) in
        [("sp2", 17.0, "Galley §6.1: ~17 MB/s"), ("asci-blue", 83.0, "GPFS §2: 83 MB/s")]
    {
        super::network::apply(Some(name))?;
        let measured = measured_read_mb_s(args, bytes)?;
        findings.push(Finding {
            what: format!("measured: {name}, 1 client <- 1 server, 1 MiB reads ({source})"),
            paper: format!("{paper_mb_s:.1} MB/s"),
            paper_ratio: 1.0,
            rule: Rule::near(0.1),
            ours: ratio(measured, paper_mb_s),
        });
        if !args.json {
            println!("measured through the transport, {name}: {measured:.2} MB/s (paper {paper_mb_s} MB/s)");
        }
    }
    super::network::apply(None)?;
    Ok((Vec::new(), findings))
}

/// Galley Fig. 5's shape as §6.1 states it, in the model (16 sinks, 64 KiB messages): the
/// aggregate rises with the sources until 32 (from at most 4 × 17 MB/s at 4 sources to
/// ~220 MB/s) and no further. The model's sinks saturate at 16 sources already (the 32 / 16
/// finding says so; its paper ratio is nominal, the text gives no value between).
fn fig5_shape() -> Vec<Finding> {
    use super::network::{preset, sources_to_sinks_mb_s};
    let Ok(sp2) = preset("sp2") else { return Vec::new() };
    let at = |sources| sources_to_sinks_mb_s(sp2, sources, 16, 64 << 10, 1 << 20);
    let rise = 220.0 / (4.0 * 17.0);
    vec![
        Finding {
            what: "model: SP-2, 32 / 4 sources into 16 sinks (Galley Fig. 5)".into(),
            paper: format!("rises to 32: 220/(4x17) = {rise:.2}"),
            paper_ratio: rise,
            rule: Rule::above(0.1, Tolerance::Ratio(1.1)).checked(),
            ours: ratio(at(32), at(4)),
        },
        Finding {
            what: "model: SP-2, 32 / 16 sources into 16 sinks (Galley Fig. 5)".into(),
            paper: "still rising until 32 sources (Fig. 5)".into(),
            paper_ratio: 1.2,
            rule: Rule::above(0.05, Tolerance::Effect(4.0)),
            ours: ratio(at(32), at(16)),
        },
        Finding {
            what: "model: SP-2, 64 / 32 sources into 16 sinks (Galley Fig. 5)".into(),
            paper: "no rise past 32 (Fig. 5)".into(),
            paper_ratio: 1.0,
            rule: Rule::near(0.1).checked(),
            ours: ratio(at(64), at(32)),
        },
    ]
}

/// One client reading `bytes` from a one-server cluster in 1 MiB requests: MB/s (median).
fn measured_read_mb_s(args: &PaperArgs, bytes: u64) -> anyhow::Result<f64> {
    let mut common = common(args, "dir", vec![1]);
    common.target_kind = "dir".into();
    let cluster = super::start_cluster(&common, 1)?;
    let outcome = (|| {
        let client = cluster.client()?;
        let path = format!("/network-check-{}", std::process::id());
        let options =
            flotilla_client::CreateOptions { subfiles: 1, ..flotilla_client::CreateOptions::default() };
        let file = client.create(&path, &options)?;
        let chunk = vec![7u8; 1 << 20];
        for at in (0..bytes).step_by(chunk.len()) {
            file.write_at(at, &chunk)?;
        }
        file.sync()?;
        let mut rates = Vec::new();
        let mut buffer = vec![0u8; 1 << 20];
        for _ in 0..args.runs.max(1) {
            let began = std::time::Instant::now();
            for at in (0..bytes).step_by(buffer.len()) {
                file.read_at(at, &mut buffer)?;
            }
            rates.push(bytes as f64 / began.elapsed().as_secs_f64() / 1e6);
        }
        drop(file);
        client.remove(&path)?;
        rates.sort_by(f64::total_cmp);
        Ok::<f64, anyhow::Error>(rates[rates.len() / 2])
    })();
    cluster.stop();
    outcome
}

fn find<'a>(report: &'a Report, wanted: &[(&str, Value)]) -> Option<&'a PointResult> {
    report.points.iter().find(|p| wanted.iter().all(|(k, v)| p.param(k) == Some(v)))
}

fn median_of(report: &Report, wanted: &[(&str, Value)]) -> f64 {
    find(report, wanted).map(PointResult::median).unwrap_or(0.0)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Galley Figs. 7 and 10–13: traditional vs strided reads over record sizes, three patterns.
fn galley(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    let records: Vec<u64> = if args.quick { vec![64, 4096] } else { vec![64, 1024, 16 << 10, 64 << 10] };
    let mut common = common(args, "sim:hp97560", vec![4]);
    common.clients = vec![4];
    let galley_args = GalleyArgs {
        common: common.clone(),
        pattern: vec![GalleyPattern::Interleaved, GalleyPattern::Partitioned, GalleyPattern::Broadcast],
        record: records.clone(),
        interface: vec![Interface::Traditional, Interface::Strided],
        op: vec![Op::Read],
        fork_bytes: if args.quick { Some(64 << 10) } else { None },
    };
    let report = run_jobs(&common, "galley read", galley_jobs(&galley_args))?;
    let (small, large) = (records[0], *records.last().unwrap_or(&64));
    let speedup = |pattern: &str, record: u64| {
        let at = |interface: &str| {
            median_of(
                &report,
                &[
                    ("pattern", json!(pattern)),
                    ("record_bytes", json!(record)),
                    ("interface", json!(interface)),
                ],
            )
        };
        ratio(at("strided"), at("traditional"))
    };
    let findings = vec![
        Finding {
            what: format!("interleaved, {small} B records: strided / traditional"),
            paper: "up to 98x (Fig. 13)".into(),
            paper_ratio: 98.0,
            rule: Rule::standard(98.0).checked(),
            ours: speedup("interleaved", small),
        },
        Finding {
            what: format!("partitioned, {small} B records: strided / traditional"),
            paper: "up to 92x (Fig. 13)".into(),
            paper_ratio: 92.0,
            rule: Rule::standard(92.0).checked(),
            ours: speedup("partitioned", small),
        },
        Finding {
            what: format!("broadcast, {small} B records: strided / traditional"),
            paper: "150x to 350x (Fig. 13)".into(),
            paper_ratio: 230.0,
            rule: Rule::standard(230.0).checked(),
            ours: speedup("broadcast", small),
        },
        Finding {
            what: format!("interleaved, {large} B records: strided / traditional"),
            paper: "1x to 2x at the largest (Fig. 13)".into(),
            paper_ratio: 1.5,
            rule: Rule::above(0.0, Tolerance::Effect(2.0)),
            ours: speedup("interleaved", large),
        },
        Finding {
            what: format!("interleaved traditional, {large} B / {small} B records"),
            paper: "throughput rises with record size (Fig. 7)".into(),
            paper_ratio: 100.0,
            rule: Rule::above(0.1, Tolerance::Ratio(10.0)).checked(),
            ours: ratio(
                median_of(
                    &report,
                    &[
                        ("pattern", json!("interleaved")),
                        ("record_bytes", json!(large)),
                        ("interface", json!("traditional")),
                    ],
                ),
                median_of(
                    &report,
                    &[
                        ("pattern", json!("interleaved")),
                        ("record_bytes", json!(small)),
                        ("interface", json!("traditional")),
                    ],
                ),
            ),
        },
    ];
    let mut findings = findings;
    let (write_report, mut write_findings) = galley_writes(args, &common, &records)?;
    findings.append(&mut write_findings);
    let (iops_report, mut iops_findings) = galley_iops(args)?;
    findings.append(&mut iops_findings);
    Ok((vec![report, write_report, iops_report], findings))
}

/// The HP 97560's sustained rate, which bounded Galley's disk-bound reads per IOP (§6.3).
const HP97560_MB_S: f64 = 2.2;

/// Galley §6.2's IOP count sweep (16 CPs, 4 to 64 IOPs) for strided reads of 4 KiB records:
/// interleaved reads are disk bound (~2.2 MB/s per IOP, §6.3), so they scale with the IOPs;
/// broadcast reads come from the IOPs' caches and are bound by the network into each CP
/// (13-14 MB/s on the SP-2, §6.4) once there are enough IOPs.
fn galley_iops(args: &PaperArgs) -> anyhow::Result<(Report, Vec<Finding>)> {
    let servers: Vec<usize> = if args.quick { vec![2, 8] } else { vec![4, 8, 16, 32] };
    let mut common = common(args, "sim:hp97560", servers.clone());
    common.clients = vec![if args.quick { 4 } else { 16 }];
    let clients = common.clients[0] as f64;
    let iops_args = GalleyArgs {
        common: common.clone(),
        pattern: vec![GalleyPattern::Interleaved, GalleyPattern::Broadcast],
        record: vec![4096],
        interface: vec![Interface::Strided],
        op: vec![Op::Read],
        fork_bytes: Some(if args.quick { 1 << 20 } else { 4 << 20 }),
    };
    let report = run_jobs(&common, "galley iops", galley_jobs(&iops_args))?;
    let at = |pattern: &str, n: usize| {
        median_of(&report, &[("pattern", json!(pattern)), ("servers", json!(n))]) / 1e6
    };
    let (fewest, most) = (servers[0], *servers.last().unwrap_or(&1));
    let scale = most as f64 / fewest as f64;
    let findings = vec![
        Finding {
            what: format!("IOPs: interleaved strided 4 KiB reads, {most} / {fewest} IOPs"),
            paper: format!("disk bound, scales with IOPs: {scale:.0}x (§6.3)"),
            paper_ratio: scale,
            rule: Rule::standard(scale).checked(),
            ours: ratio(at("interleaved", most), at("interleaved", fewest)),
        },
        Finding {
            what: format!("IOPs: interleaved strided reads, {most} IOPs: MB/s per IOP / 2.2"),
            paper: "peak ~2.2 MB/s per IOP's disk (§6.3)".into(),
            paper_ratio: 1.0,
            rule: Rule::near(0.2),
            ours: at("interleaved", most) / most as f64 / HP97560_MB_S,
        },
        Finding {
            what: format!("IOPs: broadcast strided reads, {most} IOPs: MB/s per CP / 13.5"),
            paper: "13-14 MB/s to each CP (§6.4)".into(),
            paper_ratio: 1.0,
            rule: Rule::near(0.1),
            ours: at("broadcast", most) / clients / 13.5,
        },
    ];
    Ok((report, findings))
}

/// Galley Figs. 8, 9 (traditional) and 11, 12 (strided) writes, overwriting and creating a
/// file, interleaved and partitioned; the speedups of Figs. 14 and 15.
fn galley_writes(
    args: &PaperArgs,
    common: &CommonArgs,
    records: &[u64],
) -> anyhow::Result<(Report, Vec<Finding>)> {
    let write_args = GalleyArgs {
        common: common.clone(),
        pattern: vec![GalleyPattern::Interleaved, GalleyPattern::Partitioned],
        record: records.to_vec(),
        interface: vec![Interface::Traditional, Interface::Strided],
        op: vec![Op::Overwrite, Op::Write],
        fork_bytes: if args.quick { Some(64 << 10) } else { None },
    };
    let report = run_jobs(common, "galley write", galley_jobs(&write_args))?;
    let (small, large) = (records[0], *records.last().unwrap_or(&64));
    let speedup = |pattern: &str, op: &str, record: u64| {
        let at = |interface: &str| {
            median_of(
                &report,
                &[
                    ("pattern", json!(pattern)),
                    ("op", json!(op)),
                    ("record_bytes", json!(record)),
                    ("interface", json!(interface)),
                ],
            )
        };
        ratio(at("strided"), at("traditional"))
    };
    let big = Rule::above(0.1, Tolerance::Ratio(2.0));
    let findings = vec![
        Finding {
            what: format!("interleaved overwrite, {small} B records: strided / traditional"),
            paper: "up to 30x (Fig. 14)".into(),
            paper_ratio: 30.0,
            rule: big.checked(),
            ours: speedup("interleaved", "overwrite", small),
        },
        Finding {
            what: format!("partitioned overwrite, {small} B records: strided / traditional"),
            paper: "up to 56x (Fig. 14)".into(),
            paper_ratio: 56.0,
            rule: big.checked(),
            ours: speedup("partitioned", "overwrite", small),
        },
        Finding {
            what: format!("interleaved new file, {small} B records: strided / traditional"),
            paper: "up to 23x (Fig. 15)".into(),
            paper_ratio: 23.0,
            rule: big.checked(),
            ours: speedup("interleaved", "write", small),
        },
        Finding {
            what: format!("partitioned new file, {small} B records: strided / traditional"),
            paper: "up to 35x (Fig. 15)".into(),
            paper_ratio: 35.0,
            rule: big.checked(),
            ours: speedup("partitioned", "write", small),
        },
        Finding {
            what: format!("interleaved new file, {large} B records: strided / traditional"),
            paper: "0.95 to 1.25 at the largest (Figs. 14-15)".into(),
            paper_ratio: 1.1,
            rule: Rule::near(0.25),
            ours: speedup("interleaved", "write", large),
        },
    ];
    Ok((report, findings))
}

/// GPFS Figs. 4, 9 and 10: client:server ratio, segmented vs round robin, scaling.
fn gpfs(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    let bytes_per_server = if args.quick { 1 << 20 } else { 4 << 20 };
    let ratios: Vec<u64> = if args.quick { vec![1, 4] } else { vec![1, 2, 4, 8, 16] };
    let mut ratio_common = common(args, "sim:hp97560", vec![2]);
    ratio_common.clients_per_server = ratios.clone();
    let ratio_args = GpfsArgs {
        common: ratio_common.clone(),
        pattern: vec![GpfsPattern::Segmented],
        transfer: vec![256 << 10],
        op: vec![Op::Read, Op::Write],
        bytes_per_server,
        stripe_unit: 256 << 10,
    };
    let ratio_report = run_jobs(&ratio_common, "gpfs ratio", gpfs_jobs(&ratio_args))?;
    let best_of = |op: &str| {
        ratio_report
            .points
            .iter()
            .filter(|p| p.param("op") == Some(&json!(op)))
            .map(PointResult::median)
            .fold(0.0, f64::max)
    };
    let (best, best_write) = (best_of("read"), best_of("write"));
    let at_ratio =
        |r: u64| median_of(&ratio_report, &[("clients_per_server", json!(r)), ("op", json!("read"))]);
    let write_at_ratio =
        |r: u64| median_of(&ratio_report, &[("clients_per_server", json!(r)), ("op", json!("write"))]);
    let top = *ratios.last().unwrap_or(&1);

    let transfers: Vec<u64> =
        if args.quick { vec![16 << 10, 1 << 20] } else { vec![16 << 10, 256 << 10, 4 << 20] };
    let mut pattern_common = common(args, "sim:hp97560", vec![4]);
    pattern_common.clients_per_server = vec![4];
    let pattern_args = GpfsArgs {
        common: pattern_common.clone(),
        pattern: vec![GpfsPattern::Segmented, GpfsPattern::Strided],
        transfer: transfers.clone(),
        op: vec![Op::Read],
        bytes_per_server,
        stripe_unit: 256 << 10,
    };
    let pattern_report = run_jobs(&pattern_common, "gpfs pattern", gpfs_jobs(&pattern_args))?;
    let pattern_at = |pattern: &str, transfer: u64| {
        median_of(&pattern_report, &[("pattern", json!(pattern)), ("transfer_bytes", json!(transfer))])
    };
    let (small, large) = (transfers[0], *transfers.last().unwrap_or(&1));

    let servers: Vec<usize> = if args.quick { vec![1, 2] } else { vec![1, 2, 4, 8] };
    let mut scale_common = common(args, "sim:hp97560", servers.clone());
    scale_common.clients_per_server = vec![4];
    let scale_args = GpfsArgs {
        common: scale_common.clone(),
        pattern: vec![GpfsPattern::Segmented],
        transfer: vec![1 << 20],
        op: vec![Op::Read],
        bytes_per_server,
        stripe_unit: 256 << 10,
    };
    let scale_report = run_jobs(&scale_common, "gpfs scaling", gpfs_jobs(&scale_args))?;
    let one = median_of(&scale_report, &[("servers", json!(1))]);
    let most = *servers.last().unwrap_or(&1);
    let at_most = median_of(&scale_report, &[("servers", json!(most))]);

    let findings = vec![
        Finding {
            what: format!("{top}:1 clients:server vs the best ratio"),
            paper: "falls past ~4:1, no flow control (Fig. 4)".into(),
            paper_ratio: 0.6,
            rule: Rule::standard(0.6),
            ours: ratio(at_ratio(top), best),
        },
        Finding {
            what: "1:1 clients:server vs the best ratio".into(),
            paper: "servers starved at 1:1 (Fig. 4)".into(),
            paper_ratio: 0.5,
            rule: Rule::below(0.05, Tolerance::Ratio(4.0)),
            ours: ratio(at_ratio(ratios[0]), best),
        },
        Finding {
            what: format!("writes: {top}:1 clients:server vs the best ratio"),
            paper: "falls past ~4:1 (Fig. 4 writes)".into(),
            paper_ratio: 0.6,
            rule: Rule::standard(0.6),
            ours: ratio(write_at_ratio(top), best_write),
        },
        Finding {
            what: "writes: 1:1 clients:server vs the best ratio".into(),
            paper: "servers starved at 1:1 (Fig. 4 writes)".into(),
            paper_ratio: 0.5,
            rule: Rule::below(0.05, Tolerance::Ratio(4.0)),
            ours: ratio(write_at_ratio(ratios[0]), best_write),
        },
        Finding {
            what: "best write / best read (client:server sweep)".into(),
            paper: "~1500 / ~1600 MB/s (Fig. 4)".into(),
            paper_ratio: 1500.0 / 1600.0,
            rule: Rule::standard(1500.0 / 1600.0),
            ours: ratio(best_write, best),
        },
        Finding {
            what: format!("round robin / segmented, {small} B transfers"),
            paper: "extremely poor below 256 KiB (Fig. 9)".into(),
            paper_ratio: 0.05,
            rule: Rule::below(0.1, Tolerance::Ratio(4.0)),
            ours: ratio(pattern_at("strided", small), pattern_at("segmented", small)),
        },
        Finding {
            what: format!("round robin / segmented, {large} B transfers"),
            paper: "about 1/3 for reads (Fig. 9)".into(),
            paper_ratio: 0.33,
            rule: Rule::standard(0.33),
            ours: ratio(pattern_at("strided", large), pattern_at("segmented", large)),
        },
        Finding {
            what: format!("{most} servers / (1 server x {most}) (scaling)"),
            paper: "almost perfectly linear (Fig. 10)".into(),
            paper_ratio: 0.95,
            rule: Rule::standard(0.95),
            ours: ratio(at_most, one * most as f64),
        },
    ];
    // Figs. 5-6 at quick size move half the bytes per server (CI time).
    let files_bytes = if args.quick { bytes_per_server / 2 } else { bytes_per_server };
    let (files_report, mut files_findings) = gpfs_files(args, files_bytes)?;
    let mut findings = findings;
    findings.append(&mut files_findings);
    Ok((vec![ratio_report, pattern_report, scale_report, files_report], findings))
}

/// GPFS Figs. 5-6 (20 servers, 1-256 clients, 4 KiB-4 MiB blocks): one shared file read or
/// written in segments against the same bytes split into a file per client, by block size.
/// The paper: block size matters little above 8 KiB, and single and separate files differ
/// little (until 128 KiB blocks with 256 clients, past what this machine runs).
fn gpfs_files(args: &PaperArgs, bytes_per_server: u64) -> anyhow::Result<(Report, Vec<Finding>)> {
    let servers = if args.quick { 2 } else { 4 };
    let mut files_common = common(args, "sim:hp97560", vec![servers]);
    files_common.clients_per_server = vec![4];
    let transfers: Vec<u64> =
        if args.quick { vec![16 << 10, 256 << 10] } else { vec![16 << 10, 256 << 10, 1 << 20] };
    let files_args = GpfsArgs {
        common: files_common.clone(),
        pattern: vec![GpfsPattern::Segmented, GpfsPattern::FilePerProcess],
        transfer: transfers.clone(),
        op: vec![Op::Read, Op::Write],
        bytes_per_server,
        stripe_unit: 256 << 10,
    };
    let report = run_jobs(&files_common, "gpfs files", gpfs_jobs(&files_args))?;
    let at = |pattern: &str, op: &str, transfer: u64| {
        median_of(
            &report,
            &[("pattern", json!(pattern)), ("op", json!(op)), ("transfer_bytes", json!(transfer))],
        )
    };
    let (small, stripe) = (transfers[0], 256u64 << 10);
    let mut findings = Vec::new();
    for (op, figure) in [("read", "Fig. 5"), ("write", "Fig. 6")] {
        for transfer in [small, stripe] {
            findings.push(Finding {
                what: format!("{op}, {} KiB blocks: separate files / one shared file", transfer >> 10),
                paper: format!("not a great deal of difference ({figure}a/b)"),
                paper_ratio: 1.0,
                rule: Rule::near(0.2),
                ours: ratio(at("file-per-process", op, transfer), at("segmented", op, transfer)),
            });
        }
        findings.push(Finding {
            what: format!("{op}, one shared file: {} KiB / {} KiB blocks", stripe >> 10, small >> 10),
            paper: format!("block size matters little above 8 kB ({figure}a)"),
            paper_ratio: 1.0,
            rule: Rule::near(0.2),
            ours: ratio(at("segmented", op, stripe), at("segmented", op, small)),
        });
    }
    Ok((report, findings))
}

/// RAMA Figs. 7-2, 7-4, 7-6 and 7-8: whole-file transfers, strided with computation, LU, and
/// the climate model skeleton GATOR.
fn rama(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    let layouts: Vec<String> = if args.quick {
        vec!["stripe:16k".into(), "stripe:256k".into(), "hash:32k".into()]
    } else {
        ["stripe:16k", "stripe:64k", "stripe:256k", "stripe:1m", "stripe:4m", "hash:32k", "hash:32k:4"]
            .map(String::from)
            .to_vec()
    };
    let mut common = common(args, "sim:st31200n", vec![4]);
    common.clients_per_server = vec![1];
    let base = RamaArgs {
        common: common.clone(),
        experiment: RamaExperiment::Whole,
        order: vec![RamaOrder::Iteration, RamaOrder::Node],
        layout: layouts.clone(),
        op: vec![Op::Read],
        // Whole-file reads move 4 MiB per client per iteration: with a barrier after each
        // iteration the busiest disk sets its time, and hashing comes within 10% of the best
        // stripe only when an iteration puts many blocks on every disk (§7.1.1, §7.1.3: RAMA
        // needs many requests per disk). 4 clients × 4 MiB in 128 KiB hash runs put 32 on
        // each of 4 disks; the LU and strided experiments keep their own sizes.
        chunk: if args.quick { 64 << 10 } else { 4 << 20 },
        file_bytes: if args.quick { 1 << 20 } else { 128 << 20 },
        request: 64 << 10,
        iterations: if args.quick { 4 } else { 16 },
        chunks_per_iteration: 1,
        think_us: None,
        lu_order: if args.quick { 128 } else { 1024 },
        lu_block: if args.quick { 16 } else { 64 },
    };
    let whole = run_jobs(&common, "rama whole-file", rama_jobs(&base)?)?;
    let stripes: Vec<&PointResult> =
        whole.points.iter().filter(|p| p.param("stripe_unit_bytes").is_some()).collect();
    let best = stripes.iter().map(|p| p.median()).fold(0.0, f64::max);
    let worst = stripes.iter().map(|p| p.median()).fold(f64::MAX, f64::min);
    let hash_layout = if args.quick { "hash:32k" } else { "hash:32k:4" };
    let hash = |order: &str| median_of(&whole, &[("layout", json!(hash_layout)), ("order", json!(order))]);
    let hash_mean = (hash("iteration") + hash("node")) / 2.0;

    let strided_layouts: Vec<String> = vec!["stripe:64k".into(), "stripe:4m".into(), hash_layout.into()];
    let strided_args = RamaArgs {
        experiment: RamaExperiment::Strided,
        op: vec![Op::Write],
        layout: strided_layouts,
        ..base.clone()
    };
    let strided = run_jobs(&common, "rama strided", rama_jobs(&strided_args)?)?;
    let utilization =
        |p: &PointResult| p.extras.first().map(|(_, v)| super::report::summary(v).0).unwrap_or(0.0);
    let strided_stripes: Vec<&PointResult> =
        strided.points.iter().filter(|p| p.param("stripe_unit_bytes").is_some()).collect();
    let strided_best = strided_stripes.iter().map(|p| p.median()).fold(0.0, f64::max);
    let strided_worst = strided_stripes.iter().map(|p| p.median()).fold(f64::MAX, f64::min);
    let strided_hash: Vec<&PointResult> =
        strided.points.iter().filter(|p| p.param("layout") == Some(&json!(hash_layout))).collect();
    let strided_hash_min = strided_hash.iter().map(|p| p.median()).fold(f64::MAX, f64::min);
    let strided_hash_util = strided_hash.iter().map(|p| utilization(p)).fold(f64::MAX, f64::min);

    let lu_layouts: Vec<String> = vec!["stripe:16k".into(), "stripe:4m".into(), hash_layout.into()];
    // Out of core: the servers' caches (512 KiB) are far smaller than the matrix (8 MiB),
    // so the re-reads of earlier columns go to the disks as in RAMA.
    let lu_common = CommonArgs { cache_bytes: 512 << 10, ..common.clone() };
    let lu_args = RamaArgs {
        common: lu_common.clone(),
        experiment: RamaExperiment::Lu,
        layout: lu_layouts,
        ..base.clone()
    };
    let lu = run_jobs(&lu_common, "rama lu", rama_jobs(&lu_args)?)?;
    let lu_at = |layout: &str| median_of(&lu, &[("layout", json!(layout))]);

    let gator_layouts: Vec<String> = if args.quick {
        vec!["stripe:64k".into(), "stripe:16m".into(), hash_layout.into()]
    } else {
        ["stripe:64k", "stripe:256k", "stripe:1m", "stripe:4m", "stripe:16m", hash_layout]
            .map(String::from)
            .to_vec()
    };
    let gator_args = RamaArgs {
        experiment: RamaExperiment::Gator,
        layout: gator_layouts,
        iterations: if args.quick { 1 } else { 4 },
        think_us: args.quick.then_some(500),
        ..base.clone()
    };
    let gator = run_jobs(&common, "rama gator", rama_jobs(&gator_args)?)?;
    let gator_util: Vec<(bool, f64)> =
        gator.points.iter().map(|p| (p.param("stripe_unit_bytes").is_some(), utilization(p))).collect();
    let gator_best = gator_util.iter().filter(|p| p.0).map(|p| p.1).fold(0.0, f64::max);
    let gator_worst = gator_util.iter().filter(|p| p.0).map(|p| p.1).fold(f64::MAX, f64::min);
    let gator_hash = gator_util.iter().filter(|p| !p.0).map(|p| p.1).fold(f64::MAX, f64::min);

    let findings = vec![
        Finding {
            what: "whole file: best stripe unit / worst stripe unit".into(),
            paper: "a factor of 5 (Fig. 7-2)".into(),
            paper_ratio: 5.0,
            rule: Rule::standard(5.0).checked(),
            ours: ratio(best, worst),
        },
        Finding {
            what: format!("whole file: {hash_layout} / best stripe unit"),
            paper: "10% slower (Fig. 7-2)".into(),
            paper_ratio: 0.9,
            rule: Rule::below(0.03, Tolerance::Effect(2.0)),
            ours: ratio(hash_mean, best),
        },
        Finding {
            what: format!("whole file: {hash_layout} node- / iteration-sequential"),
            paper: "within 0.4% (Fig. 7-2)".into(),
            paper_ratio: 1.0,
            rule: Rule::near(0.05),
            ours: ratio(hash("node"), hash("iteration")),
        },
        Finding {
            what: format!("strided write: {hash_layout} (worse order) / best stripe"),
            paper: "within 5% (Fig. 7-4)".into(),
            paper_ratio: 0.95,
            rule: Rule::standard(0.95),
            ours: ratio(strided_hash_min, strided_best),
        },
        Finding {
            what: format!("strided write: {hash_layout} / worst stripe"),
            paper: "up to 8x (Fig. 7-4)".into(),
            paper_ratio: 8.0,
            rule: Rule::standard(8.0),
            ours: ratio(strided_hash_min, strided_worst),
        },
        Finding {
            what: format!("strided write: {hash_layout} CPU utilization"),
            paper: "nearly 100% (Fig. 7-4)".into(),
            paper_ratio: 1.0,
            rule: Rule::standard(1.0),
            ours: strided_hash_util,
        },
        Finding {
            what: format!("LU: {hash_layout} / stripe:16k (rate)"),
            paper: "2% slower (Fig. 7-6)".into(),
            paper_ratio: 0.98,
            rule: Rule::near(0.05),
            ours: ratio(lu_at(hash_layout), lu_at("stripe:16k")),
        },
        Finding {
            what: format!("LU: {hash_layout} / stripe:4m (rate)"),
            paper: "3x faster than the worst (Fig. 7-6)".into(),
            paper_ratio: 3.0,
            rule: Rule::standard(3.0),
            ours: ratio(lu_at(hash_layout), lu_at("stripe:4m")),
        },
        Finding {
            what: format!("GATOR: {hash_layout} / best stripe (CPU utilization)"),
            paper: "2% lower on 8x8 (Fig. 7-8)".into(),
            paper_ratio: 0.98,
            rule: Rule::near(0.05),
            ours: ratio(gator_hash, gator_best),
        },
        Finding {
            what: "GATOR: worst stripe / best stripe (CPU utilization)".into(),
            paper: "as low as 21% (Fig. 7-8)".into(),
            paper_ratio: 0.21,
            rule: Rule::standard(0.21).checked(),
            ours: ratio(gator_worst, gator_best),
        },
    ];
    Ok((vec![whole, strided, lu, gator], findings))
}

/// One spatial spread: a workload's bytes per disk under each layout.
struct SpreadCase {
    figure: &'static str,
    layouts: Vec<(String, spread::Load)>,
}

fn spread_loads(
    disks: u32,
    steps: usize,
    accesses: &[spread::Access],
    layouts: &[&str],
) -> Vec<(String, spread::Load)> {
    layouts
        .iter()
        .map(|text| {
            let layout = flotilla_client::Layout::parse(text).expect("a valid layout");
            (text.to_string(), spread::Load::of(layout, disks, steps, accesses.iter().copied()))
        })
        .collect()
}

fn print_spread(case: &SpreadCase) {
    println!("== RAMA {}: bytes per disk", case.figure);
    println!(
        "{:<12} {:>6} {:>12} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "layout", "disks", "mean MB", "max/mean", "min/mean", "max/min", "temporal", "idle"
    );
    for (name, load) in &case.layouts {
        println!(
            "{:<12} {:>6} {:>12.1} {:>9.3} {:>9.3} {:>9.3} {:>10.3} {:>9.3}",
            name,
            load.disks,
            load.mean_bytes() / 1e6,
            load.max_over_mean(),
            load.min_over_mean(),
            load.max_over_min(),
            load.temporal_efficiency(),
            load.idle_fraction()
        );
    }
    println!();
}

fn draw_spread(dir: &std::path::Path, name: &str, case: &SpreadCase) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<u64>)> = case
        .layouts
        .iter()
        .map(|(layout, load)| (format!("{layout}, {} disks", load.disks), load.per_disk_bytes.clone()))
        .collect();
    super::plot::draw_disk_load(
        &format!("RAMA {}: bytes per disk", case.figure),
        &series,
        &dir.join(format!("{name}.png")),
    )
}

/// RAMA Figs. 7-10 to 7-14 (§7.2): spatial and temporal spread of the disks' load.
fn rama_spread(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    // The thesis's sizes; --quick scales the LU and whole-file sizes down by 16 to 64.
    let (lu_poor, lu_rama, whole_bytes) =
        if args.quick { (2048, 1536, 512u64 << 20) } else { (32_768, 24_576, 32u64 << 30) };
    // Fig. 7-13's 1 GB file at every scale (64 iterations: cheap to count).
    let iter_file = 1u64 << 30;
    let segment = if args.quick { 64 } else { 512 };
    let stripes = ["stripe:64k", "stripe:256k", "stripe:1m", "stripe:4m"];

    let (steps, accesses) = spread::lu(lu_poor, segment);
    let lu_striped = SpreadCase {
        figure: "Fig. 7-10 (LU, striped, 64 disks)",
        layouts: spread_loads(64, steps, &accesses, &stripes),
    };
    let (steps, accesses) = spread::lu(lu_rama, segment);
    let lu_hashed = SpreadCase {
        figure: "Fig. 7-12 (LU, hashed, 64 disks)",
        layouts: spread_loads(64, steps, &accesses, &["hash:32k"]),
    };
    drop(accesses);
    let whole: Vec<spread::Access> = spread::whole_read(whole_bytes, 32 << 10).collect();
    let mut whole_layouts = spread_loads(64, 1, &whole, &["hash:32k"]);
    whole_layouts.extend(spread_loads(256, 1, &whole, &["hash:32k"]));
    let whole_case = SpreadCase { figure: "Fig. 7-11 (whole-file read, hashed)", layouts: whole_layouts };
    drop(whole);
    let temporal = |node_sequential: bool| {
        let (steps, accesses) = spread::iterations(iter_file, 16, 1 << 20, node_sequential);
        spread_loads(16, steps, &accesses, &["stripe:2m", "hash:32k"])
    };
    let (iteration_order, node_order) = (temporal(false), temporal(true));
    let temporal_case = SpreadCase {
        figure: "Figs. 7-13/7-14 (16 nodes, 1 MiB each per iteration; iteration then node order)",
        layouts: iteration_order.iter().chain(node_order.iter()).cloned().collect(),
    };
    if !args.json {
        for case in [&lu_striped, &lu_hashed, &whole_case, &temporal_case] {
            print_spread(case);
        }
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        draw_spread(dir, "rama-fig7-10-lu-striped", &lu_striped)?;
        draw_spread(dir, "rama-fig7-12-lu-hashed", &lu_hashed)?;
        draw_spread(dir, "rama-fig7-11-whole-hashed", &whole_case)?;
        for (order, loads) in [("iteration", &iteration_order), ("node", &node_order)] {
            for (layout, load) in loads {
                let name = format!("rama-fig7-13-14-{order}-{}", layout.replace(':', "-"));
                let title =
                    format!("RAMA Figs. 7-13/7-14: {layout}, {order}-sequential, disks busy per iteration");
                super::plot::draw_temporal(&title, &load.per_step, &dir.join(format!("{name}.png")))?;
            }
        }
    }
    let worst_stripe = lu_striped.layouts.iter().map(|(_, l)| l.max_over_min()).fold(0.0, f64::max);
    let lu_hash = &lu_hashed.layouts[0].1;
    let whole_min = whole_case.layouts.iter().map(|(_, l)| l.min_over_mean()).fold(f64::MAX, f64::min);
    let efficiency = |loads: &[(String, spread::Load)], layout: &str| {
        loads.iter().find(|(name, _)| name == layout).map(|(_, l)| l.temporal_efficiency()).unwrap_or(0.0)
    };
    let findings = vec![
        Finding {
            what: "LU striped: busiest / idlest disk, worst stripe unit".into(),
            paper: "a factor of 2.5 (Fig. 7-10)".into(),
            paper_ratio: 2.5,
            rule: Rule::standard(2.5),
            ours: worst_stripe,
        },
        Finding {
            what: "whole-file read hashed: idlest disk / mean (64, 256 disks)".into(),
            paper: "all near the mean (Fig. 7-11)".into(),
            paper_ratio: 1.0,
            rule: Rule::standard(1.0),
            ours: whole_min,
        },
        Finding {
            what: "LU hashed: busiest / idlest disk".into(),
            paper: "1.15/1.03 MB/s = 1.12 (Fig. 7-12)".into(),
            paper_ratio: 1.12,
            rule: Rule::above(0.03, Tolerance::Effect(2.0)),
            ours: lu_hash.max_over_min(),
        },
        Finding {
            what: "LU hashed: busiest disk / mean".into(),
            paper: "at most 6.5% over (Fig. 7-12)".into(),
            paper_ratio: 1.065,
            rule: Rule::near(0.1),
            ours: lu_hash.max_over_mean(),
        },
        Finding {
            what: "stripe:2m: iteration- / node-sequential (time model)".into(),
            paper: "twice the bandwidth (Fig. 7-13)".into(),
            paper_ratio: 2.0,
            rule: Rule::standard(2.0),
            ours: ratio(efficiency(&iteration_order, "stripe:2m"), efficiency(&node_order, "stripe:2m")),
        },
        Finding {
            what: "hash:32k: node- / iteration-sequential (time model)".into(),
            paper: "no degradation (Fig. 7-14)".into(),
            paper_ratio: 1.0,
            rule: Rule::standard(1.0),
            ours: ratio(efficiency(&node_order, "hash:32k"), efficiency(&iteration_order, "hash:32k")),
        },
    ];
    Ok((Vec::new(), findings))
}

/// Galley's IOP buffer cache (Galley §6.1: 24 MB) against the data each of GFS-GROUP's four
/// IOPs held (256 MB / 4).
const GROUP_IOP_CACHE_MB: u64 = 24;
const GROUP_IOP_DATA_MB: u64 = 64;

/// GFS-GROUP Table 1 (mean seconds; 256 MB, four IOPs): [write, read] × [16 B, 16 KiB]
/// elements × [synchronous, asynchronous, group-nosend, group-send].
const GROUP_TABLE1_S: [[[f64; 4]; 2]; 2] = [
    [[148.9, 139.5, 144.2, 171.3], [103.4, 66.9, 65.3, 63.0]],
    [[204.7, 175.2, 192.9, 206.2], [126.5, 70.3, 78.5, 77.2]],
];

/// The pairs of programs GFS-GROUP Table 2 tests (indices into `PROGRAMS`).
const GROUP_TABLE2_PAIRS: [(usize, usize); 6] = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)];

/// GFS-GROUP Table 2: whether each pair's timings differ at 95% ([write, read] × [16 B,
/// 16 KiB] × the pairs above).
const GROUP_TABLE2_DIFFER: [[[bool; 6]; 2]; 2] = [
    [[true, true, true, true, true, true], [true, true, true, false, false, false]],
    [[true, true, false, true, true, true], [true, true, true, true, true, false]],
];

/// Table 2 re-run: our t-test of each pair against the paper's, per element size; the
/// finding is the share of the 12 cells (6 pairs, write and read) that agree. Needs at least
/// two runs (`MISSING` with one).
fn group_table2(args: &PaperArgs, timings: &[Vec<super::group::Timing>]) -> Vec<Finding> {
    use super::group::PROGRAMS;
    use super::ttest::differs_95;
    let mut findings = Vec::new();
    for (m, element) in ["16 B", "16 KiB"].iter().enumerate() {
        let mut cells = Vec::new();
        for (d, direction) in ["write", "read"].iter().enumerate() {
            for (k, &(a, b)) in GROUP_TABLE2_PAIRS.iter().enumerate() {
                let samples = |p: usize| if d == 0 { &timings[m][p].write_s } else { &timings[m][p].read_s };
                let ours = differs_95(samples(a), samples(b));
                let paper = GROUP_TABLE2_DIFFER[d][m][k];
                cells.push((direction, a, b, paper, ours));
            }
        }
        if !args.json {
            println!("== GFS-GROUP Table 2, {element} elements: differ at 95%? (paper / ours)");
            for (direction, a, b, paper, ours) in &cells {
                let label = |x: Option<bool>| x.map_or("n/a", |d| if d { "yes" } else { "no" });
                println!(
                    "{:<6} {:<13} vs {:<13} {:>4} / {:<4}",
                    direction,
                    PROGRAMS[*a].name(),
                    PROGRAMS[*b].name(),
                    label(Some(*paper)),
                    label(*ours)
                );
            }
            println!();
        }
        let tested: Vec<bool> = cells.iter().filter_map(|c| c.4.map(|ours| ours == c.3)).collect();
        let agreeing = tested.iter().filter(|a| **a).count();
        findings.push(Finding {
            what: format!("Table 2, {element}: t-test verdicts agreeing with the paper's, of 12"),
            paper: "12 of 12 (Table 2)".into(),
            paper_ratio: 1.0,
            rule: Rule::near(0.25),
            // None agreeing shows as a tiny share (DIFFERS), not as nothing measured (MISSING).
            ours: if tested.len() == cells.len() {
                (agreeing as f64 / cells.len() as f64).max(1e-3)
            } else {
                0.0
            },
        });
    }
    findings
}

/// GFS-GROUP Tables 1 and 3: the four programs on a 16 B-element and a 16 KiB-element matrix,
/// scaled from 256 MB to 16 MiB (1024×1024×16 B and 32×32×16 KiB; --quick: 4 MiB,
/// 512×512×16 B and 16×16×16 KiB) on four simulated HP 97560 disks, over the paper's network
/// (FDDI, by default) and with each server's cache scaled as Galley's IOP cache was to the
/// data an IOP held (24 MB of 64 MB: 3/8), so writes wait for the disks as the paper's did.
fn group(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    use super::group::{measure, Matrix, PROGRAMS};
    let matrices = if args.quick {
        [Matrix { order: 512, element_bytes: 16 }, Matrix { order: 16, element_bytes: 16 << 10 }]
    } else {
        [Matrix { order: 1024, element_bytes: 16 }, Matrix { order: 32, element_bytes: 16 << 10 }]
    };
    let mut common = common(args, "sim:hp97560", vec![4]);
    let per_server_bytes = matrices[1].order * matrices[1].order * matrices[1].element_bytes / 4;
    common.cache_bytes = per_server_bytes * GROUP_IOP_CACHE_MB / GROUP_IOP_DATA_MB;
    let mut cluster = super::start_cluster(&common, 4)?;
    let mut timings = Vec::new();
    for matrix in matrices {
        timings.push(measure(&mut cluster, &common, matrix, args.runs)?);
    }
    cluster.stop();
    let ours = |direction: usize, m: usize, p: usize| {
        let t = &timings[m][p];
        if direction == 0 {
            t.write_median_s()
        } else {
            t.read_median_s()
        }
    };
    let directions = ["write", "read"];
    if !args.json {
        println!(
            "== GFS-GROUP Table 1: seconds (paper: mean of 10, 4096x4096x16B and 128x128x16384B; \
             ours: median of {}, {} and {})",
            args.runs,
            matrices[0].label(),
            matrices[1].label()
        );
        println!(
            "{:<6} {:<14} {:>16} {:>10} {:>16} {:>10}",
            "", "program", "paper 16 B", "ours", "paper 16 KiB", "ours"
        );
        for (d, direction) in directions.iter().enumerate() {
            for (p, program) in PROGRAMS.iter().enumerate() {
                println!(
                    "{:<6} {:<14} {:>16.1} {:>10.3} {:>16.1} {:>10.3}",
                    direction,
                    program.name(),
                    GROUP_TABLE1_S[d][0][p],
                    ours(d, 0, p),
                    GROUP_TABLE1_S[d][1][p],
                    ours(d, 1, p)
                );
            }
        }
        println!();
    }
    // Table 3: speedup of a program over a base = base time / program time.
    let pairs = [(1, 0), (2, 0), (3, 0), (2, 1), (3, 2)];
    let mut findings = Vec::new();
    for (d, direction) in directions.iter().enumerate() {
        for (m, element) in ["16 B", "16 KiB"].iter().enumerate() {
            for (program, base) in pairs {
                let paper = GROUP_TABLE1_S[d][m][base] / GROUP_TABLE1_S[d][m][program];
                findings.push(Finding {
                    what: format!(
                        "{direction} {element}: {} over {}",
                        PROGRAMS[program].name(),
                        PROGRAMS[base].name()
                    ),
                    paper: format!("{paper:.2} (Table 3)"),
                    paper_ratio: paper,
                    // The 16 KiB elements' gains over synchronous (the paper's headline, and
                    // the target) are asserted by --check; the 16 B ones are within
                    // 17% of no effect in the paper and noisy here.
                    rule: if m == 1 && base == 0 {
                        Rule::standard(paper).checked()
                    } else {
                        Rule::standard(paper)
                    },
                    ours: ratio(ours(d, m, base), ours(d, m, program)),
                });
            }
        }
    }
    findings.extend(group_table2(args, &timings));
    let mut points = Vec::new();
    for (matrix, timings) in matrices.iter().zip(&timings) {
        let bytes = (matrix.order * matrix.order * matrix.element_bytes) as f64;
        for timing in timings {
            for (op, seconds) in [("write", &timing.write_s), ("read", &timing.read_s)] {
                points.push(PointResult {
                    params: vec![
                        ("matrix".into(), json!(matrix.label())),
                        ("program".into(), json!(timing.program.name())),
                        ("op".into(), json!(op)),
                    ],
                    rates: seconds.iter().map(|s| ratio(bytes, *s)).collect(),
                    extras: vec![("seconds".into(), seconds.clone())],
                });
            }
        }
    }
    let facts = vec![
        ("target_kind".into(), json!(common.target_kind)),
        ("servers".into(), json!(4)),
        ("cache_bytes".into(), json!(common.cache_bytes)),
        ("runs".into(), json!(args.runs)),
    ];
    Ok((vec![Report { workload: "gfs-group".into(), points, facts }], findings))
}

/// ENWRICH Figs. 4 and 5: ENWRICH vs traditional caching (TC) throughput for every pattern
/// and two record sizes, 4 writers over 4 sim:hp97560 servers, on the paper's random-blocks
/// layout (Fig. 4) and its contiguous layout (Fig. 5); file and caches scaled down with the
/// paper's ratio of file size to total cache kept (64 MB over 16 × 1 MB: 4). Fig. 6 (the cache
/// sweep) runs on the contiguous layout. `--target-kind` runs one layout of the caller's.
fn enwrich(args: &PaperArgs) -> anyhow::Result<(Vec<Report>, Vec<Finding>)> {
    use super::enwrich::MEMBERS;
    let setup = EnwrichSetup::new(args);
    let layouts: Vec<(&str, String)> = match &args.target_kind {
        Some(kind) => vec![("given", kind.clone())],
        None => vec![
            ("random-blocks", "sim:hp97560,layout=random-blocks".to_string()),
            ("contiguous", "sim:hp97560,layout=contiguous".to_string()),
        ],
    };
    let mut reports = Vec::new();
    let mut findings = Vec::new();
    for (index, (layout, kind)) in layouts.iter().enumerate() {
        let sweep = index + 1 == layouts.len();
        let (report, mut found) = enwrich_layout(args, &setup, layout, kind, sweep)?;
        reports.push(report);
        findings.append(&mut found);
    }
    if let Some((_, kind)) = layouts.last() {
        let (report, mut found) = enwrich_writers(args, kind)?;
        reports.push(report);
        findings.append(&mut found);
    }
    if !args.json {
        println!(
            "(ENWRICH: {} writers, 4 sim:hp97560 servers, {} KiB file, {} KiB cache per writer, median of {} runs)",
            MEMBERS,
            setup.file_bytes >> 10,
            setup.cache_bytes >> 10,
            args.runs
        );
    }
    Ok((reports, findings))
}

/// ENWRICH Fig. 7: ENWRICH and TC as the compute processors grow (paper: 1-16 CPs, 16 IOPs,
/// contiguous layout, 8 KiB records, 1 MB of ENWRICH cache per CP, TC's IOP cache two buffers
/// per CP per disk): 1, 2 and 4 writers (8 in full runs) on 4 servers, a fresh cluster per
/// writer count for its cache, on round-robin workloads only (a partitioned one needs two
/// writers). Median MB/s per (writers, workload, method).
fn enwrich_writers(args: &PaperArgs, kind: &str) -> anyhow::Result<(Report, Vec<Finding>)> {
    use super::enwrich::{run_once, Method, Point};
    use super::hpf::{Workload, PATTERNS, TWO_ARRAYS};
    let (file_bytes, counts): (u64, Vec<u64>) =
        if args.quick { (1 << 20, vec![1, 2, 4]) } else { (8 << 20, vec![1, 2, 4, 8]) };
    let workloads: &[Workload] =
        if args.quick { &[Workload::One(PATTERNS[1])] } else { &[Workload::One(PATTERNS[1]), TWO_ARRAYS[0]] };
    let cache_per_writer = file_bytes / 16;
    let mut points = Vec::new();
    let mut rates: Vec<(u64, Method, f64)> = Vec::new();
    for &writers in &counts {
        let mut common = common(args, kind, vec![4]);
        // The store's cache holds at least 4 blocks: 1 writer gets 4, not 2.
        common.cache_bytes = (2 * writers).max(4) * (32 << 10);
        super::cluster::set_server_write_full(true);
        let cluster = super::start_cluster(&common, 4);
        super::cluster::set_server_write_full(false);
        let cluster = cluster?;
        for &workload in workloads {
            for method in [Method::Traditional, Method::Enwrich] {
                let point = Point {
                    workload,
                    record_bytes: 8192,
                    file_bytes,
                    cache_bytes: cache_per_writer,
                    method,
                    writers,
                };
                let mut seconds = Vec::new();
                for run in 0..args.runs.max(1) {
                    seconds.push(run_once(&cluster, point, run)?);
                }
                let result = PointResult {
                    params: vec![
                        ("writers".into(), json!(writers)),
                        ("pattern".into(), json!(workload.name())),
                        ("method".into(), json!(method.name())),
                    ],
                    rates: seconds.iter().map(|s| ratio(point.bytes() as f64, *s)).collect(),
                    extras: vec![("seconds".into(), seconds)],
                };
                rates.push((writers, method, result.median() / 1e6));
                points.push(result);
            }
        }
        cluster.stop();
    }
    let mean = |writers: u64, method: Method| {
        let of: Vec<f64> = rates.iter().filter(|r| r.0 == writers && r.1 == method).map(|r| r.2).collect();
        of.iter().sum::<f64>() / of.len().max(1) as f64
    };
    let most = *counts.last().unwrap_or(&1);
    let findings = enwrich_writer_findings(most, &mean);
    let facts = vec![
        ("target_kind".into(), json!(kind)),
        ("servers".into(), json!(4)),
        ("file_bytes".into(), json!(file_bytes)),
        ("cache_bytes_per_writer".into(), json!(cache_per_writer)),
        ("runs".into(), json!(args.runs)),
    ];
    Ok((Report { workload: "enwrich-writers".into(), points, facts }, findings))
}

/// Fig. 7's findings (the text gives directions, not values: the paper ratios are nominal and
/// the tolerances wide). `mean(writers, method)`: MB/s averaged over the workloads.
fn enwrich_writer_findings(most: u64, mean: &dyn Fn(u64, super::enwrich::Method) -> f64) -> Vec<Finding> {
    use super::enwrich::Method;
    vec![
        Finding {
            what: format!("Fig. 7: TC, {most} / 1 writers (mean of patterns)"),
            paper: "<1: TC falls off with more CPs (Fig. 7)".into(),
            paper_ratio: 0.7,
            rule: Rule::below(0.05, Tolerance::Effect(4.0)),
            ours: ratio(mean(most, Method::Traditional), mean(1, Method::Traditional)),
        },
        Finding {
            what: "Fig. 7: ENWRICH, 2 / 1 writers".into(),
            paper: "<1: falls from 1 CP to 2 (Fig. 7)".into(),
            paper_ratio: 0.9,
            rule: Rule::below(0.05, Tolerance::Effect(4.0)),
            ours: ratio(mean(2, Method::Enwrich), mean(1, Method::Enwrich)),
        },
        Finding {
            what: format!("Fig. 7: ENWRICH, {most} / 2 writers"),
            paper: ">1: scales with CPs past 2 (Fig. 7)".into(),
            paper_ratio: 1.5,
            rule: Rule::above(0.05, Tolerance::Effect(4.0)),
            ours: ratio(mean(most, Method::Enwrich), mean(2, Method::Enwrich)),
        },
    ]
}

/// What every layout of `paper enwrich` runs.
struct EnwrichSetup {
    file_bytes: u64,
    cache_bytes: u64,
    records: Vec<u64>,
    workloads: Vec<super::hpf::Workload>,
    /// 8-byte records write this share of `file_bytes` (1/8 as the paper's, 1/32 quick).
    small_file_share: u64,
}

impl EnwrichSetup {
    fn new(args: &PaperArgs) -> EnwrichSetup {
        use super::enwrich::MEMBERS;
        use super::hpf::{Workload, PATTERNS, TWO_ARRAYS};
        let (file_bytes, mut workloads): (u64, Vec<Workload>) = if args.quick {
            (256 << 10, PATTERNS[..2].iter().map(|p| Workload::One(*p)).collect())
        } else {
            (8 << 20, PATTERNS.iter().map(|p| Workload::One(*p)).collect())
        };
        workloads.extend(if args.quick { &TWO_ARRAYS[..1] } else { &TWO_ARRAYS[..] });
        workloads.push(Workload::Synchronous);
        EnwrichSetup {
            file_bytes,
            cache_bytes: file_bytes / 4 / MEMBERS,
            records: vec![8192, 512, 8],
            workloads,
            small_file_share: if args.quick { 32 } else { 8 },
        }
    }

    /// The file of a point: 8-byte records write an eighth of it (as the paper's 8 MB files of
    /// 64 MB, "to save excessive simulation time"; a 32nd in quick runs).
    fn file_bytes_for(&self, record_bytes: u64) -> u64 {
        if record_bytes <= 8 {
            self.file_bytes / self.small_file_share
        } else {
            self.file_bytes
        }
    }
}

/// Median MB/s of each (record, workload, method) measured on one layout.
type EnwrichRates = Vec<(u64, String, super::enwrich::Method, f64)>;

/// `paper enwrich` on one disk layout: its report and findings.
fn enwrich_layout(
    args: &PaperArgs,
    setup: &EnwrichSetup,
    layout: &str,
    kind: &str,
    sweep: bool,
) -> anyhow::Result<(Report, Vec<Finding>)> {
    use super::enwrich::{run_once, Method, Point, MEMBERS};
    let mut common = common(args, kind, vec![4]);
    // The paper's IOP cache for TC: two buffers per writer per disk (of the store's 32 KiB
    // blocks) with its WriteFull policy (a block goes to disk once wholly written); ENWRICH's
    // flushes go through the same cache.
    common.cache_bytes = 2 * MEMBERS * (32 << 10);
    super::cluster::set_server_write_full(true);
    let cluster = super::start_cluster(&common, 4);
    super::cluster::set_server_write_full(false);
    let cluster = cluster?;
    let mut points = Vec::new();
    let mut rates: EnwrichRates = Vec::new();
    for &record_bytes in &setup.records {
        // Quick runs keep 8-byte records to the contiguous layout (CI time).
        if args.quick && record_bytes <= 8 && layout == "random-blocks" {
            continue;
        }
        for workload in &setup.workloads {
            for method in [Method::Traditional, Method::Enwrich] {
                let point = Point {
                    workload: *workload,
                    record_bytes,
                    file_bytes: setup.file_bytes_for(record_bytes),
                    cache_bytes: setup.cache_bytes,
                    method,
                    writers: MEMBERS,
                };
                let mut seconds = Vec::new();
                for run in 0..args.runs.max(1) {
                    seconds.push(run_once(&cluster, point, run)?);
                }
                let mut mb_s: Vec<f64> =
                    seconds.iter().map(|s| ratio(point.bytes() as f64, *s) / 1e6).collect();
                mb_s.sort_by(|a, b| a.total_cmp(b));
                rates.push((record_bytes, workload.name(), method, mb_s[mb_s.len() / 2]));
                points.push(PointResult {
                    params: vec![
                        ("layout".into(), json!(layout)),
                        ("record_bytes".into(), json!(record_bytes)),
                        ("pattern".into(), json!(workload.name())),
                        ("method".into(), json!(method.name())),
                    ],
                    rates: seconds.iter().map(|s| ratio(point.bytes() as f64, *s)).collect(),
                    extras: vec![("seconds".into(), seconds.clone())],
                });
            }
        }
    }
    let swept = if sweep { enwrich_sweep(args, setup, &cluster)? } else { Vec::new() };
    cluster.stop();
    if !args.json {
        print_enwrich_rates(setup, layout, &rates);
    }
    let mut findings = enwrich_findings(setup, layout, &rates);
    if sweep {
        findings.push(sweep_finding(setup, &swept));
    }
    let facts = vec![
        ("target_kind".into(), json!(kind)),
        ("layout".into(), json!(layout)),
        ("servers".into(), json!(4)),
        ("writers".into(), json!(MEMBERS)),
        ("file_bytes".into(), json!(setup.file_bytes)),
        ("cache_bytes_per_writer".into(), json!(setup.cache_bytes)),
        ("runs".into(), json!(args.runs)),
    ];
    Ok((Report { workload: format!("enwrich-{layout}"), points, facts }, findings))
}

fn enwrich_rate(rates: &EnwrichRates, record: u64, workload: &str, method: super::enwrich::Method) -> f64 {
    rates.iter().find(|r| r.0 == record && r.1 == workload && r.2 == method).map_or(0.0, |r| r.3)
}

fn print_enwrich_rates(setup: &EnwrichSetup, layout: &str, rates: &EnwrichRates) {
    use super::enwrich::Method;
    let figure = if layout == "random-blocks" { "Fig. 4" } else { "Fig. 5" };
    println!("== ENWRICH {figure}, {layout} layout: MB/s");
    println!("{:<8} {:<8} {:>10} {:>10} {:>8}", "record", "pattern", "TC", "ENWRICH", "ratio");
    for &record in setup.records.iter().filter(|r| rates.iter().any(|rate| rate.0 == **r)) {
        for workload in &setup.workloads {
            let name = workload.name();
            let (tc, en) = (
                enwrich_rate(rates, record, &name, Method::Traditional),
                enwrich_rate(rates, record, &name, Method::Enwrich),
            );
            println!("{:<8} {:<8} {:>10.2} {:>10.2} {:>8.2}", record, name, tc, en, ratio(en, tc));
        }
    }
    println!();
}

/// Per record size: ENWRICH over TC, averaged over the workloads but `wnn`, and for `wnn`.
fn enwrich_findings(setup: &EnwrichSetup, layout: &str, rates: &EnwrichRates) -> Vec<Finding> {
    use super::enwrich::Method;
    let (paper, paper_ratio) = if layout == "random-blocks" {
        ("~1.5 (Fig. 4: 7-8 vs <= 5.3 MB/s)", 1.5)
    } else {
        ("~3 (Fig. 5: ~30 vs 9-10 MB/s)", 3.0)
    };
    let over = |record: u64, name: &str| {
        ratio(
            enwrich_rate(rates, record, name, Method::Enwrich),
            enwrich_rate(rates, record, name, Method::Traditional),
        )
    };
    let mut findings = Vec::new();
    for &record in setup.records.iter().filter(|r| rates.iter().any(|rate| rate.0 == **r)) {
        let others: Vec<f64> = setup
            .workloads
            .iter()
            .filter(|w| w.name() != "wnn" && !w.synchronous())
            .map(|w| over(record, &w.name()))
            .collect();
        let paper =
            if record <= 8 { format!("{paper}; 8 B: down to TC's level (§5)") } else { paper.to_string() };
        findings.push(Finding {
            what: format!("{layout}, {record} B records: ENWRICH over TC, mean of patterns but wnn, wss"),
            paper: paper.clone(),
            paper_ratio,
            // The 512 B records' gain is large here on both layouts; the 8 KiB one is near
            // the no-effect band on a quick run.
            rule: if record == 512 {
                Rule::standard(paper_ratio).checked()
            } else {
                Rule::standard(paper_ratio)
            },
            ours: others.iter().sum::<f64>() / others.len().max(1) as f64,
        });
        findings.push(Finding {
            what: format!("{layout}, {record} B records: ENWRICH over TC, wnn"),
            paper: "<1 (Figs. 4/5: TC wins wnn)".into(),
            paper_ratio: 0.5,
            rule: Rule::below(0.05, Tolerance::Ratio(4.0)),
            ours: over(record, "wnn"),
        });
        findings.push(Finding {
            what: format!("{layout}, {record} B records: ENWRICH over TC, wss"),
            paper,
            paper_ratio,
            rule: Rule::standard(paper_ratio),
            ours: over(record, "wss"),
        });
    }
    findings
}

/// Fig. 6: ENWRICH with half, the same and twice the cache per writer (paper: 0.5, 1, 2 MB):
/// (workload, cache bytes, median MB/s). Quick runs use 512-byte records: their halved cache
/// is smaller than an 8 KiB record.
fn enwrich_sweep(
    args: &PaperArgs,
    setup: &EnwrichSetup,
    cluster: &super::cluster::Cluster,
) -> anyhow::Result<Vec<(String, u64, f64)>> {
    use super::enwrich::{run_once, Method, Point};
    use super::hpf::{Workload, PATTERNS};
    let (sweep_patterns, sweep_record) =
        if args.quick { (&PATTERNS[1..2], 512) } else { (&PATTERNS[1..4], 8192) };
    let mut sweep = Vec::new();
    for pattern in sweep_patterns {
        for cache in [setup.cache_bytes / 2, setup.cache_bytes, setup.cache_bytes * 2] {
            let point = Point {
                workload: Workload::One(*pattern),
                record_bytes: sweep_record,
                file_bytes: setup.file_bytes,
                cache_bytes: cache,
                method: Method::Enwrich,
                writers: super::enwrich::MEMBERS,
            };
            let mut mb_s: Vec<f64> = Vec::new();
            for run in 0..args.runs.max(1) {
                mb_s.push(ratio(point.bytes() as f64, run_once(cluster, point, run)?) / 1e6);
            }
            mb_s.sort_by(|a, b| a.total_cmp(b));
            sweep.push((pattern.name(), cache, mb_s[mb_s.len() / 2]));
        }
    }
    if !args.json {
        println!("== ENWRICH Fig. 6: MB/s with the cache per writer halved, as is, doubled ({sweep_record} B records)");
        for (pattern, cache, mb_s) in &sweep {
            println!("{:<8} {:>8} KiB {:>10.2}", pattern, cache >> 10, mb_s);
        }
        println!();
    }
    Ok(sweep)
}

fn sweep_finding(setup: &EnwrichSetup, sweep: &[(String, u64, f64)]) -> Finding {
    let swept = |pattern: &str, cache: u64| {
        sweep.iter().find(|s| s.0 == pattern && s.1 == cache).map_or(0.0, |s| s.2)
    };
    let mut names: Vec<&String> = sweep.iter().map(|s| &s.0).collect();
    names.dedup();
    let gains: Vec<f64> = names
        .iter()
        .map(|p| ratio(swept(p, setup.cache_bytes * 2), swept(p, setup.cache_bytes / 2)))
        .collect();
    Finding {
        what: "ENWRICH, 4x the cache per writer: speedup, mean".into(),
        paper: ">1: rises with the cache (Fig. 6)".into(),
        paper_ratio: 1.2,
        // Not asserted by `--check`: at `--quick` sizes with one run per point the sweep's
        // mean moved between 1.03 and 2.03 across runs of the same build (2026-12-02), so its
        // direction says nothing in CI; full runs still print the verdict.
        rule: Rule::above(0.05, Tolerance::Effect(3.0)),
        ours: gains.iter().sum::<f64>() / gains.len().max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::super::group::{Timing, PROGRAMS};
    use super::*;

    fn args(runs: usize) -> PaperArgs {
        PaperArgs {
            name: Paper::Group,
            runs,
            target_kind: None,
            quick: true,
            json: true,
            out: None,
            network: None,
            check: false,
        }
    }

    /// Timings whose program `p` takes `base[p]` seconds, with a small spread per run.
    fn timings(base: [f64; 4], runs: usize) -> Vec<Timing> {
        PROGRAMS
            .iter()
            .zip(base)
            .map(|(&program, s)| {
                let samples: Vec<f64> = (0..runs).map(|r| s + 0.01 * r as f64).collect();
                Timing { program, write_s: samples.clone(), read_s: samples }
            })
            .collect()
    }

    #[test]
    fn table2_counts_the_cells_that_agree_with_the_paper() {
        // Every program clearly apart: every "yes" of the paper agrees. 16 B: all 12 cells
        // are yes but the read synchronous/group-send pair (11 of 12); 16 KiB: 3 write and 1
        // read "no" (8 of 12).
        let apart = vec![timings([10.0, 20.0, 30.0, 40.0], 3), timings([10.0, 20.0, 30.0, 40.0], 3)];
        let found = group_table2(&args(3), &apart);
        assert_eq!(found.len(), 2);
        assert!((found[0].ours - 11.0 / 12.0).abs() < 1e-9, "{}", found[0].ours);
        assert!((found[1].ours - 8.0 / 12.0).abs() < 1e-9, "{}", found[1].ours);
        assert_eq!(found[0].verdict(), Verdict::Agrees);
        assert_eq!(found[1].verdict(), Verdict::Differs);
    }

    #[test]
    fn table2_with_one_run_is_missing() {
        let one = vec![timings([1.0, 2.0, 3.0, 4.0], 1), timings([1.0, 2.0, 3.0, 4.0], 1)];
        let found = group_table2(&args(1), &one);
        assert!(found.iter().all(|f| f.verdict() == Verdict::Missing));
    }

    #[test]
    fn fig5_shape_in_the_model() {
        let found = fig5_shape();
        assert_eq!(found.len(), 3);
        let verdicts: Vec<Verdict> = found.iter().map(Finding::verdict).collect();
        // Rises 4 -> 32 and is flat past 32, as the paper; but flat from 16 already.
        assert_eq!(verdicts, [Verdict::Agrees, Verdict::NoEffect, Verdict::Agrees], "{found:?}");
    }

    #[test]
    fn fig7_findings_follow_the_means() {
        use super::super::enwrich::Method;
        // TC falls 1 -> 4 writers; ENWRICH dips at 2 and climbs at 4, as the paper's Fig. 7.
        let mean = |writers: u64, method: Method| match (method, writers) {
            (Method::Traditional, 1) => 10.0,
            (Method::Traditional, _) => 6.0,
            (Method::Enwrich, 1) => 10.0,
            (Method::Enwrich, 2) => 8.0,
            (Method::Enwrich, _) => 14.0,
        };
        let found = enwrich_writer_findings(4, &mean);
        assert!(found.iter().all(|f| f.verdict().direction_holds()), "{found:?}");
        let flat = |_: u64, _: Method| 5.0;
        assert!(enwrich_writer_findings(4, &flat).iter().all(|f| f.verdict() == Verdict::NoEffect));
    }
}
