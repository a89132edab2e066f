//! A seeded, deterministic simulation of replication (TigerBeetle's VOPR and FoundationDB's
//! simulator in miniature): one metadata service running the crate's real [`Membership`]
//! engine, five servers fencing every request with the crate's real [`admit`], recording
//! missing updates in the crate's [`RangeSet`] and applying, forwarding and acknowledging the
//! chain's order through the crate's [`ChainMemberLog`] and [`ChainHead`] (resync copies are
//! modelled here), and three clients writing overlapping ranges,
//! syncing and reading one replicated subfile on one chain of three.
//!
//! Faults: messages lost, delayed and so reordered; servers crashing (losing everything not
//! fsynced) and restarting; servers cut off from everyone and healed; one server down long
//! enough to be declared dead and replaced by a spare with a full copy.
//!
//! Invariants checked after every event:
//! 1. serving members at the same point of the write stream hold identical bytes;
//! 2. no read returns bytes older than a write acknowledged before the read started;
//! 3. no member applies a write under a chain version other than its own (asserted where
//!    it applies);
//! 4. chain versions only grow, at the metadata service and in every server's view.
//!
//! At the end every fault heals and the run quiesces: every serving member must hold the
//! same bytes, none older than the last acknowledged write of each byte.
//!
//! The data model: a fork of [`CELLS`] one-byte cells; a cell holds the `(order, tag)` of the
//! write that last set it, where `order` is the head's position for that write in the chain's
//! one write order and `tag` names the write.
//!
//! A failing run prints its seed; `FLOTILLA_SIM_SEED=<seed> cargo test -p flotilla-replica
//! --test simulation` repeats exactly that run.

use flotilla_replica::{
    admit, Access, Admission, ByteRange, Chain, ChainEntry, ChainHead, ChainId, ChainMemberLog, ChainTable,
    ChainVersion, Event, FailureGroup, Incarnation, MemberState, MemberView, Membership, MembershipConfig,
    Progress, RangeSet, Receive, Unsettled,
};
use flotilla_types::TargetId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SERVERS: usize = 5;
const CLIENTS: usize = 3;
const REPLICAS: usize = 3;
const CELLS: usize = 16;
/// Bound on missing-update ranges per member record: small, so coarsening is exercised.
const RECORD_RANGES_MAX: usize = 3;
const HEARTBEAT_MS: u64 = 100;
const RETRANSMIT_MS: u64 = 50;
const CLIENT_TIMEOUT_MS: u64 = 300;
const META_TICK_MS: u64 = 50;
const FAULT_EVERY_MS: u64 = 250;
const RUN_MS: u64 = 20_000;
/// When one serving member is crashed for good (declared dead, replaced).
const LONG_KILL_AFTER_MS: u64 = 6_000;
const QUIESCE_MS: u64 = 6_000;
const LOSS_PERCENT: u32 = 3;
/// Outbox entries resent per retransmission (a bounded window).
const RETRANSMIT_ENTRIES_MAX: usize = 16;
/// Entries the head keeps in flight (`forward_window_max`); past it a client is refused and
/// retries.
const FORWARD_WINDOW_MAX: usize = 16;
/// Wall-clock budget for the default (many seeds) run.
const WALL_BUDGET: Duration = Duration::from_secs(4);
const SEEDS_MAX: u64 = 64;

fn config() -> MembershipConfig {
    MembershipConfig { lease_ms: 300, clock_margin_ms: 100, fence_after_ms: 500, dead_after_ms: 3_000 }
}

type Cell = (u64, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Meta,
    Server(usize),
    Client(usize),
}

#[derive(Clone, Debug)]
enum EntryKind {
    Write { lo: usize, hi: usize, tag: u64 },
    Sync,
    Copy(Box<CopyBody>),
}

/// A resync copy, sent by the syncing member's predecessor in its ordered forward stream: the
/// cells of the ranges to copy, and the source's records and unsettled writes, so the new
/// member can be a copy source itself later.
#[derive(Clone, Debug)]
struct CopyBody {
    cells: Vec<(usize, Cell)>,
    records: BTreeMap<TargetId, RangeSet>,
    unsettled: Unsettled<()>,
}

#[derive(Clone, Debug)]
struct Entry {
    order: u64,
    kind: EntryKind,
}

#[derive(Clone, Debug)]
enum Msg {
    Heartbeat { incarnation: u64, sent_at_ms: u64 },
    HeartbeatReply { incarnation: u64, sent_at_ms: u64, chain: Chain },
    ChainQuery,
    ChainReply { chain: Chain },
    SyncDone { version: ChainVersion },
    Write { version: ChainVersion, req: u64, lo: usize, hi: usize, tag: u64 },
    Sync { version: ChainVersion, req: u64 },
    Read { version: ChainVersion, req: u64, lo: usize, hi: usize },
    Done { req: u64, order: u64, cells: Vec<Cell> },
    Refused { req: u64 },
    Forward { version: ChainVersion, entry: Entry },
    Ack { version: ChainVersion, order: u64 },
    Join { version: ChainVersion, own: RangeSet },
}

#[derive(Clone, Copy, Debug)]
enum Timer {
    Heartbeat(u64),
    Retransmit(u64),
    MetaTick,
    ClientNext,
    ClientTimeout(u64),
    Fault,
    Restart,
    Heal,
}

#[derive(Debug)]
enum Scheduled {
    Deliver { from: Node, to: Node, msg: Msg },
    Timer { node: Node, timer: Timer },
}

/// What a server keeps on disk (and, in `volatile`, in memory): cells, its chain's member
/// log (the crate's real [`ChainMemberLog`]: its position in the write order, its unsettled
/// writes, and in memory what it forwarded and the syncs not yet settled) and its
/// missing-update records.
#[derive(Clone, Debug)]
struct Store {
    cells: [Cell; CELLS],
    log: Log,
    /// For each member out of the write path: the ranges it misses.
    records: BTreeMap<TargetId, RangeSet>,
}

/// A write's cells and tag, as the member log carries it.
type Log = ChainMemberLog<(), (usize, usize, u64)>;
type LogKind = flotilla_replica::EntryKind<(), (usize, usize, u64)>;

struct Server {
    target: TargetId,
    up: bool,
    cut_off: bool,
    incarnation: u64,
    durable: Store,
    volatile: Store,
    lease_until_ms: u64,
    view: Option<Chain>,
    /// The resync copy this member sent its syncing successor, resent until acknowledged.
    copy_out: Option<Entry>,
    /// At the head: orders waiting for the chain's ack, and whom to answer.
    head: Option<ChainHead<(usize, u64)>>,
    awaiting_copy: bool,
    copy_sent: Option<ChainVersion>,
    down_since_ms: u64,
}

#[derive(Clone, Debug)]
enum OpKind {
    Write { lo: usize, hi: usize, tag: u64 },
    Sync,
    Read { lo: usize, hi: usize, floor: Vec<u64> },
}

struct Client {
    view: Option<Chain>,
    op: Option<(u64, OpKind)>,
    attempt: u64,
    next_req: u64,
}

struct Sim {
    rng: StdRng,
    now_ms: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Scheduled>,
    meta: Membership,
    meta_versions: BTreeMap<ChainId, ChainVersion>,
    chain: ChainId,
    servers: Vec<Server>,
    clients: Vec<Client>,
    /// Highest acknowledged order per cell.
    floor: [u64; CELLS],
    faults: bool,
    long_kills: usize,
    next_tag: u64,
    acked_writes: u64,
    reads_checked: u64,
    rejoined: u64,
    rebuilds: u64,
    /// `FLOTILLA_SIM_TRACE` set: print faults, chain changes and copies.
    trace: bool,
}

impl Store {
    fn empty(chain: ChainId) -> Store {
        Store {
            cells: [(0, 0); CELLS],
            log: Log::new(chain, ChainVersion::FIRST, 0, false),
            records: BTreeMap::new(),
        }
    }

    fn applied(&self) -> u64 {
        self.log.applied()
    }

    fn unsettled_ranges(&self) -> RangeSet {
        self.log
            .unsettled()
            .ranges(RECORD_RANGES_MAX)
            .remove(&())
            .unwrap_or_else(|| RangeSet::new(RECORD_RANGES_MAX))
    }
}

fn range(lo: usize, hi: usize) -> ByteRange {
    ByteRange::new(lo as u64, (hi - lo) as u64).unwrap().unwrap()
}

fn target_of(index: usize) -> TargetId {
    TargetId(index as u64 + 1)
}

fn index_of(target: TargetId) -> usize {
    target.0 as usize - 1
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let groups: BTreeMap<TargetId, FailureGroup> =
            (0..SERVERS).map(|i| (target_of(i), FailureGroup::new(&format!("host{i}")).unwrap())).collect();
        let table = ChainTable::build(groups, REPLICAS, 1).unwrap();
        let chain = table.choose_for_file(1, |_| 0).unwrap()[0];
        let meta = Membership::new(config(), table, 0).unwrap();
        let servers = (0..SERVERS)
            .map(|i| Server {
                target: target_of(i),
                up: true,
                cut_off: false,
                incarnation: 1,
                durable: Store::empty(chain),
                volatile: Store::empty(chain),
                lease_until_ms: 0,
                view: None,
                copy_out: None,
                head: None,
                awaiting_copy: false,
                copy_sent: None,
                down_since_ms: 0,
            })
            .collect();
        let clients =
            (0..CLIENTS).map(|_| Client { view: None, op: None, attempt: 0, next_req: 1 }).collect();
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            now_ms: 0,
            seq: 0,
            queue: BTreeMap::new(),
            meta,
            meta_versions: BTreeMap::new(),
            chain,
            servers,
            clients,
            floor: [0; CELLS],
            faults: true,
            long_kills: 0,
            next_tag: 1,
            acked_writes: 0,
            reads_checked: 0,
            rejoined: 0,
            rebuilds: 0,
            trace: std::env::var_os("FLOTILLA_SIM_TRACE").is_some(),
        };
        for i in 0..SERVERS {
            sim.timer(1 + i as u64, Node::Server(i), Timer::Heartbeat(1));
            sim.timer(5 + i as u64, Node::Server(i), Timer::Retransmit(1));
        }
        for c in 0..CLIENTS {
            sim.timer(200 + c as u64, Node::Client(c), Timer::ClientNext);
        }
        sim.timer(META_TICK_MS, Node::Meta, Timer::MetaTick);
        sim.timer(1_000, Node::Meta, Timer::Fault);
        sim
    }

    fn timer(&mut self, after_ms: u64, node: Node, timer: Timer) {
        self.seq += 1;
        self.queue.insert((self.now_ms + after_ms, self.seq), Scheduled::Timer { node, timer });
    }

    fn reachable(&self, node: Node) -> bool {
        match node {
            Node::Server(i) => self.servers[i].up && !self.servers[i].cut_off,
            Node::Meta | Node::Client(_) => true,
        }
    }

    fn send(&mut self, from: Node, to: Node, msg: Msg) {
        if !self.reachable(from) || !self.reachable(to) {
            return;
        }
        // Heartbeats are lost only by partitions and crashes, so a healthy server is never
        // fenced by bad luck (which would make the fault-safety rule below unsound).
        let heartbeat = matches!(msg, Msg::Heartbeat { .. } | Msg::HeartbeatReply { .. });
        if self.faults && !heartbeat && self.rng.random_range(0..100) < LOSS_PERCENT {
            return;
        }
        let delay_ms = if self.rng.random_range(0..20) == 0 {
            self.rng.random_range(40..150)
        } else {
            self.rng.random_range(1..20)
        };
        self.seq += 1;
        self.queue.insert((self.now_ms + delay_ms, self.seq), Scheduled::Deliver { from, to, msg });
    }

    /// Runs until `end_ms`, checking the invariants after every event.
    fn run_until(&mut self, end_ms: u64) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > end_ms {
                break;
            }
            let ((at_ms, _), event) = entry.remove_entry();
            self.now_ms = at_ms;
            match event {
                Scheduled::Deliver { from, to, msg } => {
                    if self.reachable(from) && self.reachable(to) {
                        self.deliver(from, to, msg);
                    }
                }
                Scheduled::Timer { node, timer } => self.fire(node, timer),
            }
            self.check_replicas();
        }
        self.now_ms = end_ms;
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) {
        match to {
            Node::Meta => self.meta_receive(from, msg),
            Node::Server(i) => self.server_receive(i, from, msg),
            Node::Client(c) => self.client_receive(c, msg),
        }
    }

    fn fire(&mut self, node: Node, timer: Timer) {
        match (node, timer) {
            (Node::Meta, Timer::MetaTick) => {
                self.meta_handle(Event::Tick { at_ms: self.now_ms });
                self.timer(META_TICK_MS, Node::Meta, Timer::MetaTick);
            }
            (Node::Meta, Timer::Fault) if self.faults => {
                self.inject_fault();
                self.timer(FAULT_EVERY_MS, Node::Meta, Timer::Fault);
            }
            (Node::Server(i), Timer::Heartbeat(incarnation))
                if self.servers[i].incarnation == incarnation =>
            {
                self.server_heartbeat(i);
                self.timer(HEARTBEAT_MS, Node::Server(i), Timer::Heartbeat(incarnation));
            }
            (Node::Server(i), Timer::Retransmit(incarnation))
                if self.servers[i].incarnation == incarnation =>
            {
                self.server_retransmit(i);
                self.timer(RETRANSMIT_MS, Node::Server(i), Timer::Retransmit(incarnation));
            }
            (Node::Server(i), Timer::Restart) => self.restart(i),
            (Node::Server(i), Timer::Heal) => self.servers[i].cut_off = false,
            (Node::Client(c), Timer::ClientNext) => self.client_next(c),
            (Node::Client(c), Timer::ClientTimeout(attempt)) if self.clients[c].attempt == attempt => {
                self.client_retry(c)
            }
            _ => {}
        }
    }

    // ---- the metadata service ----

    fn meta_handle(&mut self, event: Event) {
        for command in self.meta.handle(event) {
            if self.trace {
                eprintln!("{:>6} ms meta: {command:?}", self.now_ms);
            }
            if matches!(command, flotilla_replica::Command::Rebuild { chain, .. } if chain == self.chain) {
                self.rebuilds += 1;
            }
            if let flotilla_replica::Command::ChainChanged { chain, version, .. } = command {
                let last = self.meta_versions.insert(chain, version);
                assert!(last.is_none_or(|v| v < version), "chain {chain} went from {last:?} to {version}");
            }
        }
    }

    fn meta_chain(&self) -> Chain {
        self.meta.table().chain(self.chain).unwrap().clone()
    }

    fn meta_receive(&mut self, from: Node, msg: Msg) {
        match (from, msg) {
            (Node::Server(i), Msg::Heartbeat { incarnation, sent_at_ms }) => {
                let target = target_of(i);
                self.meta_handle(Event::Heartbeat {
                    target,
                    incarnation: Incarnation(incarnation),
                    at_ms: self.now_ms,
                });
                let chain = self.meta_chain();
                self.send(Node::Meta, from, Msg::HeartbeatReply { incarnation, sent_at_ms, chain });
            }
            (Node::Server(i), Msg::SyncDone { version }) => {
                let before = self.meta_chain().state_of(target_of(i));
                self.meta_handle(Event::SyncDone { chain: self.chain, target: target_of(i), version });
                if before != Some(MemberState::Serving)
                    && self.meta_chain().state_of(target_of(i)) == Some(MemberState::Serving)
                {
                    self.rejoined += 1;
                }
            }
            (Node::Client(_), Msg::ChainQuery) => {
                let chain = self.meta_chain();
                self.send(Node::Meta, from, Msg::ChainReply { chain });
            }
            _ => {}
        }
    }

    // ---- servers ----

    fn server_heartbeat(&mut self, i: usize) {
        let s = &self.servers[i];
        let msg = Msg::Heartbeat { incarnation: s.incarnation, sent_at_ms: self.now_ms };
        self.send(Node::Server(i), Node::Meta, msg);
    }

    fn admit_at(&self, i: usize, version: ChainVersion, access: Access) -> Admission {
        let s = &self.servers[i];
        let Some(view) = &s.view else { return Admission::NoLease };
        let member = MemberView { version: view.version(), state: view.state_of(s.target) };
        admit(version, member, access, s.lease_until_ms, self.now_ms)
    }

    fn server_receive(&mut self, i: usize, from: Node, msg: Msg) {
        match msg {
            Msg::HeartbeatReply { incarnation, sent_at_ms, chain }
                if incarnation == self.servers[i].incarnation =>
            {
                let s = &mut self.servers[i];
                s.lease_until_ms = s.lease_until_ms.max(sent_at_ms + config().lease_ms);
                if s.view.as_ref().is_none_or(|v| v.version() < chain.version()) {
                    self.learn(i, chain);
                }
            }
            Msg::Write { version, req, lo, hi, tag } => {
                self.client_write(i, from, version, req, EntryKind::Write { lo, hi, tag })
            }
            Msg::Sync { version, req } => self.client_write(i, from, version, req, EntryKind::Sync),
            Msg::Read { version, req, lo, hi } => {
                if self.trace {
                    let s = &self.servers[i];
                    eprintln!(
                        "{:>6} ms {} read {lo}..{hi} at {version} (view {:?}, applied {}, lease {})",
                        self.now_ms,
                        s.target,
                        s.view.as_ref().map(|v| (v.version(), v.state_of(s.target))),
                        s.volatile.applied(),
                        s.lease_until_ms
                    );
                }
                let reply = match self.admit_at(i, version, Access::Read) {
                    Admission::Serve => {
                        Msg::Done { req, order: 0, cells: self.servers[i].volatile.cells[lo..hi].to_vec() }
                    }
                    _ => Msg::Refused { req },
                };
                self.send(Node::Server(i), from, reply);
            }
            Msg::Forward { version, entry } => self.forward_in(i, from, version, entry),
            Msg::Ack { version, order } => self.ack_in(i, from, version, order),
            Msg::Join { version, own } => self.join_in(i, from, version, own),
            _ => {}
        }
    }

    /// A newer chain version: the view, the records of absent members, the resync duties.
    fn learn(&mut self, i: usize, chain: Chain) {
        let s = &mut self.servers[i];
        let old = s.view.as_ref().map(Chain::version);
        assert!(old.is_none_or(|v| v < chain.version()), "server view went back");
        let unsettled = s.volatile.unsettled_ranges();
        let mut records = std::mem::take(&mut s.volatile.records);
        records.retain(|t, _| {
            matches!(
                chain.state_of(*t),
                Some(MemberState::Offline { full: false, .. } | MemberState::Syncing { full: false, .. })
            )
        });
        for member in chain.members() {
            if member.target != s.target
                && matches!(
                    member.state,
                    MemberState::Offline { full: false, .. } | MemberState::Syncing { full: false, .. }
                )
            {
                records
                    .entry(member.target)
                    .or_insert_with(|| RangeSet::new(RECORD_RANGES_MAX))
                    .union(&unsettled);
            }
        }
        s.volatile.records = records;
        let me = chain.state_of(s.target);
        s.awaiting_copy = matches!(me, Some(MemberState::Syncing { .. }));
        // A copy was made for the syncing member as it stood in one version; in any other it
        // may miss what that member lost since, so it is never sent again.
        s.copy_out = None;
        // A member out of the write path, or back in it only through a copy, has left the
        // stream: what it applied but nobody acknowledged may hold orders the next head gave
        // to other writes, so none of it is ever forwarded (its ranges are in its unsettled
        // set, which its resync overwrites). Nor does it settle anything by the syncs it
        // applied then: their orders, too, may be reused, and settling by them would drop
        // unsettled ranges of the new stream. (The member log does both.)
        let serving = matches!(me, Some(MemberState::Serving));
        let successor = chain.successor(s.target);
        let tail = me.is_some_and(MemberState::in_write_path) && successor.is_none();
        let progress = s.volatile.log.change_version(chain.version(), serving, successor.is_some());
        // The head role is volatile: a member that is not the serving head drops it (its
        // clients retry); one that stays head keeps the clients whose entries it applied.
        match (&mut s.head, serving && chain.head() == Some(s.target)) {
            (_, false) => s.head = None,
            (Some(head), true) => drop(head.change_version(&s.volatile.log)),
            (None, true) => s.head = Some(ChainHead::new(&s.volatile.log, FORWARD_WINDOW_MAX)),
        }
        s.view = Some(chain);
        if s.awaiting_copy {
            self.send_join(i);
        } else if tail {
            self.acked(i, progress.ack_up);
        }
    }

    fn send_join(&mut self, i: usize) {
        let s = &self.servers[i];
        let Some(view) = &s.view else { return };
        let Some(from) = view.predecessor(s.target) else { return };
        let msg = Msg::Join { version: view.version(), own: s.volatile.unsettled_ranges() };
        self.send(Node::Server(i), Node::Server(index_of(from)), msg);
    }

    fn client_write(&mut self, i: usize, from: Node, version: ChainVersion, req: u64, kind: EntryKind) {
        let Node::Client(c) = from else { return };
        let is_head = self.servers[i].view.as_ref().and_then(Chain::head) == Some(self.servers[i].target);
        if self.admit_at(i, version, Access::Write) != Admission::Serve
            || !is_head
            || self.servers[i].awaiting_copy
        {
            self.send(Node::Server(i), from, Msg::Refused { req });
            return;
        }
        let s = &mut self.servers[i];
        let log_kind = match &kind {
            EntryKind::Write { lo, hi, tag } => {
                LogKind::Write { fork: (), range: range(*lo, *hi), payload: (*lo, *hi, *tag) }
            }
            _ => LogKind::Sync,
        };
        let submitted = match s.head.as_mut() {
            Some(head) => head.submit(&s.volatile.log, version, log_kind, (c, req)).ok(),
            None => None,
        };
        let Some(submitted) = submitted else {
            self.send(Node::Server(i), from, Msg::Refused { req });
            return;
        };
        let entry = Entry { order: submitted.position, kind };
        let progress = self.apply(i, version, &entry);
        self.pass_down(i, entry, progress);
    }

    /// After applying `entry`: to the successor, or (at the tail) acknowledged upstream.
    /// (The member log keeps what it forwards until the successor acknowledges it.)
    fn pass_down(&mut self, i: usize, entry: Entry, progress: Progress) {
        let s = &self.servers[i];
        let view = s.view.as_ref().expect("applying needs a view");
        match view.successor(s.target) {
            Some(next) => {
                let msg = Msg::Forward { version: view.version(), entry };
                self.send(Node::Server(i), Node::Server(index_of(next)), msg);
            }
            None => self.acked(i, progress.ack_up),
        }
    }

    /// Applies `entry` at its order under `version` (invariant 3: the member's own version).
    fn apply(&mut self, i: usize, version: ChainVersion, entry: &Entry) -> Progress {
        let s = &mut self.servers[i];
        let view = s.view.as_ref().expect("applying needs a view");
        assert_eq!(view.version(), version, "{} applied a write under another version", s.target);
        assert_eq!(entry.order, s.volatile.applied() + 1, "out of order");
        let kind = match &entry.kind {
            EntryKind::Write { lo, hi, tag } => {
                LogKind::Write { fork: (), range: range(*lo, *hi), payload: (*lo, *hi, *tag) }
            }
            EntryKind::Sync => LogKind::Sync,
            EntryKind::Copy(_) => unreachable!("copies are applied by copy_in"),
        };
        let progress = s.volatile.log.applied_entry(ChainEntry { position: entry.order, kind });
        match &entry.kind {
            EntryKind::Write { lo, hi, tag } => {
                for cell in &mut s.volatile.cells[*lo..*hi] {
                    *cell = (entry.order, *tag);
                }
                for member in view.members() {
                    if matches!(member.state, MemberState::Offline { full: false, .. }) {
                        let record = s
                            .volatile
                            .records
                            .entry(member.target)
                            .or_insert_with(|| RangeSet::new(RECORD_RANGES_MAX));
                        record.insert(range(*lo, *hi));
                    }
                }
            }
            EntryKind::Sync => s.durable = s.volatile.clone(),
            EntryKind::Copy(_) => unreachable!("copies are applied by copy_in"),
        }
        progress
    }

    fn forward_in(&mut self, i: usize, from: Node, version: ChainVersion, entry: Entry) {
        let s = &self.servers[i];
        let Some(view) = &s.view else { return };
        let Node::Server(p) = from else { return };
        if self.admit_at(i, version, Access::Write) != Admission::Serve
            || view.predecessor(s.target) != Some(target_of(p))
        {
            return;
        }
        if s.awaiting_copy {
            if let EntryKind::Copy(body) = entry.kind {
                self.copy_in(i, version, entry.order, *body);
            }
            return;
        }
        match s.volatile.log.receive(version, entry.order) {
            Ok(Receive::Duplicate { ack }) => {
                self.send(Node::Server(i), from, Msg::Ack { version, order: ack })
            }
            Ok(Receive::Apply) if !matches!(entry.kind, EntryKind::Copy(_)) => {
                let progress = self.apply(i, version, &entry);
                self.pass_down(i, entry, progress);
            }
            // A gap (or a copy not asked for) is dropped: the predecessor retransmits.
            _ => {}
        }
    }

    /// The syncing member takes the copy: cells, position, and the source's records.
    fn copy_in(&mut self, i: usize, version: ChainVersion, order: u64, body: CopyBody) {
        let s = &mut self.servers[i];
        for (index, cell) in body.cells {
            s.volatile.cells[index] = cell;
        }
        s.volatile.log.copied_to(order, &body.unsettled);
        for (target, ranges) in body.records {
            if target != s.target {
                s.volatile
                    .records
                    .entry(target)
                    .or_insert_with(|| RangeSet::new(RECORD_RANGES_MAX))
                    .union(&ranges);
            }
        }
        s.awaiting_copy = false;
        // The copy is made durable before it is acknowledged: syncs the chain settled while
        // this member was away never passed through it.
        s.durable = s.volatile.clone();
        self.acked(i, order);
        self.send(Node::Server(i), Node::Meta, Msg::SyncDone { version });
    }

    /// Everything up to `order` is applied from here to the tail (the member log has settled
    /// by it): answer, pass up.
    fn acked(&mut self, i: usize, order: u64) {
        let s = &mut self.servers[i];
        if s.copy_out.as_ref().is_some_and(|e| e.order <= order) {
            s.copy_out = None;
        }
        let answered = s.head.as_mut().map(|head| head.answer(order)).unwrap_or_default();
        let view = s.view.clone().expect("acks need a view");
        let up = view.predecessor(s.target);
        for (o, (c, req)) in answered {
            self.send(Node::Server(i), Node::Client(c), Msg::Done { req, order: o, cells: Vec::new() });
        }
        if let Some(up) = up {
            self.send(
                Node::Server(i),
                Node::Server(index_of(up)),
                Msg::Ack { version: view.version(), order },
            );
        }
    }

    fn ack_in(&mut self, i: usize, from: Node, version: ChainVersion, order: u64) {
        let s = &self.servers[i];
        let Some(view) = &s.view else { return };
        let Node::Server(n) = from else { return };
        if self.admit_at(i, version, Access::Write) != Admission::Serve
            || view.successor(s.target) != Some(target_of(n))
        {
            return;
        }
        let Ok(progress) = self.servers[i].volatile.log.successor_acked(version, order) else { return };
        self.acked(i, progress.ack_up);
    }

    /// The syncing member asks its predecessor (the last serving member) for its copy.
    fn join_in(&mut self, i: usize, from: Node, version: ChainVersion, own: RangeSet) {
        let s = &self.servers[i];
        let Some(view) = &s.view else { return };
        let Node::Server(x) = from else { return };
        let joiner = target_of(x);
        let Some(MemberState::Syncing { full, .. }) = view.state_of(joiner) else { return };
        if self.admit_at(i, version, Access::Write) != Admission::Serve
            || view.successor(s.target) != Some(joiner)
            || s.copy_sent == Some(version)
        {
            return;
        }
        let mut ranges = if full { RangeSet::whole(RECORD_RANGES_MAX) } else { own };
        if !full {
            ranges.union(&s.volatile.unsettled_ranges());
            if let Some(record) = s.volatile.records.get(&joiner) {
                ranges.union(record);
            }
        }
        let cells =
            (0..CELLS).filter(|&c| ranges.contains(c as u64)).map(|c| (c, s.volatile.cells[c])).collect();
        let mut records = s.volatile.records.clone();
        records.remove(&joiner);
        if self.trace {
            eprintln!(
                "{:>6} ms {} copies {:?} at order {} to {joiner}: {cells:?}",
                self.now_ms,
                s.target,
                ranges,
                s.volatile.applied()
            );
        }
        let body = CopyBody { cells, records, unsettled: s.volatile.log.unsettled().clone() };
        let entry = Entry { order: s.volatile.applied(), kind: EntryKind::Copy(Box::new(body)) };
        let s = &mut self.servers[i];
        s.copy_sent = Some(version);
        s.copy_out = Some(entry.clone());
        self.send(Node::Server(i), from, Msg::Forward { version, entry });
    }

    fn server_retransmit(&mut self, i: usize) {
        let s = &self.servers[i];
        let Some(view) = s.view.clone() else { return };
        if s.awaiting_copy {
            self.send_join(i);
            return;
        }
        let target = s.target;
        if matches!(view.state_of(target), Some(MemberState::Syncing { .. })) {
            self.send(Node::Server(i), Node::Meta, Msg::SyncDone { version: view.version() });
        }
        let Some(next) = view.successor(target) else { return };
        let s = &self.servers[i];
        let forwarded = s.volatile.log.retransmit(RETRANSMIT_ENTRIES_MAX).map(|e| Entry {
            order: e.position,
            kind: match e.kind {
                LogKind::Write { payload: (lo, hi, tag), .. } => EntryKind::Write { lo, hi, tag },
                LogKind::Sync | LogKind::SyncFork { .. } => EntryKind::Sync,
            },
        });
        let entries: Vec<Entry> = s.copy_out.clone().into_iter().chain(forwarded).collect();
        for entry in entries {
            self.send(
                Node::Server(i),
                Node::Server(index_of(next)),
                Msg::Forward { version: view.version(), entry },
            );
        }
    }

    fn crash(&mut self, i: usize) {
        let now_ms = self.now_ms;
        let s = &mut self.servers[i];
        s.up = false;
        s.down_since_ms = now_ms;
        s.volatile = s.durable.clone();
        s.volatile.log.restarted();
        s.incarnation += 1;
        s.lease_until_ms = 0;
        s.view = None;
        s.copy_out = None;
        s.head = None;
        s.awaiting_copy = false;
        s.copy_sent = None;
    }

    fn restart(&mut self, i: usize) {
        let incarnation = self.servers[i].incarnation;
        self.servers[i].up = true;
        self.timer(1, Node::Server(i), Timer::Heartbeat(incarnation));
        self.timer(2, Node::Server(i), Timer::Retransmit(incarnation));
    }

    // ---- faults ----

    /// Whether a fault on server `i` leaves the chain a serving member that holds every
    /// acknowledged write and will stay serving: reachable now and heard by the metadata
    /// service within two heartbeats (so it is not about to be fenced). Faults beyond that
    /// (every current replica failing before a sync) may lose unsynced writes by contract.
    fn fault_is_safe(&self, i: usize) -> bool {
        let chain = self.meta_chain();
        let healthy = |t: TargetId| {
            index_of(t) != i && self.reachable(Node::Server(index_of(t))) && self.heard_lately(t)
        };
        chain.serving().any(healthy)
            && self.servers[i].up
            && !self.servers[i].cut_off
            && self.heard_lately(target_of(i))
    }

    /// Heard by the metadata service within two heartbeats: faults only hit servers that are
    /// back for good, so only the one long kill outlasts `dead_after_ms`.
    fn heard_lately(&self, target: TargetId) -> bool {
        self.meta.health(target).is_some_and(|h| !h.down && h.last_heard_ms + 2 * HEARTBEAT_MS >= self.now_ms)
    }

    fn inject_fault(&mut self) {
        if self.now_ms >= LONG_KILL_AFTER_MS && self.long_kills == 0 {
            self.long_kill();
            return;
        }
        let i = self.rng.random_range(0..SERVERS);
        if !self.fault_is_safe(i) {
            return;
        }
        let kind = self.rng.random_range(0..10);
        if self.trace && kind <= 4 {
            eprintln!(
                "{:>6} ms fault {} on {} (applied {})",
                self.now_ms,
                if kind <= 2 { "crash" } else { "cut" },
                target_of(i),
                self.servers[i].volatile.applied()
            );
        }
        match kind {
            0..=2 => {
                self.crash(i);
                let down_ms = self.rng.random_range(50..1_500);
                self.timer(down_ms, Node::Server(i), Timer::Restart);
            }
            3..=4 => {
                self.servers[i].cut_off = true;
                let cut_ms = self.rng.random_range(100..2_000);
                self.timer(cut_ms, Node::Server(i), Timer::Heal);
            }
            _ => {}
        }
    }

    /// Crashes a serving member of the chain for longer than `dead_after_ms`, so it is
    /// declared dead and replaced (if no member can go safely now, tries at the next fault).
    fn long_kill(&mut self) {
        let members: Vec<usize> = self.meta_chain().serving().map(index_of).collect();
        let Some(&i) = members.iter().find(|&&i| self.fault_is_safe(i)) else { return };
        if self.trace {
            eprintln!("{:>6} ms fault long crash on {}", self.now_ms, target_of(i));
        }
        self.crash(i);
        self.long_kills += 1;
        self.timer(config().dead_after_ms + 1_000, Node::Server(i), Timer::Restart);
    }

    // ---- clients ----

    fn client_next(&mut self, c: usize) {
        if !self.faults {
            return;
        }
        let lo = self.rng.random_range(0..CELLS);
        let hi = self.rng.random_range(lo + 1..=CELLS.min(lo + 6));
        let kind = match self.rng.random_range(0..8) {
            0..=3 => {
                self.next_tag += 1;
                OpKind::Write { lo, hi, tag: self.next_tag }
            }
            4 => OpKind::Sync,
            _ => OpKind::Read { lo, hi, floor: self.floor[lo..hi].to_vec() },
        };
        let client = &mut self.clients[c];
        client.op = Some((client.next_req, kind));
        client.next_req += 1;
        self.client_send(c);
    }

    fn client_send(&mut self, c: usize) {
        self.clients[c].attempt += 1;
        let attempt = self.clients[c].attempt;
        self.timer(CLIENT_TIMEOUT_MS, Node::Client(c), Timer::ClientTimeout(attempt));
        let client = &self.clients[c];
        let (Some(view), Some((req, kind))) = (client.view.clone(), client.op.clone()) else {
            self.send(Node::Client(c), Node::Meta, Msg::ChainQuery);
            return;
        };
        let version = view.version();
        let (to, msg) = match kind {
            OpKind::Write { lo, hi, tag } => (view.head(), Msg::Write { version, req, lo, hi, tag }),
            OpKind::Sync => (view.head(), Msg::Sync { version, req }),
            OpKind::Read { lo, hi, .. } => {
                let serving: Vec<TargetId> = view.serving().collect();
                let pick = serving[self.rng.random_range(0..serving.len())];
                (Some(pick), Msg::Read { version, req, lo, hi })
            }
        };
        if let Some(to) = to {
            self.send(Node::Client(c), Node::Server(index_of(to)), msg);
        }
    }

    fn client_retry(&mut self, c: usize) {
        if self.clients[c].op.is_some() {
            self.send(Node::Client(c), Node::Meta, Msg::ChainQuery);
            self.client_send(c);
        }
    }

    fn client_receive(&mut self, c: usize, msg: Msg) {
        match msg {
            Msg::ChainReply { chain } => {
                let client = &mut self.clients[c];
                if client.view.as_ref().is_none_or(|v| v.version() < chain.version()) {
                    client.view = Some(chain);
                    if client.op.is_some() {
                        self.client_send(c);
                    }
                }
            }
            Msg::Refused { req } if self.clients[c].op.as_ref().is_some_and(|(r, _)| *r == req) => {
                self.send(Node::Client(c), Node::Meta, Msg::ChainQuery);
            }
            Msg::Done { req, order, cells }
                if self.clients[c].op.as_ref().is_some_and(|(r, _)| *r == req) =>
            {
                let (_, kind) = self.clients[c].op.take().unwrap();
                self.clients[c].attempt += 1;
                self.complete(kind, order, &cells);
                let think_ms = self.rng.random_range(1..40);
                self.timer(think_ms, Node::Client(c), Timer::ClientNext);
            }
            _ => {}
        }
    }

    /// Invariant 2, and the floor every later read must reach.
    fn complete(&mut self, kind: OpKind, order: u64, cells: &[Cell]) {
        match kind {
            OpKind::Write { lo, hi, .. } => {
                if self.trace {
                    eprintln!("{:>6} ms write {lo}..{hi} acknowledged at order {order}", self.now_ms);
                }
                for floor in &mut self.floor[lo..hi] {
                    *floor = (*floor).max(order);
                }
                self.acked_writes += 1;
            }
            OpKind::Sync => {}
            OpKind::Read { lo, floor, .. } => {
                for (k, (cell, floor)) in cells.iter().zip(&floor).enumerate() {
                    assert!(
                        cell.0 >= *floor,
                        "read of cell {} returned order {} older than acknowledged {}",
                        lo + k,
                        cell.0,
                        floor
                    );
                }
                self.reads_checked += 1;
            }
        }
    }

    // ---- invariants ----

    /// Invariant 1 (and 4 at the servers): serving members at the same point of the stream,
    /// in the service's current version, hold identical bytes.
    fn check_replicas(&self) {
        let chain = self.meta_chain();
        let mut by_point: BTreeMap<u64, (TargetId, [Cell; CELLS])> = BTreeMap::new();
        for target in chain.serving() {
            let s = &self.servers[index_of(target)];
            let current = s.view.as_ref().is_some_and(|v| v.version() == chain.version());
            if !s.up || !current || s.awaiting_copy {
                continue;
            }
            if let Some((other, cells)) = by_point.get(&s.volatile.applied()) {
                assert_eq!(
                    cells,
                    &s.volatile.cells,
                    "serving {} and {} differ at order {} in {}",
                    other,
                    target,
                    s.volatile.applied(),
                    chain.version()
                );
            } else {
                by_point.insert(s.volatile.applied(), (target, s.volatile.cells));
            }
        }
    }

    /// Heals everything, lets the clients finish, and checks the final state.
    fn quiesce_and_check(&mut self) {
        self.faults = false;
        for i in 0..SERVERS {
            self.servers[i].cut_off = false;
            let dead = self.meta.health(target_of(i)).is_some_and(|h| h.dead);
            if !self.servers[i].up && !dead {
                self.restart(i);
            }
        }
        self.run_until(self.now_ms + QUIESCE_MS);
        let chain = self.meta_chain();
        let serving: Vec<TargetId> = chain.serving().collect();
        let alive = (0..SERVERS).filter(|&i| self.meta.health(target_of(i)).is_some_and(|h| !h.dead)).count();
        assert_eq!(serving.len(), REPLICAS.min(alive), "the chain did not recover: {chain:?}");
        let first = &self.servers[index_of(serving[0])].volatile;
        for &target in &serving {
            let s = &self.servers[index_of(target)].volatile;
            assert_eq!(s.cells, first.cells, "{} and {} differ after quiescing", serving[0], target);
            for (cell, floor) in s.cells.iter().zip(&self.floor) {
                assert!(cell.0 >= *floor, "{target} lost an acknowledged write");
            }
        }
    }
}

/// What one run did: acknowledged writes, checked reads, rejoins, rebuilds onto a replacement.
type Counts = [u64; 4];

fn run(seed: u64) -> Counts {
    let mut sim = Sim::new(seed);
    sim.run_until(RUN_MS);
    sim.quiesce_and_check();
    [sim.acked_writes, sim.reads_checked, sim.rejoined, sim.rebuilds]
}

fn run_reporting_seed(seed: u64) -> Counts {
    match std::panic::catch_unwind(|| run(seed)) {
        Ok(counts) => counts,
        Err(panic) => {
            eprintln!("simulation failed with seed {seed}: repeat with FLOTILLA_SIM_SEED={seed}");
            std::panic::resume_unwind(panic)
        }
    }
}

#[test]
fn replication_survives_crashes_partitions_and_lossy_networks() {
    if let Ok(seed) = std::env::var("FLOTILLA_SIM_SEED") {
        let seed: u64 = seed.parse().expect("FLOTILLA_SIM_SEED is a u64");
        let [writes, reads, rejoins, rebuilds] = run_reporting_seed(seed);
        eprintln!("seed {seed}: {writes} writes acknowledged, {reads} reads checked, {rejoins} rejoins, {rebuilds} rebuilds");
        return;
    }
    let base: u64 = rand::random();
    let started = Instant::now();
    let (mut total, mut seeds) = ([0u64; 4], 0);
    while seeds < SEEDS_MAX && (seeds < 2 || started.elapsed() < WALL_BUDGET) {
        let counts = run_reporting_seed(base.wrapping_add(seeds));
        total.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
        seeds += 1;
    }
    let [writes, reads, rejoins, rebuilds] = total;
    eprintln!("{seeds} seeds from {base}: {writes} writes acknowledged, {reads} reads checked, {rejoins} rejoins, {rebuilds} rebuilds");
    assert!(writes > 50 * seeds && reads > 30 * seeds, "the simulation did too little to mean anything");
    assert!(rejoins > 0, "no member ever rejoined");
    assert!(rebuilds >= seeds / 2, "too few dead members were replaced: {rebuilds} in {seeds} runs");
}
