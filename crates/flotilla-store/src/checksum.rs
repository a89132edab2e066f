//! Per-block CRC32C of fork data: the pure rules, no I/O.
//!
//! A fork is cut into checksum blocks of `checksum_block_bytes` (fixed per target) from
//! offset 0. Block `i`'s entry in the fork's checksum file is the CRC32C of the block as it
//! lies on disk, zero-padded to the full block length when the fork ends inside it.
//!
//! An entry of 0 also stands for "never written": a block whose entry is 0 is accepted when
//! its bytes are all zeros (a hole, or space past the end) or when its CRC32C happens to be 0.
//! Any other mismatch is a checksum error. So a torn write can never pass: a block that holds
//! bytes the entry does not describe fails unless those bytes are all zeros and the entry
//! was never written.

/// Bytes of one checksum entry in a checksum file (little-endian `u32`).
pub const CHECKSUM_ENTRY_BYTES: u64 = 4;

/// A block of zeros to pad partial blocks with, without allocating.
const ZEROS: [u8; 4096] = [0u8; 4096];

/// The CRC32C of `data` zero-padded to `block_bytes` (`data.len() <= block_bytes`).
pub(crate) fn block_crc(data: &[u8], block_bytes: usize) -> u32 {
    debug_assert!(data.len() <= block_bytes);
    let mut crc = crc32c::crc32c(data);
    let mut missing = block_bytes - data.len();
    while missing > 0 {
        let step = missing.min(ZEROS.len());
        crc = crc32c::crc32c_append(crc, &ZEROS[..step]);
        missing -= step;
    }
    crc
}

/// The entries of `data`, which starts at a checksum block boundary; its last block may be
/// partial (the end of the fork) and is zero-padded.
pub(crate) fn crcs_of(data: &[u8], block_bytes: usize, out: &mut Vec<u32>) {
    out.extend(data.chunks(block_bytes).map(|chunk| block_crc(chunk, block_bytes)));
}

/// Whether a whole block's bytes match its stored entry (see the module doc for entry 0).
pub(crate) fn block_matches(data: &[u8], stored: u32) -> Result<(), u32> {
    let computed = crc32c::crc32c(data);
    if computed == stored || (stored == 0 && data.iter().all(|byte| *byte == 0)) {
        return Ok(());
    }
    Err(computed)
}

/// Encodes entries for the checksum file.
pub(crate) fn encode(entries: &[u32]) -> Vec<u8> {
    entries.iter().flat_map(|entry| entry.to_le_bytes()).collect()
}

/// Decodes entries from the checksum file; `bytes.len()` is a multiple of 4.
pub(crate) fn decode(bytes: &[u8], out: &mut [u32]) {
    for (entry, chunk) in out.iter_mut().zip(bytes.chunks_exact(CHECKSUM_ENTRY_BYTES as usize)) {
        *entry = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_entry_means_unwritten_and_accepts_only_zeros() {
        assert_eq!(block_matches(&[0u8; 512], 0), Ok(()));
        assert!(block_matches(&[1u8; 512], 0).is_err());
        let crc = block_crc(&[0u8; 512], 512);
        assert_eq!(block_matches(&[0u8; 512], crc), Ok(()));
    }

    proptest! {
        #[test]
        fn padded_crc_equals_crc_of_the_padded_block(data in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let block_bytes = 8192usize.max(data.len().next_power_of_two());
            let mut padded = data.clone();
            padded.resize(block_bytes, 0);
            prop_assert_eq!(block_crc(&data, block_bytes), crc32c::crc32c(&padded));
            prop_assert_eq!(block_matches(&padded, block_crc(&data, block_bytes)), Ok(()));
        }

        #[test]
        fn any_single_byte_change_is_caught(
            data in proptest::collection::vec(any::<u8>(), 512),
            at in 0usize..512,
            flip in 1u8..=255,
        ) {
            let stored = block_crc(&data, 512);
            let mut changed = data.clone();
            changed[at] ^= flip;
            prop_assert!(block_matches(&changed, stored).is_err());
        }

        #[test]
        fn entries_round_trip(entries in proptest::collection::vec(any::<u32>(), 0..64)) {
            let mut back = vec![0u32; entries.len()];
            decode(&encode(&entries), &mut back);
            prop_assert_eq!(back, entries);
        }
    }
}
