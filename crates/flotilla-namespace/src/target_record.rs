//! The target record: the value of the `targets` table, format version 1 (see `FORMAT.md`).
//!
//! It remembers every target the metadata service has heard from, so that `status` can show
//! a target that is down after a metadata restart, with its last known usage.

use crate::codec::{Reader, Writer};
use crate::error::NamespaceError;
use flotilla_types::TargetId;

/// Format version of target records written by this build.
pub(crate) const TARGET_FORMAT_VERSION: u8 = 1;
/// Longest server address kept for a target.
pub const SERVER_ADDR_BYTES_MAX: usize = 1024;

/// What the namespace remembers about a storage target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetRecord {
    pub target: TargetId,
    /// Address of the I/O server that last reported the target.
    pub server_addr: String,
    pub used_bytes: u64,
    pub free_bytes: u64,
}

impl TargetRecord {
    /// Encodes everything but the target id, which is the table key.
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(self.server_addr.len() <= SERVER_ADDR_BYTES_MAX, "server address too long");
        let mut writer = Writer::new(TARGET_FORMAT_VERSION);
        writer.u64(self.used_bytes);
        writer.u64(self.free_bytes);
        writer.u16(self.server_addr.len() as u16);
        writer.raw(self.server_addr.as_bytes());
        writer.finish()
    }

    pub(crate) fn decode(target: TargetId, record: &[u8]) -> Result<Self, NamespaceError> {
        let mut reader = Reader::open("target", record, TARGET_FORMAT_VERSION)?;
        let used_bytes = reader.u64()?;
        let free_bytes = reader.u64()?;
        let length = usize::from(reader.u16()?);
        if length > SERVER_ADDR_BYTES_MAX {
            return Err(reader.error(format!("has a {length}-byte server address")));
        }
        let server_addr = std::str::from_utf8(reader.take(length)?)
            .map_err(|_| reader.error("has a server address that is not UTF-8".into()))?
            .to_string();
        reader.finish()?;
        Ok(Self { target, server_addr, used_bytes, free_bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_documented_bytes() {
        let record = TargetRecord {
            target: TargetId(9),
            server_addr: "10.0.0.1:7000".into(),
            used_bytes: 5,
            free_bytes: 6,
        };
        let bytes = record.encode();
        assert_eq!(bytes[0], 1);
        assert_eq!(&bytes[1..9], &5u64.to_le_bytes());
        assert_eq!(&bytes[17..19], &13u16.to_le_bytes());
        assert_eq!(bytes.len(), 19 + 13 + 4);
        assert_eq!(TargetRecord::decode(TargetId(9), &bytes).unwrap(), record);
    }
}
