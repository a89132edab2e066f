//! Inode tokens (GPFS §2's inode and directory tokens, as read leases): which client
//! session may cache an inode's attributes (`Attr(id)`) and a directory's names and search
//! permission (`Names(dir)`). [`InodeTable`] is pure bookkeeping; [`InodeTokens`] adds the
//! revocation queues each session polls (`InodeTokenWait`) and the bounded wait of a change
//! for its revocations to be answered.
//!
//! Tokens are only ever shared: the metadata service itself is the only writer. After a
//! change is durable and before it is acknowledged, every session holding a token the
//! change touched (the namespace records them, `flotilla_namespace::recording`) is sent a
//! revocation, and the change waits — up to `token_wait_ms_max` — for each to be given
//! back. A holder that does not answer in time loses the token anyway: its client trusts
//! its cache only while its polls are fresh (`attr_lease_ms`, below the wait), so a stopped
//! or cut-off holder stops answering from its cache before the change is acknowledged.
//!
//! A grant is registered before the answer it covers is read from the namespace (the
//! service reads again after registering), so a change committed after the read revokes
//! it. Each grant carries a sequence number; a revocation names the newest grant of the
//! token it knew of, and a release drops a token only if no newer grant replaced it.
//!
//! **A failover** (issue 33; [`InodeTokens::begin_term`]): tokens are not reclaimed but
//! outlived. A new leader (or a restarted service) starts with no token and acknowledges no
//! change until `token_wait_ms_max` after its term began ([`acknowledge_from`]). A client of
//! an earlier leader trusts its cache until `p + attr_lease_ms` for the last poll it sent
//! at `p` that was answered; an earlier leader answers a poll only after a read barrier
//! confirmed it still led, i.e. before a quorum voted for the new term, so `p` is before
//! the new term began and `p + attr_lease_ms < begin + token_wait_ms_max`: every such cache
//! has gone stale before the first change of the new term is acknowledged. Its next poll
//! (to the new leader) is answered `lost` (the table knows none of its tokens), and the
//! client drops its cache. The cost is a pause of at most `token_wait_ms_max` (1 s) on the
//! first changes after an election, beside the election itself; a reclaim would not avoid
//! it (until every holder reclaimed, a change could not tell whose cache it spoils).

use crate::tokens::{wait_for_answer, PollSlot};
use flotilla_proto::{ErrorCode, InodeToken, InodeTokenKind, WireError, INODE_TOKENS_PER_REQUEST_MAX};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What one token covers.
pub type Key = (InodeTokenKind, u64);

/// Revocations queued per session at most; past it the session is told its tokens are lost.
const QUEUED_PER_SESSION_MAX: usize = 1 << 16;

/// The sessions holding one key, each with the sequence number of its newest grant.
///
/// Nearly every key has one holder (the client that made or listed the entry), and a client
/// that listed a directory of 10^6 entries holds 10^6 keys: that holder is kept inline, so a
/// grant allocates nothing and the table holds no heap block per key (an inner map per key
/// made every create's `malloc` slower as the table grew).
#[derive(Debug)]
enum Holders {
    One { session: u64, seq: u64 },
    Many(HashMap<u64, u64>),
}

impl Holders {
    fn get(&self, session: u64) -> Option<u64> {
        match self {
            Holders::One { session: held, seq } => (*held == session).then_some(*seq),
            Holders::Many(map) => map.get(&session).copied(),
        }
    }

    /// Records `session`'s grant `seq`; returns its previous grant, if any.
    fn insert(&mut self, session: u64, seq: u64) -> Option<u64> {
        match self {
            Holders::One { session: held, seq: old } if *held == session => Some(std::mem::replace(old, seq)),
            Holders::One { session: held, seq: old } => {
                let map = HashMap::from([(*held, *old), (session, seq)]);
                *self = Holders::Many(map);
                None
            }
            Holders::Many(map) => map.insert(session, seq),
        }
    }

    /// Drops `session`'s grant; returns whether the key has holders left.
    fn remove(&mut self, session: u64) -> bool {
        match self {
            Holders::One { session: held, .. } => *held != session,
            Holders::Many(map) => {
                map.remove(&session);
                !map.is_empty()
            }
        }
    }

    /// Drops the grants of sessions `gone` names; returns whether the key has holders left.
    fn retain(&mut self, gone: &impl Fn(u64) -> bool) -> bool {
        match self {
            Holders::One { session, .. } => !gone(*session),
            Holders::Many(map) => {
                map.retain(|session, _| !gone(*session));
                !map.is_empty()
            }
        }
    }

    fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        match self {
            Holders::One { session, seq } => f(*session, *seq),
            Holders::Many(map) => map.iter().for_each(|(session, seq)| f(*session, *seq)),
        }
    }
}

/// Every inode token of every session.
#[derive(Debug, Default)]
pub struct InodeTable {
    /// Per key, the sessions holding it and the sequence number of each one's newest grant.
    held: HashMap<Key, Holders>,
    per_session: HashMap<u64, usize>,
    count: usize,
    next_seq: u64,
}

/// Grant sequence numbers of term `t` start at `t << TERM_SEQ_SHIFT`, so a grant of a
/// later term (on any node) is newer than every grant of an earlier one, and a client's late
/// release of an earlier leader's grant never drops a grant of this term.
pub const TERM_SEQ_SHIFT: u32 = 40;

impl InodeTable {
    /// A new term: no token is held; grants go on with sequence numbers above every one an
    /// earlier term's leader gave.
    pub fn begin_term(&mut self, term: u64) {
        let floor = term.saturating_mul(1 << TERM_SEQ_SHIFT);
        *self = InodeTable { next_seq: self.next_seq.max(floor), ..InodeTable::default() };
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn holds_any(&self, session: u64) -> bool {
        self.per_session.get(&session).is_some_and(|count| *count > 0)
    }

    /// Grants `session` every key in `keys` (one new sequence number for all), or nothing
    /// when that would pass `per_session_max` or `total_max`.
    pub fn grant(
        &mut self,
        session: u64,
        keys: &[Key],
        (per_session_max, total_max): (usize, usize),
    ) -> Option<Vec<InodeToken>> {
        let new =
            keys.iter().filter(|key| self.held.get(*key).is_none_or(|h| h.get(session).is_none())).count();
        let mine = self.per_session.get(&session).copied().unwrap_or(0);
        if mine + new > per_session_max || self.count + new > total_max {
            return None;
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        for key in keys {
            let previous = match self.held.entry(*key) {
                Entry::Occupied(mut holders) => holders.get_mut().insert(session, seq),
                Entry::Vacant(vacant) => {
                    vacant.insert(Holders::One { session, seq });
                    None
                }
            };
            if previous.is_none() {
                self.count += 1;
                *self.per_session.entry(session).or_insert(0) += 1;
            }
        }
        Some(keys.iter().map(|&(kind, id)| InodeToken { kind, id, seq }).collect())
    }

    /// Drops `session`'s token `token` names unless a newer grant replaced it.
    pub fn release(&mut self, session: u64, token: &InodeToken) -> bool {
        let key = (token.kind, token.id);
        let Some(holders) = self.held.get_mut(&key) else { return false };
        if holders.get(session).is_none_or(|seq| seq > token.seq) {
            return false;
        }
        if !holders.remove(session) {
            self.held.remove(&key);
        }
        self.count -= 1;
        if let Some(count) = self.per_session.get_mut(&session) {
            *count -= 1;
            if *count == 0 {
                self.per_session.remove(&session);
            }
        }
        true
    }

    /// Whether `session` still holds the grant `token` names (or an older one of it).
    pub fn still_held(&self, session: u64, token: &InodeToken) -> bool {
        self.held
            .get(&(token.kind, token.id))
            .and_then(|holders| holders.get(session))
            .is_some_and(|seq| seq <= token.seq)
    }

    /// Every holder of the keys, with the token to revoke.
    pub fn holders(&self, keys: &[Key]) -> Vec<(u64, InodeToken)> {
        let mut found = Vec::new();
        for &(kind, id) in keys {
            if let Some(holders) = self.held.get(&(kind, id)) {
                holders.for_each(|session, seq| found.push((session, InodeToken { kind, id, seq })));
            }
        }
        found
    }

    /// Drops every token of the sessions `alive` says are gone. The periodic sweep calls this
    /// with every session alive nearly always, so that case costs a look at each session
    /// holding tokens, not at each token (a client that listed a directory of 10^6 entries
    /// holds 10^6 of them, and scanning them every sweep made creates slower as the
    /// namespace grew).
    pub fn retain_sessions(&mut self, alive: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self.per_session.keys().copied().filter(|session| !alive(*session)).collect();
        if gone.is_empty() {
            return;
        }
        self.drop_where(|session| gone.contains(&session));
    }

    fn drop_where(&mut self, gone: impl Fn(u64) -> bool) {
        self.held.retain(|_, holders| holders.retain(&gone));
        self.per_session.clear();
        self.count = 0;
        for holders in self.held.values() {
            holders.for_each(|session, _| {
                *self.per_session.entry(session).or_insert(0) += 1;
                self.count += 1;
            });
        }
    }
}

/// Bounds of the inode token service.
#[derive(Clone, Copy, Debug)]
pub struct InodeBounds {
    pub per_session_max: usize,
    pub total_max: usize,
    /// Longest a change waits for its revocations, and a poll for events.
    pub wait_ms_max: u64,
    /// Polls held at once.
    pub pollers_max: usize,
}

#[derive(Default)]
struct Shared {
    table: InodeTable,
    events: HashMap<u64, Vec<InodeToken>>,
    /// Sessions whose queue overflowed: their next poll is told everything is lost.
    overflowed: std::collections::HashSet<u64>,
    /// Until then (a restart or a new term: clients may still trust caches of the previous
    /// run until their polls go stale), a change is not acknowledged.
    changes_from: Option<Instant>,
}

/// When a change may be acknowledged at the earliest after a term (or a run) began at
/// `began`, given that a holder trusts its cache for `attr_lease_ms` after a poll it sent
/// and that `token_wait_ms_max` is above it: `began + token_wait_ms_max`.
pub fn acknowledge_from(began: Instant, wait_ms_max: u64) -> Instant {
    began + Duration::from_millis(wait_ms_max)
}

/// What the metrics endpoint shows of inode tokens (issue 34: the mechanism, counted).
#[derive(Debug, Default)]
pub struct InodeTokenCounts {
    /// Revocations queued to holders.
    pub revoked: AtomicU64,
    /// Of them, tokens not given back within `token_wait_ms_max` (dropped anyway).
    pub unanswered: AtomicU64,
}

/// The inode token table shared by request handlers, with revocation queues.
pub struct InodeTokens {
    shared: parking_lot::Mutex<Shared>,
    changed: parking_lot::Condvar,
    pollers: AtomicUsize,
    bounds: InodeBounds,
    pub counts: std::sync::Arc<InodeTokenCounts>,
}

impl InodeTokens {
    pub fn new(bounds: InodeBounds, restarted: bool) -> InodeTokens {
        let shared = Shared {
            changes_from: restarted.then(|| acknowledge_from(Instant::now(), bounds.wait_ms_max)),
            ..Shared::default()
        };
        InodeTokens {
            shared: parking_lot::Mutex::new(shared),
            changed: parking_lot::Condvar::new(),
            pollers: AtomicUsize::new(0),
            bounds,
            counts: std::sync::Arc::default(),
        }
    }

    /// A new term `term` this node leads (at `began`): every token and queued revocation of
    /// an earlier term is dropped (holders polling are told their tokens are lost), and no
    /// change is acknowledged before [`acknowledge_from`].
    pub fn begin_term(&self, began: Instant, term: u64) {
        let mut shared = self.shared.lock();
        shared.table.begin_term(term);
        shared.events.clear();
        shared.overflowed.clear();
        let from = acknowledge_from(began, self.bounds.wait_ms_max);
        shared.changes_from = Some(shared.changes_from.map_or(from, |at| at.max(from)));
        drop(shared);
        self.changed.notify_all();
    }

    /// Registers grants of `keys` to `session` (before the answer is read); `None` past
    /// the bounds.
    pub fn grant(&self, session: u64, keys: &[Key]) -> Option<Vec<InodeToken>> {
        let mut shared = self.shared.lock();
        if shared.overflowed.contains(&session) {
            return None;
        }
        shared.table.grant(session, keys, (self.bounds.per_session_max, self.bounds.total_max))
    }

    /// `InodeTokenRelease`.
    pub fn release(&self, session: u64, tokens: &[InodeToken]) -> Result<(), WireError> {
        if tokens.len() > INODE_TOKENS_PER_REQUEST_MAX {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} inode tokens in one release, at most {INODE_TOKENS_PER_REQUEST_MAX}",
                    tokens.len()
                ),
            ));
        }
        let mut shared = self.shared.lock();
        for token in tokens {
            shared.table.release(session, token);
        }
        if let Some(queue) = shared.events.get_mut(&session) {
            queue.retain(|queued| {
                !tokens.iter().any(|t| t.kind == queued.kind && t.id == queued.id && t.seq >= queued.seq)
            });
        }
        drop(shared);
        self.changed.notify_all();
        Ok(())
    }

    /// After a change that touched `keys` is durable: revokes them from every holder and
    /// waits (bounded) until each gave its token back; holders still silent at the deadline
    /// lose the token (their caches go stale on their own). The tokens of session `except`
    /// (the changer's, issue 34) are neither revoked nor waited for.
    pub fn revoke(&self, keys: &[Key], except: Option<u64>) {
        let now = Instant::now();
        let changes_from = self.shared.lock().changes_from;
        if let Some(from) = changes_from.filter(|from| now < *from) {
            std::thread::sleep(from - now);
        }
        if keys.is_empty() {
            return;
        }
        let deadline = Instant::now() + Duration::from_millis(self.bounds.wait_ms_max);
        let mut shared = self.shared.lock();
        let mut revoked = shared.table.holders(keys);
        revoked.retain(|(session, _)| Some(*session) != except);
        if revoked.is_empty() {
            return;
        }
        self.counts.revoked.fetch_add(revoked.len() as u64, Ordering::Relaxed);
        for (session, token) in &revoked {
            let Shared { events, overflowed, table, .. } = &mut *shared;
            let queue = events.entry(*session).or_default();
            if queue.len() >= QUEUED_PER_SESSION_MAX {
                // The session is not answering: all of its tokens go, and it is told so.
                overflowed.insert(*session);
                queue.clear();
                let lost = *session;
                table.drop_where(|s| s == lost);
                continue;
            }
            if !queue.contains(token) {
                queue.push(*token);
            }
        }
        self.changed.notify_all();
        loop {
            let pending = revoked.iter().any(|(session, token)| shared.table.still_held(*session, token));
            if !pending {
                return;
            }
            if Instant::now() >= deadline {
                for (session, token) in &revoked {
                    if shared.table.release(*session, token) {
                        self.counts.unanswered.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(session, id = token.id, kind = ?token.kind, "an inode token was not given back in time; dropped");
                    }
                }
                return;
            }
            self.changed.wait_until(&mut shared, deadline);
        }
    }

    /// `InodeTokenWait`.
    pub fn wait(
        &self,
        session: u64,
        holding: bool,
        wait_ms: u64,
    ) -> Result<(Vec<InodeToken>, bool), WireError> {
        let _slot = PollSlot::take(&self.pollers, self.bounds.pollers_max, "inode token")?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms.min(self.bounds.wait_ms_max));
        let answer = wait_for_answer(&self.shared, &self.changed, deadline, |shared| {
            if shared.overflowed.remove(&session) {
                shared.events.remove(&session);
                return Some((Vec::new(), true));
            }
            if let Some(queue) = shared.events.get_mut(&session).filter(|q| !q.is_empty()) {
                let taken = queue.len().min(INODE_TOKENS_PER_REQUEST_MAX);
                return Some((queue.drain(..taken).collect(), false));
            }
            (holding && !shared.table.holds_any(session)).then(|| (Vec::new(), true))
        });
        Ok(answer.unwrap_or((Vec::new(), false)))
    }

    pub fn holds_any(&self, session: u64) -> bool {
        self.shared.lock().table.holds_any(session)
    }

    /// Drops the tokens and queues of sessions that ended.
    pub fn retain_sessions(&self, alive: impl Fn(u64) -> bool) {
        let mut shared = self.shared.lock();
        let before = shared.table.len();
        shared.table.retain_sessions(&alive);
        shared.events.retain(|session, _| alive(*session));
        if shared.table.len() != before {
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use InodeTokenKind::{Attr, Names};

    fn bounds() -> InodeBounds {
        InodeBounds { per_session_max: 4, total_max: 6, wait_ms_max: 5000, pollers_max: 8 }
    }

    #[test]
    fn grants_are_bounded_and_a_release_spares_a_newer_grant() {
        let mut table = InodeTable::default();
        let first = table.grant(10, &[(Names, 1), (Attr, 2)], (4, 6)).unwrap();
        assert_eq!(table.len(), 2);
        let again = table.grant(10, &[(Names, 1), (Attr, 3)], (4, 6)).unwrap();
        assert_eq!(table.len(), 3);
        // A release of the first grant of Names(1) does not drop the newer one.
        assert!(!table.release(10, &first[0]));
        assert!(table.release(10, &again[0]));
        assert!(table.grant(10, &[(Attr, 4), (Attr, 5), (Attr, 6)], (4, 6)).is_none());
        assert!(table.grant(20, &[(Attr, 4), (Attr, 5), (Attr, 6), (Attr, 7), (Attr, 8)], (4, 6)).is_none());
        assert!(table.grant(20, &[(Attr, 4), (Attr, 5), (Attr, 6), (Attr, 7)], (4, 6)).is_some());
        assert!(table.grant(30, &[(Attr, 4)], (4, 6)).is_none(), "six tokens in all");
        table.retain_sessions(|s| s != 10);
        assert!(!table.holds_any(10) && table.holds_any(20));
        assert_eq!(table.len(), 4);
    }

    #[test]
    fn a_sweep_with_every_session_alive_asks_once_per_session_not_per_token() {
        let mut table = InodeTable::default();
        let keys: Vec<Key> = (0..1000).map(|id| (Attr, id)).collect();
        for session in [10, 20] {
            table.grant(session, &keys, (1000, 4000)).unwrap();
        }
        let asked = std::cell::Cell::new(0);
        table.retain_sessions(|_| {
            asked.set(asked.get() + 1);
            true
        });
        assert_eq!((asked.get(), table.len()), (2, 2000));
        table.retain_sessions(|session| session == 20);
        assert_eq!(table.len(), 1000);
        assert!(!table.holds_any(10) && table.holds_any(20));
        assert_eq!(table.holders(&[(Attr, 5)]).len(), 1);
    }

    #[test]
    fn a_change_waits_for_the_holder_and_no_longer_than_the_bound() {
        let tokens = Arc::new(InodeTokens::new(bounds(), false));
        let granted = tokens.grant(10, &[(Attr, 7)]).unwrap();
        let change = {
            let tokens = tokens.clone();
            std::thread::spawn(move || tokens.revoke(&[(Attr, 7), (Names, 8)], None))
        };
        let (revokes, lost) = tokens.wait(10, true, 5000).unwrap();
        assert_eq!((revokes, lost), (granted.clone(), false));
        assert!(!change.is_finished());
        tokens.release(10, &revokes_of(&granted)).unwrap();
        change.join().unwrap();
        assert!(!tokens.holds_any(10));
        assert_eq!(tokens.wait(10, true, 0).unwrap(), (Vec::new(), true));
        // A holder that never answers holds a change up for the bound only.
        let quick = InodeTokens::new(InodeBounds { wait_ms_max: 50, ..bounds() }, false);
        quick.grant(20, &[(Names, 1)]).unwrap();
        let started = Instant::now();
        quick.revoke(&[(Names, 1)], None);
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(!quick.holds_any(20));
        assert_eq!(quick.wait(20, false, 0).unwrap().0.len(), 1, "the revocation stays queued");
    }

    #[test]
    fn a_key_held_by_one_session_then_by_several_then_by_none() {
        let mut table = InodeTable::default();
        let first = table.grant(10, &[(Attr, 1)], (8, 8)).unwrap();
        let again = table.grant(10, &[(Attr, 1)], (8, 8)).unwrap();
        assert_eq!(table.len(), 1, "a second grant to the same session replaces the first");
        assert!(!table.release(10, &first[0]), "the newer grant stays");
        let other = table.grant(20, &[(Attr, 1)], (8, 8)).unwrap();
        let mut holders = table.holders(&[(Attr, 1)]);
        holders.sort_by_key(|(session, _)| *session);
        assert_eq!(holders, vec![(10, again[0]), (20, other[0])]);
        assert!(table.release(10, &again[0]));
        assert_eq!(table.holders(&[(Attr, 1)]), vec![(20, other[0])]);
        assert!(table.still_held(20, &other[0]) && !table.still_held(10, &again[0]));
        assert!(table.release(20, &other[0]));
        assert!(table.holders(&[(Attr, 1)]).is_empty() && table.held.is_empty());
        assert_eq!(table.len(), 0);
    }

    proptest::proptest! {
        /// The table against a plain model (per key, a map of session to newest grant).
        #[test]
        fn the_table_matches_a_map_of_maps(
            ops in proptest::collection::vec((0u8..3, 0u64..4, 0u64..3, 0u64..4), 1..80),
        ) {
            let mut table = InodeTable::default();
            let mut model: HashMap<u64, HashMap<u64, u64>> = HashMap::new();
            let mut granted: Vec<(u64, InodeToken)> = Vec::new();
            for (op, session, id, pick) in ops {
                match op {
                    0 => {
                        let tokens = table.grant(session, &[(Attr, id)], (100, 100)).unwrap();
                        model.entry(id).or_default().insert(session, tokens[0].seq);
                        granted.push((session, tokens[0]));
                    }
                    1 if !granted.is_empty() => {
                        let (session, token) = granted[pick as usize % granted.len()];
                        let newest = model.get(&token.id).and_then(|h| h.get(&session)).copied();
                        let expect = newest.is_some_and(|seq| seq <= token.seq);
                        proptest::prop_assert_eq!(table.release(session, &token), expect);
                        if expect {
                            let holders = model.get_mut(&token.id).unwrap();
                            holders.remove(&session);
                            if holders.is_empty() {
                                model.remove(&token.id);
                            }
                        }
                    }
                    _ => {
                        table.retain_sessions(|s| s != session);
                        model.retain(|_, holders| {
                            holders.remove(&session);
                            !holders.is_empty()
                        });
                    }
                }
                let count: usize = model.values().map(HashMap::len).sum();
                proptest::prop_assert_eq!(table.len(), count);
                for id in 0..3 {
                    let mut holders: Vec<(u64, u64)> =
                        table.holders(&[(Attr, id)]).into_iter().map(|(s, t)| (s, t.seq)).collect();
                    holders.sort_unstable();
                    let mut expected: Vec<(u64, u64)> =
                        model.get(&id).map(|h| h.iter().map(|(s, q)| (*s, *q)).collect()).unwrap_or_default();
                    expected.sort_unstable();
                    proptest::prop_assert_eq!(holders, expected);
                }
                for session in 0..4 {
                    let holds = model.values().any(|h| h.contains_key(&session));
                    proptest::prop_assert_eq!(table.holds_any(session), holds);
                }
            }
        }
    }

    proptest::proptest! {
        /// Across terms (leaders, on any node): after a term begins no session holds a token
        /// (each holder's next poll is told its tokens are lost), every grant of a later term
        /// is numbered above every grant of an earlier one, and a late release of an earlier
        /// term's grant never drops a grant of the current term (whose holder would then
        /// trust a cache no change revokes).
        #[test]
        fn a_new_term_forgets_every_token_and_outnumbers_the_old_grants(
            terms in proptest::collection::vec(
                proptest::collection::vec((0u8..2, 0u64..3, 0u64..3), 0..30), 1..5),
            nodes in proptest::collection::vec(0usize..3, 1..5),
        ) {
            // One table per node; each term is led by one of them.
            let mut tables: Vec<InodeTable> = (0..3).map(|_| InodeTable::default()).collect();
            let mut earlier: Vec<(u64, InodeToken)> = Vec::new();
            for (term, ops) in terms.iter().enumerate() {
                let term = term as u64 + 1;
                let node = nodes[term as usize % nodes.len()];
                let table = &mut tables[node];
                table.begin_term(term);
                for session in 0..3 {
                    proptest::prop_assert!(!table.holds_any(session), "a token outlived its term");
                }
                let oldest_here = earlier.iter().map(|(_, t)| t.seq).max().unwrap_or(0);
                let mut granted: Vec<(u64, InodeToken)> = Vec::new();
                for (op, session, id) in ops {
                    if *op == 0 {
                        let token = table.grant(*session, &[(Attr, *id)], (100, 100)).unwrap()[0];
                        proptest::prop_assert!(token.seq > oldest_here, "a grant numbered below an earlier term's");
                        granted.push((*session, token));
                    } else if let Some((old_session, old)) = earlier.get(*id as usize) {
                        let before = table.holders(&[(old.kind, old.id)]);
                        proptest::prop_assert!(!table.release(*old_session, old), "an earlier term's release dropped a grant");
                        proptest::prop_assert_eq!(table.holders(&[(old.kind, old.id)]), before);
                    }
                }
                earlier.extend(granted);
            }
        }

        /// The timing rule: a holder of an earlier term trusts its cache until `p + lease`
        /// for a poll sent at `p` no later than the new term began; the first change of the
        /// new term is acknowledged after every such cache went stale whenever the lease is
        /// below the wait (as `attr_lease_ms` < `token_wait_ms_max` is required).
        #[test]
        fn no_change_is_acknowledged_while_an_old_cache_is_trusted(
            before_ms in 0u64..10_000,
            lease_ms in 1u64..1000,
            extra_ms in 1u64..1000,
            change_ms in 0u64..5000,
        ) {
            let began = Instant::now() + Duration::from_secs(20);
            let wait_ms = lease_ms + extra_ms;
            let polled = began - Duration::from_millis(before_ms);
            let trusted_until = polled + Duration::from_millis(lease_ms);
            let acknowledged = acknowledge_from(began, wait_ms).max(began + Duration::from_millis(change_ms));
            proptest::prop_assert!(trusted_until < acknowledged);
        }
    }

    #[test]
    fn a_new_term_holds_changes_and_tells_pollers_their_tokens_are_lost() {
        let tokens = InodeTokens::new(InodeBounds { wait_ms_max: 80, ..bounds() }, false);
        tokens.grant(10, &[(Attr, 1)]).unwrap();
        tokens.begin_term(Instant::now(), 7);
        assert_eq!(tokens.wait(10, true, 0).unwrap(), (Vec::new(), true));
        let started = Instant::now();
        tokens.revoke(&[(Attr, 1)], None);
        assert!(started.elapsed() >= Duration::from_millis(80), "a change acknowledged within the hold");
        let granted = tokens.grant(10, &[(Attr, 1)]).unwrap();
        assert!(granted[0].seq > 7 << TERM_SEQ_SHIFT);
    }

    #[test]
    fn a_change_spares_the_changers_own_tokens() {
        let tokens = InodeTokens::new(InodeBounds { wait_ms_max: 5000, ..bounds() }, false);
        let mine = tokens.grant(10, &[(Names, 1)]).unwrap();
        tokens.grant(20, &[(Names, 1)]).unwrap();
        let started = Instant::now();
        let change = std::thread::scope(|scope| {
            let change = scope.spawn(|| tokens.revoke(&[(Names, 1)], Some(10)));
            let (revokes, _) = tokens.wait(20, true, 5000).unwrap();
            tokens.release(20, &revokes).unwrap();
            change.join()
        });
        change.unwrap();
        assert!(started.elapsed() < Duration::from_millis(5000), "the change waited for its own changer");
        assert!(tokens.holds_any(10) && !tokens.holds_any(20));
        assert_eq!(tokens.wait(10, true, 0).unwrap(), (Vec::new(), false), "nothing queued for the changer");
        assert!(tokens.shared.lock().table.still_held(10, &mine[0]));
    }

    fn revokes_of(tokens: &[InodeToken]) -> Vec<InodeToken> {
        tokens.to_vec()
    }
}
