//! The namespace requests addressed by identity: a directory by inode id and a name in it
//! (issue 11). They run the same namespace operations as the path requests, with the place
//! given as `Place::At`, so permission checks, link counts and orphan handling are shared.

use crate::handle::{wire, Asker, State};
use flotilla_namespace::Place;
use flotilla_proto::{
    ErrorCode, ListedEntry, ListedEntryPlus, MetaReply, MetaRequest, RenameMode, WireError, NAME_BYTES_MAX,
    READDIR_ENTRIES_MAX,
};
use flotilla_types::CallerPolicy;

/// A name from the wire, checked to be at most `NAME_BYTES_MAX` bytes (names are bytes; the
/// namespace checks the single-component rules: no '/' or NUL, not "." or "..").
pub(crate) fn name(bytes: &[u8]) -> Result<&[u8], WireError> {
    if bytes.len() > NAME_BYTES_MAX {
        return Err(WireError::new(
            ErrorCode::NameTooLong,
            format!("a {}-byte name is over the {NAME_BYTES_MAX}-byte limit", bytes.len()),
        ));
    }
    Ok(bytes)
}

fn at(parent: u64, bytes: &[u8]) -> Result<Place<'_>, WireError> {
    Ok(Place::At { parent, name: name(bytes)? })
}

/// The directory ids an id-addressed request acts in (for the subtree check).
pub(crate) fn directories(request: &MetaRequest) -> Vec<u64> {
    match request {
        MetaRequest::LookupAt { parent, .. }
        | MetaRequest::CreateAt { parent, .. }
        | MetaRequest::CreateAtOpen { parent, .. }
        | MetaRequest::MkdirAt { parent, .. }
        | MetaRequest::MknodAt { parent, .. }
        | MetaRequest::SymlinkAt { parent, .. }
        | MetaRequest::LinkAt { parent, .. }
        | MetaRequest::UnlinkAt { parent, .. }
        | MetaRequest::RmdirAt { parent, .. } => vec![*parent],
        MetaRequest::RenameAt { from_parent, to_parent, .. } => vec![*from_parent, *to_parent],
        MetaRequest::ReaddirId { id, .. } | MetaRequest::ReaddirPlusId { id, .. } => vec![*id],
        MetaRequest::InodeCached { ask: flotilla_proto::InodeAsk::Lookup { parent, .. }, .. } => {
            vec![*parent]
        }
        _ => Vec::new(),
    }
}

/// The entries an id-addressed change acts on itself (not in): a directory among them must
/// be inside a confined connection's subtree. A file has no parent to check; its id, which
/// looks random, is learned only through a lookup, and the subtree confines those.
pub(crate) fn changed_entries(request: &MetaRequest) -> Vec<u64> {
    match request {
        MetaRequest::SetAttr { id, .. }
        | MetaRequest::SetLayoutId { id, .. }
        | MetaRequest::SetNoOverlapId { id, .. }
        | MetaRequest::TouchAtime { id, .. }
        | MetaRequest::GrowSize { id, .. }
        | MetaRequest::LinkAt { id, .. } => vec![*id],
        _ => Vec::new(),
    }
}

impl State {
    /// On a connection confined to a subtree, refuses an id-addressed request that acts in
    /// a directory outside it (found by walking up the directory's parents), or changes a
    /// directory outside it (the root's well-known id, say).
    pub(crate) fn admit_at(&self, request: &MetaRequest, policy: &CallerPolicy) -> Result<(), WireError> {
        let Some(subtree) = &policy.subtree else { return Ok(()) };
        for id in changed_entries(request) {
            let kind = self.ns()?.get(id).map(|entry| entry.attrs.kind);
            let is_directory = kind.is_ok_and(|kind| kind == flotilla_types::FileKind::Directory);
            if is_directory && !self.ns()?.directory_within(id, subtree).map_err(wire)? {
                return Err(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("directory {id:016x} is outside the connection's subtree {subtree}"),
                ));
            }
        }
        for dir in directories(request) {
            if !self.ns()?.directory_within(dir, subtree).map_err(wire)? {
                return Err(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("directory {dir:016x} is outside the connection's subtree {subtree}"),
                ));
            }
        }
        Ok(())
    }

    /// Executes one id-addressed request.
    pub(crate) fn dispatch_at(
        &self,
        request: MetaRequest,
        asker: &Asker,
        now: i64,
    ) -> Result<MetaReply, WireError> {
        let shared = self.ns()?;
        let (ns, who) = (&*shared, asker.who);
        let reply = match request {
            MetaRequest::LookupAt { parent, name: bytes } => {
                MetaReply::Entry(self.granted(ns.lookup_at(who, parent, name(&bytes)?).map_err(wire)?, asker))
            }
            MetaRequest::CreateAt { parent, name, spec } => {
                let entry = self.create_inheriting(who, at(parent, &name)?, spec, now)?;
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::CreateAtOpen { parent, name, spec, session } => {
                let created = self.create_inheriting(who, at(parent, &name)?, spec, now)?;
                MetaReply::Entry(self.granted(self.opened(session, created.id)?, asker))
            }
            MetaRequest::MkdirAt { parent, name, mode, uid, gid } => {
                let owner = crate::policy::owner(who, mode, uid, gid);
                MetaReply::Entry(self.info(ns.mkdir_in(who, at(parent, &name)?, owner, now).map_err(wire)?))
            }
            MetaRequest::MknodAt { parent, name, kind, rdev, mode, uid, gid } => {
                let owner = crate::policy::owner(who, mode, uid, gid);
                let entry = ns.mknod_in(who, at(parent, &name)?, kind, rdev, owner, now).map_err(wire)?;
                MetaReply::Entry(self.info(entry))
            }
            MetaRequest::SymlinkAt { parent, name, target, uid, gid } => {
                let owner = crate::policy::owner(who, 0o777, uid, gid);
                let entry = ns.symlink_in(who, at(parent, &name)?, &target, owner, now).map_err(wire)?;
                MetaReply::Entry(self.info(entry))
            }
            MetaRequest::LinkAt { id, parent, name } => MetaReply::Entry(
                self.granted(ns.link_in(who, id, at(parent, &name)?, now).map_err(wire)?, asker),
            ),
            MetaRequest::UnlinkAt { parent, name, id } => {
                let place = at(parent, &name)?;
                self.remove(|is_open| ns.unlink_in(who, place, id, is_open, now).map(|_| ()))?
            }
            MetaRequest::RmdirAt { parent, name } => {
                ns.rmdir_in(who, at(parent, &name)?, now).map_err(wire)?;
                MetaReply::Done
            }
            MetaRequest::RenameAt { from_parent, from_name, to_parent, to_name, mode } => {
                let (from, to) = (at(from_parent, &from_name)?, at(to_parent, &to_name)?);
                match mode {
                    RenameMode::Replace => {
                        self.remove(|is_open| ns.rename_in(who, from, to, is_open, now).map(|_| ()))?
                    }
                    RenameMode::NoReplace => {
                        ns.rename_no_replace_in(who, from, to, now).map_err(wire)?;
                        MetaReply::Done
                    }
                    RenameMode::Exchange => {
                        ns.exchange_in(who, from, to, now).map_err(wire)?;
                        MetaReply::Done
                    }
                }
            }
            MetaRequest::ReaddirId { id, after, entries_max } => {
                let after = after.as_deref().map(name).transpose()?;
                let max = entries_max.min(READDIR_ENTRIES_MAX) as usize;
                let page = ns.readdir_page_id(who, id, after, max).map_err(wire)?;
                MetaReply::Listing(
                    page.into_iter().map(|e| ListedEntry { name: e.name, id: e.id, kind: e.kind }).collect(),
                )
            }
            MetaRequest::ReaddirPlusId { id, after, entries_max } => {
                let after = after.as_deref().map(name).transpose()?;
                let max = entries_max.min(READDIR_ENTRIES_MAX) as usize;
                let page = ns.readdir_plus_page_id(who, id, after, max).map_err(wire)?;
                MetaReply::ListingPlus(
                    page.into_iter()
                        .map(|e| ListedEntryPlus { name: e.name, id: e.id, attrs: e.attrs })
                        .collect(),
                )
            }
            other => {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!("{other:?} is not an id-addressed request"),
                ))
            }
        };
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::directories;
    use flotilla_proto::{CreateSpec, MetaRequest};

    fn spec() -> CreateSpec {
        CreateSpec { mode: 0o644, uid: 0, gid: 0, subfiles: 0, targets: None, layout: None, exclusive: true }
    }

    /// The subtree check sees the directory of every create, the one-request form included
    /// (a request it did not list would act anywhere on a confined connection).
    #[test]
    fn creates_name_the_directory_they_act_in() {
        let name = b"f".to_vec();
        let create = MetaRequest::CreateAt { parent: 7, name: name.clone(), spec: spec() };
        let create_open = MetaRequest::CreateAtOpen { parent: 9, name, spec: spec(), session: 3 };
        assert_eq!(directories(&create), vec![7]);
        assert_eq!(directories(&create_open), vec![9]);
    }

    /// Every id-addressed change names the entry it changes, so a confined connection
    /// cannot change a directory outside its subtree by id (the root's, say).
    #[test]
    fn id_addressed_changes_name_their_entry() {
        use super::changed_entries;
        let layout = MetaRequest::SetLayoutId { id: 1, layout: None, replicas: 1 };
        let attr = MetaRequest::SetAttr { id: 1, change: Default::default() };
        let atime = MetaRequest::TouchAtime { id: 1, atime_ns: 0 };
        let hint = MetaRequest::SetNoOverlapId { id: 1, no_overlap: true };
        for request in [layout, attr, atime, hint] {
            assert_eq!(changed_entries(&request), vec![1], "{request:?}");
        }
    }
}
