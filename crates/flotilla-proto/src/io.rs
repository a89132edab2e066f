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

impl IoRequest {
    /// The postcard variant index of `With` (see `capability::WithRef`).
    pub const WITH_VARIANT_INDEX: u32 = 12;

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
}
