//! Non-blocking forms of the namespace and fork-management calls: each returns a
//! [`Handle`] at once, with `test` and `wait`, like the data calls.

use crate::client::Client;
use crate::error::{done_reply, entry_reply, unexpected, ClientError};
use crate::file::File;
use crate::handle::Handle;
use flotilla_proto::{DirEntryInfo, EntryInfo, MetaReply, MetaRequest, TargetStatus};

impl Client {
    /// Sends one metadata request on the runtime and converts its reply.
    fn meta_nb<T: Send + 'static>(
        &self,
        request: MetaRequest,
        what: &'static str,
        convert: fn(MetaReply, &'static str) -> Result<T, ClientError>,
    ) -> Handle<T> {
        let transport = self.core.transport.clone();
        self.spawn(async move { convert(transport.meta_call(request).await?, what) })
    }

    /// Non-blocking `stat`.
    pub fn stat_nb(&self, path: &str) -> Handle<EntryInfo> {
        self.meta_nb(MetaRequest::Lookup { path: path.to_string() }, "lookup", entry_reply)
    }

    /// Non-blocking `mkdir` (owned by uid/gid 0 unless the caller sets them later).
    pub fn mkdir_nb(&self, path: &str, mode: u32) -> Handle<EntryInfo> {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        self.meta_nb(MetaRequest::Mkdir { path: path.to_string(), mode, uid, gid }, "mkdir", entry_reply)
    }

    /// Non-blocking `readdir`.
    pub fn readdir_nb(&self, path: &str) -> Handle<Vec<DirEntryInfo>> {
        fn entries(reply: MetaReply, what: &'static str) -> Result<Vec<DirEntryInfo>, ClientError> {
            match reply {
                MetaReply::Entries(entries) => Ok(entries),
                other => Err(unexpected(what, &other)),
            }
        }
        self.meta_nb(MetaRequest::Readdir { path: path.to_string() }, "readdir", entries)
    }

    /// Non-blocking `remove`.
    pub fn remove_nb(&self, path: &str) -> Handle<()> {
        self.meta_nb(MetaRequest::Unlink { path: path.to_string() }, "unlink", done_reply)
    }

    /// Non-blocking `rmdir`.
    pub fn rmdir_nb(&self, path: &str) -> Handle<()> {
        self.meta_nb(MetaRequest::Rmdir { path: path.to_string() }, "rmdir", done_reply)
    }

    /// Non-blocking `rename`.
    pub fn rename_nb(&self, from: &str, to: &str) -> Handle<()> {
        self.meta_nb(MetaRequest::Rename { from: from.to_string(), to: to.to_string() }, "rename", done_reply)
    }

    /// Non-blocking `status`.
    pub fn status_nb(&self) -> Handle<Vec<TargetStatus>> {
        fn status(reply: MetaReply, what: &'static str) -> Result<Vec<TargetStatus>, ClientError> {
            match reply {
                MetaReply::Status(targets) => Ok(targets),
                other => Err(unexpected(what, &other)),
            }
        }
        self.meta_nb(MetaRequest::Status, "status", status)
    }

    /// Non-blocking `open`.
    pub fn open_nb(&self, path: &str) -> Handle<File> {
        let client = self.clone();
        let path = path.to_string();
        let transport = self.core.transport.clone();
        self.spawn(async move {
            let info = entry_reply(
                transport.meta_call(MetaRequest::Lookup { path: path.clone() }).await?,
                "lookup",
            )?;
            if info.attrs.kind != flotilla_types::FileKind::File {
                return Err(ClientError::NotAFile { path });
            }
            crate::opens::open_file(client, path, info.id).await
        })
    }
}
