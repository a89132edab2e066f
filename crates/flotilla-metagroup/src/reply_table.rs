//! The exactly-once reply table (Lustre's last_rcvd, as plain logic with no I/O).
//!
//! A client opens a session (the state machine hands out its id) and numbers its changing
//! requests 1, 2, 3 … in that session. The table keeps the reply of each applied request, so a
//! request retried after a leader change gets the first reply instead of being applied again.
//!
//! Invariants:
//! - a (session, sequence) is answered [`Lookup::Apply`] at most once, ever;
//! - a session holds at most `replies_per_session_max` replies; past it the lowest sequence is
//!   dropped and a retry of it is [`ReplyError::Forgotten`] (never applied again);
//! - replies the client acknowledged (`acknowledged_through`) are dropped; a retry of one is
//!   [`ReplyError::Forgotten`];
//! - a session idle longer than `session_idle_ms_max` (by the proposer's clock carried in the
//!   log, never a local clock) is removed; its requests are then [`ReplyError::UnknownSession`]
//!   — the client must open a new session and treat its unanswered requests as of unknown
//!   outcome (Lustre's eviction), so nothing is applied twice;
//! - at most `sessions_max` sessions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bounds of the reply table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyLimits {
    pub replies_per_session_max: usize,
    pub reply_bytes_max: usize,
    pub sessions_max: usize,
    pub session_idle_ms_max: u64,
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            replies_per_session_max: 64,
            reply_bytes_max: 64 << 10,
            sessions_max: 65_536,
            session_idle_ms_max: 300_000,
        }
    }
}

/// One client session's replies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The proposer's clock at this session's last request.
    pub last_active_ms: u64,
    /// Every sequence at or below this was dropped (acknowledged or pushed out by the bound).
    pub dropped_through: u64,
    /// Replies kept, by sequence; every key is above `dropped_through`.
    pub replies: BTreeMap<u64, Vec<u8>>,
    /// The credential that opened the session, the only one that may use it (issue 33);
    /// `None`: a session the service opened for itself, that no client may use.
    pub owner: Option<String>,
}

/// A session's record as stored before sessions had owners (read, never written).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionV1 {
    pub last_active_ms: u64,
    pub dropped_through: u64,
    pub replies: BTreeMap<u64, Vec<u8>>,
}

impl From<SessionV1> for Session {
    fn from(old: SessionV1) -> Session {
        Session {
            last_active_ms: old.last_active_ms,
            dropped_through: old.dropped_through,
            replies: old.replies,
            owner: None,
        }
    }
}

/// Who may use a session, asked by a client presenting its credential's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Usable {
    Yes,
    /// No such session (never opened, closed or expired).
    Unknown,
    /// Opened by the service for itself (no owner): no client may use it.
    Unowned,
    /// Opened by another credential.
    OtherOwner(String),
}

impl Session {
    /// Whether the client with credential `who` may send changes in this session.
    pub fn usable_by(&self, who: &str) -> Usable {
        match &self.owner {
            Some(owner) if owner == who => Usable::Yes,
            Some(owner) => Usable::OtherOwner(owner.clone()),
            None => Usable::Unowned,
        }
    }
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Not seen before: apply it, then [`ReplyTable::record`] its reply.
    Apply,
    /// Applied before: answer with this reply, apply nothing.
    Replay(Vec<u8>),
}

/// Why a request gets neither a replay nor an application.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ReplyError {
    #[error("session {session_id} is unknown or expired; open a new session")]
    UnknownSession { session_id: u64 },
    #[error(
        "reply to request {sequence} of session {session_id} was forgotten (at or below {dropped_through})"
    )]
    Forgotten { session_id: u64, sequence: u64, dropped_through: u64 },
    #[error("request sequence 0 is not valid in session {session_id}")]
    ZeroSequence { session_id: u64 },
    #[error("{sessions} sessions open, the bound sessions_max is {sessions_max}")]
    TooManySessions { sessions: usize, sessions_max: usize },
    #[error("reply of {bytes} bytes is over reply_bytes_max {bytes_max}")]
    ReplyTooLarge { bytes: usize, bytes_max: usize },
}

/// The table: sessions by id, the next id to hand out, and the latest proposer clock seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyTable {
    limits: ReplyLimits,
    sessions: BTreeMap<u64, Session>,
    next_session_id: u64,
    clock_ms: u64,
}

impl ReplyTable {
    /// An empty table.
    pub fn new(limits: ReplyLimits) -> Self {
        ReplyTable { limits, sessions: BTreeMap::new(), next_session_id: 1, clock_ms: 0 }
    }

    /// A table rebuilt from its parts (a state machine that keeps one record per session).
    pub fn from_parts(
        limits: ReplyLimits,
        sessions: BTreeMap<u64, Session>,
        next_session_id: u64,
        clock_ms: u64,
    ) -> Self {
        ReplyTable { limits, sessions, next_session_id: next_session_id.max(1), clock_ms }
    }

    /// The id the next session gets.
    pub fn next_session_id(&self) -> u64 {
        self.next_session_id
    }

    /// The latest proposer clock seen.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Every session, by id.
    pub fn sessions(&self) -> impl Iterator<Item = (&u64, &Session)> {
        self.sessions.iter()
    }

    /// Advances the table's clock (never backwards) and removes idle sessions; returns their ids.
    pub fn tick(&mut self, now_ms: u64) -> Vec<u64> {
        self.clock_ms = self.clock_ms.max(now_ms);
        let idle_max = self.limits.session_idle_ms_max;
        let clock = self.clock_ms;
        let expired: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| clock.saturating_sub(s.last_active_ms) > idle_max)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.sessions.remove(id);
        }
        expired
    }

    /// Opens a session; ids are never reused.
    pub fn open_session(&mut self, now_ms: u64) -> Result<u64, ReplyError> {
        self.open_session_for(now_ms, None)
    }

    /// Opens a session owned by `owner` (a client's credential name; `None`: the service's
    /// own); ids are never reused.
    pub fn open_session_for(&mut self, now_ms: u64, owner: Option<String>) -> Result<u64, ReplyError> {
        self.tick(now_ms);
        if self.sessions.len() >= self.limits.sessions_max {
            return Err(ReplyError::TooManySessions {
                sessions: self.sessions.len(),
                sessions_max: self.limits.sessions_max,
            });
        }
        let id = self.next_session_id;
        self.next_session_id += 1;
        self.sessions.insert(id, Session { last_active_ms: self.clock_ms, owner, ..Session::default() });
        Ok(id)
    }

    /// Closes a session (the client is done); its replies go.
    pub fn close_session(&mut self, session_id: u64) -> bool {
        self.sessions.remove(&session_id).is_some()
    }

    /// Decides a request: apply it, replay its reply, or refuse it. Drops the replies the
    /// client acknowledged first.
    pub fn check(
        &mut self,
        session_id: u64,
        sequence: u64,
        acknowledged_through: u64,
    ) -> Result<Lookup, ReplyError> {
        if sequence == 0 {
            return Err(ReplyError::ZeroSequence { session_id });
        }
        let clock = self.clock_ms;
        let session = self.sessions.get_mut(&session_id).ok_or(ReplyError::UnknownSession { session_id })?;
        session.last_active_ms = clock;
        drop_through(session, acknowledged_through.min(sequence - 1));
        if let Some(reply) = session.replies.get(&sequence) {
            return Ok(Lookup::Replay(reply.clone()));
        }
        if sequence <= session.dropped_through {
            return Err(ReplyError::Forgotten {
                session_id,
                sequence,
                dropped_through: session.dropped_through,
            });
        }
        Ok(Lookup::Apply)
    }

    /// Records the reply of a request [`ReplyTable::check`] said to apply.
    pub fn record(&mut self, session_id: u64, sequence: u64, reply: Vec<u8>) -> Result<(), ReplyError> {
        if reply.len() > self.limits.reply_bytes_max {
            return Err(ReplyError::ReplyTooLarge {
                bytes: reply.len(),
                bytes_max: self.limits.reply_bytes_max,
            });
        }
        let per_session_max = self.limits.replies_per_session_max;
        let session = self.sessions.get_mut(&session_id).ok_or(ReplyError::UnknownSession { session_id })?;
        debug_assert!(sequence > session.dropped_through && !session.replies.contains_key(&sequence));
        session.replies.insert(sequence, reply);
        while session.replies.len() > per_session_max {
            let Some((&lowest, _)) = session.replies.iter().next() else { break };
            drop_through(session, lowest);
        }
        Ok(())
    }

    /// The session with this id.
    pub fn session(&self, session_id: u64) -> Option<&Session> {
        self.sessions.get(&session_id)
    }

    /// Number of open sessions.
    pub fn sessions_len(&self) -> usize {
        self.sessions.len()
    }

    /// The bounds.
    pub fn limits(&self) -> &ReplyLimits {
        &self.limits
    }
}

fn drop_through(session: &mut Session, through: u64) {
    if through <= session.dropped_through {
        return;
    }
    session.dropped_through = through;
    session.replies = session.replies.split_off(&(through + 1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn limits(per_session: usize) -> ReplyLimits {
        ReplyLimits {
            replies_per_session_max: per_session,
            session_idle_ms_max: 1_000,
            ..ReplyLimits::default()
        }
    }

    #[test]
    fn a_session_is_usable_by_its_owner_only() {
        let mut table = ReplyTable::new(ReplyLimits::default());
        let mine = table.open_session_for(0, Some("alice".into())).unwrap();
        let service = table.open_session(0).unwrap();
        assert_eq!(table.session(mine).unwrap().usable_by("alice"), Usable::Yes);
        assert_eq!(table.session(mine).unwrap().usable_by("bob"), Usable::OtherOwner("alice".into()));
        assert_eq!(table.session(service).unwrap().usable_by("alice"), Usable::Unowned);
        // A record stored before owners is read as the service's own.
        let old = SessionV1 { last_active_ms: 3, dropped_through: 1, replies: BTreeMap::new() };
        assert_eq!(Session::from(old).usable_by("alice"), Usable::Unowned);
    }

    #[test]
    fn a_retry_gets_the_first_reply() {
        let mut table = ReplyTable::new(limits(4));
        let s = table.open_session(0).unwrap();
        assert_eq!(table.check(s, 1, 0), Ok(Lookup::Apply));
        table.record(s, 1, b"first".to_vec()).unwrap();
        assert_eq!(table.check(s, 1, 0), Ok(Lookup::Replay(b"first".to_vec())));
    }

    #[test]
    fn acknowledged_and_pushed_out_replies_are_forgotten_not_reapplied() {
        let mut table = ReplyTable::new(limits(2));
        let s = table.open_session(0).unwrap();
        for seq in 1..=3 {
            assert_eq!(table.check(s, seq, 0), Ok(Lookup::Apply));
            table.record(s, seq, vec![seq as u8]).unwrap();
        }
        // Phase: the bound of 2 pushed out sequence 1.
        assert!(matches!(table.check(s, 1, 0), Err(ReplyError::Forgotten { sequence: 1, .. })));
        // Phase: acknowledging through 2 drops 2; 3 is still replayed.
        assert_eq!(table.check(s, 4, 2), Ok(Lookup::Apply));
        assert!(matches!(table.check(s, 2, 0), Err(ReplyError::Forgotten { .. })));
        assert_eq!(table.check(s, 3, 0), Ok(Lookup::Replay(vec![3])));
    }

    #[test]
    fn an_idle_session_expires_by_the_proposer_clock() {
        let mut table = ReplyTable::new(limits(2));
        let s = table.open_session(0).unwrap();
        table.tick(500);
        assert_eq!(table.check(s, 1, 0), Ok(Lookup::Apply));
        table.record(s, 1, vec![]).unwrap();
        assert!(table.tick(1_400).is_empty());
        assert_eq!(table.tick(1_501), vec![s]);
        assert_eq!(table.check(s, 1, 0), Err(ReplyError::UnknownSession { session_id: s }));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Request { session: usize, sequence: u64, acknowledged: u64 },
        Tick { advance_ms: u64 },
        Open,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0usize..3, 1u64..24, 0u64..24)
                .prop_map(|(session, sequence, acknowledged)| Op::Request { session, sequence, acknowledged }),
            1 => (0u64..600).prop_map(|advance_ms| Op::Tick { advance_ms }),
            1 => Just(Op::Open),
        ]
    }

    proptest! {
        /// Whatever the clients send, in any order and with any retries: no request is applied
        /// twice, a replay returns the reply recorded when it was applied, and every bound holds.
        #[test]
        fn never_applied_twice_and_replays_are_first_replies(
            per_session in 1usize..6,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut table = ReplyTable::new(limits(per_session));
            let mut sessions = vec![table.open_session(0).unwrap()];
            let mut applied: HashSet<(u64, u64)> = HashSet::new();
            let mut first_reply: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
            let mut clock = 0u64;
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Open => {
                        if let Ok(id) = table.open_session(clock) { sessions.push(id); }
                    }
                    Op::Tick { advance_ms } => { clock += advance_ms; table.tick(clock); }
                    Op::Request { session, sequence, acknowledged } => {
                        let id = sessions[session % sessions.len()];
                        let key = (id, sequence);
                        match table.check(id, sequence, acknowledged) {
                            Ok(Lookup::Apply) => {
                                prop_assert!(applied.insert(key), "{key:?} applied twice");
                                let reply = (step as u64).to_le_bytes().to_vec();
                                first_reply.insert(key, reply.clone());
                                table.record(id, sequence, reply).unwrap();
                            }
                            Ok(Lookup::Replay(reply)) => {
                                prop_assert_eq!(Some(&reply), first_reply.get(&key));
                            }
                            Err(ReplyError::UnknownSession { .. }) => prop_assert!(table.session(id).is_none()),
                            Err(ReplyError::Forgotten { .. }) => {}
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                        if let Some(s) = table.session(id) {
                            prop_assert!(s.replies.len() <= per_session);
                            prop_assert!(s.replies.keys().all(|k| *k > s.dropped_through));
                        }
                    }
                }
            }
        }

        /// A client that keeps at most `per_session` requests unacknowledged (in order, retrying
        /// any of them) always gets an answer: an application the first time, the same reply after.
        #[test]
        fn a_disciplined_client_is_never_forgotten(
            per_session in 1usize..6,
            retries in proptest::collection::vec(0usize..6, 1..100),
        ) {
            let mut table = ReplyTable::new(limits(per_session));
            let id = table.open_session(0).unwrap();
            let mut acknowledged = 0u64;
            for (i, back) in retries.into_iter().enumerate() {
                let sequence = i as u64 + 1;
                prop_assert_eq!(table.check(id, sequence, acknowledged), Ok(Lookup::Apply));
                table.record(id, sequence, sequence.to_le_bytes().to_vec()).unwrap();
                // Retry one of the unacknowledged requests (the window is `per_session`).
                let window_low = acknowledged + 1;
                let retried = sequence.saturating_sub(back as u64).max(window_low);
                prop_assert_eq!(
                    table.check(id, retried, acknowledged),
                    Ok(Lookup::Replay(retried.to_le_bytes().to_vec()))
                );
                if sequence - acknowledged >= per_session as u64 { acknowledged = sequence - per_session as u64 + 1; }
            }
        }
    }
}
