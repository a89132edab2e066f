//! Flotilla's metrics: cheap counters for the hot paths and their Prometheus form.
//!
//! Services count with relaxed atomics ([`LatencyHistogram`], [`JobTable`]'s counters) and
//! never take a lock per request; a scrape walks the counters through the collectors each
//! service registers with a `prometheus_client` [`Registry`], which formats the text.
//! [`serve`] answers scrapes over HTTP (hyper), with a bound on connections and on the time
//! a request may take to arrive.

mod endpoint;
mod errors;
mod histogram;
mod jobs;
pub mod write;

pub use endpoint::{bind, EndpointConfig, MetricsError, MetricsHandle};
pub use errors::ErrorCounts;
pub use histogram::{LatencyHistogram, LATENCY_BUCKETS_SECONDS};
pub use jobs::{JobCounters, JobTable, OpKind, OTHER_JOBS};
pub use prometheus_client::registry::Registry;

/// The Prometheus text of everything registered in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a bug in a collector.
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, registry) {
        tracing::error!(%error, "formatting metrics failed");
    }
    text
}
