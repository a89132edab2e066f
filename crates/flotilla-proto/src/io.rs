//! Messages between clients and I/O servers.

use crate::wire_error::WireError;
use flotilla_request::Shape;
use flotilla_types::{FileId, Limits, SubfileIndex, TargetId};
use serde::{Deserialize, Serialize};

/// One fork of one subfile on one target.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ForkRef {
    pub target: TargetId,
    pub file: FileId,
    pub subfile: SubfileIndex,
    pub fork: String,
}

/// A fork's name and size, as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkInfo {
    pub name: String,
    pub size_bytes: u64,
}

/// A request to an I/O server. `Write` carries its data in the frame's data section,
/// packed in the order of the shape's pieces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoRequest {
    /// First message on a connection; the reply carries the server's limits and the credit.
    Hello {
        client: String,
    },
    Read {
        fork: ForkRef,
        shape: Shape,
    },
    Write {
        fork: ForkRef,
        shape: Shape,
    },
    CreateSubfile {
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    },
    RemoveSubfile {
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    },
    CreateFork {
        fork: ForkRef,
    },
    RemoveFork {
        fork: ForkRef,
    },
    ListForks {
        target: TargetId,
        file: FileId,
        subfile: SubfileIndex,
    },
    ForkSize {
        fork: ForkRef,
    },
    /// Preallocates the fork to at least `size_bytes` (Galley's `gfs_extend`).
    Extend {
        fork: ForkRef,
        size_bytes: u64,
    },
    Truncate {
        fork: ForkRef,
        size_bytes: u64,
    },
    /// Writes the fork's dirty blocks and syncs it to disk.
    Sync {
        fork: ForkRef,
    },
    /// `request` made under `capability` (issued by the metadata service): how a client
    /// credential reaches a file's data. Never nested. Its index stays 12
    /// (`WITH_VARIANT_INDEX`): later variants are appended after it.
    With {
        capability: crate::Capability,
        request: Box<IoRequest>,
    },
    /// ENWRICH: a job member's directory entries for this server's subfiles of `job.file`
    /// (docs/protocol.md "ENWRICH flush"). Replied `Done` once recorded.
    FlushDirectory {
        job: FlushJob,
        entries: Vec<FlushEntry>,
    },
    /// ENWRICH: a long-poll for the next ranges this server pulls from the member; replied
    /// `Pull`, or `Flushed` when the server's part of the flush is written and synced.
    FlushPull {
        job: FlushJob,
    },
    /// ENWRICH: the bytes of the ranges last pulled, packed in order in the data section;
    /// replied like `FlushPull` (the next ranges, or `Flushed`).
    FlushData {
        job: FlushJob,
        ranges: Vec<PullRange>,
    },
    /// Names the job this connection works for (from the client's environment, e.g.
    /// `SLURM_JOB_ID`); sent once after `Hello`, at most [`JOB_ID_BYTES_MAX`] bytes. The
    /// server counts the connection's bytes and operations under it. Any credential may send it.
    Job {
        id: String,
    },
    /// Asks for the server's counters and its busiest jobs (`flotilla jobs`, `flotilla top`).
    /// Any credential may send it.
    Stats,
    /// The tertiary tier (`flotilla hsm`) on one fork of a lines target of a server with an
    /// archive; replied `Hsm` with the fork's state after the action.
    Hsm {
        fork: ForkRef,
        action: HsmAction,
    },
    /// The tier counters of every target of the server (`flotilla hsm status`); replied
    /// `HsmStatus`. Any credential may send it.
    HsmStatus,
    /// Replication (issue 32): an entry of a chain's order from the member before this one
    /// (server credentials only; `docs/protocol.md` "Chain forwards"). Replied `Forwarded`,
    /// or `ForwardRefused` naming the chain, version and reason.
    Forward {
        forward: crate::chains::ChainForward,
    },
    /// Replication (issue 32): `request` on a subfile of a replicated file, under chain
    /// `chain` at `version` as the sender knows it (`SubfilePlace::chain`). A client sends it
    /// inside `With`: changes to the chain's head, reads to any serving member. The receiver
    /// fences it like a forward (`admit`: lease, membership, exactly this version, readable
    /// for reads, head for changes); a refusal is replied `ForwardRefused` naming the chain,
    /// the version and the reason, and the client refetches the chain and asks again.
    Chained {
        chain: u32,
        version: u64,
        request: Box<IoRequest>,
    },
    /// Scrub (issue 32): the stored per-block checksums of `length` bytes of a fork from
    /// `offset` (rounded out to checksum blocks, at most [`SCRUB_BLOCKS_MAX`] blocks), each
    /// block read from disk and verified against its entry. With `repair`, a member of a
    /// replicated subfile rewrites its bad blocks from another serving member; with
    /// `compare`, it also asks every other serving member for the same (each verifying its
    /// own) and repairs whichever member's blocks fail. Replied `BlockChecksums`. Sent inside
    /// `Chained` to a serving member for a replicated subfile (a read: any serving member).
    BlockChecksums {
        fork: ForkRef,
        offset: u64,
        length: u64,
        repair: bool,
        compare: bool,
    },
}

/// Most checksum blocks one `BlockChecksums` request covers.
pub const SCRUB_BLOCKS_MAX: u64 = 16_384;

/// One checksum block found bad (or repaired) on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubBlock {
    pub target: TargetId,
    /// Fork offset of the block.
    pub offset: u64,
}

/// A member's answer to `BlockChecksums`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// The member that answered.
    pub target: TargetId,
    /// Offset of the first block (a multiple of `block_bytes`).
    pub offset: u64,
    /// Bytes one entry covers on the answering member.
    pub block_bytes: u64,
    /// The fork's size on the answering member.
    pub size_bytes: u64,
    /// The stored entry of each block below the fork's end, after any repair.
    pub entries: Vec<u32>,
    /// Members whose checksums were compared (1: only the answering one).
    pub members: u32,
    /// Blocks whose data failed their entry, on any compared member.
    pub bad: Vec<ScrubBlock>,
    /// Blocks rewritten from a member whose block verified.
    pub repaired: Vec<ScrubBlock>,
    /// Offsets where members' entries differ although each verifies (replicas diverged), or
    /// members could not be compared (sizes or block sizes differ); not repaired.
    pub differing: Vec<u64>,
    /// Why a member could not be asked or a block could not be repaired.
    pub notes: Vec<String>,
}

/// What `flotilla hsm` asks of a fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HsmAction {
    /// Where its data is.
    State,
    /// Copy it whole to the archive now and mark its blocks clean.
    Archive,
    /// Drop its blocks from disk (refused unless the archive copy holds every byte).
    Release,
    /// Recall every block the disk lacks.
    Restore,
}

/// Where a fork's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Residency {
    /// On disk only (never archived).
    Resident,
    /// On disk, and the archive holds the same bytes.
    Archived,
    /// Some or all blocks only in the archive (a read recalls them).
    Released,
    /// Changed since its archive copy was made.
    Modified,
}

/// A fork's place in the storage hierarchy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HsmForkState {
    pub residency: Residency,
    pub size_bytes: u64,
    pub resident_bytes: u64,
    pub archived_bytes: u64,
    pub archived_at_s: u64,
    pub object_key: String,
}

/// The tier counters of one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetTierStatus {
    pub target: TargetId,
    pub archived_forks: u64,
    pub archived_bytes: u64,
    pub recalls: u64,
    pub recalled_bytes: u64,
    pub recall_failures: u64,
    pub released_forks: u64,
    pub superseded_copies: u64,
    pub read_throughs: u64,
    pub reclaimed_blocks: u64,
    pub dirty_blocks: u64,
    pub clean_blocks: u64,
    pub free_blocks: u64,
    pub block_bytes: u64,
}

/// Which collective flush a flush message belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlushJob {
    /// The job group's name.
    pub name: String,
    /// The job's flush generation (every member flushes generation `epoch` together).
    pub epoch: u64,
    /// The sender's member index, `0..members`.
    pub member: u32,
    /// The job's size (every member must send the same).
    pub members: u32,
    /// Members that left the job before this generation (they send nothing; every member
    /// must send the same list, ascending).
    pub absent: Vec<u32>,
    pub file: FileId,
    /// Whether the flush must end with the written forks synced (`sync`, `close`, a read);
    /// the server syncs if any member says so. A flush that is not durable leaves its bytes
    /// in the server's cache; the members detect a server restart before the next durable
    /// flush by its boot epoch and fail that flush.
    pub durable: bool,
}

/// One log-cache directory entry, mapped to one subfile's `data` fork: `length` bytes at
/// fork offset `offset`, written at hybrid-logical-clock time `timestamp`, held in the
/// member's data section at `cache_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlushEntry {
    pub target: TargetId,
    pub subfile: SubfileIndex,
    pub offset: u64,
    pub length: u64,
    pub timestamp: u64,
    pub cache_offset: u64,
}

/// Bytes of a member's data section the server asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PullRange {
    pub cache_offset: u64,
    pub length: u64,
}

/// Longest job id a server accepts (`IoRequest::Job`).
pub const JOB_ID_BYTES_MAX: usize = 128;

/// Whether `id` is a job id a server accepts: 1 to [`JOB_ID_BYTES_MAX`] bytes of ASCII
/// letters, digits and `._-:+@/` (what batch systems use; safe as a metric label value).
pub fn check_job_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > JOB_ID_BYTES_MAX {
        return Err(format!("job id of {} bytes; it must have 1 to {JOB_ID_BYTES_MAX}", id.len()));
    }
    match id.chars().find(|c| !(c.is_ascii_alphanumeric() || "._-:+@/".contains(*c))) {
        Some(bad) => {
            Err(format!("job id {id:?} holds {bad:?}; only ASCII letters, digits and ._-:+@/ are allowed"))
        }
        None => Ok(()),
    }
}

/// What one job (or a whole server) moved, counted by an I/O server since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    /// The job id (`other`: jobs not listed; empty: the server's total).
    pub job: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// Operations that move no data (create, sync, truncate, ...).
    pub other_ops: u64,
    /// Sum of the operations' times in the server (queue and execution), in nanoseconds.
    pub latency_ns: u64,
}

/// An I/O server's answer to `IoRequest::Stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    pub server: String,
    pub uptime_ms: u64,
    /// Everything the server did, all jobs and connections without a job together.
    pub total: JobStats,
    /// The busiest jobs, then `other` (bounded by the server's `jobs_listed_max`).
    pub jobs: Vec<JobStats>,
}

impl ScrubReport {
    /// An empty report of `target` for blocks of `block_bytes` from `offset`.
    pub fn new(target: TargetId, offset: u64, block_bytes: u64, size_bytes: u64) -> ScrubReport {
        ScrubReport {
            target,
            offset,
            block_bytes,
            size_bytes,
            entries: Vec::new(),
            members: 1,
            bad: Vec::new(),
            repaired: Vec::new(),
            differing: Vec::new(),
            notes: Vec::new(),
        }
    }
}

impl IoRequest {
    /// The postcard variant index of `With` (see `capability::WithRef`).
    pub const WITH_VARIANT_INDEX: u32 = 12;

    /// The target a data request acts on (`None` for the others: greeting, envelopes,
    /// flushes, statistics, forwards).
    pub fn target(&self) -> Option<TargetId> {
        match self {
            IoRequest::Read { fork, .. }
            | IoRequest::Write { fork, .. }
            | IoRequest::CreateFork { fork }
            | IoRequest::RemoveFork { fork }
            | IoRequest::ForkSize { fork }
            | IoRequest::Extend { fork, .. }
            | IoRequest::Truncate { fork, .. }
            | IoRequest::Sync { fork }
            | IoRequest::Hsm { fork, .. }
            | IoRequest::BlockChecksums { fork, .. } => Some(fork.target),
            IoRequest::CreateSubfile { target, .. }
            | IoRequest::RemoveSubfile { target, .. }
            | IoRequest::ListForks { target, .. } => Some(*target),
            _ => None,
        }
    }

    /// Data bytes the request moves, for flow control (0 for metadata operations).
    pub fn data_bytes(&self) -> Result<u64, flotilla_request::ShapeError> {
        match self {
            IoRequest::Read { shape, .. } | IoRequest::Write { shape, .. } => {
                let (_, bytes) = shape.piece_and_byte_count()?;
                Ok(u64::try_from(bytes).unwrap_or(u64::MAX))
            }
            IoRequest::With { request, .. } => request.data_bytes(),
            IoRequest::FlushData { ranges, .. } => {
                Ok(ranges.iter().fold(0u64, |sum, range| sum.saturating_add(range.length)))
            }
            IoRequest::Forward { forward } => Ok(forward.data_bytes()),
            IoRequest::Chained { request, .. } => request.data_bytes(),
            _ => Ok(0),
        }
    }
}

/// A reply from an I/O server. `Data` carries the bytes read in the frame's data section,
/// packed in the order of the request's pieces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoReply {
    /// `boot_epoch` changes on every start of the server process (random, never 0): every
    /// reply on a connection comes from the epoch its `Welcome` named, so a client that meets
    /// a new epoch knows the server restarted and lost whatever it had not yet synced.
    Welcome {
        server: String,
        limits: Limits,
        boot_epoch: u64,
    },
    Data,
    Done {
        bytes: u64,
    },
    Forks(Vec<ForkInfo>),
    Size {
        bytes: u64,
    },
    Error(WireError),
    /// ENWRICH: the ranges of the member's data section the server wants next.
    Pull {
        ranges: Vec<PullRange>,
    },
    /// ENWRICH: this server wrote and synced its whole part of the flush.
    Flushed {
        bytes: u64,
    },
    Stats(ServerStats),
    Hsm(HsmForkState),
    /// One entry per target with a tier (none: the server has no archive).
    HsmStatus(Vec<TargetTierStatus>),
    /// A forward was applied (or was a duplicate): the receiver's position and cumulative
    /// acknowledgement.
    Forwarded(crate::chains::ForwardAck),
    /// A forward was refused by the fencing check or the order.
    ForwardRefused(crate::chains::ForwardRefused),
    /// Scrub: the answer to `BlockChecksums` (boxed: it is much larger than the others;
    /// the wire form is the report's).
    BlockChecksums(Box<ScrubReport>),
}

#[cfg(test)]
mod job_id_tests {
    use super::*;

    /// Scrub: `BlockChecksums` is I/O request 22 and I/O reply 13; `ChecksumMismatch` is
    /// error code 20 (docs/protocol.md).
    #[test]
    fn scrub_indexes_are_the_documented_ones() {
        use crate::encode_body;
        let fork =
            ForkRef { target: TargetId(1), file: FileId(2), subfile: SubfileIndex(0), fork: "data".into() };
        let request =
            IoRequest::BlockChecksums { fork, offset: 0, length: 4096, repair: true, compare: false };
        assert_eq!(encode_body(&request).unwrap()[0], 22);
        assert_eq!(
            encode_body(&IoReply::BlockChecksums(Box::new(ScrubReport::new(TargetId(1), 0, 4096, 0))))
                .unwrap()[0],
            13
        );
        assert_eq!(encode_body(&crate::ErrorCode::ChecksumMismatch).unwrap()[0], 20);
        assert_eq!(crate::ErrorCode::ChecksumMismatch.errno(), 5);
    }

    #[test]
    fn job_ids_are_bounded_and_label_safe() {
        assert!(check_job_id("12345_7").is_ok());
        assert!(check_job_id("").is_err());
        assert!(check_job_id(&"1".repeat(JOB_ID_BYTES_MAX + 1)).is_err());
        let quote = check_job_id("a\"b").unwrap_err();
        assert!(quote.contains("'\"'"), "{quote}");
        assert!(check_job_id("a\nb").is_err());
    }
}
