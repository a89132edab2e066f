//! A completion ticket: a caller submits `count` disk operations sharing one ticket and
//! blocks in `wait` until all of them reported, or asks to be called back (`on_done`) by
//! whoever reports the last one. The first error is kept; later ones are dropped (they
//! describe the same batch).
//!
//! Invariants: the callback runs at most once, never while the ticket's lock is held; it
//! runs on the thread that reported the last operation, or on the registering thread if
//! every operation had already reported.

use crate::error::StoreError;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// What a ticket calls once its last operation reported.
pub(crate) type Waker = Box<dyn FnOnce() + Send>;

/// Counts down the operations of one batch.
#[derive(Debug)]
pub(crate) struct Completion {
    state: Mutex<CompletionState>,
    done: Condvar,
}

struct CompletionState {
    remaining: usize,
    first_error: Option<StoreError>,
    waker: Option<Waker>,
}

impl std::fmt::Debug for CompletionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionState")
            .field("remaining", &self.remaining)
            .field("first_error", &self.first_error)
            .field("waker", &self.waker.is_some())
            .finish()
    }
}

impl Completion {
    pub(crate) fn new(count: usize) -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(CompletionState { remaining: count, first_error: None, waker: None }),
            done: Condvar::new(),
        })
    }

    /// Reports one operation's result; the last report runs the callback, if one is set.
    pub(crate) fn complete(&self, result: Result<(), StoreError>) {
        let mut state = self.state.lock();
        assert!(state.remaining > 0, "completion reported more often than submitted");
        state.remaining -= 1;
        if let Err(error) = result {
            state.first_error.get_or_insert(error);
        }
        if state.remaining > 0 {
            return;
        }
        self.done.notify_all();
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker();
        }
    }

    /// Calls `waker` once every operation reported: now, on this thread, if they already
    /// have, else on the thread reporting the last one (keep it cheap: a disk thread).
    pub(crate) fn on_done(&self, waker: Waker) {
        let mut state = self.state.lock();
        if state.remaining > 0 {
            state.waker = Some(waker);
            return;
        }
        drop(state);
        waker();
    }

    /// Whether every operation reported.
    pub(crate) fn is_done(&self) -> bool {
        self.state.lock().remaining == 0
    }

    /// Whether an operation failed (so far).
    pub(crate) fn failed(&self) -> bool {
        self.state.lock().first_error.is_some()
    }

    /// Blocks until every operation reported; returns the first error.
    pub(crate) fn wait(&self) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        while state.remaining > 0 {
            self.done.wait(&mut state);
        }
        match state.first_error.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting_waker(calls: &Arc<AtomicUsize>) -> Waker {
        let calls = calls.clone();
        Box::new(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn waker_runs_once_on_the_last_report() {
        let ticket = Completion::new(2);
        let calls = Arc::new(AtomicUsize::new(0));
        ticket.on_done(counting_waker(&calls));
        ticket.complete(Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "one operation is still out");
        assert!(!ticket.is_done());
        ticket.complete(Err(StoreError::ShuttingDown));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(ticket.is_done() && ticket.failed());
    }

    #[test]
    fn waker_set_after_the_last_report_runs_at_once() {
        let ticket = Completion::new(1);
        ticket.complete(Ok(()));
        let calls = Arc::new(AtomicUsize::new(0));
        ticket.on_done(counting_waker(&calls));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(ticket.wait().is_ok());
    }
}
