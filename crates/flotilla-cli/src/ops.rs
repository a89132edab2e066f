//! Operating the cluster: metrics endpoints of the services, `flotilla jobs` and
//! `flotilla top` (both from the I/O servers' `Stats` replies). The arithmetic on counters
//! is pure and tested apart from the commands.

use crate::show::{human_bytes, table, Output};
use clap::Args;
use flotilla_client::{Client, TargetState};
use flotilla_metrics::{EndpointConfig, MetricsHandle, Registry};
use flotilla_proto::{JobStats, ServerStats};
use prometheus_client::collector::Collector;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Serves `collectors` on `listen` (from inside a tokio runtime); each is labelled
/// `service="NAME"` when it has a name (`flotilla local` serves all its services at once).
pub async fn serve_metrics(
    listen: &str,
    collectors: Vec<(Option<String>, Box<dyn Collector>)>,
) -> anyhow::Result<MetricsHandle> {
    let mut registry = Registry::with_prefix("flotilla");
    for (service, collector) in collectors {
        match service {
            Some(name) => {
                let label = (std::borrow::Cow::Borrowed("service"), std::borrow::Cow::Owned(name));
                registry.sub_registry_with_label(label).register_collector(collector);
            }
            None => registry.register_collector(collector),
        }
    }
    let handle = flotilla_metrics::bind(&EndpointConfig::on(listen), Arc::new(registry)).await?;
    crate::process::announce(format!("metrics={}", handle.local_addr()));
    Ok(handle)
}

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    report: crate::args::ReportArgs,
    /// Time between refreshes, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Stop after this many refreshes (default: until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
}

/// The addresses of the servers with a target up.
fn servers(client: &Client) -> anyhow::Result<Vec<String>> {
    let mut servers: Vec<String> =
        client.status()?.into_iter().filter(|t| t.state == TargetState::Up).map(|t| t.server).collect();
    servers.sort();
    servers.dedup();
    Ok(servers)
}

/// Every live server's stats (a server that does not answer is reported on stderr, skipped).
fn gather(client: &Client, servers: &[String]) -> Vec<ServerStats> {
    let mut all = Vec::new();
    for server in servers {
        match client.server_stats(server) {
            Ok(stats) => all.push(stats),
            Err(error) => eprintln!("flotilla: no stats from {server}: {error}"),
        }
    }
    all
}

/// Jobs summed over servers, busiest first (`other` last).
pub fn merge_jobs(servers: &[ServerStats]) -> Vec<JobStats> {
    let mut merged: BTreeMap<String, JobStats> = BTreeMap::new();
    for job in servers.iter().flat_map(|s| &s.jobs) {
        let sum = merged
            .entry(job.job.clone())
            .or_insert_with(|| JobStats { job: job.job.clone(), ..JobStats::default() });
        *sum = add(sum, job);
    }
    let mut jobs: Vec<JobStats> = merged.into_values().collect();
    jobs.sort_by_key(|j| {
        (j.job == flotilla_metrics::OTHER_JOBS, std::cmp::Reverse(j.read_bytes + j.write_bytes))
    });
    jobs
}

fn add(a: &JobStats, b: &JobStats) -> JobStats {
    JobStats {
        job: a.job.clone(),
        read_bytes: a.read_bytes.saturating_add(b.read_bytes),
        write_bytes: a.write_bytes.saturating_add(b.write_bytes),
        read_ops: a.read_ops.saturating_add(b.read_ops),
        write_ops: a.write_ops.saturating_add(b.write_ops),
        other_ops: a.other_ops.saturating_add(b.other_ops),
        latency_ns: a.latency_ns.saturating_add(b.latency_ns),
    }
}

fn job_json(job: &JobStats) -> Value {
    json!({
        "job": job.job, "read_bytes": job.read_bytes, "write_bytes": job.write_bytes,
        "read_ops": job.read_ops, "write_ops": job.write_ops, "other_ops": job.other_ops,
        "latency_ns": job.latency_ns,
    })
}

/// `flotilla jobs`: the busiest jobs over all servers.
pub fn jobs(args: crate::args::ReportArgs) -> anyhow::Result<()> {
    let (client, output) = args.parts()?;
    let stats = gather(&client, &servers(&client)?);
    let jobs = merge_jobs(&stats);
    if output.json {
        let servers: Vec<Value> = stats
            .iter()
            .map(|s| json!({"server": s.server, "uptime_ms": s.uptime_ms, "total": job_json(&s.total)}))
            .collect();
        let jobs: Vec<Value> = jobs.iter().map(job_json).collect();
        println!("{}", json!({ "servers": servers, "jobs": jobs }));
        return Ok(());
    }
    let mut rows =
        vec![["JOB", "READ", "WRITTEN", "READS", "WRITES", "OTHER OPS"].map(String::from).to_vec()];
    for job in &jobs {
        rows.push(vec![
            job.job.clone(),
            output.size(job.read_bytes),
            output.size(job.write_bytes),
            job.read_ops.to_string(),
            job.write_ops.to_string(),
            job.other_ops.to_string(),
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// Throughput, operations per second and mean latency between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    pub bytes_per_second: f64,
    pub ops_per_second: f64,
    /// Mean time per operation in the interval, in milliseconds (0 without operations).
    pub latency_ms: f64,
}

/// The rate between `before` and `after`, `elapsed` apart (a restarted server's counters go
/// down: that interval counts as zero).
pub fn rate(before: &JobStats, after: &JobStats, elapsed: Duration) -> Rate {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let delta = |a: u64, b: u64| b.saturating_sub(a) as f64;
    let bytes = delta(before.read_bytes + before.write_bytes, after.read_bytes + after.write_bytes);
    let ops = delta(
        before.read_ops + before.write_ops + before.other_ops,
        after.read_ops + after.write_ops + after.other_ops,
    );
    let latency_ns = delta(before.latency_ns, after.latency_ns);
    let latency_ms = if ops > 0.0 { latency_ns / ops / 1e6 } else { 0.0 };
    Rate { bytes_per_second: bytes / seconds, ops_per_second: ops / seconds, latency_ms }
}

/// `flotilla top`: refreshes per server and per job until Ctrl-C (or `--count`).
pub fn top(args: TopArgs) -> anyhow::Result<()> {
    let (client, output) = args.report.parts()?;
    let servers = servers(&client)?;
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let mut previous = (Instant::now(), gather(&client, &servers));
    let terminal = std::io::stdout().is_terminal() && !output.json;
    for _ in 0..args.count.unwrap_or(u64::MAX) {
        std::thread::sleep(interval);
        let now = (Instant::now(), gather(&client, &servers));
        let elapsed = now.0 - previous.0;
        let text = if output.json {
            format!("{}\n", top_json(&previous.1, &now.1, elapsed))
        } else {
            top_text(&previous.1, &now.1, elapsed, output)
        };
        let mut stdout = std::io::stdout();
        if terminal {
            let _ = write!(stdout, "\x1b[H\x1b[2J");
        }
        if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
            return Ok(()); // the reader went away (`| head`)
        }
        previous = now;
    }
    Ok(())
}

/// A server's or job's name and its rate.
type Named = (String, Rate);

/// Rates per server (matched by name) and per job (summed over servers).
fn rates(before: &[ServerStats], after: &[ServerStats], elapsed: Duration) -> (Vec<Named>, Vec<Named>) {
    let servers = after
        .iter()
        .map(|now| {
            let then = before.iter().find(|b| b.server == now.server).map(|b| &b.total);
            (now.server.clone(), rate(then.unwrap_or(&now.total), &now.total, elapsed))
        })
        .collect();
    let (then_jobs, now_jobs) = (merge_jobs(before), merge_jobs(after));
    let jobs = now_jobs
        .iter()
        .map(|now| {
            let then = then_jobs.iter().find(|j| j.job == now.job);
            let empty = JobStats::default();
            (now.job.clone(), rate(then.unwrap_or(&empty), now, elapsed))
        })
        .collect();
    (servers, jobs)
}

fn rate_row(name: &str, rate: &Rate, output: Output) -> Vec<String> {
    let per_second = if output.bytes {
        format!("{:.0}", rate.bytes_per_second)
    } else {
        format!("{}/s", human_bytes(rate.bytes_per_second as u64))
    };
    vec![
        name.to_string(),
        per_second,
        format!("{:.0}", rate.ops_per_second),
        format!("{:.3}", rate.latency_ms),
    ]
}

fn top_text(before: &[ServerStats], after: &[ServerStats], elapsed: Duration, output: Output) -> String {
    let (servers, jobs) = rates(before, after, elapsed);
    let header =
        |first: &str| vec![first.to_string(), "THROUGHPUT".into(), "IOPS".into(), "LATENCY MS".into()];
    let mut rows = vec![header("SERVER")];
    rows.extend(servers.iter().map(|(name, rate)| rate_row(name, rate, output)));
    let mut text = table(&rows);
    let mut rows = vec![header("JOB")];
    rows.extend(jobs.iter().map(|(name, rate)| rate_row(name, rate, output)));
    text.push('\n');
    text.push_str(&table(&rows));
    text
}

fn top_json(before: &[ServerStats], after: &[ServerStats], elapsed: Duration) -> Value {
    let (servers, jobs) = rates(before, after, elapsed);
    let entry = |key: &str, (name, rate): &(String, Rate)| {
        json!({ key: name, "bytes_per_second": rate.bytes_per_second,
                "ops_per_second": rate.ops_per_second, "latency_ms": rate.latency_ms })
    };
    let servers: Vec<Value> = servers.iter().map(|s| entry("server", s)).collect();
    let jobs: Vec<Value> = jobs.iter().map(|j| entry("job", j)).collect();
    json!({ "interval_ms": elapsed.as_millis() as u64, "servers": servers, "jobs": jobs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, read_bytes: u64, read_ops: u64, latency_ns: u64) -> JobStats {
        JobStats { job: name.into(), read_bytes, read_ops, latency_ns, ..JobStats::default() }
    }

    #[test]
    fn jobs_are_summed_over_servers_busiest_first_other_last() {
        let a = ServerStats { jobs: vec![job("1", 10, 1, 0), job("other", 500, 1, 0)], ..Default::default() };
        let b = ServerStats { jobs: vec![job("2", 30, 1, 0), job("1", 5, 2, 0)], ..Default::default() };
        let merged = merge_jobs(&[a, b]);
        let names: Vec<&str> = merged.iter().map(|j| j.job.as_str()).collect();
        assert_eq!(names, ["2", "1", "other"]);
        assert_eq!((merged[1].read_bytes, merged[1].read_ops), (15, 3));
    }

    #[test]
    fn rates_divide_deltas_by_time() {
        let before = job("j", 1000, 10, 10_000_000);
        let after = job("j", 3000, 20, 30_000_000);
        let rate = rate(&before, &after, Duration::from_secs(2));
        assert_eq!(rate.bytes_per_second, 1000.0);
        assert_eq!(rate.ops_per_second, 5.0);
        assert_eq!(rate.latency_ms, 2.0, "20 ms over 10 operations");
    }

    #[test]
    fn a_restarted_server_counts_zero_not_negative() {
        let rate = rate(&job("j", 5000, 50, 9), &job("j", 10, 1, 1), Duration::from_secs(1));
        assert_eq!(rate, Rate::default());
    }
}
