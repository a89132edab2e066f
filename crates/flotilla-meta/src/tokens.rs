//! Byte-range tokens (GPFS §2): which client session may cache, and which may change, which
//! bytes of which file. [`TokenTable`] is pure bookkeeping (no I/O, no time); [`Tokens`]
//! adds waiting for conflicting holders, the queues of revocations each session polls
//! (`TokenWait`) and the no-overlap hints. (Token traffic is counted by the service's
//! per-request metrics.)
//!
//! A token is (session, mode, bytes `start..=end`) on one file. Invariants: one session's
//! tokens on a file never overlap one another; two sessions' tokens on a file overlap only
//! if both are read tokens; at most `tokens_max` tokens exist in all.
//!
//! Granting (GPFS's optimistic ranges): a request names the bytes it needs (`required`) and
//! the bytes it would like (`desired`, usually the whole file). With no conflict on
//! `required` it gets the largest range inside `desired` that conflicts with no other
//! session's token — the first writer of a file gets the whole file and never asks again.
//! With a conflict each holder in the way is asked to give back its bytes from the start of
//! `required` to the end of `desired` (a reader asks writers only to downgrade to read), so
//! writers of consecutive segments of one file split it once and keep their parts.
//!
//! Revocations carry the sequence number of the holder's last grant on the file: a client
//! applies a revocation only after every grant up to it (the grant's reply and the
//! revocation travel on different requests and may arrive in either order).

use flotilla_proto::{ErrorCode, TokenGrant, TokenMode, TokenRevoke, WireError, TOKEN_EVENTS_MAX};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// An inclusive byte range.
pub type Range = (u64, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub session: u64,
    pub mode: TokenMode,
    pub start: u64,
    pub end: u64,
}

impl Held {
    fn overlaps(&self, (start, end): Range) -> bool {
        self.start <= end && start <= self.end
    }

    /// Whether this token stands in the way of `session` wanting `mode`.
    fn conflicts(&self, session: u64, mode: TokenMode, range: Range) -> bool {
        self.session != session
            && self.overlaps(range)
            && (mode == TokenMode::Write || self.mode == TokenMode::Write)
    }
}

/// Every token on every file.
#[derive(Debug, Default)]
pub struct TokenTable {
    files: HashMap<u64, Vec<Held>>,
    count: usize,
    /// Tokens per session (a session holding none was told nothing is lost).
    per_session: HashMap<u64, usize>,
    /// Per session, the sequence number of each file's last grant (by session first, so
    /// that a sweep drops a gone session's entries without looking at everyone's).
    seqs: HashMap<u64, HashMap<u64, u64>>,
    next_seq: u64,
}

impl TokenTable {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn holds_any(&self, session: u64) -> bool {
        self.per_session.get(&session).is_some_and(|count| *count > 0)
    }

    /// Forgets every token (a new term of a metadata group's leader); grant sequence
    /// numbers go on from where they were.
    pub fn clear(&mut self) {
        *self = TokenTable { next_seq: self.next_seq, ..TokenTable::default() };
    }

    /// The tokens of other sessions on `file` that `session` wanting `mode` on `range`
    /// conflicts with.
    pub fn conflicts(&self, file: u64, session: u64, mode: TokenMode, range: Range) -> Vec<Held> {
        self.files
            .get(&file)
            .map(|held| held.iter().filter(|h| h.conflicts(session, mode, range)).copied().collect())
            .unwrap_or_default()
    }

    /// Grants `mode` on `required` and as much of `desired` around it as conflicts with no
    /// other session, or names the tokens in the way.
    pub fn grant(
        &mut self,
        file: u64,
        session: u64,
        mode: TokenMode,
        (required, desired): (Range, Range),
    ) -> Result<TokenGrant, Vec<Held>> {
        let in_the_way = self.conflicts(file, session, mode, required);
        if !in_the_way.is_empty() {
            return Err(in_the_way);
        }
        let (start, end) = self.widest(file, session, mode, required, desired);
        self.set(file, session, mode, (start, end));
        self.next_seq += 1;
        self.seqs.entry(session).or_default().insert(file, self.next_seq);
        Ok(TokenGrant { mode, start, end, seq: self.next_seq })
    }

    /// The largest range inside `desired` containing `required` that conflicts with no
    /// other session's token.
    fn widest(&self, file: u64, session: u64, mode: TokenMode, required: Range, desired: Range) -> Range {
        let (mut start, mut end) = desired;
        for held in self.conflicts(file, session, mode, desired) {
            if held.end < required.0 {
                start = start.max(held.end + 1);
            } else if held.start > required.1 {
                end = end.min(held.start - 1);
            }
        }
        (start, end)
    }

    /// `session` holds `mode` on `range` of `file`: a write token replaces the session's own
    /// tokens there; a read token keeps the session's write tokens and fills the rest.
    fn set(&mut self, file: u64, session: u64, mode: TokenMode, range: Range) {
        let (before, kept, mut own, inside) = self.cut(file, session, range);
        if mode == TokenMode::Read {
            own.extend(inside.into_iter().filter(|token| token.mode == TokenMode::Write));
        }
        let mut covered: Vec<Range> =
            own.iter().filter(|t| t.overlaps(range)).map(|t| (t.start, t.end)).collect();
        covered.sort_unstable();
        let mut next = Some(range.0);
        for (start, end) in covered {
            if let Some(from) = next.filter(|from| *from < start) {
                own.push(Held { session, mode, start: from, end: start - 1 });
            }
            next = end.checked_add(1).filter(|n| *n <= range.1);
        }
        if let Some(from) = next {
            own.push(Held { session, mode, start: from, end: range.1 });
        }
        self.replace_own(file, session, before, (kept, own));
    }

    /// Gives back `session`'s tokens on `range` of `file`, or downgrades them to read.
    pub fn release(&mut self, file: u64, session: u64, range: Range, to: Option<TokenMode>) {
        if !self.files.contains_key(&file) {
            return;
        }
        let (before, kept, mut own, inside) = self.cut(file, session, range);
        if to == Some(TokenMode::Read) {
            own.extend(inside.into_iter().map(|token| Held { mode: TokenMode::Read, ..token }));
        }
        self.replace_own(file, session, before, (kept, own));
    }

    /// Takes `file`'s tokens out, apart around `range`: the counts before (see
    /// `replace_own`), the other sessions' tokens, `session`'s tokens with `range` cut out of
    /// them, and the parts cut out.
    fn cut(
        &mut self,
        file: u64,
        session: u64,
        range: Range,
    ) -> ((usize, usize), Vec<Held>, Vec<Held>, Vec<Held>) {
        let held = self.files.entry(file).or_default();
        let before = counts(held, session);
        let (mut kept, mut own, mut inside) = (Vec::with_capacity(held.len() + 2), Vec::new(), Vec::new());
        for token in held.drain(..) {
            if token.session != session {
                kept.push(token);
            } else if !token.overlaps(range) {
                own.push(token);
            } else {
                outside(&token, range, &mut own);
                inside.push(Held { start: token.start.max(range.0), end: token.end.min(range.1), ..token });
            }
        }
        (before, kept, own, inside)
    }

    /// Puts `session`'s new token list for `file` beside the other sessions' `kept` ones,
    /// merging the session's adjacent tokens of one mode; `before` are the file's token
    /// count and the session's share of it before the change.
    fn replace_own(
        &mut self,
        file: u64,
        session: u64,
        before: (usize, usize),
        (mut kept, mut own): (Vec<Held>, Vec<Held>),
    ) {
        own.sort_unstable_by_key(|t| t.start);
        let mut merged: Vec<Held> = Vec::with_capacity(own.len());
        for token in own {
            match merged.last_mut() {
                Some(last) if last.mode == token.mode && last.end.checked_add(1) == Some(token.start) => {
                    last.end = token.end;
                }
                _ => merged.push(token),
            }
        }
        let mine = merged.len();
        if mine == 0 {
            // Nothing of this file left to revoke from the session: its last grant's number
            // is not needed (a later grant takes a new one), and keeping it would grow the
            // map with every file a long session ever touched.
            if let Some(files) = self.seqs.get_mut(&session) {
                files.remove(&file);
                if files.is_empty() {
                    self.seqs.remove(&session);
                }
            }
        }
        kept.extend(merged);
        self.count = self.count - before.0 + kept.len();
        let per_session = self.per_session.entry(session).or_insert(0);
        *per_session = *per_session - before.1 + mine;
        if *per_session == 0 {
            self.per_session.remove(&session);
        }
        if kept.is_empty() {
            self.files.remove(&file);
        } else {
            self.files.insert(file, kept);
        }
    }

    /// Counts again from the tokens themselves.
    fn recount(&mut self) {
        self.count = self.files.values().map(Vec::len).sum();
        self.per_session.clear();
        for token in self.files.values().flatten() {
            *self.per_session.entry(token.session).or_insert(0) += 1;
        }
    }

    /// Drops every token of the sessions `alive` says are gone. The periodic sweep finds
    /// every session alive nearly always; that case looks at each session, not at each token.
    pub fn retain_sessions(&mut self, alive: impl Fn(u64) -> bool) {
        self.seqs.retain(|session, _| alive(*session));
        let gone: Vec<u64> = self.per_session.keys().copied().filter(|session| !alive(*session)).collect();
        if gone.is_empty() {
            return;
        }
        self.files.retain(|_, held| {
            held.retain(|token| !gone.contains(&token.session));
            !held.is_empty()
        });
        self.recount();
    }

    /// The revocation to send `held`'s session for a request of `mode` on `required`
    /// wanting up to the end of `desired`.
    pub fn revoke_for(
        &self,
        file: u64,
        held: &Held,
        mode: TokenMode,
        required: Range,
        desired: Range,
    ) -> TokenRevoke {
        let start = held.start.max(required.0);
        let end = held.end.min(desired.1.max(required.1));
        let to = (mode == TokenMode::Read).then_some(TokenMode::Read);
        let seq = self.seqs.get(&held.session).and_then(|files| files.get(&file)).copied().unwrap_or(0);
        TokenRevoke { id: file, start, end, to, seq }
    }

    /// Every token on `file`, for tests.
    #[cfg(test)]
    pub fn held(&self, file: u64) -> Vec<Held> {
        self.files.get(&file).cloned().unwrap_or_default()
    }
}

/// The number of tokens in `held`, and of `session`'s among them.
fn counts(held: &[Held], session: u64) -> (usize, usize) {
    (held.len(), held.iter().filter(|t| t.session == session).count())
}

/// The parts of `token` before and after `range`.
fn outside(token: &Held, (start, end): Range, into: &mut Vec<Held>) {
    if token.start < start {
        into.push(Held { end: start - 1, ..*token });
    }
    if token.end > end {
        into.push(Held { start: end + 1, ..*token });
    }
}

/// Bounds of the token service.
#[derive(Clone, Copy, Debug)]
pub struct TokenBounds {
    /// Tokens held in the whole cluster.
    pub tokens_max: usize,
    /// Longest one `TokenAcquire` or `TokenWait` waits before answering.
    pub wait_ms_max: u64,
    /// `TokenAcquire` requests waiting for holders at once; more are answered busy at once.
    pub waiters_max: usize,
    /// `TokenWait` polls held at once (one per client); more are refused.
    pub pollers_max: usize,
    /// After the service starts, no token is granted for this long, so that every client
    /// that held tokens before a restart learns they were lost (its next poll) first.
    pub recovery_ms: u64,
}

#[derive(Default)]
struct Shared {
    table: TokenTable,
    /// Revocations each session has yet to collect.
    events: HashMap<u64, Vec<TokenRevoke>>,
}

/// The token table shared by request handlers, with waiting and revocation queues.
pub struct Tokens {
    shared: parking_lot::Mutex<Shared>,
    changed: parking_lot::Condvar,
    waiters: AtomicUsize,
    pollers: AtomicUsize,
    /// Files with the no-overlap hint (persisted in the namespace, read at start).
    no_overlap: parking_lot::RwLock<HashSet<u64>>,
    /// No grant before this instant (the recovery period after a start or an election).
    granting_from: parking_lot::Mutex<Instant>,
    bounds: TokenBounds,
}

impl Tokens {
    pub fn new(bounds: TokenBounds, no_overlap: Vec<u64>) -> Tokens {
        Tokens {
            shared: parking_lot::Mutex::new(Shared::default()),
            changed: parking_lot::Condvar::new(),
            waiters: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            no_overlap: parking_lot::RwLock::new(no_overlap.into_iter().collect()),
            granting_from: parking_lot::Mutex::new(
                Instant::now() + Duration::from_millis(bounds.recovery_ms),
            ),
            bounds,
        }
    }

    pub fn no_overlap(&self, file: u64) -> bool {
        self.no_overlap.read().contains(&file)
    }

    pub fn set_no_overlap(&self, file: u64, no_overlap: bool) {
        let mut files = self.no_overlap.write();
        if no_overlap {
            files.insert(file);
        } else {
            files.remove(&file);
        }
    }

    /// `TokenAcquire`: a grant, or `Err(holder)` when a conflicting token is still held
    /// after `wait_ms` (bounded). Holders in the way are sent revocations.
    pub fn acquire(
        &self,
        (file, session): (u64, u64),
        mode: TokenMode,
        (required, desired): (Range, Range),
        wait_ms: u64,
    ) -> Result<Result<TokenGrant, u64>, WireError> {
        check_ranges(required, desired)?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms.min(self.bounds.wait_ms_max));
        let mut shared = self.shared.lock();
        let mut waiting = false;
        let outcome = loop {
            let granting_from = *self.granting_from.lock();
            if Instant::now() < granting_from {
                if Instant::now() >= deadline {
                    break Ok(Err(0));
                }
                self.changed.wait_until(&mut shared, deadline.min(granting_from));
                continue;
            }
            if shared.table.len() + 3 > self.bounds.tokens_max {
                break Err(WireError::new(
                    ErrorCode::OverLimit,
                    format!(
                        "{} byte-range tokens are held, the limit tokens_max = {}",
                        shared.table.len(),
                        self.bounds.tokens_max
                    ),
                ));
            }
            let in_the_way = match shared.table.grant(file, session, mode, (required, desired)) {
                Ok(grant) => break Ok(Ok(grant)),
                Err(in_the_way) => in_the_way,
            };
            self.send_revokes(&mut shared, file, &in_the_way, mode, (required, desired));
            if Instant::now() >= deadline || !self.begin_waiting(&mut waiting) {
                break Ok(Err(in_the_way[0].session));
            }
            self.changed.wait_until(&mut shared, deadline);
        };
        if waiting {
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
        outcome
    }

    /// Counts this request among the waiting ones (once); false when too many wait.
    fn begin_waiting(&self, waiting: &mut bool) -> bool {
        if !*waiting {
            *waiting = true;
            let now_waiting = self.waiters.fetch_add(1, Ordering::SeqCst) + 1;
            return now_waiting <= self.bounds.waiters_max;
        }
        true
    }

    /// Queues a revocation for each token in the way (once: an identical one already
    /// queued is not repeated) and wakes the holders' polls.
    fn send_revokes(
        &self,
        shared: &mut Shared,
        file: u64,
        in_the_way: &[Held],
        mode: TokenMode,
        ranges: (Range, Range),
    ) {
        let mut sent = false;
        for held in in_the_way {
            let revoke = shared.table.revoke_for(file, held, mode, ranges.0, ranges.1);
            let queue = shared.events.entry(held.session).or_default();
            if queue.len() < TOKEN_EVENTS_MAX && !queue.contains(&revoke) {
                queue.push(revoke);
                sent = true;
            }
        }
        if sent {
            self.changed.notify_all();
        }
    }

    /// A new recovery period until `until`, starting from an empty table: this node just
    /// became the metadata group's leader and holds none of the tokens granted under the
    /// previous one. A client polling with tokens is told they are `lost` (it flushes and
    /// drops its cache, as after a restart); nothing is granted before `until`.
    pub fn begin_grace(&self, until: Instant) {
        let mut shared = self.shared.lock();
        shared.table.clear();
        shared.events.clear();
        *self.granting_from.lock() = until;
        drop(shared);
        self.changed.notify_all();
    }

    /// `TokenRelease`: gives back `session`'s tokens on `range` of `file` (or downgrades
    /// them to read), and forgets the revocations it answered.
    pub fn release(
        &self,
        (file, session): (u64, u64),
        range: Range,
        to: Option<TokenMode>,
    ) -> Result<(), WireError> {
        check_ranges(range, range)?;
        if to == Some(TokenMode::Write) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "a token can be released to read or to nothing, not to write",
            ));
        }
        let mut shared = self.shared.lock();
        shared.table.release(file, session, range, to);
        if let Some(queue) = shared.events.get_mut(&session) {
            queue.retain(|r| {
                !(r.id == file && range.0 <= r.start && r.end <= range.1 && (to.is_none() || r.to == to))
            });
        }
        self.changed.notify_all();
        Ok(())
    }

    /// `TokenWait`: the revocations queued for `session`, waiting up to `wait_ms` (bounded)
    /// for one; `lost` when the client believes it holds tokens the service does not have.
    pub fn wait(
        &self,
        session: u64,
        holding: bool,
        wait_ms: u64,
    ) -> Result<(Vec<TokenRevoke>, bool), WireError> {
        let _slot = PollSlot::take(&self.pollers, self.bounds.pollers_max, "token")?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms.min(self.bounds.wait_ms_max));
        let answer = wait_for_answer(&self.shared, &self.changed, deadline, |shared| {
            if let Some(queue) = shared.events.get_mut(&session).filter(|q| !q.is_empty()) {
                let taken = queue.len().min(TOKEN_EVENTS_MAX);
                return Some((queue.drain(..taken).collect(), false));
            }
            (holding && !shared.table.holds_any(session)).then(|| (Vec::new(), true))
        });
        Ok(answer.unwrap_or((Vec::new(), false)))
    }

    /// Whether `session` holds any token.
    pub fn holds_any(&self, session: u64) -> bool {
        self.shared.lock().table.holds_any(session)
    }

    /// Drops the tokens and queued revocations of sessions that ended (lease ran out).
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

/// A place among the token polls the service holds at once (each holds a blocking thread),
/// given back when dropped.
pub(crate) struct PollSlot<'a>(&'a AtomicUsize);

impl<'a> PollSlot<'a> {
    /// Takes a place among at most `max` polls of `what` (`OverLimit` past it).
    pub(crate) fn take(pollers: &'a AtomicUsize, max: usize, what: &str) -> Result<PollSlot<'a>, WireError> {
        let now_polling = pollers.fetch_add(1, Ordering::SeqCst) + 1;
        let slot = PollSlot(pollers);
        if now_polling > max {
            return Err(WireError::new(
                ErrorCode::OverLimit,
                format!("{now_polling} {what} polls are waiting, the limit token_pollers_max = {max}"),
            ));
        }
        Ok(slot)
    }
}

impl Drop for PollSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits on `changed` until `answer` finds one in the shared state or `deadline` passes
/// (`None`): the loop of a revocation poll.
pub(crate) fn wait_for_answer<S, T>(
    shared: &parking_lot::Mutex<S>,
    changed: &parking_lot::Condvar,
    deadline: Instant,
    mut answer: impl FnMut(&mut S) -> Option<T>,
) -> Option<T> {
    let mut guard = shared.lock();
    loop {
        if let Some(found) = answer(&mut guard) {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        changed.wait_until(&mut guard, deadline);
    }
}

fn check_ranges(required: Range, desired: Range) -> Result<(), WireError> {
    let fits = required.0 <= required.1 && desired.0 <= required.0 && required.1 <= desired.1;
    if !fits {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!(
                "token range {}..={} is empty or not inside {}..={}",
                required.0, required.1, desired.0, desired.1
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_past_the_limit_are_refused_and_a_finished_poll_frees_its_place() {
        let pollers = AtomicUsize::new(0);
        let first = PollSlot::take(&pollers, 2, "token").unwrap();
        let second = PollSlot::take(&pollers, 2, "token").unwrap();
        let refused = PollSlot::take(&pollers, 2, "token").err().expect("a third poll is refused");
        assert_eq!(refused.code, ErrorCode::OverLimit);
        assert!(refused.message.contains("token_pollers_max = 2"), "{}", refused.message);
        drop(first);
        let third = PollSlot::take(&pollers, 2, "token").unwrap();
        drop((second, third));
        assert_eq!(pollers.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_poll_answers_what_is_there_or_nothing_at_its_deadline() {
        let shared = parking_lot::Mutex::new(vec![7u64]);
        let changed = parking_lot::Condvar::new();
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(wait_for_answer(&shared, &changed, soon, |queue: &mut Vec<u64>| queue.pop()), Some(7));
        let began = Instant::now();
        assert_eq!(
            wait_for_answer(&shared, &changed, began + Duration::from_millis(20), |q: &mut Vec<u64>| q.pop()),
            None
        );
        assert!(began.elapsed() >= Duration::from_millis(20), "it waited until the deadline");
    }
    use proptest::prelude::*;
    use TokenMode::{Read, Write};

    const WHOLE: Range = (0, u64::MAX);

    fn bounds() -> TokenBounds {
        TokenBounds { tokens_max: 1000, wait_ms_max: 5000, waiters_max: 8, pollers_max: 8, recovery_ms: 0 }
    }

    #[test]
    fn the_first_writer_gets_the_whole_file_and_the_next_splits_it() {
        let mut table = TokenTable::default();
        let grant = table.grant(1, 10, Write, ((0, 99), WHOLE)).unwrap();
        assert_eq!((grant.start, grant.end), WHOLE);
        // A second writer at 1000 is in the way of the first; the first gives back 1000.. .
        let in_the_way = table.grant(1, 20, Write, ((1000, 1099), WHOLE)).unwrap_err();
        assert_eq!(in_the_way.len(), 1);
        let revoke = table.revoke_for(1, &in_the_way[0], Write, (1000, 1099), WHOLE);
        assert_eq!((revoke.start, revoke.end, revoke.to, revoke.seq), (1000, u64::MAX, None, grant.seq));
        table.release(1, 10, (revoke.start, revoke.end), revoke.to);
        let second = table.grant(1, 20, Write, ((1000, 1099), WHOLE)).unwrap();
        assert_eq!((second.start, second.end), (1000, u64::MAX));
        // The first writer keeps writing below 1000 without asking.
        assert!(table.conflicts(1, 10, Write, (0, 999)).is_empty());
        assert!(table.grant(1, 10, Write, ((500, 599), WHOLE)).is_ok());
        assert_eq!(table.held(1).len(), 2);
    }

    #[test]
    fn released_files_leave_no_sequence_numbers_and_a_sweep_asks_once_per_session() {
        let mut table = TokenTable::default();
        for file in 0..500 {
            table.grant(file, 10, Read, ((0, 9), WHOLE)).unwrap();
            table.grant(file, 20, Read, ((0, 9), WHOLE)).unwrap();
        }
        for file in 0..500 {
            table.release(file, 10, WHOLE, None);
        }
        assert!(!table.seqs.contains_key(&10), "session 10 holds nothing");
        assert_eq!(table.seqs.get(&20).map(HashMap::len), Some(500));
        let asked = std::cell::Cell::new(0);
        table.retain_sessions(|_| {
            asked.set(asked.get() + 1);
            true
        });
        assert!(asked.get() <= 2, "asked {} times", asked.get());
        assert_eq!(table.len(), 500);
        table.retain_sessions(|session| session != 20);
        assert_eq!((table.len(), table.seqs.len()), (0, 0));
    }

    #[test]
    fn readers_share_and_a_reader_asks_a_writer_to_downgrade() {
        let mut table = TokenTable::default();
        table.grant(1, 10, Read, ((0, 9), WHOLE)).unwrap();
        table.grant(1, 20, Read, ((0, 9), WHOLE)).unwrap();
        assert!(table.grant(1, 30, Write, ((5, 5), WHOLE)).is_err());
        table.release(1, 10, WHOLE, None);
        table.release(1, 20, WHOLE, None);
        table.grant(1, 30, Write, ((5, 5), WHOLE)).unwrap();
        let in_the_way = table.grant(1, 10, Read, ((0, 9), WHOLE)).unwrap_err();
        let revoke = table.revoke_for(1, &in_the_way[0], Read, (0, 9), WHOLE);
        assert_eq!(revoke.to, Some(Read));
        table.release(1, 30, (revoke.start, revoke.end), revoke.to);
        assert!(table.grant(1, 10, Read, ((0, 9), WHOLE)).is_ok());
        // The former writer still reads without asking.
        assert!(table.conflicts(1, 30, Read, WHOLE).is_empty());
    }

    #[test]
    fn a_grant_stops_short_of_other_sessions_tokens() {
        let mut table = TokenTable::default();
        table.grant(1, 10, Write, ((100, 199), (100, 199))).unwrap();
        table.grant(1, 10, Write, ((500, 599), (500, 599))).unwrap();
        let grant = table.grant(1, 20, Write, ((300, 309), WHOLE)).unwrap();
        assert_eq!((grant.start, grant.end), (200, 499));
    }

    #[test]
    fn ended_sessions_lose_their_tokens() {
        let mut table = TokenTable::default();
        table.grant(1, 10, Write, ((0, 0), WHOLE)).unwrap();
        table.grant(2, 20, Read, ((0, 0), WHOLE)).unwrap();
        table.retain_sessions(|session| session != 10);
        assert_eq!(table.len(), 1);
        assert!(!table.holds_any(10) && table.holds_any(20));
        assert!(table.grant(1, 20, Write, ((0, 0), WHOLE)).is_ok());
    }

    #[test]
    fn an_acquire_waits_for_the_holder_to_release() {
        let tokens = std::sync::Arc::new(Tokens::new(bounds(), Vec::new()));
        assert!(tokens.acquire((1, 10), Write, ((0, 9), WHOLE), 0).unwrap().is_ok());
        let waiter = {
            let tokens = tokens.clone();
            std::thread::spawn(move || tokens.acquire((1, 20), Write, ((0, 9), WHOLE), 5000))
        };
        // The holder learns of the revocation by its poll, and gives the bytes back.
        let (revokes, lost) = tokens.wait(10, true, 5000).unwrap();
        assert!(!lost);
        assert_eq!(revokes.len(), 1);
        tokens.release((1, 10), (revokes[0].start, revokes[0].end), revokes[0].to).unwrap();
        let grant = waiter.join().unwrap().unwrap().unwrap();
        assert_eq!((grant.start, grant.end), WHOLE);
        // A session that believes it holds tokens the service does not have is told so.
        assert_eq!(tokens.wait(10, true, 0).unwrap(), (Vec::new(), true));
        assert_eq!(tokens.wait(20, true, 0).unwrap(), (Vec::new(), false));
    }

    #[test]
    fn no_grant_during_recovery_and_the_table_is_bounded() {
        let recovering = Tokens::new(TokenBounds { recovery_ms: 60_000, ..bounds() }, Vec::new());
        assert_eq!(recovering.acquire((1, 10), Read, ((0, 0), WHOLE), 10).unwrap(), Err(0));
        let small = Tokens::new(TokenBounds { tokens_max: 3, ..bounds() }, vec![7]);
        assert!(small.no_overlap(7) && !small.no_overlap(8));
        small.acquire((1, 10), Write, ((0, 0), (0, 0)), 0).unwrap().unwrap();
        let error = small.acquire((2, 10), Write, ((0, 0), (0, 0)), 0).unwrap_err();
        assert!(error.message.contains("tokens_max"), "{}", error.message);
        let bad = small.acquire((3, 10), Write, ((5, 9), (6, 9)), 0).unwrap_err();
        assert_eq!(bad.code, ErrorCode::InvalidArgument);
    }

    #[test]
    fn an_election_loses_every_token_and_grants_nothing_until_the_grace_ends() {
        let tokens = Tokens::new(bounds(), Vec::new());
        tokens.acquire((1, 10), Write, ((0, 9), WHOLE), 0).unwrap().unwrap();
        let started = Instant::now();
        tokens.begin_grace(started + Duration::from_millis(300));
        assert_eq!(tokens.wait(10, true, 0).unwrap(), (Vec::new(), true), "the holder is told: lost");
        assert_eq!(tokens.acquire((1, 20), Write, ((0, 9), WHOLE), 0).unwrap(), Err(0));
        let grant = tokens.acquire((1, 20), Write, ((0, 9), WHOLE), 5_000).unwrap().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300), "granted inside the grace period");
        assert_eq!((grant.start, grant.end), WHOLE, "the old term's token is not in the way");
    }

    proptest! {
        /// After any sequence of grants and releases: one session's tokens never overlap,
        /// two sessions' tokens overlap only if both read, every granted range is held by
        /// its session in at least its mode, and the counts match the tokens.
        #[test]
        fn the_invariants_hold(ops in proptest::collection::vec((0u64..3, 0u8..4, 0u64..60, 0u64..12), 1..80)) {
            let mut table = TokenTable::default();
            for (session, op, start, length) in ops {
                let range = (start, start + length);
                match op {
                    0 | 1 => {
                        let mode = if op == 0 { Read } else { Write };
                        if let Ok(grant) = table.grant(1, session, mode, (range, (0, 80))) {
                            prop_assert!(grant.start <= range.0 && range.1 <= grant.end);
                            for byte in grant.start..=grant.end {
                                let held = table.held(1).into_iter().find(|t| t.session == session && t.start <= byte && byte <= t.end);
                                prop_assert!(held.is_some_and(|t| t.mode >= mode), "byte {} not held", byte);
                            }
                        }
                    }
                    2 => table.release(1, session, range, None),
                    _ => table.release(1, session, range, Some(Read)),
                }
                let held = table.held(1);
                for (i, a) in held.iter().enumerate() {
                    for b in &held[i + 1..] {
                        if a.overlaps((b.start, b.end)) {
                            prop_assert!(a.session != b.session, "one session's tokens overlap");
                            prop_assert!(a.mode == Read && b.mode == Read, "a write token is shared");
                        }
                    }
                }
                prop_assert_eq!(table.len(), held.len());
                for session in 0..3 {
                    prop_assert_eq!(table.holds_any(session), held.iter().any(|t| t.session == session));
                }
            }
        }
    }
}
