//! Helpers of the replication tests (issue 32: `replicated`, `resync`, `rebuild`,
//! `meta_chains`, ...): polling for a cluster's state with a bound, replicated create
//! options, a cluster with one server per failure group.

use super::{cli, Cluster};
use flotilla_client::CreateOptions;
use std::time::{Duration, Instant};

/// How often the waits below look again.
const POLL: Duration = Duration::from_millis(100);

/// Polls `probe` until it gives a value and returns it; fails the test naming `what` if it
/// gives none within `within`.
pub fn until<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(POLL);
    }
}

/// Polls `done` until it holds; fails the test naming `what` if it does not within `within`.
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    until(what, within, || done().then_some(()))
}

/// `subfiles` stripes of `unit_bytes` (at least one subfile per chain), two replicas each.
pub fn replicated(subfiles: u32, unit_bytes: u64) -> CreateOptions {
    let layout = flotilla_types::Layout::Stripe { unit_bytes, count: subfiles };
    CreateOptions { subfiles, layout: Some(layout), replicas: 2, ..CreateOptions::default() }
}

/// Whether the metadata service at `meta` built its chain table (`status --chains` lists a
/// chain); false also when the command fails.
pub fn chain_table_built(meta: &str) -> bool {
    !chain_lines(meta).is_empty()
}

/// The chain lines of `flotilla status --chains` (`chain=N version=V members=...`),
/// trimmed and sorted; none when the command fails (a metadata node being replaced).
pub fn chain_lines(meta: &str) -> Vec<String> {
    let (ok, stdout, stderr) = cli(&["status", "--chains", "--meta", meta]);
    if !ok {
        eprintln!("status --chains --meta {meta}: {stderr}");
        return Vec::new();
    }
    let mut lines: Vec<String> =
        stdout.lines().map(str::trim).filter(|l| l.starts_with("chain=")).map(str::to_string).collect();
    lines.sort();
    lines
}

impl Cluster {
    /// A metadata service (`meta_extra` added to `[meta]`) and one server per group, server
    /// `index` in `groups[index]` (`server_extra` added to `[server]`); returns once every
    /// target is up and the chain table is built (within `within`).
    pub fn start_in_groups(
        meta_extra: &str,
        server_extra: &str,
        groups: &[&str],
        within: Duration,
    ) -> Cluster {
        let mut cluster = Cluster::start_configured(0, meta_extra, server_extra);
        for (index, group) in groups.iter().enumerate() {
            let server = cluster.start_server_in_group(index, group);
            cluster.servers.push(Some(server));
        }
        cluster.wait_up(groups.len());
        let meta = cluster.meta_addr();
        wait_until("the chain table", within, || chain_table_built(&meta));
        cluster
    }
}
