//! A client's own metrics, when asked for (`ClientConfig::metrics_listen`): bytes and
//! requests it sent the I/O servers, their round-trip latency by kind, and how often a
//! request waited for flow-control credit. Relaxed atomics; written at scrape time.

use flotilla_metrics::write::{self, Labels};
use flotilla_metrics::{ErrorCounts, LatencyHistogram};
use flotilla_proto::IoRequest;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

const KINDS: [&str; 3] = ["read", "write", "other"];

#[derive(Debug, Default)]
pub(crate) struct ClientMetrics {
    latency: [LatencyHistogram; 3],
    bytes: [AtomicU64; 2],
    credit_waits: AtomicU64,
    pub errors: ErrorCounts,
}

impl ClientMetrics {
    /// Counts one finished round trip of `request`, which moved `bytes`.
    pub fn observed(&self, request: &IoRequest, bytes: u64, elapsed: Duration) {
        // A replicated subfile's request counts as what it carries.
        let request = match request {
            IoRequest::Chained { request, .. } => request,
            other => other,
        };
        let kind = match request {
            IoRequest::Read { .. } => 0,
            IoRequest::Write { .. } => 1,
            _ => 2,
        };
        self.latency[kind].observe(elapsed);
        if kind < 2 {
            self.bytes[kind].fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn credit_wait(&self) {
        self.credit_waits.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub(crate) struct ClientCollector(pub Weak<ClientMetrics>);

impl Collector for ClientCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(metrics) = self.0.upgrade() else { return Ok(()) };
        let latency: Vec<(Labels, &LatencyHistogram)> =
            KINDS.iter().zip(&metrics.latency).map(|(k, h)| (vec![("kind", k.to_string())], h)).collect();
        let help = "Round trip of a request to an I/O server, by kind.";
        write::histograms(&mut encoder, ("client_request_duration", help), &latency)?;
        let bytes: Vec<(Labels, u64)> = KINDS[..2]
            .iter()
            .zip(&metrics.bytes)
            .map(|(k, b)| (vec![("kind", k.to_string())], b.load(Ordering::Relaxed)))
            .collect();
        let help = "Bytes read from or written to I/O servers.";
        write::counters(&mut encoder, ("client_data", help, Some(Unit::Bytes)), &bytes)?;
        let waits = metrics.credit_waits.load(Ordering::Relaxed);
        let help = "Requests that waited for flow-control credit of their server.";
        write::counter(&mut encoder, "client_credit_waits", help, None, waits)?;
        let help = "Requests an I/O server answered with an error, by code.";
        write::counters(&mut encoder, ("client_errors", help, None), &metrics.errors.samples())
    }
}

/// A registry with the client's metrics (prefix `flotilla`).
pub(crate) fn registry(metrics: &Arc<ClientMetrics>) -> flotilla_metrics::Registry {
    let mut registry = flotilla_metrics::Registry::with_prefix("flotilla");
    registry.register_collector(Box::new(ClientCollector(Arc::downgrade(metrics))));
    registry
}
