//! Messages to the metadata service, from clients and from I/O servers.

use crate::wire_error::WireError;
use flotilla_types::{Attributes, Caller, FileId, FileKind, Layout, SetAttr, SubfileIndex, TargetId};
use serde::{Deserialize, Serialize};

/// Where one subfile of a file lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubfilePlace {
    pub target: TargetId,
    /// Address of the I/O server that last registered the target.
    pub server: String,
    pub up: bool,
    /// Replicated files (issue 32): the chain holding the subfile's replicas, as the
    /// metadata service knew it when it answered (`None`: a file with one copy, at `target`).
    /// For a replicated file `target` and `server` name the chain's head.
    pub chain: Option<SubfileChain>,
}

/// Most chains one `GetChains` may ask for.
pub const CHAINS_PER_REQUEST_MAX: usize = 1024;

/// Most inode rows one `ChainSubfiles` page scans (the metadata service scans at most this
/// many, and fewer if asked).
pub const CHAIN_SUBFILES_SCAN_MAX: u32 = 4096;

/// The chain holding a replicated subfile: its id, its version (every chained request
/// carries it, and members refuse any other) and its members in chain order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubfileChain {
    pub chain: u32,
    pub version: u64,
    pub members: Vec<ReplicaPlace>,
}

/// One replica of a subfile: its target, the address of the server that last registered
/// the target, and the member's state in the chain (reads go to `Serving` members only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPlace {
    pub target: TargetId,
    pub server: String,
    pub state: crate::chains::ChainMemberState,
}

/// A namespace entry as the client sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    pub id: u64,
    pub attrs: Attributes,
    /// For files: the layout and one place per subfile, in subfile order.
    pub layout: Option<Layout>,
    pub subfiles: Vec<SubfilePlace>,
    pub symlink: Option<String>,
    /// For files: what the asking credential may do to the file's data on the I/O servers
    /// (`None` when it may do nothing, and for directories and symlinks).
    pub capability: Option<crate::Capability>,
    /// For files: writers promised never to overlap (`user.flotilla.no_overlap`), so
    /// clients take no byte-range tokens for it.
    pub no_overlap: bool,
    /// Copies of every byte (issue 32): a file's replica count, a directory's default one
    /// (1: a plain file, or a directory whose files take no replica count from it).
    pub replicas: u32,
}

impl EntryInfo {
    pub fn file_id(&self) -> FileId {
        FileId(self.id)
    }

    /// The layout with the replica count (a directory's default, or a file's own).
    pub fn replicated_layout(&self) -> Option<flotilla_types::ReplicatedLayout> {
        self.layout.map(|layout| flotilla_types::ReplicatedLayout { layout, replicas: self.replicas.max(1) })
    }
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntryInfo {
    pub name: String,
    pub id: u64,
    pub kind: FileKind,
}

/// How to create a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSpec {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub subfiles: u32,
    /// The targets to use, one per subfile, or `None` to let the service choose.
    pub targets: Option<Vec<TargetId>>,
    /// The layout, or `None` to inherit the parent directory's default (else explicit).
    pub layout: Option<Layout>,
    /// Fail if the path exists (O_EXCL).
    pub exclusive: bool,
}

/// What a server reports about one of its targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    pub target: TargetId,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// The target lost its contents (its server serves nothing from it until it is repaired).
    pub lost: bool,
}

/// A subfile the server should delete (its file lost its last link).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteOrder {
    pub target: TargetId,
    pub file: FileId,
    pub subfile: SubfileIndex,
}

/// Whether a target's server is heard from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetState {
    Up,
    Down,
    /// Up, but the target lost its contents: every request for it is refused until an
    /// operator repairs it (`flotilla target accept-loss`).
    Lost,
}

/// One line of `flotilla status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    pub target: TargetId,
    pub server: String,
    pub state: TargetState,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// The name of the server credential that reported the target (empty if none since
    /// the metadata service started).
    pub credential: String,
}

/// A request to the metadata service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    Lookup {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Create {
        path: String,
        spec: CreateSpec,
    },
    Readdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
    },
    SetAttr {
        id: u64,
        change: SetAttr,
    },
    Symlink {
        path: String,
        target: String,
        uid: u32,
        gid: u32,
    },
    Link {
        existing: String,
        new: String,
    },
    Status,
    /// An I/O server announces itself and its targets.
    Register {
        server: String,
        targets: Vec<TargetReport>,
    },
    /// Periodic liveness and usage report; `deleted` acknowledges earlier delete orders.
    Heartbeat {
        server: String,
        targets: Vec<TargetReport>,
        deleted: Vec<DeleteOrder>,
    },
    /// An entry by id (inode number).
    GetById {
        id: u64,
    },
    /// Raises a file's size to at least `size_bytes` and sets its mtime (on close or fsync).
    GrowSize {
        id: u64,
        size_bytes: u64,
        mtime_ns: i64,
    },
    /// Sets a directory's default layout (`None` clears it) or an empty file's layout.
    SetLayout {
        path: String,
        layout: Option<Layout>,
        /// A directory's default replica count (issue 32: files created in it without one
        /// of their own keep this many copies); 1 for a file, or with no layout.
        replicas: u32,
    },
    /// Removes the name `path` only if it still names entry `id` (undo of a failed create:
    /// never removes a file someone else put there).
    UnlinkId {
        path: String,
        id: u64,
    },
    /// `rename(2)` with `RENAME_NOREPLACE`: fails with `AlreadyExists` if `to` exists,
    /// checked in the same transaction as the move.
    RenameNoReplace {
        from: String,
        to: String,
    },
    /// Client `session` opened file `id`: until it closes it (or its lease runs out), the
    /// file outlives the loss of its last name. Replies with the entry.
    Opened {
        session: u64,
        id: u64,
    },
    /// Client `session` closed one handle on file `id`.
    Closed {
        session: u64,
        id: u64,
    },
    /// Renews client `session`'s lease on its open files, naming them all (so a restarted
    /// metadata service learns them again).
    KeepOpen {
        session: u64,
        files: Vec<u64>,
    },
    /// `request` made on behalf of `caller` (a program's uid, gid and groups); the service
    /// maps it by the connection's policy and checks permissions for it. A request sent
    /// bare acts with the connection's identity (root on an unrestricted connection).
    /// Never nested.
    As {
        caller: Caller,
        request: Box<MetaRequest>,
    },
    // Requests addressed by identity (issue 11): a directory by its inode id and a name in
    // it, as bytes of at most `NAME_BYTES_MAX`. The mount uses only these (and the id calls
    // above), so it never rebuilds a path and another client's rename cannot redirect it.
    /// The entry `name` in directory `parent` (a symlink is returned, not followed).
    LookupAt {
        parent: u64,
        name: Vec<u8>,
    },
    /// `Create` of `name` in directory `parent`.
    CreateAt {
        parent: u64,
        name: Vec<u8>,
        spec: CreateSpec,
    },
    /// `Mkdir` of `name` in directory `parent`.
    MkdirAt {
        parent: u64,
        name: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// A FIFO, socket or device node `name` in directory `parent`; `rdev` is the device
    /// number of a device node (0 for the others).
    MknodAt {
        parent: u64,
        name: Vec<u8>,
        kind: FileKind,
        rdev: u64,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// `Symlink` named `name` in directory `parent`.
    SymlinkAt {
        parent: u64,
        name: Vec<u8>,
        target: String,
        uid: u32,
        gid: u32,
    },
    /// A new name `name` in directory `parent` for the entry with id `id` (not a directory).
    LinkAt {
        id: u64,
        parent: u64,
        name: Vec<u8>,
    },
    /// Removes the name `name` of a non-directory in directory `parent`; with `id`, only if
    /// the name still names that entry (the undo of a failed create).
    UnlinkAt {
        parent: u64,
        name: Vec<u8>,
        id: Option<u64>,
    },
    /// Removes the empty directory `name` in directory `parent`.
    RmdirAt {
        parent: u64,
        name: Vec<u8>,
    },
    /// `rename(2)`/`renameat2(2)` between (directory id, name) places.
    RenameAt {
        from_parent: u64,
        from_name: Vec<u8>,
        to_parent: u64,
        to_name: Vec<u8>,
        mode: RenameMode,
    },
    /// Up to `entries_max` entries of directory `id` whose names sort after `after`, in
    /// name order; replies `Listing`.
    ReaddirId {
        id: u64,
        after: Option<Vec<u8>>,
        entries_max: u32,
    },
    /// `SetLayout` of the entry with id `id` (a directory's default layout, or an empty
    /// file's layout).
    SetLayoutId {
        id: u64,
        layout: Option<Layout>,
        /// As `SetLayout`'s.
        replicas: u32,
    },
    /// A read's access time: sets the atime of entry `id` to `atime_ns` and nothing else
    /// (no ctime change, unlike `SetAttr`). The mount sends it under its atime rules.
    TouchAtime {
        id: u64,
        atime_ns: i64,
    },
    /// How many inodes the namespace holds (for `statfs`); replies `Inodes`.
    CountInodes,
    /// ENWRICH: joins (creating it if needed) the job group `name` of `size` members;
    /// replied `JobJoined`.
    JobJoin {
        name: String,
        size: u32,
    },
    /// ENWRICH: member `member` asks the whole job to flush generation `epoch`; `clock` is
    /// its hybrid logical clock (the service keeps the largest it has seen).
    JobFlush {
        name: String,
        member: u32,
        epoch: u64,
        clock: u64,
        /// The flush must end with the data synced (a `sync` or `close`, not a full cache).
        durable: bool,
    },
    /// ENWRICH: waits up to `wait_ms` (bounded by the service) for a flush of generation
    /// `epoch` or later to be asked; replied `Job`. Also renews the member's lease.
    JobWait {
        name: String,
        member: u32,
        epoch: u64,
        clock: u64,
        wait_ms: u64,
    },
    /// ENWRICH: member `member` leaves the job group, taking part in no flush of
    /// generation `epoch` or later (refused once such a flush was asked).
    JobLeave {
        name: String,
        member: u32,
        epoch: u64,
    },
    /// `ReaddirId` with each entry's attributes (readdirplus); replies `ListingPlus`.
    ReaddirPlusId {
        id: u64,
        after: Option<Vec<u8>>,
        entries_max: u32,
    },
    /// A byte-range lock (fcntl, and flock as the mount forwards it) on bytes `start..=end`
    /// of file `id` for lock `owner` of client `session`: `Read`/`Write` take it (replacing
    /// the owner's own locks in the range), `Unlock` drops the owner's locks in the range.
    /// With `wait_ms` > 0 the service waits up to that long (bounded by its
    /// `lock_wait_ms_max`) for conflicting locks to go. Replies `Lock(None)` when done,
    /// `Lock(Some(holder))` naming a conflicting lock otherwise.
    SetLock {
        session: u64,
        id: u64,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
        pid: u32,
        wait_ms: u64,
    },
    /// The first lock of another owner conflicting with `kind` on `start..=end` (F_GETLK):
    /// replies `Lock(holder)`.
    GetLock {
        session: u64,
        id: u64,
        owner: u64,
        kind: LockKind,
        start: u64,
        end: u64,
    },
    /// Drops every lock `owner` of `session` holds on file `id` (a descriptor's close).
    ReleaseLocks {
        session: u64,
        id: u64,
        owner: u64,
    },
    /// A byte-range token on file `id` for client `session` (GPFS §2): `mode` over at least
    /// `required` (inclusive byte ranges), and as much of `desired` as conflicts with no
    /// other session's token. Conflicting holders are asked to give their tokens back
    /// (`TokenWait`); the service waits up to `wait_ms` (bounded by `token_wait_ms_max`)
    /// for them. Replies `TokenGranted`, or `TokenBusy` naming a holder still in the way.
    TokenAcquire {
        session: u64,
        id: u64,
        mode: TokenMode,
        required: (u64, u64),
        desired: (u64, u64),
        wait_ms: u64,
    },
    /// Gives back `session`'s tokens on bytes `range` of file `id` (all of them with
    /// `to: None`, or keeps a read token with `to: Some(Read)`), after writing back what
    /// they covered. Replies `Done`.
    TokenRelease {
        session: u64,
        id: u64,
        range: (u64, u64),
        to: Option<TokenMode>,
    },
    /// Waits up to `wait_ms` (bounded) for revocations of `session`'s tokens; replies
    /// `TokenEvents`. `holding`: the client believes it holds tokens (if the service holds
    /// none for it, they were lost — a restart or an expired lease — and it is told so).
    TokenWait {
        session: u64,
        holding: bool,
        wait_ms: u64,
    },
    /// Sets or clears file `id`'s no-overlap hint (`user.flotilla.no_overlap`); needs the
    /// right to change the file's attributes. Replies `Entry`.
    SetNoOverlapId {
        id: u64,
        no_overlap: bool,
    },
    /// `Create`, then `Opened` by client `session` of the file it names, in one round trip
    /// (a program's create is both). Replies with the entry, as `Opened` does.
    CreateOpen {
        path: String,
        spec: CreateSpec,
        session: u64,
    },
    /// `Lookup`, and grants `session` inode tokens (read leases) on what the answer depends
    /// on: `Names` of every directory the walk went through and `Attr` of the entry found.
    /// Replies `CachedEntry` (no grants past the session's `attr_tokens_per_session_max`).
    LookupCached {
        path: String,
        session: u64,
    },
    /// `CreateOpen`, and grants as `LookupCached` does for the new file's path. Replies
    /// `CachedEntry`.
    CreateOpenCached {
        path: String,
        spec: CreateSpec,
        session: u64,
    },
    /// Waits up to `wait_ms` (bounded by `token_wait_ms_max`) for revocations of
    /// `session`'s inode tokens; replies `InodeEvents`. `holding` as for `TokenWait`
    /// (and it renews the session's lease).
    InodeTokenWait {
        session: u64,
        holding: bool,
        wait_ms: u64,
    },
    /// Gives back inode tokens: each is dropped if the session's grant of it is not newer
    /// than the `seq` named. At most `INODE_TOKENS_PER_REQUEST_MAX`. Replies `Done`.
    InodeTokenRelease {
        session: u64,
        tokens: Vec<InodeToken>,
    },
    /// `CreateAt`, then `Opened` by client `session` of the new file, in one round trip (the
    /// mount's create is both). Replies with the entry, as `Opened` does.
    CreateAtOpen {
        parent: u64,
        name: Vec<u8>,
        spec: CreateSpec,
        session: u64,
    },
    /// `Lookup` of `path`, then `Opened` by client `session` when it names a file, in one
    /// round trip (a program's `open` of an existing file). Replies with the entry, as
    /// `Opened` does; an entry that is not a file is returned and not opened.
    OpenPath {
        path: String,
        session: u64,
    },
    /// `Register` with the server's failure group and incarnation (replication, issue 32).
    RegisterMember {
        server: String,
        targets: Vec<TargetReport>,
        member: crate::chains::MemberInfo,
    },
    /// `Heartbeat` with the server's failure group and incarnation; replies
    /// `HeartbeatChains` (the delete orders and the server's chains).
    HeartbeatMember {
        server: String,
        targets: Vec<TargetReport>,
        deleted: Vec<DeleteOrder>,
        member: crate::chains::MemberInfo,
    },
    /// The chain table as `flotilla status` shows it (every chain too with `chains`);
    /// replies `Chains`.
    ChainStatus {
        chains: bool,
    },
    /// `Create` of a file whose every subfile has `replicas` copies on targets of distinct
    /// failure groups (`replicas` 1 is `Create`).
    CreateReplicated {
        path: String,
        spec: CreateSpec,
        replicas: u32,
    },
    /// Re-presents locks `session` held before the metadata service restarted (or another
    /// node took over), after its opens were re-announced (`KeepOpen`). During the service's
    /// lock grace period they are installed again; after it, they must still be held. All
    /// or nothing: `Done`, or `LockLost` naming the first lock refused (not held, conflicting
    /// with another owner's, or on a file the session has not open), `OverLimit` past
    /// `RECLAIM_LOCKS_MAX` or `locks_max`.
    ReclaimLocks {
        session: u64,
        locks: Vec<HeldLock>,
    },
    /// Asks a metadata group for a client session of its reply table (issue 33,
    /// exactly-once): answered `GroupSession`. A service not on a group answers
    /// `GroupSession { session: 0 }` (no session: send changes bare).
    OpenGroupSession,
    /// `request` (a change) as number `sequence` of the client's group `session`: a group
    /// applies it at most once per (session, sequence) and answers a resend with the first
    /// reply, whichever node proposed the first attempt. Replies up to
    /// `acknowledged_through` were received and may be dropped by the group. Outermost:
    /// `request` may be `As`, never another `Sequenced`. A service not on a group serves
    /// `request` bare. A session the group forgot is `ErrorCode::SessionExpired`.
    Sequenced {
        session: u64,
        sequence: u64,
        acknowledged_through: u64,
        request: Box<MetaRequest>,
    },
    /// Replication (issue 32): the current state of chains `chains` (ids from
    /// `SubfilePlace::chain`), at most `CHAINS_PER_REQUEST_MAX`, for a client whose chained
    /// request was refused or whose chain member is unreachable; replies `SubfileChains` in
    /// the order asked (a chain the table does not have is `NotFound`).
    GetChains {
        chains: Vec<u32>,
    },
    /// Replication's resync (issue 32), server credentials only: the subfiles placed on
    /// `chain`, scanning at most `scan_max` (≤ `CHAIN_SUBFILES_SCAN_MAX`) inodes after the
    /// cursor `after` (0 first); replies `ChainSubfiles`.
    ChainSubfiles {
        chain: u32,
        after: u64,
        scan_max: u32,
    },
    /// Replication's resync, server credentials only: the copy source finished copying
    /// `target` everything of `chain` at `version`, and `target` acknowledged it (after an
    /// fsync). The membership engine makes the member serving only if `version` is still
    /// the chain's; replies `Done` either way.
    SyncDone {
        chain: u32,
        target: TargetId,
        version: u64,
    },
    /// Replication (issue 32), admin only (a credential that is neither read-only nor
    /// confined to a subtree, acting as root): drain or remove `target` online through the
    /// membership engine; replies `Done` once the chain changes are durable. An unknown
    /// target is `NotFound`; a removal that would lose a chain's last serving copy is
    /// refused (`InvalidArgument`) naming the chains.
    TargetAdmin {
        target: TargetId,
        action: crate::chains::TargetAction,
    },
    /// A metadata group's members (issue 33), admin only (root not squashed, not read-only,
    /// not confined to a subtree): `Status` is answered by the node asked, with its own view;
    /// `Add` and `Remove` by the leader (others answer `NotServed::NotLeader`). Replies
    /// `GroupStatus` (after a change: the leader's view once the change committed).
    GroupMembership(GroupMembershipRequest),
    /// ENWRICH (issue 33): member `member` of job `name` (`size` members) presents what it
    /// knows of the job to a metadata service that lost it (a new group leader, a restart;
    /// the job requests answer `NotFound` for a job the service does not know): its next
    /// generation `epoch` and `known`, the highest generations it asked for or learned were
    /// asked, the largest clock and the members it learned left. Replies `JobJoined` (its own
    /// index again). Refused (`InvalidArgument`, naming why) when the size differs or the
    /// index was given to another process after the reclaim period.
    JobReclaim {
        name: String,
        size: u32,
        member: u32,
        epoch: u64,
        known: JobEvent,
    },
    /// The mount's lookups and attribute reads under inode tokens (issue 34): `ask` as
    /// `LookupAt` or `GetById` would answer it, and grants `session` what the answer
    /// depends on — `Names(parent)` and `Attr(entry)` for a lookup, `Attr(id)` for an
    /// attribute read — registered before the answer is read. Replies `CachedEntry`, or
    /// `NoEntry` (with `Names(parent)`) when a looked-up name does not exist.
    InodeCached {
        session: u64,
        ask: InodeAsk,
    },
    /// `request` (outermost, around `Sequenced` or `As`), made by client `session`: the
    /// change revokes no inode token of `session` itself (the mount's kernel updates its
    /// own caches for its own changes, and a revocation of its own `Names(dir)` would wait
    /// for the kernel's lock on `dir` that the changing syscall holds). Any request may be
    /// carried; only changes use it. Never nested.
    ChangedBy {
        request: Box<MetaRequest>,
        session: u64,
    },
}

/// What `MetaRequest::InodeCached` asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InodeAsk {
    /// The entry `name` in directory `parent`, as `LookupAt`.
    Lookup { parent: u64, name: Vec<u8> },
    /// The entry with id `id`, as `GetById`.
    Attr { id: u64 },
}

/// Most bytes of an address in a `GroupMembershipRequest::Add`.
pub const GROUP_ADDRESS_BYTES_MAX: usize = 256;

/// What `MetaRequest::GroupMembership` asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupMembershipRequest {
    /// The answering node's view of the group.
    Status,
    /// Add node `node_id`: clients reach it at `meta_addr`, its peers at `group_addr`. It
    /// becomes a learner, catches up (log or snapshot), then a voter.
    Add { node_id: u64, meta_addr: String, group_addr: String },
    /// Remove node `node_id` from the voters and the group.
    Remove { node_id: u64 },
}

/// One member of a metadata group in a `GroupStatus`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMemberInfo {
    pub node_id: u64,
    /// Clients' address (`None`: recorded with its group address only).
    pub meta_addr: Option<String>,
    pub group_addr: String,
    /// A voter (else a learner).
    pub voter: bool,
    /// The last log index it is known to hold: the answering node's applied index for
    /// itself, the leader's replication progress for the others (`None`: unknown there).
    pub log_index: Option<u64>,
}

/// A metadata group node's view of its group (`MetaReply::GroupStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The node that answered.
    pub node_id: u64,
    /// "leader", "follower", "candidate", "learner" or "shutdown".
    pub role: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub members: Vec<GroupMemberInfo>,
}

/// What an inode token covers: `Attr` an inode's attributes (everything `EntryInfo`
/// carries of it), `Names` a directory's entries (name → id) and its search permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum InodeTokenKind {
    Attr,
    Names,
}

/// An inode token (granted, revoked or given back): `kind` on inode `id`; `seq` orders the
/// grants (a revocation or release names the newest grant it covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InodeToken {
    pub kind: InodeTokenKind,
    pub id: u64,
    pub seq: u64,
}

/// Most inode tokens one `InodeTokenRelease` or `InodeEvents` carries.
pub const INODE_TOKENS_PER_REQUEST_MAX: usize = 4096;

/// The right a byte-range token gives: `Read` lets a client cache the bytes; `Write` lets it
/// also change them and keep the changes in its cache (write-behind). Read tokens of several
/// clients coexist; a write token excludes every other client's token on its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TokenMode {
    Read,
    Write,
}

/// A token the service granted: `mode` over bytes `start..=end`; `seq` orders it among the
/// session's grants on the file (a revocation names the last grant it knew of).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenGrant {
    pub mode: TokenMode,
    pub start: u64,
    pub end: u64,
    pub seq: u64,
}

/// A revocation: give back bytes `start..=end` of file `id` (keeping a read token with
/// `to: Some(Read)`) once every grant up to `seq` on that file has been applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRevoke {
    pub id: u64,
    pub start: u64,
    pub end: u64,
    pub to: Option<TokenMode>,
    pub seq: u64,
}

/// Most revocations one `TokenEvents` reply carries.
pub const TOKEN_EVENTS_MAX: usize = 1024;

/// What a `SetLock` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// A lock someone holds: its kind, bytes `start..=end` and the holder's process id (on the
/// holder's machine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// One lock a client holds, as `ReclaimLocks` re-presents it (`kind` is `Read` or `Write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLock {
    pub id: u64,
    pub owner: u64,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// Most locks one `ReclaimLocks` carries (a client holding more sends several).
pub const RECLAIM_LOCKS_MAX: usize = 1024;

/// What a `RenameAt` does when the destination exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameMode {
    /// Replaces it (plain `rename`).
    Replace,
    /// Fails with `AlreadyExists` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swaps the two entries; both must exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// Longest name of one directory entry, in bytes (Linux `NAME_MAX`).
pub const NAME_BYTES_MAX: usize = 255;
/// Most entries one `ReaddirId` reply carries.
pub const READDIR_ENTRIES_MAX: u32 = 4096;

/// One directory entry of a `ReaddirId` listing: the name as bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntry {
    pub name: Vec<u8>,
    pub id: u64,
    pub kind: FileKind,
}

/// One directory entry of a `ReaddirPlusId` listing, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntryPlus {
    pub name: Vec<u8>,
    pub id: u64,
    pub attrs: Attributes,
}

/// What a job member learns from `JobWait` (and `JobJoin`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Highest generation a flush was asked for (`None`: none yet).
    pub flush_asked: Option<u64>,
    /// Highest generation a durable flush was asked for.
    pub durable_asked: Option<u64>,
    /// The largest hybrid-logical-clock value any member reported.
    pub clock: u64,
    /// Members that left: (member index, the generation from which it takes no part).
    pub left: Vec<(u32, u64)>,
}

/// A reply from the metadata service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    Entry(EntryInfo),
    Entries(Vec<DirEntryInfo>),
    Attributes(Attributes),
    Done,
    Status(Vec<TargetStatus>),
    Registered {
        heartbeat_ms: u64,
    },
    HeartbeatAck {
        delete: Vec<DeleteOrder>,
    },
    Error(WireError),
    /// One page of a `ReaddirId` listing; fewer than asked means the end.
    Listing(Vec<ListedEntry>),
    /// Inodes the namespace holds, the root and orphans included.
    Inodes {
        count: u64,
    },
    /// ENWRICH: the joining process's member index and the job's current generation.
    JobJoined {
        member: u32,
        epoch: u64,
        event: JobEvent,
    },
    /// ENWRICH: the job group's state, answering `JobWait`.
    Job(JobEvent),
    /// One page of a `ReaddirPlusId` listing; fewer than asked means the end.
    ListingPlus(Vec<ListedEntryPlus>),
    /// Answers `SetLock` (`None`: done) and `GetLock` (`None`: no conflicting lock).
    Lock(Option<LockInfo>),
    /// Answers `TokenAcquire`.
    TokenGranted(TokenGrant),
    /// Answers `TokenAcquire`: a token of `holder` (a session) still conflicts; ask again.
    TokenBusy {
        holder: u64,
    },
    /// Answers `TokenWait`: tokens to give back; `lost`: the service holds none of this
    /// session's tokens although it believes it holds some (drop them all).
    TokenEvents {
        revokes: Vec<TokenRevoke>,
        lost: bool,
    },
    /// Answers `LookupCached` and `CreateOpenCached`: the entry and the inode tokens
    /// granted with it (none: do not cache it).
    CachedEntry {
        entry: EntryInfo,
        grants: Vec<InodeToken>,
    },
    /// Answers `InodeTokenWait`: inode tokens to give back; `lost` as in `TokenEvents`.
    InodeEvents {
        revokes: Vec<InodeToken>,
        lost: bool,
    },
    /// Answers `HeartbeatMember`: delete orders, and the server's chains and lease.
    HeartbeatChains {
        delete: Vec<DeleteOrder>,
        view: crate::chains::ChainView,
    },
    /// Answers `ChainStatus`.
    Chains(crate::chains::ChainReport),
    /// A metadata group node handled nothing: it is not the leader, or has no quorum
    /// (issue 33, `not_served.rs`).
    NotServed(crate::not_served::NotServed),
    /// Answers `OpenGroupSession`: the client's session id in the group's reply table,
    /// 0 from a service not on a group.
    GroupSession {
        session: u64,
    },
    /// Answers `GetChains`: each chain asked for, with its members' servers and states.
    SubfileChains(Vec<SubfileChain>),
    /// Answers `ChainSubfiles`: (file id, subfile index) of the subfiles found on the chain;
    /// `next` is the cursor of the next page, `None` once every inode was scanned.
    ChainSubfiles {
        subfiles: Vec<(u64, u32)>,
        next: Option<u64>,
    },
    /// Answers `GroupMembership`.
    GroupStatus(GroupStatus),
    /// Answers `InodeCached` for a name that does not exist: `grants` (`Names(parent)`, or
    /// none past the bounds) cover the answer, so the asker may cache it as a negative
    /// entry until the token is revoked.
    NoEntry {
        grants: Vec<InodeToken>,
    },
}
