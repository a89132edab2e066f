//! The capabilities this client holds, one per file: handed out by the metadata service with
//! every file entry, attached to every request to an I/O server, and renewed before they run
//! out (at half their lifetime, measured on this client's clock from when each arrived, so
//! clock skew between client and service does not matter) or when a request needs a right
//! the held one lacks. Pure bookkeeping; `Core` does the calls.

use flotilla_proto::{Capability, Rights};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Files whose capabilities one client keeps at most; past it, the ones nearest renewal go.
pub const CAPABILITIES_MAX: usize = 65_536;

struct Held {
    capability: Arc<Capability>,
    renew_at: Instant,
}

/// The held capabilities, by file id.
#[derive(Default)]
pub struct CapabilityCache {
    held: HashMap<u64, Held>,
}

impl CapabilityCache {
    /// Keeps `capability` (which arrived at `now`) unless the one held for its file grants
    /// more and is not yet due for renewal.
    pub fn remember(&mut self, capability: Capability, now: Instant) {
        let file = capability.file.0;
        if let Some(held) = self.held.get(&file) {
            let narrower = !capability.rights.contains(held.capability.rights);
            if narrower && now < held.renew_at {
                return;
            }
        }
        if self.held.len() >= CAPABILITIES_MAX && !self.held.contains_key(&file) {
            self.evict_one();
        }
        let renew_at = now + Duration::from_millis(capability.lifetime_ms() / 2);
        self.held.insert(file, Held { capability: Arc::new(capability), renew_at });
    }

    /// The capability for `file` if one is held that grants `wanted` and is not due for
    /// renewal at `now`.
    pub fn fresh(&self, file: u64, wanted: Rights, now: Instant) -> Option<Arc<Capability>> {
        self.held
            .get(&file)
            .filter(|held| held.capability.rights.contains(wanted) && now < held.renew_at)
            .map(|held| held.capability.clone())
    }

    /// The capability held for `file`, due or not (used when renewal failed: the servers
    /// judge its expiry).
    pub fn any(&self, file: u64) -> Option<Arc<Capability>> {
        self.held.get(&file).map(|held| held.capability.clone())
    }

    /// Forgets `file`'s capability (the server said it expired).
    pub fn forget(&mut self, file: u64) {
        self.held.remove(&file);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    fn evict_one(&mut self) {
        let oldest = self.held.iter().min_by_key(|(_, held)| held.renew_at).map(|(file, _)| *file);
        if let Some(file) = oldest {
            self.held.remove(&file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_types::FileId;

    fn capability(file: u64, rights: Rights, lifetime_ms: u64) -> Capability {
        Capability {
            file: FileId(file),
            subfiles: 1,
            rights,
            holder: "c".into(),
            issued_unix_ms: 1_000,
            expires_unix_ms: 1_000 + lifetime_ms,
            tag: [0; 32],
        }
    }

    #[test]
    fn a_capability_is_fresh_until_half_its_lifetime() {
        let now = Instant::now();
        let mut cache = CapabilityCache::default();
        cache.remember(capability(1, Rights::READ, 10_000), now);
        assert!(cache.fresh(1, Rights::READ, now + Duration::from_millis(4_999)).is_some());
        assert!(cache.fresh(1, Rights::READ, now + Duration::from_millis(5_000)).is_none());
        assert!(cache.fresh(1, Rights::WRITE, now).is_none(), "a right it lacks makes it not fresh");
        assert!(cache.any(1).is_some());
        cache.forget(1);
        assert!(cache.any(1).is_none());
    }

    #[test]
    fn a_narrower_capability_does_not_replace_a_fresh_wider_one() {
        let now = Instant::now();
        let mut cache = CapabilityCache::default();
        let all = Rights::READ.union(Rights::WRITE);
        cache.remember(capability(1, all, 10_000), now);
        cache.remember(capability(1, Rights::READ, 10_000), now);
        assert!(cache.fresh(1, Rights::WRITE, now).is_some());
        cache.remember(capability(1, Rights::READ, 10_000), now + Duration::from_secs(6));
        assert_eq!(cache.any(1).unwrap().rights, Rights::READ, "a due wider one is replaced");
    }

    #[test]
    fn the_cache_is_bounded() {
        let now = Instant::now();
        let mut cache = CapabilityCache::default();
        for file in 0..(CAPABILITIES_MAX as u64 + 10) {
            cache.remember(capability(file, Rights::READ, 10_000 + file), now);
        }
        assert_eq!(cache.len(), CAPABILITIES_MAX);
        assert!(cache.any(0).is_none(), "the one nearest renewal went first");
    }
}
