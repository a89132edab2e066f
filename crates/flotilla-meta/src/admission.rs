//! What an authenticated peer may ask of the metadata service, checked before a request
//! is executed: only server credentials register or heartbeat targets, and only targets
//! bound to them; a read-only client credential changes nothing.

use crate::handle::State;
use flotilla_auth::{Peer, Role};
use flotilla_proto::{ErrorCode, MetaRequest, WireError};

/// Refuses `request` when `peer` may not make it; binds reported targets to the peer.
pub(crate) fn admit(state: &State, peer: &Peer, request: &MetaRequest) -> Result<(), WireError> {
    // The envelopes (`Sequenced`, then `As`) are judged by what they carry.
    let request = match request {
        MetaRequest::Sequenced { request, .. } => request,
        bare => bare,
    };
    let request = match request {
        MetaRequest::As { request, .. } => request,
        bare => bare,
    };
    match request {
        MetaRequest::Register { targets, .. }
        | MetaRequest::Heartbeat { targets, .. }
        | MetaRequest::RegisterMember { targets, .. }
        | MetaRequest::HeartbeatMember { targets, .. } => {
            if peer.role != Role::Server {
                return Err(denied(format!(
                    "credential {:?} has role {}; only a server credential may register or heartbeat targets",
                    peer.name, peer.role
                )));
            }
            let persist = |new: &[flotilla_types::TargetId]| {
                let op = crate::replicated::Op::BindTargets {
                    credential: peer.name.clone(),
                    targets: new.to_vec(),
                };
                state.write(op)
            };
            state.membership.bind(&peer.name, targets, state.targets_per_server_max, persist)
        }
        request if is_resync(request) && peer.role != Role::Server => Err(denied(format!(
            "credential {:?} has role {}; only a server credential may take part in a chain's resync",
            peer.name, peer.role
        ))),
        request if peer.limits.read_only && is_mutating(request) => Err(denied(format!(
            "credential {:?} is read-only; {} changes the namespace",
            peer.name,
            request_name(request)
        ))),
        _ => Ok(()),
    }
}

/// A resync request (`ChainSubfiles`, `SyncDone`), bare or under `As`.
fn is_resync(request: &MetaRequest) -> bool {
    match request {
        MetaRequest::As { request, .. } => is_resync(request),
        other => matches!(other, MetaRequest::ChainSubfiles { .. } | MetaRequest::SyncDone { .. }),
    }
}

fn denied(message: String) -> WireError {
    WireError::new(ErrorCode::PermissionDenied, message)
}

/// Whether a request changes the namespace.
pub(crate) fn is_mutating(request: &MetaRequest) -> bool {
    matches!(
        request,
        MetaRequest::Mkdir { .. }
            | MetaRequest::Create { .. }
            | MetaRequest::CreateReplicated { .. }
            | MetaRequest::CreateOpen { .. }
            | MetaRequest::CreateOpenCached { .. }
            | MetaRequest::Unlink { .. }
            | MetaRequest::RenameNoReplace { .. }
            | MetaRequest::UnlinkId { .. }
            | MetaRequest::Rmdir { .. }
            | MetaRequest::Rename { .. }
            | MetaRequest::SetAttr { .. }
            | MetaRequest::Symlink { .. }
            | MetaRequest::Link { .. }
            | MetaRequest::GrowSize { .. }
            | MetaRequest::SetLayout { .. }
            | MetaRequest::CreateAt { .. }
            | MetaRequest::CreateAtOpen { .. }
            | MetaRequest::MkdirAt { .. }
            | MetaRequest::MknodAt { .. }
            | MetaRequest::SymlinkAt { .. }
            | MetaRequest::LinkAt { .. }
            | MetaRequest::UnlinkAt { .. }
            | MetaRequest::RmdirAt { .. }
            | MetaRequest::RenameAt { .. }
            | MetaRequest::SetLayoutId { .. }
            | MetaRequest::SetNoOverlapId { .. }
            | MetaRequest::TouchAtime { .. }
            | MetaRequest::TargetAdmin { .. }
    )
}

fn request_name(request: &MetaRequest) -> String {
    let debug = format!("{request:?}");
    debug.split([' ', '{', '(']).next().unwrap_or("request").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_auth::Limits;

    #[test]
    fn read_only_covers_every_namespace_change_and_nothing_else() {
        let mkdir = MetaRequest::Mkdir { path: "/a".into(), mode: 0o755, uid: 0, gid: 0 };
        let lookup = MetaRequest::Lookup { path: "/a".into() };
        assert!(is_mutating(&mkdir));
        assert!(is_mutating(&MetaRequest::Rmdir { path: "/a".into() }));
        assert!(!is_mutating(&lookup));
        assert!(!is_mutating(&MetaRequest::Status));
        assert_eq!(request_name(&mkdir), "Mkdir");
        let peer = Peer {
            role: Role::Client,
            name: "ro".into(),
            limits: Limits { read_only: true, ..Limits::default() },
        };
        assert!(peer.limits.read_only);
    }

    #[test]
    fn resync_requests_are_known_bare_and_under_a_caller() {
        let done = MetaRequest::SyncDone { chain: 1, target: flotilla_types::TargetId(2), version: 3 };
        assert!(is_resync(&done));
        assert!(is_resync(&MetaRequest::ChainSubfiles { chain: 1, after: 0, scan_max: 1 }));
        let wrapped = MetaRequest::As { caller: flotilla_types::Caller::root(), request: Box::new(done) };
        assert!(is_resync(&wrapped), "a caller wrapper does not hide a resync request");
        assert!(!is_resync(&MetaRequest::Status));
    }
}
