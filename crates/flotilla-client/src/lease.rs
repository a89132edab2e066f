//! Open handles and the session's lease. Every `File` handle is announced to the metadata
//! service (`Opened`) and withdrawn when its last clone is dropped (`Closed`), so a file whose
//! last name goes away while it is open here stays readable and writable through the handle
//! (POSIX open-unlink). A background task renews the session's lease, naming every open file,
//! so a restarted metadata service learns them again and a crashed client's opens expire.

use crate::core::Core;
use flotilla_proto::MetaRequest;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Files one lease renewal names at most (more stay announced only by their `Opened`).
const RENEW_FILES_MAX: usize = 65_536;

/// One open handle's registration; dropping it closes the handle at the metadata service.
pub(crate) struct OpenGuard {
    core: Arc<Core>,
    runtime: tokio::runtime::Handle,
    id: u64,
}

impl OpenGuard {
    /// Counts one more open handle on file `id` (the caller announces it, or the service's
    /// reply to a create-and-open already counted it there).
    pub fn register(core: Arc<Core>, runtime: tokio::runtime::Handle, id: u64) -> OpenGuard {
        core.note_opened(id);
        OpenGuard { core, runtime, id }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let last = self.core.note_closed(self.id);
        let (core, id) = (self.core.clone(), self.id);
        let session = core.transport.session();
        // Fire and forget: a lost `Closed` only delays the release to the lease's end.
        let closed = async move {
            if let Err(error) = core.transport.meta_call(MetaRequest::Closed { session, id }).await {
                tracing::debug!(file = id, %error, "close not announced; the lease will expire it");
            }
        };
        // The client's last handle on the file gives its tokens back first.
        match self.core.tokens.made().filter(|_| last) {
            Some(cache) => {
                let runtime = self.runtime.clone();
                let announce = move || drop(runtime.spawn(closed));
                crate::library_tokens::release_file(cache, id, &self.runtime, announce);
            }
            None => drop(self.runtime.spawn(closed)),
        }
    }
}

/// Renews the session's lease every `period` while files are open, until the client goes;
/// frees the write buffers idle for long at the same pace.
pub(crate) async fn renew_leases(core: Weak<Core>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(core) = core.upgrade() else { return };
        core.buffers.trim(flotilla_proto::buffers::IDLE_KEPT_MAX);
        let mut files = core.open_files();
        if files.is_empty() {
            continue;
        }
        files.truncate(RENEW_FILES_MAX);
        let request = MetaRequest::KeepOpen { session: core.transport.session(), files };
        if let Err(error) = core.transport.meta_call(request).await {
            tracing::warn!(%error, "cannot renew the lease on open files");
        }
    }
}
