//! The library's attribute cache under inode tokens (issue 12; GPFS §2's inode tokens as
//! read leases): `Client::stat` answers from [`AttrCache`] while the client holds the
//! tokens of every directory on the path and of the entry, so a change acknowledged to any
//! client is never followed by a stat here that returns what it replaced.
//!
//! Misses ask `LookupCached` (creates `CreateOpenCached`), whose replies carry the grants.
//! A poll thread (`InodeTokenWait`, started at the first grant) collects revocations, drops
//! what depends on them and gives them back (`InodeTokenRelease`) — the service waits for
//! that before it acknowledges the change. The cache is used only while the polls are
//! fresh: a poll sent at `p` whose events were applied makes the cache usable until
//! `p + lease_ms`, below the service's bounded wait (`token_wait_ms_max`), so a client
//! whose poll thread is stopped, cut off or slow stops answering from the cache before a
//! change that gave up waiting for it is acknowledged.

use crate::attr_cache::AttrCache;
use crate::transport::{MetaLine, WeakMetaLine};
use flotilla_proto::{EntryInfo, InodeToken, MetaReply, MetaRequest, INODE_TOKENS_PER_REQUEST_MAX};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tokens given back from lookups (evictions, spoiled grants) wait for the next poll (at
/// most half a lease away), up to this many.
const PENDING_RELEASES_MAX: usize = 1 << 16;

/// Settings of the attribute cache.
#[derive(Clone, Copy, Debug)]
pub struct AttrSettings {
    /// Paths cached at most (least recently used go first, giving their tokens back).
    pub entries_max: usize,
    /// How long one poll keeps the cache usable; must stay well below the metadata
    /// service's `token_wait_ms_max` (1 s by default). Polls are sent every half of it.
    pub lease_ms: u64,
}

impl Default for AttrSettings {
    fn default() -> Self {
        AttrSettings { entries_max: 32_768, lease_ms: 500 }
    }
}

struct State {
    cache: AttrCache,
    /// Until when the cache may answer (set by the poll thread).
    fresh_until: Option<Instant>,
    polling: bool,
    /// Tokens to give back with the next poll.
    pending: Vec<InodeToken>,
}

pub(crate) struct AttrLeases {
    enabled: AtomicBool,
    settings: AttrSettings,
    state: Arc<parking_lot::Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl AttrLeases {
    pub fn new(enabled: bool, settings: AttrSettings) -> AttrLeases {
        let state = State {
            cache: AttrCache::new(settings.entries_max),
            fresh_until: None,
            polling: false,
            pending: Vec::new(),
        };
        AttrLeases {
            enabled: AtomicBool::new(enabled),
            settings,
            state: Arc::new(parking_lot::Mutex::new(state)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Turns the cache off (a service that does not know `LookupCached`).
    pub fn disable(&self) {
        self.enabled.store(false, Ordering::SeqCst);
        let mut state = self.state.lock();
        let back = state.cache.clear();
        state.pending.extend(back);
    }

    /// The cached entry of `path`, while the polls are fresh.
    pub fn cached(&self, path: &str) -> Option<EntryInfo> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.state.lock();
        if state.fresh_until.is_none_or(|until| Instant::now() >= until) {
            return None;
        }
        state.cache.get(path)
    }

    /// A request that may bring grants is about to be sent; starts the poll thread, which
    /// asks over `line`.
    pub fn begin(&self, line: WeakMetaLine) {
        let mut state = self.state.lock();
        state.cache.begin();
        if !state.polling {
            state.polling = true;
            let (weak, state_ref, stop) = (line, self.state.clone(), self.stop.clone());
            let lease = Duration::from_millis(self.settings.lease_ms.max(2));
            let spawned = std::thread::Builder::new()
                .name("flotilla-attrs".into())
                .spawn(move || poll(weak, state_ref, stop, lease));
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start the inode token poll thread; not caching attributes");
                self.enabled.store(false, Ordering::SeqCst);
            }
        }
    }

    /// The request sent after `begin` failed.
    pub fn abandon(&self) {
        self.state.lock().cache.abandon();
    }

    /// The answer to a request sent after `begin`. (It may run on the client's runtime, so
    /// what goes back is sent by the poll thread.)
    pub fn answer(&self, path: &str, entry: &EntryInfo, grants: &[InodeToken]) {
        let mut state = self.state.lock();
        let back = state.cache.answer(path, entry.clone(), grants);
        if state.pending.len() + back.len() > PENDING_RELEASES_MAX {
            // Never sent: the service drops them when a change revokes them (the client
            // then gives them back at once) or when the session ends.
            tracing::debug!(tokens = back.len(), "too many inode tokens waiting to be given back");
            return;
        }
        state.pending.extend(back);
    }

    /// Drops everything cached (the caller identity changed).
    pub fn clear(&self) {
        let mut state = self.state.lock();
        let back = state.cache.clear();
        state.pending.extend(back);
    }
}

impl Drop for AttrLeases {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Gives `tokens` back, in requests of at most `INODE_TOKENS_PER_REQUEST_MAX`.
fn release(line: &MetaLine, tokens: Vec<InodeToken>) {
    let session = line.session();
    for chunk in tokens.chunks(INODE_TOKENS_PER_REQUEST_MAX) {
        let request = MetaRequest::InodeTokenRelease { session, tokens: chunk.to_vec() };
        match line.call(request) {
            Ok(MetaReply::Done) => {}
            Ok(other) => tracing::warn!(reply = ?other, "unexpected reply to an inode token release"),
            Err(error) => tracing::debug!(%error, "giving inode tokens back failed"),
        }
    }
}

/// The poll thread: collects revocations, drops what depends on them, gives them back and
/// keeps the cache fresh, until the client is gone.
fn poll(weak: WeakMetaLine, state: Arc<parking_lot::Mutex<State>>, stop: Arc<AtomicBool>, lease: Duration) {
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(line) = weak.upgrade() else { return };
        let (holding, first, pending) = {
            let mut state = state.lock();
            (state.cache.holding(), state.fresh_until.is_none(), std::mem::take(&mut state.pending))
        };
        if !pending.is_empty() {
            release(&line, pending);
        }
        let session = line.session();
        // The first poll returns at once, so the cache is usable from the first answer on.
        let wait_ms = if first { 0 } else { (lease.as_millis() as u64 / 2).max(1) };
        let sent = Instant::now();
        let polled = line.call(MetaRequest::InodeTokenWait { session, holding, wait_ms });
        match polled {
            Ok(MetaReply::InodeEvents { revokes, lost }) => {
                let mut back = Vec::new();
                {
                    let mut state = state.lock();
                    if lost {
                        tracing::debug!("the metadata service holds none of this client's inode tokens");
                        state.cache.lose_all();
                    }
                    for token in revokes {
                        back.extend(state.cache.revoke(token));
                    }
                    state.fresh_until = Some(sent + lease);
                }
                if !back.is_empty() {
                    release(&line, back);
                }
            }
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected reply to an inode token poll");
                drop(line);
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => {
                tracing::debug!(%error, "inode token poll failed; polling again");
                drop(line);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
