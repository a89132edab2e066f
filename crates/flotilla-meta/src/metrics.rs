//! What the metadata service counts for its metrics endpoint: request latencies by kind,
//! errors by code and open connections, in relaxed atomics; written at scrape time.
//!
//! A request's kind is its message's variant index (the first byte of its postcard body),
//! so new request kinds need no change here; the label is the variant's name, taken once.

use flotilla_metrics::write::{self, Labels};
use flotilla_metrics::{ErrorCounts, LatencyHistogram};
use flotilla_proto::{MetaReply, MetaRequest};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Request kinds counted apart; variant indexes at or past the last share it.
const KINDS_MAX: usize = 96;

#[derive(Debug)]
pub(crate) struct MetaMetrics {
    latency: [LatencyHistogram; KINDS_MAX],
    names: [OnceLock<String>; KINDS_MAX],
    errors: ErrorCounts,
    connections: AtomicI64,
    connections_total: AtomicU64,
}

impl Default for MetaMetrics {
    fn default() -> Self {
        MetaMetrics {
            latency: std::array::from_fn(|_| LatencyHistogram::default()),
            names: std::array::from_fn(|_| OnceLock::new()),
            errors: ErrorCounts::default(),
            connections: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
        }
    }
}

impl MetaMetrics {
    pub fn connection(&self, delta: i64) {
        self.connections.fetch_add(delta, Ordering::Relaxed);
        if delta > 0 {
            self.connections_total.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Names the kind of requests whose body begins with `variant` (once per kind).
    pub fn name_kind(&self, variant: u8, request: &MetaRequest) {
        let index = usize::from(variant).min(KINDS_MAX - 1);
        self.names[index].get_or_init(|| {
            if index == KINDS_MAX - 1 {
                "other".into()
            } else {
                variant_name(request)
            }
        });
    }

    /// Counts one request whose body began with `variant` and was answered with `reply`.
    pub fn handled(&self, variant: u8, reply: &MetaReply, elapsed: Duration) {
        let index = usize::from(variant).min(KINDS_MAX - 1);
        self.latency[index].observe(elapsed);
        if let MetaReply::Error(error) = reply {
            self.errors.add(error.code);
        }
    }

    /// A request refused before it was handled (undecodable, bad frame).
    pub fn refused(&self, code: flotilla_proto::ErrorCode) {
        self.errors.add(code);
    }
}

/// `lookup` for `MetaRequest::Lookup { .. }`: the variant's name in snake case.
fn variant_name(request: &MetaRequest) -> String {
    let debug = format!("{request:?}");
    let name = debug.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("unknown");
    let mut snake = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

/// Writes the service's metrics at scrape time.
#[derive(Debug)]
pub(crate) struct MetaCollector {
    pub metrics: Weak<MetaMetrics>,
    pub acceptor: Weak<flotilla_auth::Acceptor>,
    pub chains: Weak<crate::chains::ChainGauges>,
    pub inode_tokens: Weak<crate::inode_tokens::InodeTokenCounts>,
}

impl Collector for MetaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (Some(metrics), Some(acceptor)) = (self.metrics.upgrade(), self.acceptor.upgrade()) else {
            return Ok(());
        };
        let latency: Vec<(Labels, &LatencyHistogram)> = metrics
            .names
            .iter()
            .zip(&metrics.latency)
            .filter_map(|(name, histogram)| Some((vec![("kind", name.get()?.clone())], histogram)))
            .collect();
        let help = "Time from a metadata request's arrival to its reply, by kind.";
        write::histograms(&mut encoder, ("meta_request_duration", help), &latency)?;
        let help = "Metadata requests answered with an error, by code.";
        write::counters(&mut encoder, ("meta_errors", help, None), &metrics.errors.samples())?;
        let open = metrics.connections.load(Ordering::Relaxed);
        write::gauge(&mut encoder, "meta_connections", "Connections open.", None, open)?;
        let opened = metrics.connections_total.load(Ordering::Relaxed);
        write::counter(&mut encoder, "meta_connections_opened", "Connections authenticated.", None, opened)?;
        write::counter(&mut encoder, "meta_auth_failures", "Handshakes refused.", None, acceptor.failures())?;
        if let Some(counts) = self.inode_tokens.upgrade() {
            let help = "Inode tokens revoked from their holders (issue 12, 34).";
            let revoked = counts.revoked.load(Ordering::Relaxed);
            write::counter(&mut encoder, "meta_inode_token_revocations", help, None, revoked)?;
            let help = "Revoked inode tokens not given back within token_wait_ms_max (dropped anyway).";
            let unanswered = counts.unanswered.load(Ordering::Relaxed);
            write::counter(&mut encoder, "meta_inode_token_revocations_unanswered", help, None, unanswered)?;
        }
        match self.chains.upgrade() {
            Some(chains) => write_chains(&mut encoder, &chains),
            None => Ok(()),
        }
    }
}

/// The chain table's gauges (replication, issue 32).
fn write_chains(encoder: &mut DescriptorEncoder, chains: &crate::chains::ChainGauges) -> std::fmt::Result {
    let gauges = [
        ("meta_chains", "Chains in the chain table.", &chains.chains),
        ("meta_chains_degraded", "Chains with fewer serving members than chain_replicas.", &chains.degraded),
        ("meta_chains_unavailable", "Chains whose serving members are all down.", &chains.unavailable),
        (
            "meta_chain_targets_down",
            "Targets fenced out of their chains (silent past fence_after_ms).",
            &chains.targets_down,
        ),
        (
            "meta_chain_targets_dead",
            "Targets declared dead (silent past dead_after_ms).",
            &chains.targets_dead,
        ),
        (
            "meta_chain_targets_draining",
            "Targets being drained or removed by the operator (flotilla target drain|remove).",
            &chains.targets_draining,
        ),
        (
            "meta_chains_rebuilding",
            "Chains with a member being copied (a returning, replacement or drain target).",
            &chains.rebuilding,
        ),
        (
            "meta_rebuild_bytes_left",
            "Estimated bytes left to copy on the rebuilding chains (as of the last flotilla status).",
            &chains.rebuild_bytes_left,
        ),
    ];
    for (name, help, value) in gauges {
        let value = i64::try_from(value.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        write::gauge(encoder, name, help, None, value)?;
    }
    Ok(())
}

pub(crate) fn collector(
    metrics: &Arc<MetaMetrics>,
    acceptor: &Arc<flotilla_auth::Acceptor>,
    chains: &Arc<crate::chains::ChainGauges>,
    inode_tokens: &Arc<crate::inode_tokens::InodeTokenCounts>,
) -> MetaCollector {
    MetaCollector {
        metrics: Arc::downgrade(metrics),
        acceptor: Arc::downgrade(acceptor),
        chains: Arc::downgrade(chains),
        inode_tokens: Arc::downgrade(inode_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_in_snake_case() {
        assert_eq!(variant_name(&MetaRequest::Lookup { path: "/a".into() }), "lookup");
        assert_eq!(variant_name(&MetaRequest::Status), "status");
    }
}
