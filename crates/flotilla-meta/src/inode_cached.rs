//! `InodeCached` (issue 34): the mount's lookups and attribute reads with inode tokens on
//! what each answer depends on, so the mount may let the kernel cache the answer for long
//! and drop it when a token is revoked.
//!
//! As `lookup_cached` does for paths: the answer is read once to learn which entry it names,
//! the grants are registered, and the answer is read again; when the two reads name
//! different entries (a change came between, and its revocations may have missed the
//! grants) the grants are given back and the answer goes without. A name that does not
//! exist is answered `NoEntry` without grants: `Names(parent)` covers a directory's
//! existing entries only (a create in it does not revoke it, `flotilla-namespace`
//! `touched.rs`), so it cannot cover a negative answer.

use crate::handle::{Asker, State};
use crate::inode_tokens::Key;
use flotilla_proto::{EntryInfo, ErrorCode, InodeAsk, InodeTokenKind, MetaReply, MetaRequest, WireError};
use std::time::Instant;

/// The entry `ask` names (`None`: a looked-up name that does not exist).
type Answer = Option<EntryInfo>;

impl State {
    pub(crate) fn inode_cached(
        &self,
        session: u64,
        ask: InodeAsk,
        asker: &Asker,
    ) -> Result<MetaReply, WireError> {
        let Some(first) = self.inode_answer(&ask, asker)? else {
            return Ok(MetaReply::NoEntry { grants: Vec::new() });
        };
        let first = Some(first);
        let keys = keys_of(&ask, first.as_ref().map(|entry| entry.id));
        let live = self.opens.lock().touch(session, Instant::now()).is_ok();
        let grants = if live { self.inode_tokens.grant(session, &keys) } else { None };
        let again = self.inode_answer(&ask, asker);
        let consistent = match (&first, &again) {
            (Some(before), Ok(Some(now))) => before.id == now.id,
            (None, Ok(None)) => true,
            _ => false,
        };
        let grants = match grants {
            Some(grants) if consistent => grants,
            Some(grants) => {
                self.inode_tokens.release(session, &grants)?;
                Vec::new()
            }
            None => Vec::new(),
        };
        Ok(match again? {
            Some(entry) => MetaReply::CachedEntry { entry, grants },
            None => MetaReply::NoEntry { grants },
        })
    }

    fn inode_answer(&self, ask: &InodeAsk, asker: &Asker) -> Result<Answer, WireError> {
        let request = match ask {
            InodeAsk::Lookup { parent, name } => {
                MetaRequest::LookupAt { parent: *parent, name: name.clone() }
            }
            InodeAsk::Attr { id } => MetaRequest::GetById { id: *id },
        };
        match self.dispatch(request, asker) {
            Ok(MetaReply::Entry(entry)) => Ok(Some(entry)),
            Ok(other) => Err(WireError::new(ErrorCode::Io, format!("an entry read answered {other:?}"))),
            Err(error) if error.code == ErrorCode::NotFound && matches!(ask, InodeAsk::Lookup { .. }) => {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}

/// The tokens an answer depends on: a lookup on its directory's names and the entry found,
/// an attribute read on the entry. (`found` `None`, a negative answer, is not granted
/// today; see the module's note.)
fn keys_of(ask: &InodeAsk, found: Option<u64>) -> Vec<Key> {
    let mut keys = Vec::with_capacity(2);
    if let InodeAsk::Lookup { parent, .. } = ask {
        keys.push((InodeTokenKind::Names, *parent));
    }
    if let Some(id) = found {
        keys.push((InodeTokenKind::Attr, id));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_depends_on_its_directory_and_what_it_found() {
        let lookup = InodeAsk::Lookup { parent: 1, name: b"a".to_vec() };
        assert_eq!(keys_of(&lookup, Some(9)), vec![(InodeTokenKind::Names, 1), (InodeTokenKind::Attr, 9)]);
        assert_eq!(
            keys_of(&lookup, None),
            vec![(InodeTokenKind::Names, 1)],
            "a negative entry: the names only"
        );
        assert_eq!(keys_of(&InodeAsk::Attr { id: 4 }, Some(4)), vec![(InodeTokenKind::Attr, 4)]);
    }
}
