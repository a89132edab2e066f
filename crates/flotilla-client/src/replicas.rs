//! Replicated subfiles (issue 32): where each request to a subfile on a chain goes.
//!
//! A replicated file's entry gives each subfile its chain (`SubfilePlace::chain`: id,
//! version, members in chain order with their servers and states). Every request to such a
//! subfile travels as `IoRequest::Chained { chain, version, request }` (under the file's
//! capability, which the connection layer attaches as for any request), with the inner
//! request's target set to the member it is sent to:
//!
//! - **changes** (write, truncate, extend, sync, fork create/remove) go to the chain's
//!   head: the first serving member in chain order (a syncing member only when none
//!   serves), which orders them and forwards them down the chain;
//! - **reads** (and fork sizes and lists) go to the serving members in turn, skipping one
//!   that failed until the chain's next version is known.
//!
//! The client keeps one view per chain (shared by every file placed on it, at most
//! `CHAIN_VIEWS_MAX`), learnt from every entry it opens and refetched (`GetChains`) when a
//! member refuses a request (`ForwardRefused`: stale version, not the head, not readable,
//! no lease, not a member) or cannot be reached. The caller's attempt loop
//! (`Transport::outlast`) then tries again with backoff, all bounded by the outage wait
//! (`OutageSettings::wait_ms`): a refused or unanswered change was not applied by the
//! chain, or is applied again harmlessly (writes are idempotent per byte range).
//!
//! Code above the connection layer names a subfile's destination by a *route*: a server
//! address, or [`chain_route`] for a chained subfile; [`destination`] resolves a route for
//! one attempt. The pure part (views, choices, what a failure means) has no sockets.

use crate::error::ClientError;
use crate::transport::outage::{classify, Failure};
use crate::transport::{ServerConnection, Transport};
use bytes::Bytes;
use flotilla_proto::chains::{ChainMemberState, ForwardRefused};
use flotilla_proto::{EntryInfo, ForkRef, IoReply, IoRequest, MetaReply, MetaRequest, SubfileChain};
use flotilla_rpc::{ReplyData, ScatterTarget};
use flotilla_types::TargetId;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Chains whose view one client keeps at most (a chain table has at most 65536).
pub const CHAIN_VIEWS_MAX: usize = 65_536;
/// The prefix of a chained subfile's route (never a server address: those are HOST:PORT).
const ROUTE_PREFIX: &str = "chain:";

/// The route of a subfile on chain `chain`.
pub(crate) fn chain_route(chain: u32) -> String {
    format!("{ROUTE_PREFIX}{chain}")
}

/// The chain a route names, if it is a chain's.
pub(crate) fn route_chain(route: &str) -> Option<u32> {
    route.strip_prefix(ROUTE_PREFIX)?.parse().ok()
}

/// What a request does to a subfile, which decides the member it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Ordered by the head and applied by every member.
    Change,
    /// Answered by any serving member.
    Read,
}

/// Whether `request` changes the subfile (goes to the head) or only reads it.
pub(crate) fn access_of(request: &IoRequest) -> Access {
    match request {
        IoRequest::Read { .. }
        | IoRequest::ForkSize { .. }
        | IoRequest::ListForks { .. }
        | IoRequest::BlockChecksums { .. }
        | IoRequest::Hsm { action: flotilla_proto::HsmAction::State, .. } => Access::Read,
        _ => Access::Change,
    }
}

/// Where one attempt of a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Destination {
    /// The server's address.
    pub addr: String,
    /// For a chained subfile: the chain, the version the request carries and the member's
    /// target.
    pub chained: Option<Member>,
}

/// A chain member chosen for one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub chain: u32,
    pub version: u64,
    pub target: TargetId,
}

impl Destination {
    pub(crate) fn direct(addr: &str) -> Destination {
        Destination { addr: addr.to_string(), chained: None }
    }

    /// `request` as it is sent to this destination: unchanged for a direct one; for a
    /// chain member, addressed to the member's target and wrapped in `Chained`.
    pub(crate) fn wrap(&self, request: &IoRequest) -> IoRequest {
        let Some(member) = self.chained else { return request.clone() };
        IoRequest::Chained {
            chain: member.chain,
            version: member.version,
            request: Box::new(retarget(request, member.target)),
        }
    }
}

/// `request` addressed to `target` (the fork or subfile it names, on that member).
fn retarget(request: &IoRequest, target: TargetId) -> IoRequest {
    let mut request = request.clone();
    let fork: Option<&mut ForkRef> = match &mut request {
        IoRequest::Read { fork, .. }
        | IoRequest::Write { fork, .. }
        | IoRequest::CreateFork { fork }
        | IoRequest::RemoveFork { fork }
        | IoRequest::ForkSize { fork }
        | IoRequest::Extend { fork, .. }
        | IoRequest::Truncate { fork, .. }
        | IoRequest::Sync { fork }
        | IoRequest::Hsm { fork, .. }
        | IoRequest::BlockChecksums { fork, .. } => Some(fork),
        IoRequest::ListForks { target: at, .. }
        | IoRequest::CreateSubfile { target: at, .. }
        | IoRequest::RemoveSubfile { target: at, .. } => {
            *at = target;
            None
        }
        _ => None,
    };
    if let Some(fork) = fork {
        fork.target = target;
    }
    request
}

/// What the client knows of one chain.
#[derive(Clone, Debug)]
struct View {
    chain: SubfileChain,
    /// A member refused or failed: refetch before the next attempt.
    stale: bool,
    /// Members that failed under this version (reads go elsewhere while another serves).
    failed: BTreeSet<TargetId>,
    /// Reads sent so far (the next one goes to the next serving member).
    reads: u64,
}

/// The client's chain views.
#[derive(Default)]
pub(crate) struct ChainViews {
    views: parking_lot::Mutex<HashMap<u32, View>>,
}

/// A view's answer for one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    Go(Destination),
    /// Nothing known, or known stale: ask the metadata service first.
    Refetch,
    /// The chain has no member to send to (`why`).
    Unavailable(String),
}

impl ChainViews {
    /// Learns the chains of `entry`'s subfiles.
    pub(crate) fn learn_entry(&self, entry: &EntryInfo) {
        for place in &entry.subfiles {
            if let Some(chain) = &place.chain {
                self.learn(chain.clone());
            }
        }
    }

    /// Keeps `chain` unless a newer version is known; a refetch (same version) clears the
    /// staleness, a new version the failed members too.
    pub(crate) fn learn(&self, chain: SubfileChain) {
        let mut views = self.views.lock();
        match views.get_mut(&chain.chain) {
            Some(view) if view.chain.version > chain.version => {}
            Some(view) => {
                if view.chain.version < chain.version {
                    view.failed.clear();
                }
                view.chain = chain;
                view.stale = false;
            }
            None => {
                if views.len() >= CHAIN_VIEWS_MAX {
                    let any = views.keys().next().copied();
                    if let Some(any) = any {
                        views.remove(&any);
                    }
                }
                let view = View { chain, stale: false, failed: BTreeSet::new(), reads: 0 };
                views.insert(view.chain.chain, view);
            }
        }
    }

    /// An attempt at `member` failed (refused, or the member was not reached).
    pub(crate) fn failed(&self, member: &Member, unreachable: bool) {
        let mut views = self.views.lock();
        if let Some(view) = views.get_mut(&member.chain) {
            view.stale = true;
            if unreachable && view.chain.version == member.version {
                view.failed.insert(member.target);
            }
        }
    }

    /// Refetch `chain` before the next attempt.
    pub(crate) fn mark_stale(&self, chain: u32) {
        if let Some(view) = self.views.lock().get_mut(&chain) {
            view.stale = true;
        }
    }

    /// The view of `chain`, if one is kept (for `flotilla stat` and tests).
    pub(crate) fn get(&self, chain: u32) -> Option<SubfileChain> {
        self.views.lock().get(&chain).map(|view| view.chain.clone())
    }

    /// How many members a read of `chain` may be spread over now: its serving members not
    /// known to have failed (all serving ones when every one failed); 1 when no current
    /// view is kept (the read's first attempt refetches it).
    pub(crate) fn readers(&self, chain: u32) -> usize {
        let views = self.views.lock();
        let Some(view) = views.get(&chain).filter(|view| !view.stale) else { return 1 };
        let serving = view.chain.members.iter().filter(|m| m.state == ChainMemberState::Serving);
        let healthy = serving.clone().filter(|m| !view.failed.contains(&m.target)).count();
        if healthy > 0 {
            healthy
        } else {
            serving.count().max(1)
        }
    }

    /// Where the next attempt of an `access` on `chain` goes.
    pub(crate) fn pick(&self, chain: u32, access: Access) -> Pick {
        let mut views = self.views.lock();
        let Some(view) = views.get_mut(&chain) else { return Pick::Refetch };
        if view.stale {
            return Pick::Refetch;
        }
        match choose(&view.chain, access, &view.failed, view.reads) {
            Ok(member) => {
                if access == Access::Read {
                    view.reads = view.reads.wrapping_add(1);
                }
                Pick::Go(member)
            }
            Err(why) => Pick::Unavailable(why),
        }
    }
}

/// The member an `access` on `chain` goes to: changes to the head (the first serving
/// member, else a syncing one); reads to serving member number `turn` (modulo), among those
/// not `failed` when any is left.
fn choose(
    chain: &SubfileChain,
    access: Access,
    failed: &BTreeSet<TargetId>,
    turn: u64,
) -> Result<Destination, String> {
    let serving: Vec<_> = chain.members.iter().filter(|m| m.state == ChainMemberState::Serving).collect();
    let member = match access {
        Access::Change => {
            let syncing =
                || chain.members.iter().find(|m| matches!(m.state, ChainMemberState::Syncing { .. }));
            serving.first().copied().or_else(syncing)
        }
        Access::Read => {
            let healthy: Vec<_> = serving.iter().copied().filter(|m| !failed.contains(&m.target)).collect();
            let from = if healthy.is_empty() { &serving } else { &healthy };
            (!from.is_empty()).then(|| from[(turn % from.len() as u64) as usize])
        }
    };
    let Some(member) = member else {
        return Err(format!("chain {} v{} has no serving member", chain.chain, chain.version));
    };
    if member.server.is_empty() {
        return Err(format!(
            "chain {} v{}: target {} has no known server",
            chain.chain, chain.version, member.target
        ));
    }
    Ok(Destination {
        addr: member.server.clone(),
        chained: Some(Member { chain: chain.chain, version: chain.version, target: member.target }),
    })
}

/// What a refusal asks of the client: every reason means its view is out of date or the
/// member is not serving yet; refetch and try again (the outage wait bounds it).
pub(crate) fn refusal_error(server: &str, refused: ForwardRefused) -> ClientError {
    ClientError::ChainRefused { server: server.to_string(), refused }
}

/// The destination of one attempt on `route` (a server address or a chain's route),
/// refetching the chain from the metadata service first when its view is missing or stale.
pub(crate) async fn destination(
    transport: &Transport,
    views: &ChainViews,
    route: &str,
    access: Access,
) -> Result<Destination, ClientError> {
    let Some(chain) = route_chain(route) else { return Ok(Destination::direct(route)) };
    let mut fetched = false;
    loop {
        match views.pick(chain, access) {
            Pick::Go(destination) => return Ok(destination),
            Pick::Refetch if !fetched => {
                refetch(transport, views, chain).await?;
                fetched = true;
            }
            Pick::Refetch => {
                return Err(ClientError::ChainUnavailable { chain, why: "its view is still stale".into() })
            }
            Pick::Unavailable(why) => {
                // Asked again before the next attempt: the chain may have changed.
                views.mark_stale(chain);
                return Err(ClientError::ChainUnavailable { chain, why });
            }
        }
    }
}

/// Asks the metadata service for `chain` and learns it.
async fn refetch(transport: &Transport, views: &ChainViews, chain: u32) -> Result<(), ClientError> {
    match transport.meta_call(MetaRequest::GetChains { chains: vec![chain] }).await? {
        MetaReply::SubfileChains(chains) => {
            for got in chains {
                tracing::debug!(chain = got.chain, version = got.version, "chain refetched");
                views.learn(got);
            }
            Ok(())
        }
        other => Err(crate::error::unexpected("get chains", &other)),
    }
}

/// How long one chained read attempt may take before the next serving member is tried:
/// a quarter of the outage wait, at least a second.
pub(crate) fn read_attempt_limit(outage_wait_ms: u64) -> Duration {
    Duration::from_millis((outage_wait_ms / 4).max(1_000))
}

/// The connection for one attempt at `destination` (a failure to reach a chain member
/// marks its chain's view for a refetch).
pub(crate) async fn connect(
    transport: &Transport,
    views: &ChainViews,
    destination: &Destination,
) -> Result<Arc<ServerConnection>, ClientError> {
    let outcome =
        transport.server(&destination.addr).await.map(|server| (IoReply::Done { bytes: 0 }, server));
    settle(views, destination, outcome).map(|(_, server)| server)
}

/// One call of `request` to `destination` on `server`: wrapped for a chain member (a read
/// bounded by [`read_attempt_limit`]); a refusal becomes [`ClientError::ChainRefused`], and a
/// refusal or a failure to reach a member marks the chain's view for a refetch.
pub(crate) async fn call(
    transport: &Transport,
    views: &ChainViews,
    destination: &Destination,
    server: &ServerConnection,
    request: &IoRequest,
    data: Bytes,
    data_bytes: u64,
) -> Result<(IoReply, Bytes), ClientError> {
    let wrapped = destination.wrap(request);
    let outcome =
        limited(transport, destination, request, transport.io_call(server, &wrapped, data, data_bytes)).await;
    settle(views, destination, outcome)
}

/// [`call`] of a read whose reply data goes straight into `target`.
pub(crate) async fn call_into(
    transport: &Transport,
    views: &ChainViews,
    destination: &Destination,
    server: &ServerConnection,
    request: &IoRequest,
    target: ScatterTarget,
) -> Result<(IoReply, ReplyData), ClientError> {
    let wrapped = destination.wrap(request);
    let outcome =
        limited(transport, destination, request, transport.io_call_into(server, &wrapped, target)).await;
    settle(views, destination, outcome)
}

/// `call` bounded by the read attempt limit when it is chained: a read goes on to the next
/// serving member; a change to a head that stays silent (its host cut off: no reset comes)
/// is sent again after a refetch of the chain, to the head the metadata service named once
/// it fenced the silent one (chained changes are rewrites of the same bytes, so a change
/// sent twice lands as once). Meanwhile the chain is asked for every
/// [`fence_watch_period`]: once a newer version no longer has the member serving, the
/// attempt is given up at once rather than at the limit (a fenced member's change can never
/// be acknowledged by the chain, nor its read reach the client from a current member).
async fn limited<T>(
    transport: &Transport,
    destination: &Destination,
    _request: &IoRequest,
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    let Some(member) = destination.chained else { return call.await };
    let limit = read_attempt_limit(transport.outage.wait_ms);
    let started = std::time::Instant::now();
    let gave_up = |started: std::time::Instant| ClientError::ReplicaTimeout {
        server: destination.addr.clone(),
        waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    tokio::select! {
        outcome = tokio::time::timeout(limit, call) => outcome.unwrap_or_else(|_| Err(gave_up(started))),
        () = fenced(transport, member, fence_watch_period(limit)) => {
            tracing::debug!(chain = member.chain, server = %destination.addr, "member fenced during the attempt; trying the chain's new view");
            Err(gave_up(started))
        }
    }
}

/// How often a chained attempt still unanswered asks for its chain: a fifteenth of the
/// attempt's limit, at least 250 ms (1 s with the default outage wait).
pub(crate) fn fence_watch_period(limit: Duration) -> Duration {
    (limit / 15).max(Duration::from_millis(250))
}

/// Resolves once the metadata service shows `member` out of its chain's serving members
/// under a newer version; never otherwise (a failed ask is asked again next period).
async fn fenced(transport: &Transport, member: Member, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let asked = transport.meta_call(MetaRequest::GetChains { chains: vec![member.chain] }).await;
        if let Ok(MetaReply::SubfileChains(chains)) = asked {
            if chains.iter().any(|chain| fenced_in(chain, &member)) {
                return;
            }
        }
    }
}

/// Whether `chain`, a view of `member`'s chain, is newer and no longer has the member serving.
pub(crate) fn fenced_in(chain: &SubfileChain, member: &Member) -> bool {
    chain.chain == member.chain
        && chain.version > member.version
        && !chain.members.iter().any(|m| m.target == member.target && m.state == ChainMemberState::Serving)
}

/// Judges one chained attempt's outcome (see [`call`]).
pub(crate) fn settle<T>(
    views: &ChainViews,
    destination: &Destination,
    outcome: Result<(IoReply, T), ClientError>,
) -> Result<(IoReply, T), ClientError> {
    let Some(member) = destination.chained else { return outcome };
    match outcome {
        Ok((IoReply::ForwardRefused(refused), _)) => {
            tracing::debug!(%refused, server = %destination.addr, "chained request refused; refetching the chain");
            views.failed(&member, false);
            Err(refusal_error(&destination.addr, refused))
        }
        Ok(answered) => Ok(answered),
        Err(error) => {
            if classify(&error) != Failure::Final {
                views.failed(&member, true);
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::chains::ForwardRefusalReason;
    use flotilla_proto::ReplicaPlace;
    use flotilla_types::{FileId, SubfileIndex};

    fn place(target: u64, state: ChainMemberState) -> ReplicaPlace {
        ReplicaPlace { target: TargetId(target), server: format!("s{target}:1"), state }
    }

    fn chain(version: u64, members: Vec<ReplicaPlace>) -> SubfileChain {
        SubfileChain { chain: 7, version, members }
    }

    const SERVING: ChainMemberState = ChainMemberState::Serving;
    const OFFLINE: ChainMemberState = ChainMemberState::Offline { missed_since: 2, full: false };
    const SYNCING: ChainMemberState = ChainMemberState::Syncing { missed_since: 2, full: false };

    fn target_of(pick: Pick) -> u64 {
        match pick {
            Pick::Go(destination) => destination.chained.unwrap().target.0,
            other => panic!("no destination: {other:?}"),
        }
    }

    #[test]
    fn a_member_is_fenced_only_by_a_newer_view_without_it_serving() {
        let member = Member { chain: 7, version: 3, target: TargetId(1) };
        let serving =
            chain(4, vec![place(1, ChainMemberState::Serving), place(2, ChainMemberState::Serving)]);
        assert!(!fenced_in(&serving, &member), "still serving under the new version");
        let same = chain(3, vec![place(2, ChainMemberState::Serving)]);
        assert!(!fenced_in(&same, &member), "not a newer version");
        let gone = chain(4, vec![place(2, ChainMemberState::Serving)]);
        assert!(fenced_in(&gone, &member));
        let syncing = chain(
            5,
            vec![
                place(2, ChainMemberState::Serving),
                place(1, ChainMemberState::Syncing { missed_since: 4, full: false }),
            ],
        );
        assert!(fenced_in(&syncing, &member));
        assert_eq!(fence_watch_period(Duration::from_secs(15)), Duration::from_secs(1));
        assert_eq!(fence_watch_period(Duration::from_secs(1)), Duration::from_millis(250));
    }

    #[test]
    fn routes_name_chains_and_never_a_server() {
        assert_eq!(route_chain(&chain_route(42)), Some(42));
        assert_eq!(route_chain("127.0.0.1:4000"), None);
        assert_eq!(route_chain("chain:x"), None);
    }

    #[test]
    fn changes_go_to_the_first_serving_member_and_reads_alternate() {
        let views = ChainViews::default();
        assert_eq!(views.pick(7, Access::Change), Pick::Refetch, "nothing known: ask first");
        views.learn(chain(3, vec![place(1, OFFLINE), place(2, SERVING), place(3, SERVING)]));
        for _ in 0..3 {
            assert_eq!(target_of(views.pick(7, Access::Change)), 2, "the first serving member heads");
        }
        let reads: Vec<u64> = (0..4).map(|_| target_of(views.pick(7, Access::Read))).collect();
        assert_eq!(reads, vec![2, 3, 2, 3], "reads spread over the serving members only");
    }

    #[test]
    fn reads_spread_over_the_healthy_serving_members_only() {
        let views = ChainViews::default();
        assert_eq!(views.readers(7), 1, "nothing known: one part");
        views.learn(chain(3, vec![place(1, SERVING), place(2, SYNCING), place(3, SERVING)]));
        assert_eq!(views.readers(7), 2, "a syncing member never serves a read");
        views.failed(&Member { chain: 7, version: 3, target: TargetId(3) }, true);
        assert_eq!(views.readers(7), 1, "stale: one part until refetched");
        views.learn(chain(3, vec![place(1, SERVING), place(2, SYNCING), place(3, SERVING)]));
        assert_eq!(views.readers(7), 1, "a member that failed under this version is left out");
        views.learn(chain(4, vec![place(1, OFFLINE), place(2, SERVING), place(3, SERVING)]));
        assert_eq!(views.readers(7), 2, "a new version forgets the failures");
    }

    #[test]
    fn a_chain_of_syncing_members_only_takes_changes_at_its_syncing_member() {
        let views = ChainViews::default();
        views.learn(chain(3, vec![place(1, OFFLINE), place(2, SYNCING)]));
        assert_eq!(target_of(views.pick(7, Access::Change)), 2);
        assert!(
            matches!(views.pick(7, Access::Read), Pick::Unavailable(why) if why.contains("no serving member"))
        );
    }

    #[test]
    fn a_refusal_or_failure_asks_for_a_refetch_and_an_unreachable_reader_is_skipped() {
        let views = ChainViews::default();
        views.learn(chain(3, vec![place(1, SERVING), place(2, SERVING)]));
        let member = Member { chain: 7, version: 3, target: TargetId(1) };
        views.failed(&member, true);
        assert_eq!(views.pick(7, Access::Read), Pick::Refetch);
        // The refetch says the same version: member 1 still looks serving, but failed.
        views.learn(chain(3, vec![place(1, SERVING), place(2, SERVING)]));
        let reads: Vec<u64> = (0..3).map(|_| target_of(views.pick(7, Access::Read))).collect();
        assert_eq!(reads, vec![2, 2, 2]);
        // A new version forgets the failures.
        views.learn(chain(4, vec![place(1, SERVING), place(2, SERVING)]));
        let reads: Vec<u64> = (0..2).map(|_| target_of(views.pick(7, Access::Read))).collect();
        assert_eq!(reads.iter().collect::<BTreeSet<_>>().len(), 2);
        // An older version never replaces a newer one.
        views.learn(chain(2, vec![place(9, SERVING)]));
        assert_eq!(views.get(7).unwrap().version, 4);
        // A refusal marks the view stale without calling the member unreachable.
        views.failed(&Member { chain: 7, version: 4, target: TargetId(1) }, false);
        assert_eq!(views.pick(7, Access::Change), Pick::Refetch);
    }

    #[test]
    fn requests_are_wrapped_and_addressed_to_the_member() {
        let fork =
            ForkRef { target: TargetId(1), file: FileId(5), subfile: SubfileIndex(0), fork: "data".into() };
        let destination = Destination {
            addr: "s2:1".into(),
            chained: Some(Member { chain: 7, version: 4, target: TargetId(2) }),
        };
        let sync = IoRequest::Sync { fork: fork.clone() };
        match destination.wrap(&sync) {
            IoRequest::Chained { chain: 7, version: 4, request } => {
                assert_eq!(
                    *request,
                    IoRequest::Sync { fork: ForkRef { target: TargetId(2), ..fork.clone() } }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(Destination::direct("a:1").wrap(&sync), sync, "a direct destination sends it as it is");
        assert_eq!(access_of(&sync), Access::Change);
        assert_eq!(access_of(&IoRequest::ForkSize { fork: fork.clone() }), Access::Read);
        // The tier: a state is read from any serving member, an action goes to the head.
        use flotilla_proto::HsmAction;
        let hsm = |action| IoRequest::Hsm { fork: fork.clone(), action };
        assert_eq!(access_of(&hsm(HsmAction::State)), Access::Read);
        for action in [HsmAction::Archive, HsmAction::Release, HsmAction::Restore] {
            assert_eq!(access_of(&hsm(action)), Access::Change, "{action:?}");
        }
    }

    #[test]
    fn a_refused_reply_becomes_an_error_that_is_retried() {
        let views = ChainViews::default();
        views.learn(chain(3, vec![place(1, SERVING), place(2, SERVING)]));
        let Pick::Go(destination) = views.pick(7, Access::Change) else { panic!() };
        let refused =
            ForwardRefused { chain: 7, version: 3, reason: ForwardRefusalReason::Stale { current: 4 } };
        let outcome = settle(&views, &destination, Ok((IoReply::ForwardRefused(refused), ())));
        let error = outcome.unwrap_err();
        assert!(matches!(error, ClientError::ChainRefused { .. }), "{error:?}");
        assert_ne!(classify(&error), Failure::Final, "a refusal is tried again after a refetch");
        assert!(error.to_string().contains("chain 7"), "{error}");
        assert_eq!(views.pick(7, Access::Change), Pick::Refetch);
    }
}
