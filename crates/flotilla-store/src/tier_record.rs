//! A fork's archive record: which archive object holds a copy of the fork, how large the
//! fork was when copied, which of its byte ranges the copy holds (`runs`: a sparse fork's
//! holes are not copied, issue 31), and how much of that copy is still the fork's data
//! (`valid_bytes`, cut by a truncation). One small checksummed file per archived fork under
//! the target's `hsm` directory, replaced atomically (write a temporary file, `fsync`,
//! rename, `fsync` the directory), so after a crash a fork has either its old record or its
//! new one.
//!
//! The object is the runs' bytes one after another. Format `FLOHSM02`: magic, size, valid
//! bytes, time, object CRC32C, key length (u16) and key, run count (u32) and each run's fork
//! offset and length (u64 each), then the CRC32C of everything before (little-endian
//! throughout). `FLOHSM01` records (no runs: the object is the whole fork) still decode, as
//! one run over the whole size.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// What the tier knows of a fork's archive copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveRecord {
    /// The object's key in the archive.
    pub object_key: String,
    /// The fork's size when it was copied.
    pub size_bytes: u64,
    /// Bytes of the fork that the copy may still give back; held bytes below this that are
    /// not on disk are recalled, everything at or past it reads as the fork says.
    pub valid_bytes: u64,
    /// When the copy was made durable (seconds since the Unix epoch).
    pub archived_at_s: u64,
    /// CRC32C of the object's bytes.
    pub crc32c: u32,
    /// The fork's byte ranges (offset, length) the object holds, in order, one after another
    /// in the object: sorted, disjoint, non-empty, within `size_bytes`. Bytes outside them
    /// were holes (zeros) when copied.
    pub runs: Vec<(u64, u64)>,
}

const MAGIC: [u8; 8] = *b"FLOHSM02";
const MAGIC_V1: [u8; 8] = *b"FLOHSM01";
const FIXED_BYTES: usize = 8 + 8 + 8 + 8 + 4 + 2;
/// Longest object key a record holds.
pub const OBJECT_KEY_BYTES_MAX: usize = 1024;
/// Most runs a record holds (16 MiB of record); a fork more fragmented than that is copied
/// as one run (its holes as zeros).
pub const RUNS_MAX: usize = 1 << 20;
const RUN_BYTES: usize = 16;

impl ArchiveRecord {
    /// The record's bytes (format `FLOHSM02`, see the module).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.object_key.len() <= OBJECT_KEY_BYTES_MAX, "object key too long");
        assert!(self.runs.len() <= RUNS_MAX, "too many runs");
        let mut bytes =
            Vec::with_capacity(FIXED_BYTES + self.object_key.len() + 4 + self.runs.len() * RUN_BYTES + 4);
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&self.size_bytes.to_le_bytes());
        bytes.extend_from_slice(&self.valid_bytes.to_le_bytes());
        bytes.extend_from_slice(&self.archived_at_s.to_le_bytes());
        bytes.extend_from_slice(&self.crc32c.to_le_bytes());
        bytes.extend_from_slice(&(self.object_key.len() as u16).to_le_bytes());
        bytes.extend_from_slice(self.object_key.as_bytes());
        bytes.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for (offset, length) in &self.runs {
            bytes.extend_from_slice(&offset.to_le_bytes());
            bytes.extend_from_slice(&length.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and checks a record (any damage is an error naming what is wrong).
    pub fn decode(bytes: &[u8]) -> Result<ArchiveRecord, String> {
        if bytes.len() < FIXED_BYTES + 4 {
            return Err(format!("{} bytes is shorter than any record", bytes.len()));
        }
        let version_1 = match &bytes[0..8] {
            magic if *magic == MAGIC => false,
            magic if *magic == MAGIC_V1 => true,
            _ => return Err("bad magic".into()),
        };
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
            return Err("checksum mismatch".into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let key_bytes = u16::from_le_bytes(body[36..38].try_into().expect("2 bytes")) as usize;
        let key_end = FIXED_BYTES + key_bytes;
        if key_bytes > OBJECT_KEY_BYTES_MAX || key_end > body.len() || (version_1 && key_end != body.len()) {
            return Err(format!("object key length {key_bytes} does not fit the record"));
        }
        let object_key =
            String::from_utf8(body[FIXED_BYTES..key_end].to_vec()).map_err(|_| "object key is not UTF-8")?;
        let size_bytes = u64_at(8);
        let runs = match version_1 {
            true => dense_runs(size_bytes),
            false => decode_runs(&body[key_end..], size_bytes)?,
        };
        let record = ArchiveRecord {
            object_key,
            size_bytes,
            valid_bytes: u64_at(16),
            archived_at_s: u64_at(24),
            crc32c: u32::from_le_bytes(body[32..36].try_into().expect("4 bytes")),
            runs,
        };
        if record.valid_bytes > record.size_bytes {
            return Err("valid bytes exceed the archived size".into());
        }
        Ok(record)
    }

    /// Bytes of the object (the runs' total).
    pub fn object_bytes(&self) -> u64 {
        self.runs.iter().map(|(_, length)| length).sum()
    }

    /// Whether the copy holds (and may still give back) any byte of `start..end`.
    pub fn holds(&self, start: u64, end: u64) -> bool {
        let end = end.min(self.valid_bytes);
        // The first run ending after `start`: it holds a byte of the range if it begins
        // before the range's end.
        let index = self.runs.partition_point(|(offset, length)| offset + length <= start);
        start < end && self.runs.get(index).is_some_and(|(offset, _)| *offset < end)
    }

    /// The parts of fork bytes `start..end` the copy holds and may still give back (below
    /// `valid_bytes`), each as (fork offset, object offset, length), in order.
    pub fn held(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        let end = end.min(self.valid_bytes);
        let mut parts = Vec::new();
        let mut object_at = 0u64;
        for (offset, length) in &self.runs {
            let run_end = offset + length;
            let (from, to) = ((*offset).max(start), run_end.min(end));
            if from < to {
                parts.push((from, object_at + (from - offset), to - from));
            }
            if run_end >= end {
                break;
            }
            object_at += length;
        }
        parts
    }
}

/// One run over `0..size_bytes` (none for an empty fork).
pub fn dense_runs(size_bytes: u64) -> Vec<(u64, u64)> {
    match size_bytes {
        0 => Vec::new(),
        size => vec![(0, size)],
    }
}

fn decode_runs(bytes: &[u8], size_bytes: u64) -> Result<Vec<(u64, u64)>, String> {
    if bytes.len() < 4 {
        return Err("the run count is missing".into());
    }
    let count = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    if count > RUNS_MAX || bytes.len() != 4 + count * RUN_BYTES {
        return Err(format!("{count} runs do not fit the record"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let runs: Vec<(u64, u64)> =
        (0..count).map(|index| (u64_at(4 + index * RUN_BYTES), u64_at(12 + index * RUN_BYTES))).collect();
    let mut end_before = 0u64;
    for (index, (offset, length)) in runs.iter().enumerate() {
        let end = offset.checked_add(*length).filter(|end| *end <= size_bytes);
        if *length == 0 || end.is_none() || (index > 0 && *offset <= end_before) {
            return Err(format!("run {index} ({offset}, {length}) is empty, unsorted or past the size"));
        }
        end_before = end.unwrap_or(0);
    }
    Ok(runs)
}

/// Reads a fork's record (`None`: the fork was never archived, or its copy was dropped).
pub fn read(path: &Path) -> io::Result<Option<ArchiveRecord>> {
    match fs::read(path) {
        Ok(bytes) => ArchiveRecord::decode(&bytes).map(Some).map_err(|reason| {
            io::Error::new(io::ErrorKind::InvalidData, format!("archive record {path:?}: {reason}"))
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Replaces a fork's record durably.
pub fn write(path: &Path, record: &ArchiveRecord) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other(format!("{path:?} has no directory")))?;
    fs::create_dir_all(dir)?;
    let temporary = path.with_extension("new");
    let mut file = fs::File::create(&temporary)?;
    file.write_all(&record.encode())?;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    fs::File::open(dir)?.sync_all()
}

/// Removes a fork's record durably (absent already: fine).
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => fs::File::open(path.parent().expect("a record has a directory"))?.sync_all(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip_and_any_flipped_byte_is_caught(
            key in "[a-z0-9/.]{1,64}", size in 0u64..1 << 40, cut in 0u64..1 << 40, at in any::<u64>(), crc in any::<u32>(),
            flip in any::<prop::sample::Index>(), bit in 0u8..8, cuts in prop::collection::vec(any::<u64>(), 0..8),
        ) {
            let runs = runs_from_cuts(size, cuts);
            let record = ArchiveRecord { object_key: key, size_bytes: size, valid_bytes: cut.min(size), archived_at_s: at, crc32c: crc, runs };
            let mut bytes = record.encode();
            prop_assert_eq!(ArchiveRecord::decode(&bytes), Ok(record));
            let index = flip.index(bytes.len());
            bytes[index] ^= 1 << bit;
            prop_assert!(ArchiveRecord::decode(&bytes).is_err());
        }
    }

    /// Sorted, disjoint, non-empty runs within `size` from arbitrary cut points (every other
    /// interval between cuts is a run).
    fn runs_from_cuts(size: u64, cuts: Vec<u64>) -> Vec<(u64, u64)> {
        let mut points: Vec<u64> = cuts.into_iter().map(|cut| cut % (size + 1)).collect();
        points.push(0);
        points.push(size);
        points.sort_unstable();
        points.dedup();
        points.windows(2).step_by(2).map(|pair| (pair[0], pair[1] - pair[0])).collect()
    }

    #[test]
    fn held_parts_map_fork_bytes_to_the_object_and_stop_at_valid_bytes() {
        let record = ArchiveRecord {
            object_key: "k".into(),
            size_bytes: 1 << 40,
            valid_bytes: (1 << 40) - 10,
            archived_at_s: 0,
            crc32c: 0,
            runs: vec![(0, 4096), (1 << 30, 4096), ((1 << 40) - 4096, 4096)],
        };
        assert_eq!(record.object_bytes(), 3 * 4096);
        assert_eq!(
            record.held(0, 1 << 40),
            vec![(0, 0, 4096), (1 << 30, 4096, 4096), ((1 << 40) - 4096, 8192, 4086)]
        );
        assert_eq!(record.held(4096, 1 << 30), vec![], "a hole holds nothing");
        assert_eq!(record.held(100, 200), vec![(100, 100, 100)]);
        assert!(record.holds(0, 1) && record.holds((1 << 30) - 1, (1 << 30) + 1));
        assert!(!record.holds(4096, 1 << 30) && !record.holds((1 << 40) - 10, 1 << 40));
    }

    #[test]
    fn a_version_1_record_is_one_dense_run() {
        let record = ArchiveRecord {
            object_key: "k/1".into(),
            size_bytes: 10,
            valid_bytes: 10,
            archived_at_s: 1,
            crc32c: 7,
            runs: dense_runs(10),
        };
        let mut bytes = record.encode();
        // Version 1 had no runs: drop the run count and the one run, fix magic and CRC.
        bytes.truncate(bytes.len() - 4 - 4 - RUN_BYTES);
        bytes[0..8].copy_from_slice(&MAGIC_V1);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(ArchiveRecord::decode(&bytes), Ok(record));
    }

    #[test]
    fn a_record_is_replaced_and_removed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hsm/0001.0/data");
        assert_eq!(read(&path).unwrap(), None);
        let mut record = ArchiveRecord {
            object_key: "k/1".into(),
            size_bytes: 10,
            valid_bytes: 10,
            archived_at_s: 1,
            crc32c: 7,
            runs: dense_runs(10),
        };
        write(&path, &record).unwrap();
        record.valid_bytes = 4;
        write(&path, &record).unwrap();
        assert_eq!(read(&path).unwrap(), Some(record));
        fs::write(&path, b"FLOHSM02 garbage that is long enough to decode").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("checksum"));
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
    }
}
