//! Which metadata requests are sent again after an attempt of unknown outcome (a connection
//! that broke after the request was sent, a node that lost its quorum), on the same node or
//! another one of the group. The rule (docs/architecture-log.md "Callers follow the leader"):
//! a request is resent when doing it twice does what doing it once does, or when the retry's
//! answer is judged (`outage::after_retry`) — until the reply table makes every change
//! exactly-once, and then by its `(session, sequence)` identity.

use flotilla_proto::MetaRequest;

/// Why a request may be sent again after an attempt of unknown outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// It changes nothing.
    Read,
    /// Doing it twice leaves what doing it once leaves (absolute values, the caller's own
    /// session state, renewals, registrations).
    Idempotent,
    /// A change whose retry is judged by `outage::after_retry` (a create that finds its name
    /// taken claims it, a remove that finds its name gone is done); exactly-once by the
    /// reply table once the service runs on the group.
    Judged,
    /// Counted twice if the first attempt was applied (an open counted twice stays until
    /// its lease ends; a close counted twice may end another handle's open of the same
    /// file early; a join takes a second member index; a hard link by path answers
    /// `AlreadyExists`). Resent as a single node did before issue 33 (logged); the
    /// reply table must cover these first.
    Counted,
}

/// The class of `request` (`As` takes its inner request's).
pub(crate) fn resend_class(request: &MetaRequest) -> Resend {
    use MetaRequest as R;
    match request {
        R::As { request, .. } | R::Sequenced { request, .. } | R::ChangedBy { request, .. } => {
            resend_class(request)
        }
        R::Lookup { .. }
        | R::InodeCached { .. }
        | R::LookupAt { .. }
        | R::LookupCached { .. }
        | R::Readdir { .. }
        | R::ReaddirId { .. }
        | R::ReaddirPlusId { .. }
        | R::Status
        | R::GetById { .. }
        | R::CountInodes
        | R::GetLock { .. }
        | R::JobWait { .. }
        | R::TokenWait { .. }
        | R::InodeTokenWait { .. }
        | R::ChainStatus { .. }
        | R::GetChains { .. }
        | R::ChainSubfiles { .. } => Resend::Read,
        R::SetAttr { .. }
        | R::GrowSize { .. }
        | R::SetLayout { .. }
        | R::SetLayoutId { .. }
        | R::SetNoOverlapId { .. }
        | R::TouchAtime { .. }
        | R::Register { .. }
        | R::Heartbeat { .. }
        | R::RegisterMember { .. }
        | R::HeartbeatMember { .. }
        | R::SyncDone { .. }
        | R::TargetAdmin { .. }
        | R::ReclaimLocks { .. }
        | R::KeepOpen { .. }
        | R::SetLock { .. }
        | R::ReleaseLocks { .. }
        | R::TokenAcquire { .. }
        | R::TokenRelease { .. }
        | R::InodeTokenRelease { .. }
        | R::JobFlush { .. }
        | R::JobLeave { .. }
        // A reclaim merges maxima and unions: presenting it twice changes nothing.
        | R::JobReclaim { .. }
        | R::OpenGroupSession
        // Issue 33's membership (a re-sent add of a node that became a voter is refused by
        // name, nothing applied twice).
        | R::GroupMembership(_)
        => Resend::Idempotent,
        R::Mkdir { .. }
        | R::MkdirAt { .. }
        | R::MknodAt { .. }
        | R::Create { .. }
        | R::CreateAt { .. }
        | R::CreateOpen { .. }
        | R::CreateOpenCached { .. }
        | R::CreateAtOpen { .. }
        | R::CreateReplicated { .. }
        | R::Symlink { .. }
        | R::SymlinkAt { .. }
        | R::LinkAt { .. }
        | R::Unlink { .. }
        | R::UnlinkAt { .. }
        | R::UnlinkId { .. }
        | R::Rmdir { .. }
        | R::RmdirAt { .. }
        | R::Rename { .. }
        | R::RenameNoReplace { .. }
        | R::RenameAt { .. } => Resend::Judged,
        R::Opened { .. } | R::OpenPath { .. } | R::Closed { .. } | R::JobJoin { .. } | R::Link { .. } => {
            Resend::Counted
        }
    }
}

/// Whether `request` goes with an identity in the client's group session (`sequence.rs`):
/// the namespace changes whose second application differs from the first (the judged ones,
/// and a hard link by path), so a resend after a failover is answered by the reply table.
pub(crate) fn sequenced(request: &MetaRequest) -> bool {
    match request {
        MetaRequest::As { request, .. } => sequenced(request),
        MetaRequest::Link { .. } => true,
        MetaRequest::Sequenced { .. } => false,
        request => resend_class(request) == Resend::Judged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::outage::{after_retry, AfterRetry};
    use flotilla_proto::ErrorCode;

    #[test]
    fn reads_changes_and_counted_requests_are_told_apart() {
        assert_eq!(resend_class(&MetaRequest::Lookup { path: "/f".into() }), Resend::Read);
        assert_eq!(resend_class(&MetaRequest::Status), Resend::Read);
        assert_eq!(resend_class(&MetaRequest::Unlink { path: "/f".into() }), Resend::Judged);
        assert_eq!(resend_class(&MetaRequest::Closed { id: 1, session: 2 }), Resend::Counted);
        let caller = flotilla_types::Caller { uid: 1, gid: 1, groups: Vec::new() };
        let wrapped =
            MetaRequest::As { caller, request: Box::new(MetaRequest::Closed { id: 1, session: 2 }) };
        assert_eq!(resend_class(&wrapped), Resend::Counted, "As takes its inner request's class");
    }

    #[test]
    fn every_judged_change_has_a_judgement() {
        let spec = flotilla_proto::CreateSpec {
            mode: 0o644,
            uid: 1,
            gid: 1,
            subfiles: 1,
            targets: None,
            layout: None,
            exclusive: true,
        };
        let judged = [
            MetaRequest::Mkdir { path: "/d".into(), mode: 0o755, uid: 1, gid: 1 },
            MetaRequest::Create { path: "/f".into(), spec },
            MetaRequest::Unlink { path: "/f".into() },
            MetaRequest::Rmdir { path: "/d".into() },
        ];
        for request in judged {
            assert_eq!(resend_class(&request), Resend::Judged);
            let taken = after_retry(&request, ErrorCode::AlreadyExists);
            let gone = after_retry(&request, ErrorCode::NotFound);
            assert!(taken != AfterRetry::Stands || gone != AfterRetry::Stands, "{request:?} is not judged");
        }
    }
}
