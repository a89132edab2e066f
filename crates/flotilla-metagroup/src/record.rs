//! The on-disk record: every value the group writes to redb is framed as
//! `[version u8 = 1][crc32c u32 LE of payload][length u32 LE][payload: postcard]`.
//!
//! Invariant: a record is checked (version, length bound, checksum) right after it is read,
//! before it is decoded; nothing read from disk is unwrapped.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The record format this build writes and reads.
pub const RECORD_VERSION: u8 = 1;
/// Bytes of a record's header.
pub const RECORD_HEADER_BYTES: usize = 9;

/// What is wrong with a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("record of {bytes} bytes is shorter than its header")]
    Truncated { bytes: usize },
    #[error("record version {found}, this build reads {RECORD_VERSION}")]
    Version { found: u8 },
    #[error("record says {declared} payload bytes but holds {held}")]
    Length { declared: usize, held: usize },
    #[error("record of {bytes} bytes is over the bound of {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
    #[error("record checksum {found:#x} does not match {computed:#x}")]
    Checksum { found: u32, computed: u32 },
    #[error("record payload does not decode: {reason}")]
    Decode { reason: String },
    #[error("value does not encode: {reason}")]
    Encode { reason: String },
}

/// Encodes `value` as a record no larger than `bytes_max`.
pub fn encode<T: Serialize>(value: &T, bytes_max: usize) -> Result<Vec<u8>, RecordError> {
    let payload = postcard::to_stdvec(value).map_err(|e| RecordError::Encode { reason: e.to_string() })?;
    let bytes = RECORD_HEADER_BYTES + payload.len();
    if bytes > bytes_max {
        return Err(RecordError::TooLarge { bytes, bytes_max });
    }
    let length = u32::try_from(payload.len())
        .map_err(|_| RecordError::TooLarge { bytes, bytes_max: u32::MAX as usize })?;
    let mut out = Vec::with_capacity(bytes);
    out.push(RECORD_VERSION);
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Checks and decodes a record read back from disk.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], bytes_max: usize) -> Result<T, RecordError> {
    let payload = check(bytes, bytes_max)?;
    postcard::from_bytes(payload).map_err(|e| RecordError::Decode { reason: e.to_string() })
}

fn check(bytes: &[u8], bytes_max: usize) -> Result<&[u8], RecordError> {
    if bytes.len() > bytes_max {
        return Err(RecordError::TooLarge { bytes: bytes.len(), bytes_max });
    }
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(RecordError::Truncated { bytes: bytes.len() });
    }
    if bytes[0] != RECORD_VERSION {
        return Err(RecordError::Version { found: bytes[0] });
    }
    let found = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let declared = u32::from_le_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) as usize;
    let payload = &bytes[RECORD_HEADER_BYTES..];
    if declared != payload.len() {
        return Err(RecordError::Length { declared, held: payload.len() });
    }
    let computed = crc32c::crc32c(payload);
    if computed != found {
        return Err(RecordError::Checksum { found, computed });
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_every_flipped_byte_is_caught() {
        let record = encode(&(7u64, "name".to_string()), 1024).unwrap();
        assert_eq!(decode::<(u64, String)>(&record, 1024).unwrap(), (7, "name".to_string()));
        for i in 0..record.len() {
            let mut bad = record.clone();
            bad[i] ^= 0x40;
            assert!(decode::<(u64, String)>(&bad, 1024).is_err(), "flip at byte {i} not caught");
        }
        assert!(matches!(decode::<u64>(&record[..4], 1024), Err(RecordError::Truncated { .. })));
        assert!(matches!(decode::<u64>(&record, 8), Err(RecordError::TooLarge { .. })));
    }
}
