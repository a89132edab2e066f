//! `flotilla bench replica-stall`: the stall a writer of a replicated file sees when a server
//! dies (issue 32, docs/performance.md).
//!
//! One `flotilla meta` and four `flotilla server` processes on loopback, each server in its
//! own failure group; a `replicas=2` file of one subfile (so one chain of two members)
//! overwritten round and round by one writer thread in `--write-bytes` writes. `--kills`
//! times: one member of the file's chain (the head and the other member in turn) is
//! SIGKILLed; once the metadata service shows it out of the chain and the writer has been
//! answered again, it is restarted on its own target, and the next kill waits until every
//! chain serves with all its members again (and `--settle-ms` more). For each kill the
//! writer's longest gap between two acknowledged writes (a write is acknowledged when
//! `write_at` returns: every current replica has it) is reported from the kill to the
//! restart (the death) and from the restart to the next kill (the return and resync), then
//! the median and worst of the deaths'. A write that fails is counted and reported: the
//! design says a writer never sees one.

use super::replica_cluster::Cluster;
use anyhow::Context;
use clap::Args;
use flotilla_client::{CreateOptions, Layout};
use flotilla_proto::ChainMemberState;
use flotilla_types::TargetId;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most write errors kept for the report (all are counted).
const ERRORS_KEPT_MAX: usize = 10;

#[derive(Args, Clone, Debug)]
pub struct StallArgs {
    /// Times a member of the writer's chain is SIGKILLed (and restarted).
    #[arg(long, default_value_t = 10)]
    pub kills: usize,
    /// Bytes per write call (k, m suffixes).
    #[arg(long, value_parser = super::parse_size, default_value = "64k")]
    pub write_bytes: u64,
    /// The file's size: the writer overwrites it round and round.
    #[arg(long, value_parser = super::parse_size, default_value = "8m")]
    pub file_bytes: u64,
    /// Writing goes on this long with every chain serving before each kill (ms).
    #[arg(long, default_value_t = 1000)]
    pub settle_ms: u64,
    /// Bound on each wait: for a member to be fenced, for every chain to serve again (ms).
    #[arg(long, default_value_t = 120_000)]
    pub wait_ms: u64,
    /// Extra `[meta]` settings, e.g. "fence_after_ms = 1000" (default: the service's defaults).
    #[arg(long, default_value = "")]
    pub meta_config: String,
    /// Extra `[server]` settings, e.g. "heartbeat_ms = 200" (a lease shorter than the
    /// servers' heartbeat period runs out between heartbeats: set both).
    #[arg(long, default_value = "")]
    pub server_config: String,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// What the writer saw, by phase (0: before the first kill; then per kill its death, from
/// the kill to the restart, and its return, from the restart to the next kill).
#[derive(Debug, Default)]
struct Seen {
    phase: usize,
    longest_gap: Vec<Duration>,
    writes: Vec<u64>,
    errors: u64,
    kept: Vec<String>,
    last_ack: Option<Instant>,
}

impl Seen {
    fn acked(&mut self, now: Instant) {
        let phase = self.phase;
        if let Some(last) = self.last_ack {
            self.longest_gap[phase] = self.longest_gap[phase].max(now - last);
        }
        self.writes[phase] += 1;
        self.last_ack = Some(now);
    }
}

/// The median of `values` (the mean of the middle two for an even count); zero for none.
pub(crate) fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
    }
}

pub fn run(args: StallArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.kills >= 1, "--kills must be at least 1");
    anyhow::ensure!(
        args.write_bytes >= 1 && args.write_bytes <= args.file_bytes,
        "--write-bytes must be between 1 and --file-bytes"
    );
    let wait = Duration::from_millis(args.wait_ms);
    let mut cluster = Cluster::start(&args.meta_config, &args.server_config)?;
    cluster.wait("every chain serving", wait, Cluster::all_serving)?;
    let client = cluster.client()?;
    let layout = Layout::Stripe { unit_bytes: 1 << 20, count: 1 };
    let options =
        CreateOptions { subfiles: 1, layout: Some(layout), replicas: 2, ..CreateOptions::default() };
    let file = client.create("/stall", &options).context("create the replicated file")?;
    let write_bytes = usize::try_from(args.write_bytes)?;
    let block: Vec<u8> = (0..write_bytes).map(|i| (i % 251) as u8).collect();
    for offset in (0..args.file_bytes).step_by(write_bytes) {
        file.write_at(offset, &block).context("fill the file")?;
    }
    let entry = client.stat("/stall")?;
    let chain = entry.subfiles.first().and_then(|s| s.chain.as_ref()).map(|c| c.chain);
    let chain = chain.context("the file's subfile has no chain")?;

    let phases = 1 + 2 * args.kills;
    let seen = Arc::new(Mutex::new(Seen {
        longest_gap: vec![Duration::ZERO; phases],
        writes: vec![0; phases],
        ..Seen::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (seen, stop, file) = (seen.clone(), stop.clone(), file.clone());
        let writes_per_round = (args.file_bytes / args.write_bytes).max(1);
        std::thread::spawn(move || {
            let mut index = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let offset = (index % writes_per_round) * block.len() as u64;
                let outcome = file.write_at(offset, &block);
                let now = Instant::now();
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                match outcome {
                    Ok(()) => seen.acked(now),
                    Err(error) => {
                        seen.errors += 1;
                        if seen.kept.len() < ERRORS_KEPT_MAX {
                            seen.kept.push(format!("write at {offset}: {error}"));
                        }
                    }
                }
                index += 1;
            }
        })
    };
    let phase = |to: usize| seen.lock().unwrap_or_else(|e| e.into_inner()).phase = to;
    let writes = || seen.lock().unwrap_or_else(|e| e.into_inner()).writes.iter().sum::<u64>();

    let mut kills = Vec::new();
    let outcome = (|| -> anyhow::Result<()> {
        std::thread::sleep(Duration::from_millis(args.settle_ms));
        for kill in 0..args.kills {
            // The head, then the other member, in turn.
            let report = cluster.chains()?;
            let info = report.chains.iter().find(|c| c.chain == chain).context("the file's chain is gone")?;
            let victim: TargetId = info.members[kill % info.members.len()].target;
            let addr = client
                .status()?
                .into_iter()
                .find(|t| t.target == victim)
                .map(|t| t.server)
                .context("the victim target has no server")?;
            let index = cluster
                .servers
                .iter()
                .position(|s| s.as_ref().is_some_and(|s| s.addr == addr))
                .with_context(|| format!("no server of this cluster at {addr}"))?;
            phase(1 + 2 * kill);
            let killed_at = Instant::now();
            cluster.servers[index].take().context("the victim is already down")?.kill();
            let fenced = cluster.wait("the killed member fenced", wait, |c| {
                c.chains().is_ok_and(|r| {
                    r.chains.iter().any(|c| {
                        c.chain == chain
                            && c.members
                                .iter()
                                .any(|m| m.target == victim && m.state != ChainMemberState::Serving)
                    })
                })
            })?;
            let after = writes();
            cluster.wait("the writer answered after the fence", wait, |_| writes() > after)?;
            phase(2 + 2 * kill);
            cluster.servers[index] = Some(cluster.start_server(index)?);
            let back = cluster.wait("every chain serving again", wait, Cluster::all_serving)?;
            std::thread::sleep(Duration::from_millis(args.settle_ms));
            kills.push((index, victim, kill % 2 == 0, fenced, back, killed_at.elapsed()));
        }
        Ok(())
    })();
    stop.store(true, Ordering::SeqCst);
    let _ = writer.join();
    let _ = file.close();
    for server in cluster.servers.iter_mut().filter_map(Option::take) {
        server.kill();
    }
    outcome?;

    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let deaths: Vec<Duration> = (0..args.kills).map(|k| seen.longest_gap[1 + 2 * k]).collect();
    let returns: Vec<Duration> = (0..args.kills).map(|k| seen.longest_gap[2 + 2 * k]).collect();
    let worst = deaths.iter().max().copied().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if args.json {
        let list: Vec<_> = kills
            .iter()
            .enumerate()
            .map(|(k, (index, victim, head, fenced, back, _))| {
                json!({
                    "server": index, "target": victim.to_string(), "head": head,
                    "stall_ms": ms(deaths[k]), "return_stall_ms": ms(returns[k]),
                    "fenced_after_ms": ms(*fenced), "serving_again_after_restart_ms": ms(*back),
                })
            })
            .collect();
        let report = json!({
            "kills": list, "median_stall_ms": ms(median(&deaths)), "worst_stall_ms": ms(worst),
            "median_return_stall_ms": ms(median(&returns)),
            "longest_gap_before_kills_ms": ms(seen.longest_gap[0]),
            "writes": seen.writes.iter().sum::<u64>(), "write_errors": seen.errors, "errors": seen.kept,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "writer: one replicas=2 file, {} B writes; longest gap before any kill {:.0} ms",
            args.write_bytes,
            ms(seen.longest_gap[0])
        );
        for (k, (index, victim, head, fenced, back, _)) in kills.iter().enumerate() {
            println!(
                "kill {}: server {index} (target {victim}, {}) stall {:.0} ms (fenced after {:.0} ms); \
                 restarted: every chain serving after {:.0} ms, longest gap {:.0} ms",
                k + 1,
                if *head { "head" } else { "tail" },
                ms(deaths[k]),
                ms(*fenced),
                ms(*back),
                ms(returns[k]),
            );
        }
        println!(
            "stall over {} kills: median {:.0} ms, worst {:.0} ms; after the restarts: median {:.0} ms, worst {:.0} ms",
            args.kills,
            ms(median(&deaths)),
            ms(worst),
            ms(median(&returns)),
            ms(returns.iter().max().copied().unwrap_or_default()),
        );
        println!("writes acknowledged {}, failed {}", seen.writes.iter().sum::<u64>(), seen.errors);
        for error in &seen.kept {
            println!("  error: {error}");
        }
    }
    anyhow::ensure!(seen.errors == 0, "{} writes failed (the writer must never see an error)", seen.errors);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_gaps() {
        let ms = Duration::from_millis;
        assert_eq!(median(&[]), Duration::ZERO);
        assert_eq!(median(&[ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(&[ms(4), ms(1), ms(2), ms(3)]), ms(2) + ms(1) / 2);
        let mut seen = Seen { longest_gap: vec![Duration::ZERO; 2], writes: vec![0; 2], ..Seen::default() };
        let start = Instant::now();
        seen.acked(start);
        seen.acked(start + ms(5));
        seen.phase = 1;
        seen.acked(start + ms(105));
        seen.acked(start + ms(110));
        assert_eq!(seen.longest_gap, vec![ms(5), ms(100)], "a gap counts in the phase it ends in");
        assert_eq!(seen.writes, vec![2, 2]);
    }
}
