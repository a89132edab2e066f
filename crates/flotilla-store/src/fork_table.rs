//! The forks of one target that are in use, by (file, subfile, name).
//!
//! Entries are weak: a fork stays in use while a request, a cached block or a write-back
//! holds it, and is forgotten once none does (by then every dirty block of it was written,
//! so its size on disk is its logical size). Dead entries are pruned when the table has
//! grown to twice its live size, so it stays bounded by the forks in use.

use crate::fork::Fork;
use flotilla_types::{FileId, SubfileIndex};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

const PRUNE_ENTRIES_MIN: usize = 1024;

type SubfileForks = HashMap<String, Weak<Fork>>;

/// Live forks of one target.
#[derive(Debug)]
pub(crate) struct ForkTable {
    subfiles: HashMap<(FileId, SubfileIndex), SubfileForks>,
    entries: usize,
    prune_at_entries: usize,
}

impl ForkTable {
    pub(crate) fn new() -> Self {
        Self { subfiles: HashMap::new(), entries: 0, prune_at_entries: PRUNE_ENTRIES_MIN }
    }

    pub(crate) fn get(&self, file: FileId, subfile: SubfileIndex, name: &str) -> Option<Arc<Fork>> {
        self.subfiles.get(&(file, subfile))?.get(name)?.upgrade()
    }

    /// Inserts `fork` unless a live fork of that name is there; returns the one in use.
    pub(crate) fn insert(&mut self, file: FileId, subfile: SubfileIndex, fork: Arc<Fork>) -> Arc<Fork> {
        if let Some(existing) = self.get(file, subfile, fork.name()) {
            return existing;
        }
        let forks = self.subfiles.entry((file, subfile)).or_default();
        if forks.insert(fork.name().to_string(), Arc::downgrade(&fork)).is_none() {
            self.entries += 1;
        }
        if self.entries >= self.prune_at_entries {
            self.prune();
        }
        fork
    }

    pub(crate) fn remove(&mut self, file: FileId, subfile: SubfileIndex, name: &str) {
        let Some(forks) = self.subfiles.get_mut(&(file, subfile)) else {
            return;
        };
        if forks.remove(name).is_some() {
            self.entries -= 1;
        }
        if forks.is_empty() {
            self.subfiles.remove(&(file, subfile));
        }
    }

    /// Removes and returns the live forks of a subfile.
    pub(crate) fn take_subfile(&mut self, file: FileId, subfile: SubfileIndex) -> Vec<Arc<Fork>> {
        let Some(forks) = self.subfiles.remove(&(file, subfile)) else {
            return Vec::new();
        };
        self.entries -= forks.len();
        forks.values().filter_map(Weak::upgrade).collect()
    }

    /// The live forks of a subfile.
    pub(crate) fn subfile(&self, file: FileId, subfile: SubfileIndex) -> Vec<Arc<Fork>> {
        self.subfiles
            .get(&(file, subfile))
            .map(|forks| forks.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default()
    }

    /// Every live fork.
    pub(crate) fn all(&self) -> Vec<Arc<Fork>> {
        self.subfiles.values().flat_map(|forks| forks.values().filter_map(Weak::upgrade)).collect()
    }

    fn prune(&mut self) {
        self.subfiles.retain(|_, forks| {
            forks.retain(|_, fork| fork.strong_count() > 0);
            !forks.is_empty()
        });
        self.entries = self.subfiles.values().map(HashMap::len).sum();
        self.prune_at_entries = (self.entries * 2).max(PRUNE_ENTRIES_MIN);
    }
}
