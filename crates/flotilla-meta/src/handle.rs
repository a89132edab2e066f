//! Executing one metadata request against the namespace and the membership.

use crate::membership::Membership;
use crate::opens::{OpenError, OpenTable};
use flotilla_namespace::{CreateFile, Entry, LayoutOf, Namespace, NamespaceError};
use flotilla_proto::{
    DeleteOrder, DirEntryInfo, EntryInfo, ErrorCode, MetaReply, MetaRequest, Rights, SubfilePlace,
    TargetReport, WireError,
};
use flotilla_types::{Caller, CallerPolicy, FileId, SubfileIndex, TargetId};
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Delete orders handed to a server per heartbeat, per target.
const DELETE_ORDERS_PER_TARGET_MAX: usize = 1024;
/// Most inode rows one `ChainStatus` scans to estimate the bytes left to rebuild (past it
/// the estimate is low).
const REBUILD_ESTIMATE_SCAN_MAX: usize = 1 << 20;

/// What request handlers share.
pub(crate) struct State {
    /// The namespace (on a group node, the state machine's, published for reads).
    pub namespace: crate::replicated::SharedNamespace,
    /// The metadata group this service is a node of (`None`: the direct path).
    pub group: Option<std::sync::Arc<crate::grouped::Group>>,
    pub membership: Membership,
    pub heartbeat_ms: u64,
    /// Open files per client session, and orphans. Held across the namespace transactions
    /// that consult it (unlink, rename, open, close), so an open never races a delete.
    pub opens: parking_lot::Mutex<OpenTable>,
    /// Until this instant (start + `recovery_window_ms`) a create waits for remembered
    /// targets to register again instead of placing the file on fewer of them.
    pub recovery_until: parking_lot::Mutex<Instant>,
    /// `recovery_window_ms`: also started again by a new leader of a metadata group, whose
    /// live targets are those that heartbeat to it since it leads.
    pub recovery_window: Duration,
    /// What a layout set by a create, `SetLayout` or `SetLayoutId` must keep to.
    pub layout_bounds: flotilla_types::LayoutBounds,
    /// Targets one server credential may report (`targets_per_server_max`).
    pub targets_per_server_max: usize,
    /// Tags the capabilities file entries carry.
    pub issuer: Issuer,
    /// ENWRICH job groups.
    pub jobs: crate::jobs::Jobs,
    /// Byte-range locks (fcntl, flock) of client sessions.
    pub locks: crate::locks::Locks,
    /// Byte-range tokens of client sessions, and the no-overlap hints.
    pub tokens: crate::tokens::Tokens,
    /// Inode tokens (attribute and name leases) of client sessions.
    pub inode_tokens: crate::inode_tokens::InodeTokens,
    /// Replication's chain table and membership engine (issue 32).
    pub chains: crate::chains::Chains,
}

/// The capability key and the lifetime of the capabilities the service issues.
pub(crate) struct Issuer {
    pub key: flotilla_auth::CapabilityKey,
    pub lifetime_ms: u64,
}

thread_local! {
    /// The client session whose request this thread is handling as `ChangedBy` (its inode
    /// tokens are spared by the change's revocations); set for one request at a time.
    static CHANGER: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Sets `CHANGER` for one request and clears it when dropped (a panic included).
struct ChangerScope;

impl ChangerScope {
    fn enter(changer: Option<u64>) -> ChangerScope {
        CHANGER.with(|cell| {
            debug_assert!(cell.get().is_none(), "ChangedBy handled inside another");
            cell.set(changer);
        });
        ChangerScope
    }
}

impl Drop for ChangerScope {
    fn drop(&mut self) {
        CHANGER.with(|cell| cell.set(None));
    }
}

/// The changer a `ChangedBy` names and the request it carries (`None` and the request
/// itself for any other).
pub(crate) fn changed_by(request: MetaRequest) -> (Option<u64>, MetaRequest) {
    match request {
        MetaRequest::ChangedBy { request, session } => (Some(session), *request),
        bare => (None, bare),
    }
}

/// Who asks: the caller after the connection's policy, the credential the connection
/// authenticated with (a capability's holder), and whether the connection is read-only.
pub(crate) struct Asker<'a> {
    pub(crate) who: &'a Caller,
    pub(crate) holder: &'a str,
    read_only: bool,
}

impl State {
    /// Executes one request (on a blocking thread: the namespace commits to disk).
    /// A change is acknowledged only once every other cached copy of what it touched is
    /// gone: its inode tokens are revoked (and given back, or the bounded wait is over)
    /// after it is durable and before the reply.
    ///
    /// `changer`: the client session a `ChangedBy` named (issue 34, peeled off by the
    /// caller, `changed_by`): the change revokes every inode token it touched but that
    /// session's own.
    pub fn handle_by(
        &self,
        changer: Option<u64>,
        request: MetaRequest,
        (policy, holder): (&CallerPolicy, &str),
        session: &crate::grouped::ClientSession,
    ) -> MetaReply {
        let _changer = ChangerScope::enter(changer);
        let (outcome, touched) =
            flotilla_namespace::recording(|| self.admit(request, (policy, holder), session));
        self.revoke_touched(&touched);
        match outcome {
            Ok(reply) => reply,
            Err(error) => MetaReply::Error(error),
        }
    }

    /// The namespace to read (a snapshot being installed on a group node has it for a moment).
    pub(crate) fn ns(&self) -> Result<std::sync::Arc<Namespace>, WireError> {
        self.namespace.read().clone().ok_or_else(|| {
            WireError::new(ErrorCode::Unavailable, "the namespace is being replaced by a snapshot")
        })
    }

    /// Where the chain table's changes go: the namespace (direct path) or the group's log.
    pub(crate) fn chain_store(&self) -> Result<Box<dyn crate::chains::ChainStore + '_>, WireError> {
        Ok(match &self.group {
            Some(group) => Box::new(crate::grouped::GroupChains { group, state: self }),
            None => Box::new(DirectChains(self.ns()?)),
        })
    }

    /// A namespace write outside a client's change (orphan release, target records): made
    /// here on the direct path, proposed to the group on a group node.
    pub(crate) fn write(&self, op: crate::replicated::Op) -> Result<(), WireError> {
        use crate::replicated::Op;
        if let Some(group) = &self.group {
            return group.write_blocking(op).map(|_| ());
        }
        let ns = self.ns()?;
        let written = match op {
            Op::ReleaseOrphan { id } => ns.release_orphan(id).map(|_| ()),
            Op::RecordTarget { target, server, used_bytes, free_bytes } => {
                ns.record_target(target, &server, used_bytes, free_bytes)
            }
            Op::AckDeletes { target, done } => ns.ack_deletes(target, &done),
            Op::BindTargets { credential, targets } => ns.bind_targets(&credential, &targets),
            other => {
                return Err(WireError::new(
                    ErrorCode::BadRequest,
                    format!("{other:?} is not a service write"),
                ))
            }
        };
        written.map_err(wire)
    }

    pub(crate) fn revoke_touched(&self, touched: &[flotilla_namespace::Touched]) {
        use flotilla_namespace::Touched;
        use flotilla_proto::InodeTokenKind;
        if touched.is_empty() {
            return;
        }
        let keys: Vec<crate::inode_tokens::Key> = touched
            .iter()
            .map(|t| match t {
                Touched::Attr(id) => (InodeTokenKind::Attr, *id),
                Touched::Names(id) => (InodeTokenKind::Names, *id),
            })
            .collect();
        self.inode_tokens.revoke(&keys, CHANGER.with(std::cell::Cell::get));
    }

    /// `Lookup` with inode tokens on what the answer depends on, registered before the
    /// answer is read: a first walk finds the directories and the entry, the grants are
    /// registered, and a second walk reads the answer; when the two differ (a change came
    /// between) the grants are given back and the answer goes without.
    pub(crate) fn lookup_cached(
        &self,
        path: &str,
        session: u64,
        asker: &Asker,
        created: Option<u64>,
    ) -> Result<MetaReply, WireError> {
        let shared = self.ns()?;
        let ns = &*shared;
        let (found, walked) = flotilla_namespace::walking(|| ns.lookup_as(asker.who, path));
        let entry_id = match (found, created) {
            (Ok(found), None) => found.id,
            (Ok(found), Some(id)) if found.id == id => id,
            (Err(error), None) => return Err(wire(error)),
            // The new file was renamed or removed already: it is open all the same.
            (_, Some(id)) => {
                let entry = ns.get(id).map_err(wire)?;
                return Ok(MetaReply::CachedEntry { entry: self.granted(entry, asker), grants: Vec::new() });
            }
        };
        let created = created.is_some();
        let keys: Vec<crate::inode_tokens::Key> = walked
            .iter()
            .map(|dir| (flotilla_proto::InodeTokenKind::Names, *dir))
            .chain(std::iter::once((flotilla_proto::InodeTokenKind::Attr, entry_id)))
            .collect();
        let live = self.opens.lock().touch(session, Instant::now()).is_ok();
        let grants = if live { self.inode_tokens.grant(session, &keys) } else { None };
        let (again, walked_again) = flotilla_namespace::walking(|| ns.lookup_as(asker.who, path));
        let entry = match again {
            Ok(entry) => entry,
            Err(error) => {
                if let Some(grants) = &grants {
                    self.inode_tokens.release(session, grants)?;
                }
                if !created {
                    return Err(wire(error));
                }
                // The new file was renamed or removed already: it is open all the same.
                let entry = ns.get(entry_id).map_err(wire)?;
                return Ok(MetaReply::CachedEntry { entry: self.granted(entry, asker), grants: Vec::new() });
            }
        };
        let consistent = entry.id == entry_id && walked_again == walked;
        // A create answers with its own file, whatever the path names now.
        let entry = if created && !consistent { ns.get(entry_id).map_err(wire)? } else { entry };
        let grants = match grants {
            Some(grants) if consistent => grants,
            Some(grants) => {
                self.inode_tokens.release(session, &grants)?;
                Vec::new()
            }
            None => Vec::new(),
        };
        Ok(MetaReply::CachedEntry { entry: self.granted(entry, asker), grants })
    }

    /// Maps the claimed caller by the connection's policy and refuses what the policy
    /// forbids (read-only, outside the subtree) before running the request.
    fn admit(
        &self,
        request: MetaRequest,
        (policy, holder): (&CallerPolicy, &str),
        session: &crate::grouped::ClientSession,
    ) -> Result<MetaReply, WireError> {
        let (sequenced, request) = match request {
            MetaRequest::Sequenced { session, sequence, acknowledged_through, request } => {
                (Some(crate::grouped::Sequenced { session, sequence, acknowledged_through }), *request)
            }
            bare => (None, bare),
        };
        let (claimed, request) = match request {
            MetaRequest::As { caller, request } => (caller, *request),
            bare => (Caller::root(), bare),
        };
        if matches!(
            request,
            MetaRequest::As { .. } | MetaRequest::Sequenced { .. } | MetaRequest::ChangedBy { .. }
        ) {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                "a caller or sequenced request may not be nested (Sequenced outermost, then As)",
            ));
        }
        claimed.check().map_err(|e| WireError::new(ErrorCode::BadRequest, e.to_string()))?;
        crate::policy::admit(&request, policy)?;
        self.admit_at(&request, policy)?;
        let who = policy.effective(&claimed);
        if let MetaRequest::GroupMembership(change) = request {
            return self.group_membership(change, &who, policy);
        }
        let asker = Asker { who: &who, holder, read_only: policy.read_only };
        match &self.group {
            Some(group) => self.on_group(group, request, &asker, (session, sequenced)),
            None => self.dispatch(request, &asker),
        }
    }

    /// `flotilla meta add|remove|status`: admins only (root, not squashed, on a connection
    /// neither read-only nor confined to a subtree), on a group node.
    fn group_membership(
        &self,
        request: flotilla_proto::GroupMembershipRequest,
        who: &Caller,
        policy: &CallerPolicy,
    ) -> Result<MetaReply, WireError> {
        if !who.is_root() || policy.read_only || policy.subtree.is_some() {
            return Err(WireError::new(
                ErrorCode::PermissionDenied,
                "the metadata group's membership is for admins: root on a credential that is not \
                 read-only, squashed or confined to a subtree",
            ));
        }
        match &self.group {
            Some(group) => group.membership(request),
            None => Err(WireError::new(
                ErrorCode::Unsupported,
                "this metadata service is not a group node (started without --node-id/--peers)",
            )),
        }
    }

    pub(crate) fn dispatch(&self, request: MetaRequest, asker: &Asker) -> Result<MetaReply, WireError> {
        let shared = self.ns()?;
        let (ns, who) = (&*shared, asker.who);
        let now = now_ns();
        let reply = match request {
            MetaRequest::As { .. } | MetaRequest::Sequenced { .. } | MetaRequest::ChangedBy { .. } => {
                return Err(WireError::new(ErrorCode::BadRequest, "a caller request may not be nested"))
            }
            MetaRequest::InodeCached { session, ask } => return self.inode_cached(session, ask, asker),
            // Not on a group: no reply table, changes are sent bare.
            MetaRequest::OpenGroupSession => MetaReply::GroupSession { session: 0 },
            request @ (MetaRequest::LookupAt { .. }
            | MetaRequest::CreateAt { .. }
            | MetaRequest::CreateAtOpen { .. }
            | MetaRequest::MkdirAt { .. }
            | MetaRequest::MknodAt { .. }
            | MetaRequest::SymlinkAt { .. }
            | MetaRequest::LinkAt { .. }
            | MetaRequest::UnlinkAt { .. }
            | MetaRequest::RmdirAt { .. }
            | MetaRequest::RenameAt { .. }
            | MetaRequest::ReaddirId { .. }
            | MetaRequest::ReaddirPlusId { .. }) => return self.dispatch_at(request, asker, now),
            MetaRequest::Lookup { path } => {
                MetaReply::Entry(self.granted(ns.lookup_as(who, &path).map_err(wire)?, asker))
            }
            MetaRequest::Mkdir { path, mode, uid, gid } => {
                let owner = crate::policy::owner(who, mode, uid, gid);
                MetaReply::Entry(self.info(ns.mkdir_as(who, &path, owner, now).map_err(wire)?))
            }
            MetaRequest::Create { path, spec } => {
                let at = flotilla_namespace::Place::Path(&path);
                MetaReply::Entry(self.granted(self.create_inheriting(who, at, spec, now)?, asker))
            }
            MetaRequest::CreateOpen { path, spec, session } => {
                let created =
                    self.create_inheriting(who, flotilla_namespace::Place::Path(&path), spec, now)?;
                MetaReply::Entry(self.granted(self.opened(session, created.id)?, asker))
            }
            MetaRequest::LookupCached { path, session } => {
                return self.lookup_cached(&path, session, asker, None)
            }
            MetaRequest::CreateOpenCached { path, spec, session } => {
                // The create's own revocations go first (its reply's grants are not theirs).
                let (created, touched) = flotilla_namespace::recording(|| -> Result<u64, WireError> {
                    let at = flotilla_namespace::Place::Path(&path);
                    let created = self.create_inheriting(who, at, spec, now)?;
                    Ok(self.opened(session, created.id)?.id)
                });
                self.revoke_touched(&touched);
                return self.lookup_cached(&path, session, asker, Some(created?));
            }
            MetaRequest::InodeTokenWait { session, holding, wait_ms } => {
                if holding {
                    self.opens.lock().renew_idle(session, Instant::now());
                }
                let (revokes, lost) = self.inode_tokens.wait(session, holding, wait_ms)?;
                MetaReply::InodeEvents { revokes, lost }
            }
            MetaRequest::InodeTokenRelease { session, tokens } => {
                self.inode_tokens.release(session, &tokens)?;
                MetaReply::Done
            }
            MetaRequest::Readdir { path } => MetaReply::Entries(
                ns.readdir_as(who, &path)
                    .map_err(wire)?
                    .into_iter()
                    .map(|e| DirEntryInfo { name: e.name_lossy(), id: e.id, kind: e.kind })
                    .collect(),
            ),
            MetaRequest::Unlink { path } => {
                self.remove(|is_open| ns.unlink_keeping_open_as(who, &path, is_open, now).map(|_| ()))?
            }
            MetaRequest::RenameNoReplace { from, to } => done(ns.rename_no_replace_as(who, &from, &to, now))?,
            MetaRequest::Opened { session, id } => {
                MetaReply::Entry(self.granted(self.opened(session, id)?, asker))
            }
            MetaRequest::OpenPath { path, session } => {
                let found = ns.lookup_as(who, &path).map_err(wire)?;
                let entry = match found.file.is_some() {
                    true => self.opened(session, found.id)?,
                    false => found,
                };
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::Closed { session, id } => {
                self.closed(session, id)?;
                MetaReply::Done
            }
            MetaRequest::KeepOpen { session, files } => {
                self.opens.lock().renew(session, &files, Instant::now()).map_err(open_error)?;
                MetaReply::Done
            }
            MetaRequest::UnlinkId { path, id } => done(ns.unlink_id_as(who, &path, id, now).map(|_| ()))?,
            MetaRequest::Rmdir { path } => done(ns.rmdir_as(who, &path, now))?,
            MetaRequest::Rename { from, to } => {
                self.remove(|is_open| ns.rename_keeping_open_as(who, &from, &to, is_open, now).map(|_| ()))?
            }
            MetaRequest::SetAttr { id, change } => {
                MetaReply::Attributes(ns.set_attr_as(who, id, &change, now).map_err(wire)?)
            }
            MetaRequest::Symlink { path, target, uid, gid } => {
                let owner = crate::policy::owner(who, 0o777, uid, gid);
                MetaReply::Entry(self.info(ns.symlink_as(who, &path, &target, owner, now).map_err(wire)?))
            }
            MetaRequest::Link { existing, new } => {
                MetaReply::Entry(self.granted(ns.link_as(who, &existing, &new, now).map_err(wire)?, asker))
            }
            MetaRequest::GetById { id } => MetaReply::Entry(self.granted(ns.get(id).map_err(wire)?, asker)),
            MetaRequest::GrowSize { id, size_bytes, mtime_ns } => {
                self.require_writer(id, asker)?;
                MetaReply::Attributes(ns.grow_size(id, size_bytes, mtime_ns, now).map_err(wire)?)
            }
            MetaRequest::SetLayout { path, layout, replicas } => {
                let entry = self.set_layout(who, LayoutOf::Path(&path), layout, replicas, now)?;
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::CountInodes => MetaReply::Inodes { count: ns.inode_count().map_err(wire)? },
            MetaRequest::TouchAtime { id, atime_ns } => {
                MetaReply::Attributes(ns.touch_atime_as(who, id, atime_ns, now).map_err(wire)?)
            }
            MetaRequest::SetLayoutId { id, layout, replicas } => {
                let entry = self.set_layout(who, LayoutOf::Id(id), layout, replicas, now)?;
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::SetLock { session, id, owner, kind, start, end, pid, wait_ms } => {
                MetaReply::Lock(self.locks.set(id, (session, owner), kind, (start, end), pid, wait_ms)?)
            }
            MetaRequest::GetLock { session, id, owner, kind, start, end } => {
                MetaReply::Lock(self.locks.get(id, (session, owner), kind, (start, end))?)
            }
            MetaRequest::ReleaseLocks { session, id, owner } => {
                self.locks.release_owner(id, (session, owner));
                MetaReply::Done
            }
            MetaRequest::ReclaimLocks { session, locks } => {
                self.reclaim_locks(session, &locks)?;
                MetaReply::Done
            }
            MetaRequest::TokenAcquire { session, id, mode, required, desired, wait_ms } => {
                match self.tokens.acquire((id, session), mode, (required, desired), wait_ms)? {
                    Ok(grant) => MetaReply::TokenGranted(grant),
                    Err(holder) => MetaReply::TokenBusy { holder },
                }
            }
            MetaRequest::TokenRelease { session, id, range, to } => {
                self.tokens.release((id, session), range, to)?;
                MetaReply::Done
            }
            MetaRequest::TokenWait { session, holding, wait_ms } => {
                if holding {
                    self.opens.lock().renew_idle(session, Instant::now());
                }
                let (revokes, lost) = self.tokens.wait(session, holding, wait_ms)?;
                MetaReply::TokenEvents { revokes, lost }
            }
            MetaRequest::SetNoOverlapId { id, no_overlap } => {
                let entry = ns.set_no_overlap_as(who, id, no_overlap, now).map_err(wire)?;
                self.tokens.set_no_overlap(id, no_overlap);
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::JobJoin { name, size } => {
                let (member, epoch, event) = self.jobs.join(&name, size)?;
                MetaReply::JobJoined { member, epoch, event }
            }
            MetaRequest::JobFlush { name, member, epoch, clock, durable } => {
                self.jobs.ask_flush(&name, member, (epoch, durable), clock)?;
                MetaReply::Done
            }
            MetaRequest::JobWait { name, member, epoch, clock, wait_ms } => {
                MetaReply::Job(self.jobs.wait(&name, member, (epoch, clock), wait_ms)?)
            }
            MetaRequest::JobReclaim { name, size, member, epoch, known } => {
                let reclaim = crate::jobs::Reclaim { size, member, epoch, known };
                let (member, epoch, event) = self.jobs.reclaim(&name, &reclaim)?;
                MetaReply::JobJoined { member, epoch, event }
            }
            MetaRequest::JobLeave { name, member, epoch } => {
                self.jobs.leave(&name, member, epoch)?;
                MetaReply::Done
            }
            MetaRequest::Status => MetaReply::Status(self.membership.status(&ns.targets().map_err(wire)?)),
            MetaRequest::Register { server, targets } => {
                self.report(&server, &targets)?;
                MetaReply::Registered { heartbeat_ms: self.heartbeat_ms }
            }
            MetaRequest::Heartbeat { server, targets, deleted } => {
                self.report(&server, &targets)?;
                self.acknowledge(&deleted)?;
                MetaReply::HeartbeatAck { delete: self.delete_orders(&targets)? }
            }
            MetaRequest::RegisterMember { server, targets, member } => {
                self.report(&server, &targets)?;
                self.chains.report(&*self.chain_store()?, &targets, &member)?;
                MetaReply::Registered { heartbeat_ms: self.heartbeat_ms }
            }
            MetaRequest::HeartbeatMember { server, targets, deleted, member } => {
                self.report(&server, &targets)?;
                self.chains.report(&*self.chain_store()?, &targets, &member)?;
                self.acknowledge(&deleted)?;
                let delete = self.delete_orders(&targets)?;
                MetaReply::HeartbeatChains { delete, view: self.chains.view_for(&targets) }
            }
            MetaRequest::ChainStatus { chains } => {
                let mut report = self.chains.report_status(chains);
                let rebuilding = self.chains.rebuilding();
                let (sums, _complete) =
                    ns.chain_bytes_estimate(&rebuilding, REBUILD_ESTIMATE_SCAN_MAX).map_err(wire)?;
                report.rebuild_bytes_left = sums.values().sum();
                self.chains.gauges.rebuild_bytes_left.store(report.rebuild_bytes_left, Ordering::Relaxed);
                MetaReply::Chains(report)
            }
            MetaRequest::TargetAdmin { target, action } => {
                if !who.is_root() || asker.read_only {
                    return Err(WireError::new(
                        ErrorCode::PermissionDenied,
                        format!(
                            "{action} of target {target} is for administrators: the credential must act as root \
                             and be neither read-only nor confined to a subtree"
                        ),
                    ));
                }
                self.chains.admin(&*self.chain_store()?, target, action)?;
                MetaReply::Done
            }
            MetaRequest::CreateReplicated { path, spec, replicas } => {
                let layout = spec.layout;
                // After a restart this waits (bounded) for remembered targets, as any create.
                let (create, live) = self.prepare_create(who, spec)?;
                self.check_replicas(layout, replicas, &live)?;
                if replicas <= 1 {
                    return Ok(MetaReply::Entry(
                        self.granted(
                            ns.create_file_as(who, &path, &create, &live, now).map_err(wire)?,
                            asker,
                        ),
                    ));
                }
                if let Ok(existing) = ns.lookup_as(who, &path) {
                    if !create.exclusive && existing.file.is_some() {
                        // An existing file is returned unchanged, as `Create` does.
                        return Ok(MetaReply::Entry(self.granted(existing, asker)));
                    }
                }
                let chains = self.place_on_chains(&path, &create, replicas)?;
                let at = flotilla_namespace::Place::Path(&path);
                let entry = ns
                    .create_file_chained_in(who, at, &create, replicas as u8, &chains, now)
                    .map_err(wire)?;
                MetaReply::Entry(self.granted(entry, asker))
            }
            MetaRequest::ChainSubfiles { chain, after, scan_max } => {
                let scan_max = scan_max.clamp(1, flotilla_proto::CHAIN_SUBFILES_SCAN_MAX) as usize;
                let page = ns.chain_subfiles(chain, after, scan_max).map_err(wire)?;
                MetaReply::ChainSubfiles { subfiles: page.subfiles, next: page.next }
            }
            MetaRequest::SyncDone { chain, target, version } => {
                self.chains.sync_done(&*self.chain_store()?, chain, target, version)?;
                MetaReply::Done
            }
            // Answered before dispatch (`group_membership`).
            MetaRequest::GroupMembership(_) => {
                return Err(WireError::new(ErrorCode::BadRequest, "a membership request reached dispatch"))
            }
            MetaRequest::GetChains { chains } => {
                if chains.len() > flotilla_proto::CHAINS_PER_REQUEST_MAX {
                    return Err(WireError::new(
                        ErrorCode::OverLimit,
                        format!(
                            "{} chains asked for; at most {} per request",
                            chains.len(),
                            flotilla_proto::CHAINS_PER_REQUEST_MAX
                        ),
                    ));
                }
                let found = self.chains.chains_by_id(&chains);
                let mut out = Vec::with_capacity(found.len());
                for (id, info) in chains.iter().zip(found) {
                    let info = info.ok_or_else(|| {
                        WireError::new(ErrorCode::NotFound, format!("chain {id} is not in the chain table"))
                    })?;
                    out.push(self.subfile_chain(info));
                }
                MetaReply::SubfileChains(out)
            }
        };
        Ok(reply)
    }

    /// `SetLayout` and `SetLayoutId`: the layout checked against the bounds and the
    /// cluster, then set if `who` owns the entry (checked in the namespace's transaction).
    fn set_layout(
        &self,
        who: &Caller,
        of: LayoutOf<'_>,
        layout: Option<flotilla_types::Layout>,
        replicas: u32,
        now: i64,
    ) -> Result<Entry, WireError> {
        self.check_layout(layout.as_ref())?;
        self.ns()?.set_layout_replicated_as(who, of, layout, replicas, now).map_err(wire)
    }

    /// A create that asks for no replica count (`Create`, `CreateAt`, `CreateOpen` and the
    /// like): the file takes its directory's default count (issue 32), placed on chains as
    /// `CreateReplicated` places it when that count is above 1.
    pub(crate) fn create_inheriting(
        &self,
        who: &Caller,
        at: flotilla_namespace::Place<'_>,
        spec: flotilla_proto::CreateSpec,
        now: i64,
    ) -> Result<Entry, WireError> {
        let ns = self.ns()?;
        let layout = spec.layout;
        let (create, live) = self.prepare_create(who, spec)?;
        let parent = match at {
            flotilla_namespace::Place::Path(path) => {
                let parent = match path.trim_end_matches('/').rsplit_once('/') {
                    Some(("", _)) | None => "/",
                    Some((parent, _)) => parent,
                };
                ns.lookup_follow(parent).ok()
            }
            flotilla_namespace::Place::At { parent, .. } => ns.get(parent).ok(),
        };
        let (default_layout, replicas) =
            parent.map(|p| (p.default_layout, p.default_replicas)).unwrap_or((None, 1));
        if replicas <= 1 {
            return ns.create_file_in(who, at, &create, &live, now).map_err(wire);
        }
        self.check_replicas(layout.or(default_layout), replicas, &live)?;
        let existing = match at {
            flotilla_namespace::Place::Path(path) => ns.lookup_as(who, path),
            flotilla_namespace::Place::At { parent, name } => ns.lookup_at(who, parent, name),
        };
        if let Ok(existing) = existing {
            if !create.exclusive && existing.file.is_some() {
                return Ok(existing);
            }
        }
        let chains = self.place_with_default(&create, default_layout, replicas)?;
        ns.create_file_chained_in(who, at, &create, replicas as u8, &chains, now).map_err(wire)
    }

    /// Runs a namespace change that may drop a file's last name (unlink, rename over), with
    /// the open table locked: a file some client has open becomes an orphan, not deleted.
    pub(crate) fn remove(
        &self,
        change: impl FnOnce(flotilla_namespace::IsOpen<'_>) -> Result<(), NamespaceError>,
    ) -> Result<MetaReply, WireError> {
        // The open-file table is held across the change (an open cannot slip between the
        // check and the unlink) but not across the group commit's fsync.
        let applied = self.ns()?.with_deferred_ack(|| {
            let mut opens = self.opens.lock();
            let orphaned = Cell::new(None);
            let now = Instant::now();
            let is_open = |id: u64| {
                let open = opens.may_be_open(id, now);
                if open {
                    orphaned.set(Some(id));
                }
                open
            };
            change(&is_open).map_err(wire)?;
            if let Some(id) = orphaned.get() {
                opens.add_orphan(id);
            }
            Ok(MetaReply::Done)
        });
        applied.map_err(wire)?
    }

    /// Records an open of file `id` by `session`; fails if the file is gone.
    pub(crate) fn opened(&self, session: u64, id: u64) -> Result<Entry, WireError> {
        let mut opens = self.opens.lock();
        let entry = self.ns()?.get(id).map_err(wire)?;
        if entry.file.is_some() {
            opens.open(session, id, Instant::now()).map_err(open_error)?;
        }
        Ok(entry)
    }

    /// Records a close; the last close of an orphan deletes it.
    fn closed(&self, session: u64, id: u64) -> Result<(), WireError> {
        let mut opens = self.opens.lock();
        // A session keeps the tokens of files it closed (a later open reuses the kernel's
        // page cache under them): it lives on, renewed by its token polls.
        let keep = self.tokens.holds_any(session) || self.inode_tokens.holds_any(session);
        opens.close(session, id, keep);
        if opens.is_releasable(id, Instant::now()) {
            self.write(crate::replicated::Op::ReleaseOrphan { id })?;
            opens.released(id);
        }
        Ok(())
    }

    /// `ReclaimLocks`: a lock needs its file open by the session (re-announced first).
    fn reclaim_locks(&self, session: u64, locks: &[flotilla_proto::HeldLock]) -> Result<(), WireError> {
        if locks.len() > flotilla_proto::RECLAIM_LOCKS_MAX {
            return Err(WireError::new(
                ErrorCode::OverLimit,
                format!(
                    "{} locks in one reclaim, the limit is {}",
                    locks.len(),
                    flotilla_proto::RECLAIM_LOCKS_MAX
                ),
            ));
        }
        let opens = self.opens.lock();
        if let Some(lock) = locks.iter().find(|lock| !opens.holds(session, lock.id)) {
            return Err(WireError::new(
                ErrorCode::LockLost,
                format!(
                    "cannot reclaim a lock on file {}: session {session:#x} does not have it open",
                    lock.id
                ),
            ));
        }
        // Held while the locks go in, so the sweeper cannot end the session in between.
        self.locks.reclaim(session, locks)
    }

    /// Ends expired client sessions and deletes the orphans nobody has open any more.
    pub fn sweep_opens(&self) {
        // A new leader starts its term (and the open grace period) before releasing anything.
        let leading = self.group.as_ref().is_none_or(|group| self.lead(group).is_ok());
        let mut opens = self.opens.lock();
        let now = Instant::now();
        opens.expire(now);
        // A lock needs an open file: the locks of sessions with nothing open went with them.
        self.locks.retain_sessions(|session| opens.has_session(session));
        self.tokens.retain_sessions(|session| opens.has_session(session));
        self.inode_tokens.retain_sessions(|session| opens.has_session(session));
        if !leading {
            return;
        }
        for id in opens.releasable(now) {
            match self.write(crate::replicated::Op::ReleaseOrphan { id }) {
                Ok(_) => opens.released(id),
                Err(error) => tracing::warn!(file = id, %error, "cannot release an orphan; will retry"),
            }
        }
    }

    /// The live targets a create may use. During the recovery window after a restart, a
    /// create that needs more targets than are live waits (bounded) for the targets the
    /// namespace remembers to register again, instead of failing or placing fewer subfiles.
    /// A create request checked against the cluster's targets, with the targets to place it
    /// on (the same for `Create` and `CreateAt`).
    pub(crate) fn prepare_create(
        &self,
        who: &Caller,
        spec: flotilla_proto::CreateSpec,
    ) -> Result<(CreateFile, Vec<flotilla_namespace::TargetUsage>), WireError> {
        self.check_layout(spec.layout.as_ref())?;
        let create = CreateFile {
            owner: crate::policy::owner(who, spec.mode, spec.uid, spec.gid),
            subfile_count: spec.subfiles,
            targets: spec.targets,
            layout: spec.layout,
            exclusive: spec.exclusive,
        };
        let live = self.live_for_create(&create);
        Ok((create, live))
    }

    pub(crate) fn live_for_create(&self, create: &CreateFile) -> Vec<flotilla_namespace::TargetUsage> {
        loop {
            let live = self.membership.live();
            if Instant::now() >= *self.recovery_until.lock() {
                return live;
            }
            let remembered = self.ns().ok().and_then(|ns| ns.targets().ok()).map_or(0, |t| t.len());
            let wanted = match (create.subfile_count, &create.targets) {
                (_, Some(named)) => named.len(),
                (0, None) => create.layout.and_then(|l| l.subfile_count()).map_or(remembered, |c| c as usize),
                (count, None) => count as usize,
            };
            let named_live = create
                .targets
                .as_ref()
                .is_none_or(|named| named.iter().all(|t| live.iter().any(|l| l.target == *t)));
            if live.len() >= wanted.min(remembered) && named_live {
                return live;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Refuses a layout outside the configured bounds (`[meta] layout_*`) or one no create
    /// could place.
    pub(crate) fn check_layout(&self, layout: Option<&flotilla_types::Layout>) -> Result<(), WireError> {
        self.check_satisfiable(layout)?;
        if let Some(layout) = layout {
            let bounds = &self.layout_bounds;
            layout
                .check_bounds(bounds)
                .map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        }
        Ok(())
    }

    /// Refuses a layout that asks for more subfiles than the cluster has storage targets:
    /// each subfile needs a target of its own, so no create could ever place such a file.
    pub(crate) fn check_satisfiable(&self, layout: Option<&flotilla_types::Layout>) -> Result<(), WireError> {
        let Some(count) = layout.and_then(flotilla_types::Layout::subfile_count) else { return Ok(()) };
        let remembered = self.ns()?.targets().map_err(wire)?.len();
        let known = remembered.max(self.membership.live().len());
        if count as usize > known {
            let message = format!(
                "layout asks for {count} subfiles, but the cluster has {known} storage targets \
                 (each subfile needs a target of its own)"
            );
            return Err(WireError::new(ErrorCode::InvalidArgument, message));
        }
        Ok(())
    }

    /// Refuses a create of more than one replica: too few failure groups, or (for now) no
    /// data path for replicated writes; see `chains.rs`.
    pub(crate) fn check_replicas(
        &self,
        layout: Option<flotilla_types::Layout>,
        replicas: u32,
        live: &[flotilla_namespace::TargetUsage],
    ) -> Result<(), WireError> {
        let layout = layout.unwrap_or(flotilla_namespace::DEFAULT_LAYOUT);
        let layout = flotilla_types::ReplicatedLayout::new(layout, replicas)
            .map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        let live: Vec<TargetId> = live.iter().map(|t| t.target).collect();
        self.chains.check_create(&layout, &live).map_err(|refusal| refusal.wire())
    }

    /// The chains (with their heads) a new replicated file at `path` is placed on: one per
    /// subfile of its layout (its own, else the parent directory's default), or as many
    /// disjoint chains as there are when the layout leaves the count open.
    fn place_on_chains(
        &self,
        path: &str,
        create: &CreateFile,
        replicas: u32,
    ) -> Result<Vec<(u32, TargetId)>, WireError> {
        let parent_default = || {
            let parent = match path.trim_end_matches('/').rsplit_once('/') {
                Some(("", _)) | None => "/",
                Some((parent, _)) => parent,
            };
            self.ns().ok().and_then(|ns| ns.lookup_follow(parent).ok()).and_then(|e| e.default_layout)
        };
        self.place_with_default(create, parent_default(), replicas)
    }

    /// `place_on_chains` with the parent directory's default layout given.
    pub(crate) fn place_with_default(
        &self,
        create: &CreateFile,
        parent_default: Option<flotilla_types::Layout>,
        replicas: u32,
    ) -> Result<Vec<(u32, TargetId)>, WireError> {
        let layout = create.layout.or(parent_default).unwrap_or(flotilla_namespace::DEFAULT_LAYOUT);
        let count = match create.subfile_count {
            0 => layout.subfile_count().map(|c| c as usize),
            count => Some(count as usize),
        };
        let replicated = flotilla_types::ReplicatedLayout::new(layout, replicas)
            .map_err(|e| WireError::new(ErrorCode::InvalidArgument, e.to_string()))?;
        self.chains.choose_for_file(&replicated, count).map_err(|refusal| refusal.wire())
    }

    /// A chain as a client sees it: each member with the address of its target's server.
    fn subfile_chain(&self, info: flotilla_proto::ChainInfo) -> flotilla_proto::SubfileChain {
        let members = info
            .members
            .into_iter()
            .map(|m| flotilla_proto::ReplicaPlace {
                target: m.target,
                server: self.server_of(m.target),
                state: m.state,
            })
            .collect();
        flotilla_proto::SubfileChain { chain: info.chain, version: info.version, members }
    }

    /// The address of the server that last registered `target` ("" if none did).
    fn server_of(&self, target: TargetId) -> String {
        if let Some((server, _)) = self.membership.place(target) {
            return server;
        }
        let remembered = self.ns().ok().and_then(|ns| ns.targets().ok()).unwrap_or_default();
        remembered.into_iter().find(|r| r.target == target).map(|r| r.server_addr).unwrap_or_default()
    }

    /// Updates membership, and persists targets that are new or moved (a durable write, so
    /// not on every heartbeat).
    fn report(&self, server: &str, targets: &[TargetReport]) -> Result<(), WireError> {
        for report in self.membership.report(server, targets) {
            self.write(crate::replicated::Op::RecordTarget {
                target: report.target,
                server: server.to_string(),
                used_bytes: report.used_bytes,
                free_bytes: report.free_bytes,
            })?;
            tracing::info!(%server, target = %report.target, "target registered");
        }
        Ok(())
    }

    fn acknowledge(&self, deleted: &[DeleteOrder]) -> Result<(), WireError> {
        let mut by_target: std::collections::BTreeMap<TargetId, Vec<(FileId, SubfileIndex)>> =
            Default::default();
        for order in deleted {
            by_target.entry(order.target).or_default().push((order.file, order.subfile));
        }
        for (target, done) in by_target {
            self.write(crate::replicated::Op::AckDeletes { target, done })?;
        }
        Ok(())
    }

    fn delete_orders(&self, targets: &[TargetReport]) -> Result<Vec<DeleteOrder>, WireError> {
        let mut orders = Vec::new();
        let ns = self.ns()?;
        for report in targets {
            let pending = ns.pending_deletes(report.target, DELETE_ORDERS_PER_TARGET_MAX).map_err(wire)?;
            orders.extend(pending.into_iter().map(|(file, subfile)| DeleteOrder {
                target: report.target,
                file,
                subfile,
            }));
        }
        Ok(orders)
    }

    /// The client's view of an entry: each subfile's target with its server and state.
    /// `info` plus the capability `asker` gets on a file: read if it may read the file,
    /// write, truncate and remove if it may write it (an owner may do both: it could
    /// chmod itself the rights anyway); nothing on a read-only connection but read.
    pub(crate) fn granted(&self, entry: Entry, asker: &Asker) -> EntryInfo {
        let rights = rights_for(&entry.attrs, asker);
        let mut info = self.info(entry);
        if !rights.is_empty() && !info.subfiles.is_empty() {
            let grant = flotilla_auth::Grant {
                file: info.file_id(),
                subfiles: info.subfiles.len() as u32,
                rights,
                holder: asker.holder.to_string(),
                lifetime_ms: self.issuer.lifetime_ms,
            };
            info.capability = self.issuer.key.issue(&grant, flotilla_auth::now_unix_ms()).ok();
        }
        info
    }

    /// Refuses a size change from a caller that may not write file `id`.
    pub(crate) fn require_writer(&self, id: u64, asker: &Asker) -> Result<(), WireError> {
        let entry = self.ns()?.get(id).map_err(wire)?;
        if rights_for(&entry.attrs, asker).contains(Rights::WRITE) {
            return Ok(());
        }
        Err(WireError::new(
            ErrorCode::PermissionDenied,
            format!("file {id}: write permission needed to grow its size"),
        ))
    }

    pub(crate) fn info(&self, entry: Entry) -> EntryInfo {
        let remembered = || self.ns().ok().and_then(|ns| ns.targets().ok()).unwrap_or_default();
        let replicas = entry.file.as_ref().map_or(entry.default_replicas, |f| f.replicas);
        let (layout, subfiles) = match &entry.file {
            Some(file) => {
                let mut records = None;
                let places = file
                    .targets
                    .iter()
                    .map(|target| match self.membership.place(*target) {
                        Some((server, up)) => SubfilePlace { target: *target, server, up, chain: None },
                        None => {
                            let records = records.get_or_insert_with(remembered);
                            let server = records
                                .iter()
                                .find(|r| r.target == *target)
                                .map(|r| r.server_addr.clone())
                                .unwrap_or_default();
                            SubfilePlace { target: *target, server, up: false, chain: None }
                        }
                    })
                    .collect();
                let places = if file.chains.is_empty() { places } else { self.chained_places(file, places) };
                (Some(file.layout), places)
            }
            None => (entry.default_layout, Vec::new()),
        };
        EntryInfo {
            id: entry.id,
            attrs: entry.attrs,
            layout,
            subfiles,
            symlink: entry.symlink_target,
            capability: None,
            no_overlap: self.tokens.no_overlap(entry.id),
            replicas,
        }
    }
}

impl State {
    /// A replicated file's places: each subfile's chain as the engine has it now, its head
    /// (the first member of the write path) as the subfile's target and server. A chain the
    /// table lost keeps the recorded target, without a chain (requests to it then fail).
    fn chained_places(
        &self,
        file: &flotilla_namespace::FileRecord,
        places: Vec<SubfilePlace>,
    ) -> Vec<SubfilePlace> {
        let infos = self.chains.chains_by_id(&file.chains);
        places
            .into_iter()
            .zip(infos)
            .map(|(place, info)| {
                let Some(info) = info else { return place };
                let chain = self.subfile_chain(info);
                let serving =
                    |m: &&flotilla_proto::ReplicaPlace| m.state == flotilla_proto::ChainMemberState::Serving;
                let syncing = |m: &&flotilla_proto::ReplicaPlace| {
                    matches!(m.state, flotilla_proto::ChainMemberState::Syncing { .. })
                };
                let head = chain.members.iter().find(serving).or_else(|| chain.members.iter().find(syncing));
                let (target, server, up) = match head {
                    Some(head) => {
                        let up = self.membership.place(head.target).is_some_and(|(_, up)| up);
                        (head.target, head.server.clone(), up)
                    }
                    None => (place.target, place.server.clone(), false),
                };
                SubfilePlace { target, server, up, chain: Some(chain) }
            })
            .collect()
    }
}

/// The direct path's chain store: the namespace itself.
struct DirectChains(std::sync::Arc<Namespace>);

impl crate::chains::ChainStore for DirectChains {
    fn stored(&self) -> Result<flotilla_namespace::StoredChains, WireError> {
        crate::chains::ChainStore::stored(&*self.0)
    }

    fn record(&self, change: flotilla_namespace::ChainChange<'_>) -> Result<(), WireError> {
        crate::chains::ChainStore::record(&*self.0, change)
    }
}

fn open_error(error: OpenError) -> WireError {
    WireError::new(ErrorCode::OverLimit, error.to_string())
}

/// The data rights `asker` has on a file with `attrs`.
fn rights_for(attrs: &flotilla_types::Attributes, asker: &Asker) -> Rights {
    use flotilla_namespace::access::{allows, READ, WRITE};
    if attrs.kind != flotilla_types::FileKind::File {
        return Rights::NONE;
    }
    let owner = asker.who.uid == attrs.uid;
    let mut rights = Rights::NONE;
    if owner || allows(attrs, asker.who, READ) {
        rights = rights.union(Rights::READ);
    }
    if !asker.read_only && (owner || allows(attrs, asker.who, WRITE)) {
        rights = rights.union(Rights::WRITE).union(Rights::TRUNCATE).union(Rights::REMOVE);
    }
    rights
}

fn done(outcome: Result<(), NamespaceError>) -> Result<MetaReply, WireError> {
    outcome.map(|()| MetaReply::Done).map_err(wire)
}

/// The wire form of a namespace error.
pub(crate) fn wire(error: NamespaceError) -> WireError {
    use flotilla_namespace as ns;
    let code = match error.errno() {
        ns::ENOENT => ErrorCode::NotFound,
        ns::EEXIST => ErrorCode::AlreadyExists,
        ns::ENOTDIR => ErrorCode::NotADirectory,
        ns::EISDIR => ErrorCode::IsADirectory,
        ns::ENOTEMPTY => ErrorCode::NotEmpty,
        ns::ENAMETOOLONG => ErrorCode::NameTooLong,
        ns::ENOSPC => ErrorCode::NoSpace,
        ns::EPERM | ns::EACCES | ns::EROFS => ErrorCode::PermissionDenied,
        ns::EIO => ErrorCode::Io,
        _ => ErrorCode::InvalidArgument,
    };
    if code == ErrorCode::Io {
        tracing::error!(%error, "namespace operation failed");
    }
    WireError::new(code, error.to_string())
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
