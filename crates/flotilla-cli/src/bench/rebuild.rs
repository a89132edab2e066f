//! `flotilla bench rebuild`: how fast a rebuild copies, and what a foreground writer keeps
//! meanwhile (issue 32, docs/performance.md "Rebuild and drain").
//!
//! For each `--rates` value of `[server] resync_bytes_per_s` (0: unlimited), a new cluster
//! (`replica_cluster`: one `flotilla meta`, four servers in four failure groups, loopback):
//! `--files` files of `--file-bytes` with `replicas=2` (one subfile each); a foreground writer
//! writes `--writer-bytes` to a new `replicas=2` file in 1 MiB writes alone, then again
//! while a target holding replicas is drained (`TargetAdmin Drain`, the same whole-subfile
//! copy a rebuild after a dead target runs). The copy's MB/s is the bytes of the files on
//! the drained target's chains (the writer's first file included; what it writes during the
//! copy not counted) over the time from the drain until no chain lists the target and none
//! is rebuilding (polled every 50 ms). Every file is read back and compared
//! afterwards: a run whose data does not survive the copy reports an error, not a figure.

use super::replica_cluster::Cluster;
use anyhow::Context;
use clap::Args;
use flotilla_client::{Client, CreateOptions, Layout};
use flotilla_proto::{MetaReply, MetaRequest, TargetAction};
use flotilla_types::TargetId;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Stripe unit of every file (one subfile each: the unit only sizes the requests).
const UNIT_BYTES: u64 = 64 << 10;
/// Bytes of one foreground write.
const WRITE_BYTES: usize = 1 << 20;

#[derive(Args, Clone, Debug)]
pub struct RebuildArgs {
    /// `resync_bytes_per_s` of every server, one cluster each (0: unlimited; k, m suffixes).
    #[arg(long, value_parser = super::parse_size, value_delimiter = ',', default_value = "0,8000000")]
    pub rates: Vec<u64>,
    /// Files written before the drain.
    #[arg(long, default_value_t = 8)]
    pub files: u64,
    /// Bytes of each file (k, m suffixes).
    #[arg(long, value_parser = super::parse_size, default_value = "8m")]
    pub file_bytes: u64,
    /// Bytes the foreground writer writes, alone and during the copy (a multiple of 1 MiB).
    #[arg(long, value_parser = super::parse_size, default_value = "32m")]
    pub writer_bytes: u64,
    /// Bound on each wait: for the chain table, for the drain to finish (ms).
    #[arg(long, default_value_t = 120_000)]
    pub wait_ms: u64,
    /// Extra `[meta]` settings (default: short membership timings, heartbeats every 200 ms).
    #[arg(
        long,
        default_value = "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nheartbeat_ms = 200"
    )]
    pub meta_config: String,
    /// Extra `[server]` settings (`resync_bytes_per_s` comes from `--rates`).
    #[arg(long, default_value = "heartbeat_ms = 200")]
    pub server_config: String,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// What one rate's run measured.
#[derive(Debug)]
struct Measured {
    rate_bytes_per_s: u64,
    copy_bytes: u64,
    chains: usize,
    copy: Duration,
    writer_alone_mb_per_s: f64,
    writer_during_mb_per_s: f64,
    /// When the writer during the copy finished, from the drain.
    writer_done: Duration,
}

impl Measured {
    fn copy_mb_per_s(&self) -> f64 {
        self.copy_bytes as f64 / 1e6 / self.copy.as_secs_f64().max(1e-9)
    }
}

pub fn run(args: RebuildArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.rates.is_empty(), "--rates lists no rate");
    anyhow::ensure!(args.files >= 1 && args.file_bytes >= 1, "--files and --file-bytes must be at least 1");
    anyhow::ensure!(
        args.writer_bytes >= WRITE_BYTES as u64 && args.writer_bytes.is_multiple_of(WRITE_BYTES as u64),
        "--writer-bytes must be a positive multiple of 1 MiB"
    );
    let mut runs = Vec::new();
    for &rate in &args.rates {
        let measured = measure(&args, rate).with_context(|| format!("resync_bytes_per_s = {rate}"))?;
        if !args.json {
            print_line(&measured);
        }
        runs.push(measured);
    }
    if args.json {
        let list: Vec<_> = runs
            .iter()
            .map(|m| {
                json!({
                    "resync_bytes_per_s": m.rate_bytes_per_s, "copy_bytes": m.copy_bytes, "chains": m.chains,
                    "copy_ms": m.copy.as_millis() as u64, "rebuild_mb_per_s": m.copy_mb_per_s(),
                    "writer_alone_mb_per_s": m.writer_alone_mb_per_s,
                    "writer_during_mb_per_s": m.writer_during_mb_per_s,
                    "writer_done_after_drain_ms": m.writer_done.as_millis() as u64,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "runs": list }))?);
    }
    Ok(())
}

fn print_line(m: &Measured) {
    println!(
        "resync_bytes_per_s={}: copied {} bytes ({} chains) in {} ms = {:.1} MB/s (the writer finished after {} ms); \
         foreground writes {:.1} MB/s alone, {:.1} MB/s during the copy ({:.2}x)",
        m.rate_bytes_per_s,
        m.copy_bytes,
        m.chains,
        m.copy.as_millis(),
        m.copy_mb_per_s(),
        m.writer_done.as_millis(),
        m.writer_alone_mb_per_s,
        m.writer_during_mb_per_s,
        m.writer_during_mb_per_s / m.writer_alone_mb_per_s.max(1e-9),
    );
}

/// One rate: a new cluster, the files, the writer alone, the drain with the writer.
fn measure(args: &RebuildArgs, rate: u64) -> anyhow::Result<Measured> {
    let wait = Duration::from_millis(args.wait_ms);
    let server_config = format!("{}\nresync_bytes_per_s = {rate}", args.server_config);
    let cluster = Cluster::start(&args.meta_config, &server_config)?;
    cluster.wait("every chain serving", wait, Cluster::all_serving)?;
    let client = cluster.client()?;
    let files = write_files(&client, args)?;
    let writer_bytes = usize::try_from(args.writer_bytes)?;
    let alone = timed_write(&client, "/fg-alone", writer_bytes)?;
    let drained = non_head_member(&client, &files[0].0)?;
    let on_drained = chains_with(&cluster, drained)?;
    // The writer's first file is on some chain too: copied if it is on one of these.
    let sizes = files.iter().map(|(name, data)| (name.as_str(), data.len() as u64));
    let copy_bytes = bytes_on(&client, sizes.chain([("/fg-alone", args.writer_bytes)]), &on_drained)?;
    let started = Instant::now();
    match cluster.call(&MetaRequest::TargetAdmin { target: drained, action: TargetAction::Drain })? {
        MetaReply::Done => {}
        other => anyhow::bail!("drain of target {drained}: {other:?}"),
    }
    let writer = {
        let client = cluster.client()?;
        std::thread::spawn(move || {
            timed_write(&client, "/fg-during", writer_bytes).map(|r| (r, Instant::now()))
        })
    };
    let copied = cluster.wait("the drain to finish", wait, |c| {
        c.chains().is_ok_and(|report| {
            report.chains_rebuilding == 0
                && report.chains.iter().all(|chain| chain.members.iter().all(|m| m.target != drained))
        })
    });
    let written = writer.join().map_err(|_| anyhow::anyhow!("the foreground writer panicked"))?;
    let copy = copied?;
    let (during, writer_end) = written?;
    for (name, data) in &files {
        let back = read_all(&client, name, data.len())?;
        anyhow::ensure!(back == *data, "{name} does not read back as written after the drain");
    }
    Ok(Measured {
        rate_bytes_per_s: rate,
        copy_bytes,
        chains: on_drained.len(),
        copy,
        writer_alone_mb_per_s: alone,
        writer_during_mb_per_s: during,
        writer_done: writer_end.duration_since(started),
    })
}

fn replicated() -> CreateOptions {
    let layout = Layout::Stripe { unit_bytes: UNIT_BYTES, count: 1 };
    CreateOptions { subfiles: 1, layout: Some(layout), replicas: 2, ..CreateOptions::default() }
}

/// Deterministic bytes of file `index` (not all alike, so a misplaced block shows).
fn file_data(index: u64, length: usize) -> Vec<u8> {
    crate::enwrich::member_bytes(index, length)
}

fn write_files(client: &Client, args: &RebuildArgs) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let length = usize::try_from(args.file_bytes)?;
    (0..args.files)
        .map(|index| {
            let name = format!("/rebuild-{index}");
            let data = file_data(index, length);
            let file = client.create(&name, &replicated()).with_context(|| format!("create {name}"))?;
            file.write_at(0, &data).with_context(|| format!("write {name}"))?;
            file.close().with_context(|| format!("close {name}"))?;
            Ok((name, data))
        })
        .collect()
}

/// Writes `bytes` to a new replicated file `name` in 1 MiB writes and closes it; MB/s.
fn timed_write(client: &Client, name: &str, bytes: usize) -> anyhow::Result<f64> {
    let chunk = file_data(77, WRITE_BYTES);
    let started = Instant::now();
    let file = client.create(name, &replicated()).with_context(|| format!("create {name}"))?;
    for index in 0..bytes / WRITE_BYTES {
        file.write_at((index * WRITE_BYTES) as u64, &chunk).with_context(|| format!("write {name}"))?;
    }
    file.close().with_context(|| format!("close {name}"))?;
    Ok(bytes as f64 / 1e6 / started.elapsed().as_secs_f64().max(1e-9))
}

/// The last member of the chain of `name`'s subfile 0 (not its head).
fn non_head_member(client: &Client, name: &str) -> anyhow::Result<TargetId> {
    let entry = client.stat(name)?;
    let chain = entry.subfiles.first().and_then(|s| s.chain.as_ref()).context("an unreplicated file")?;
    Ok(chain.members.last().context("a chain without members")?.target)
}

/// The chains that list `target` now.
fn chains_with(cluster: &Cluster, target: TargetId) -> anyhow::Result<BTreeSet<u32>> {
    let report = cluster.chains()?;
    let listing = report.chains.iter().filter(|c| c.members.iter().any(|m| m.target == target));
    Ok(listing.map(|c| c.chain).collect())
}

/// The bytes of the files `(name, size)` on `chains` (one subfile each: the whole file).
fn bytes_on<'a>(
    client: &Client,
    files: impl Iterator<Item = (&'a str, u64)>,
    chains: &BTreeSet<u32>,
) -> anyhow::Result<u64> {
    let mut bytes = 0u64;
    for (name, size) in files {
        let entry = client.stat(name)?;
        if entry.subfiles.iter().any(|s| s.chain.as_ref().is_some_and(|c| chains.contains(&c.chain))) {
            bytes += size;
        }
    }
    Ok(bytes)
}

fn read_all(client: &Client, name: &str, length: usize) -> anyhow::Result<Vec<u8>> {
    let file = client.open(name).with_context(|| format!("open {name}"))?;
    let mut out = vec![0u8; length];
    let read = file.read_at(0, &mut out).with_context(|| format!("read {name}"))?;
    out.truncate(read);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_differ_and_rates_are_computed_over_the_copy_time() {
        assert_ne!(file_data(0, 64), file_data(1, 64));
        assert_eq!(file_data(3, 64), file_data(3, 64));
        let m = Measured {
            rate_bytes_per_s: 0,
            copy_bytes: 50_000_000,
            chains: 3,
            copy: Duration::from_secs(2),
            writer_alone_mb_per_s: 30.0,
            writer_during_mb_per_s: 15.0,
            writer_done: Duration::from_secs(1),
        };
        assert!((m.copy_mb_per_s() - 25.0).abs() < 1e-9);
    }
}
