//! Byte-range locks across clients (fcntl record locks; the mount forwards flock the same
//! way), kept by the metadata service for this client's session. A lock needs the file open
//! through this client: the service drops the locks of a session whose lease ran out.

use crate::client::Client;
use crate::error::{unexpected, ClientError};
use flotilla_proto::{LockInfo, LockKind, MetaReply, MetaRequest};

impl Client {
    /// Takes (`Read`, `Write`) or drops (`Unlock`) lock `owner`'s lock on bytes
    /// `start..=end` of file `id`, waiting up to `wait_ms` for conflicting locks of other
    /// owners to go. `Ok(None)`: done; `Ok(Some(holder))`: a conflicting lock is still held.
    pub fn set_lock(
        &self,
        id: u64,
        owner: u64,
        kind: LockKind,
        (start, end): (u64, u64),
        pid: u32,
        wait_ms: u64,
    ) -> Result<Option<LockInfo>, ClientError> {
        let session = self.core.transport.session();
        let request = MetaRequest::SetLock { session, id, owner, kind, start, end, pid, wait_ms };
        lock_reply(self.meta(request)?, "set a lock")
    }

    /// The first lock of another owner that would conflict with `kind` on `start..=end`.
    pub fn get_lock(
        &self,
        id: u64,
        owner: u64,
        kind: LockKind,
        (start, end): (u64, u64),
    ) -> Result<Option<LockInfo>, ClientError> {
        let session = self.core.transport.session();
        lock_reply(self.meta(MetaRequest::GetLock { session, id, owner, kind, start, end })?, "test a lock")
    }

    /// Drops every lock `owner` holds on file `id`.
    pub fn release_locks(&self, id: u64, owner: u64) -> Result<(), ClientError> {
        let session = self.core.transport.session();
        match self.meta(MetaRequest::ReleaseLocks { session, id, owner })? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected("release locks", &other)),
        }
    }
}

fn lock_reply(reply: MetaReply, what: &'static str) -> Result<Option<LockInfo>, ClientError> {
    match reply {
        MetaReply::Lock(holder) => Ok(holder),
        other => Err(unexpected(what, &other)),
    }
}
