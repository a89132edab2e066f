//! A target on a 1 MiB tmpfs runs out of space: the write that cannot reserve its space
//! fails with `TargetFull` and is not applied, and data synced before reads back.
//!
//! Mounting needs root. Without it this test fails loudly instead of skipping, so a run that
//! did not exercise the disk-full path cannot pass unnoticed.

mod common;

use common::*;
use flotilla_store::{Extent, Store, StoreError};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for the test, unmounted when dropped (also on panic).
struct TmpfsMount {
    dir: PathBuf,
}

impl TmpfsMount {
    fn new(dir: &Path, size: &str) -> TmpfsMount {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs on {dir:?} failed: {status}");
        TmpfsMount { dir: dir.to_path_buf() }
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(&self.dir).status();
        if !matches!(status, Ok(status) if status.success()) {
            eprintln!("umount {:?} failed: {status:?}", self.dir);
        }
    }
}

#[test]
fn a_full_target_refuses_growth_and_keeps_synced_data() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root to mount a 1 MiB tmpfs (run cargo test as root); it does not skip"
    );
    let outer = tempfile::tempdir().unwrap();
    let mount = TmpfsMount::new(outer.path(), "1m");
    let (store, target) = open_with_subfile(config(&mount.dir, 4096, 64));
    let fork = data_fork(target);

    // Phase 1: 512 KiB fits; make it durable.
    let synced = pattern(512 * 1024, 1);
    store.write(&fork, &[Extent::new(0, synced.len() as u64)], &synced).unwrap();
    store.sync(&fork).unwrap();

    // Phase 2: another 1 MiB cannot be reserved.
    let too_much = pattern(1 << 20, 2);
    let error = store.write(&fork, &[Extent::new(512 * 1024, 1 << 20)], &too_much).unwrap_err();
    assert!(
        matches!(&error, StoreError::TargetFull { target: full, dir } if *full == target && dir == &mount.dir),
        "expected TargetFull, got {error:?}"
    );
    assert!(error.to_string().contains("full"));

    // Phase 3: nothing of the refused write was applied, synced data reads back.
    assert_eq!(store.fork_size(&fork).unwrap(), 512 * 1024);
    assert_eq!(read_range(&store, &fork, 0, synced.len()), synced);
    assert_eq!(read_range(&store, &fork, 512 * 1024, 4096), vec![0; 4096]);

    // Phase 4: the same data through a fresh store.
    drop(store);
    let store = Store::open(config(&mount.dir, 4096, 64)).unwrap();
    assert_eq!(read_range(&store, &fork, 0, synced.len()), synced);
    drop(store);
    drop(mount);
}
