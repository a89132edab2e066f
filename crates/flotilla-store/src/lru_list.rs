//! An intrusive doubly linked list over the indices `0..capacity`, with O(1) push, remove
//! and lookup at either end and no allocation after construction.
//!
//! Invariants: an index is linked at most once; `len` is the number of linked indices;
//! `prev[i] == UNLINKED` exactly when `i` is not linked. The front is the most recently
//! pushed-to-front end; the cache evicts from the back.

const NIL: u32 = u32::MAX;
const UNLINKED: u32 = u32::MAX - 1;

/// A list of slot indices.
#[derive(Debug)]
pub(crate) struct LruList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl LruList {
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(capacity < UNLINKED as usize, "list capacity {capacity} too large");
        Self { prev: vec![UNLINKED; capacity], next: vec![NIL; capacity], head: NIL, tail: NIL, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, index: u32) -> bool {
        self.prev[index as usize] != UNLINKED
    }

    pub(crate) fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    pub(crate) fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// The index after `index`, towards the back.
    pub(crate) fn next_of(&self, index: u32) -> Option<u32> {
        debug_assert!(self.contains(index));
        let next = self.next[index as usize];
        (next != NIL).then_some(next)
    }

    pub(crate) fn push_front(&mut self, index: u32) {
        assert!(!self.contains(index), "index {index} linked twice");
        self.prev[index as usize] = NIL;
        self.next[index as usize] = self.head;
        match self.head {
            NIL => self.tail = index,
            head => self.prev[head as usize] = index,
        }
        self.head = index;
        self.len += 1;
    }

    pub(crate) fn push_back(&mut self, index: u32) {
        assert!(!self.contains(index), "index {index} linked twice");
        self.next[index as usize] = NIL;
        self.prev[index as usize] = self.tail;
        match self.tail {
            NIL => self.head = index,
            tail => self.next[tail as usize] = index,
        }
        self.tail = index;
        self.len += 1;
    }

    /// Unlinks `index`; returns whether it was linked.
    pub(crate) fn remove(&mut self, index: u32) -> bool {
        if !self.contains(index) {
            return false;
        }
        let (prev, next) = (self.prev[index as usize], self.next[index as usize]);
        match prev {
            NIL => self.head = next,
            prev => self.next[prev as usize] = next,
        }
        match next {
            NIL => self.tail = prev,
            next => self.prev[next as usize] = prev,
        }
        self.prev[index as usize] = UNLINKED;
        self.next[index as usize] = NIL;
        self.len -= 1;
        true
    }

    /// Unlinks and returns the back.
    #[cfg(test)]
    pub(crate) fn pop_back(&mut self) -> Option<u32> {
        let back = self.back()?;
        self.remove(back);
        Some(back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(list: &LruList) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = list.front();
        while let Some(index) = at {
            out.push(index);
            at = list.next_of(index);
        }
        out
    }

    #[test]
    fn push_remove_pop_keep_order() {
        let mut list = LruList::new(8);
        list.push_front(1);
        list.push_front(2);
        list.push_back(3);
        list.push_front(4);
        assert_eq!(collect(&list), [4, 2, 1, 3]);
        assert!(list.remove(2));
        assert!(!list.remove(2));
        assert_eq!(collect(&list), [4, 1, 3]);
        assert_eq!(list.pop_back(), Some(3));
        assert_eq!(list.pop_back(), Some(1));
        assert_eq!(list.pop_back(), Some(4));
        assert_eq!(list.pop_back(), None);
        assert_eq!(list.len(), 0);
    }
}
