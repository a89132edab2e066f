//! Names through two mounts of one cluster (issue 34): with the mount's default timeouts,
//! a name changed through one mount is gone from the other the moment the change returns —
//! the second mount's kernel cached it under inode tokens, and the change was not
//! acknowledged before that mount had its kernel drop it. No sleeps: each check runs right
//! after the system call on the first mount returned.
//!
//! Real processes: `flotilla local` (metadata service and an I/O server) and two `flotilla
//! mount` processes (two client sessions, as two nodes). Needs root (FUSE).

mod common;

use common::{Local, Mount};
use std::fs;
use std::io::ErrorKind;

/// Rounds of each check: one stale kernel entry in any of them fails the test.
const ROUNDS: usize = 10;

/// Every revocation was answered by its holder (none left to `token_wait_ms_max`): the
/// invalidations, not the timeout, made the checks pass.
fn assert_revocations_answered(local: &Local) {
    let revoked = local.meta_counter("flotilla_meta_inode_token_revocations_total");
    let unanswered = local.meta_counter("flotilla_meta_inode_token_revocations_unanswered_total");
    assert!(revoked >= ROUNDS as u64, "{revoked} revocations for {ROUNDS} rounds");
    assert_eq!(unanswered, 0, "{unanswered} of {revoked} revocations unanswered");
}

fn two_mounts(local: &Local) -> (Mount, Mount) {
    let key = common::path(&local.key).to_string();
    let args = ["--key", key.as_str()];
    (Mount::start_default_timeouts(&local.meta, &args), Mount::start_default_timeouts(&local.meta, &args))
}

/// `mv a b` through mount one: mount two, whose kernel just looked `a` up (and would keep it
/// for its entry timeout), finds no `a` when the rename returned, and finds `b`.
#[test]
fn a_rename_through_one_mount_is_gone_from_the_other_when_it_returns() {
    let local = Local::start(1, true);
    let (one, two) = two_mounts(&local);
    fs::write(one.path("a"), b"x").expect("create a");
    for round in 0..ROUNDS {
        let (from, to) = if round % 2 == 0 { ("a", "b") } else { ("b", "a") };
        for _ in 0..3 {
            fs::symlink_metadata(two.path(from)).expect("mount two finds the name before the rename");
        }
        fs::rename(one.path(from), one.path(to)).expect("rename through mount one");
        let error = fs::symlink_metadata(two.path(from)).expect_err("the old name is gone on mount two");
        assert_eq!(error.kind(), ErrorKind::NotFound, "round {round}: {error}");
        assert_eq!(fs::read(two.path(to)).expect("the new name on mount two"), b"x", "round {round}");
    }
    assert_revocations_answered(&local);
}

/// A directory renamed away and made again through mount one: a file created through mount
/// two right after lands in the new directory, not in the renamed one its kernel knew.
#[test]
fn a_create_through_the_other_mount_lands_in_the_directory_made_again() {
    let local = Local::start(1, true);
    let (one, two) = two_mounts(&local);
    fs::create_dir(one.path("d")).expect("mkdir d");
    for round in 0..ROUNDS {
        let file = format!("d/f{round}");
        fs::read_dir(two.path("d")).expect("mount two lists d").for_each(drop);
        fs::symlink_metadata(two.path("d")).expect("mount two finds d");
        let old = format!("old{round}");
        fs::rename(one.path("d"), one.path(&old)).expect("rename d away through mount one");
        fs::create_dir(one.path("d")).expect("mkdir d again through mount one");
        fs::write(two.path(&file), b"new").expect("create through mount two");
        assert_eq!(fs::read(one.path(&file)).expect("the file in the new d"), b"new", "round {round}");
        let misplaced = one.path(&format!("{old}/f{round}"));
        assert!(!misplaced.exists(), "round {round}: the file landed in the renamed directory");
    }
    assert_revocations_answered(&local);
}
