//! Fuzzing on the stable toolchain, as an ordinary test: every decoder a peer can reach
//! (frame, `IoRequest`, `IoReply`, `MetaRequest`, `MetaReply`, `Shape`) is fed
//! - raw bytes, mostly short, now and then up to the largest frame;
//! - arbitrary well-formed messages (proptest strategies below), which must round-trip
//!   exactly through encode and decode;
//! - those messages' encodings with a few bytes changed, inserted or cut, which must decode
//!   to an error or to a message that round-trips itself.
//!
//! No input may panic. Each test runs for `FLOTILLA_FUZZ_SECONDS` (default 6) or
//! `FLOTILLA_FUZZ_CASES` inputs, whichever ends first; the seed is printed and
//! `FLOTILLA_FUZZ_SEED=<hex>` replays a run.

use flotilla_proto::{
    decode_body, decode_frame, encode_body, Capability, ChainForward, CreateSpec, DeleteOrder, DirEntryInfo,
    EntryInfo, ErrorCode, ForkInfo, ForkRef, ForwardAck, ForwardEntry, ForwardRefusalReason, ForwardRefused,
    FrameHeader, HeldLock, IoReply, IoRequest, LockKind, MetaReply, MetaRequest, Rights, SubfilePlace,
    TargetReport, TargetState, TargetStatus, WireError, HEADER_BYTES,
};
use flotilla_request::{BatchNode, BatchSub, Piece, Shape, ShapeLimits, StrideLevel};
use flotilla_types::{Attributes, Caller, FileId, FileKind, Layout, Limits, SetAttr, SubfileIndex, TargetId};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// The largest frame a default peer accepts.
const FRAME_BYTES_MAX: u32 = 65 << 20;
/// Inputs of the largest size per run (each is tens of MiB).
const HUGE_INPUTS_MAX: u32 = 4;

struct Budget {
    deadline: Instant,
    cases_max: u64,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn budget() -> Budget {
    Budget {
        deadline: Instant::now() + Duration::from_secs(env_u64("FLOTILLA_FUZZ_SECONDS", 6)),
        cases_max: env_u64("FLOTILLA_FUZZ_CASES", u64::MAX),
    }
}

/// A runner with a printed seed (from `FLOTILLA_FUZZ_SEED` or the clock).
fn runner(test: &str) -> TestRunner {
    let seed = std::env::var("FLOTILLA_FUZZ_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(&s, 16).ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
    println!("{test}: FLOTILLA_FUZZ_SEED={seed:x}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// Runs `check` on values of `strategy` until the budget ends; returns the count.
fn drive<T: Debug>(
    test: &str,
    strategy: impl Strategy<Value = T>,
    mut check: impl FnMut(&T, &mut TestRng),
) -> u64 {
    let mut runner = runner(test);
    let budget = budget();
    let mut cases = 0u64;
    while cases < budget.cases_max && Instant::now() < budget.deadline {
        let value = strategy.new_tree(&mut runner).expect("generate a value").current();
        check(&value, runner.rng());
        cases += 1;
    }
    println!("{test}: {cases} inputs, no panic");
    assert!(cases > 0, "{test}: no input was tried");
    cases
}

/// Raw input: mostly short, sometimes up to 64 KiB, rarely up to the largest frame.
fn raw_bytes(rng: &mut TestRng, huge_left: &mut u32) -> Vec<u8> {
    let roll = rng.next_u32() % 1000;
    let length = if roll == 0 && *huge_left > 0 {
        *huge_left -= 1;
        (rng.next_u32() % FRAME_BYTES_MAX) as usize
    } else if roll < 50 {
        (rng.next_u32() % (64 << 10)) as usize
    } else {
        (rng.next_u32() % 512) as usize
    };
    let mut bytes = vec![0u8; length];
    rng.fill_bytes(&mut bytes);
    bytes
}

fn decode_everything(bytes: &[u8]) {
    let _ = decode_frame(bytes, FRAME_BYTES_MAX);
    let _ = decode_body::<IoRequest>(bytes, "I/O request").map(|r| validate_request(&r));
    let _ = decode_body::<IoReply>(bytes, "I/O reply");
    let _ = decode_body::<MetaRequest>(bytes, "metadata request");
    let _ = decode_body::<MetaReply>(bytes, "metadata reply");
    let _ = decode_body::<Shape>(bytes, "shape").map(|s| validate_shape(&s));
}

/// What a server does with a decoded shape must not panic either.
fn validate_shape(shape: &Shape) {
    let _ = shape.validate(&ShapeLimits { pieces_max: 1 << 12, bytes_max: 1 << 20 });
}

fn validate_request(request: &IoRequest) {
    if let IoRequest::Read { shape, .. } | IoRequest::Write { shape, .. } = request {
        validate_shape(shape);
    }
    let _ = request.data_bytes();
}

/// Encodes, decodes and compares; then decodes mutated encodings.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T, rng: &mut TestRng) {
    let bytes = encode_body(value).expect("encode");
    let back: T =
        decode_body(&bytes, "round trip").unwrap_or_else(|e| panic!("{value:?} does not decode: {e}"));
    assert_eq!(&back, value, "round trip changed the message");
    for _ in 0..4 {
        let mutated = mutate(&bytes, rng);
        decode_everything(&mutated);
        if let Ok(decoded) = decode_body::<T>(&mutated, "mutated") {
            let again = encode_body(&decoded).expect("re-encode a decoded message");
            let twice: T = decode_body(&again, "re-decoded").expect("a re-encoded message decodes");
            assert_eq!(twice, decoded, "a decoded message does not round-trip");
        }
    }
}

/// A few byte changes: overwrite, insert, delete, cut.
fn mutate(bytes: &[u8], rng: &mut TestRng) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..1 + rng.next_u32() % 3 {
        let at = if out.is_empty() { 0 } else { rng.next_u32() as usize % out.len() };
        match rng.next_u32() % 4 {
            0 if !out.is_empty() => out[at] = rng.next_u32() as u8,
            1 => out.insert(at, rng.next_u32() as u8),
            2 if !out.is_empty() => {
                out.remove(at);
            }
            _ => out.truncate(at),
        }
    }
    out
}

// ---- Strategies for every message type -------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,24}", "/[a-z]{1,8}(/[a-z0-9._-]{1,8}){0,3}"]
}

fn target_id() -> impl Strategy<Value = TargetId> + Clone {
    any::<u64>().prop_map(TargetId)
}

fn fork_ref() -> impl Strategy<Value = ForkRef> {
    (target_id(), any::<u64>(), any::<u32>(), text()).prop_map(|(target, file, subfile, fork)| ForkRef {
        target,
        file: FileId(file),
        subfile: SubfileIndex(subfile),
        fork,
    })
}

fn batch_node(depth: u32) -> BoxedStrategy<BatchNode> {
    let leaf = any::<u64>().prop_map(BatchSub::Size).boxed();
    let sub = if depth == 0 {
        leaf
    } else {
        prop_oneof![3 => leaf, 1 => prop::collection::vec(batch_node(depth - 1), 0..4).prop_map(BatchSub::Vector)]
            .boxed()
    };
    (any::<(i64, i64, bool, bool, u64, i64, i64)>(), sub)
        .prop_map(|((file_offset, memory_offset, fa, ma, count, file_stride, memory_stride), sub)| {
            BatchNode {
                file_offset,
                memory_offset,
                file_absolute: fa,
                memory_absolute: ma,
                count,
                file_stride,
                memory_stride,
                sub,
            }
        })
        .boxed()
}

fn shape() -> impl Strategy<Value = Shape> {
    let level = any::<(i64, i64, u64)>().prop_map(|(file_stride, memory_stride, count)| StrideLevel {
        file_stride,
        memory_stride,
        count,
    });
    let piece = any::<(u64, u64, u64)>().prop_map(|(file_offset, memory_offset, length)| Piece {
        file_offset,
        memory_offset,
        length,
    });
    prop_oneof![
        any::<(u64, u64, u64)>().prop_map(|(file_offset, memory_offset, length)| Shape::Contiguous {
            file_offset,
            memory_offset,
            length
        }),
        any::<(u64, u64, u64, i64, i64, u64)>().prop_map(|(fo, mo, record_bytes, fs, ms, count)| {
            Shape::Strided {
                file_offset: fo,
                memory_offset: mo,
                record_bytes,
                file_stride: fs,
                memory_stride: ms,
                count,
            }
        }),
        (any::<(u64, u64, u64)>(), prop::collection::vec(level, 0..6)).prop_map(|((fo, mo, rb), levels)| {
            Shape::Nested { file_offset: fo, memory_offset: mo, record_bytes: rb, levels }
        }),
        prop::collection::vec(batch_node(5), 0..4).prop_map(|nodes| Shape::Batched { nodes }),
        prop::collection::vec(piece, 0..8).prop_map(|pieces| Shape::List { pieces }),
    ]
}

fn capability() -> impl Strategy<Value = Capability> {
    (any::<u64>(), any::<u32>(), any::<u8>(), text(), any::<u64>(), any::<u64>(), any::<[u8; 32]>()).prop_map(
        |(file, subfiles, rights, holder, issued_unix_ms, expires_unix_ms, tag)| Capability {
            file: FileId(file),
            subfiles,
            rights: Rights(rights),
            holder,
            issued_unix_ms,
            expires_unix_ms,
            tag,
        },
    )
}

fn io_request() -> impl Strategy<Value = IoRequest> {
    plain_io_request().prop_flat_map(|request| {
        let plain = request.clone();
        prop_oneof![
            3 => Just(plain),
            1 => capability().prop_map(move |capability| IoRequest::With {
                capability,
                request: Box::new(request.clone())
            }),
        ]
    })
}

fn plain_io_request() -> impl Strategy<Value = IoRequest> {
    let ids = (target_id(), any::<u64>(), any::<u32>());
    prop_oneof![
        text().prop_map(|client| IoRequest::Hello { client }),
        (fork_ref(), shape()).prop_map(|(fork, shape)| IoRequest::Read { fork, shape }),
        (fork_ref(), shape()).prop_map(|(fork, shape)| IoRequest::Write { fork, shape }),
        ids.clone().prop_map(|(target, f, s)| IoRequest::CreateSubfile {
            target,
            file: FileId(f),
            subfile: SubfileIndex(s)
        }),
        ids.clone().prop_map(|(target, f, s)| IoRequest::RemoveSubfile {
            target,
            file: FileId(f),
            subfile: SubfileIndex(s)
        }),
        fork_ref().prop_map(|fork| IoRequest::CreateFork { fork }),
        fork_ref().prop_map(|fork| IoRequest::RemoveFork { fork }),
        ids.prop_map(|(target, f, s)| IoRequest::ListForks {
            target,
            file: FileId(f),
            subfile: SubfileIndex(s)
        }),
        fork_ref().prop_map(|fork| IoRequest::ForkSize { fork }),
        (fork_ref(), any::<u64>()).prop_map(|(fork, size_bytes)| IoRequest::Extend { fork, size_bytes }),
        (fork_ref(), any::<u64>()).prop_map(|(fork, size_bytes)| IoRequest::Truncate { fork, size_bytes }),
        fork_ref().prop_map(|fork| IoRequest::Sync { fork }),
        (any::<(u32, u64, u64)>(), fork_ref(), any::<Option<(u64, u64)>>(), any::<bool>()).prop_map(
            |((chain, version, position), fork, write, request)| {
                let entry = match (write, request) {
                    (Some((offset, size_bytes)), true) => ForwardEntry::Request {
                        request: Box::new(IoRequest::Truncate { fork, size_bytes: offset ^ size_bytes }),
                    },
                    (Some((offset, length_bytes)), false) => {
                        ForwardEntry::Write { fork, offset, length_bytes }
                    }
                    (None, _) => ForwardEntry::Sync { fork },
                };
                IoRequest::Forward { forward: ChainForward { chain, version, position, entry } }
            }
        ),
    ]
}

fn forward_reply() -> impl Strategy<Value = IoReply> {
    let reason = prop_oneof![
        Just(ForwardRefusalReason::NoLease),
        Just(ForwardRefusalReason::NotMember),
        any::<u64>().prop_map(|current| ForwardRefusalReason::Stale { current }),
        any::<u64>().prop_map(|expected| ForwardRefusalReason::Gap { expected }),
        any::<Option<u64>>().prop_map(|head| ForwardRefusalReason::NotHead { head: head.map(TargetId) }),
        Just(ForwardRefusalReason::NotReadable),
    ];
    prop_oneof![
        any::<(u32, u64, u64, u64)>().prop_map(|(chain, version, applied, acknowledged)| {
            IoReply::Forwarded(ForwardAck { chain, version, applied, acknowledged })
        }),
        (any::<(u32, u64)>(), reason).prop_map(|((chain, version), reason)| {
            IoReply::ForwardRefused(ForwardRefused { chain, version, reason })
        }),
    ]
}

fn wire_error() -> impl Strategy<Value = WireError> {
    let codes = [
        ErrorCode::BadRequest,
        ErrorCode::OverLimit,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::NotADirectory,
        ErrorCode::IsADirectory,
        ErrorCode::NotEmpty,
        ErrorCode::InvalidArgument,
        ErrorCode::NoSpace,
        ErrorCode::Unavailable,
        ErrorCode::Io,
        ErrorCode::Protocol,
        ErrorCode::PermissionDenied,
        ErrorCode::NameTooLong,
        ErrorCode::CrossDevice,
        ErrorCode::CapabilityExpired,
        ErrorCode::Recovering,
        ErrorCode::LockLost,
    ];
    (prop::sample::select(codes.to_vec()), text()).prop_map(|(code, message)| WireError::new(code, message))
}

fn limits() -> impl Strategy<Value = Limits> {
    any::<(u32, u64, u64, u64)>().prop_map(|(f, r, p, i)| Limits {
        frame_bytes_max: f,
        request_bytes_max: r,
        pieces_per_request_max: p,
        in_flight_bytes_max: i,
    })
}

fn io_reply() -> impl Strategy<Value = IoReply> {
    let fork_info = (text(), any::<u64>()).prop_map(|(name, size_bytes)| ForkInfo { name, size_bytes });
    prop_oneof![
        (text(), limits(), any::<u64>()).prop_map(|(server, limits, boot_epoch)| IoReply::Welcome {
            server,
            limits,
            boot_epoch
        }),
        Just(IoReply::Data),
        any::<u64>().prop_map(|bytes| IoReply::Done { bytes }),
        prop::collection::vec(fork_info, 0..5).prop_map(IoReply::Forks),
        any::<u64>().prop_map(|bytes| IoReply::Size { bytes }),
        wire_error().prop_map(IoReply::Error),
        forward_reply(),
    ]
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        Just(Layout::Explicit),
        any::<(u64, u32)>().prop_map(|(unit_bytes, count)| Layout::Stripe { unit_bytes, count }),
        any::<(u64, u32, u32)>().prop_map(|(block_bytes, sequentiality, count)| Layout::Hash {
            block_bytes,
            sequentiality,
            count
        }),
    ]
}

fn kind() -> impl Strategy<Value = FileKind> {
    prop::sample::select(vec![
        FileKind::Directory,
        FileKind::File,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ])
}

fn attributes() -> impl Strategy<Value = Attributes> {
    (kind(), any::<(u32, u32, u32, u64, u32)>(), any::<(i64, i64, i64)>()).prop_map(
        |(kind, (mode, uid, gid, size_bytes, nlink), (atime_ns, mtime_ns, ctime_ns))| Attributes {
            kind,
            mode,
            uid,
            gid,
            size_bytes,
            nlink,
            atime_ns,
            mtime_ns,
            ctime_ns,
            rdev: 0,
        },
    )
}

fn set_attr() -> impl Strategy<Value = SetAttr> {
    any::<(Option<u32>, Option<u32>, Option<u32>, Option<u64>, Option<i64>, Option<i64>)>().prop_map(
        |(mode, uid, gid, size_bytes, atime_ns, mtime_ns)| SetAttr {
            mode,
            uid,
            gid,
            size_bytes,
            atime_ns,
            mtime_ns,
        },
    )
}

fn target_report() -> impl Strategy<Value = TargetReport> {
    (target_id(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
        |(target, used_bytes, free_bytes, lost)| TargetReport { target, used_bytes, free_bytes, lost },
    )
}

fn delete_order() -> impl Strategy<Value = DeleteOrder> {
    (target_id(), any::<u64>(), any::<u32>()).prop_map(|(target, f, s)| DeleteOrder {
        target,
        file: FileId(f),
        subfile: SubfileIndex(s),
    })
}

fn create_spec() -> impl Strategy<Value = CreateSpec> {
    (
        any::<(u32, u32, u32, u32, bool)>(),
        prop::option::of(prop::collection::vec(target_id(), 0..4)),
        prop::option::of(layout()),
    )
        .prop_map(|((mode, uid, gid, subfiles, exclusive), targets, layout)| CreateSpec {
            mode,
            uid,
            gid,
            subfiles,
            targets,
            layout,
            exclusive,
        })
}

fn meta_request() -> impl Strategy<Value = MetaRequest> {
    let id = any::<u64>();
    prop_oneof![
        text().prop_map(|path| MetaRequest::Lookup { path }),
        (text(), any::<(u32, u32, u32)>()).prop_map(|(path, (mode, uid, gid))| MetaRequest::Mkdir {
            path,
            mode,
            uid,
            gid
        }),
        (text(), create_spec()).prop_map(|(path, spec)| MetaRequest::Create { path, spec }),
        (text(), create_spec(), any::<u64>()).prop_map(|(path, spec, session)| MetaRequest::CreateOpen {
            path,
            spec,
            session
        }),
        text().prop_map(|path| MetaRequest::Readdir { path }),
        text().prop_map(|path| MetaRequest::Unlink { path }),
        text().prop_map(|path| MetaRequest::Rmdir { path }),
        (text(), text()).prop_map(|(from, to)| MetaRequest::Rename { from, to }),
        (id, set_attr()).prop_map(|(id, change)| MetaRequest::SetAttr { id, change }),
        (text(), text(), any::<(u32, u32)>()).prop_map(|(path, target, (uid, gid))| MetaRequest::Symlink {
            path,
            target,
            uid,
            gid
        }),
        (text(), text()).prop_map(|(existing, new)| MetaRequest::Link { existing, new }),
        Just(MetaRequest::Status),
        (text(), prop::collection::vec(target_report(), 0..4))
            .prop_map(|(server, targets)| MetaRequest::Register { server, targets }),
        (text(), prop::collection::vec(target_report(), 0..4), prop::collection::vec(delete_order(), 0..4))
            .prop_map(|(server, targets, deleted)| MetaRequest::Heartbeat { server, targets, deleted }),
        (text(), prop::collection::vec(target_report(), 0..4), member_info())
            .prop_map(|(server, targets, member)| MetaRequest::RegisterMember { server, targets, member }),
        (text(), prop::collection::vec(delete_order(), 0..4), member_info()).prop_map(
            |(server, deleted, member)| {
                MetaRequest::HeartbeatMember { server, targets: Vec::new(), deleted, member }
            }
        ),
        any::<bool>().prop_map(|chains| MetaRequest::ChainStatus { chains }),
        (text(), create_spec(), any::<u32>())
            .prop_map(|(path, spec, replicas)| MetaRequest::CreateReplicated { path, spec, replicas }),
        id.prop_map(|id| MetaRequest::GetById { id }),
        any::<(u64, u64, i64)>().prop_map(|(id, size_bytes, mtime_ns)| MetaRequest::GrowSize {
            id,
            size_bytes,
            mtime_ns
        }),
        (text(), prop::option::of(layout()), any::<u32>())
            .prop_map(|(path, layout, replicas)| MetaRequest::SetLayout { path, layout, replicas }),
        (text(), id).prop_map(|(path, id)| MetaRequest::UnlinkId { path, id }),
        (text(), text()).prop_map(|(from, to)| MetaRequest::RenameNoReplace { from, to }),
        any::<(u64, u64)>().prop_map(|(session, id)| MetaRequest::Opened { session, id }),
        (text(), any::<u64>()).prop_map(|(path, session)| MetaRequest::OpenPath { path, session }),
        (any::<u64>(), prop::collection::vec(any::<(u64, u64, u64, u64, u32)>(), 0..4)).prop_map(
            |(session, locks)| MetaRequest::ReclaimLocks {
                session,
                locks: locks
                    .into_iter()
                    .map(|(id, owner, start, end, pid)| HeldLock {
                        id,
                        owner,
                        kind: LockKind::Write,
                        start,
                        end,
                        pid
                    })
                    .collect()
            }
        ),
        any::<(u64, u64)>().prop_map(|(session, id)| MetaRequest::Closed { session, id }),
        (any::<u64>(), prop::collection::vec(id, 0..8))
            .prop_map(|(session, files)| MetaRequest::KeepOpen { session, files }),
        (any::<(u32, u32)>(), prop::collection::vec(any::<u32>(), 0..4), text()).prop_map(
            |((uid, gid), groups, path)| MetaRequest::As {
                caller: Caller { uid, gid, groups },
                request: Box::new(MetaRequest::Lookup { path }),
            }
        ),
        Just(MetaRequest::OpenGroupSession),
        (any::<(u64, u64, u64)>(), text()).prop_map(|((session, sequence, acknowledged_through), path)| {
            MetaRequest::Sequenced {
                session,
                sequence,
                acknowledged_through,
                request: Box::new(MetaRequest::Unlink { path }),
            }
        }),
        (any::<(u64, u64)>(), prop::collection::vec(any::<u8>(), 0..8)).prop_map(
            |((session, parent), name)| {
                MetaRequest::InodeCached { session, ask: flotilla_proto::InodeAsk::Lookup { parent, name } }
            }
        ),
        any::<(u64, u64)>().prop_map(|(session, id)| MetaRequest::InodeCached {
            session,
            ask: flotilla_proto::InodeAsk::Attr { id }
        }),
        (any::<(u64, u64)>(), prop::collection::vec(any::<u8>(), 0..8)).prop_map(
            |((session, parent), name)| {
                MetaRequest::ChangedBy {
                    request: Box::new(MetaRequest::UnlinkAt { parent, name, id: None }),
                    session,
                }
            }
        ),
    ]
}

fn meta_reply() -> impl Strategy<Value = MetaReply> {
    let place = (target_id(), text(), any::<bool>()).prop_map(|(target, server, up)| SubfilePlace {
        target,
        server,
        up,
        chain: None,
    });
    let entry = (
        any::<u64>(),
        attributes(),
        prop::option::of(layout()),
        prop::collection::vec(place, 0..4),
        prop::option::of(text()),
        prop::option::of(capability()),
    )
        .prop_map(|(id, attrs, layout, subfiles, symlink, capability)| EntryInfo {
            id,
            attrs,
            layout,
            subfiles,
            symlink,
            capability,
            no_overlap: id % 2 == 0,
            replicas: (id % 7) as u32 + 1,
        });
    let dir_entry =
        (text(), any::<u64>(), kind()).prop_map(|(name, id, kind)| DirEntryInfo { name, id, kind });
    let status = (target_id(), text(), any::<bool>(), any::<(u64, u64)>(), text()).prop_map(
        |(target, server, up, (used_bytes, free_bytes), credential)| TargetStatus {
            target,
            server,
            state: if up { TargetState::Up } else { TargetState::Down },
            used_bytes,
            free_bytes,
            credential,
        },
    );
    prop_oneof![
        entry.prop_map(MetaReply::Entry),
        prop::collection::vec(dir_entry, 0..5).prop_map(MetaReply::Entries),
        attributes().prop_map(MetaReply::Attributes),
        Just(MetaReply::Done),
        prop::collection::vec(status, 0..4).prop_map(MetaReply::Status),
        any::<u64>().prop_map(|heartbeat_ms| MetaReply::Registered { heartbeat_ms }),
        prop::collection::vec(delete_order(), 0..4).prop_map(|delete| MetaReply::HeartbeatAck { delete }),
        wire_error().prop_map(MetaReply::Error),
        (prop::collection::vec(delete_order(), 0..4), chain_view())
            .prop_map(|(delete, view)| MetaReply::HeartbeatChains { delete, view }),
        chain_report().prop_map(MetaReply::Chains),
        any::<u64>().prop_map(|session| MetaReply::GroupSession { session }),
    ]
}

fn member_info() -> impl Strategy<Value = flotilla_proto::MemberInfo> {
    (text(), any::<u64>())
        .prop_map(|(failure_group, incarnation)| flotilla_proto::MemberInfo { failure_group, incarnation })
}

fn chain_info() -> impl Strategy<Value = flotilla_proto::ChainInfo> {
    use flotilla_proto::{ChainMember, ChainMemberState};
    let state = prop_oneof![
        Just(ChainMemberState::Serving),
        any::<(u64, bool)>()
            .prop_map(|(missed_since, full)| ChainMemberState::Syncing { missed_since, full }),
        any::<(u64, bool)>()
            .prop_map(|(missed_since, full)| ChainMemberState::Offline { missed_since, full }),
        Just(ChainMemberState::Dead),
    ];
    let member = (target_id(), state).prop_map(|(target, state)| ChainMember { target, state });
    (any::<u32>(), any::<u64>(), prop::collection::vec(member, 0..4))
        .prop_map(|(chain, version, members)| flotilla_proto::ChainInfo { chain, version, members })
}

fn chain_view() -> impl Strategy<Value = flotilla_proto::ChainView> {
    (any::<u64>(), prop::collection::vec(chain_info(), 0..3))
        .prop_map(|(lease_ms, chains)| flotilla_proto::ChainView { lease_ms, chains })
}

fn chain_report() -> impl Strategy<Value = flotilla_proto::ChainReport> {
    use flotilla_proto::{MemberHealth, TargetChains};
    let health = prop_oneof![
        Just(MemberHealth::Up),
        Just(MemberHealth::Down),
        Just(MemberHealth::Dead),
        Just(MemberHealth::Draining),
        Just(MemberHealth::Unplaced),
    ];
    let target = (target_id(), text(), health, any::<(u64, u32, u32)>()).prop_map(
        |(target, failure_group, health, (incarnation, chains, degraded))| TargetChains {
            target,
            failure_group,
            health,
            incarnation,
            chains,
            degraded,
        },
    );
    (
        any::<(u32, u32, u32, u32, u32)>(),
        prop::collection::vec(target, 0..3),
        prop::collection::vec(chain_info(), 0..3),
    )
        .prop_map(
            |(
                (replicas, failure_groups, chains_total, chains_degraded, chains_unavailable),
                targets,
                chains,
            )| {
                flotilla_proto::ChainReport {
                    replicas,
                    failure_groups,
                    chains_total,
                    chains_degraded,
                    chains_unavailable,
                    targets,
                    chains,
                    chains_rebuilding: chains_degraded,
                    rebuild_bytes_left: u64::from(chains_unavailable) << 20,
                }
            },
        )
}

// ---- The passes ---------------------------------------------------------------------------

#[test]
fn raw_bytes_up_to_the_largest_frame_never_panic() {
    let mut huge_left = HUGE_INPUTS_MAX;
    drive("raw", Just(()), |_, rng| decode_everything(&raw_bytes(rng, &mut huge_left)));
}

#[test]
fn frames_with_valid_headers_and_random_payloads_never_panic() {
    let mut huge_left = HUGE_INPUTS_MAX;
    drive("framed", Just(()), |_, rng| {
        let body = raw_bytes(rng, &mut huge_left);
        let mut frame =
            FrameHeader::for_payload(rng.next_u64(), &body, b"").expect("header").encode().to_vec();
        frame.extend_from_slice(&body);
        let (decoded, used) = decode_frame(&frame, FRAME_BYTES_MAX).expect("a valid frame decodes");
        assert_eq!((used, &decoded.body[..]), (HEADER_BYTES + body.len(), &body[..]));
        decode_everything(&decoded.body);
        // Cut anywhere, it must ask for more or fail, never panic or read past the end.
        let cut = rng.next_u32() as usize % frame.len();
        let _ = decode_frame(&frame[..cut], FRAME_BYTES_MAX);
    });
}

#[test]
fn io_requests_round_trip() {
    drive("io_request", io_request(), |request, rng| {
        validate_request(request);
        round_trip(request, rng);
    });
}

#[test]
fn io_replies_round_trip() {
    drive("io_reply", io_reply(), round_trip);
}

#[test]
fn meta_requests_round_trip() {
    drive("meta_request", meta_request(), round_trip);
}

#[test]
fn meta_replies_round_trip() {
    drive("meta_reply", meta_reply(), round_trip);
}

#[test]
fn shapes_round_trip() {
    drive("shape", shape(), |shape, rng| {
        validate_shape(shape);
        round_trip(shape, rng);
    });
}
