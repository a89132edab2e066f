//! Which clients have which files open, and which files are orphans (their last name went
//! away while they were open). Pure bookkeeping, no I/O: the handlers consult it inside the
//! namespace's transactions and the sweeper asks it which orphans may be released.
//!
//! Clients hold their opens under a *lease*: a session that is not renewed within
//! `lease` expires with all its opens (a crashed client or mount). The table lives in memory
//! only; after a restart of the metadata service clients re-announce their open files with
//! their next renewal, and no orphan is released before one lease has passed since start.
//!
//! Invariants: `open_counts[file]` is the number of sessions holding `file`; every session
//! holds at most `files_per_session_max` files; at most `sessions_max` sessions exist.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A limit of the open table was reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("client session has {open} files open, the limit open_files_per_session_max = {max}")]
    TooManyFiles { open: usize, max: usize },
    #[error("{sessions} client sessions hold open files, the limit open_sessions_max = {max}")]
    TooManySessions { sessions: usize, max: usize },
}

#[derive(Debug)]
struct Session {
    expires: Instant,
    /// File id → handles this session has open on it.
    files: HashMap<u64, u32>,
}

/// The open files of every client session, and the orphans.
#[derive(Debug)]
pub(crate) struct OpenTable {
    sessions: HashMap<u64, Session>,
    open_counts: HashMap<u64, u32>,
    orphans: HashSet<u64>,
    lease: Duration,
    /// Orphans are not released before this instant (one lease after start).
    release_after: Instant,
    files_per_session_max: usize,
    sessions_max: usize,
}

impl OpenTable {
    pub fn new(
        lease: Duration,
        now: Instant,
        files_per_session_max: usize,
        sessions_max: usize,
    ) -> OpenTable {
        OpenTable {
            sessions: HashMap::new(),
            open_counts: HashMap::new(),
            orphans: HashSet::new(),
            lease,
            release_after: now + lease,
            files_per_session_max: files_per_session_max.max(1),
            sessions_max: sessions_max.max(1),
        }
    }

    /// Whether any live session has `file` open.
    pub fn is_open(&self, file: u64) -> bool {
        self.open_counts.contains_key(&file)
    }

    /// Sets the end of the start-up grace period, in which any file may be open (clients
    /// re-announce their opens) and no orphan is released.
    pub fn set_reclaim_until(&mut self, until: Instant) {
        self.release_after = until;
    }

    /// A new term of the metadata group's leader: forgets every session (clients re-announce
    /// their opens with their next renewal, as after a restart) and releases no orphan
    /// before `until`.
    pub fn begin_grace(&mut self, until: Instant) {
        self.sessions.clear();
        self.open_counts.clear();
        self.release_after = until;
    }

    /// The orphans are `orphans` (as the namespace keeps them, read by a new leader).
    pub fn replace_orphans(&mut self, orphans: impl IntoIterator<Item = u64>) {
        self.orphans = orphans.into_iter().collect();
    }

    /// Whether `file` may be open: some live session holds it, or the service restarted less
    /// than a lease ago and clients may not have re-announced their opens yet.
    pub fn may_be_open(&self, file: u64, now: Instant) -> bool {
        now < self.release_after || self.is_open(file)
    }

    /// Records one more handle of `session` on `file`, and renews the session.
    pub fn open(&mut self, session: u64, file: u64, now: Instant) -> Result<(), OpenError> {
        let max = self.files_per_session_max;
        let session = self.session(session, now)?;
        if !session.files.contains_key(&file) && session.files.len() >= max {
            return Err(OpenError::TooManyFiles { open: session.files.len(), max });
        }
        let handles = session.files.entry(file).or_insert(0);
        *handles = handles.saturating_add(1);
        if *handles == 1 {
            *self.open_counts.entry(file).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Drops one handle of `session` on `file`; true if no session has `file` open now. A
    /// session left with no open files ends, unless `keep_session` (it holds byte-range
    /// tokens, which live as long as its lease: `renew_idle`).
    pub fn close(&mut self, session: u64, file: u64, keep_session: bool) -> bool {
        let Some(state) = self.sessions.get_mut(&session) else { return !self.is_open(file) };
        let Some(handles) = state.files.get_mut(&file) else { return !self.is_open(file) };
        *handles -= 1;
        let last_handle = *handles == 0;
        if last_handle {
            state.files.remove(&file);
        }
        if state.files.is_empty() && !keep_session {
            self.sessions.remove(&session);
        }
        if last_handle {
            self.forget_session_file(file);
        }
        !self.is_open(file)
    }

    /// Renews `session`'s lease; files it names that it does not hold yet (after a restart
    /// of the service) are added with one handle each, as far as the limit allows.
    pub fn renew(&mut self, session: u64, files: &[u64], now: Instant) -> Result<(), OpenError> {
        for file in files {
            let known = self.sessions.get(&session).is_some_and(|s| s.files.contains_key(file));
            if !known {
                self.open(session, *file, now)?;
            }
        }
        if let Some(state) = self.sessions.get_mut(&session) {
            state.expires = now + self.lease;
        }
        Ok(())
    }

    /// Renews the lease of `session` if it is live, open files or not (a client holding
    /// tokens after its last close renews with its token polls).
    pub fn renew_idle(&mut self, session: u64, now: Instant) {
        if let Some(state) = self.sessions.get_mut(&session) {
            state.expires = now + self.lease;
        }
    }

    /// Makes `session` live (or renews it) with no file open: a session granted inode
    /// tokens lives on, renewed by its polls, so that the sweeper keeps its tokens.
    pub fn touch(&mut self, session: u64, now: Instant) -> Result<(), OpenError> {
        self.session(session, now).map(|_| ())
    }

    /// Whether client `session` has `file` open.
    pub fn holds(&self, session: u64, file: u64) -> bool {
        self.sessions.get(&session).is_some_and(|s| s.files.contains_key(&file))
    }

    /// Whether client `session` holds open files or tokens (and so a live lease).
    pub fn has_session(&self, session: u64) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Ends every session whose lease ran out.
    pub fn expire(&mut self, now: Instant) {
        let expired: Vec<u64> =
            self.sessions.iter().filter(|(_, s)| s.expires <= now).map(|(id, _)| *id).collect();
        for id in expired {
            if let Some(session) = self.sessions.remove(&id) {
                for file in session.files.keys() {
                    self.forget_session_file(*file);
                }
            }
        }
    }

    /// Records that `file` became an orphan (it lost its last name while open).
    pub fn add_orphan(&mut self, file: u64) {
        self.orphans.insert(file);
    }

    /// Orphans nobody has open any more, once the start-up grace period is over.
    pub fn releasable(&self, now: Instant) -> Vec<u64> {
        if now < self.release_after {
            return Vec::new();
        }
        self.orphans.iter().copied().filter(|file| !self.is_open(*file)).collect()
    }

    /// Whether `file` may be released now (an orphan nobody has open, grace period over).
    pub fn is_releasable(&self, file: u64, now: Instant) -> bool {
        now >= self.release_after && self.orphans.contains(&file) && !self.is_open(file)
    }

    /// Forgets orphan `file` (it was released).
    pub fn released(&mut self, file: u64) {
        self.orphans.remove(&file);
    }

    fn session(&mut self, session: u64, now: Instant) -> Result<&mut Session, OpenError> {
        let count = self.sessions.len();
        if count >= self.sessions_max && !self.sessions.contains_key(&session) {
            return Err(OpenError::TooManySessions { sessions: count, max: self.sessions_max });
        }
        let lease = self.lease;
        let state = self
            .sessions
            .entry(session)
            .or_insert_with(|| Session { expires: now + lease, files: HashMap::new() });
        state.expires = now + lease;
        Ok(state)
    }

    fn forget_session_file(&mut self, file: u64) {
        if let Some(count) = self.open_counts.get_mut(&file) {
            *count -= 1;
            if *count == 0 {
                self.open_counts.remove(&file);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_secs(10);

    #[test]
    fn a_file_is_open_until_every_handle_of_every_session_closes() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.open(1, 7, start).unwrap();
        table.open(1, 7, start).unwrap();
        table.open(2, 7, start).unwrap();
        assert!(!table.close(1, 7, false), "session 1 has a second handle, session 2 one");
        assert!(!table.close(2, 7, false));
        assert!(table.close(1, 7, false), "last handle closed");
        assert!(!table.is_open(7));
    }

    #[test]
    fn orphans_are_released_only_after_the_grace_period_and_when_closed() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.open(1, 7, start).unwrap();
        table.add_orphan(7);
        table.add_orphan(8);
        assert!(table.releasable(start).is_empty(), "nothing released during the grace period");
        assert!(table.may_be_open(9, start), "during the grace period any file may be open");
        assert!(!table.may_be_open(9, start + LEASE));
        let later = start + LEASE;
        assert_eq!(table.releasable(later), vec![8], "7 is still open");
        assert!(table.is_releasable(8, later) && !table.is_releasable(7, later));
        table.close(1, 7, false);
        let mut both = table.releasable(later);
        both.sort();
        assert_eq!(both, vec![7, 8]);
        table.released(7);
        assert_eq!(table.releasable(later), vec![8]);
    }

    #[test]
    fn a_session_kept_at_its_last_close_lives_while_renewed_idle() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.open(1, 7, start).unwrap();
        table.open(2, 7, start).unwrap();
        assert!(!table.close(1, 7, true), "session 2 still has it open");
        assert!(table.close(2, 7, false));
        assert!(table.has_session(1), "kept: it holds tokens");
        assert!(!table.has_session(2), "ended at its last close");
        table.renew_idle(2, start + LEASE / 2);
        assert!(!table.has_session(2), "an ended session is not brought back by a poll");
        table.renew_idle(1, start + LEASE / 2);
        table.expire(start + LEASE);
        assert!(table.has_session(1), "renewed half a lease in");
        table.expire(start + LEASE + LEASE / 2);
        assert!(!table.has_session(1), "not renewed for a whole lease: ended");
    }

    #[test]
    fn a_session_not_renewed_expires_with_its_opens() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.open(1, 7, start).unwrap();
        table.open(2, 8, start).unwrap();
        table.renew(2, &[8], start + LEASE / 2).unwrap();
        table.expire(start + LEASE);
        assert!(!table.is_open(7), "session 1 expired");
        assert!(table.is_open(8), "session 2 renewed");
        table.expire(start + LEASE * 2);
        assert!(!table.is_open(8));
    }

    #[test]
    fn renewal_after_a_restart_reclaims_the_opens() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.renew(3, &[5, 6], start).unwrap();
        assert!(table.is_open(5) && table.is_open(6));
        table.renew(3, &[5, 6], start).unwrap();
        assert!(table.close(3, 5, false), "a renewal does not add handles it already holds");
    }

    #[test]
    fn a_new_term_forgets_the_sessions_and_releases_nothing_before_they_renew() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 10, 10);
        table.open(1, 7, start).unwrap();
        table.add_orphan(9);
        let elected = start + LEASE * 2;
        table.begin_grace(elected + LEASE);
        table.replace_orphans([7, 8]);
        assert!(!table.has_session(1) && !table.is_open(7), "sessions of another term are gone");
        assert!(table.may_be_open(7, elected) && table.releasable(elected).is_empty());
        table.renew(1, &[7], elected).unwrap();
        let after = elected + LEASE;
        assert_eq!(
            table.releasable(after),
            vec![8],
            "the re-announced orphan stays, 9 is the namespace's no more"
        );
        assert!(!table.may_be_open(8, after));
    }

    #[test]
    fn limits_are_enforced() {
        let start = Instant::now();
        let mut table = OpenTable::new(LEASE, start, 2, 1);
        table.open(1, 1, start).unwrap();
        table.open(1, 2, start).unwrap();
        assert!(matches!(table.open(1, 3, start), Err(OpenError::TooManyFiles { .. })));
        table.open(1, 2, start).unwrap();
        assert!(matches!(table.open(2, 1, start), Err(OpenError::TooManySessions { .. })));
    }

    proptest! {
        /// Whatever the order of opens and closes, a file is open exactly when some session
        /// holds more handles on it than it closed.
        #[test]
        fn open_matches_a_reference_count(ops in proptest::collection::vec((0u64..3, 0u64..4, any::<bool>()), 0..200)) {
            let start = Instant::now();
            let mut table = OpenTable::new(LEASE, start, 100, 100);
            let mut model: HashMap<(u64, u64), u32> = HashMap::new();
            for (session, file, open) in ops {
                let held = model.entry((session, file)).or_insert(0);
                if open {
                    table.open(session, file, start).unwrap();
                    *held += 1;
                } else if *held > 0 {
                    table.close(session, file, false);
                    *held -= 1;
                }
                for f in 0..4 {
                    let expected = model.iter().any(|((_, mf), n)| *mf == f && *n > 0);
                    prop_assert_eq!(table.is_open(f), expected);
                }
            }
        }
    }
}
