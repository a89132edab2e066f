//! The POSIX mount against a real cluster: `flotilla mount` processes on temporary
//! directories, driven with system calls (through std and libc) and with unmodified programs
//! (cp, dd, tar, rsync, sqlite3, python3, git, an MPI-IO program through ROMIO).
//!
//! Needs root (to mount without fusermount and to act as another user) and the programs
//! above; `scripts/test.sh` installs them. A missing program fails the test, never skips it.

mod common;

use common::{random_bytes, Cluster, Process, FLOTILLA};
use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The largest file the mount allows (flotilla_fuse::FILE_BYTES_MAX).
const FILE_BYTES_MAX: u64 = 1 << 44;
/// The user the permission checks run as.
const NOBODY: u32 = 65534;

/// A `flotilla mount` process on a fresh directory; unmounted when dropped.
struct Mount {
    process: Option<Process>,
    dir: PathBuf,
    /// Extra `flotilla mount` arguments.
    extra: Vec<String>,
    _holder: tempfile::TempDir,
}

impl Mount {
    fn start(meta: &str) -> Mount {
        Mount::start_with(meta, &[])
    }

    /// A mount with extra `flotilla mount` arguments, kept for `remount`.
    fn start_with(meta: &str, extra: &[&str]) -> Mount {
        let holder = tempfile::tempdir().expect("temporary folder");
        // Other users must be able to reach the mount point (permission tests run as nobody).
        fs::set_permissions(holder.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let dir = holder.path().join("mnt");
        let extra = extra.iter().map(|arg| arg.to_string()).collect();
        let mut mount = Mount { process: None, dir, extra, _holder: holder };
        mount.remount(meta);
        mount
    }

    fn remount(&mut self, meta: &str) {
        assert!(self.process.is_none());
        let mut args = vec!["mount", "--meta", meta];
        args.extend(self.extra.iter().map(String::as_str));
        args.push(common::path(&self.dir));
        self.process = Some(Process::start(&args, "mount").expect("start flotilla mount"));
        assert!(common::is_mounted(&self.dir), "{} is not in /proc/mounts", self.dir.display());
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// SIGTERM (the clean path): the process unmounts and exits successfully.
    fn stop(&mut self) {
        let Some(mut process) = self.process.take() else { return };
        // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
        unsafe { libc::kill(process.child.id() as i32, libc::SIGTERM) };
        let status = wait_with_timeout(&mut process.child, Duration::from_secs(20));
        assert!(status.is_some_and(|s| s.success()), "flotilla mount exited with {status:?}");
        assert!(!common::is_mounted(&self.dir), "still mounted after SIGTERM");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // SAFETY: as in `stop`.
            unsafe { libc::kill(process.child.id() as i32, libc::SIGTERM) };
            if wait_with_timeout(&mut process.child, Duration::from_secs(10)).is_none() {
                let _ = process.child.kill();
                let _ = process.child.wait();
            }
        }
        if common::is_mounted(&self.dir) {
            let _ = Command::new(FLOTILLA).args(["umount", "--lazy", common::path(&self.dir)]).status();
        }
    }
}

fn wait_with_timeout(child: &mut std::process::Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The errno of a failed call.
fn errno<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    result.expect_err("the call should have failed").raw_os_error().expect("an errno")
}

/// Fails loudly when a program the test needs is not installed.
fn require(program: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "{program} is not installed: scripts/test.sh installs it (apt-get install)"
    );
}

/// Runs a shell command; panics with its output if it fails.
fn sh(command: &str) -> String {
    let output = Command::new("sh").arg("-c").arg(command).output().expect("run sh");
    assert!(
        output.status.success(),
        "`{command}` failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a shell command as user nobody; returns (success, stderr).
fn sh_as_nobody(command: &str) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let output = Command::new("sh").arg("-c").arg(command).uid(NOBODY).gid(NOBODY).output().expect("run sh");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<String> {
    let (path, name) = (c_path(path), CString::new(name).unwrap());
    let mut buffer = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let length =
        unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate(length as usize);
    Ok(String::from_utf8(buffer).unwrap())
}

fn set_xattr(path: &Path, name: &str, value: &str) -> std::io::Result<()> {
    let (path, name) = (c_path(path), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a value of the length passed.
    let code = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if code < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn list_xattr(path: &Path) -> Vec<String> {
    let path = c_path(path);
    let mut buffer = vec![0u8; 256];
    // SAFETY: a valid NUL-terminated string and a buffer of the length passed.
    let length = unsafe { libc::listxattr(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(length >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buffer.truncate(length as usize);
    buffer
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

fn set_times(path: &Path, atime_s: i64, mtime_s: i64) {
    let path = c_path(path);
    let times =
        [libc::timespec { tv_sec: atime_s, tv_nsec: 250 }, libc::timespec { tv_sec: mtime_s, tv_nsec: 500 }];
    // SAFETY: a valid NUL-terminated path and an array of two timespecs.
    let code = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(code, 0, "utimensat: {}", std::io::Error::last_os_error());
}

#[test]
fn files_directories_and_attributes() {
    let cluster = Cluster::start(3);
    let mount = Mount::start(&cluster.meta_addr());

    // Phase 1: create, write, read, size within the mount before and after close.
    let data = random_bytes(1, 3 << 20);
    let mut file = fs::File::create(mount.path("a.bin")).unwrap();
    file.write_all(&data).unwrap();
    assert_eq!(file.metadata().unwrap().len(), data.len() as u64, "size seen before close");
    drop(file);
    assert_eq!(fs::read(mount.path("a.bin")).unwrap(), data);
    let meta = fs::metadata(mount.path("a.bin")).unwrap();
    assert!(meta.is_file() && meta.len() == data.len() as u64 && meta.nlink() == 1);
    assert_eq!(meta.mode() & 0o7777, 0o666 & !umask());

    // Phase 2: directories and listings.
    fs::create_dir(mount.path("d")).unwrap();
    fs::create_dir_all(mount.path("d/e/f")).unwrap();
    fs::write(mount.path("d/x"), b"x").unwrap();
    let mut names: Vec<String> = fs::read_dir(mount.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["e", "x"]);
    assert!(fs::metadata(mount.path("d/e")).unwrap().is_dir());

    // Phase 3: chmod, chown, truncate (shrink and grow), utimens.
    fs::set_permissions(mount.path("a.bin"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(mount.path("a.bin")).unwrap().mode() & 0o7777, 0o600);
    std::os::unix::fs::chown(mount.path("a.bin"), Some(1234), Some(5678)).unwrap();
    let meta = fs::metadata(mount.path("a.bin")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    let file = fs::OpenOptions::new().write(true).open(mount.path("a.bin")).unwrap();
    file.set_len(1000).unwrap();
    file.set_len(5000).unwrap();
    drop(file);
    let mut expected = data[..1000].to_vec();
    expected.resize(5000, 0);
    assert_eq!(fs::read(mount.path("a.bin")).unwrap(), expected, "a shrunk then grown file reads zeros");
    set_times(&mount.path("a.bin"), 1_000_000, 2_000_000);
    let meta = fs::metadata(mount.path("a.bin")).unwrap();
    assert_eq!(
        (meta.atime(), meta.atime_nsec(), meta.mtime(), meta.mtime_nsec()),
        (1_000_000, 250, 2_000_000, 500)
    );

    // Phase 4: symlinks and hard links.
    std::os::unix::fs::symlink("a.bin", mount.path("link")).unwrap();
    assert_eq!(fs::read_link(mount.path("link")).unwrap(), Path::new("a.bin"));
    assert_eq!(fs::read(mount.path("link")).unwrap(), expected);
    assert!(fs::symlink_metadata(mount.path("link")).unwrap().file_type().is_symlink());
    fs::hard_link(mount.path("a.bin"), mount.path("d/hard")).unwrap();
    let (first, second) =
        (fs::metadata(mount.path("a.bin")).unwrap(), fs::metadata(mount.path("d/hard")).unwrap());
    assert_eq!((first.ino(), first.nlink()), (second.ino(), 2));

    // Phase 5: renames, over an existing file too (atomic replace), and of directories.
    fs::write(mount.path("old"), b"old").unwrap();
    fs::write(mount.path("new"), b"new").unwrap();
    fs::rename(mount.path("new"), mount.path("old")).unwrap();
    assert_eq!(fs::read(mount.path("old")).unwrap(), b"new");
    assert_eq!(errno(fs::metadata(mount.path("new"))), libc::ENOENT);
    fs::rename(mount.path("d/e"), mount.path("moved")).unwrap();
    assert!(fs::metadata(mount.path("moved/f")).unwrap().is_dir());
    fs::write(mount.path("moved/f/deep"), b"deep").unwrap();
    fs::create_dir(mount.path("empty")).unwrap();
    fs::rename(mount.path("moved"), mount.path("empty")).unwrap();
    assert_eq!(fs::read(mount.path("empty/f/deep")).unwrap(), b"deep");

    // Phase 6: unlink and rmdir; a removed file's open handle still works.
    fs::remove_file(mount.path("d/x")).unwrap();
    fs::remove_file(mount.path("d/hard")).unwrap();
    assert_eq!(fs::metadata(mount.path("a.bin")).unwrap().nlink(), 1);
    fs::remove_dir(mount.path("d")).unwrap();
    assert_eq!(errno(fs::metadata(mount.path("d"))), libc::ENOENT);

    // Phase 7: statfs and the layout attribute.
    let statfs = statvfs(&mount.dir);
    assert!(statfs.f_blocks > 0 && statfs.f_bfree <= statfs.f_blocks && statfs.f_namemax == 255);
    assert_eq!(list_xattr(&mount.path("a.bin")), ["user.flotilla.layout"]);
    assert_eq!(get_xattr(&mount.path("a.bin"), "user.flotilla.layout").unwrap(), "stripe:1M:0");
    fs::create_dir(mount.path("small")).unwrap();
    assert_eq!(errno(get_xattr(&mount.path("small"), "user.flotilla.layout")), libc::ENODATA);
    set_xattr(&mount.path("small"), "user.flotilla.layout", "stripe:64K:2").unwrap();
    fs::write(mount.path("small/f"), random_bytes(2, 300_000)).unwrap();
    assert_eq!(get_xattr(&mount.path("small/f"), "user.flotilla.layout").unwrap(), "stripe:64K:2");
    assert_eq!(fs::read(mount.path("small/f")).unwrap(), random_bytes(2, 300_000));
    let entry = cluster.client().stat("/small/f").unwrap();
    assert_eq!(entry.subfiles.len(), 2, "the directory's default layout named 2 subfiles");
    fs::File::create(mount.path("empty.bin")).unwrap();
    set_xattr(&mount.path("empty.bin"), "user.flotilla.layout", "hash:64K:4").unwrap();
    assert_eq!(get_xattr(&mount.path("empty.bin"), "user.flotilla.layout").unwrap(), "hash:64K:4:0");
    assert_eq!(errno(set_xattr(&mount.path("a.bin"), "user.flotilla.layout", "stripe:4K")), libc::EINVAL);
    assert_eq!(errno(set_xattr(&mount.path("small"), "user.flotilla.layout", "bogus")), libc::EINVAL);
    assert_eq!(errno(get_xattr(&mount.path("a.bin"), "user.other")), libc::ENODATA);
    assert_eq!(errno(set_xattr(&mount.path("a.bin"), "user.other", "x")), libc::EOPNOTSUPP);
}

fn umask() -> u32 {
    // SAFETY: umask has no preconditions; it is set back at once.
    let mask = unsafe { libc::umask(0o022) };
    // SAFETY: as above.
    unsafe { libc::umask(mask) };
    mask
}

fn statvfs(path: &Path) -> libc::statvfs {
    let path = c_path(path);
    // SAFETY: statvfs is plain data; zeroed is a valid value for it.
    let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a valid out pointer.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut out) }, 0);
    out
}

#[test]
fn error_codes_match_linux() {
    let cluster = Cluster::start(2);
    let mount = Mount::start(&cluster.meta_addr());
    fs::write(mount.path("file"), b"data").unwrap();
    fs::create_dir_all(mount.path("dir/sub")).unwrap();

    assert_eq!(errno(fs::read(mount.path("missing"))), libc::ENOENT);
    assert_eq!(errno(fs::create_dir(mount.path("dir"))), libc::EEXIST);
    assert_eq!(
        errno(fs::OpenOptions::new().write(true).create_new(true).open(mount.path("file"))),
        libc::EEXIST
    );
    assert_eq!(errno(fs::write(mount.path("file/x"), b"")), libc::ENOTDIR);
    assert_eq!(errno(fs::metadata(mount.path("file/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::OpenOptions::new().write(true).open(mount.path("dir"))), libc::EISDIR);
    assert_eq!(errno(fs::remove_dir(mount.path("dir"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(mount.path("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(mount.path("dir"))), libc::EISDIR);
    let long = "n".repeat(256);
    assert_eq!(errno(fs::write(mount.path(&long), b"")), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::create_dir(mount.path(&long))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::metadata(mount.path(&long))), libc::ENAMETOOLONG);
    fs::write(mount.path(&"n".repeat(255)), b"ok").unwrap();
    assert_eq!(errno(fs::rename(mount.path("dir"), mount.path("dir/sub/inside"))), libc::EINVAL);
    assert_eq!(errno(fs::rename(mount.path("file"), mount.path("dir"))), libc::EISDIR);
    assert_eq!(errno(fs::rename(mount.path("dir"), mount.path("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(mount.path("dir/sub"), mount.path("dir/sub2/x"))), libc::ENOENT);
    assert_eq!(errno(fs::hard_link(mount.path("dir"), mount.path("dirlink"))), libc::EPERM);
    let outside = tempfile::tempdir().unwrap();
    assert_eq!(errno(fs::rename(mount.path("file"), outside.path().join("f"))), libc::EXDEV);

    // Writes and truncates past the largest file size.
    let file = fs::OpenOptions::new().write(true).open(mount.path("file")).unwrap();
    assert_eq!(errno(file.write_at(b"x", FILE_BYTES_MAX)), libc::EFBIG);
    assert_eq!(errno(file.set_len(FILE_BYTES_MAX + 1)), libc::EFBIG);
    assert_eq!(errno(file.write_at(b"x", i64::MAX as u64 - 1)), libc::EFBIG);
    drop(file);
    assert_eq!(fs::read(mount.path("file")).unwrap(), b"data");

    // Permissions, enforced as a local file system would (as user nobody).
    fs::write(mount.path("secret"), b"secret").unwrap();
    fs::set_permissions(mount.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let secret = common::path(&mount.path("secret")).to_string();
    let (ok, stderr) = sh_as_nobody(&format!("cat {secret}"));
    assert!(!ok && stderr.contains("Permission denied"), "{stderr}");
    let (ok, stderr) = sh_as_nobody(&format!("touch {}/new", common::path(&mount.dir)));
    assert!(!ok && stderr.contains("Permission denied"), "{stderr}");
    let (ok, stderr) = sh_as_nobody(&format!("chmod 666 {secret}"));
    assert!(!ok && stderr.contains("Operation not permitted"), "{stderr}");
    fs::create_dir(mount.path("shared")).unwrap();
    fs::set_permissions(mount.path("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    let mine = format!("{}/shared/mine", common::path(&mount.dir));
    let (ok, stderr) = sh_as_nobody(&format!("echo hi > {mine} && chmod 640 {mine}"));
    assert!(ok, "{stderr}");
    let meta = fs::metadata(&mine).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (NOBODY, NOBODY, 0o640),
        "owned by its creator"
    );
    let (ok, stderr) = sh_as_nobody(&format!("chown 0 {mine}"));
    assert!(!ok && stderr.contains("Operation not permitted"), "{stderr}");
    let (ok, _) = sh_as_nobody(&format!("cat {mine}"));
    assert!(ok);
}

#[test]
fn concurrent_writers_to_disjoint_ranges_of_one_file() {
    const WRITERS: usize = 4;
    const RECORDS: usize = 64;
    const RECORD_BYTES: usize = 47_008;
    let cluster = Cluster::start(4);
    let mount = Mount::start(&cluster.meta_addr());
    let path = mount.path("shared.bin");
    fs::File::create(&path).unwrap();

    // Phase 1: threads, each with its own open file, write every 4th record at once.
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let path = path.clone();
            std::thread::spawn(move || {
                let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
                for record in (writer..RECORDS).step_by(WRITERS) {
                    let data = random_bytes(record as u64, RECORD_BYTES);
                    file.write_all_at(&data, (record * RECORD_BYTES) as u64).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let whole = fs::read(&path).unwrap();
    assert_eq!(whole.len(), RECORDS * RECORD_BYTES);
    for (record, chunk) in whole.chunks(RECORD_BYTES).enumerate() {
        assert!(chunk == random_bytes(record as u64, RECORD_BYTES), "record {record} differs");
    }

    // Phase 2: processes (dd), each writing its own 1 MiB segment of a second file.
    let source = tempfile::NamedTempFile::new().unwrap();
    fs::write(source.path(), random_bytes(9, 4 << 20)).unwrap();
    let target = mount.path("segments.bin");
    let children: Vec<_> = (0..WRITERS)
        .map(|segment| {
            Command::new("dd")
                .arg(format!("if={}", common::path(source.path())))
                .arg(format!("of={}", common::path(&target)))
                .args(["bs=1M", "count=1", "conv=notrunc"])
                .arg(format!("skip={segment}"))
                .arg(format!("seek={segment}"))
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    assert!(fs::read(&target).unwrap() == fs::read(source.path()).unwrap());
}

/// Close-to-open with several handles of one file in one mount: when a `close` returns, the
/// size covering what its handle wrote is published, even while another handle's close or
/// release of the file is publishing at that moment. Each writer opens, writes one record
/// and closes, over and over, then checks the size as another mount sees it (the metadata
/// service's) and as this mount does (a stale `getattr` answer there would also shrink the
/// kernel's size, so that a later read stops short). Issue 34: one run of
/// `concurrent_writers_to_disjoint_ranges_of_one_file` read 63 of 64 records.
#[test]
fn a_close_publishes_its_writes_while_other_handles_of_the_file_publish() {
    const WRITERS: usize = 4;
    const RECORDS: usize = 48;
    const RECORD_BYTES: usize = 47_008;
    const ROUNDS: usize = 4;
    let cluster = Cluster::start(4);
    let mount = Mount::start(&cluster.meta_addr());
    let other = Mount::start_with(&cluster.meta_addr(), &["--attr-timeout-ms", "0"]);
    for round in 0..ROUNDS {
        let name = format!("round-{round}.bin");
        fs::File::create(mount.path(&name)).unwrap();
        let threads: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (here, there) = (mount.path(&name), other.path(&name));
                std::thread::spawn(move || {
                    for record in (writer..RECORDS).step_by(WRITERS) {
                        let file = fs::OpenOptions::new().write(true).open(&here).unwrap();
                        let data = random_bytes(record as u64, RECORD_BYTES);
                        file.write_all_at(&data, (record * RECORD_BYTES) as u64).unwrap();
                        drop(file);
                        let end = ((record + 1) * RECORD_BYTES) as u64;
                        let seen_there = fs::metadata(&there).unwrap().len();
                        let seen_here = fs::metadata(&here).unwrap().len();
                        assert!(
                            seen_there >= end && seen_here >= end,
                            "round {round}: record {record} closed (end {end}), yet the size is \
                             {seen_there} through another mount and {seen_here} through this one"
                        );
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        for path in [mount.path(&name), other.path(&name)] {
            let whole = fs::read(&path).unwrap();
            assert_eq!(whole.len(), RECORDS * RECORD_BYTES, "round {round}: {}", path.display());
            for (record, chunk) in whole.chunks(RECORD_BYTES).enumerate() {
                assert!(chunk == random_bytes(record as u64, RECORD_BYTES), "round {round}: record {record}");
            }
        }
    }
}

#[test]
fn tarball_extracted_on_the_mount_matches_the_tree() {
    require("tar");
    require("diff");
    let cluster = Cluster::start(3);
    let mount = Mount::start(&cluster.meta_addr());
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    make_tree(&tree);
    let tarball = work.path().join("tree.tar");
    sh(&format!("tar -C {} -cf {} tree", common::path(work.path()), common::path(&tarball)));
    sh(&format!("tar -C {} -xpf {}", common::path(&mount.dir), common::path(&tarball)));
    sh(&format!("diff -r --no-dereference {} {}", common::path(&tree), common::path(&mount.path("tree"))));
    // tar's own comparison checks modes, times, sizes and link targets too.
    sh(&format!("cd {} && tar -df {}", common::path(&mount.dir), common::path(&tarball)));
}

/// A small tree: nested directories, empty and multi-stripe files, a symlink, odd modes.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    for (index, size) in [0usize, 1, 4095, 4096, 100_000, 1 << 20, (3 << 20) + 17].into_iter().enumerate() {
        fs::write(root.join(format!("a/file-{index}")), random_bytes(index as u64, size)).unwrap();
    }
    for index in 0..50 {
        fs::write(root.join(format!("a/b/c/small-{index}.txt")), format!("line {index}\n")).unwrap();
    }
    std::os::unix::fs::symlink("../file-2", root.join("a/b/link")).unwrap();
    fs::set_permissions(root.join("a/file-1"), fs::Permissions::from_mode(0o751)).unwrap();
}

#[test]
fn unmodified_programs_work_on_the_mount() {
    for program in ["cp", "dd", "rsync", "sqlite3", "python3", "git", "cmp", "diff"] {
        require(program);
    }
    let cluster = Cluster::start(3);
    let mount = Mount::start(&cluster.meta_addr());
    let work = tempfile::tempdir().unwrap();
    let (m, w) = (common::path(&mount.dir).to_string(), common::path(work.path()).to_string());
    fs::write(work.path().join("blob"), random_bytes(3, (5 << 20) + 333)).unwrap();

    // cp and dd, both ways.
    sh(&format!("cp {w}/blob {m}/blob && cmp {w}/blob {m}/blob"));
    sh(&format!("cp {m}/blob {w}/back && cmp {w}/blob {w}/back"));
    sh(&format!("dd if={w}/blob of={m}/dd bs=64k status=none && cmp {w}/blob {m}/dd"));
    sh(&format!("dd if={m}/dd of={w}/dd bs=1M status=none && cmp {w}/blob {w}/dd"));

    // rsync -a of a tree (times, modes, symlinks), then an incremental second pass.
    make_tree(&work.path().join("tree"));
    sh(&format!("rsync -a {w}/tree/ {m}/rsynced/ && diff -r --no-dereference {w}/tree {m}/rsynced"));
    fs::write(work.path().join("tree/a/file-3"), b"changed").unwrap();
    sh(&format!("rsync -a {w}/tree/ {m}/rsynced/ && diff -r {w}/tree {m}/rsynced"));
    let output = sh(&format!("rsync -ai --dry-run {w}/tree/ {m}/rsynced/"));
    assert!(output.trim().is_empty(), "rsync found differences after syncing: {output}");

    // sqlite3: a database file with its journal on the mount.
    let sql = work.path().join("script.sql");
    fs::write(
        &sql,
        "create table t(a integer, b text);\n\
         insert into t values (1, 'one'), (2, 'two');\n\
         insert into t select a + 2, b || '!' from t;\n\
         select count(*), sum(a) from t;\n",
    )
    .unwrap();
    let rows = sh(&format!("sqlite3 {m}/db.sqlite < {}", common::path(&sql)));
    assert_eq!(rows.trim(), "4|10");
    fs::write(&sql, "select b from t where a = 4;\n").unwrap();
    let rows = sh(&format!("sqlite3 {m}/db.sqlite < {}", common::path(&sql)));
    assert_eq!(rows.trim(), "two!");

    // Python's open: text, binary, append, seek.
    let script = format!(
        "p = '{m}/py.txt'\n\
         open(p, 'w').write('hello\\n')\n\
         open(p, 'a').write('world\\n')\n\
         f = open(p, 'r+b'); f.seek(6); f.write(b'W'); f.close()\n\
         assert open(p).read() == 'hello\\nWorld\\n', open(p).read()\n\
         print('ok')\n"
    );
    assert_eq!(sh(&format!("python3 -c \"{script}\"")).trim(), "ok");

    // git: clone a local repository onto the mount, check it, commit on it.
    let repo = format!("{w}/repo");
    sh(&format!("git init -q {repo}"));
    for index in 0..5 {
        fs::write(
            work.path().join(format!("repo/file-{index}")),
            random_bytes(index, 20_000 * index as usize),
        )
        .unwrap();
        sh(&format!(
            "cd {repo} && git add . && git -c user.name=t -c user.email=t@t commit -qm 'commit {index}'"
        ));
    }
    sh(&format!("git clone -q {repo} {m}/clone"));
    sh(&format!("cd {m}/clone && git fsck --full"));
    let log = sh(&format!("cd {m}/clone && git log --oneline"));
    assert_eq!(log.lines().count(), 5);
    sh(&format!(
        "cd {m}/clone && echo more >> file-1 && git -c user.name=t -c user.email=t@t commit -qam more"
    ));
    sh(&format!("cd {m}/clone && git gc -q && git fsck --full"));
}

/// Each MPI by its own name (Debian's `mpicc`/`mpiexec` alternatives point at whichever was
/// installed last, and Open MPI's refuses to run as root without a flag): the compiler and the
/// launcher command line. Open MPI's default MPI-IO component (OMPIO) does not know the
/// `ufs:` prefix, so its ROMIO component is asked for by name.
const MPIS: [(&str, &str); 2] = [
    ("mpicc.mpich", "mpiexec.mpich"),
    ("mpicc.openmpi", "mpirun.openmpi --allow-run-as-root --oversubscribe --mca io romio321"),
];

#[test]
fn mpi_io_through_romio_posix_driver() {
    for (compiler, launcher) in MPIS {
        require(compiler);
        require(launcher.split(' ').next().unwrap());
    }
    let cluster = Cluster::start(2);
    let mount = Mount::start(&cluster.meta_addr());
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("mpiio.c");
    fs::write(&source, MPI_PROGRAM).unwrap();
    for (index, (compiler, launcher)) in MPIS.iter().enumerate() {
        let program = work.path().join(format!("mpiio-{index}"));
        sh(&format!("{compiler} -O2 -o {} {}", common::path(&program), common::path(&source)));
        let name = format!("mpi-{index}.dat");
        let target = format!("ufs:{}", common::path(&mount.path(&name)));
        let output = sh(&format!("{launcher} -n 2 {} {target}", common::path(&program)));
        const BLOCK: usize = 1 << 20;
        const RECORD: usize = 47_008;
        const RECORDS: usize = 32;
        let total = 2 * BLOCK + 2 * RECORDS * RECORD;
        assert!(output.contains(&format!("verified {total} bytes")), "{compiler}: {output}");
        let data = fs::read(mount.path(&name)).unwrap();
        assert_eq!(data.len(), total, "{compiler}");
        for (index, byte) in data.iter().enumerate() {
            let expected = match index.checked_sub(2 * BLOCK) {
                None => b'a' + (index / BLOCK) as u8,
                Some(past) => b'A' + (past / RECORD % 2) as u8,
            };
            assert_eq!(*byte, expected, "{compiler}: byte {index}");
        }
    }
}

/// Each rank writes its 1 MiB block with MPI_File_write_at (independent I/O), then records
/// of 47008 bytes interleaved with the other rank's through a strided file view with
/// MPI_File_write_all (collective I/O); rank 0 reads the whole file back and checks it.
const MPI_PROGRAM: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define BLOCK (1 << 20)
#define RECORD 47008
#define RECORDS 32
static void check(int code, const char *what) {
    if (code != MPI_SUCCESS) { fprintf(stderr, "%s failed\n", what); MPI_Abort(MPI_COMM_WORLD, 1); }
}
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_File fh;
    MPI_Status status;
    check(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open");
    char *block = malloc(BLOCK);
    memset(block, 'a' + rank, BLOCK);
    check(MPI_File_write_at(fh, (MPI_Offset)rank * BLOCK, block, BLOCK, MPI_BYTE, &status), "write_at");
    MPI_Datatype records;
    MPI_Type_vector(RECORDS, RECORD, RECORD * size, MPI_BYTE, &records);
    MPI_Type_commit(&records);
    MPI_Offset start = (MPI_Offset)size * BLOCK + (MPI_Offset)rank * RECORD;
    check(MPI_File_set_view(fh, start, MPI_BYTE, records, "native", MPI_INFO_NULL), "set_view");
    char *mine = malloc(RECORD * RECORDS);
    memset(mine, 'A' + rank, RECORD * RECORDS);
    check(MPI_File_write_all(fh, mine, RECORD * RECORDS, MPI_BYTE, &status), "write_all");
    check(MPI_File_sync(fh), "sync");
    MPI_Barrier(MPI_COMM_WORLD);
    check(MPI_File_sync(fh), "sync");
    check(MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL), "set_view");
    if (rank == 0) {
        long total = (long)size * BLOCK + (long)size * RECORDS * RECORD;
        char *all = malloc(total);
        check(MPI_File_read_at(fh, 0, all, total, MPI_BYTE, &status), "read_at");
        int count;
        MPI_Get_count(&status, MPI_BYTE, &count);
        if (count != total) { fprintf(stderr, "read %d of %ld bytes\n", count, total); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (long i = 0; i < total; i++) {
            long past = i - (long)size * BLOCK;
            char expected = past < 0 ? 'a' + i / BLOCK : 'A' + (past / RECORD) % size;
            if (all[i] != expected) { fprintf(stderr, "byte %ld differs\n", i); MPI_Abort(MPI_COMM_WORLD, 1); }
        }
        printf("verified %ld bytes\n", total);
    }
    check(MPI_File_close(&fh), "close");
    MPI_Finalize();
    return 0;
}
"#;

#[test]
fn files_persist_across_a_cluster_restart() {
    let mut cluster = Cluster::start(3);
    let mut mount = Mount::start(&cluster.meta_addr());
    // Phase 1: write, with attributes to keep.
    let data = random_bytes(5, (2 << 20) + 5);
    fs::create_dir_all(mount.path("keep/deep")).unwrap();
    fs::write(mount.path("keep/deep/data"), &data).unwrap();
    fs::set_permissions(mount.path("keep/deep/data"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("deep/data", mount.path("keep/link")).unwrap();
    set_times(&mount.path("keep/deep/data"), 1_500_000_000, 1_600_000_000);
    // Phase 2: unmount cleanly, restart every process, mount again.
    mount.stop();
    cluster.restart();
    mount.remount(&cluster.meta_addr());
    // Phase 3: everything is there.
    assert_eq!(fs::read(mount.path("keep/link")).unwrap(), data);
    let meta = fs::metadata(mount.path("keep/deep/data")).unwrap();
    assert_eq!((meta.len(), meta.mode() & 0o777, meta.mtime()), (data.len() as u64, 0o640, 1_600_000_000));
    fs::write(mount.path("keep/after"), b"after").unwrap();
    assert_eq!(fs::read(mount.path("keep/after")).unwrap(), b"after");
}

#[test]
fn a_server_down_gives_eio_on_its_files_only_and_recovers() {
    let mut cluster = Cluster::start(2);
    // Files wait for a server that is away only this long (the default is a minute).
    let mount = Mount::start_with(&cluster.meta_addr(), &["--outage-wait-ms", "500"]);
    // Phase 1: one-subfile files, so that each lives on one server; find one per server.
    fs::create_dir(mount.path("one")).unwrap();
    set_xattr(&mount.path("one"), "user.flotilla.layout", "stripe:1M:1").unwrap();
    let client = cluster.client();
    let mut on_server: Vec<Option<(String, Vec<u8>)>> = vec![None, None];
    for index in 0..8 {
        let name = format!("one/f{index}");
        let data = random_bytes(index, 200_000);
        let mut file = fs::File::create(mount.path(&name)).unwrap();
        file.write_all(&data).unwrap();
        file.sync_all().unwrap();
        let place = client.stat(&format!("/{name}")).unwrap().subfiles[0].server.clone();
        let server = cluster.servers.iter().position(|s| s.as_ref().unwrap().addr == place).unwrap();
        on_server[server].get_or_insert((name, data));
    }
    let (victim, victim_data) = on_server[0].clone().expect("a file on server 0");
    let (other, other_data) = on_server[1].clone().expect("a file on server 1");
    let open_victim = fs::File::open(mount.path(&victim)).unwrap();

    // Phase 2: server 0 dies; its files give EIO, everything else works.
    cluster.servers[0].take().unwrap().kill();
    assert_eq!(errno(fs::read(mount.path(&victim))), libc::EIO);
    let mut buffer = vec![0u8; 10];
    assert_eq!(errno(open_victim.read_at(&mut buffer, 0)), libc::EIO);
    assert_eq!(fs::read(mount.path(&other)).unwrap(), other_data);
    assert_eq!(fs::metadata(mount.path(&victim)).unwrap().len(), victim_data.len() as u64);
    assert!(fs::read_dir(mount.path("one")).unwrap().count() >= 2);

    // Phase 3: the server comes back (on a new port); the same open file works again.
    let restarted = cluster.start_server(0);
    let new_addr = restarted.addr.clone();
    cluster.servers[0] = Some(restarted);
    // Wait for the target to be registered at its new address (until then the metadata
    // service may still list it, up, at the dead server's address).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client
        .status()
        .unwrap()
        .iter()
        .any(|t| t.server == new_addr && t.state == flotilla_client::TargetState::Up)
    {
        assert!(Instant::now() < deadline, "restarted server never registered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut back = vec![0u8; victim_data.len()];
    open_victim.read_exact_at(&mut back, 0).unwrap();
    assert!(back == victim_data);
    assert_eq!(fs::read(mount.path(&victim)).unwrap(), victim_data);
}

#[test]
fn sizes_are_seen_across_mounts_after_close() {
    let cluster = Cluster::start(2);
    let writer = Mount::start(&cluster.meta_addr());
    let reader = Mount::start(&cluster.meta_addr());
    fs::write(writer.path("grow"), b"").unwrap();
    assert_eq!(fs::metadata(reader.path("grow")).unwrap().len(), 0);
    let mut file = fs::OpenOptions::new().append(true).open(writer.path("grow")).unwrap();
    file.write_all(&random_bytes(7, 100_000)).unwrap();
    file.flush().unwrap();
    drop(file);
    // The reader's kernel may cache attributes for a second (attr_timeout_ms).
    let deadline = Instant::now() + Duration::from_secs(3);
    while fs::metadata(reader.path("grow")).unwrap().len() != 100_000 {
        assert!(Instant::now() < deadline, "size not seen by another mount after close");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fs::read(reader.path("grow")).unwrap() == random_bytes(7, 100_000));
    // fsync publishes too, while the file stays open.
    let file = fs::OpenOptions::new().write(true).open(writer.path("grow")).unwrap();
    file.write_all_at(b"tail", 200_000).unwrap();
    file.sync_all().unwrap();
    let mut read = fs::File::open(reader.path("grow")).unwrap();
    let mut all = Vec::new();
    read.read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 200_004);
    assert_eq!(&all[200_000..], b"tail");
}

#[test]
fn umount_cleans_up_after_a_killed_mount_process() {
    let cluster = Cluster::start(1);
    let mut mount = Mount::start(&cluster.meta_addr());
    fs::write(mount.path("f"), b"x").unwrap();
    // Phase 1: the mount process is killed: the mount answers ENOTCONN.
    let mut process = mount.process.take().unwrap();
    process.child.kill().unwrap();
    process.child.wait().unwrap();
    assert_eq!(errno(fs::metadata(mount.path("f"))), libc::ENOTCONN);
    // Phase 2: `flotilla umount` removes it; a new mount serves the same files.
    let status = Command::new(FLOTILLA).args(["umount", common::path(&mount.dir)]).status().unwrap();
    assert!(status.success());
    assert!(!common::is_mounted(&mount.dir));
    mount.remount(&cluster.meta_addr());
    assert_eq!(fs::read(mount.path("f")).unwrap(), b"x");
    // Phase 3: SIGTERM unmounts cleanly (checked by `stop`).
    mount.stop();
}

#[test]
fn local_cluster_mounts_and_unmounts() {
    let work = tempfile::tempdir().unwrap();
    fs::set_permissions(work.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = work.path().join("mnt");
    let data = work.path().join("data");
    let mut child = Command::new(FLOTILLA)
        .args(["local", "--servers", "2", "--listen", "127.0.0.1:0", "--data", common::path(&data)])
        .args(["--mount", common::path(&dir)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("meta="), "{first}");
    let key = lines.next().unwrap().unwrap();
    assert_eq!(key, format!("key={}", data.join("keys").join("client.cred").display()));
    let second = lines.next().unwrap().unwrap();
    assert_eq!(second, format!("mount={}", dir.display()));
    fs::write(dir.join("hello"), b"world").unwrap();
    assert_eq!(fs::read(dir.join("hello")).unwrap(), b"world");
    // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_with_timeout(&mut child, Duration::from_secs(20));
    let unmounted = !common::is_mounted(&dir);
    if !unmounted {
        let _ = Command::new(FLOTILLA).args(["umount", "--lazy", common::path(&dir)]).status();
    }
    assert!(status.is_some_and(|s| s.success()), "flotilla local exited with {status:?}");
    assert!(unmounted, "flotilla local left its mount behind");
}

/// Subfile directories of file `id` still present on the cluster's targets.
fn subfiles_on_disk(cluster: &Cluster, servers: usize, id: u64) -> usize {
    let prefix = format!("{id:016x}.");
    (0..servers)
        .filter_map(|index| fs::read_dir(cluster.target_dir(index).join("subfiles")).ok())
        .flat_map(|dir| dir.filter_map(Result::ok))
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .count()
}

fn wait_until_deleted(cluster: &Cluster, servers: usize, id: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while subfiles_on_disk(cluster, servers, id) > 0 {
        assert!(Instant::now() < deadline, "{what}: subfiles of {id:016x} never deleted");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// POSIX lifetimes across two mounts of one cluster: a file unlinked, or renamed over, by
/// mount B stays readable and writable through the descriptor mount A has open, until A
/// closes it; then its space is freed.
#[test]
fn open_unlink_and_rename_over_across_two_mounts() {
    let cluster = Cluster::start_with(2, "open_lease_ms = 3000");
    // Past the start-up grace period (one lease), in which any unlinked file is kept.
    std::thread::sleep(Duration::from_millis(3200));
    let a = Mount::start(&cluster.meta_addr());
    let b = Mount::start(&cluster.meta_addr());
    let data = random_bytes(11, 3 << 20);
    fs::write(a.path("scratch"), &data).unwrap();
    let id = fs::metadata(a.path("scratch")).unwrap().ino();
    let held = fs::OpenOptions::new().read(true).write(true).open(a.path("scratch")).unwrap();

    // Phase: B unlinks; several heartbeats pass (deletes would have gone out by now).
    fs::remove_file(b.path("scratch")).unwrap();
    assert_eq!(errno(fs::metadata(b.path("scratch"))), libc::ENOENT);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(subfiles_on_disk(&cluster, 2, id) > 0, "data deleted while open");
    let mut back = vec![0u8; data.len()];
    held.read_exact_at(&mut back, 0).expect("read through the open descriptor after unlink");
    assert!(back == data, "open-unlinked file changed");
    held.write_all_at(b"still writable", 100).unwrap();
    let mut small = [0u8; 14];
    held.read_exact_at(&mut small, 100).unwrap();
    assert_eq!(&small, b"still writable");

    // Phase: the last close frees the space.
    drop(held);
    wait_until_deleted(&cluster, 2, id, "after the last close");

    // Phase: rename over a file open on A; A keeps the old bytes, B sees the new file.
    fs::write(a.path("old"), b"old contents").unwrap();
    let old_id = fs::metadata(a.path("old")).unwrap().ino();
    let mut old = fs::File::open(a.path("old")).unwrap();
    fs::write(b.path("new"), b"new contents").unwrap();
    fs::rename(b.path("new"), b.path("old")).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let mut text = String::new();
    old.read_to_string(&mut text).unwrap();
    assert_eq!(text, "old contents", "the renamed-over file must keep its bytes for its reader");
    assert_eq!(fs::read(b.path("old")).unwrap(), b"new contents");
    drop(old);
    wait_until_deleted(&cluster, 2, old_id, "renamed-over file after close");
}

/// A file held open only by a mount process that is then killed (SIGKILL) is deleted once
/// that mount's lease runs out: orphans of crashed clients do not leak.
#[test]
fn orphans_of_a_killed_mount_are_released_when_its_lease_expires() {
    let cluster = Cluster::start_with(1, "open_lease_ms = 3000");
    std::thread::sleep(Duration::from_millis(3200));
    let mut a = Mount::start(&cluster.meta_addr());
    fs::write(a.path("tmp"), random_bytes(3, 100_000)).unwrap();
    let id = fs::metadata(a.path("tmp")).unwrap().ino();
    // `exec sleep`: the holder is the process killed below (a `sleep` left behind would keep
    // the test's output pipe open for ten minutes).
    let mut holder = Command::new("sh")
        .args(["-c", &format!("exec 3< {}; exec sleep 600", a.path("tmp").display())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    cluster.client().remove("/tmp").unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(subfiles_on_disk(&cluster, 1, id) > 0, "deleted while a process holds it open");

    // Phase: the mount process dies with the descriptor open; its lease expires.
    let mut process = a.process.take().unwrap();
    process.child.kill().unwrap();
    process.child.wait().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    wait_until_deleted(&cluster, 1, id, "after the killed mount's lease");
}

/// A file created through the mount is created and opened by one request to the metadata
/// service (`CreateAtOpen`), not a create and then an open; the file works as before.
#[test]
fn a_create_through_the_mount_is_one_request() {
    const FILES: u64 = 40;
    let local = common::Local::start(1, true);
    let mount = common::Mount::start_with(&local.meta, &["--key", common::path(&local.key)]);
    let kinds = ["create_at_open", "create_at", "opened"];
    let before: Vec<u64> = kinds.iter().map(|kind| local.meta_requests(kind)).collect();
    for i in 0..FILES {
        fs::write(mount.path(&format!("f{i}")), format!("file {i}")).expect("create and write");
    }
    let after: Vec<u64> = kinds.iter().map(|kind| local.meta_requests(kind)).collect();
    let made: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(made, [FILES, 0, 0], "requests per kind {kinds:?}");
    for i in 0..FILES {
        assert_eq!(fs::read_to_string(mount.path(&format!("f{i}"))).unwrap(), format!("file {i}"));
    }
    // O_CREAT without O_EXCL on an existing file opens it (the exclusive create fails first).
    fs::write(mount.path("f0"), "again").expect("rewrite");
    assert_eq!(fs::read_to_string(mount.path("f0")).unwrap(), "again");
    let exclusive = fs::OpenOptions::new().write(true).create_new(true).open(mount.path("f1"));
    assert_eq!(exclusive.unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
}
