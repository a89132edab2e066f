//! fcntl locks taken and probed by the lock tests (`posix.rs`, `reclaim.rs`,
//! `meta_failover_locks.rs`): Python one-liners run on a path, and a non-waiting `F_SETLK`.
#![allow(dead_code)]

/// `fcntl(F_SETLK)` of bytes 0..10 without waiting: "got" or "busy".
pub const TRY_LOCKF: &str = "import fcntl,sys\nf=open(sys.argv[1],'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB, 10, 0)\n    print('got')\nexcept OSError:\n    print('busy')";
/// `fcntl(F_SETLKW)`: waits for the lock, then prints "got".
pub const WAIT_LOCKF: &str =
    "import fcntl,sys\nf=open(sys.argv[1],'r+')\nfcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\nprint('got')";
/// `fcntl(F_GETLK)` for a write lock of bytes 0..10: "held" or "unlocked".
pub const TEST_LOCK: &str = "import fcntl,struct,sys\nf=open(sys.argv[1],'r+')\nr=fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 10, 0))\nt,w,s,l,p=struct.unpack('hhqqi4x', r)\nprint('unlocked' if t == fcntl.F_UNLCK else 'held')";

/// Takes (or with `F_UNLCK` drops) an fcntl lock of bytes 0..10 on `fd`, without waiting.
pub fn set_lock(fd: i32, typ: i32) -> i32 {
    // SAFETY: a zeroed flock is a valid value; fcntl reads it for the length of the call.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = typ as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = 0;
    lock.l_len = 10;
    // SAFETY: fd is open and `lock` outlives the call.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &lock) }
}

/// Asserts a libc call returned 0, naming `what` and the OS error.
pub fn check(result: i32, what: &str) {
    assert_eq!(result, 0, "{what}: {}", std::io::Error::last_os_error());
}
