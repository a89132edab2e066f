//! fcntl locks survive a restart of the metadata service (issue 33, "what lives only in
//! memory"): the service forgets its lock table with its process, gives its clients a grace
//! period (`lock_reclaim_ms`) to present the locks they held, and grants nothing new until
//! it ends. A lock whose holder died during the outage is not reclaimed and is free after
//! the grace period.
//!
//! Real processes: a cluster, two `flotilla mount` processes, the metadata service killed
//! with SIGKILL and started again on the same data and address; locks taken with fcntl by
//! this process and by Python processes. Needs root (to mount).

mod common;
mod locking;

use common::{Cluster, Mount};
use locking::{check, set_lock, TEST_LOCK, TRY_LOCKF, WAIT_LOCKF};
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The grace period the tests configure, in ms.
const RECLAIM_MS: u64 = 3000;

/// Takes a write lock of bytes 0..10, says so, and waits to be killed.
const HOLD_LOCKF: &str = "import fcntl,sys,time\nf=open(sys.argv[1],'r+')\nfcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\nprint('held', flush=True)\ntime.sleep(600)";

fn python(script: &str, file: &Path) -> Child {
    Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3")
}

fn output_of(child: Child) -> String {
    let output = child.wait_with_output().expect("wait for python3");
    assert!(output.status.success(), "python3 failed: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn cluster() -> Cluster {
    Cluster::start_with(1, &format!("lock_reclaim_ms = {RECLAIM_MS}"))
}

/// A write lock taken through mount A is reclaimed after the metadata service is killed and
/// started again: mount B's conflicting F_SETLK fails (EAGAIN) during the grace period and
/// after it, F_GETLK on B reports it, and a waiter on B (F_SETLKW, blocked since before the
/// kill) keeps waiting; once A unlocks, the waiter gets it.
#[test]
fn a_held_lock_survives_a_restart_of_the_metadata_service() {
    let mut cluster = cluster();
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    std::fs::write(a.path("locked"), b"0123456789abcdef").unwrap();
    let holder = std::fs::OpenOptions::new().read(true).write(true).open(a.path("locked")).unwrap();
    check(set_lock(holder.as_raw_fd(), libc::F_WRLCK), "F_SETLK through mount A");
    assert_eq!(output_of(python(TRY_LOCKF, &b.path("locked"))), "busy", "B locked what A holds");
    let mut waiter = python(WAIT_LOCKF, &b.path("locked"));

    let restarted = Instant::now();
    common::kill_and_restart_meta(&mut cluster);
    // Through the grace period and a while after it, B never gets A's lock.
    let until = restarted + Duration::from_millis(RECLAIM_MS + 2000);
    let mut tries = 0;
    while Instant::now() < until {
        let answer = output_of(python(TRY_LOCKF, &b.path("locked")));
        assert_eq!(answer, "busy", "B got A's lock {:?} after the restart", restarted.elapsed());
        tries += 1;
    }
    assert!(tries >= 2, "only {tries} attempts in the window");
    assert_eq!(output_of(python(TEST_LOCK, &b.path("locked"))), "held", "F_GETLK on B sees A's lock");
    assert!(waiter.try_wait().expect("poll the waiter").is_none(), "the waiter on B got A's lock");

    check(set_lock(holder.as_raw_fd(), libc::F_UNLCK), "F_UNLCK through mount A");
    assert_eq!(output_of(waiter), "got", "the waiter on B gets the lock A let go");
    assert_eq!(output_of(python(TRY_LOCKF, &b.path("locked"))), "got", "and lets go of it when it exits");
}

/// A lock whose holder (the mount itself) is killed while the metadata service is down is
/// not reclaimed: mount B's F_SETLK is not granted before the grace period ends, then is.
#[test]
fn a_lock_of_a_mount_killed_during_the_outage_is_not_reclaimed() {
    let mut cluster = cluster();
    let b = Mount::start(&cluster.meta_addr());
    let mut a = Mount::start(&cluster.meta_addr());
    std::fs::write(a.path("orphaned"), b"0123456789").unwrap();
    let mut holder = python(HOLD_LOCKF, &a.path("orphaned"));
    let mut line = [0u8; 5];
    holder.stdout.as_mut().expect("stdout").read_exact(&mut line).expect("the holder reports");
    assert_eq!(&line, b"held\n");
    assert_eq!(output_of(python(TRY_LOCKF, &b.path("orphaned"))), "busy");

    let meta = cluster.meta.take().expect("meta running");
    let addr = meta.addr.clone();
    meta.kill();
    let mut mount_a = a.process.take().expect("mount A running");
    mount_a.child.kill().expect("SIGKILL mount A");
    let _ = mount_a.child.wait();
    let _ = holder.kill();
    let _ = holder.wait();
    let restarted = Instant::now();
    cluster.start_meta(&addr);

    // B's request waits out the grace period (the service answers "recovering", the mount
    // asks again), then is granted: nobody reclaimed the dead mount's lock.
    let deadline = restarted + Duration::from_millis(RECLAIM_MS + 20_000);
    loop {
        if output_of(python(TRY_LOCKF, &b.path("orphaned"))) == "got" {
            break;
        }
        assert!(Instant::now() < deadline, "the dead mount's lock was never released");
        std::thread::sleep(Duration::from_millis(200));
    }
    let waited = restarted.elapsed();
    assert!(
        waited >= Duration::from_millis(RECLAIM_MS),
        "granted {waited:?} after the restart, inside the grace period"
    );
}
