//! The snapshot of a [`NamespaceMachine`](super::NamespaceMachine): every table of the
//! namespace and the machine's own records (genesis, the reply table), read from one read
//! transaction.
//!
//! Format (version 2): `[magic "FLNSSNAP"][version u16 LE][crc32c u32 LE of payload]
//! [payload length u64 LE][payload: postcard of MachineImage]`. The applied mark is not in
//! it: the group sends it beside the snapshot and the install records it.
//!
//! Invariant: a snapshot is checked (magic, version, length within `snapshot_bytes_max`,
//! checksum) before its payload is decoded; nothing in it is unwrapped.

use std::io::{Read, Write};

use flotilla_metagroup::reply_table::Session;
use flotilla_metagroup::StateMachineError;
use flotilla_namespace::NamespaceImage;
use serde::{Deserialize, Serialize};

/// The snapshot's first bytes.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"FLNSSNAP";
/// The snapshot format this build writes and reads.
/// 2: the namespace image carries the chain table (`chains`, `chain_targets`) and sessions
/// carry their owner (issue 33); a version-1 snapshot is refused by name.
pub const SNAPSHOT_VERSION: u16 = 2;
const HEADER_BYTES: usize = 8 + 2 + 4 + 8;

/// The reply table's counters (its sessions are records of their own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyMeta {
    pub next_session_id: u64,
    pub clock_ms: u64,
}

/// The whole replicated state but the mark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineImage {
    pub born: bool,
    pub replies: ReplyMeta,
    pub sessions: Vec<(u64, Session)>,
    pub namespace: NamespaceImage,
}

fn bad(reason: impl Into<String>) -> StateMachineError {
    StateMachineError::BadSnapshot { reason: reason.into() }
}

/// Writes `image` as a snapshot of at most `bytes_max` bytes.
pub fn write_image(
    out: &mut dyn Write,
    image: &MachineImage,
    bytes_max: usize,
) -> Result<(), StateMachineError> {
    let payload = postcard::to_stdvec(image).map_err(|e| StateMachineError::Storage(e.to_string()))?;
    if HEADER_BYTES + payload.len() > bytes_max {
        return Err(StateMachineError::SnapshotTooLarge { bytes_max });
    }
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(SNAPSHOT_MAGIC);
    header.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    header.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.write_all(&header)?;
    out.write_all(&payload)?;
    Ok(())
}

/// Reads and checks a snapshot of at most `bytes_max` bytes.
pub fn read_image(input: &mut dyn Read, bytes_max: usize) -> Result<MachineImage, StateMachineError> {
    let mut header = [0u8; HEADER_BYTES];
    input.read_exact(&mut header).map_err(|e| bad(format!("header: {e}")))?;
    if &header[..8] != SNAPSHOT_MAGIC {
        return Err(bad("not a namespace snapshot (magic)"));
    }
    let version = u16::from_le_bytes([header[8], header[9]]);
    if version != SNAPSHOT_VERSION {
        return Err(bad(format!("version {version}, this build reads {SNAPSHOT_VERSION}")));
    }
    let crc = u32::from_le_bytes([header[10], header[11], header[12], header[13]]);
    let mut length_bytes = [0u8; 8];
    length_bytes.copy_from_slice(&header[14..22]);
    let length = u64::from_le_bytes(length_bytes);
    if length > bytes_max.saturating_sub(HEADER_BYTES) as u64 {
        return Err(StateMachineError::SnapshotTooLarge { bytes_max });
    }
    let mut payload = Vec::new();
    input.take(length).read_to_end(&mut payload)?;
    if payload.len() as u64 != length {
        return Err(bad(format!("payload of {} bytes, the header says {length}", payload.len())));
    }
    let computed = crc32c::crc32c(&payload);
    if computed != crc {
        return Err(bad(format!("checksum {computed:#x} does not match {crc:#x}")));
    }
    postcard::from_bytes(&payload).map_err(|e| bad(format!("payload: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> MachineImage {
        let mut session = Session::default();
        session.replies.insert(3, vec![1, 2, 3]);
        MachineImage {
            born: true,
            replies: ReplyMeta { next_session_id: 4, clock_ms: 99 },
            sessions: vec![(1, session)],
            namespace: NamespaceImage::fresh([7; 16], 5),
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_every_flipped_byte_is_caught() {
        let mut bytes = Vec::new();
        write_image(&mut bytes, &image(), 1 << 20).unwrap();
        assert_eq!(read_image(&mut bytes.as_slice(), 1 << 20).unwrap(), image());
        for i in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[i] ^= 0x21;
            assert!(read_image(&mut flipped.as_slice(), 1 << 20).is_err(), "flip at byte {i} not caught");
        }
        assert!(read_image(&mut &bytes[..bytes.len() - 1], 1 << 20).is_err(), "a short snapshot");
        assert!(matches!(
            read_image(&mut bytes.as_slice(), bytes.len() - 1),
            Err(StateMachineError::SnapshotTooLarge { .. })
        ));
        assert!(matches!(
            write_image(&mut Vec::new(), &image(), 10),
            Err(StateMachineError::SnapshotTooLarge { .. })
        ));
    }
}
