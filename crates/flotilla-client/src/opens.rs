//! Open files and their leases. Every `File` handle is announced to the metadata service
//! (`Opened`) and withdrawn when its last clone is dropped (`Closed`), so a file whose last
//! name goes away while it is open here stays readable and writable through the handle
//! (POSIX open-unlink). A background task renews the session's lease, naming every open file,
//! so a restarted metadata service learns them again and a crashed client's opens expire.

use crate::client::Client;
use crate::core::{unexpected, Core};
use crate::error::ClientError;
use crate::file::File;
use flotilla_proto::{EntryInfo, MetaReply, MetaRequest};
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

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let last = self.core.note_closed(self.id);
        let (core, id) = (self.core.clone(), self.id);
        let session = core.session();
        // Fire and forget: a lost `Closed` only delays the release to the lease's end.
        let closed = async move {
            if let Err(error) = core.meta_call(MetaRequest::Closed { session, id }).await {
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

/// Announces an open of file `id` and returns the file handle (with its fresh entry).
pub(crate) async fn open_file(client: Client, path: String, id: u64) -> Result<File, ClientError> {
    let core = client.core.clone();
    core.note_opened(id);
    let guard = OpenGuard { core: core.clone(), runtime: client.runtime.handle().clone(), id };
    let entry = match core.meta_call(MetaRequest::Opened { session: core.session(), id }).await? {
        MetaReply::Entry(entry) => entry,
        other => return Err(unexpected("open", &other)),
    };
    handle(client, path, entry, guard)
}

/// The handle on a file the metadata service already counts as opened by this session (its
/// `CreateOpen` reply): counted here too, and closed there when the handle goes.
pub(crate) fn opened_file(client: Client, path: String, entry: EntryInfo) -> Result<File, ClientError> {
    let core = client.core.clone();
    core.note_opened(entry.id);
    let guard = OpenGuard { core, runtime: client.runtime.handle().clone(), id: entry.id };
    handle(client, path, entry, guard)
}

fn handle(client: Client, path: String, mut entry: EntryInfo, guard: OpenGuard) -> Result<File, ClientError> {
    if entry.attrs.kind != flotilla_types::FileKind::File {
        return Err(ClientError::NotAFile { path });
    }
    client.core.overlay(entry.id, &mut entry.attrs);
    Ok(File::opened(client, path, entry, Arc::new(guard)))
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
        let request = MetaRequest::KeepOpen { session: core.session(), files };
        if let Err(error) = core.meta_call(request).await {
            tracing::warn!(%error, "cannot renew the lease on open files");
        }
    }
}
