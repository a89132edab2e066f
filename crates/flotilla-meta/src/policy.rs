//! What a connection's [`CallerPolicy`] refuses before a request reaches the namespace, and
//! the owner a caller may give a new entry.

use flotilla_namespace::Owner;
use flotilla_proto::{ErrorCode, MetaRequest, WireError};
use flotilla_types::{Caller, CallerPolicy};

/// The policy of a connection authenticated as `peer`: the service's default narrowed by the
/// limits in the peer's certificate.
pub(crate) fn for_peer(default: &CallerPolicy, limits: &flotilla_auth::Limits) -> CallerPolicy {
    default.narrowed_by(limits)
}

/// Refuses a change on a read-only connection and a path outside the policy's subtree.
pub(crate) fn admit(request: &MetaRequest, policy: &CallerPolicy) -> Result<(), WireError> {
    if policy.read_only && crate::admission::is_mutating(request) {
        return Err(WireError::new(
            ErrorCode::PermissionDenied,
            format!("read-only connection: {} is a change", name(request)),
        ));
    }
    if policy.subtree.is_some() {
        if matches!(
            request,
            MetaRequest::Register { .. }
                | MetaRequest::Heartbeat { .. }
                | MetaRequest::RegisterMember { .. }
                | MetaRequest::HeartbeatMember { .. }
                | MetaRequest::ChainSubfiles { .. }
                | MetaRequest::SyncDone { .. }
                | MetaRequest::TargetAdmin { .. }
        ) {
            return Err(WireError::new(
                ErrorCode::PermissionDenied,
                "a confined connection may not register",
            ));
        }
        for path in paths(request) {
            if !policy.allows_path(path) {
                return Err(WireError::new(
                    ErrorCode::PermissionDenied,
                    format!("{path} is outside the connection's subtree"),
                ));
            }
        }
    }
    Ok(())
}

/// The owner of a new entry: root may name any; anyone else owns what they create, with
/// the group they ask for if they belong to it, else their own.
pub(crate) fn owner(who: &Caller, mode: u32, uid: u32, gid: u32) -> Owner {
    if who.is_root() {
        return Owner { mode, uid, gid };
    }
    let gid = if who.in_group(gid) { gid } else { who.gid };
    Owner { mode, uid: who.uid, gid }
}

fn name(request: &MetaRequest) -> &'static str {
    match request {
        MetaRequest::Mkdir { .. } => "mkdir",
        MetaRequest::Create { .. }
        | MetaRequest::CreateReplicated { .. }
        | MetaRequest::CreateOpen { .. }
        | MetaRequest::CreateOpenCached { .. }
        | MetaRequest::CreateAt { .. }
        | MetaRequest::CreateAtOpen { .. } => "create",
        MetaRequest::Unlink { .. } => "unlink",
        MetaRequest::Rmdir { .. } => "rmdir",
        MetaRequest::Rename { .. } => "rename",
        MetaRequest::SetAttr { .. } => "setattr",
        MetaRequest::Symlink { .. } => "symlink",
        MetaRequest::Link { .. } => "link",
        MetaRequest::GrowSize { .. } => "grow size",
        MetaRequest::SetLayout { .. } => "set layout",
        MetaRequest::Register { .. }
        | MetaRequest::Heartbeat { .. }
        | MetaRequest::RegisterMember { .. }
        | MetaRequest::HeartbeatMember { .. } => "server registration",
        MetaRequest::ChainSubfiles { .. } | MetaRequest::SyncDone { .. } => "chain resync",
        MetaRequest::TargetAdmin { .. } => "target drain/remove",
        _ => "this request",
    }
}

fn paths(request: &MetaRequest) -> Vec<&str> {
    match request {
        MetaRequest::Lookup { path }
        | MetaRequest::OpenPath { path, .. }
        | MetaRequest::Mkdir { path, .. }
        | MetaRequest::Create { path, .. }
        | MetaRequest::CreateReplicated { path, .. }
        | MetaRequest::CreateOpen { path, .. }
        | MetaRequest::CreateOpenCached { path, .. }
        | MetaRequest::LookupCached { path, .. }
        | MetaRequest::Readdir { path }
        | MetaRequest::Unlink { path }
        | MetaRequest::Rmdir { path }
        | MetaRequest::Symlink { path, .. }
        | MetaRequest::UnlinkId { path, .. }
        | MetaRequest::SetLayout { path, .. } => vec![path],
        MetaRequest::Rename { from, to } | MetaRequest::RenameNoReplace { from, to } => vec![from, to],
        MetaRequest::Link { existing, new } => vec![existing, new],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_refuses_changes_only() {
        let policy = CallerPolicy { read_only: true, ..Default::default() };
        assert!(admit(&MetaRequest::Lookup { path: "/a".into() }, &policy).is_ok());
        let refused = admit(&MetaRequest::Unlink { path: "/a".into() }, &policy).unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied);
        assert!(refused.message.contains("unlink"));
    }

    #[test]
    fn subtree_refuses_outside_paths() {
        let policy = CallerPolicy { subtree: Some("/home/a".into()), ..Default::default() };
        assert!(admit(&MetaRequest::Lookup { path: "/home/a/x".into() }, &policy).is_ok());
        let rename = MetaRequest::Rename { from: "/home/a/x".into(), to: "/home/b/x".into() };
        assert!(admit(&rename, &policy).is_err());
        // Every path-addressed change is confined, the less common forms too.
        let no_replace = MetaRequest::RenameNoReplace { from: "/home/a/x".into(), to: "/home/b/x".into() };
        assert!(admit(&no_replace, &policy).is_err());
        let unlink_id = MetaRequest::UnlinkId { path: "/home/b/x".into(), id: 5 };
        assert!(admit(&unlink_id, &policy).is_err());
    }

    #[test]
    fn non_root_owns_what_it_creates() {
        let who = Caller { uid: 5, gid: 6, groups: vec![7] };
        assert_eq!(owner(&who, 0o644, 0, 7), Owner { mode: 0o644, uid: 5, gid: 7 });
        assert_eq!(owner(&who, 0o644, 0, 0), Owner { mode: 0o644, uid: 5, gid: 6 });
        assert_eq!(owner(&Caller::root(), 0o600, 9, 9), Owner { mode: 0o600, uid: 9, gid: 9 });
    }

    #[test]
    fn a_credential_narrows_the_default_policy() {
        let default = CallerPolicy {
            read_only: false,
            subtree: Some("/a".into()),
            uid: Some(7),
            gid: None,
            root_squash: true,
        };
        let limits = flotilla_auth::Limits {
            read_only: true,
            subtree: Some("/b".into()),
            uid: None,
            gid: Some(9),
            root_squash: false,
        };
        let policy = for_peer(&default, &limits);
        assert!(policy.read_only && policy.root_squash);
        assert_eq!((policy.subtree.as_deref(), policy.uid, policy.gid), (Some("/b"), Some(7), Some(9)));
        let open = for_peer(&CallerPolicy::default(), &flotilla_auth::Limits::default());
        assert_eq!(open, CallerPolicy::default());
    }
}
