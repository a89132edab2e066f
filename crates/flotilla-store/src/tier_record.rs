//! A fork's archive record: which archive object holds a copy of the fork, how large the
//! fork was when copied, and how much of that copy is still the fork's data (`valid_bytes`,
//! cut by a truncation). One small checksummed file per archived fork under the target's
//! `hsm` directory, replaced atomically (write a temporary file, `fsync`, rename, `fsync`
//! the directory), so after a crash a fork has either its old record or its new one.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// What the tier knows of a fork's archive copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveRecord {
    /// The object's key in the archive.
    pub object_key: String,
    /// The fork's size when it was copied (the object's size).
    pub size_bytes: u64,
    /// Bytes at the start of the object that are still the fork's data; blocks below this
    /// that are not on disk are recalled, blocks at or past it read as the fork says.
    pub valid_bytes: u64,
    /// When the copy was made durable (seconds since the Unix epoch).
    pub archived_at_s: u64,
    /// CRC32C of the object's bytes.
    pub crc32c: u32,
}

const MAGIC: [u8; 8] = *b"FLOHSM01";
const FIXED_BYTES: usize = 8 + 8 + 8 + 8 + 4 + 2;
/// Longest object key a record holds.
pub const OBJECT_KEY_BYTES_MAX: usize = 1024;

impl ArchiveRecord {
    /// The record's bytes: magic, sizes, time, object CRC, key length and key, then the
    /// CRC32C of everything before it (little-endian throughout).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.object_key.len() <= OBJECT_KEY_BYTES_MAX, "object key too long");
        let mut bytes = Vec::with_capacity(FIXED_BYTES + self.object_key.len() + 4);
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&self.size_bytes.to_le_bytes());
        bytes.extend_from_slice(&self.valid_bytes.to_le_bytes());
        bytes.extend_from_slice(&self.archived_at_s.to_le_bytes());
        bytes.extend_from_slice(&self.crc32c.to_le_bytes());
        bytes.extend_from_slice(&(self.object_key.len() as u16).to_le_bytes());
        bytes.extend_from_slice(self.object_key.as_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and checks a record (any damage is an error naming what is wrong).
    pub fn decode(bytes: &[u8]) -> Result<ArchiveRecord, String> {
        if bytes.len() < FIXED_BYTES + 4 {
            return Err(format!("{} bytes is shorter than any record", bytes.len()));
        }
        if bytes[0..8] != MAGIC {
            return Err("bad magic".into());
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
            return Err("checksum mismatch".into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let key_bytes = u16::from_le_bytes(body[36..38].try_into().expect("2 bytes")) as usize;
        if key_bytes > OBJECT_KEY_BYTES_MAX || FIXED_BYTES + key_bytes != body.len() {
            return Err(format!("object key length {key_bytes} does not fit the record"));
        }
        let object_key =
            String::from_utf8(body[FIXED_BYTES..].to_vec()).map_err(|_| "object key is not UTF-8")?;
        let record = ArchiveRecord {
            object_key,
            size_bytes: u64_at(8),
            valid_bytes: u64_at(16),
            archived_at_s: u64_at(24),
            crc32c: u32::from_le_bytes(body[32..36].try_into().expect("4 bytes")),
        };
        if record.valid_bytes > record.size_bytes {
            return Err("valid bytes exceed the archived size".into());
        }
        Ok(record)
    }
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
            flip in any::<prop::sample::Index>(), bit in 0u8..8,
        ) {
            let record = ArchiveRecord { object_key: key, size_bytes: size, valid_bytes: cut.min(size), archived_at_s: at, crc32c: crc };
            let mut bytes = record.encode();
            prop_assert_eq!(ArchiveRecord::decode(&bytes), Ok(record));
            let index = flip.index(bytes.len());
            bytes[index] ^= 1 << bit;
            prop_assert!(ArchiveRecord::decode(&bytes).is_err());
        }
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
        };
        write(&path, &record).unwrap();
        record.valid_bytes = 4;
        write(&path, &record).unwrap();
        assert_eq!(read(&path).unwrap(), Some(record));
        fs::write(&path, b"FLOHSM01 garbage that is long enough to decode").unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("checksum"));
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
    }
}
