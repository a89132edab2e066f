//! What counting one request costs an I/O server with `metrics = true`: the work the worker
//! thread adds to every request (queue gauge up and down, the latency clock read, the
//! histogram, the server, job and target counters), timed over many requests and printed as
//! nanoseconds per request, for a 64-byte read (the interleaved benchmark's traditional mode)
//! and a 65,536-record strided read (its strided mode).
//!
//! `cargo run --release -p flotilla-server --example metrics_cost [REQUESTS]`
//!
//! Compare the figure with a request's own CPU cost (2 cores / requests per second served),
//! e.g. `flotilla bench interleaved --modes traditional`: about 100 µs per 64-byte request
//! on the 2-core machine of docs/performance.md.

use flotilla_proto::{ForkRef, IoReply, IoRequest};
use flotilla_request::Shape;
use flotilla_server::metrics::ServerMetrics;
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::time::Instant;

fn read(shape: Shape) -> IoRequest {
    let fork =
        ForkRef { target: TargetId(2), file: FileId(7), subfile: SubfileIndex(0), fork: "data".into() };
    IoRequest::Read { fork, shape }
}

/// Nanoseconds per counted request, over `requests` requests.
fn cost_ns(metrics: &ServerMetrics, request: &IoRequest, requests: u64) -> f64 {
    let job = metrics.jobs.counters("bench-job");
    let began = Instant::now();
    for _ in 0..requests {
        let started = Instant::now();
        metrics.queued(1);
        metrics.queued(-1);
        metrics.executed(request, &IoReply::Data, Some(&job), started.elapsed());
    }
    began.elapsed().as_nanos() as f64 / requests as f64
}

fn main() {
    let requests: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(2_000_000);
    let metrics = ServerMetrics::new((0..4).map(TargetId).collect(), 64, 16);
    let small = read(Shape::Contiguous { file_offset: 4096, memory_offset: 0, length: 64 });
    let strided = read(Shape::Strided {
        file_offset: 0,
        memory_offset: 0,
        record_bytes: 64,
        file_stride: 256,
        memory_stride: 64,
        count: 65_536,
    });
    for (name, request) in [("64-byte read", &small), ("strided read, 65,536 records", &strided)] {
        let mut runs: Vec<f64> = (0..5).map(|_| cost_ns(&metrics, request, requests)).collect();
        runs.sort_by(|a, b| a.total_cmp(b));
        println!("{name}: {:.1} ns per request (median of 5 runs of {requests})", runs[2]);
    }
    let stats = metrics.stats("example");
    assert!(stats.total.read_ops >= 10 * requests, "every counted request is in the totals");
}
