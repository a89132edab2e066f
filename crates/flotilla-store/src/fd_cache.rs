//! A bounded cache of open fork files.
//!
//! Each `Fork` keeps its open block I/O in its own slot; this cache only decides which forks
//! may keep theirs. When more than `fds_max` forks hold an open file, the least recently used
//! one is closed (its slot emptied; an operation that still holds the `Arc` finishes first,
//! and the next use reopens the file by path).
//!
//! Invariants: at most `fds_max` entries; an entry exists for every fork whose slot is full,
//! except briefly while `install` runs. Eviction scans the entries (at most `fds_max + 1`),
//! which only happens when a file is opened.

use crate::backend::ForkBackend;
use crate::error::StoreError;
use crate::fork::Fork;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Weak};

#[derive(Debug)]
struct FdEntry {
    fork: Weak<Fork>,
    last_use: u64,
}

#[derive(Debug, Default)]
struct FdState {
    entries: HashMap<u64, FdEntry>,
    clock: u64,
}

/// Which forks keep an open file.
#[derive(Debug)]
pub(crate) struct FdCache {
    fds_max: usize,
    state: Mutex<FdState>,
}

impl FdCache {
    pub(crate) fn new(fds_max: usize) -> Self {
        assert!(fds_max > 0);
        Self { fds_max, state: Mutex::new(FdState::default()) }
    }

    /// Number of forks holding an open file.
    pub(crate) fn open_count(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// The fork's block I/O, reopening its file if it was closed.
    pub(crate) fn backend(&self, fork: &Arc<Fork>) -> Result<Arc<dyn ForkBackend>, StoreError> {
        if let Some(backend) = fork.cached_backend() {
            self.touch(fork.serial());
            return Ok(backend);
        }
        let backend = fork.target().reopen_fork(fork.path()).map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => fork.unknown(),
            _ => StoreError::io(format!("open {fork}"), error),
        })?;
        self.install(fork, backend.clone());
        Ok(backend)
    }

    /// Gives `fork` an open file, closing the least recently used others over the limit.
    pub(crate) fn install(&self, fork: &Arc<Fork>, backend: Arc<dyn ForkBackend>) {
        fork.set_backend(Some(backend));
        let victims = {
            let mut state = self.state.lock();
            state.clock += 1;
            let entry = FdEntry { fork: Arc::downgrade(fork), last_use: state.clock };
            state.entries.insert(fork.serial(), entry);
            self.evict_over_limit(&mut state, fork.serial())
        };
        for victim in victims.iter().filter_map(Weak::upgrade) {
            victim.set_backend(None);
        }
    }

    fn evict_over_limit(&self, state: &mut FdState, keep: u64) -> Vec<Weak<Fork>> {
        let mut victims = Vec::new();
        while state.entries.len() > self.fds_max {
            let oldest = state
                .entries
                .iter()
                .filter(|(serial, _)| **serial != keep)
                .min_by_key(|(_, entry)| (entry.fork.strong_count() > 0, entry.last_use))
                .map(|(serial, _)| *serial);
            let Some(serial) = oldest else { break };
            if let Some(entry) = state.entries.remove(&serial) {
                victims.push(entry.fork);
            }
        }
        victims
    }

    fn touch(&self, serial: u64) {
        let mut state = self.state.lock();
        state.clock += 1;
        let now = state.clock;
        if let Some(entry) = state.entries.get_mut(&serial) {
            entry.last_use = now;
        }
    }

    /// Closes the fork's file and drops its entry (removal, or the fork is going away).
    pub(crate) fn forget(&self, fork: &Fork) {
        self.state.lock().entries.remove(&fork.serial());
        fork.set_backend(None);
    }
}
