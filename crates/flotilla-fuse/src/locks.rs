//! fcntl record locks and flock across mounts: the kernel hands both to the mount as
//! GETLK/SETLK/SETLKW (flock too, once `FUSE_FLOCK_LOCKS` is granted at init), and the mount
//! keeps them in the metadata service under its client session, so a lock taken through
//! one mount excludes the others and a crashed mount's locks go with its lease.
//!
//! A blocking SETLKW waits in rounds: each asks the service to wait up to
//! `LOCK_WAIT_ROUND_MS` for the conflicting locks to go, then asks again. A round that
//! starts after the waiter's descriptor was closed (the kernel gave up on it: the process
//! was killed) stops waiting, and a lock granted to it then is given back. At most half the
//! mount's threads wait at once (ENOLCK beyond), so waiters never starve other requests.
//!
//! The mount remembers which (inode, owner) pairs ever took a lock, so a `close` asks the
//! service to drop locks only for those (POSIX: closing any descriptor of a file drops the
//! process's locks on it) and costs nothing for programs that never lock.
//!
//! After a restart of the metadata service the client library reclaims the locks granted
//! here and asks again for new ones while the service's grace period lasts
//! (`flotilla-client` `locks.rs`), so a lock held through this mount keeps excluding others.

use crate::fs::FlotillaFs;
use crate::names::failed;
use flotilla_client::{LockInfo, LockKind};
use fuser::Errno;
use std::collections::HashMap;

/// Longest one round of a blocking lock wait asks the metadata service to hold it.
const LOCK_WAIT_ROUND_MS: u64 = 1000;

/// The byte an `O_APPEND` write locks while it finds the end of the file, writes there and
/// publishes the new size: past `OFFSET_MAX`, so no program's lock can cover it.
const APPEND_LOCK_BYTE: u64 = u64::MAX;
/// Owners of append locks have this bit set (program lock owners are kernel pointers, which
/// never do on x86-64 and arm64), and a serial number, so every append is its own owner and
/// appends of this mount's own processes exclude each other too.
const APPEND_OWNER_BIT: u64 = 1 << 63;

/// The mount's side of the locks: who has locked what, and how many threads wait.
#[derive(Default)]
pub(crate) struct LockState {
    /// (inode, owner) → the generation it was first seen locking in (unique per sighting:
    /// after its locks were dropped, the pair comes back with a new one).
    owners: parking_lot::Mutex<HashMap<(u64, u64), u64>>,
    generations: std::sync::atomic::AtomicU64,
    waiting: std::sync::atomic::AtomicUsize,
}

fn kind_of(typ: i32) -> Result<LockKind, Errno> {
    match typ {
        libc::F_RDLCK => Ok(LockKind::Read),
        libc::F_WRLCK => Ok(LockKind::Write),
        libc::F_UNLCK => Ok(LockKind::Unlock),
        _ => Err(Errno::EINVAL),
    }
}

fn typ_of(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

/// What GETLK answers: the conflicting lock, or F_UNLCK over the range asked.
pub(crate) struct Tested {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

impl FlotillaFs {
    /// GETLK: the first lock another owner (on any mount) holds that conflicts.
    pub(crate) fn lock_test(
        &self,
        ino: u64,
        owner: u64,
        (start, end): (u64, u64),
        typ: i32,
    ) -> Result<Tested, Errno> {
        let kind = kind_of(typ)?;
        let holder =
            self.retrying(|| self.client.get_lock(ino, owner, kind, (start, end))).map_err(failed)?;
        Ok(match holder {
            Some(LockInfo { kind, start, end, pid }) => Tested { start, end, typ: typ_of(kind), pid },
            None => Tested { start, end, typ: libc::F_UNLCK, pid: 0 },
        })
    }

    /// SETLK (`sleep` false: EAGAIN on a conflict) and SETLKW (`sleep` true: waits).
    pub(crate) fn lock_set(
        &self,
        ino: u64,
        owner: u64,
        range: (u64, u64),
        (typ, pid): (i32, u32),
        sleep: bool,
    ) -> Result<(), Errno> {
        let kind = kind_of(typ)?;
        let generation = self.locks.note_owner(ino, owner);
        if !sleep || kind == LockKind::Unlock {
            let holder = self.client.set_lock(ino, owner, kind, range, pid, 0).map_err(failed)?;
            return if holder.is_some() { Err(Errno::EAGAIN) } else { Ok(()) };
        }
        let _waiting = self.locks.start_waiting(self.lock_waiters_max)?;
        loop {
            let holder =
                self.client.set_lock(ino, owner, kind, range, pid, LOCK_WAIT_ROUND_MS).map_err(failed)?;
            let still_open = self.locks.generation(ino, owner) == Some(generation);
            match (holder, still_open) {
                (None, true) => return Ok(()),
                (None, false) => {
                    // Granted after the waiter's descriptor was closed: give it back.
                    let _ = self.client.set_lock(ino, owner, LockKind::Unlock, range, pid, 0);
                    return Err(Errno::EINTR);
                }
                (Some(_), false) => return Err(Errno::EINTR),
                (Some(_), true) => continue,
            }
        }
    }

    /// Runs `append` holding the cluster-wide append lock of `ino` (waiting for it as long as
    /// another append holds it; a dead mount's hold goes with its lease).
    pub(crate) fn with_append_lock<T>(
        &self,
        ino: u64,
        append: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let serial = self.locks.generations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = APPEND_OWNER_BIT | serial;
        let byte = (APPEND_LOCK_BYTE, APPEND_LOCK_BYTE);
        while self
            .client
            .set_lock(ino, owner, LockKind::Write, byte, 0, LOCK_WAIT_ROUND_MS)
            .map_err(failed)?
            .is_some()
        {}
        let appended = append();
        let unlocked = self.retrying(|| self.client.set_lock(ino, owner, LockKind::Unlock, byte, 0, 0));
        if let Err(error) = &unlocked {
            tracing::error!(ino, %error, "could not give back an append lock; other appenders wait for this mount's lease");
        }
        let value = appended?;
        unlocked.map_err(failed)?;
        Ok(value)
    }

    /// A descriptor of `ino` was closed by `owner` (FLUSH), or an flock owner's file was
    /// released: drops its locks everywhere, if it ever took one here.
    pub(crate) fn locks_released(&self, ino: u64, owner: u64) -> Result<(), Errno> {
        if !self.locks.forget_owner(ino, owner) {
            return Ok(());
        }
        self.retrying(|| self.client.release_locks(ino, owner)).map_err(failed)
    }
}

impl LockState {
    /// Records that `owner` locks on `ino`; returns the owner's current generation.
    fn note_owner(&self, ino: u64, owner: u64) -> u64 {
        let next = || self.generations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.owners.lock().entry((ino, owner)).or_insert_with(next)
    }

    fn generation(&self, ino: u64, owner: u64) -> Option<u64> {
        self.owners.lock().get(&(ino, owner)).copied()
    }

    /// Forgets `owner` on `ino`; true if it had locked there.
    fn forget_owner(&self, ino: u64, owner: u64) -> bool {
        self.owners.lock().remove(&(ino, owner)).is_some()
    }

    fn start_waiting(&self, waiters_max: usize) -> Result<Waiting<'_>, Errno> {
        use std::sync::atomic::Ordering;
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= waiters_max {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(waiters_max, "too many blocking lock waits in this mount; answering ENOLCK");
            return Err(Errno::ENOLCK);
        }
        Ok(Waiting(&self.waiting))
    }
}

/// One waiting thread, counted while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_bad_types_are_refused() {
        for typ in [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK] {
            assert_eq!(typ_of(kind_of(typ).unwrap()), typ);
        }
        assert_eq!(kind_of(77).unwrap_err(), Errno::EINVAL);
    }

    #[test]
    fn a_closed_owner_is_forgotten_and_waiters_are_bounded() {
        let state = LockState::default();
        let first_sighting = state.note_owner(1, 9);
        assert_eq!(state.note_owner(1, 9), first_sighting, "same while it keeps locking");
        assert!(state.forget_owner(1, 9));
        assert!(!state.forget_owner(1, 9), "forgotten once");
        assert_eq!(state.generation(1, 9), None);
        assert_ne!(state.note_owner(1, 9), first_sighting, "a new sighting after a close");
        let first = state.start_waiting(1).expect("one waiter fits");
        assert_eq!(state.start_waiting(1).err(), Some(Errno::ENOLCK));
        drop(first);
        assert!(state.start_waiting(1).is_ok());
    }
}
