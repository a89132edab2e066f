//! The chain data path's interleavings with the chain table, driven step by step: one
//! `ChainPaths` on a temporary store, its held chains fed by hand (no sockets: no member
//! is reachable, and nothing here needs one).

use super::*;
use crate::execute::BufferPool;
use flotilla_proto::{ChainMember, ChainView, MemberInfo};
use flotilla_store::{Store, StoreConfig};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

struct Rig {
    paths: ChainPaths,
    held: Arc<HeldChains>,
    me: TargetId,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig::new(vec![dir.path().to_path_buf()], true)).unwrap();
    let me = store.target_ids()[0];
    let pool = BufferPool::new(1, 1 << 20);
    let executor = Arc::new(Executor { store, limits: flotilla_types::Limits::default(), pool });
    let member = MemberInfo { failure_group: "g0".into(), incarnation: 1 };
    let held = Arc::new(HeldChains::new(member));
    let request = flotilla_auth::IssueRequest {
        role: flotilla_auth::Role::Server,
        name: "io-test".into(),
        limits: flotilla_auth::Limits::default(),
        expires_unix_secs: None,
    };
    let credential = Arc::new(flotilla_auth::ClusterCa::generate().issue(request).unwrap());
    let auth = flotilla_auth::ClientAuth { credential, bounds: flotilla_auth::AuthBounds::default() };
    let config = PathConfig {
        forward_timeout: Duration::from_millis(200),
        change_wait: Duration::from_millis(200),
        retry: Duration::from_millis(10),
        window_max: 4,
        gap_wait: Duration::from_millis(100),
        copy_chunk_bytes: 1 << 16,
        resync_bytes_per_s: 0,
        record_bytes_max: 1 << 20,
    };
    let paths = ChainPaths::new(config, executor, held.clone(), auth);
    Rig { paths, held, me, _dir: dir }
}

/// Chain 0 at `version`: this server's target at the head, then two others (the last one
/// offline when `third_out`).
fn chain(rig: &Rig, version: u64, third_out: bool) -> ChainView {
    let serving = ChainMemberState::Serving;
    let third = match third_out {
        true => ChainMemberState::Offline { missed_since: version, full: false },
        false => serving,
    };
    let members = vec![
        ChainMember { target: rig.me, state: serving },
        ChainMember { target: TargetId(9001), state: serving },
        ChainMember { target: TargetId(9002), state: third },
    ];
    ChainView { lease_ms: 60_000, chains: vec![ChainInfo { chain: 0, version, members }] }
}

/// Polls `future` once: it runs until it first waits.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let mut context = Context::from_waker(std::task::Waker::noop());
    Pin::new(future).poll(&mut context)
}

#[tokio::test(flavor = "current_thread")]
async fn a_resync_pass_observes_the_chain_held_once_it_has_the_lock() {
    let rig = rig();
    rig.held.store(chain(&rig, 1, false), Instant::now());
    let slot = rig.paths.state(0);
    // Phase 1: another task holds the chain's lock; the pass starts and waits for it (a
    // view it read before the lock would be v1).
    let guard = slot.state.lock().await;
    let mut pass = Box::pin(rig.paths.resync_pass());
    assert!(poll_once(&mut pass).is_pending(), "the pass waits for the chain's lock");
    // Phase 2: v2 (a member out) arrives while the lock is held; the lock is released.
    rig.held.store(chain(&rig, 2, true), Instant::now());
    drop(guard);
    pass.await;
    // Phase 3: the pass brought the record to v2, the chain as held when it ran.
    let state = slot.state.lock().await;
    assert_eq!(state.seen.as_ref().map(|seen| seen.version), Some(2));
    assert!(state.record.is_some(), "a member is out at v2: a record is kept");
}

#[tokio::test(flavor = "current_thread")]
async fn a_late_resync_pass_keeps_the_record_a_newer_view_started() {
    let rig = rig();
    rig.held.store(chain(&rig, 1, false), Instant::now());
    let slot = rig.paths.state(0);
    let third = TargetId(9002);
    // Phase 1: a change under the lock brings the log to v1 (everyone serves: no record).
    let mut guard = slot.state.lock().await;
    assert!(rig.paths.follow(&mut guard, 0, rig.me).is_ok());
    assert!(guard.record.is_none());
    // Phase 2: the pass starts and waits for the lock.
    let mut pass = Box::pin(rig.paths.resync_pass());
    assert!(poll_once(&mut pass).is_pending(), "the pass waits for the chain's lock");
    // Phase 3: v2 (the third member out) arrives; the change follows it (this member saw
    // the third leave: the record covers it) and applies a write, which the record keeps.
    rig.held.store(chain(&rig, 2, true), Instant::now());
    assert!(rig.paths.follow(&mut guard, 0, rig.me).is_ok());
    let fork = ForkRef { target: rig.me, file: FileId(7), subfile: SubfileIndex(0), fork: "data".into() };
    note(&mut guard, &IoRequest::Write { fork, shape: Shape::contiguous(4096, 100) });
    drop(guard);
    // Phase 4: the pass runs late: the record, its cover and its range are still there.
    pass.await;
    let state = slot.state.lock().await;
    assert_eq!(state.seen.as_ref().map(|seen| seen.version), Some(2));
    let record = state.record.as_ref().expect("the record v2 started");
    assert!(record.covers_target(third), "covers the member seen leaving");
    let key = (7u64, 0u32, Some("data".to_string()));
    let ranges = record.keys().get(&key).expect("the write applied meanwhile is recorded");
    assert!(ranges.iter().any(|range| range.offset <= 4096 && range.offset + range.length_bytes >= 4196));
}

#[tokio::test(flavor = "current_thread")]
async fn a_late_heartbeat_reply_does_not_take_a_chain_back() {
    let rig = rig();
    rig.held.store(chain(&rig, 2, true), Instant::now());
    rig.held.store(chain(&rig, 1, false), Instant::now());
    assert_eq!(rig.held.chain(0).map(|info| info.version), Some(2));
    let (chains, lease) = rig.held.fence_view();
    assert_eq!(chains.iter().map(|info| info.version).collect::<Vec<_>>(), vec![2]);
    assert!(lease.valid_until_ms > lease.now_ms, "the late reply still renewed the lease");
}
