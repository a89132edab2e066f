//! POSIX through the mount with a namespace addressed by identity (issue 11): two mounts of
//! one cluster where one renames what the other holds, paths longer than PATH_MAX, names
//! that are not UTF-8, FIFOs, sockets and device nodes, and the setuid/setgid rules.
//!
//! Real processes: a cluster, `flotilla mount` processes, system calls through libc and std.
//! Needs root (to mount, to make device nodes and to act as another user).

mod common;
mod locking;

use common::{Cluster, Mount};
use locking::{set_lock, TRY_LOCKF, WAIT_LOCKF};
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The unprivileged user the permission rules are checked for.
const NOBODY: u32 = 65534;

fn c_bytes(bytes: &[u8]) -> CString {
    CString::new(bytes).expect("no NUL")
}

fn c_path(path: &Path) -> CString {
    c_bytes(path.as_os_str().as_bytes())
}

/// The last errno as an `io::Error`, for a libc call that returned -1.
fn check(result: i32, what: &str) -> i32 {
    assert!(result >= 0, "{what}: {}", std::io::Error::last_os_error());
    result
}

/// Opens a directory (O_PATH is not enough for *at calls that create).
fn open_dir(path: &Path) -> i32 {
    // SAFETY: a valid NUL-terminated path; the fd is closed by the caller.
    check(unsafe { libc::open(c_path(path).as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) }, "open dir")
}

fn close(fd: i32) {
    // SAFETY: closing an fd this test opened.
    unsafe { libc::close(fd) };
}

/// Creates (or truncates) `name` in the directory `dir_fd` and writes `data`.
fn write_at(dir_fd: i32, name: &[u8], data: &[u8]) {
    let name = c_bytes(name);
    // SAFETY: valid fd and NUL-terminated name.
    let fd =
        unsafe { libc::openat(dir_fd, name.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644) };
    check(fd, "openat create");
    let mut file = fd_file(fd);
    file.write_all(data).unwrap();
}

fn fd_file(fd: i32) -> fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` is a fresh descriptor this test owns; the File closes it.
    unsafe { fs::File::from_raw_fd(fd) }
}

fn names(dir: &Path) -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> =
        fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().as_bytes().to_vec()).collect();
    names.sort();
    names
}

/// The issue's case: mount A renames q1 to q2 and makes a new q1; mount B, which held the
/// old q1 open (a directory handle and an open file in it), keeps acting on the old objects,
/// and its path lookups see the new q1.
#[test]
fn another_mounts_rename_never_redirects_this_mount() {
    let cluster = Cluster::start(2);
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    fs::create_dir(b.path("q1")).unwrap();
    fs::write(b.path("q1/old"), b"old").unwrap();
    let held_dir = open_dir(&b.path("q1"));
    let mut held_file = fs::OpenOptions::new().read(true).write(true).open(b.path("q1/old")).unwrap();

    fs::rename(a.path("q1"), a.path("q2")).unwrap();
    fs::create_dir(a.path("q1")).unwrap();
    fs::write(a.path("q1/new"), b"new").unwrap();

    // Through its old directory handle, B creates in the old directory (now q2).
    write_at(held_dir, b"made-by-b", b"b");
    assert_eq!(names(&a.path("q2")), [b"made-by-b".to_vec(), b"old".to_vec()]);
    assert_eq!(names(&a.path("q1")), [b"new".to_vec()]);
    // Listing the held handle lists the old directory.
    let listed = names(&PathBuf::from(format!("/proc/self/fd/{held_dir}")));
    assert_eq!(listed, [b"made-by-b".to_vec(), b"old".to_vec()]);
    close(held_dir);
    // The open file is still the old file.
    held_file.write_all(b"+b").unwrap();
    drop(held_file);
    assert_eq!(fs::read(a.path("q2/old")).unwrap(), b"+bd");
    let mut text = String::new();
    fs::File::open(b.path("q1/new")).unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(text, "new");
    assert_eq!(names(&b.path("q1")), [b"new".to_vec()]);
    // A hard link made by B into another directory names the same file.
    fs::hard_link(b.path("q2/old"), b.path("q1/linked")).unwrap();
    assert_eq!(
        fs::metadata(a.path("q1/linked")).unwrap().ino(),
        fs::metadata(a.path("q2/old")).unwrap().ino()
    );
    assert_eq!(fs::metadata(a.path("q2/old")).unwrap().nlink(), 2);
}

/// Any path the kernel can walk works: components of 255 bytes, a path just under
/// PATH_MAX given whole, and a tree deeper than PATH_MAX reached by directory handles.
#[test]
fn names_near_and_beyond_path_max() {
    let cluster = Cluster::start(1);
    let mount = Mount::start(&cluster.meta_addr());
    let long = "n".repeat(255);
    let mut path = mount.dir.clone();
    // Whole paths: as deep as fits in PATH_MAX (4096 bytes with the NUL).
    while path.as_os_str().len() + 1 + 255 + 1 + 10 < 4096 {
        path.push(&long);
        fs::create_dir(&path).unwrap();
    }
    let file = path.join("f");
    assert!(file.as_os_str().len() > 3800, "{}", file.as_os_str().len());
    fs::write(&file, b"deep").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"deep");
    assert_eq!(errno_of(fs::create_dir(path.join("x".repeat(256)))), libc::ENAMETOOLONG);

    // Beyond PATH_MAX: walk down with directory handles, 20 levels of 255-byte names.
    let mut dir_fd = open_dir(&mount.dir);
    let name = c_bytes(b"d".repeat(255).as_slice());
    for _ in 0..20 {
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::mkdirat(dir_fd, name.as_ptr(), 0o755) }, "mkdirat");
        // SAFETY: as above.
        let next = unsafe { libc::openat(dir_fd, name.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        close(dir_fd);
        dir_fd = check(next, "openat dir");
    }
    write_at(dir_fd, b"bottom", b"5100 bytes down");
    let bottom = c_bytes(b"bottom");
    // SAFETY: valid fd and name; `stat` is written by fstatat.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatat(dir_fd, bottom.as_ptr(), &mut stat, 0) }, "fstatat");
    assert_eq!(stat.st_size, 15);
    close(dir_fd);
    // The library resolves the same tree component by component, past PATH_MAX too.
    let client = cluster.client();
    let top = client.stat(&format!("/{}", "d".repeat(255))).unwrap();
    assert_eq!(top.attrs.kind, flotilla_client::FileKind::Directory);
}

fn errno_of<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    result.expect_err("the call should have failed").raw_os_error().expect("an errno")
}

/// Names are bytes: a name that is not UTF-8 is created, listed, renamed and removed.
#[test]
fn names_that_are_not_utf8() {
    let cluster = Cluster::start(1);
    let mount = Mount::start(&cluster.meta_addr());
    let raw: &[u8] = b"caf\xe9-\xff\xfe";
    let path = mount.dir.join(std::ffi::OsStr::from_bytes(raw));
    fs::write(&path, b"latin-1").unwrap();
    assert_eq!(names(&mount.dir), [raw.to_vec()]);
    assert_eq!(fs::read(&path).unwrap(), b"latin-1");
    let renamed = mount.dir.join(std::ffi::OsStr::from_bytes(b"\x80dir"));
    fs::create_dir(&renamed).unwrap();
    let inside = renamed.join(std::ffi::OsStr::from_bytes(raw));
    fs::rename(&path, &inside).unwrap();
    assert_eq!(names(&renamed), [raw.to_vec()]);
    fs::remove_file(&inside).unwrap();
    fs::remove_dir(&renamed).unwrap();
    assert!(names(&mount.dir).is_empty());
}

/// FIFOs, UNIX sockets and device nodes are inodes of their own kind, with rdev, seen
/// alike through a second mount and the library.
#[test]
fn fifos_sockets_and_device_nodes() {
    let cluster = Cluster::start(1);
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    let fifo = a.path("pipe");
    // SAFETY: valid NUL-terminated paths.
    check(unsafe { libc::mkfifo(c_path(&fifo).as_ptr(), 0o644) }, "mkfifo");
    let device = libc::makedev(1, 3);
    check(
        unsafe { libc::mknod(c_path(&a.path("null")).as_ptr(), libc::S_IFCHR | 0o600, device) },
        "mknod chr",
    );
    check(
        unsafe { libc::mknod(c_path(&a.path("disk")).as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(8, 1)) },
        "mknod blk",
    );
    let listener = std::os::unix::net::UnixListener::bind(a.path("sock")).unwrap();

    let meta = |name: &str| fs::symlink_metadata(b.path(name)).unwrap();
    assert!(meta("pipe").file_type().is_fifo());
    assert!(meta("sock").file_type().is_socket());
    assert!(meta("null").file_type().is_char_device());
    assert_eq!(meta("null").rdev(), device);
    assert!(meta("disk").file_type().is_block_device());
    assert_eq!(meta("disk").rdev(), libc::makedev(8, 1));
    let client = cluster.client();
    assert_eq!(client.stat("/pipe").unwrap().attrs.kind, flotilla_client::FileKind::Fifo);
    // statfs counts the inodes in use: the root and the four made here.
    // SAFETY: a valid path; `stats` is written by statvfs.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(c_path(&b.dir).as_ptr(), &mut stats) }, "statvfs");
    assert_eq!(stats.f_files - stats.f_ffree, 5);
    assert_eq!(client.stat("/null").unwrap().attrs.rdev, device);

    // The FIFO is a pipe: what a writer on mount A sends, a reader on mount A receives.
    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || fs::write(writer_path, b"through the fifo").unwrap());
    assert_eq!(fs::read(&fifo).unwrap(), b"through the fifo");
    writer.join().unwrap();
    // The socket works: a client connects through its name on the mount.
    let mut stream = std::os::unix::net::UnixStream::connect(a.path("sock")).unwrap();
    stream.write_all(b"hi").unwrap();
    let (mut accepted, _) = listener.accept().unwrap();
    let mut got = [0u8; 2];
    accepted.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hi");
    // Special files link, rename and unlink like files.
    fs::hard_link(a.path("pipe"), a.path("pipe2")).unwrap();
    assert_eq!(meta("pipe2").nlink(), 2);
    fs::rename(a.path("null"), a.path("null2")).unwrap();
    assert_eq!(meta("null2").rdev(), device);
    for name in ["pipe", "pipe2", "null2", "disk", "sock"] {
        fs::remove_file(a.path(name)).unwrap();
    }
    assert!(names(&b.dir).is_empty());
}

/// setuid/setgid are cleared when someone other than root writes, truncates or chowns the
/// file (as on Linux), and kept when root writes.
#[test]
fn setuid_and_setgid_are_cleared_by_writes_truncates_and_chown() {
    let cluster = Cluster::start(1);
    let mount = Mount::start(&cluster.meta_addr());
    let file = mount.path("prog");
    let setid = |mode: u32| {
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o7777, mode);
    };
    let mode = || fs::metadata(&file).unwrap().mode() & 0o7777;
    fs::write(&file, b"#!/bin/sh\n").unwrap();

    // Root writes: the bits stay.
    setid(0o6777);
    fs::OpenOptions::new().append(true).open(&file).unwrap().write_all(b"true\n").unwrap();
    assert_eq!(mode(), 0o6777);

    // Another user writes: both go.
    let as_nobody = |command: &str| {
        let output = Command::new("sh").arg("-c").arg(command).uid(NOBODY).gid(NOBODY).output().unwrap();
        assert!(output.status.success(), "{command}: {}", String::from_utf8_lossy(&output.stderr));
    };
    as_nobody(&format!("echo more >> {}", file.display()));
    assert_eq!(mode(), 0o0777);

    // Another user truncates: both go.
    setid(0o6777);
    as_nobody(&format!("truncate -s 3 {}", file.display()));
    assert_eq!(mode(), 0o0777);
    assert_eq!(fs::metadata(&file).unwrap().len(), 3);

    // chown: both go (setgid with group execute).
    setid(0o6755);
    std::os::unix::fs::chown(&file, Some(NOBODY), None).unwrap();
    assert_eq!(mode(), 0o0755);
    assert_eq!(fs::metadata(&file).unwrap().uid(), NOBODY);
}

/// Sets a file's atime and mtime (seconds since the epoch) through the mount.
fn set_times(path: &Path, atime_s: i64, mtime_s: i64) {
    let times =
        [libc::timespec { tv_sec: atime_s, tv_nsec: 0 }, libc::timespec { tv_sec: mtime_s, tv_nsec: 0 }];
    // SAFETY: a valid path and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, c_path(path).as_ptr(), times.as_ptr(), 0) }, "utimensat");
}

/// Access times of reads: relatime (the default) updates an atime not after the mtime (or
/// ctime), and leaves a recent one; strictatime updates at every read; noatime never. No read
/// changes the ctime.
#[test]
fn reads_update_atime_by_the_mount_rule() {
    let cluster = Cluster::start(1);
    let meta = cluster.meta_addr();
    let relatime = Mount::start(&meta);
    let strict = Mount::start_with(&meta, &["--atime", "strictatime"]);
    let noatime = Mount::start_with(&meta, &["--atime", "noatime"]);
    fs::write(relatime.path("f"), b"data").unwrap();
    let stat = |mount: &Mount| fs::metadata(mount.path("f")).unwrap();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;

    // An atime before the mtime: relatime updates it, without touching the ctime.
    set_times(&relatime.path("f"), 1_000, 2_000);
    let ctime = (stat(&relatime).ctime(), stat(&relatime).ctime_nsec());
    assert_eq!(fs::read(noatime.path("f")).unwrap(), b"data");
    assert_eq!(stat(&relatime).atime(), 1_000, "noatime updated the atime");
    assert_eq!(fs::read(relatime.path("f")).unwrap(), b"data");
    assert!(stat(&relatime).atime() >= now_s, "relatime did not update an atime before the mtime");
    assert_eq!((stat(&relatime).ctime(), stat(&relatime).ctime_nsec()), ctime, "a read changed the ctime");

    // Now the atime is recent and after the mtime and ctime: relatime leaves it,
    // strictatime updates it.
    let atime = |mount: &Mount| (stat(mount).atime(), stat(mount).atime_nsec());
    let updated = atime(&relatime);
    fs::read(relatime.path("f")).unwrap();
    assert_eq!(atime(&relatime), updated, "relatime updated a recent atime");
    fs::read(strict.path("f")).unwrap();
    assert!(atime(&strict) > updated, "strictatime did not update the atime");
}

/// A writer process for the ENWRICH test: opens `path` write-only, writes `length` bytes of
/// `byte` at `offset`, says so, and closes the file when told to (a line on stdin).
const ENWRICH_WRITER: &str = r#"
import os, sys
path, offset, byte, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY)
os.pwrite(fd, bytes([byte]) * length, offset)
print("written", flush=True)
sys.stdin.readline()
os.close(fd)
print("closed", flush=True)
"#;

/// ENWRICH through the mount (`--enwrich`): two processes whose environment names a job of
/// two open one file write-only; their writes, which this mount (no write-behind) would
/// otherwise send at once, stay in the mount's log caches until the job flushes; an open of
/// the file for reading through the mount flushes the job first, and both closes succeed.
#[test]
fn enwrich_mount_holds_a_jobs_writes_until_the_job_flushes() {
    use std::io::BufRead;
    use std::process::Stdio;
    const PART: usize = 1 << 20;
    let cluster = Cluster::start(2);
    let mount = Mount::start_with(&cluster.meta_addr(), &["--enwrich", "--write-behind-bytes", "0"]);
    let path = mount.path("out");
    fs::write(&path, b"").unwrap();
    let job = format!("posix-test-{}", std::process::id());
    let mut writers: Vec<_> = [(0usize, 0xA1u8), (1, 0xB2)]
        .iter()
        .map(|(index, byte)| {
            let mut child = Command::new("python3")
                .args(["-c", ENWRICH_WRITER, common::path(&path)])
                .args([(index * PART).to_string(), byte.to_string(), PART.to_string()])
                .env("FLOTILLA_JOB_NAME", &job)
                .env("FLOTILLA_JOB_SIZE", "2")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start python3");
            let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
            assert_eq!(lines.next().unwrap().unwrap(), "written");
            (child, lines)
        })
        .collect();
    // Both writes are in the mount's ENWRICH caches: the servers hold nothing yet.
    let client = cluster.client();
    let file = client.open("/out").unwrap();
    let mut seen = vec![0x55u8; 2 * PART];
    // A read of the subfiles' bytes whatever size the metadata service has published.
    file.read_shape(&flotilla_client::Shape::contiguous(0, 2 * PART as u64), &mut seen).unwrap();
    assert!(seen.iter().all(|b| *b == 0), "ENWRICH writes reached the servers before a flush");
    // Opening for reading through the mount flushes the job (flush-on-read).
    let read = fs::read(&path).unwrap();
    assert_eq!(read.len(), 2 * PART);
    assert!(read[..PART].iter().all(|b| *b == 0xA1) && read[PART..].iter().all(|b| *b == 0xB2));
    for (child, lines) in &mut writers {
        writeln!(child.stdin.as_mut().unwrap()).unwrap();
        assert_eq!(lines.next().unwrap().unwrap(), "closed");
    }
    for (mut child, _) in writers {
        assert!(child.wait().unwrap().success());
    }
    let after = client.open("/out").unwrap();
    assert_eq!(after.size(), 2 * PART as u64);
    let mut data = vec![0u8; 2 * PART];
    after.read_at(0, &mut data).unwrap();
    assert_eq!(data, read);
}

/// Runs a Python snippet that tries a lock on `path` (another process, so POSIX's "a
/// process never conflicts with itself" does not hide anything) and prints what it got.
fn python_lock(script: &str, path: &Path) -> std::process::Child {
    Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3")
}

fn output_of(child: std::process::Child) -> String {
    let output = child.wait_with_output().expect("wait for python3");
    assert!(output.status.success(), "python3 failed: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// `fcntl(F_GETLK)` for a write lock of bytes 0..10: the holder's type and range, or "unlocked".
const TEST_LOCK: &str = "import fcntl,struct,sys\nf=open(sys.argv[1],'r+')\nr=fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 10, 0))\nt,w,s,l,p=struct.unpack('hhqqi4x', r)\nprint('unlocked' if t == fcntl.F_UNLCK else 'held %d %d %d' % (t, s, l))";
/// `flock(LOCK_EX|LOCK_NB)`: "got" or "busy".
const TRY_FLOCK: &str = "import fcntl,sys\nf=open(sys.argv[1],'r+')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX|fcntl.LOCK_NB)\n    print('got')\nexcept OSError:\n    print('busy')";

/// fcntl and flock locks taken through one mount exclude processes on another mount of the
/// same cluster; F_GETLK on the other mount reports the holder; a waiter on the other mount
/// gets the lock when the holder lets go.
#[test]
fn fcntl_and_flock_locks_exclude_across_mounts() {
    let cluster = Cluster::start(1);
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    fs::write(a.path("locked"), b"0123456789abcdef").unwrap();
    let holder = fs::OpenOptions::new().read(true).write(true).open(a.path("locked")).unwrap();
    use std::os::unix::io::AsRawFd;
    check(set_lock(holder.as_raw_fd(), libc::F_WRLCK), "F_SETLK through mount A");
    assert_eq!(output_of(python_lock(TRY_LOCKF, &b.path("locked"))), "busy", "B locked what A holds");
    assert_eq!(output_of(python_lock(TEST_LOCK, &b.path("locked"))), format!("held {} 0 10", libc::F_WRLCK));
    let waiter = python_lock(WAIT_LOCKF, &b.path("locked"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    check(set_lock(holder.as_raw_fd(), libc::F_UNLCK), "F_UNLCK through mount A");
    assert_eq!(output_of(waiter), "got", "the waiter on B got the lock A let go");
    assert_eq!(output_of(python_lock(TEST_LOCK, &b.path("locked"))), "unlocked");
    // flock: held through A by an open file, refused on B until that file is closed.
    // SAFETY: the descriptor is open.
    check(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, "flock through mount A");
    assert_eq!(output_of(python_lock(TRY_FLOCK, &b.path("locked"))), "busy", "B flocked what A holds");
    drop(holder);
    assert_eq!(output_of(python_lock(TRY_FLOCK, &b.path("locked"))), "got", "A's close released its flock");
}

/// A lock held through a mount that is killed (SIGKILL: no unlock, no close reaches the
/// cluster) is released when the mount's lease runs out, and another mount can take it.
#[test]
fn a_killed_mounts_locks_go_with_its_lease() {
    let cluster = Cluster::start_with(1, "open_lease_ms = 2000");
    let b = Mount::start(&cluster.meta_addr());
    let mut a = Mount::start(&cluster.meta_addr());
    fs::write(a.path("leased"), b"0123456789").unwrap();
    // The holder is a Python process on A that takes the lock and then waits to be killed.
    let hold = "import fcntl,sys,time\nf=open(sys.argv[1],'r+')\nfcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\nprint('held', flush=True)\ntime.sleep(600)";
    let mut holder = python_lock(hold, &a.path("leased"));
    let mut line = [0u8; 5];
    holder.stdout.as_mut().expect("stdout").read_exact(&mut line).expect("the holder reports");
    assert_eq!(&line, b"held\n");
    assert_eq!(output_of(python_lock(TRY_LOCKF, &b.path("leased"))), "busy");
    let mut process = a.process.take().expect("mount A running");
    process.child.kill().expect("SIGKILL mount A");
    let _ = process.child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if output_of(python_lock(TRY_LOCKF, &b.path("leased"))) == "got" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the dead mount's lock was never released");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

/// The issue's case: two processes, one per mount, append 2,000 lines each with O_APPEND at
/// the same time; every line of both is in the file, whole, and each writer's lines keep
/// their order.
#[test]
fn appends_from_two_mounts_keep_every_line() {
    let cluster = Cluster::start(2);
    let (a, b) = (Mount::start(&cluster.meta_addr()), Mount::start(&cluster.meta_addr()));
    fs::write(a.path("log"), b"").unwrap();
    let append = "import os,sys\nfd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND)\nfor i in range(2000):\n    line=('%s %04d ' % (sys.argv[2], i)).encode() + b'x' * (i % 23) + b'\\n'\n    assert os.write(fd, line) == len(line)\nos.close(fd)";
    let writers: Vec<std::process::Child> = [(&a, "A"), (&b, "B")]
        .iter()
        .map(|(mount, name)| {
            Command::new("python3")
                .args(["-c", append])
                .arg(mount.path("log"))
                .arg(name)
                .spawn()
                .expect("python3")
        })
        .collect();
    for mut writer in writers {
        assert!(writer.wait().expect("wait").success(), "an appender failed");
    }
    let text = fs::read_to_string(b.path("log")).expect("read the log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4000, "lines lost or torn: {} of 4000", lines.len());
    for name in ["A", "B"] {
        let mine: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with(name)).collect();
        assert_eq!(mine.len(), 2000, "{name} lost lines");
        for (i, line) in mine.iter().enumerate() {
            let want = format!("{name} {i:04} {}", "x".repeat(i % 23));
            assert_eq!(*line, want, "{name}'s line {i} torn or out of order");
        }
    }
}

/// Read requests the cluster's servers have served so far.
fn server_read_ops(client: &flotilla_client::Client) -> u64 {
    let servers: std::collections::BTreeSet<String> =
        client.status().expect("status").into_iter().map(|target| target.server).collect();
    servers.iter().map(|server| client.server_stats(server).expect("server stats").total.read_ops).sum()
}

/// Reads every 4th 4 KiB record of `path` with pread, checking each against `content`, and
/// returns how many read requests the servers served meanwhile.
fn strided_scan(client: &flotilla_client::Client, path: &Path, content: &[u8]) -> u64 {
    use std::os::unix::fs::FileExt;
    let before = server_read_ops(client);
    let file = fs::File::open(path).expect("open for reading");
    let mut record = vec![0u8; 4096];
    for index in (0..content.len() / 4096).step_by(4) {
        let offset = index * 4096;
        file.read_exact_at(&mut record, offset as u64).expect("pread");
        assert!(record[..] == content[offset..offset + 4096], "record {index} differs");
    }
    server_read_ops(client) - before
}

/// Read-ahead sees the stride: a scan of every 4th 4 KiB record through a mount makes a
/// fraction of the requests it makes with read-ahead off (counted by the servers), and
/// reads the same bytes; a write through the mount is seen by the next read of an open
/// reader (its fetched-ahead bytes are dropped).
#[test]
fn read_ahead_turns_a_strided_scan_into_few_requests() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    // The mount's own read-ahead: without the kernel's page cache (whose read-ahead would
    // make the requests few either way).
    let ahead = Mount::start_with(&cluster.meta_addr(), &["--kernel-cache", "off"]);
    let plain = Mount::start_with(&cluster.meta_addr(), &["--kernel-cache", "off", "--readahead-bytes", "0"]);
    let content: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(ahead.path("scan"), &content).unwrap();
    let records = (content.len() / 4096).div_ceil(4) as u64;
    let without = strided_scan(&client, &plain.path("scan"), &content);
    let with = strided_scan(&client, &ahead.path("scan"), &content);
    eprintln!("strided scan of {records} records: {without} read requests without read-ahead, {with} with");
    assert!(without >= records, "{without} requests for {records} reads without read-ahead");
    assert!(with * 4 <= records, "{with} requests for {records} reads with read-ahead");
    // Through the kernel's page cache (a read-only open under tokens) the kernel's own
    // read-ahead makes the requests few too, and the bytes are the same.
    let cached = Mount::start(&cluster.meta_addr());
    let through_kernel = strided_scan(&client, &cached.path("scan"), &content);
    eprintln!("the same scan through the kernel's page cache: {through_kernel} read requests");
    assert!(
        through_kernel * 4 <= records,
        "{through_kernel} requests for {records} reads through the page cache"
    );
    // Coherence within the mount: a reader's window is dropped by a write through the mount.
    use std::os::unix::fs::FileExt;
    let reader = fs::File::open(ahead.path("scan")).unwrap();
    let mut record = vec![0u8; 4096];
    for index in 0..4u64 {
        reader.read_exact_at(&mut record, index * 16384).unwrap();
    }
    let writer = fs::OpenOptions::new().write(true).open(ahead.path("scan")).unwrap();
    writer.write_all_at(&[0xab; 4096], 5 * 16384).unwrap();
    reader.read_exact_at(&mut record, 4 * 16384).unwrap();
    reader.read_exact_at(&mut record, 5 * 16384).unwrap();
    assert!(record.iter().all(|b| *b == 0xab), "the reader saw bytes fetched before the write");
}
