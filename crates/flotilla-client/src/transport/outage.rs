//! Waiting out short outages: a call that cannot reach an I/O server or the metadata service
//! (connection refused or reset, a connection that broke mid-call) is tried again, with
//! bounded backoff, for up to `OutageSettings::wait_ms` (60 s by default, as a hard NFS
//! mount would wait longer) before it fails with [`ClientError::Unreachable`]. Every other
//! error (permission, not found, no space, a bad reply, a call timeout) returns at once.
//!
//! Retries are safe because data writes are idempotent by offset and reads change nothing;
//! a metadata change whose connection broke after it was sent may have been applied, and
//! the reply that says so was lost. Such a retry is judged by [`after_retry`]: a create or
//! mkdir that now finds its name taken claims the entry when it is the kind this caller
//! asked for, owned by it and changed since the first attempt; a remove or rename that now
//! finds its name gone counts as done. That is not exactly-once (a reply table in the
//! metadata service is a later issue): another client's entry made in that window under the
//! same uid is taken for ours, `Opened`/`Closed` may count twice, and a hard link by path is
//! not claimed.
//!
//! The logic here has no sockets: `OutageWait` is the clock arithmetic, `classify` the
//! error judgement, `after_retry` the plan for a retried metadata change.

pub use crate::error::Service;

use crate::error::ClientError;
use flotilla_proto::{CreateSpec, EntryInfo, ErrorCode, MetaRequest, NotServed};
use flotilla_rpc::RpcError;
use flotilla_types::FileKind;
use std::time::{Duration, Instant};

/// Default for `OutageSettings::wait_ms`.
pub const OUTAGE_WAIT_MS_DEFAULT: u64 = 60_000;
/// The environment variable that sets `OutageSettings::wait_ms` of a new `ClientConfig`.
pub const OUTAGE_WAIT_ENV: &str = "FLOTILLA_OUTAGE_WAIT_MS";
/// How much earlier than the first attempt a claimed entry's ctime may be (clock skew
/// between this host and the metadata service's).
const CLAIM_CLOCK_SLACK_NS: i64 = 5_000_000_000;

/// How long and how often a client tries an unreachable service again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutageSettings {
    /// How long after the first failure a call keeps trying (0: fail at once).
    pub wait_ms: u64,
    /// The first pause between attempts; each next one doubles, up to `backoff_ms_max`.
    pub backoff_ms_min: u64,
    pub backoff_ms_max: u64,
}

impl Default for OutageSettings {
    fn default() -> Self {
        OutageSettings { wait_ms: OUTAGE_WAIT_MS_DEFAULT, backoff_ms_min: 50, backoff_ms_max: 1_000 }
    }
}

impl OutageSettings {
    /// The defaults, with `wait_ms` from `FLOTILLA_OUTAGE_WAIT_MS` when it is set to a number.
    pub fn from_env() -> OutageSettings {
        let wait = std::env::var(OUTAGE_WAIT_ENV).ok().and_then(|value| value.trim().parse().ok());
        OutageSettings { wait_ms: wait.unwrap_or(OUTAGE_WAIT_MS_DEFAULT), ..OutageSettings::default() }
    }
}

/// What a failed attempt tells about trying again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request never reached the service: try again.
    NotSent,
    /// The connection broke after the request may have been sent (and applied): try again,
    /// judging the answer with `after_retry`.
    MaybeApplied,
    /// Not an outage: return it.
    Final,
}

pub(crate) fn classify(error: &ClientError) -> Failure {
    match error {
        ClientError::Rpc(RpcError::Connect { .. }) => Failure::NotSent,
        ClientError::Rpc(RpcError::ConnectionLost { .. }) => Failure::MaybeApplied,
        // A node that is not the leader proposed nothing; one without a quorum may have.
        ClientError::NotServed { reason: NotServed::NotLeader { .. }, .. } => Failure::NotSent,
        ClientError::NotServed { reason: NotServed::NoQuorum, .. } => Failure::MaybeApplied,
        // A replicated subfile's request was refused unapplied, found no member to go to,
        // or (a read) got no answer: the layer above refetches the chain and goes again.
        ClientError::ChainRefused { .. }
        | ClientError::ChainUnavailable { .. }
        | ClientError::ReplicaTimeout { .. } => Failure::NotSent,
        _ => Failure::Final,
    }
}

/// The clock of one call's outage: when it began and how long to pause next.
#[derive(Debug)]
pub(crate) struct OutageWait {
    settings: OutageSettings,
    started: Option<Instant>,
    backoff_ms: u64,
    /// An attempt failed after its request may have been applied.
    pub maybe_applied: bool,
}

impl OutageWait {
    pub fn new(settings: OutageSettings) -> OutageWait {
        OutageWait {
            settings,
            started: None,
            backoff_ms: settings.backoff_ms_min.max(1),
            maybe_applied: false,
        }
    }

    /// After an attempt failed with `failure` at `now`: the pause before the next attempt,
    /// or `None` when the wait is over (or the failure is not an outage).
    pub fn after_failure(&mut self, failure: Failure, now: Instant) -> Option<Duration> {
        if failure == Failure::Final {
            return None;
        }
        self.maybe_applied |= failure == Failure::MaybeApplied;
        let started = *self.started.get_or_insert(now);
        let waited_ms = now.saturating_duration_since(started).as_millis() as u64;
        let left_ms = self.settings.wait_ms.checked_sub(waited_ms).filter(|left| *left > 0)?;
        let pause_ms = self.backoff_ms.min(left_ms);
        self.backoff_ms = (self.backoff_ms * 2).min(self.settings.backoff_ms_max.max(1));
        Some(Duration::from_millis(pause_ms))
    }

    /// After an attempt failed with `failure` at `now` and the caller moves to another
    /// address at once (`leader.rs`): whether the wait still has time left. The backoff is
    /// left as it is, for the pause after a round.
    pub fn note(&mut self, failure: Failure, now: Instant) -> bool {
        if failure == Failure::Final {
            return false;
        }
        self.maybe_applied |= failure == Failure::MaybeApplied;
        let started = *self.started.get_or_insert(now);
        (now.saturating_duration_since(started).as_millis() as u64) < self.settings.wait_ms
    }

    /// Whether an earlier attempt failed (so this one is a retry).
    pub fn retrying(&self) -> bool {
        self.started.is_some()
    }

    /// How long since the first failure.
    pub fn waited_ms(&self, now: Instant) -> u64 {
        self.started.map_or(0, |started| now.saturating_duration_since(started).as_millis() as u64)
    }
}

/// Runs `attempt` until it succeeds, fails with an error that is not an outage, or the
/// outage wait runs out (then `Unreachable`, with the last error). `attempt` is told
/// whether an earlier attempt may have been applied.
pub(crate) async fn outlast<T, F, Fut>(
    settings: OutageSettings,
    service: Service,
    mut attempt: F,
) -> Result<T, ClientError>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut wait = OutageWait::new(settings);
    loop {
        let error = match attempt(wait.maybe_applied).await {
            Ok(value) => {
                if wait.retrying() {
                    tracing::info!(%service, waited_ms = wait.waited_ms(Instant::now()), "reached again");
                }
                return Ok(value);
            }
            Err(error) => error,
        };
        let failure = classify(&error);
        let first = !wait.retrying();
        match wait.after_failure(failure, Instant::now()) {
            Some(pause) => {
                if first {
                    tracing::info!(%service, %error, wait_ms = settings.wait_ms, "unreachable; trying again");
                } else {
                    tracing::debug!(%service, %error, "still unreachable");
                }
                tokio::time::sleep(pause).await;
            }
            None if failure == Failure::Final => return Err(error),
            None => {
                let waited_ms = wait.waited_ms(Instant::now());
                let wait_ms = settings.wait_ms;
                return Err(ClientError::Unreachable { service, waited_ms, wait_ms, last: Box::new(error) });
            }
        }
    }
}

/// What a retried metadata change that failed with `code` means.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AfterRetry {
    /// The error stands.
    Stands,
    /// The earlier attempt did it: answer `Done`.
    Done,
    /// The earlier attempt may have made the entry: look it up with `lookup`; if it is what
    /// `claim` expects, it is ours: answer with `resend` (a non-exclusive create, which
    /// opens it as the original would have) or, without one, with the entry.
    Claim { lookup: MetaRequest, claim: Claim, resend: Option<Box<MetaRequest>> },
}

/// What an entry made by this caller's earlier attempt looks like.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Claim {
    pub kind: FileKind,
    pub uid: u32,
    /// A symlink's target, a hard link's id.
    pub symlink: Option<String>,
    pub id: Option<u64>,
}

impl Claim {
    fn of(kind: FileKind, uid: u32) -> Claim {
        Claim { kind, uid, symlink: None, id: None }
    }

    /// Whether `entry` is what the earlier attempt (started at `started_ns`, wall clock)
    /// would have made, for a caller with uid `caller_uid`.
    pub fn matches(&self, entry: &EntryInfo, started_ns: i64, caller_uid: Option<u32>) -> bool {
        let attrs = &entry.attrs;
        let owned = attrs.uid == self.uid || caller_uid == Some(attrs.uid);
        let recent = attrs.ctime_ns >= started_ns.saturating_sub(CLAIM_CLOCK_SLACK_NS);
        let symlink = self.symlink.is_none() || entry.symlink == self.symlink;
        let id = self.id.is_none_or(|id| id == entry.id);
        attrs.kind == self.kind && owned && recent && symlink && id
    }
}

/// The plan for `request` (bare, not `As`), retried after an attempt that may have been
/// applied, now failing with `code`.
pub(crate) fn after_retry(request: &MetaRequest, code: ErrorCode) -> AfterRetry {
    match code {
        ErrorCode::AlreadyExists => claim_plan(request).unwrap_or(AfterRetry::Stands),
        ErrorCode::NotFound if removes(request) => AfterRetry::Done,
        _ => AfterRetry::Stands,
    }
}

/// Requests whose success removes the name they failed to find.
fn removes(request: &MetaRequest) -> bool {
    matches!(
        request,
        MetaRequest::Unlink { .. }
            | MetaRequest::UnlinkAt { .. }
            | MetaRequest::UnlinkId { .. }
            | MetaRequest::Rmdir { .. }
            | MetaRequest::RmdirAt { .. }
            | MetaRequest::Rename { .. }
            | MetaRequest::RenameNoReplace { .. }
            | MetaRequest::RenameAt { .. }
    )
}

fn claim_plan(request: &MetaRequest) -> Option<AfterRetry> {
    let by_path = |path: &String| MetaRequest::Lookup { path: path.clone() };
    let at = |parent: &u64, name: &Vec<u8>| MetaRequest::LookupAt { parent: *parent, name: name.clone() };
    let plan = |lookup, claim, resend| Some(AfterRetry::Claim { lookup, claim, resend });
    match request {
        MetaRequest::Create { path, spec }
        | MetaRequest::CreateOpen { path, spec, .. }
        | MetaRequest::CreateOpenCached { path, spec, .. } => {
            plan(by_path(path), Claim::of(FileKind::File, spec.uid), Some(Box::new(non_exclusive(request)?)))
        }
        MetaRequest::CreateAt { parent, name, spec }
        | MetaRequest::CreateAtOpen { parent, name, spec, .. } => plan(
            at(parent, name),
            Claim::of(FileKind::File, spec.uid),
            Some(Box::new(non_exclusive(request)?)),
        ),
        MetaRequest::Mkdir { path, uid, .. } => {
            plan(by_path(path), Claim::of(FileKind::Directory, *uid), None)
        }
        MetaRequest::MkdirAt { parent, name, uid, .. } => {
            plan(at(parent, name), Claim::of(FileKind::Directory, *uid), None)
        }
        MetaRequest::MknodAt { parent, name, kind, uid, .. } => {
            plan(at(parent, name), Claim::of(*kind, *uid), None)
        }
        MetaRequest::Symlink { path, target, uid, .. } => {
            let claim = Claim { symlink: Some(target.clone()), ..Claim::of(FileKind::Symlink, *uid) };
            plan(by_path(path), claim, None)
        }
        MetaRequest::SymlinkAt { parent, name, target, uid, .. } => {
            let claim = Claim { symlink: Some(target.clone()), ..Claim::of(FileKind::Symlink, *uid) };
            plan(at(parent, name), claim, None)
        }
        MetaRequest::LinkAt { id, parent, name } => {
            // A link adds a name to an existing entry: any owner, any age.
            let claim = Claim { id: Some(*id), ..Claim::of(FileKind::File, u32::MAX) };
            plan(at(parent, name), claim, None)
        }
        _ => None,
    }
}

/// An exclusive create as a non-exclusive one (which returns, and opens, the existing
/// file); `None` for a create that was not exclusive.
fn non_exclusive(request: &MetaRequest) -> Option<MetaRequest> {
    let open = |spec: &CreateSpec| spec.exclusive.then(|| CreateSpec { exclusive: false, ..spec.clone() });
    Some(match request.clone() {
        MetaRequest::Create { path, spec } => MetaRequest::Create { path, spec: open(&spec)? },
        MetaRequest::CreateOpen { path, spec, session } => {
            MetaRequest::CreateOpen { path, spec: open(&spec)?, session }
        }
        MetaRequest::CreateOpenCached { path, spec, session } => {
            MetaRequest::CreateOpenCached { path, spec: open(&spec)?, session }
        }
        MetaRequest::CreateAt { parent, name, spec } => {
            MetaRequest::CreateAt { parent, name, spec: open(&spec)? }
        }
        MetaRequest::CreateAtOpen { parent, name, spec, session } => {
            MetaRequest::CreateAtOpen { parent, name, spec: open(&spec)?, session }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(wait_ms: u64) -> OutageSettings {
        OutageSettings { wait_ms, backoff_ms_min: 50, backoff_ms_max: 400 }
    }

    #[test]
    fn pauses_double_up_to_the_bound_and_stop_at_the_wait() {
        let mut wait = OutageWait::new(settings(1_000));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let pauses: Vec<u64> = [0, 50, 150, 350, 750]
            .into_iter()
            .map(|ms| wait.after_failure(Failure::NotSent, at(ms)).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 250], "doubling, bounded, and never past the wait");
        assert_eq!(wait.after_failure(Failure::NotSent, at(1_000)), None, "the wait is over");
        assert_eq!(wait.waited_ms(at(1_000)), 1_000);
    }

    #[test]
    fn final_errors_and_a_zero_wait_return_at_once() {
        let mut wait = OutageWait::new(settings(1_000));
        assert_eq!(wait.after_failure(Failure::Final, Instant::now()), None);
        assert!(!wait.retrying(), "a final error starts no outage");
        let mut none = OutageWait::new(settings(0));
        assert_eq!(none.after_failure(Failure::NotSent, Instant::now()), None);
    }

    #[test]
    fn only_unreachable_services_are_outages() {
        let lost = ClientError::Rpc(RpcError::ConnectionLost { addr: "a".into(), message: "reset".into() });
        let refused = ClientError::Rpc(RpcError::Connect { addr: "a".into(), message: "refused".into() });
        let timeout = ClientError::Rpc(RpcError::CallTimeout { addr: "a".into(), ms: 5 });
        let handshake = ClientError::Rpc(RpcError::Handshake { addr: "a".into(), message: "CA".into() });
        let denied = ClientError::Meta(flotilla_proto::WireError::new(ErrorCode::PermissionDenied, "no"));
        let full = ClientError::Server {
            server: "a".into(),
            error: flotilla_proto::WireError::new(ErrorCode::NoSpace, "full"),
        };
        assert_eq!(classify(&lost), Failure::MaybeApplied);
        assert_eq!(classify(&refused), Failure::NotSent);
        for error in [timeout, handshake, denied, full] {
            assert_eq!(classify(&error), Failure::Final, "{error}");
        }
    }

    fn spec(exclusive: bool) -> CreateSpec {
        CreateSpec { mode: 0o644, uid: 7, gid: 7, subfiles: 1, targets: None, layout: None, exclusive }
    }

    #[test]
    fn a_retried_exclusive_create_claims_its_file_by_a_non_exclusive_create() {
        let request = MetaRequest::CreateOpen { path: "/f".into(), spec: spec(true), session: 3 };
        let AfterRetry::Claim { lookup, claim, resend } = after_retry(&request, ErrorCode::AlreadyExists)
        else {
            panic!("an exclusive create that finds its name taken must try to claim it");
        };
        assert_eq!(lookup, MetaRequest::Lookup { path: "/f".into() });
        assert_eq!(
            resend,
            Some(Box::new(MetaRequest::CreateOpen { path: "/f".into(), spec: spec(false), session: 3 }))
        );
        let mut entry = EntryInfo {
            id: 9,
            attrs: flotilla_types::Attributes {
                kind: FileKind::File,
                mode: 0o644,
                uid: 7,
                gid: 7,
                size_bytes: 0,
                nlink: 1,
                atime_ns: 1_000_000_000_000,
                mtime_ns: 1_000_000_000_000,
                ctime_ns: 1_000_000_000_000,
                rdev: 0,
            },
            layout: None,
            subfiles: Vec::new(),
            symlink: None,
            capability: None,
            no_overlap: false,
            replicas: 1,
        };
        assert!(claim.matches(&entry, 1_000_000_000_000, None));
        assert!(!claim.matches(&entry, 1_000_000_000_000 + 2 * CLAIM_CLOCK_SLACK_NS, None), "an old file");
        entry.attrs.uid = 8;
        assert!(!claim.matches(&entry, 1_000_000_000_000, None), "another user's file");
        assert!(claim.matches(&entry, 1_000_000_000_000, Some(8)), "the caller's mapped uid");
        entry.attrs.kind = FileKind::Directory;
        assert!(!claim.matches(&entry, 1_000_000_000_000, Some(8)), "a directory is not the file");
    }

    #[test]
    fn retried_removes_that_find_nothing_are_done_and_other_errors_stand() {
        let unlink = MetaRequest::Unlink { path: "/f".into() };
        assert_eq!(after_retry(&unlink, ErrorCode::NotFound), AfterRetry::Done);
        assert_eq!(after_retry(&unlink, ErrorCode::PermissionDenied), AfterRetry::Stands);
        let mkdir = MetaRequest::Mkdir { path: "/d".into(), mode: 0o755, uid: 1, gid: 1 };
        assert_eq!(after_retry(&mkdir, ErrorCode::NotFound), AfterRetry::Stands, "a missing parent");
        assert!(matches!(
            after_retry(&mkdir, ErrorCode::AlreadyExists),
            AfterRetry::Claim { resend: None, .. }
        ));
        let open_existing = MetaRequest::CreateOpen { path: "/f".into(), spec: spec(false), session: 1 };
        assert_eq!(after_retry(&open_existing, ErrorCode::AlreadyExists), AfterRetry::Stands);
        let lookup = MetaRequest::Lookup { path: "/f".into() };
        assert_eq!(after_retry(&lookup, ErrorCode::NotFound), AfterRetry::Stands);
    }
}
