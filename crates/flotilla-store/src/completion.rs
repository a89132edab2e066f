//! A completion ticket: a caller submits `count` disk operations sharing one ticket and
//! blocks in `wait` until all of them reported. The first error is kept; later ones are
//! dropped (they describe the same batch).

use crate::error::StoreError;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Counts down the operations of one batch.
#[derive(Debug)]
pub(crate) struct Completion {
    state: Mutex<CompletionState>,
    done: Condvar,
}

#[derive(Debug)]
struct CompletionState {
    remaining: usize,
    first_error: Option<StoreError>,
}

impl Completion {
    pub(crate) fn new(count: usize) -> Arc<Completion> {
        Arc::new(Completion {
            state: Mutex::new(CompletionState { remaining: count, first_error: None }),
            done: Condvar::new(),
        })
    }

    /// Reports one operation's result.
    pub(crate) fn complete(&self, result: Result<(), StoreError>) {
        let mut state = self.state.lock();
        assert!(state.remaining > 0, "completion reported more often than submitted");
        state.remaining -= 1;
        if let Err(error) = result {
            state.first_error.get_or_insert(error);
        }
        if state.remaining == 0 {
            self.done.notify_all();
        }
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
