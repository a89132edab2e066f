//! The inode record: the value of the `inodes_by_seq` and (legacy) `inodes` tables, format
//! version 1 (see `FORMAT.md`).
//!
//! Invariants kept on encode and checked on decode: the kind byte agrees with the body, a
//! file has `1..=SUBFILE_COUNT_MAX` subfiles on distinct targets, a stripe unit is nonzero,
//! a symlink target is UTF-8 of at most `PATH_BYTES_MAX` bytes, and the CRC32C matches.

use crate::codec::{Reader, Writer};
use crate::entry::{Entry, FileRecord};
use crate::error::NamespaceError;
use flotilla_types::{Attributes, FileId, FileKind, Layout, TargetId, PATH_BYTES_MAX, REPLICAS_MAX};

/// Format version of inode records written by this build.
pub(crate) const INODE_FORMAT_VERSION: u8 = 1;
/// Most subfiles one file may have.
pub const SUBFILE_COUNT_MAX: u32 = 65_536;

const KIND_DIRECTORY: u8 = 1;
const KIND_FILE: u8 = 2;
const KIND_SYMLINK: u8 = 3;
const KIND_FIFO: u8 = 4;
const KIND_SOCKET: u8 = 5;
const KIND_CHAR_DEVICE: u8 = 6;
const KIND_BLOCK_DEVICE: u8 = 7;
const LAYOUT_EXPLICIT: u8 = 0;
const LAYOUT_STRIPE: u8 = 1;
const LAYOUT_HASH: u8 = 2;
/// Set in a file layout's tag when a replica count byte follows the layout (replicas > 1);
/// a layout of one copy is written exactly as before replicas existed.
const LAYOUT_REPLICATED: u8 = 0x80;

/// What an inode holds beyond its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    Directory {
        default_layout: Option<Layout>,
        /// Copies of every byte files created here take when they ask for no count (issue
        /// 32); 1 without a default layout.
        default_replicas: u8,
    },
    File {
        layout: Layout,
        targets: Vec<TargetId>,
        /// Copies of every subfile, 1..=`REPLICAS_MAX` (1: the record has no replica byte).
        replicas: u8,
        /// Replicated files: the chain of each subfile (index = subfile index), as many as
        /// `targets`; empty when `replicas` is 1 (then nothing of it is written).
        chains: Vec<u32>,
    },
    Symlink {
        target: String,
    },
    /// A FIFO, socket or device node (its kind and device number are in the attributes).
    Special,
}

/// One decoded inode record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inode {
    pub(crate) attrs: Attributes,
    pub(crate) body: Body,
}

impl Inode {
    pub(crate) fn is_directory(&self) -> bool {
        matches!(self.body, Body::Directory { .. })
    }

    /// The file record of a file inode with id `id`.
    pub(crate) fn file_record(&self, id: u64) -> Option<FileRecord> {
        match &self.body {
            Body::File { layout, targets, replicas, chains } => Some(FileRecord {
                id: FileId(id),
                layout: *layout,
                targets: targets.clone(),
                replicas: u32::from(*replicas),
                chains: chains.clone(),
            }),
            _ => None,
        }
    }

    pub(crate) fn into_entry(self, id: u64) -> Entry {
        let file = self.file_record(id);
        let (symlink_target, default_layout, default_replicas) = match self.body {
            Body::Symlink { target } => (Some(target), None, 1),
            Body::Directory { default_layout, default_replicas } => (None, default_layout, default_replicas),
            Body::File { .. } | Body::Special => (None, None, 1),
        };
        let default_replicas = u32::from(default_replicas);
        Entry { id, attrs: self.attrs, file, symlink_target, default_layout, default_replicas }
    }

    /// Encodes the record. Panics if the inode breaks an invariant (a bug, not bad input).
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(kind_agrees(self.attrs.kind, &self.body), "kind disagrees with body");
        let mut writer = Writer::new(INODE_FORMAT_VERSION);
        writer.u8(kind_byte(self.attrs.kind));
        encode_attrs(&mut writer, &self.attrs);
        match &self.body {
            Body::Directory { default_layout, default_replicas } => {
                encode_directory(&mut writer, default_layout, *default_replicas)
            }
            Body::File { layout, targets, replicas, chains } => {
                encode_file(&mut writer, layout, targets, *replicas, chains)
            }
            Body::Symlink { target } => encode_symlink(&mut writer, target),
            Body::Special => writer.u64(self.attrs.rdev),
        }
        writer.finish()
    }

    pub(crate) fn decode(record: &[u8]) -> Result<Self, NamespaceError> {
        let mut reader = Reader::open("inode", record, INODE_FORMAT_VERSION)?;
        let kind = match reader.u8()? {
            KIND_DIRECTORY => FileKind::Directory,
            KIND_FILE => FileKind::File,
            KIND_SYMLINK => FileKind::Symlink,
            KIND_FIFO => FileKind::Fifo,
            KIND_SOCKET => FileKind::Socket,
            KIND_CHAR_DEVICE => FileKind::CharDevice,
            KIND_BLOCK_DEVICE => FileKind::BlockDevice,
            other => return Err(reader.error(format!("has unknown kind {other}"))),
        };
        let mut attrs = decode_attrs(&mut reader, kind)?;
        let body = match kind {
            FileKind::Directory => decode_directory(&mut reader)?,
            FileKind::File => decode_file(&mut reader)?,
            FileKind::Symlink => decode_symlink(&mut reader)?,
            _ => {
                attrs.rdev = reader.u64()?;
                Body::Special
            }
        };
        reader.finish()?;
        Ok(Self { attrs, body })
    }
}

fn kind_agrees(kind: FileKind, body: &Body) -> bool {
    match body {
        Body::Special => kind.is_special(),
        other => body_kind(other) == kind,
    }
}

fn body_kind(body: &Body) -> FileKind {
    match body {
        Body::Directory { .. } => FileKind::Directory,
        Body::File { .. } => FileKind::File,
        Body::Symlink { .. } => FileKind::Symlink,
        Body::Special => FileKind::Fifo,
    }
}

fn kind_byte(kind: FileKind) -> u8 {
    match kind {
        FileKind::Directory => KIND_DIRECTORY,
        FileKind::File => KIND_FILE,
        FileKind::Symlink => KIND_SYMLINK,
        FileKind::Fifo => KIND_FIFO,
        FileKind::Socket => KIND_SOCKET,
        FileKind::CharDevice => KIND_CHAR_DEVICE,
        FileKind::BlockDevice => KIND_BLOCK_DEVICE,
    }
}

fn encode_attrs(writer: &mut Writer, attrs: &Attributes) {
    writer.u32(attrs.mode);
    writer.u32(attrs.uid);
    writer.u32(attrs.gid);
    writer.u64(attrs.size_bytes);
    writer.u32(attrs.nlink);
    writer.i64(attrs.atime_ns);
    writer.i64(attrs.mtime_ns);
    writer.i64(attrs.ctime_ns);
}

fn decode_attrs(reader: &mut Reader<'_>, kind: FileKind) -> Result<Attributes, NamespaceError> {
    Ok(Attributes {
        kind,
        mode: reader.u32()?,
        uid: reader.u32()?,
        gid: reader.u32()?,
        size_bytes: reader.u64()?,
        nlink: reader.u32()?,
        atime_ns: reader.i64()?,
        mtime_ns: reader.i64()?,
        ctime_ns: reader.i64()?,
        rdev: 0,
    })
}

fn encode_layout(writer: &mut Writer, layout: &Layout, replicas: u8) {
    assert!(layout.validate().is_ok(), "layout {layout} is invalid");
    assert!((1..=REPLICAS_MAX).contains(&u32::from(replicas)), "replica count {replicas}");
    let (tag, size, second, count) = match *layout {
        Layout::Explicit => (LAYOUT_EXPLICIT, 0, 0, 0),
        Layout::Stripe { unit_bytes, count } => (LAYOUT_STRIPE, unit_bytes, 0, count),
        Layout::Hash { block_bytes, sequentiality, count } => {
            (LAYOUT_HASH, block_bytes, sequentiality, count)
        }
    };
    let replicated = replicas > 1;
    writer.u8(if replicated { tag | LAYOUT_REPLICATED } else { tag });
    writer.u64(size);
    writer.u32(second);
    writer.u32(count);
    if replicated {
        writer.u8(replicas);
    }
}

/// A layout and its replica count (1 when the tag has no replica flag).
fn decode_layout(reader: &mut Reader<'_>) -> Result<(Layout, u8), NamespaceError> {
    let (layout, replicated) = decode_plain_layout(reader)?;
    if !replicated {
        return Ok((layout, 1));
    }
    let replicas = reader.u8()?;
    if !(2..=REPLICAS_MAX).contains(&u32::from(replicas)) {
        return Err(reader.error(format!("has replica count {replicas}, outside 2..={REPLICAS_MAX}")));
    }
    Ok((layout, replicas))
}

/// The 17 layout bytes, and whether the tag's replica flag was set.
fn decode_plain_layout(reader: &mut Reader<'_>) -> Result<(Layout, bool), NamespaceError> {
    let flagged = reader.u8()?;
    let (tag, replicated) = (flagged & !LAYOUT_REPLICATED, flagged & LAYOUT_REPLICATED != 0);
    let size = reader.u64()?;
    let second = reader.u32()?;
    let count = reader.u32()?;
    let layout = match (tag, size, second, count) {
        (LAYOUT_EXPLICIT, 0, 0, 0) => Layout::Explicit,
        (LAYOUT_STRIPE, unit_bytes, 0, count) => Layout::Stripe { unit_bytes, count },
        (LAYOUT_HASH, block_bytes, sequentiality, count) => {
            Layout::Hash { block_bytes, sequentiality, count }
        }
        _ => return Err(reader.error(format!("has bad layout {tag}/{size}/{second}/{count}"))),
    };
    layout.validate().map_err(|e| reader.error(format!("has bad layout: {e}")))?;
    Ok((layout, replicated))
}

fn encode_directory(writer: &mut Writer, default_layout: &Option<Layout>, default_replicas: u8) {
    match default_layout {
        None => writer.u8(0),
        Some(layout) => {
            writer.u8(1);
            encode_layout(writer, layout, default_replicas);
        }
    }
}

fn decode_directory(reader: &mut Reader<'_>) -> Result<Body, NamespaceError> {
    let (default_layout, default_replicas) = match reader.u8()? {
        0 => (None, 1),
        1 => {
            let (layout, replicas) = decode_layout(reader)?;
            (Some(layout), replicas)
        }
        other => return Err(reader.error(format!("has bad default-layout flag {other}"))),
    };
    Ok(Body::Directory { default_layout, default_replicas })
}

fn encode_file(writer: &mut Writer, layout: &Layout, targets: &[TargetId], replicas: u8, chains: &[u32]) {
    let count = u32::try_from(targets.len()).unwrap_or(u32::MAX);
    assert!((1..=SUBFILE_COUNT_MAX).contains(&count), "bad subfile count {count}");
    assert!(all_distinct(targets), "two subfiles on one target");
    let expected_chains = if replicas > 1 { targets.len() } else { 0 };
    assert_eq!(chains.len(), expected_chains, "a replicated file has one chain per subfile");
    encode_layout(writer, layout, replicas);
    writer.u32(count);
    for target in targets {
        writer.u64(target.0);
    }
    // Replicated (the tag's flag is set): each subfile's chain id follows the targets.
    for chain in chains {
        writer.u32(*chain);
    }
}

fn decode_file(reader: &mut Reader<'_>) -> Result<Body, NamespaceError> {
    let (layout, replicas) = decode_layout(reader)?;
    let count = reader.u32()?;
    if !(1..=SUBFILE_COUNT_MAX).contains(&count) {
        return Err(reader.error(format!("has subfile count {count}")));
    }
    // The length is checked by `take` before anything is allocated for it.
    let bytes = reader.take(count as usize * 8)?;
    let targets: Vec<TargetId> = bytes
        .chunks_exact(8)
        .map(|chunk| {
            let mut id = [0u8; 8];
            id.copy_from_slice(chunk);
            TargetId(u64::from_le_bytes(id))
        })
        .collect();
    if !all_distinct(&targets) {
        return Err(reader.error("places two subfiles on one target".into()));
    }
    let chains = if replicas > 1 {
        let bytes = reader.take(count as usize * 4)?;
        bytes
            .chunks_exact(4)
            .map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Body::File { layout, targets, replicas, chains })
}

fn encode_symlink(writer: &mut Writer, target: &str) {
    assert!(target.len() <= PATH_BYTES_MAX, "symlink target too long");
    writer.u32(target.len() as u32);
    writer.raw(target.as_bytes());
}

fn decode_symlink(reader: &mut Reader<'_>) -> Result<Body, NamespaceError> {
    let length = reader.u32()? as usize;
    if length > PATH_BYTES_MAX {
        return Err(reader.error(format!("has a {length}-byte symlink target")));
    }
    let bytes = reader.take(length)?;
    let target = std::str::from_utf8(bytes)
        .map_err(|_| reader.error("has a symlink target that is not UTF-8".into()))?;
    Ok(Body::Symlink { target: target.to_string() })
}

pub(crate) fn all_distinct(targets: &[TargetId]) -> bool {
    let mut sorted = targets.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|pair| pair[0] != pair[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kind: FileKind) -> Attributes {
        Attributes {
            kind,
            mode: 0o644,
            uid: 7,
            gid: 8,
            size_bytes: 99,
            nlink: 1,
            atime_ns: -1,
            mtime_ns: 2,
            ctime_ns: 3,
            rdev: 0,
        }
    }

    fn samples() -> Vec<Inode> {
        vec![
            Inode {
                attrs: attrs(FileKind::Directory),
                body: Body::Directory {
                    default_layout: Some(Layout::Stripe { unit_bytes: 4096, count: 2 }),
                    default_replicas: 2,
                },
            },
            Inode {
                attrs: attrs(FileKind::File),
                body: Body::File {
                    layout: Layout::Explicit,
                    targets: vec![TargetId(3), TargetId(u64::MAX)],
                    replicas: 1,
                    chains: Vec::new(),
                },
            },
            Inode {
                attrs: attrs(FileKind::File),
                body: Body::File {
                    layout: Layout::Hash { block_bytes: 4096, sequentiality: 2, count: 0 },
                    targets: vec![TargetId(5)],
                    replicas: 3,
                    chains: vec![0x0102_0304],
                },
            },
            Inode { attrs: attrs(FileKind::Symlink), body: Body::Symlink { target: "../x/ÿ".into() } },
            Inode { attrs: attrs(FileKind::Fifo), body: Body::Special },
            Inode { attrs: Attributes { rdev: 0x0803, ..attrs(FileKind::BlockDevice) }, body: Body::Special },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for inode in samples() {
            assert_eq!(Inode::decode(&inode.encode()).unwrap(), inode);
        }
    }

    #[test]
    fn file_record_has_documented_bytes() {
        let record = samples()[1].encode();
        assert_eq!(record[0], 1, "format version");
        assert_eq!(record[1], KIND_FILE);
        assert_eq!(&record[2..6], &0o644u32.to_le_bytes());
        assert_eq!(record[50], LAYOUT_EXPLICIT);
        assert_eq!(&record[67..71], &2u32.to_le_bytes());
        assert_eq!(&record[71..79], &3u64.to_le_bytes());
        assert_eq!(record.len(), 50 + 17 + 4 + 16 + 4);
    }

    #[test]
    fn replicated_file_record_flags_its_tag_and_adds_one_byte() {
        let record = samples()[2].encode();
        assert_eq!(record[50], LAYOUT_HASH | LAYOUT_REPLICATED);
        assert_eq!(record[67], 3, "replica count after the 17 layout bytes");
        assert_eq!(&record[68..72], &1u32.to_le_bytes(), "subfile count");
        assert_eq!(&record[80..84], &0x0102_0304u32.to_le_bytes(), "the subfile's chain after the targets");
        assert_eq!(record.len(), 50 + 18 + 4 + 8 + 4 + 4);
        let entry = Inode::decode(&record).unwrap().into_entry(9);
        let file = entry.file.unwrap();
        assert_eq!((file.replicas, file.chains), (3, vec![0x0102_0304]));
        // An old record (no flag) reads as one replica.
        let old = Inode::decode(&samples()[1].encode()).unwrap().into_entry(9);
        assert_eq!(old.file.unwrap().replicas, 1);
    }

    #[test]
    fn a_replica_count_out_of_range_is_corrupt() {
        let mut record = samples()[2].encode();
        for bad in [0u8, 1, 8, 255] {
            record[67] = bad;
            let body = record.len() - 4;
            let crc = crc32c::crc32c(&record[..body]);
            record[body..].copy_from_slice(&crc.to_le_bytes());
            assert!(matches!(Inode::decode(&record), Err(NamespaceError::Corrupt { .. })), "{bad}");
        }
    }

    proptest::proptest! {
        /// A file record of any layout and replica count decodes to what was encoded.
        #[test]
        fn file_records_round_trip(unit in 1u64..u64::MAX, seq in 1u32..u32::MAX, count in proptest::num::u32::ANY,
                replicas in 1u8..=7, kind in 0u8..3, targets in proptest::collection::btree_set(proptest::num::u64::ANY, 1..16)) {
            let layout = match kind {
                0 => Layout::Explicit,
                1 => Layout::Stripe { unit_bytes: unit, count },
                _ => Layout::Hash { block_bytes: unit, sequentiality: seq, count },
            };
            let targets: Vec<TargetId> = targets.into_iter().map(TargetId).collect();
            let chains = if replicas > 1 { (0..targets.len() as u32).map(|i| i.wrapping_mul(seq)).collect() } else { Vec::new() };
            let inode = Inode { attrs: attrs(FileKind::File), body: Body::File { layout, targets, replicas, chains } };
            proptest::prop_assert_eq!(Inode::decode(&inode.encode()).unwrap(), inode);
        }
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        for inode in samples() {
            let record = inode.encode();
            for length in 0..record.len() {
                let err = Inode::decode(&record[..length]).unwrap_err();
                assert!(matches!(err, NamespaceError::Corrupt { .. }));
            }
        }
    }
}
