//! The library's coherent attribute cache, pure bookkeeping (no I/O, no time): entries
//! keyed by the path a program asked for, each kept only while the client holds every inode
//! token the answer depends on (`Names` of each directory the lookup walked through, `Attr`
//! of the entry; see `flotilla-meta` `inode_tokens.rs`). An index from token to paths lets
//! a revocation drop every path that depends on it; a bounded LRU evicts, and a token no
//! cached path depends on any more is given back.
//!
//! Races: a grant's reply and a revocation travel on different requests. A revocation of a
//! token this cache does not hold (yet) is remembered while lookups are in flight, and a
//! grant whose sequence number it covers is not used; when no lookup is in flight nothing
//! is remembered (every grant made before was applied). The memory is bounded: past
//! `EARLY_MAX` revocations it collapses into one floor (no grant at or below it is used).

use flotilla_proto::{EntryInfo, InodeToken, InodeTokenKind};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A token: its kind and inode id.
pub type Key = (InodeTokenKind, u64);

/// Revocations remembered for grants in flight before they collapse into a floor.
const EARLY_MAX: usize = 4096;

struct Cached {
    entry: EntryInfo,
    /// Each token the entry depends on, with the grant's sequence number.
    deps: Vec<(Key, u64)>,
    /// Position in the LRU order.
    used: u64,
}

#[derive(Default)]
struct HeldToken {
    /// Newest grant applied.
    seq: u64,
    /// Cached paths depending on it.
    paths: HashSet<String>,
}

/// The cache. Every method returns the tokens to give back (batched by the caller).
pub struct AttrCache {
    entries: HashMap<String, Cached>,
    lru: BTreeMap<u64, String>,
    next_use: u64,
    held: HashMap<Key, HeldToken>,
    early: HashMap<Key, u64>,
    floor: u64,
    in_flight: usize,
    entries_max: usize,
}

impl AttrCache {
    pub fn new(entries_max: usize) -> AttrCache {
        AttrCache {
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            next_use: 0,
            held: HashMap::new(),
            early: HashMap::new(),
            floor: 0,
            in_flight: 0,
            entries_max: entries_max.max(1),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any token is held.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The cached entry of `path`, marked recently used.
    pub fn get(&mut self, path: &str) -> Option<EntryInfo> {
        let cached = self.entries.get_mut(path)?;
        self.lru.remove(&cached.used);
        self.next_use += 1;
        cached.used = self.next_use;
        self.lru.insert(cached.used, path.to_string());
        Some(cached.entry.clone())
    }

    /// A lookup that may bring grants is about to be sent.
    pub fn begin(&mut self) {
        self.in_flight += 1;
    }

    /// A lookup that brought no answer (failed) ended.
    pub fn abandon(&mut self) {
        self.end_flight();
    }

    fn end_flight(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.early.clear();
            self.floor = 0;
        }
    }

    /// A lookup's answer: caches `entry` under `path` if the grants cover it and none was
    /// revoked already; returns the tokens to give back.
    pub fn answer(&mut self, path: &str, entry: EntryInfo, grants: &[InodeToken]) -> Vec<InodeToken> {
        let mut give_back = Vec::new();
        let revoked = |cache: &AttrCache, token: &InodeToken| {
            token.seq <= cache.floor
                || cache.early.get(&(token.kind, token.id)).is_some_and(|seq| *seq >= token.seq)
        };
        let live: Vec<bool> = grants.iter().map(|t| !revoked(self, t)).collect();
        let usable = !grants.is_empty()
            && grants.iter().any(|t| t.kind == InodeTokenKind::Attr && t.id == entry.id)
            && live.iter().all(|l| *l);
        if usable {
            // The older answer goes first (what it alone held goes back at its older
            // grants, which the service keeps apart from the newer ones).
            self.remove(path, &mut give_back);
        }
        // Every live grant is held from now on (the service holds it), used or not.
        for (token, _) in grants.iter().zip(&live).filter(|(_, live)| **live) {
            let held = self.held.entry((token.kind, token.id)).or_default();
            held.seq = held.seq.max(token.seq);
        }
        if usable {
            for token in grants {
                if let Some(held) = self.held.get_mut(&(token.kind, token.id)) {
                    held.paths.insert(path.to_string());
                }
            }
            self.next_use += 1;
            let deps = grants.iter().map(|t| ((t.kind, t.id), t.seq)).collect();
            self.entries.insert(path.to_string(), Cached { entry, deps, used: self.next_use });
            self.lru.insert(self.next_use, path.to_string());
            while self.entries.len() > self.entries_max {
                let Some((_, oldest)) = self.lru.pop_first() else { break };
                self.remove(&oldest, &mut give_back);
            }
        }
        for token in grants {
            self.give_back_if_unused((token.kind, token.id), &mut give_back);
        }
        self.end_flight();
        give_back
    }

    /// A revocation of `token` (the newest grant it covers): drops every path depending on
    /// it; returns the tokens to give back (the revoked one among them).
    pub fn revoke(&mut self, token: InodeToken) -> Vec<InodeToken> {
        let key = (token.kind, token.id);
        let mut give_back = vec![token];
        if let Some(held) = self.held.get(&key) {
            let paths: Vec<String> = held.paths.iter().cloned().collect();
            for path in paths {
                let depends = self
                    .entries
                    .get(&path)
                    .is_some_and(|c| c.deps.iter().any(|(k, seq)| *k == key && *seq <= token.seq));
                if depends {
                    self.remove(&path, &mut give_back);
                }
            }
            if self.held.get(&key).is_some_and(|h| h.seq <= token.seq) {
                self.held.remove(&key);
            }
        }
        if self.in_flight > 0 {
            let seq = self.early.entry(key).or_insert(0);
            *seq = (*seq).max(token.seq);
            if self.early.len() > EARLY_MAX {
                self.floor = self.floor.max(self.early.values().copied().max().unwrap_or(0));
                self.early.clear();
            }
        }
        give_back
    }

    /// Drops everything (the service lost this client's tokens, or the caller changed).
    pub fn clear(&mut self) -> Vec<InodeToken> {
        let give_back = self
            .held
            .iter()
            .map(|((kind, id), held)| InodeToken { kind: *kind, id: *id, seq: held.seq })
            .collect();
        self.entries.clear();
        self.lru.clear();
        self.held.clear();
        give_back
    }

    /// Forgets everything without giving anything back (the service holds nothing).
    pub fn lose_all(&mut self) {
        self.clear();
        if self.in_flight > 0 {
            // Grants in flight were made before the loss was known: none of them is used.
            self.floor = u64::MAX;
        }
    }

    /// Drops the cached entry of `path` (if any).
    #[cfg(test)]
    pub fn forget(&mut self, path: &str) -> Vec<InodeToken> {
        let mut give_back = Vec::new();
        self.remove(path, &mut give_back);
        give_back
    }

    fn remove(&mut self, path: &str, give_back: &mut Vec<InodeToken>) {
        let Some(cached) = self.entries.remove(path) else { return };
        self.lru.remove(&cached.used);
        for (key, _) in cached.deps {
            if let Some(held) = self.held.get_mut(&key) {
                held.paths.remove(path);
            }
            self.give_back_if_unused(key, give_back);
        }
    }

    fn give_back_if_unused(&mut self, key: Key, give_back: &mut Vec<InodeToken>) {
        if self.held.get(&key).is_some_and(|h| h.paths.is_empty()) {
            let held = self.held.remove(&key).unwrap_or_default();
            give_back.push(InodeToken { kind: key.0, id: key.1, seq: held.seq });
        }
    }

    /// The tokens a cached path depends on (tests).
    #[cfg(test)]
    fn deps(&self, path: &str) -> Vec<(Key, u64)> {
        self.entries.get(path).map(|c| c.deps.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::EntryInfo;
    use flotilla_types::{Attributes, FileKind};
    use InodeTokenKind::{Attr, Names};

    fn entry(id: u64) -> EntryInfo {
        EntryInfo {
            id,
            attrs: Attributes {
                kind: FileKind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                size_bytes: 0,
                nlink: 1,
                atime_ns: 0,
                mtime_ns: 0,
                ctime_ns: 0,
                rdev: 0,
            },
            layout: None,
            subfiles: Vec::new(),
            symlink: None,
            capability: None,
            no_overlap: false,
            replicas: 1,
        }
    }

    fn token(kind: InodeTokenKind, id: u64, seq: u64) -> InodeToken {
        InodeToken { kind, id, seq }
    }

    #[test]
    fn a_revocation_drops_the_paths_that_depend_on_it_and_gives_back_unused_tokens() {
        let mut cache = AttrCache::new(10);
        cache.begin();
        let back =
            cache.answer("/d/a", entry(5), &[token(Names, 1, 1), token(Names, 2, 1), token(Attr, 5, 1)]);
        assert!(back.is_empty());
        cache.begin();
        cache.answer("/d/b", entry(6), &[token(Names, 1, 2), token(Names, 2, 2), token(Attr, 6, 2)]);
        assert_eq!(cache.get("/d/a").map(|e| e.id), Some(5));
        // Names(2) revoked: both paths go, and every token with them.
        let mut back = cache.revoke(token(Names, 2, 2));
        back.sort_by_key(|t| (t.kind, t.id));
        assert!(cache.is_empty() && !cache.holding());
        assert_eq!(back.len(), 5, "{back:?}");
    }

    #[test]
    fn a_revocation_before_its_grant_spoils_the_grant() {
        let mut cache = AttrCache::new(10);
        cache.begin();
        cache.revoke(token(Attr, 5, 3));
        let back = cache.answer("/a", entry(5), &[token(Names, 1, 3), token(Attr, 5, 3)]);
        assert!(cache.get("/a").is_none());
        assert_eq!(back, vec![token(Names, 1, 3)], "the unused live grant goes back");
        // A later grant of the same token is good.
        cache.begin();
        cache.answer("/a", entry(5), &[token(Names, 1, 4), token(Attr, 5, 4)]);
        assert!(cache.get("/a").is_some());
        assert_eq!(cache.deps("/a").len(), 2);
    }

    #[test]
    fn an_older_revocation_spares_a_newer_grant_only_for_paths_it_covers() {
        let mut cache = AttrCache::new(10);
        cache.begin();
        cache.answer("/a", entry(5), &[token(Names, 1, 1), token(Attr, 5, 1)]);
        cache.begin();
        cache.answer("/b", entry(5), &[token(Names, 1, 2), token(Attr, 5, 2)]);
        cache.revoke(token(Attr, 5, 1));
        assert!(cache.get("/a").is_none() && cache.get("/b").is_some());
    }

    #[test]
    fn the_lru_is_bounded_and_evicting_gives_back() {
        let mut cache = AttrCache::new(2);
        for i in 0..3u64 {
            cache.begin();
            let back = cache.answer(
                &format!("/f{i}"),
                entry(10 + i),
                &[token(Names, 1, i + 1), token(Attr, 10 + i, i + 1)],
            );
            if i == 2 {
                assert_eq!(back, vec![token(Attr, 10, 1)]);
            }
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.get("/f0").is_none());
    }

    proptest::proptest! {
        /// A model: the service's current generation of each token (bumped by a change
        /// that revokes it). Random interleavings of lookups (sent, answered later),
        /// revocations (delivered possibly before the grant's answer), evictions and reads
        /// never return an entry one of whose tokens was revoked after it was granted.
        #[test]
        fn never_an_entry_whose_token_was_revoked(ops in proptest::collection::vec((0u8..5, 0u64..4, 0u64..3), 1..120)) {
            let mut cache = AttrCache::new(3);
            let mut seq = 0u64;
            // Per key, the last seq that was revoked (a change since that grant).
            let mut revoked: HashMap<Key, u64> = HashMap::new();
            // Lookups in flight: (path index, grants).
            let mut flying: Vec<(u64, Vec<InodeToken>)> = Vec::new();
            // Per key, the grants handed out (for the service's revocations).
            let mut granted: HashMap<Key, u64> = HashMap::new();
            let keys_of = |p: u64| vec![(Names, 100 + p % 2), (Attr, p)];
            for (op, p, d) in ops {
                match op {
                    0 => {
                        // The service registers grants and answers later.
                        seq += 1;
                        let grants: Vec<InodeToken> = keys_of(p).into_iter().map(|(k, id)| token(k, id, seq)).collect();
                        for g in &grants {
                            granted.insert((g.kind, g.id), seq);
                        }
                        cache.begin();
                        flying.push((p, grants));
                    }
                    1 if !flying.is_empty() => {
                        let (p, grants) = flying.remove((d as usize) % flying.len());
                        cache.answer(&format!("/p{p}"), entry(p), &grants);
                    }
                    2 => {
                        // A change touches a key: its holders are revoked at their newest grant.
                        let key = if d == 0 { (Names, 100 + p % 2) } else { (Attr, p) };
                        if let Some(s) = granted.remove(&key) {
                            revoked.insert(key, s);
                            cache.revoke(token(key.0, key.1, s));
                        } else {
                            revoked.insert(key, seq);
                        }
                    }
                    3 => {
                        let path = format!("/p{p}");
                        cache.forget(&path);
                    }
                    _ => {
                        let path = format!("/p{p}");
                        if cache.get(&path).is_some() {
                            for (key, s) in cache.deps(&path) {
                                let bad = revoked.get(&key).is_some_and(|r| *r >= s);
                                proptest::prop_assert!(!bad, "{} served after {:?} was revoked", path, key);
                            }
                        }
                    }
                }
            }
        }
    }
}
