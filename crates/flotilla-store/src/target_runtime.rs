//! A target while the store runs: its layout (`Target`), its disk scheduler, and the forks
//! in use on it, with the namespace operations that must coordinate with the cache.
//!
//! Locking: `namespace` is held shared while a fork is looked up or opened and exclusive by
//! create and remove, so a fork cannot be opened while its subfile is being removed. Lock
//! order is namespace, then a fork's lock, then the cache; requests take only a fork's lock
//! (after the lookup released the namespace), so removal waits for requests in flight and
//! requests never wait for removal while holding pins.

use crate::block_cache::BlockCache;
use crate::disk_manager::DiskManager;
use crate::error::StoreError;
use crate::fork::{Fork, ForkContext};
use crate::fork_ref::ForkRef;
use crate::fork_table::ForkTable;
use crate::target::Target;
use flotilla_types::{check_fork_name, FileId, SubfileIndex};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

/// One running target.
#[derive(Debug)]
pub(crate) struct TargetRuntime {
    context: ForkContext,
    namespace: RwLock<()>,
    forks: Mutex<ForkTable>,
}

impl TargetRuntime {
    pub(crate) fn new(context: ForkContext) -> Self {
        Self { context, namespace: RwLock::new(()), forks: Mutex::new(ForkTable::new()) }
    }

    pub(crate) fn target(&self) -> &Arc<Target> {
        &self.context.target
    }

    pub(crate) fn disk(&self) -> &Arc<DiskManager> {
        &self.context.disk
    }

    /// Every fork in use.
    pub(crate) fn live_forks(&self) -> Vec<Arc<Fork>> {
        self.forks.lock().all()
    }

    /// fdatasyncs (data and checksums of) every fork that went out of use with written data
    /// not yet synced.
    pub(crate) fn sync_closed(&self) -> Result<(), StoreError> {
        let closed = std::mem::take(&mut *self.context.unsynced_closed.lock());
        for path in closed {
            match self.target().reopen_fork(&path).and_then(|backend| backend.sync_data()) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(StoreError::io(format!("fdatasync {path:?}"), error)),
            }
        }
        Ok(())
    }

    /// The fork in use for `fork`, opening it if needed.
    pub(crate) fn fork(&self, fork: &ForkRef<'_>) -> Result<Arc<Fork>, StoreError> {
        fork.check_name()?;
        let _namespace = self.namespace.read();
        if let Some(found) = self.forks.lock().get(fork.file, fork.subfile, fork.fork) {
            return Ok(found);
        }
        let backend = self.target().open_fork(fork.file, fork.subfile, fork.fork)?;
        let opened = Fork::open(&self.context, fork, backend)?;
        Ok(self.forks.lock().insert(fork.file, fork.subfile, opened))
    }

    pub(crate) fn create_subfile(&self, file: FileId, subfile: SubfileIndex) -> Result<(), StoreError> {
        let _namespace = self.namespace.write();
        self.target().create_subfile(file, subfile)
    }

    /// Removes a subfile: its forks' cached blocks are dropped (dirty ones discarded).
    pub(crate) fn remove_subfile(
        &self,
        cache: &BlockCache,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<(), StoreError> {
        let _namespace = self.namespace.write();
        if !self.target().subfile_exists(file, subfile) {
            return Err(self.target().unknown_subfile(file, subfile));
        }
        let live = self.forks.lock().subfile(file, subfile);
        for fork in &live {
            retire(cache, fork);
        }
        self.forks.lock().take_subfile(file, subfile);
        self.target().remove_subfile(file, subfile)
    }

    pub(crate) fn create_fork(&self, fork: &ForkRef<'_>) -> Result<(), StoreError> {
        fork.check_name()?;
        let _namespace = self.namespace.write();
        self.target().create_fork(fork.file, fork.subfile, fork.fork)
    }

    /// Removes a fork: its cached blocks are dropped (dirty ones discarded).
    pub(crate) fn remove_fork(&self, cache: &BlockCache, fork: &ForkRef<'_>) -> Result<(), StoreError> {
        fork.check_name()?;
        let _namespace = self.namespace.write();
        let live = self.forks.lock().get(fork.file, fork.subfile, fork.fork);
        if let Some(live) = &live {
            retire(cache, live);
        }
        self.forks.lock().remove(fork.file, fork.subfile, fork.fork);
        self.target().remove_fork(fork.file, fork.subfile, fork.fork)
    }

    /// Forks of a subfile with their logical sizes (cached writes included), by name.
    pub(crate) fn list_forks(
        &self,
        file: FileId,
        subfile: SubfileIndex,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let _namespace = self.namespace.read();
        let mut forks = self.target().list_forks(file, subfile)?;
        forks.retain(|(name, _)| check_fork_name(name).is_ok());
        let table = self.forks.lock();
        for (name, size_bytes) in &mut forks {
            if let Some(live) = table.get(file, subfile, name) {
                *size_bytes = live.size_bytes();
            }
        }
        Ok(forks)
    }
}

/// Waits for requests on the fork to finish, drops its cached blocks and marks it removed.
fn retire(cache: &BlockCache, fork: &Fork) {
    let Ok(_exclusive) = fork.lock_exclusive() else {
        return;
    };
    cache.drop_fork(fork.serial());
    fork.mark_removed();
}
