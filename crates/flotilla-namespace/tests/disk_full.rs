//! The namespace database's disk fills up: changes fail with ENOSPC (not EIO), and once
//! space is freed the same `Namespace` works again, without being reopened by its owner.

use flotilla_namespace::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const OWNER: Owner = Owner { mode: 0o755, uid: 0, gid: 0 };

/// A tmpfs mounted for the test, unmounted when dropped (also on panic).
struct Tmpfs {
    dir: PathBuf,
    _holder: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let holder = tempfile::tempdir().unwrap();
        let dir = holder.path().join("fs");
        std::fs::create_dir(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("run mount(8); this test needs root and does not skip");
        assert!(status.success(), "mount -t tmpfs on {dir:?} failed: {status}");
        Tmpfs { dir, _holder: holder }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// Fills the file system at `dir` with one file until writes fail; returns its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    let small = [0u8; 512];
    while file.write_all(&small).is_ok() {}
    path
}

#[test]
fn a_full_disk_gives_enospc_and_the_namespace_recovers_when_space_is_freed() {
    let fs = Tmpfs::mount("8m");
    let ns = Namespace::open(&fs.dir.join("namespace.redb")).unwrap();
    ns.mkdir("/before", OWNER, 1).unwrap();
    let filler = fill(&fs.dir);

    // Phase: the disk is full; directory creations fail with ENOSPC, never EIO.
    let mut failures = 0;
    for index in 0..2_000 {
        match ns.mkdir(&format!("/d{index}"), OWNER, 2) {
            Ok(_) => continue,
            Err(error) => {
                assert_eq!(error.errno(), ENOSPC, "a full disk must be ENOSPC: {error}");
                failures += 1;
                if failures >= 3 {
                    break;
                }
            }
        }
    }
    assert!(failures >= 3, "the disk never filled");

    // Phase: space is freed; the same namespace works again and kept what it acknowledged.
    std::fs::remove_file(filler).unwrap();
    ns.mkdir("/after", OWNER, 3).expect("mkdir after space was freed");
    assert!(ns.lookup("/before").is_ok());
    assert!(ns.lookup("/after").is_ok());
}
