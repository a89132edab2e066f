//! The client's own session in the metadata group's reply table (issue 33, exactly-once;
//! docs/architecture.md "Metadata group").
//!
//! The client asks the group for a session once (`OpenGroupSession`), numbers its changes
//! 1, 2, 3 … in it and sends each as `Sequenced { session, sequence, acknowledged_through }`.
//! The session and the numbering belong to the client, not to a connection: they survive a
//! broken connection and a change of leader, so a change resent to the new leader carries
//! the identity of its first attempt and gets the first reply if that attempt was applied.
//!
//! `acknowledged_through` is the highest sequence below which every change was answered (or
//! given up on: the client never resends it), so the group drops those replies. A change is
//! numbered only while fewer than [`WINDOW_MAX`] numbers are unacknowledged, below the
//! group's `replies_per_session_max` (64), so the reply of a change still in flight is never
//! pushed out of the table.

use std::collections::BTreeSet;

/// Most sequence numbers a client has unacknowledged at once (the group keeps 64 replies a
/// session; a client within this window is never told a reply was forgotten).
pub(crate) const WINDOW_MAX: u64 = 32;

/// A change's identity in the client's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub session: u64,
    pub sequence: u64,
}

/// The session, its numbering and the changes in flight.
#[derive(Default)]
pub(crate) struct GroupSessions {
    state: parking_lot::Mutex<State>,
    /// Held while a session is being opened (one at a time).
    pub(crate) opening: tokio::sync::Mutex<()>,
    /// Woken when a change is answered (the window may have moved) or the session changed.
    moved: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// `None`: not asked yet; `Some(0)`: the service is not on a group (changes go bare).
    session: Option<u64>,
    /// The last sequence handed out in `session`.
    issued: u64,
    /// Sequences of `session` handed out and not answered yet.
    outstanding: BTreeSet<u64>,
}

impl State {
    fn acknowledged_through(&self) -> u64 {
        self.outstanding.first().map_or(self.issued, |first| first - 1)
    }
}

impl GroupSessions {
    /// The session in use: `None` before one was asked for, `Some(0)` if there is no group.
    pub(crate) fn current(&self) -> Option<u64> {
        self.state.lock().session
    }

    /// Uses `session` from now on, numbering from 1 (0: no group, changes go bare).
    pub(crate) fn set(&self, session: u64) {
        let mut state = self.state.lock();
        *state = State { session: Some(session), issued: 0, outstanding: BTreeSet::new() };
        drop(state);
        self.moved.notify_waiters();
    }

    /// Forgets `session` (the group forgot it): the next change opens another.
    pub(crate) fn forget(&self, session: u64) {
        let mut state = self.state.lock();
        if state.session == Some(session) {
            *state = State::default();
        }
        drop(state);
        self.moved.notify_waiters();
    }

    /// The next number of `session`, once the window has room; `None` if the session in use
    /// is no longer `session`.
    pub(crate) async fn take(&self, session: u64) -> Option<Ticket> {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            {
                let mut state = self.state.lock();
                if state.session != Some(session) {
                    return None;
                }
                if state.issued + 1 - state.acknowledged_through() <= WINDOW_MAX {
                    state.issued += 1;
                    let sequence = state.issued;
                    state.outstanding.insert(sequence);
                    return Some(Ticket { session, sequence });
                }
            }
            moved.await;
        }
    }

    /// What the client acknowledges with a change of `session`.
    pub(crate) fn acknowledged_through(&self, session: u64) -> u64 {
        let state = self.state.lock();
        if state.session == Some(session) {
            state.acknowledged_through()
        } else {
            0
        }
    }

    /// The change numbered `ticket` was answered, or given up on (never resent).
    pub(crate) fn done(&self, ticket: Ticket) {
        let mut state = self.state.lock();
        if state.session == Some(ticket.session) {
            state.outstanding.remove(&ticket.sequence);
        }
        drop(state);
        self.moved.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn numbers_acknowledge_the_answered_prefix_and_the_window_waits() {
        let sessions = GroupSessions::default();
        assert_eq!(sessions.take(5).await, None, "no session yet");
        sessions.set(5);
        let first = sessions.take(5).await.unwrap();
        let second = sessions.take(5).await.unwrap();
        assert_eq!((first.sequence, second.sequence), (1, 2));
        assert_eq!(sessions.acknowledged_through(5), 0);
        sessions.done(second);
        assert_eq!(sessions.acknowledged_through(5), 0, "1 is still unanswered");
        sessions.done(first);
        assert_eq!(sessions.acknowledged_through(5), 2);
        // Fill the window behind one slow change: the next number waits for it.
        let slow = sessions.take(5).await.unwrap();
        for _ in 1..WINDOW_MAX {
            let ticket = sessions.take(5).await.unwrap();
            sessions.done(ticket);
        }
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), sessions.take(5)).await;
        assert!(waiting.is_err(), "a number past the window was handed out");
        sessions.done(slow);
        let next = sessions.take(5).await.unwrap();
        assert_eq!(next.sequence, 3 + WINDOW_MAX);
        // A forgotten session numbers nothing; a new one starts at 1.
        sessions.forget(5);
        assert_eq!(sessions.take(5).await, None);
        sessions.set(6);
        assert_eq!(sessions.take(6).await.unwrap().sequence, 1);
    }
}
