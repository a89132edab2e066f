//! What a change touched, for the metadata service's inode tokens: a thread that asks
//! (`recording`) gets the inodes whose records its write transactions wrote or removed
//! (`Attr`), and the directories whose existing entries were removed or replaced, or whose
//! search permission (mode, owner, group) changed, or that were removed (`Names`); and
//! (`walking`) the directories its path walks went through. Both are off on every thread
//! that did not ask, and may over-count (a transaction that then failed): a token revoked
//! for nothing costs a cache miss, never a stale answer.

use std::cell::RefCell;

/// One thing a change touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Touched {
    /// The inode's record (attributes, layout, symlink target, hints).
    Attr(u64),
    /// The directory's existing names or its search permission.
    Names(u64),
}

thread_local! {
    static TOUCHED: RefCell<Option<Vec<Touched>>> = const { RefCell::new(None) };
    static WALKED: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
}

/// Runs `body` and returns what the namespace changes it made on this thread touched,
/// sorted and without duplicates. A `recording` inside another keeps its own.
pub fn recording<R>(body: impl FnOnce() -> R) -> (R, Vec<Touched>) {
    let outer = TOUCHED.with(|t| t.borrow_mut().replace(Vec::new()));
    let value = body();
    let mut touched = TOUCHED.with(|t| std::mem::replace(&mut *t.borrow_mut(), outer)).unwrap_or_default();
    touched.sort_unstable();
    touched.dedup();
    (value, touched)
}

/// Runs `body` and returns the directories the path walks it made on this thread went
/// through (the parent of each component looked up), in order, without duplicates.
pub fn walking<R>(body: impl FnOnce() -> R) -> (R, Vec<u64>) {
    let outer = WALKED.with(|w| w.borrow_mut().replace(Vec::new()));
    let value = body();
    let walked = WALKED.with(|w| std::mem::replace(&mut *w.borrow_mut(), outer)).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    (value, walked.into_iter().filter(|id| seen.insert(*id)).collect())
}

pub(crate) fn note(touched: Touched) {
    TOUCHED.with(|t| {
        if let Some(list) = t.borrow_mut().as_mut() {
            list.push(touched);
        }
    });
}

pub(crate) fn note_walk(dir: u64) {
    WALKED.with(|w| {
        if let Some(list) = w.borrow_mut().as_mut() {
            list.push(dir);
        }
    });
}

/// Whether a change is being recorded on this thread (to skip the work otherwise).
pub(crate) fn is_recording() -> bool {
    TOUCHED.with(|t| t.borrow().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_asking_threads_record_and_inner_recordings_keep_their_own() {
        note(Touched::Attr(1));
        let ((), outer) = recording(|| {
            note(Touched::Names(2));
            let ((), inner) = recording(|| note(Touched::Attr(3)));
            assert_eq!(inner, vec![Touched::Attr(3)]);
            note(Touched::Names(2));
        });
        assert_eq!(outer, vec![Touched::Names(2)]);
        let ((), walked) = walking(|| [1, 5, 1, 7].into_iter().for_each(note_walk));
        assert_eq!(walked, vec![1, 5, 7]);
    }
}
