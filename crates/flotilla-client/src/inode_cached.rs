//! Lookups and attribute reads under inode tokens for the mount (issue 34): the answer
//! comes with the tokens that cover it (`InodeCached`), and the mount polls for their
//! revocations (`InodeTokenWait`) and gives them back (`InodeTokenRelease`) itself, after
//! dropping what the kernel cached under them. The library's own attribute cache
//! (`attr_leases.rs`) is not used by such a client: one poller per session.

use crate::client::Client;
use crate::error::{done_reply, unexpected, ClientError};
use crate::posix_at::At;
use flotilla_proto::{EntryInfo, InodeAsk, InodeToken, MetaReply, MetaRequest, INODE_TOKENS_PER_REQUEST_MAX};

/// What a lookup under tokens found.
#[derive(Clone, Debug)]
pub enum CachedLookup {
    /// The entry, and the tokens on its directory's names and its attributes (none when
    /// the service granted none).
    Found { entry: Box<EntryInfo>, grants: Vec<InodeToken> },
    /// No such name; `grants` (its directory's names) cover that answer.
    Missing { grants: Vec<InodeToken> },
}

impl Client {
    /// Makes every later change of this client carry its session (`ChangedBy`), so the
    /// service revokes no inode token of this client for it.
    pub fn set_changes_carry_session(&self, on: bool) {
        self.core.transport.set_changes_carry_session(on);
    }

    /// `lookup_at`, with inode tokens on what the answer depends on.
    pub fn lookup_at_cached(&self, at: At<'_>) -> Result<CachedLookup, ClientError> {
        let ask = InodeAsk::Lookup { parent: at.parent, name: at.name.to_vec() };
        match self.inode_cached(ask)? {
            MetaReply::CachedEntry { mut entry, grants } => {
                self.overlay(entry.id, &mut entry.attrs);
                Ok(CachedLookup::Found { entry: Box::new(entry), grants })
            }
            MetaReply::NoEntry { grants } => Ok(CachedLookup::Missing { grants }),
            other => Err(unexpected("lookup under tokens", &other)),
        }
    }

    /// `stat_id`, with an inode token on the entry's attributes.
    pub fn stat_id_cached(&self, id: u64) -> Result<(EntryInfo, Vec<InodeToken>), ClientError> {
        match self.inode_cached(InodeAsk::Attr { id })? {
            MetaReply::CachedEntry { mut entry, grants } => {
                self.overlay(entry.id, &mut entry.attrs);
                Ok((entry, grants))
            }
            other => Err(unexpected("stat under tokens", &other)),
        }
    }

    fn inode_cached(&self, ask: InodeAsk) -> Result<MetaReply, ClientError> {
        self.meta(MetaRequest::InodeCached { session: self.core.transport.session(), ask })
    }

    /// Waits up to `wait_ms` (bounded by the service) for revocations of this client's
    /// inode tokens: the tokens to give back, and whether the service holds none of them
    /// any more although `holding` said it should (drop everything cached).
    pub fn inode_token_wait(
        &self,
        holding: bool,
        wait_ms: u64,
    ) -> Result<(Vec<InodeToken>, bool), ClientError> {
        let session = self.core.transport.session();
        match self.meta(MetaRequest::InodeTokenWait { session, holding, wait_ms })? {
            MetaReply::InodeEvents { revokes, lost } => Ok((revokes, lost)),
            other => Err(unexpected("inode token wait", &other)),
        }
    }

    /// Gives inode tokens back (in requests of at most `INODE_TOKENS_PER_REQUEST_MAX`).
    pub fn inode_token_release(&self, tokens: &[InodeToken]) -> Result<(), ClientError> {
        let session = self.core.transport.session();
        for chunk in tokens.chunks(INODE_TOKENS_PER_REQUEST_MAX) {
            let request = MetaRequest::InodeTokenRelease { session, tokens: chunk.to_vec() };
            done_reply(self.meta(request)?, "inode token release")?;
        }
        Ok(())
    }
}
