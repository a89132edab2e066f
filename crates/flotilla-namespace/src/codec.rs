//! Little-endian field writer and bounds-checked reader shared by the record encoders.
//!
//! Every record ends with a CRC32C of all bytes before it. [`Reader::open`] checks that
//! checksum before any field is read, so a torn or altered record is reported as
//! [`NamespaceError::Corrupt`] and never decoded into nonsense.

use crate::error::NamespaceError;

/// Bytes of the CRC32C trailer that ends every record.
pub(crate) const CRC_BYTES: usize = 4;

/// Appends little-endian fields to a record buffer.
pub(crate) struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    pub(crate) fn new(version: u8) -> Self {
        Self { bytes: vec![version] }
    }

    pub(crate) fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub(crate) fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn i64(&mut self, value: i64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn raw(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }

    /// Appends the CRC32C trailer and returns the finished record.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let crc = crc32c::crc32c(&self.bytes);
        self.bytes.extend_from_slice(&crc.to_le_bytes());
        self.bytes
    }
}

/// Reads fields from a record whose checksum and version were already checked.
pub(crate) struct Reader<'a> {
    what: &'static str,
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Checks the CRC32C trailer and the version byte; returns a reader over the fields.
    pub(crate) fn open(what: &'static str, record: &'a [u8], version: u8) -> Result<Self, NamespaceError> {
        let body_len = record
            .len()
            .checked_sub(CRC_BYTES)
            .filter(|len| *len >= 1)
            .ok_or_else(|| NamespaceError::corrupt(format!("{what} record is {} bytes", record.len())))?;
        let (body, trailer) = record.split_at(body_len);
        let mut stored = [0u8; CRC_BYTES];
        stored.copy_from_slice(trailer);
        if crc32c::crc32c(body) != u32::from_le_bytes(stored) {
            return Err(NamespaceError::corrupt(format!("{what} record fails its checksum")));
        }
        if body[0] != version {
            return Err(NamespaceError::corrupt(format!(
                "{what} record has format version {}, expected {version}",
                body[0]
            )));
        }
        Ok(Self { what, rest: &body[1..] })
    }

    pub(crate) fn take(&mut self, length: usize) -> Result<&'a [u8], NamespaceError> {
        if self.rest.len() < length {
            return Err(NamespaceError::corrupt(format!("{} record is truncated", self.what)));
        }
        let (head, tail) = self.rest.split_at(length);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], NamespaceError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, NamespaceError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, NamespaceError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, NamespaceError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, NamespaceError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, NamespaceError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// Whether every field was consumed (an optional last field is absent).
    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// Errors unless every field was consumed.
    pub(crate) fn finish(self) -> Result<(), NamespaceError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!("has {} trailing bytes", self.rest.len())))
        }
    }

    /// A corruption error that names the record kind.
    pub(crate) fn error(&self, detail: String) -> NamespaceError {
        NamespaceError::corrupt(format!("{} record {detail}", self.what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let mut writer = Writer::new(7);
        writer.u32(0xdead_beef);
        writer.i64(-5);
        let mut record = writer.finish();
        let mut reader = Reader::open("test", &record, 7).unwrap();
        assert_eq!(reader.u32().unwrap(), 0xdead_beef);
        assert_eq!(reader.i64().unwrap(), -5);
        reader.finish().unwrap();

        assert!(Reader::open("test", &record, 8).is_err());
        record[2] ^= 1;
        assert!(Reader::open("test", &record, 7).is_err());
        assert!(Reader::open("test", &record[..3], 7).is_err());
        assert!(Reader::open("test", &[], 7).is_err());
    }
}
