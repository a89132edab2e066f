//! A bounded table of open handles (open files, open directory listings), keyed by the
//! handle number the kernel hands back on every call.
//!
//! Invariants: at most `handles_max` entries; handle numbers are never reused within one
//! mount (a stale number from the kernel finds nothing rather than another file).

use fuser::Errno;
use std::collections::HashMap;
use std::sync::Arc;

pub struct HandleTable<T> {
    inner: parking_lot::Mutex<Inner<T>>,
    handles_max: usize,
}

struct Inner<T> {
    handles: HashMap<u64, Arc<T>>,
    next: u64,
}

impl<T> HandleTable<T> {
    pub fn new(handles_max: usize) -> HandleTable<T> {
        assert!(handles_max >= 1);
        HandleTable {
            inner: parking_lot::Mutex::new(Inner { handles: HashMap::new(), next: 1 }),
            handles_max,
        }
    }

    /// Stores `value` and returns its handle; ENFILE when the table is full.
    pub fn insert(&self, value: T) -> Result<u64, Errno> {
        let mut inner = self.inner.lock();
        if inner.handles.len() >= self.handles_max {
            return Err(Errno::ENFILE);
        }
        let handle = inner.next;
        inner.next += 1;
        let previous = inner.handles.insert(handle, Arc::new(value));
        debug_assert!(previous.is_none());
        Ok(handle)
    }

    /// The value behind `handle`; EBADF for a handle that is not open.
    pub fn get(&self, handle: u64) -> Result<Arc<T>, Errno> {
        self.inner.lock().handles.get(&handle).cloned().ok_or(Errno::EBADF)
    }

    pub fn remove(&self, handle: u64) -> Option<Arc<T>> {
        self.inner.lock().handles.remove(&handle)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().handles.len()
    }

    /// Every open value (for the final flush at unmount).
    pub fn all(&self) -> Vec<Arc<T>> {
        self.inner.lock().handles.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_never_reused() {
        let table = HandleTable::new(2);
        let a = table.insert("a").unwrap();
        let b = table.insert("b").unwrap();
        assert_eq!(table.insert("c"), Err(Errno::ENFILE));
        table.remove(a);
        let c = table.insert("c").unwrap();
        assert!(c != a && c != b);
        assert_eq!(table.get(a).err(), Some(Errno::EBADF));
        assert_eq!(*table.get(c).unwrap(), "c");
        assert_eq!(table.len(), 2);
    }
}
