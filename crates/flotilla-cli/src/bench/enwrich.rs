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
//! `wss` (synchronous sequential) writers keep lock-step rounds through a barrier, one record
//! each per round. Fig. 7's sweep gives a point its own writer count.
//!
//! Two-array workloads write two files (each array half the bytes); in ENWRICH each file is
//! its own job (of the processes writing that array), the cache split between them.
//!
//! A run's time is from the first writer starting to the last one finishing (its data
//! durable and the size published). The file is read back and checked after the timer.

use super::cluster::Cluster;
use super::hpf::Workload;
use flotilla_client::{Client, CreateOptions, EnwrichOptions, Layout};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Writer processes (threads with their own clients) per run, unless a point says otherwise
/// (Fig. 7's sweep of the compute processors).
pub const MEMBERS: u64 = 4;
/// Most writers a point may have.
pub const WRITERS_MAX: u64 = 64;

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
    pub workload: Workload,
    pub record_bytes: u64,
    pub file_bytes: u64,
    pub cache_bytes: u64,
    pub method: Method,
    /// Writer processes (1..=`WRITERS_MAX`).
    pub writers: u64,
}

impl Point {
    /// Records per side of each array (two arrays share the file bytes).
    fn order(self) -> u64 {
        ((self.file_bytes / self.workload.arrays() as u64 / self.record_bytes) as f64).sqrt() as u64
    }

    /// Bytes of one array.
    fn array_bytes(self) -> u64 {
        self.order() * self.order() * self.record_bytes
    }

    pub fn bytes(self) -> u64 {
        self.array_bytes() * self.workload.arrays() as u64
    }
}

/// The bytes of record `index`.
fn record(index: u64, bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (index.wrapping_mul(131).wrapping_add(i * 7) % 251) as u8).collect()
}

/// The arrays member `member` writes: (array, its file path, that array's writer count).
fn arrays_of(point: Point, path: &str, member: u64) -> Vec<(usize, String, u64)> {
    (0..point.workload.arrays())
        .filter_map(|array| {
            let (first, count) = point.workload.writers(array, point.writers);
            (member >= first && member < first + count).then(|| (array, format!("{path}-{array}"), count))
        })
        .collect()
}

fn writer(
    client: Client,
    path: &str,
    point: Point,
    member: u64,
    (start, rounds): (&Barrier, &Barrier),
) -> anyhow::Result<(Instant, Instant)> {
    let writes = point.workload.writes(point.order(), point.writers, member);
    let arrays = arrays_of(point, path, member);
    let slot = |array: usize| arrays.iter().position(|a| a.0 == array).unwrap_or(0);
    match point.method {
        Method::Traditional => {
            let files = arrays.iter().map(|(_, file, _)| client.open(file)).collect::<Result<Vec<_>, _>>()?;
            start.wait();
            let began = Instant::now();
            write_records(point, &writes, rounds, |array, at, data| {
                files[slot(array)].write_at(at, data).map(drop).map_err(anyhow::Error::from)
            })?;
            for file in &files {
                file.sync()?;
            }
            Ok((began, Instant::now()))
        }
        Method::Enwrich => {
            let mut files = Vec::new();
            for (_, file, count) in &arrays {
                let job = format!("bench-{}", file.trim_start_matches('/'));
                let mut options = EnwrichOptions::new(job, *count as u32);
                options.cache_bytes = point.cache_bytes / arrays.len() as u64;
                options.flush_timeout_ms = 0;
                files.push(client.open_enwrich(file, &options)?);
            }
            start.wait();
            let began = Instant::now();
            write_records(point, &writes, rounds, |array, at, data| {
                files[slot(array)].write_at(at, data).map(drop).map_err(anyhow::Error::from)
            })?;
            for file in files {
                file.close()?;
            }
            Ok((began, Instant::now()))
        }
    }
}

/// Writes a writer's records in its order through `write(array, offset, bytes)`. For a
/// synchronous workload (`wss`) every writer passes `rounds` after each round, as many
/// rounds as the busiest writer has records (a writer with fewer, or one whose write failed,
/// still keeps the rounds, so the others are never left waiting).
fn write_records(
    point: Point,
    writes: &[(usize, u64)],
    rounds: &Barrier,
    mut write: impl FnMut(usize, u64, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let synchronous = point.workload.synchronous();
    let count = if synchronous { point.workload.rounds(point.order(), point.writers) } else { writes.len() };
    let mut failed = None;
    for k in 0..count {
        if let (None, Some(&(array, r))) = (&failed, writes.get(k)) {
            if let Err(error) = write(array, r * point.record_bytes, &record(r, point.record_bytes)) {
                failed = Some(error);
            }
        }
        if synchronous {
            rounds.wait();
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Runs `point` once on a fresh file; its seconds.
pub fn run_once(cluster: &Cluster, point: Point, run: usize) -> anyhow::Result<f64> {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = format!(
        "/enwrich-{}-{}-{}-{run}-{}-{nanos}",
        point.workload.name(),
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
    for array in 0..point.workload.arrays() {
        client.create(&format!("{path}-{array}"), &options)?.close()?;
    }
    anyhow::ensure!(
        (1..=WRITERS_MAX).contains(&point.writers),
        "writers must be 1 to {WRITERS_MAX}, not {}",
        point.writers
    );
    let start = Arc::new(Barrier::new(point.writers as usize));
    let rounds = Arc::new(Barrier::new(point.writers as usize));
    let writers: Vec<_> = (0..point.writers)
        .map(|member| {
            let (client, path, start, rounds) =
                (cluster.client(), path.clone(), start.clone(), rounds.clone());
            std::thread::spawn(move || writer(client?, &path, point, member, (&start, &rounds)))
        })
        .collect();
    let mut spans = Vec::new();
    for writer in writers {
        spans.push(writer.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??);
    }
    let began = spans.iter().map(|s| s.0).min().unwrap_or_else(Instant::now);
    let ended = spans.iter().map(|s| s.1).max().unwrap_or(began);
    for array in 0..point.workload.arrays() {
        let file = format!("{path}-{array}");
        check(&client, &file, point)?;
        client.remove(&file)?;
    }
    Ok(ended.duration_since(began).as_secs_f64())
}

/// Reads the file back: every record must hold its bytes.
fn check(client: &Client, path: &str, point: Point) -> anyhow::Result<()> {
    let file = client.open(path)?;
    let mut data = vec![0u8; point.array_bytes() as usize];
    file.read_at(0, &mut data)?;
    for (index, chunk) in data.chunks(point.record_bytes as usize).enumerate() {
        if chunk != record(index as u64, point.record_bytes).as_slice() {
            anyhow::bail!(
                "{} {}: record {index} of {path} is wrong after the run",
                point.method.name(),
                point.workload.name()
            );
        }
    }
    Ok(())
}
