//! `flotilla bench paper enwrich`: the ENWRICH paper's comparison (Purakayastha, Ellis &
//! Kotz §5, Figs. 4 and 5) of ENWRICH with traditional caching (TC), on the HPF write
//! patterns of `hpf.rs`, scaled to this machine: `MEMBERS` writer threads (each with its own
//! `Client`, so its own connections, as separate processes would have) over four servers.
//!
//! - *TC*: every record is written straight to the servers (`File::write_at`, one request per
//!   record; the servers' write-back cache holds it), then each writer syncs.
//! - *ENWRICH*: every writer opens the file in ENWRICH mode in one job; records go to its
//!   log cache; flushes are triggered by full caches and by the final close.
//!
//! A run's time is from the first writer starting to the last one finishing (its data
//! durable and the size published). The file is read back and checked after the timer.

use super::cluster::Cluster;
use super::hpf::Pattern;
use flotilla_client::{Client, CreateOptions, EnwrichOptions, Layout};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Writer processes (threads with their own clients) per run.
pub const MEMBERS: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Traditional,
    Enwrich,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Traditional => "TC",
            Method::Enwrich => "ENWRICH",
        }
    }
}

/// One experiment point.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub pattern: Pattern,
    pub record_bytes: u64,
    pub file_bytes: u64,
    pub cache_bytes: u64,
    pub method: Method,
}

impl Point {
    fn order(self) -> u64 {
        ((self.file_bytes / self.record_bytes) as f64).sqrt() as u64
    }

    pub fn bytes(self) -> u64 {
        self.order() * self.order() * self.record_bytes
    }
}

/// The bytes of record `index`.
fn record(index: u64, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (index.wrapping_mul(131).wrapping_add(i * 7) % 251) as u8).collect()
}

fn writer(
    client: Client,
    path: &str,
    point: Point,
    member: u64,
    start: &Barrier,
) -> anyhow::Result<(Instant, Instant)> {
    let order = point.order();
    let records = point.pattern.records(order, MEMBERS, member);
    match point.method {
        Method::Traditional => {
            let file = client.open(path)?;
            start.wait();
            let began = Instant::now();
            for r in records {
                file.write_at(r * point.record_bytes, &record(r, point.record_bytes))?;
            }
            file.sync()?;
            Ok((began, Instant::now()))
        }
        Method::Enwrich => {
            let job = format!("bench-{}", path.trim_start_matches('/'));
            let mut options = EnwrichOptions::new(job, MEMBERS as u32);
            options.cache_bytes = point.cache_bytes;
            options.flush_timeout_ms = 0;
            let file = client.open_enwrich(path, &options)?;
            start.wait();
            let began = Instant::now();
            for r in records {
                file.write_at(r * point.record_bytes, &record(r, point.record_bytes))?;
            }
            file.close()?;
            Ok((began, Instant::now()))
        }
    }
}

/// Runs `point` once on a fresh file; its seconds.
pub fn run_once(cluster: &Cluster, point: Point, run: usize) -> anyhow::Result<f64> {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = format!(
        "/enwrich-{}-{}-{}-{run}-{}-{nanos}",
        point.pattern.name(),
        point.record_bytes,
        point.method.name(),
        std::process::id()
    );
    let client = cluster.client()?;
    let options = CreateOptions {
        subfiles: 4,
        layout: Some(Layout::Stripe { unit_bytes: 64 << 10, count: 4 }),
        ..CreateOptions::default()
    };
    client.create(&path, &options)?.close()?;
    let start = Arc::new(Barrier::new(MEMBERS as usize));
    let writers: Vec<_> = (0..MEMBERS)
        .map(|member| {
            let (client, path, start) = (cluster.client(), path.clone(), start.clone());
            std::thread::spawn(move || writer(client?, &path, point, member, &start))
        })
        .collect();
    let mut spans = Vec::new();
    for writer in writers {
        spans.push(writer.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??);
    }
    let began = spans.iter().map(|s| s.0).min().unwrap_or_else(Instant::now);
    let ended = spans.iter().map(|s| s.1).max().unwrap_or(began);
    check(&client, &path, point)?;
    client.remove(&path)?;
    Ok(ended.duration_since(began).as_secs_f64())
}

/// Reads the file back: every record must hold its bytes.
fn check(client: &Client, path: &str, point: Point) -> anyhow::Result<()> {
    let file = client.open(path)?;
    let mut data = vec![0u8; point.bytes() as usize];
    file.read_at(0, &mut data)?;
    for (index, chunk) in data.chunks(point.record_bytes as usize).enumerate() {
        if chunk != record(index as u64, point.record_bytes).as_slice() {
            anyhow::bail!(
                "{} {}: record {index} of {path} is wrong after the run",
                point.method.name(),
                point.pattern.name()
            );
        }
    }
    Ok(())
}
