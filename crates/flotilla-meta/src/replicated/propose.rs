//! The proposer's half (the first step of wiring the handlers to the group): which
//! [`NamespaceChange`] a request becomes, with what only the proposer knows filled in — its
//! clock, the targets in its order of preference, and which files its clients have open.
//!
//! The request is one the service admitted already (policy, subtree, layout bounds, a
//! grower's write right); `who` is the caller after the connection's policy. A request that
//! changes nothing in the namespace (reads, tokens, locks, opens, jobs, target reports) is
//! `None`: the service keeps serving it from memory or decides the target changes itself.

use flotilla_proto::{MetaRequest, RenameMode as WireRenameMode, WireError};
use flotilla_types::{Caller, TargetId};

use super::change::{LayoutOn, NamespaceChange, NewOwner, Op, OpenHint, Place, RenameMode};

/// What the proposer knows that a replica must not decide for itself.
pub trait ProposerView {
    /// Every live target in the order a new file should take them
    /// (`flotilla_namespace::rank_targets` over the membership's live targets).
    fn ranked_targets(&self) -> Vec<TargetId>;
    /// Whether the entry a removal at `at` would unname is open (found in the proposer's
    /// applied state and its open-file table).
    fn open_hint(&self, at: &Place) -> OpenHint;
}

fn at(parent: u64, name: &[u8]) -> Result<Place, WireError> {
    Ok(Place::At { parent, name: crate::handle_at::name(name)?.to_vec() })
}

fn owner(who: &Caller, mode: u32, uid: u32, gid: u32) -> NewOwner {
    crate::policy::owner(who, mode, uid, gid).into()
}

/// The create of `spec` at `at`.
fn create(who: &Caller, at: Place, spec: &flotilla_proto::CreateSpec, view: &impl ProposerView) -> Op {
    Op::Create {
        at,
        owner: owner(who, spec.mode, spec.uid, spec.gid),
        subfile_count: spec.subfiles,
        targets: spec.targets.clone(),
        layout: spec.layout,
        exclusive: spec.exclusive,
        ranked: view.ranked_targets(),
    }
}

/// The change `request` becomes, or `None` if it changes nothing in the namespace.
pub fn change_for(
    request: &MetaRequest,
    who: &Caller,
    now_ns: i64,
    view: &impl ProposerView,
) -> Result<Option<NamespaceChange>, WireError> {
    let op = match op_for(request, who, view)? {
        Some(op) => op,
        None => return Ok(None),
    };
    Ok(Some(NamespaceChange::new(who.clone(), now_ns, op)))
}

fn op_for(request: &MetaRequest, who: &Caller, view: &impl ProposerView) -> Result<Option<Op>, WireError> {
    use MetaRequest as R;
    let path = |p: &String| Place::Path(p.clone());
    let removal = |place: Place| {
        let open = view.open_hint(&place);
        (place, open)
    };
    let op = match request {
        R::Mkdir { path: p, mode, uid, gid } => {
            Op::Mkdir { at: path(p), owner: owner(who, *mode, *uid, *gid) }
        }
        R::MkdirAt { parent, name, mode, uid, gid } => {
            Op::Mkdir { at: at(*parent, name)?, owner: owner(who, *mode, *uid, *gid) }
        }
        R::Create { path: p, spec }
        | R::CreateOpen { path: p, spec, .. }
        | R::CreateOpenCached { path: p, spec, .. } => create(who, path(p), spec, view),
        R::CreateAt { parent, name, spec } | R::CreateAtOpen { parent, name, spec, .. } => {
            create(who, at(*parent, name)?, spec, view)
        }
        R::MknodAt { parent, name, kind, rdev, mode, uid, gid } => Op::Mknod {
            at: at(*parent, name)?,
            kind: *kind,
            rdev: *rdev,
            owner: owner(who, *mode, *uid, *gid),
        },
        R::Symlink { path: p, target, uid, gid } => {
            Op::Symlink { at: path(p), target: target.clone(), owner: owner(who, 0o777, *uid, *gid) }
        }
        R::SymlinkAt { parent, name, target, uid, gid } => Op::Symlink {
            at: at(*parent, name)?,
            target: target.clone(),
            owner: owner(who, 0o777, *uid, *gid),
        },
        R::Link { existing, new } => Op::Link { existing: existing.clone(), new: new.clone() },
        R::LinkAt { id, parent, name } => Op::LinkAt { id: *id, at: at(*parent, name)? },
        R::Unlink { path: p } => {
            let (at, open) = removal(path(p));
            Op::Unlink { at, expected_id: None, open }
        }
        R::UnlinkAt { parent, name, id } => {
            let (at, open) = removal(at(*parent, name)?);
            Op::Unlink { at, expected_id: *id, open }
        }
        R::UnlinkId { path: p, id } => {
            Op::Unlink { at: path(p), expected_id: Some(*id), open: OpenHint::NoneOpen }
        }
        R::Rmdir { path: p } => Op::Rmdir { at: path(p) },
        R::RmdirAt { parent, name } => Op::Rmdir { at: at(*parent, name)? },
        R::Rename { from, to } => {
            let (to, open) = removal(path(to));
            Op::Rename { from: path(from), to, mode: RenameMode::Replace { open } }
        }
        R::RenameNoReplace { from, to } => {
            Op::Rename { from: path(from), to: path(to), mode: RenameMode::NoReplace }
        }
        R::RenameAt { from_parent, from_name, to_parent, to_name, mode } => {
            let (from, to) = (at(*from_parent, from_name)?, at(*to_parent, to_name)?);
            let mode = match mode {
                WireRenameMode::Replace => RenameMode::Replace { open: view.open_hint(&to) },
                WireRenameMode::NoReplace => RenameMode::NoReplace,
                WireRenameMode::Exchange => RenameMode::Exchange,
            };
            Op::Rename { from, to, mode }
        }
        R::SetAttr { id, change } => Op::SetAttr { id: *id, change: change.clone() },
        R::GrowSize { id, size_bytes, mtime_ns } => {
            Op::GrowSize { id: *id, size_bytes: *size_bytes, mtime_ns: *mtime_ns }
        }
        R::SetLayout { path: p, layout, replicas } if *replicas > 1 => {
            Op::SetLayoutReplicated { on: LayoutOn::Path(p.clone()), layout: *layout, replicas: *replicas }
        }
        R::SetLayoutId { id, layout, replicas } if *replicas > 1 => {
            Op::SetLayoutReplicated { on: LayoutOn::Id(*id), layout: *layout, replicas: *replicas }
        }
        R::SetLayout { path: p, layout, .. } => {
            Op::SetLayout { on: LayoutOn::Path(p.clone()), layout: *layout }
        }
        R::SetLayoutId { id, layout, .. } => Op::SetLayout { on: LayoutOn::Id(*id), layout: *layout },
        // More replicas than one are placed on chains by the service (`chained_create`).
        R::CreateReplicated { path: p, spec, replicas } if *replicas <= 1 => create(who, path(p), spec, view),
        R::TouchAtime { id, atime_ns } => Op::TouchAtime { id: *id, atime_ns: *atime_ns },
        R::SetNoOverlapId { id, no_overlap } => Op::SetNoOverlap { id: *id, no_overlap: *no_overlap },
        _ => return Ok(None),
    };
    Ok(Some(op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::CreateSpec;

    struct View;

    impl ProposerView for View {
        fn ranked_targets(&self) -> Vec<TargetId> {
            vec![TargetId(2), TargetId(1)]
        }

        fn open_hint(&self, _: &Place) -> OpenHint {
            OpenHint::Found { id: 5, open: true }
        }
    }

    fn spec() -> CreateSpec {
        CreateSpec { mode: 0o644, uid: 7, gid: 7, subfiles: 1, targets: None, layout: None, exclusive: true }
    }

    /// Every changing request becomes a change carrying what the proposer decided; a
    /// plain user's owner is mapped as the handlers map it; reads are no change.
    #[test]
    fn changing_requests_become_changes_with_the_proposers_decisions() {
        let user = Caller { uid: 1000, gid: 1000, groups: vec![] };
        let create = MetaRequest::CreateAtOpen { parent: 1, name: b"f".to_vec(), spec: spec(), session: 3 };
        let change = change_for(&create, &user, 42, &View).unwrap().unwrap();
        assert_eq!(change.now_ns, 42);
        let Op::Create { ranked, owner, at, .. } = change.op else { panic!("{change:?}") };
        assert_eq!(ranked, vec![TargetId(2), TargetId(1)]);
        assert_eq!(owner.uid, 1000, "a plain user cannot create as another");
        assert_eq!(at, Place::At { parent: 1, name: b"f".to_vec() });
        let unlink = MetaRequest::Unlink { path: "/f".into() };
        let Op::Unlink { open, .. } = change_for(&unlink, &user, 0, &View).unwrap().unwrap().op else {
            panic!()
        };
        assert_eq!(open, OpenHint::Found { id: 5, open: true });
        let undo = MetaRequest::UnlinkId { path: "/f".into(), id: 9 };
        let Op::Unlink { open, expected_id, .. } = change_for(&undo, &user, 0, &View).unwrap().unwrap().op
        else {
            panic!()
        };
        assert_eq!((open, expected_id), (OpenHint::NoneOpen, Some(9)));
        assert_eq!(change_for(&MetaRequest::Lookup { path: "/".into() }, &user, 0, &View).unwrap(), None);
        let long = MetaRequest::MkdirAt { parent: 1, name: vec![b'a'; 300], mode: 0o755, uid: 0, gid: 0 };
        assert!(change_for(&long, &user, 0, &View).is_err(), "a name over its bound");
    }
}
