//! Group commit keeps the durability contract: every create, rename and unlink the metadata
//! service acknowledged survives a SIGKILL of the service, with several clients changing the
//! namespace at once (so changes share batches). Real processes; the service is killed with
//! SIGKILL and restarted on the same folder and address.

mod common;

use common::{kill_and_restart_meta, Cluster};
use flotilla_client::{Client, CreateOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;
/// Most changes one client makes before the kill (bounds the test's length).
const CHANGES_PER_CLIENT_MAX: usize = 2000;

/// Where an acknowledged file must be after the restart: at this name, or gone.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    At(String),
    Gone,
}

/// What the clients learned: per file, the state its last acknowledged change left.
/// A file whose last change failed (its outcome unknown) is left out.
type Ledger = Arc<Mutex<BTreeMap<String, Expect>>>;

/// One client: create `/c{client}/f{n}`; every 3rd file is renamed to `r{n}`, every 5th
/// removed. Each acknowledged change goes in the ledger; the first failure ends the client.
fn churn(client: &Client, index: usize, ledger: &Ledger, acked: &AtomicUsize, stop: &AtomicBool) {
    for n in 0..CHANGES_PER_CLIENT_MAX {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let name = format!("/c{index}/f{n}");
        if client.create(&name, &CreateOptions::default()).is_err() {
            return;
        }
        ledger.lock().expect("ledger").insert(name.clone(), Expect::At(name.clone()));
        acked.fetch_add(1, Ordering::Release);
        let outcome = if n % 3 == 0 {
            let renamed = format!("/c{index}/r{n}");
            client.rename(&name, &renamed).map(|()| Expect::At(renamed))
        } else if n % 5 == 0 {
            client.remove(&name).map(|()| Expect::Gone)
        } else {
            continue;
        };
        let mut ledger = ledger.lock().expect("ledger");
        match outcome {
            Ok(expect) => {
                ledger.insert(name, expect);
                acked.fetch_add(1, Ordering::Release);
            }
            Err(_) => {
                ledger.remove(&name);
                return;
            }
        }
    }
}

#[test]
fn every_acknowledged_change_survives_sigkill_of_the_metadata_service() {
    // A long batch delay makes the kill likely to land while a batch is open.
    let mut cluster = Cluster::start_with(2, "commit_batch_delay_us_max = 5000\ncommit_batch_ops_max = 64");
    let setup = cluster.client();
    for index in 0..CLIENTS {
        setup.mkdir(&format!("/c{index}"), 0o755).expect("mkdir");
    }
    let ledger: Ledger = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let (ledger, acked, stop) = (ledger.clone(), acked.clone(), stop.clone());
            let client = cluster.client();
            std::thread::spawn(move || churn(&client, index, &ledger, &acked, &stop))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::Acquire) < 300 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    kill_and_restart_meta(&mut cluster);
    stop.store(true, Ordering::Release);
    for worker in workers {
        worker.join().expect("client thread");
    }
    let ledger = ledger.lock().expect("ledger").clone();
    assert!(ledger.len() >= 100, "too few acknowledged changes before the kill: {}", ledger.len());
    let client = cluster.client();
    let mut lost = Vec::new();
    for (created, expect) in &ledger {
        let present = |path: &str| client.stat(path).is_ok();
        let kept = match expect {
            Expect::At(path) => present(path) && (path == created || !present(created)),
            Expect::Gone => !present(created),
        };
        if !kept {
            lost.push(format!("{created}: expected {expect:?}"));
        }
    }
    assert!(lost.is_empty(), "{} of {} acknowledged changes lost: {:?}", lost.len(), ledger.len(), &lost);
}
