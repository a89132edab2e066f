//! What goes through the metadata group's log for the namespace: one [`NamespaceChange`] per
//! changing request (the body of a `flotilla_metagroup::Change`), and what the state machine
//! answers ([`BatchReply`], one [`Outcome`] per change).
//!
//! Everything a replica could decide differently is decided by the proposer and carried
//! here: the caller (after the connection's policy), the clock (`now_ns`), the targets a
//! create may take (in order of preference), whether the file a name loses is open, and the
//! id key of a new namespace. Admission checks that depend on the connection or the
//! service's settings (policy, subtree, layout bounds, a grower's write right) are made by
//! the proposer before it proposes, as the handlers make them today before executing.
//!
//! Invariants: a change is encoded as `[version u8][postcard]`, at most
//! [`CHANGE_BYTES_MAX`] bytes; a decoded change passed [`NamespaceChange::check`] (every
//! name, path and list within its bound), so nothing unbounded reaches the namespace.

use flotilla_metagroup::ReplyError;
use flotilla_namespace::{
    Entry, FileRecord, Owner, Place as NsPlace, ID_KEY_BYTES, OWNER_NAME_BYTES_MAX,
    PENDING_DELETES_BATCH_MAX, SERVER_ADDR_BYTES_MAX, SUBFILE_COUNT_MAX, TARGETS_BOUND_PER_CALL_MAX,
};
use flotilla_proto::WireError;
use flotilla_types::{
    Attributes, Caller, FileId, FileKind, Layout, SetAttr, SubfileIndex, TargetId, NAME_BYTES_MAX,
    PATH_BYTES_MAX,
};
use serde::{Deserialize, Serialize};

/// The change format this build writes and reads.
pub const CHANGE_VERSION: u8 = 1;
/// Most bytes of one encoded change (the largest is an acknowledgement of
/// `PENDING_DELETES_BATCH_MAX` deletions, under 1.5 MiB).
pub const CHANGE_BYTES_MAX: usize = 2 << 20;
/// The reply format this build writes and reads.
pub const REPLY_VERSION: u8 = 1;

/// Where a name is: a path, or a directory by id and a name in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Place {
    Path(String),
    At { parent: u64, name: Vec<u8> },
}

impl Place {
    /// The namespace's form.
    pub fn as_namespace(&self) -> NsPlace<'_> {
        match self {
            Place::Path(path) => NsPlace::Path(path),
            Place::At { parent, name } => NsPlace::At { parent: *parent, name },
        }
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Place::Path(path) => check_len("path", path.len(), PATH_BYTES_MAX),
            Place::At { name, .. } => check_len("name", name.len(), NAME_BYTES_MAX),
        }
    }
}

/// Owner and permissions of a new entry (the policy already applied by the proposer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOwner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl From<NewOwner> for Owner {
    fn from(o: NewOwner) -> Owner {
        Owner { mode: o.mode, uid: o.uid, gid: o.gid }
    }
}

impl From<Owner> for NewOwner {
    fn from(o: Owner) -> NewOwner {
        NewOwner { mode: o.mode, uid: o.uid, gid: o.gid }
    }
}

/// Whether the file a name loses is kept (as an orphan) because a client has it open; the
/// open-file table is the proposer's memory, so the proposer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpenHint {
    /// Nothing is kept (the undo of a failed create).
    NoneOpen,
    /// The proposer found entry `id` at the name, open or not. Any other entry found there
    /// when the change is applied (the name changed in between) is kept as an orphan: the
    /// safe side, since an orphan nobody has open is released later.
    Found { id: u64, open: bool },
    /// The proposer found nothing there: whatever is found when applied is kept.
    Unknown,
}

impl OpenHint {
    /// Whether file `id` is to be kept as open.
    pub fn is_open(&self, id: u64) -> bool {
        match *self {
            OpenHint::NoneOpen => false,
            OpenHint::Found { id: found, open } if found == id => open,
            OpenHint::Found { .. } | OpenHint::Unknown => true,
        }
    }
}

/// The three renames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameMode {
    /// May replace what `to` names (kept as an orphan if open).
    Replace {
        open: OpenHint,
    },
    NoReplace,
    Exchange,
}

/// Which entry a layout is set on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayoutOn {
    Path(String),
    Id(u64),
}

/// One namespace-changing operation (every changing request of `handle.rs` and
/// `handle_at.rs`, the target records and the orphans' release).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// The group's first state: an empty namespace with this id key, its root's times
    /// `now_ns`. Applied once, alone in its batch, outside sessions; refused once the
    /// namespace has one.
    Genesis {
        id_key: [u8; ID_KEY_BYTES],
    },
    /// Opens an exactly-once session; the result is its id.
    OpenSession,
    /// Ends a session; its replies go.
    CloseSession {
        session_id: u64,
    },
    Mkdir {
        at: Place,
        owner: NewOwner,
    },
    /// A create (`Create`, `CreateOpen`, `CreateAt`, `CreateAtOpen`): `ranked` is every live
    /// target in the proposer's order of preference; the file takes the first ones.
    Create {
        at: Place,
        owner: NewOwner,
        subfile_count: u32,
        targets: Option<Vec<TargetId>>,
        layout: Option<Layout>,
        exclusive: bool,
        ranked: Vec<TargetId>,
    },
    Mknod {
        at: Place,
        kind: FileKind,
        rdev: u64,
        owner: NewOwner,
    },
    Symlink {
        at: Place,
        target: String,
        owner: NewOwner,
    },
    /// `Link` by paths.
    Link {
        existing: String,
        new: String,
    },
    /// `LinkAt`: entry `id` gets a name at `at`.
    LinkAt {
        id: u64,
        at: Place,
    },
    /// `Unlink`, `UnlinkAt` (with `expected_id`) and `UnlinkId` (with `expected_id` and
    /// `OpenHint::NoneOpen`).
    Unlink {
        at: Place,
        expected_id: Option<u64>,
        open: OpenHint,
    },
    Rmdir {
        at: Place,
    },
    Rename {
        from: Place,
        to: Place,
        mode: RenameMode,
    },
    SetAttr {
        id: u64,
        change: SetAttr,
    },
    GrowSize {
        id: u64,
        size_bytes: u64,
        mtime_ns: i64,
    },
    SetLayout {
        on: LayoutOn,
        layout: Option<Layout>,
    },
    TouchAtime {
        id: u64,
        atime_ns: i64,
    },
    SetNoOverlap {
        id: u64,
        no_overlap: bool,
    },
    /// A target new or moved (registration or heartbeat).
    RecordTarget {
        target: TargetId,
        server: String,
        used_bytes: u64,
        free_bytes: u64,
    },
    /// Targets bound to a server credential at their first report.
    BindTargets {
        credential: String,
        targets: Vec<TargetId>,
    },
    /// Subfile deletions a server reports done.
    AckDeletes {
        target: TargetId,
        done: Vec<(FileId, SubfileIndex)>,
    },
    /// An orphan nobody has open any more: its inode goes, its subfiles are queued.
    ReleaseOrphan {
        id: u64,
    },
    /// Chain changes the leader's membership engine decided (issue 32 on a group): chains
    /// written whole, target records (failure group, incarnation) written whole, and the
    /// replica count when the table is built. Applied into the tables `chains` and
    /// `chain_targets` as the direct path writes them.
    ChainChanges {
        replicas: Option<u32>,
        chains: Vec<ChainRow>,
        targets: Vec<ChainTargetRow>,
    },
    /// A replicated create: subfile `i` on chain `chains[i].0` with head `chains[i].1`, as
    /// the proposer placed it from its chain table.
    CreateChained {
        at: Place,
        owner: NewOwner,
        subfile_count: u32,
        layout: Option<Layout>,
        exclusive: bool,
        replicas: u8,
        chains: Vec<(u32, TargetId)>,
    },
    /// `SetLayout`/`SetLayoutId` with a directory's default replica count.
    SetLayoutReplicated {
        on: LayoutOn,
        layout: Option<Layout>,
        replicas: u32,
    },
    /// Opens an exactly-once session owned by the client credential `owner` (a client's
    /// `OpenGroupSession`): only that credential may send changes in it. The result is its id.
    OpenSessionFor {
        owner: String,
    },
}

/// One chain of an [`Op::ChainChanges`], as the engine holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRow {
    pub id: u32,
    pub version: u64,
    pub members: Vec<flotilla_replica::Member>,
}

impl ChainRow {
    pub fn of(chain: &flotilla_replica::Chain) -> ChainRow {
        ChainRow { id: chain.id().0, version: chain.version().0, members: chain.members().to_vec() }
    }

    /// The chain, if it keeps the chain invariants (distinct members, at most one syncing).
    pub fn chain(&self) -> Option<flotilla_replica::Chain> {
        if self.members.is_empty() || self.members.len() > flotilla_replica::MEMBERS_PER_CHAIN_MAX {
            return None;
        }
        flotilla_replica::Chain::from_parts(
            flotilla_replica::ChainId(self.id),
            flotilla_replica::ChainVersion(self.version),
            self.members.clone(),
        )
    }
}

/// One target record of an [`Op::ChainChanges`]: its failure group, incarnation and the
/// dead and draining marks (so a new leader keeps them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTargetRow {
    pub target: TargetId,
    pub group: String,
    pub incarnation: Option<u64>,
    pub dead: bool,
    pub draining: bool,
}

impl ChainTargetRow {
    pub fn record(&self) -> Option<flotilla_namespace::ChainTarget> {
        let group = flotilla_replica::FailureGroup::new(&self.group).ok()?;
        Some(flotilla_namespace::ChainTarget {
            group,
            incarnation: self.incarnation.filter(|&i| i != 0).map(flotilla_replica::Incarnation),
            dead: self.dead,
            draining: self.draining,
        })
    }
}

/// A change as the proposer sends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceChange {
    /// Who asks, after the connection's policy.
    pub caller: Caller,
    /// The proposer's clock (ns since the epoch): the change's times.
    pub now_ns: i64,
    pub op: Op,
}

/// Why a change's bytes are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    #[error("change of {bytes} bytes is over change_bytes_max {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
    #[error("change version {found}, this build reads {CHANGE_VERSION}")]
    Version { found: u8 },
    #[error("change is empty")]
    Empty,
    #[error("change does not decode: {reason}")]
    Decode { reason: String },
    #[error("change does not encode: {reason}")]
    Encode { reason: String },
    #[error("change out of bounds: {reason}")]
    Bounds { reason: String },
}

fn check_len(what: &str, len: usize, max: usize) -> Result<(), String> {
    match len <= max {
        true => Ok(()),
        false => Err(format!("{what} of {len} over its bound of {max}")),
    }
}

impl NamespaceChange {
    pub fn new(caller: Caller, now_ns: i64, op: Op) -> Self {
        NamespaceChange { caller, now_ns, op }
    }

    /// `[CHANGE_VERSION][postcard]`, checked against the bounds first.
    pub fn encode(&self) -> Result<Vec<u8>, ChangeError> {
        self.check()?;
        let mut bytes = vec![CHANGE_VERSION];
        postcard::to_io(self, &mut bytes).map_err(|e| ChangeError::Encode { reason: e.to_string() })?;
        if bytes.len() > CHANGE_BYTES_MAX {
            return Err(ChangeError::TooLarge { bytes: bytes.len(), bytes_max: CHANGE_BYTES_MAX });
        }
        Ok(bytes)
    }

    /// Decodes and checks a change's bytes; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, ChangeError> {
        if bytes.len() > CHANGE_BYTES_MAX {
            return Err(ChangeError::TooLarge { bytes: bytes.len(), bytes_max: CHANGE_BYTES_MAX });
        }
        let (&version, payload) = bytes.split_first().ok_or(ChangeError::Empty)?;
        if version != CHANGE_VERSION {
            return Err(ChangeError::Version { found: version });
        }
        let change: NamespaceChange =
            postcard::from_bytes(payload).map_err(|e| ChangeError::Decode { reason: e.to_string() })?;
        change.check()?;
        Ok(change)
    }

    /// Every name, path and list within its bound.
    pub fn check(&self) -> Result<(), ChangeError> {
        self.check_op().map_err(|reason| ChangeError::Bounds { reason })
    }

    fn check_op(&self) -> Result<(), String> {
        check_len("caller's groups", self.caller.groups.len(), flotilla_types::CALLER_GROUPS_MAX)?;
        let subfiles = SUBFILE_COUNT_MAX as usize;
        match &self.op {
            Op::Genesis { .. } | Op::OpenSession | Op::CloseSession { .. } => Ok(()),
            Op::OpenSessionFor { owner } => check_len("session owner", owner.len(), OWNER_NAME_BYTES_MAX),
            Op::Mkdir { at, .. } | Op::Mknod { at, .. } | Op::Rmdir { at } | Op::LinkAt { at, .. } => {
                at.check()
            }
            Op::Unlink { at, .. } => at.check(),
            Op::Create { at, targets, ranked, .. } => {
                at.check()?;
                check_len("named targets", targets.as_ref().map_or(0, Vec::len), subfiles)?;
                check_len("ranked targets", ranked.len(), subfiles)
            }
            Op::Symlink { at, target, .. } => {
                at.check()?;
                check_len("symlink target", target.len(), PATH_BYTES_MAX)
            }
            Op::Link { existing, new } => {
                check_len("path", existing.len(), PATH_BYTES_MAX)?;
                check_len("path", new.len(), PATH_BYTES_MAX)
            }
            Op::Rename { from, to, .. } => {
                from.check()?;
                to.check()
            }
            Op::SetLayout { on: LayoutOn::Path(path), .. } => check_len("path", path.len(), PATH_BYTES_MAX),
            Op::SetAttr { .. }
            | Op::GrowSize { .. }
            | Op::SetLayout { .. }
            | Op::TouchAtime { .. }
            | Op::SetNoOverlap { .. }
            | Op::ReleaseOrphan { .. } => Ok(()),
            Op::RecordTarget { server, .. } => {
                check_len("server address", server.len(), SERVER_ADDR_BYTES_MAX)
            }
            Op::BindTargets { credential, targets } => {
                check_len("credential", credential.len(), OWNER_NAME_BYTES_MAX)?;
                check_len("bound targets", targets.len(), TARGETS_BOUND_PER_CALL_MAX)
            }
            Op::AckDeletes { done, .. } => {
                check_len("acknowledged deletions", done.len(), PENDING_DELETES_BATCH_MAX)
            }
            Op::ChainChanges { chains, targets, .. } => {
                check_len("chains", chains.len(), flotilla_replica::CHAINS_MAX)?;
                check_len("chain targets", targets.len(), flotilla_replica::CHAINS_MAX)?;
                if let Some(bad) = chains.iter().find(|c| c.chain().is_none()) {
                    return Err(format!("chain {} breaks the chain invariants", bad.id));
                }
                match targets.iter().find(|t| t.record().is_none()) {
                    Some(bad) => Err(format!("target {} has a bad failure group", bad.target)),
                    None => Ok(()),
                }
            }
            Op::CreateChained { at, chains, .. } => {
                at.check()?;
                check_len("chains", chains.len(), subfiles)
            }
            Op::SetLayoutReplicated { on: LayoutOn::Path(path), .. } => {
                check_len("path", path.len(), PATH_BYTES_MAX)
            }
            Op::SetLayoutReplicated { .. } => Ok(()),
        }
    }
}

/// An entry as the state machine answers it (the namespace's `Entry`; the service turns it
/// into the client's view with its membership and capabilities).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyEntry {
    pub id: u64,
    pub attrs: Attributes,
    /// A file's layout, targets and replica count.
    pub file: Option<(Layout, Vec<TargetId>, u32)>,
    pub symlink_target: Option<String>,
    pub default_layout: Option<Layout>,
}

impl From<Entry> for ReplyEntry {
    fn from(e: Entry) -> Self {
        ReplyEntry {
            id: e.id,
            attrs: e.attrs,
            file: e.file.map(|f| (f.layout, f.targets, f.replicas)),
            symlink_target: e.symlink_target,
            default_layout: e.default_layout,
        }
    }
}

impl ReplyEntry {
    /// The namespace's entry again.
    pub fn into_entry(self) -> Entry {
        let id = self.id;
        Entry {
            id,
            attrs: self.attrs,
            file: self.file.map(|(layout, targets, replicas)| FileRecord {
                id: FileId(id),
                layout,
                targets,
                replicas,
                // Not carried: the service reads a replicated file back (`answer`).
                chains: Vec::new(),
            }),
            symlink_target: self.symlink_target,
            default_layout: self.default_layout,
            // Not carried: the service reads a directory with a default back (`answer`).
            default_replicas: 1,
        }
    }
}

/// What an applied change produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    Entry(ReplyEntry),
    Attributes(Attributes),
    Done,
    /// A name was removed (unlink, rename over); `orphaned` is the file kept because open.
    Removed {
        orphaned: Option<u64>,
    },
    /// An orphan was released (`false`: it was not an orphan).
    Released(bool),
    /// A session was opened.
    Session(u64),
}

/// The result a handler would give: the value, or the wire error it would send.
pub type ChangeResult = Result<Applied, WireError>;

/// An inode whose cached copies a change made stale (the service revokes its inode tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TouchedInode {
    Attr(u64),
    Names(u64),
}

/// What happened to one change of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Applied now.
    Applied { result: ChangeResult, touched: Vec<TouchedInode> },
    /// Applied before under the same (session, sequence): its first result; nothing now.
    Replayed(ChangeResult),
    /// Neither applied nor replayed (session unknown or expired, reply forgotten …).
    Refused(ReplyError),
    /// The change's bytes were not a valid change.
    Invalid(String),
}

impl Outcome {
    /// The handler's result, applied now or before.
    pub fn result(&self) -> Option<&ChangeResult> {
        match self {
            Outcome::Applied { result, .. } | Outcome::Replayed(result) => Some(result),
            Outcome::Refused(_) | Outcome::Invalid(_) => None,
        }
    }
}

/// The state machine's reply to one batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReply {
    pub outcomes: Vec<Outcome>,
}

impl BatchReply {
    /// `[REPLY_VERSION][postcard]`.
    pub fn encode(&self) -> Result<Vec<u8>, ChangeError> {
        let mut bytes = vec![REPLY_VERSION];
        postcard::to_io(self, &mut bytes).map_err(|e| ChangeError::Encode { reason: e.to_string() })?;
        Ok(bytes)
    }

    /// Decodes a batch reply (bounded by the reply's own length); never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, ChangeError> {
        let (&version, payload) = bytes.split_first().ok_or(ChangeError::Empty)?;
        if version != REPLY_VERSION {
            return Err(ChangeError::Version { found: version });
        }
        postcard::from_bytes(payload).map_err(|e| ChangeError::Decode { reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn place() -> impl Strategy<Value = Place> {
        prop_oneof![
            "/[a-z]{1,8}(/[a-z]{1,8}){0,2}".prop_map(Place::Path),
            (any::<u64>(), proptest::collection::vec(1u8..=255, 1..16))
                .prop_map(|(parent, name)| Place::At { parent, name }),
        ]
    }

    fn owner() -> impl Strategy<Value = NewOwner> {
        (0u32..0o7777, any::<u32>(), any::<u32>()).prop_map(|(mode, uid, gid)| NewOwner { mode, uid, gid })
    }

    fn hint() -> impl Strategy<Value = OpenHint> {
        prop_oneof![
            Just(OpenHint::NoneOpen),
            Just(OpenHint::Unknown),
            (any::<u64>(), any::<bool>()).prop_map(|(id, open)| OpenHint::Found { id, open }),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let targets = proptest::collection::vec(any::<u64>().prop_map(TargetId), 0..8);
        prop_oneof![
            any::<[u8; 16]>().prop_map(|id_key| Op::Genesis { id_key }),
            Just(Op::OpenSession),
            (place(), owner()).prop_map(|(at, owner)| Op::Mkdir { at, owner }),
            (place(), owner(), 0u32..8, targets.clone(), any::<bool>()).prop_map(
                |(at, owner, subfile_count, ranked, exclusive)| Op::Create {
                    at,
                    owner,
                    subfile_count,
                    targets: None,
                    layout: Some(Layout::Stripe { unit_bytes: 1 << 16, count: 2 }),
                    exclusive,
                    ranked,
                }
            ),
            (place(), any::<Option<u64>>(), hint()).prop_map(|(at, expected_id, open)| Op::Unlink {
                at,
                expected_id,
                open
            }),
            (place(), place(), hint()).prop_map(|(from, to, open)| Op::Rename {
                from,
                to,
                mode: RenameMode::Replace { open }
            }),
            (any::<u64>(), any::<u32>()).prop_map(|(id, mode)| Op::SetAttr {
                id,
                change: SetAttr { mode: Some(mode & 0o7777), ..SetAttr::default() }
            }),
            (any::<u64>(), targets)
                .prop_map(|(t, targets)| Op::BindTargets { credential: format!("server-{t}"), targets }),
            any::<u64>().prop_map(|id| Op::ReleaseOrphan { id }),
            (0u32..64, 1u64..100, proptest::collection::vec(any::<u64>(), 1..4), any::<Option<u64>>())
                .prop_map(|(id, version, members, incarnation)| {
                    let mut members: Vec<u64> = members;
                    members.sort_unstable();
                    members.dedup();
                    let members = members
                        .into_iter()
                        .map(|t| flotilla_replica::Member {
                            target: TargetId(t),
                            state: flotilla_replica::MemberState::Serving,
                        })
                        .collect();
                    Op::ChainChanges {
                        replicas: Some(2),
                        chains: vec![ChainRow { id, version, members }],
                        targets: vec![ChainTargetRow {
                            target: TargetId(u64::from(id)),
                            group: format!("g{id}"),
                            incarnation,
                            dead: id % 3 == 0,
                            draining: id % 5 == 0,
                        }],
                    }
                }),
            "[a-z]{1,12}".prop_map(|owner| Op::OpenSessionFor { owner }),
        ]
    }

    proptest! {
        /// Every change round-trips through its bytes.
        #[test]
        fn a_change_round_trips(op in op(), uid in any::<u32>(), now_ns in any::<i64>()) {
            let change = NamespaceChange::new(Caller { uid, gid: uid, groups: vec![1, 2] }, now_ns, op);
            let bytes = change.encode().unwrap();
            prop_assert_eq!(NamespaceChange::decode(&bytes).unwrap(), change);
        }

        /// Any bytes at all decode to a checked change or an error, never a panic.
        #[test]
        fn any_bytes_decode_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = NamespaceChange::decode(&bytes);
            let _ = BatchReply::decode(&bytes);
        }
    }

    #[test]
    fn changes_over_their_bounds_are_refused() {
        let caller = Caller::root();
        let long = Op::Mkdir { at: Place::Path("/".repeat(PATH_BYTES_MAX + 1)), owner: owner_of(0o755) };
        assert!(matches!(
            NamespaceChange::new(caller.clone(), 0, long).encode(),
            Err(ChangeError::Bounds { .. })
        ));
        let many = Op::AckDeletes {
            target: TargetId(1),
            done: vec![(FileId(1), SubfileIndex(0)); PENDING_DELETES_BATCH_MAX + 1],
        };
        let change = NamespaceChange::new(caller.clone(), 0, many);
        let mut bytes = vec![CHANGE_VERSION];
        postcard::to_io(&change, &mut bytes).unwrap();
        assert!(matches!(NamespaceChange::decode(&bytes), Err(ChangeError::Bounds { .. })));
        let ok = NamespaceChange::new(caller, 0, Op::OpenSession).encode().unwrap();
        let mut other = ok.clone();
        other[0] = 2;
        assert_eq!(NamespaceChange::decode(&other), Err(ChangeError::Version { found: 2 }));
        assert!(matches!(
            NamespaceChange::decode(&vec![CHANGE_VERSION; CHANGE_BYTES_MAX + 1]),
            Err(ChangeError::TooLarge { .. })
        ));
    }

    #[test]
    fn an_open_hint_keeps_what_the_proposer_did_not_see() {
        let found = OpenHint::Found { id: 7, open: false };
        assert!(!found.is_open(7) && found.is_open(8));
        assert!(OpenHint::Found { id: 7, open: true }.is_open(7));
        assert!(OpenHint::Unknown.is_open(1) && !OpenHint::NoneOpen.is_open(1));
    }

    fn owner_of(mode: u32) -> NewOwner {
        NewOwner { mode, uid: 0, gid: 0 }
    }
}
