//! Completion-driven execution through a real server (issue 12): with one worker thread and
//! a simulated HP 97560 disk, a read of cached bytes from a second client is answered while
//! a first client's cold read waits for the disk, because the cold read is parked instead of
//! holding the worker. With `parked_requests_max = 0` (the behaviour before) the cached read
//! waits behind the cold one.

mod common;

use common::{http_get, path, Local};
use flotilla_client::{Client, CreateOptions, Shape};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records of the cold read, each in its own 32 KiB block, 512 KiB apart on the disk.
const COLD_RECORDS: u64 = 96;
const COLD_STRIDE_BYTES: u64 = 512 << 10;

/// `flotilla local` with one server on a `sim:hp97560` target, one worker thread, and
/// `parked_requests_max` as given; its metrics endpoint on.
struct SimLocal {
    local: Local,
    _config: tempfile::NamedTempFile,
}

impl SimLocal {
    fn start(parked_requests_max: usize) -> SimLocal {
        let config = tempfile::NamedTempFile::new().expect("config file");
        let text = format!("[server]\nworkers = 1\nparked_requests_max = {parked_requests_max}\n");
        std::fs::write(config.path(), text).expect("write the config");
        let global = ["--config", path(config.path())];
        let local = ["--servers", "1", "--target-kind", "sim:hp97560"];
        SimLocal { local: Local::start_with(&global, &local, true), _config: config }
    }

    fn client(&self) -> Client {
        let mut config = flotilla_client::ClientConfig::new(&self.local.meta);
        config.key = Some(self.local.key.clone());
        Client::with_config(config).expect("client")
    }

    /// A gauge or counter of the server's metrics, summed over its label sets.
    fn metric(&self, name: &str) -> u64 {
        let metrics = self.local.metrics.as_deref().expect("a metrics endpoint");
        let text = http_get(metrics, "/metrics").expect("scrape the metrics");
        text.lines()
            .filter(|line| line.split([' ', '{']).next() == Some(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits (at most 20 s) until the server holds `depth` requests queued or executing.
    fn await_queue_depth(&self, depth: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.metric("flotilla_server_queue_depth") < depth {
            assert!(Instant::now() < deadline, "the server never saw the cold read");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn parked_total(&self) -> u64 {
        self.metric("flotilla_server_requests_parked_total")
    }
}

/// What one run saw: whether the cached read finished while the cold read was still out,
/// how long each took, and how many requests the server parked.
#[derive(Debug)]
struct Seen {
    cached_first: bool,
    cached: Duration,
    cold: Duration,
    parked_total: u64,
}

fn cold_and_cached(parked_requests_max: usize) -> Seen {
    let local = SimLocal::start(parked_requests_max);
    let (first, second) = (local.client(), local.client());
    let file = first.create("/f", &CreateOptions { subfiles: 1, ..Default::default() }).expect("create");
    let fork = file.fork(0, "data").expect("fork");
    let hot = Shape::Contiguous { file_offset: 0, memory_offset: 0, length: 4096 };
    fork.write(&hot, &[7u8; 4096]).expect("write the cached bytes");
    // Bytes below the fork's size that were never written: read from the (simulated) disk.
    fork.extend(COLD_RECORDS * COLD_STRIDE_BYTES + COLD_STRIDE_BYTES).expect("extend");
    let cold = Shape::Strided {
        file_offset: COLD_STRIDE_BYTES,
        memory_offset: 0,
        record_bytes: 64,
        file_stride: COLD_STRIDE_BYTES as i64,
        memory_stride: 64,
        count: COLD_RECORDS,
    };
    let cold_done = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let cold_reader = {
        let (fork, cold_done) = (fork.clone(), cold_done.clone());
        std::thread::spawn(move || {
            let mut buffer = vec![1u8; (64 * COLD_RECORDS) as usize];
            fork.read(&cold, &mut buffer).expect("cold read");
            cold_done.store(true, Ordering::SeqCst);
            assert!(buffer.iter().all(|&byte| byte == 0), "never-written bytes read as zeros");
            began.elapsed()
        })
    };
    // Let the one worker take the cold read first: wait until the server counts it (queued
    // or executing), then give the idle worker a moment to pick it up.
    local.await_queue_depth(1);
    std::thread::sleep(Duration::from_millis(50));
    let other = second.open("/f").expect("open").fork(0, "data").expect("fork");
    let asked = Instant::now();
    let mut buffer = vec![0u8; 4096];
    other.read(&hot, &mut buffer).expect("cached read");
    let cached = asked.elapsed();
    let cached_first = !cold_done.load(Ordering::SeqCst);
    assert_eq!(buffer, vec![7u8; 4096]);
    let cold = cold_reader.join().expect("cold reader");
    Seen { cached_first, cached, cold, parked_total: local.parked_total() }
}

#[test]
fn a_cached_read_is_not_held_up_by_a_cold_read_on_the_one_worker() {
    let seen = cold_and_cached(64);
    assert!(seen.cached_first, "the cached read waited for the cold one: {seen:?}");
    assert!(seen.parked_total >= 1, "the cold read was parked: {seen:?}");
    assert!(seen.cached < seen.cold / 2, "{seen:?}");
}

/// The same with parking off: the behaviour before issue 12's change, which the test above
/// would fail on.
#[test]
fn without_parking_the_cached_read_waits_for_the_worker() {
    let seen = cold_and_cached(0);
    // Its reply may still overtake the cold one's on the way back, so judge by time: it
    // waited for the worker until the cold read was done.
    assert!(seen.cached > seen.cold / 2, "with one worker and no parking the cached read queues: {seen:?}");
    assert_eq!(seen.parked_total, 0, "{seen:?}");
}
