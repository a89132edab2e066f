//! Executing one metadata request against the namespace and the membership.

use crate::membership::Membership;
use flotilla_namespace::{CreateFile, Entry, Namespace, NamespaceError, Owner};
use flotilla_proto::{
    DeleteOrder, DirEntryInfo, EntryInfo, ErrorCode, MetaReply, MetaRequest, SubfilePlace, TargetReport,
    WireError,
};
use flotilla_types::{Caller, CallerPolicy, FileId, SubfileIndex, TargetId};

/// Delete orders handed to a server per heartbeat, per target.
const DELETE_ORDERS_PER_TARGET_MAX: usize = 1024;

/// What request handlers share.
pub(crate) struct State {
    pub namespace: Namespace,
    pub membership: Membership,
    pub heartbeat_ms: u64,
}

impl State {
    /// Executes one request (on a blocking thread: the namespace commits to disk).
    pub fn handle(&self, request: MetaRequest, policy: &CallerPolicy) -> MetaReply {
        match self.admit(request, policy) {
            Ok(reply) => reply,
            Err(error) => MetaReply::Error(error),
        }
    }

    /// Maps the claimed caller by the connection's policy and refuses what the policy
    /// forbids (read-only, outside the subtree) before running the request.
    fn admit(&self, request: MetaRequest, policy: &CallerPolicy) -> Result<MetaReply, WireError> {
        let (claimed, request) = match request {
            MetaRequest::As { caller, request } => (caller, *request),
            bare => (Caller::root(), bare),
        };
        if matches!(request, MetaRequest::As { .. }) {
            return Err(WireError::new(ErrorCode::BadRequest, "a caller request may not be nested"));
        }
        claimed.check().map_err(|e| WireError::new(ErrorCode::BadRequest, e.to_string()))?;
        crate::policy::admit(&request, policy)?;
        self.dispatch(request, &policy.effective(&claimed))
    }

    fn dispatch(&self, request: MetaRequest, who: &Caller) -> Result<MetaReply, WireError> {
        let ns = &self.namespace;
        let now = now_ns();
        let reply = match request {
            MetaRequest::As { .. } => {
                return Err(WireError::new(ErrorCode::BadRequest, "a caller request may not be nested"))
            }
            MetaRequest::Lookup { path } => {
                MetaReply::Entry(self.info(ns.lookup_as(who, &path).map_err(wire)?))
            }
            MetaRequest::Mkdir { path, mode, uid, gid } => {
                let owner = crate::policy::owner(who, mode, uid, gid);
                MetaReply::Entry(self.info(ns.mkdir_as(who, &path, owner, now).map_err(wire)?))
            }
            MetaRequest::Create { path, spec } => {
                let create = CreateFile {
                    owner: crate::policy::owner(who, spec.mode, spec.uid, spec.gid),
                    subfile_count: spec.subfiles,
                    targets: spec.targets,
                    layout: spec.layout,
                    exclusive: spec.exclusive,
                };
                let live = self.membership.live();
                MetaReply::Entry(self.info(ns.create_file_as(who, &path, &create, &live, now).map_err(wire)?))
            }
            MetaRequest::Readdir { path } => MetaReply::Entries(
                ns.readdir_as(who, &path)
                    .map_err(wire)?
                    .into_iter()
                    .map(|e| DirEntryInfo { name: e.name, id: e.id, kind: e.kind })
                    .collect(),
            ),
            MetaRequest::Unlink { path } => done(ns.unlink_as(who, &path, now).map(|_| ()))?,
            MetaRequest::Rmdir { path } => done(ns.rmdir_as(who, &path, now))?,
            MetaRequest::Rename { from, to } => done(ns.rename_as(who, &from, &to, now).map(|_| ()))?,
            MetaRequest::SetAttr { id, change } => {
                MetaReply::Attributes(ns.set_attr_as(who, id, &change, now).map_err(wire)?)
            }
            MetaRequest::Symlink { path, target, uid, gid } => {
                let owner = crate::policy::owner(who, 0o777, uid, gid);
                MetaReply::Entry(self.info(ns.symlink_as(who, &path, &target, owner, now).map_err(wire)?))
            }
            MetaRequest::Link { existing, new } => {
                MetaReply::Entry(self.info(ns.link_as(who, &existing, &new, now).map_err(wire)?))
            }
            MetaRequest::GetById { id } => MetaReply::Entry(self.info(ns.get(id).map_err(wire)?)),
            MetaRequest::GrowSize { id, size_bytes, mtime_ns } => {
                MetaReply::Attributes(ns.grow_size(id, size_bytes, mtime_ns, now).map_err(wire)?)
            }
            MetaRequest::SetLayout { path, layout } => {
                MetaReply::Entry(self.info(self.set_layout(&path, layout, now)?))
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
        };
        Ok(reply)
    }

    fn set_layout(
        &self,
        path: &str,
        layout: Option<flotilla_types::Layout>,
        now: i64,
    ) -> Result<Entry, WireError> {
        let entry = self.namespace.lookup(path).map_err(wire)?;
        match (entry.file.is_some(), layout) {
            (false, layout) => self.namespace.set_default_layout(path, layout, now).map_err(wire),
            (true, Some(layout)) => self.namespace.set_file_layout(entry.id, layout, now).map_err(wire),
            (true, None) => {
                Err(WireError::new(ErrorCode::InvalidArgument, "a file's layout cannot be cleared"))
            }
        }
    }

    /// Updates membership, and persists targets that are new or moved (a durable write, so
    /// not on every heartbeat).
    fn report(&self, server: &str, targets: &[TargetReport]) -> Result<(), WireError> {
        for report in self.membership.report(server, targets) {
            self.namespace
                .record_target(report.target, server, report.used_bytes, report.free_bytes)
                .map_err(wire)?;
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
            self.namespace.ack_deletes(target, &done).map_err(wire)?;
        }
        Ok(())
    }

    fn delete_orders(&self, targets: &[TargetReport]) -> Result<Vec<DeleteOrder>, WireError> {
        let mut orders = Vec::new();
        for report in targets {
            let pending =
                self.namespace.pending_deletes(report.target, DELETE_ORDERS_PER_TARGET_MAX).map_err(wire)?;
            orders.extend(pending.into_iter().map(|(file, subfile)| DeleteOrder {
                target: report.target,
                file,
                subfile,
            }));
        }
        Ok(orders)
    }

    /// The client's view of an entry: each subfile's target with its server and state.
    fn info(&self, entry: Entry) -> EntryInfo {
        let remembered = || self.namespace.targets().unwrap_or_default();
        let (layout, subfiles) = match &entry.file {
            Some(file) => {
                let mut records = None;
                let places = file
                    .targets
                    .iter()
                    .map(|target| match self.membership.place(*target) {
                        Some((server, up)) => SubfilePlace { target: *target, server, up },
                        None => {
                            let records = records.get_or_insert_with(remembered);
                            let server = records
                                .iter()
                                .find(|r| r.target == *target)
                                .map(|r| r.server_addr.clone())
                                .unwrap_or_default();
                            SubfilePlace { target: *target, server, up: false }
                        }
                    })
                    .collect();
                (Some(file.layout), places)
            }
            None => (entry.default_layout, Vec::new()),
        };
        EntryInfo { id: entry.id, attrs: entry.attrs, layout, subfiles, symlink: entry.symlink_target }
    }
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
