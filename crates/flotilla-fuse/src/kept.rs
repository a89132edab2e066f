//! Files this mount closed but keeps the tokens of (GPFS keeps tokens past `close`: a file
//! read again soon is read from the cache, and nobody is asked for anything). While such a
//! file's read token is held, nobody else changed its bytes, so the kernel's pages of it are
//! still true and the next read-only open passes `FOPEN_KEEP_CACHE`.
//!
//! A record says whether the pages are worth keeping: a file this mount wrote or truncated
//! while it was open, or whose tokens were revoked meanwhile, is kept without them (its
//! tokens still save asking again). A revocation (`to: None`) removes the record, and any
//! open takes it out (records exist only for files nobody here has open). The pages are
//! kept only if the file's size and mtime at the next open are those at the close
//! (close-to-open, as NFS checks: a client that takes no tokens — a program that promised
//! disjoint writes — publishes both at its close). Bounded: past `kept_files_max` the least
//! recently closed file goes, and its tokens are given back. Pure bookkeeping;
//! `open_files.rs` and `coherence.rs` act on it.

use std::collections::{BTreeMap, HashMap};

/// A file's size and mtime (ns) as the metadata service gave them.
pub type Stamp = (u64, i64);

/// Closed files kept under their tokens, least recently closed first out.
#[derive(Debug)]
pub struct KeptFiles {
    /// File id → (close order, the stamp the kernel's pages go with, if they may be kept).
    files: HashMap<u64, (u64, Option<Stamp>)>,
    /// Close order → file id.
    order: BTreeMap<u64, u64>,
    next: u64,
    files_max: usize,
}

impl KeptFiles {
    pub fn new(files_max: usize) -> KeptFiles {
        KeptFiles { files: HashMap::new(), order: BTreeMap::new(), next: 0, files_max }
    }

    /// The last close of file `id` here; returns the files that no longer fit, whose
    /// tokens the caller gives back (with `kept_files_max = 0`, `id` itself).
    pub fn closed(&mut self, id: u64, pages: Option<Stamp>) -> Vec<u64> {
        self.remove(id);
        self.files.insert(id, (self.next, pages));
        self.order.insert(self.next, id);
        self.next += 1;
        let mut evicted = Vec::new();
        while self.files.len() > self.files_max {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.files.remove(&oldest);
            evicted.push(oldest);
        }
        self.check();
        evicted
    }

    /// An open of file `id`, whose stamp is now `stamp`: its record goes; whether the
    /// kernel may keep its pages.
    pub fn opened(&mut self, id: u64, stamp: Stamp) -> bool {
        self.remove(id).flatten() == Some(stamp)
    }

    /// Its tokens went (revoked, lost, given back): whether the file was kept here.
    pub fn given_back(&mut self, id: u64) -> bool {
        self.remove(id).is_some()
    }

    /// Every kept file, the records gone (at unmount: their tokens are given back).
    pub fn drain(&mut self) -> Vec<u64> {
        self.order.clear();
        self.files.drain().map(|(id, _)| id).collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.files.len()
    }

    fn remove(&mut self, id: u64) -> Option<Option<Stamp>> {
        let (order, pages) = self.files.remove(&id)?;
        self.order.remove(&order);
        Some(pages)
    }

    fn check(&self) {
        debug_assert_eq!(self.files.len(), self.order.len(), "every kept file has one place in the order");
        debug_assert!(self.files.len() <= self.files_max, "kept files within kept_files_max");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Stamp = (4096, 1_700_000_000_000_000_000);

    #[test]
    fn pages_are_kept_only_for_unchanged_files_until_a_revocation() {
        let mut kept = KeptFiles::new(8);
        assert!(kept.closed(1, Some(S)).is_empty());
        assert!(kept.closed(2, None).is_empty());
        assert!(kept.opened(1, S), "closed unchanged, no revocation since");
        assert!(!kept.opened(1, S), "the open took the record");
        assert!(!kept.opened(2, S), "written while open: pages not kept");
        kept.closed(3, Some(S));
        assert!(kept.given_back(3));
        assert!(!kept.opened(3, S), "revoked after its close");
        assert!(!kept.given_back(3));
        kept.closed(4, Some(S));
        assert!(!kept.opened(4, (S.0, S.1 + 1)), "changed by a client without tokens");
    }

    #[test]
    fn the_least_recently_closed_file_goes_first() {
        let mut kept = KeptFiles::new(2);
        kept.closed(1, Some(S));
        kept.closed(2, Some(S));
        kept.closed(1, None);
        assert_eq!(kept.closed(3, Some(S)), vec![2], "1 was closed again after 2");
        assert_eq!(kept.len(), 2);
        assert_eq!(KeptFiles::new(0).closed(9, Some(S)), vec![9], "nothing is kept with a bound of 0");
        let mut drained = kept.drain();
        drained.sort();
        assert_eq!(drained, vec![1, 3]);
        assert!(!kept.opened(1, S), "nothing is kept after a drain");
    }

    proptest! {
        /// Against a model: a list in close order, bounded, records removed by opens and
        /// revocations.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..3, 0u64..6, 0u64..3), 0..200)) {
            let mut kept = KeptFiles::new(3);
            let mut model: Vec<(u64, u64)> = Vec::new();
            // Size 0: pages not kept; otherwise the stamp's size.
            let stamp = |size: u64| (size > 0).then_some((size, 7));
            for (op, id, size) in ops {
                match op {
                    0 => {
                        model.retain(|(m, _)| *m != id);
                        model.push((id, size));
                        let over = model.len().saturating_sub(3);
                        let evicted: Vec<u64> = model.drain(..over).map(|(m, _)| m).collect();
                        prop_assert_eq!(kept.closed(id, stamp(size)), evicted);
                    }
                    1 => {
                        let kept_size = model.iter().find(|(m, _)| *m == id).map(|(_, s)| *s);
                        let expected = kept_size.is_some_and(|s| s > 0 && s == size.max(1));
                        model.retain(|(m, _)| *m != id);
                        prop_assert_eq!(kept.opened(id, (size.max(1), 7)), expected);
                    }
                    _ => {
                        let expected = model.iter().any(|(m, _)| *m == id);
                        model.retain(|(m, _)| *m != id);
                        prop_assert_eq!(kept.given_back(id), expected);
                    }
                }
                prop_assert_eq!(kept.len(), model.len());
            }
        }
    }
}
