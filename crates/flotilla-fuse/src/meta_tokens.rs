//! Names and attributes the kernel caches under inode tokens (issue 34; the service side is
//! `flotilla-meta` `inode_tokens.rs`). A lookup or `getattr` answered with tokens
//! (`InodeCached`) is given to the kernel with long timeouts; what was given is recorded —
//! (directory, name) pairs under `Names(directory)`, inodes under `Attr(inode)` — and a
//! poll thread turns each revocation into the kernel invalidations it needs
//! (`FUSE_NOTIFY_INVAL_ENTRY` for every recorded name of the directory,
//! `FUSE_NOTIFY_INVAL_INODE` for the inode's attributes) *before* it gives the token back,
//! so a change another mount makes is out of this kernel when it returns there. A poll that
//! fails, or the service saying the tokens are lost, invalidates everything recorded.
//!
//! Invariants:
//! - a name is recorded before the reply that hands it to the kernel goes (an invalidation
//!   is only sent for what was recorded; the kernel's lookup holds the directory's lock
//!   shared, which `inval_entry` waits for, so it cannot overtake the reply);
//! - an answer is cached long only if no revocation was handled between sending its
//!   request and recording it (`generation`): such a revocation might have been of the very
//!   grant the answer came with, before the answer was recorded;
//! - at most `recorded_max` names and inodes are recorded; past it answers get timeout 0
//!   (the kernel asks again each time), never a long timeout nobody could revoke.
//!
//! This mount's own changes carry its session (`ChangedBy`): the service revokes none of its
//! tokens for them (the kernel updates its own caches after its own changes, and a
//! revocation of `Names(dir)` would wait for the directory lock the changing syscall holds).

use flotilla_client::{InodeToken, InodeTokenKind};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::time::Duration;

/// Settings of the metadata cache.
#[derive(Clone, Copy, Debug)]
pub struct MetaTokenSettings {
    /// Timeout of names and attributes held under tokens.
    pub timeout: Duration,
    /// Most (directory, name) pairs and inodes recorded at once.
    pub recorded_max: usize,
}

/// One thing the kernel must drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// The name `.1` in directory `.0`.
    Entry(u64, OsString),
    /// The attributes of an inode.
    Attributes(u64),
}

#[derive(Default)]
struct Recorded {
    names: HashMap<u64, HashSet<OsString>>,
    attributes: HashSet<u64>,
    count: usize,
    /// Revocations handled so far (and losses): an answer asked before the last one is not
    /// cached long.
    generation: u64,
}

/// What this mount gave the kernel under tokens.
pub struct MetaTokens {
    recorded: parking_lot::Mutex<Recorded>,
    settings: MetaTokenSettings,
}

/// The timeouts one answer goes to the kernel with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub entry: Duration,
    pub attributes: Duration,
}

impl Timeouts {
    pub const NONE: Timeouts = Timeouts { entry: Duration::ZERO, attributes: Duration::ZERO };
}

fn grants_cover(grants: &[InodeToken], kind: InodeTokenKind, id: u64) -> bool {
    grants.iter().any(|token| token.kind == kind && token.id == id)
}

impl MetaTokens {
    pub fn new(settings: MetaTokenSettings) -> MetaTokens {
        MetaTokens { recorded: parking_lot::Mutex::new(Recorded::default()), settings }
    }

    /// The generation to pass to `record_*` for an answer whose request is sent now.
    pub fn generation(&self) -> u64 {
        self.recorded.lock().generation
    }

    /// Records a lookup's answer (`id`: the entry found; `None` for a name that does not
    /// exist) and returns its timeouts.
    pub fn record_lookup(
        &self,
        asked_at: u64,
        (parent, name): (u64, &OsStr),
        id: Option<u64>,
        grants: &[InodeToken],
    ) -> Timeouts {
        let mut recorded = self.recorded.lock();
        if recorded.generation != asked_at || !grants_cover(grants, InodeTokenKind::Names, parent) {
            return Timeouts::NONE;
        }
        let entry = recorded.record_name(parent, name, self.settings.recorded_max);
        let attributes = match id {
            Some(id) if entry && grants_cover(grants, InodeTokenKind::Attr, id) => {
                recorded.record_attributes(id, self.settings.recorded_max)
            }
            _ => false,
        };
        Timeouts { entry: self.long(entry), attributes: self.long(attributes) }
    }

    /// Records an attribute read of `id` and returns its attribute timeout.
    pub fn record_attributes(&self, asked_at: u64, id: u64, grants: &[InodeToken]) -> Duration {
        let mut recorded = self.recorded.lock();
        let held = recorded.generation == asked_at
            && grants_cover(grants, InodeTokenKind::Attr, id)
            && recorded.record_attributes(id, self.settings.recorded_max);
        self.long(held)
    }

    fn long(&self, held: bool) -> Duration {
        if held {
            self.settings.timeout
        } else {
            Duration::ZERO
        }
    }

    /// The invalidations `revoked` needs (to be sent before the tokens go back).
    pub fn revoke(&self, revoked: &[InodeToken]) -> Vec<Invalidation> {
        let mut recorded = self.recorded.lock();
        recorded.generation += 1;
        let mut invalidations = Vec::new();
        for token in revoked {
            match token.kind {
                InodeTokenKind::Names => {
                    let names = recorded.names.remove(&token.id).unwrap_or_default();
                    recorded.count -= names.len();
                    invalidations.extend(names.into_iter().map(|name| Invalidation::Entry(token.id, name)));
                }
                InodeTokenKind::Attr => {
                    if recorded.attributes.remove(&token.id) {
                        recorded.count -= 1;
                    }
                    // Also when not recorded: the kernel may hold it from before a loss.
                    invalidations.push(Invalidation::Attributes(token.id));
                }
            }
        }
        invalidations
    }

    /// Everything recorded, to invalidate (the tokens were lost, or the polls failed).
    pub fn drop_all(&self) -> Vec<Invalidation> {
        let mut recorded = self.recorded.lock();
        recorded.generation += 1;
        recorded.count = 0;
        let names = std::mem::take(&mut recorded.names);
        let attributes = std::mem::take(&mut recorded.attributes);
        let mut invalidations: Vec<Invalidation> = names
            .into_iter()
            .flat_map(|(dir, names)| names.into_iter().map(move |name| Invalidation::Entry(dir, name)))
            .collect();
        invalidations.extend(attributes.into_iter().map(Invalidation::Attributes));
        invalidations
    }

    /// Whether anything is recorded (the poll tells the service it holds tokens).
    pub fn holds_any(&self) -> bool {
        self.recorded.lock().count > 0
    }
}

/// How long one poll waits for revocations at most (the service bounds it further).
const POLL_WAIT_MS: u64 = 1_000;
/// Pause after a failed poll before the next.
const POLL_RETRY_MS: u64 = 100;

/// The poll thread: waits for revocations, has the kernel drop what each covers, then gives
/// the tokens back; until `stop`.
pub fn poll(
    client: flotilla_client::Client,
    cache: std::sync::Arc<MetaTokens>,
    notifier: fuser::Notifier,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match client.inode_token_wait(cache.holds_any(), POLL_WAIT_MS) {
            Ok((revoked, lost)) => {
                if lost {
                    tracing::info!("the metadata service holds none of this mount's inode tokens; dropping the kernel's cache");
                    invalidate(&notifier, cache.drop_all());
                }
                if revoked.is_empty() {
                    continue;
                }
                invalidate(&notifier, cache.revoke(&revoked));
                if let Err(error) = client.inode_token_release(&revoked) {
                    tracing::warn!(%error, "giving inode tokens back failed");
                }
            }
            Err(error) => {
                // The service may revoke without this mount hearing of it: trust nothing.
                tracing::warn!(%error, "polling for inode token revocations failed; dropping the kernel's cache");
                invalidate(&notifier, cache.drop_all());
                std::thread::sleep(Duration::from_millis(POLL_RETRY_MS));
            }
        }
    }
}

fn invalidate(notifier: &fuser::Notifier, invalidations: Vec<Invalidation>) {
    for invalidation in invalidations {
        let sent = match &invalidation {
            Invalidation::Entry(dir, name) => notifier.inval_entry(fuser::INodeNo(*dir), name),
            Invalidation::Attributes(id) => notifier.inval_inode(fuser::INodeNo(*id), -1, 0),
        };
        // ENOENT (the kernel no longer has it) is no error; fuser passes it as Ok.
        if let Err(error) = sent {
            tracing::warn!(%error, ?invalidation, "the kernel refused an invalidation");
        }
    }
}

impl Recorded {
    fn record_name(&mut self, parent: u64, name: &OsStr, recorded_max: usize) -> bool {
        if self.names.get(&parent).is_some_and(|names| names.contains(name)) {
            return true;
        }
        if self.count >= recorded_max {
            return false;
        }
        self.names.entry(parent).or_default().insert(name.to_os_string());
        self.count += 1;
        true
    }

    fn record_attributes(&mut self, id: u64, recorded_max: usize) -> bool {
        if self.attributes.contains(&id) {
            return true;
        }
        if self.count >= recorded_max {
            return false;
        }
        self.attributes.insert(id);
        self.count += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InodeTokenKind::{Attr, Names};

    fn token(kind: InodeTokenKind, id: u64, seq: u64) -> InodeToken {
        InodeToken { kind, id, seq }
    }

    fn tokens(recorded_max: usize) -> MetaTokens {
        MetaTokens::new(MetaTokenSettings { timeout: Duration::from_secs(600), recorded_max })
    }

    #[test]
    fn a_revocation_invalidates_what_was_recorded_under_it() {
        let cache = tokens(8);
        let asked = cache.generation();
        let grants = [token(Names, 1, 5), token(Attr, 9, 5)];
        let long = cache.record_lookup(asked, (1, OsStr::new("a")), Some(9), &grants);
        assert_eq!(long, Timeouts { entry: Duration::from_secs(600), attributes: Duration::from_secs(600) });
        let invalidations = cache.revoke(&[token(Names, 1, 5)]);
        assert_eq!(invalidations, vec![Invalidation::Entry(1, "a".into())]);
        assert_eq!(cache.revoke(&[token(Attr, 9, 5)]), vec![Invalidation::Attributes(9)]);
        assert!(!cache.holds_any());
    }

    #[test]
    fn an_answer_overtaken_by_a_revocation_or_without_grants_is_not_cached() {
        let cache = tokens(8);
        let asked = cache.generation();
        cache.revoke(&[token(Names, 1, 5)]);
        let grants = [token(Names, 1, 5), token(Attr, 9, 5)];
        assert_eq!(cache.record_lookup(asked, (1, OsStr::new("a")), Some(9), &grants), Timeouts::NONE);
        let now = cache.generation();
        assert_eq!(cache.record_lookup(now, (1, OsStr::new("a")), Some(9), &[]), Timeouts::NONE);
        assert_eq!(cache.record_attributes(now, 9, &[token(Attr, 8, 1)]), Duration::ZERO);
        assert!(!cache.holds_any(), "nothing recorded that could not be revoked");
    }

    #[test]
    fn past_the_bound_answers_get_no_timeout_and_a_loss_drops_everything() {
        let cache = tokens(2);
        let asked = cache.generation();
        let grants = |id| [token(Names, 1, 1), token(Attr, id, 1)];
        let first = cache.record_lookup(asked, (1, OsStr::new("a")), Some(10), &grants(10));
        assert!(first.entry > Duration::ZERO && first.attributes > Duration::ZERO);
        let second = cache.record_lookup(asked, (1, OsStr::new("b")), Some(11), &grants(11));
        assert_eq!(second, Timeouts::NONE, "two recorded already");
        let mut dropped = cache.drop_all();
        dropped.sort_by_key(|i| format!("{i:?}"));
        assert_eq!(dropped, vec![Invalidation::Attributes(10), Invalidation::Entry(1, "a".into())]);
        assert!(!cache.holds_any());
    }
}
