//! The byte layout of a `lines` target's image (pure: encoding, decoding, geometry; no I/O).
//! See `docs/target-format.md`, section "lines targets".
//!
//! - Superblock (`SUPERBLOCK_BYTES` at offset 0): magic, version, block size, blocks per
//!   line, line count, descriptor copy size, CRC32C of the bytes before it.
//! - Then `line_count` lines, each: descriptor copy A, descriptor copy B (each
//!   `descriptor_copy_bytes`), then `line_blocks` block slots of `block_bytes`.
//! - A descriptor copy: a header (magic, line index, entry count, sequence number, CRC32C
//!   over the header with the CRC field zero and all entries) and one `ENTRY_BYTES` entry
//!   per slot. The valid copy with the higher sequence number is the line's descriptor.

use std::fmt;

/// Bytes of the superblock at the start of the image.
pub const SUPERBLOCK_BYTES: u64 = 4096;
/// The superblock's magic bytes.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"FLOLINES";
/// The only superblock version this code reads and writes.
pub const LINES_FORMAT_VERSION: u32 = 1;
/// The descriptor copies' magic bytes.
pub const DESCRIPTOR_MAGIC: [u8; 8] = *b"FLODESC1";
/// Bytes of a descriptor copy's header.
pub const DESCRIPTOR_HEADER_BYTES: usize = 32;
/// Bytes of one descriptor entry.
pub const ENTRY_BYTES: usize = 32;
/// Descriptor copies are padded to a multiple of this.
pub const DESCRIPTOR_ALIGN_BYTES: u64 = 4096;
/// Smallest and largest block size a lines target may be formatted with.
pub const LINES_BLOCK_BYTES_MIN: u64 = 512;
pub const LINES_BLOCK_BYTES_MAX: u64 = 16 << 20;
/// Most blocks per line (the descriptor of one line is read and written whole).
pub const LINE_BLOCKS_MAX: u32 = 65_536;

/// Why bytes on disk could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

fn bad<T>(reason: impl Into<String>) -> Result<T, FormatError> {
    Err(FormatError(reason.into()))
}

/// The settings fixed at format time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    pub line_blocks: u32,
    pub line_count: u32,
    /// RAMA's sequentiality: this many consecutive blocks of a fork go to one line.
    pub group_blocks: u32,
}

impl Geometry {
    /// The geometry with as many whole lines as fit in `capacity_bytes`.
    pub fn for_capacity(
        capacity_bytes: u64,
        block_bytes: u64,
        line_blocks: u32,
        group_blocks: u32,
    ) -> Result<Geometry, FormatError> {
        if !(LINES_BLOCK_BYTES_MIN..=LINES_BLOCK_BYTES_MAX).contains(&block_bytes)
            || !block_bytes.is_power_of_two()
        {
            return bad(format!(
                "block size {block_bytes} must be a power of two in {LINES_BLOCK_BYTES_MIN}..={LINES_BLOCK_BYTES_MAX}"
            ));
        }
        if line_blocks == 0 || line_blocks > LINE_BLOCKS_MAX {
            return bad(format!("blocks per line {line_blocks} must be in 1..={LINE_BLOCKS_MAX}"));
        }
        if group_blocks == 0 || group_blocks > line_blocks {
            return bad(format!(
                "blocks per group {group_blocks} must be in 1..=blocks per line {line_blocks}"
            ));
        }
        let probe = Geometry { block_bytes: block_bytes as u32, line_blocks, line_count: 1, group_blocks };
        let lines = capacity_bytes.saturating_sub(SUPERBLOCK_BYTES) / probe.line_bytes();
        if lines == 0 || lines > u64::from(u32::MAX) {
            return bad(format!(
                "capacity {capacity_bytes} bytes holds {lines} lines of {} bytes (need 1..=2^32-1)",
                probe.line_bytes()
            ));
        }
        Ok(Geometry { line_count: lines as u32, ..probe })
    }

    /// Bytes of one descriptor copy (header and entries, padded).
    pub fn descriptor_copy_bytes(&self) -> u64 {
        let raw = (DESCRIPTOR_HEADER_BYTES + ENTRY_BYTES * self.line_blocks as usize) as u64;
        raw.next_multiple_of(DESCRIPTOR_ALIGN_BYTES)
    }

    /// Bytes of one line: two descriptor copies and the block slots.
    pub fn line_bytes(&self) -> u64 {
        2 * self.descriptor_copy_bytes() + u64::from(self.line_blocks) * u64::from(self.block_bytes)
    }

    /// Bytes of the whole image.
    pub fn image_bytes(&self) -> u64 {
        SUPERBLOCK_BYTES + u64::from(self.line_count) * self.line_bytes()
    }

    /// Offset of descriptor copy `copy` (0 = A, 1 = B) of `line`.
    pub fn descriptor_offset(&self, line: u32, copy: u8) -> u64 {
        SUPERBLOCK_BYTES
            + u64::from(line) * self.line_bytes()
            + u64::from(copy) * self.descriptor_copy_bytes()
    }

    /// Offset of block slot `slot` of `line`.
    pub fn slot_offset(&self, line: u32, slot: u32) -> u64 {
        self.descriptor_offset(line, 2) + u64::from(slot) * u64::from(self.block_bytes)
    }

    /// Bytes of all descriptor copies (what recovery reads).
    pub fn descriptor_area_bytes(&self) -> u64 {
        2 * u64::from(self.line_count) * self.descriptor_copy_bytes()
    }

    /// Total block slots.
    pub fn slots(&self) -> u64 {
        u64::from(self.line_count) * u64::from(self.line_blocks)
    }
}

/// Encodes the superblock (`SUPERBLOCK_BYTES` long).
pub fn encode_superblock(geometry: &Geometry) -> Vec<u8> {
    let mut bytes = vec![0u8; SUPERBLOCK_BYTES as usize];
    bytes[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
    bytes[8..12].copy_from_slice(&LINES_FORMAT_VERSION.to_le_bytes());
    bytes[12..16].copy_from_slice(&geometry.block_bytes.to_le_bytes());
    bytes[16..20].copy_from_slice(&geometry.line_blocks.to_le_bytes());
    bytes[20..24].copy_from_slice(&geometry.line_count.to_le_bytes());
    bytes[24..32].copy_from_slice(&geometry.descriptor_copy_bytes().to_le_bytes());
    bytes[32..36].copy_from_slice(&geometry.group_blocks.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[0..36]);
    bytes[36..40].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// Decodes and checks a superblock.
pub fn decode_superblock(bytes: &[u8]) -> Result<Geometry, FormatError> {
    if bytes.len() < 40 {
        return bad(format!("superblock is {} bytes, need 40", bytes.len()));
    }
    if bytes[0..8] != SUPERBLOCK_MAGIC {
        return bad("superblock magic is not FLOLINES (not a formatted lines target)");
    }
    let stored = le_u32(&bytes[36..40]);
    let computed = crc32c::crc32c(&bytes[0..36]);
    if stored != computed {
        return bad(format!("superblock CRC32C is {stored:#010x}, its bytes have {computed:#010x}"));
    }
    let version = le_u32(&bytes[8..12]);
    if version != LINES_FORMAT_VERSION {
        return bad(format!("superblock version {version}, this build reads {LINES_FORMAT_VERSION}"));
    }
    let geometry = Geometry {
        block_bytes: le_u32(&bytes[12..16]),
        line_blocks: le_u32(&bytes[16..20]),
        line_count: le_u32(&bytes[20..24]),
        group_blocks: le_u32(&bytes[32..36]),
    };
    let checked = Geometry::for_capacity(
        geometry.image_bytes(),
        u64::from(geometry.block_bytes),
        geometry.line_blocks,
        geometry.group_blocks,
    )?;
    if checked != geometry || le_u64(&bytes[24..32]) != geometry.descriptor_copy_bytes() {
        return bad("superblock geometry is inconsistent");
    }
    Ok(geometry)
}

/// A block slot's state (RAMA §4.3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockState {
    /// Holds nothing; may be allocated.
    Free = 0,
    /// Holds a fork's block that exists nowhere else (written, not archived).
    Dirty = 1,
    /// Holds a fork's block that a tertiary copy also holds (may be reclaimed when space is
    /// needed); set by the migration manager after archiving, and by a recall.
    Clean = 2,
    /// Held a block that now lives elsewhere (moved by reorganization, or dropped by a
    /// truncation or removal); not reused until the descriptor saying so is durable.
    Reclaimable = 3,
}

impl BlockState {
    fn from_byte(byte: u8) -> Result<BlockState, FormatError> {
        Ok(match byte {
            0 => BlockState::Free,
            1 => BlockState::Dirty,
            2 => BlockState::Clean,
            3 => BlockState::Reclaimable,
            other => return bad(format!("block state {other} is not 0..=3")),
        })
    }

    /// Whether a slot in this state holds a fork's block.
    pub fn holds_block(self) -> bool {
        matches!(self, BlockState::Dirty | BlockState::Clean)
    }
}

/// A fork's identity on a lines target: its file, subfile and the CRC32C of its name (two
/// forks of one subfile whose names have the same CRC32C cannot both exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForkKey {
    pub file: u64,
    pub subfile: u32,
    pub fork_tag: u32,
}

impl ForkKey {
    pub fn new(file: u64, subfile: u32, fork_name: &str) -> ForkKey {
        ForkKey { file, subfile, fork_tag: crc32c::crc32c(fork_name.as_bytes()) }
    }
}

/// One descriptor entry: what a block slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: ForkKey,
    pub block: u64,
    /// Seconds since the Unix epoch when the block was last written (its age, for migration).
    pub timestamp_s: u32,
    pub state: BlockState,
}

impl Entry {
    pub const FREE: Entry = Entry {
        key: ForkKey { file: 0, subfile: 0, fork_tag: 0 },
        block: 0,
        timestamp_s: 0,
        state: BlockState::Free,
    };

    fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.key.file.to_le_bytes());
        out[8..16].copy_from_slice(&self.block.to_le_bytes());
        out[16..20].copy_from_slice(&self.key.subfile.to_le_bytes());
        out[20..24].copy_from_slice(&self.key.fork_tag.to_le_bytes());
        out[24..28].copy_from_slice(&self.timestamp_s.to_le_bytes());
        out[28] = self.state as u8;
        out[29..32].fill(0);
    }

    fn decode(bytes: &[u8]) -> Result<Entry, FormatError> {
        Ok(Entry {
            key: ForkKey {
                file: le_u64(&bytes[0..8]),
                subfile: le_u32(&bytes[16..20]),
                fork_tag: le_u32(&bytes[20..24]),
            },
            block: le_u64(&bytes[8..16]),
            timestamp_s: le_u32(&bytes[24..28]),
            state: BlockState::from_byte(bytes[28])?,
        })
    }
}

/// One decoded descriptor copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub line: u32,
    pub sequence: u64,
    pub entries: Vec<Entry>,
}

/// Encodes a descriptor copy, padded to `geometry.descriptor_copy_bytes()`.
pub fn encode_descriptor(geometry: &Geometry, descriptor: &Descriptor) -> Vec<u8> {
    let mut bytes = vec![0u8; geometry.descriptor_copy_bytes() as usize];
    bytes[0..8].copy_from_slice(&DESCRIPTOR_MAGIC);
    bytes[8..12].copy_from_slice(&descriptor.line.to_le_bytes());
    bytes[12..16].copy_from_slice(&(descriptor.entries.len() as u32).to_le_bytes());
    bytes[16..24].copy_from_slice(&descriptor.sequence.to_le_bytes());
    for (index, entry) in descriptor.entries.iter().enumerate() {
        let at = DESCRIPTOR_HEADER_BYTES + index * ENTRY_BYTES;
        entry.encode(&mut bytes[at..at + ENTRY_BYTES]);
    }
    let crc = crc32c::crc32c(&bytes);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// Decodes and checks a descriptor copy of `line` (any damage is an error).
pub fn decode_descriptor(geometry: &Geometry, line: u32, bytes: &[u8]) -> Result<Descriptor, FormatError> {
    if bytes.len() as u64 != geometry.descriptor_copy_bytes() {
        return bad(format!(
            "descriptor copy is {} bytes, need {}",
            bytes.len(),
            geometry.descriptor_copy_bytes()
        ));
    }
    if bytes[0..8] != DESCRIPTOR_MAGIC {
        return bad("descriptor magic is not FLODESC1");
    }
    let stored = le_u32(&bytes[24..28]);
    let mut copy = bytes.to_vec();
    copy[24..28].fill(0);
    let computed = crc32c::crc32c(&copy);
    if stored != computed {
        return bad(format!("descriptor CRC32C is {stored:#010x}, its bytes have {computed:#010x}"));
    }
    let named_line = le_u32(&bytes[8..12]);
    let count = le_u32(&bytes[12..16]);
    if named_line != line || count != geometry.line_blocks {
        return bad(format!("descriptor names line {named_line} with {count} entries, expected line {line}"));
    }
    let entries = (0..count as usize)
        .map(|index| {
            let at = DESCRIPTOR_HEADER_BYTES + index * ENTRY_BYTES;
            Entry::decode(&bytes[at..at + ENTRY_BYTES])
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Descriptor { line, sequence: le_u64(&bytes[16..24]), entries })
}

/// Of a line's two copies, the one to trust: the valid one with the higher sequence.
pub fn choose_descriptor(
    geometry: &Geometry,
    line: u32,
    copy_a: &[u8],
    copy_b: &[u8],
) -> Result<(u8, Descriptor), FormatError> {
    let a = decode_descriptor(geometry, line, copy_a);
    let b = decode_descriptor(geometry, line, copy_b);
    match (a, b) {
        (Ok(a), Ok(b)) if b.sequence > a.sequence => Ok((1, b)),
        (Ok(a), _) => Ok((0, a)),
        (Err(_), Ok(b)) => Ok((1, b)),
        (Err(a), Err(b)) => bad(format!("line {line}: both descriptor copies are damaged (A: {a}; B: {b})")),
    }
}

fn le_u32(bytes: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(raw)
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geometry() -> Geometry {
        Geometry::for_capacity(4 << 20, 4096, 64, 8).unwrap()
    }

    fn entry() -> impl Strategy<Value = Entry> {
        (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>(), any::<u32>(), 0u8..4).prop_map(
            |(file, subfile, fork_tag, block, timestamp_s, state)| Entry {
                key: ForkKey { file, subfile, fork_tag },
                block,
                timestamp_s,
                state: BlockState::from_byte(state).unwrap(),
            },
        )
    }

    proptest! {
        #[test]
        fn descriptors_round_trip_and_any_flipped_byte_is_caught(
            entries in prop::collection::vec(entry(), 64),
            sequence in any::<u64>(),
            flip in 0usize..(32 + 64 * 32),
        ) {
            let geometry = geometry();
            let descriptor = Descriptor { line: 3, sequence, entries };
            let bytes = encode_descriptor(&geometry, &descriptor);
            prop_assert_eq!(decode_descriptor(&geometry, 3, &bytes).unwrap(), descriptor.clone());
            prop_assert!(decode_descriptor(&geometry, 4, &bytes).is_err());
            let mut torn = bytes.clone();
            torn[flip] ^= 0x40;
            prop_assert!(decode_descriptor(&geometry, 3, &torn).is_err());
            // A torn newer copy falls back to the older valid one.
            let older = Descriptor { sequence: sequence.wrapping_sub(1), ..descriptor.clone() };
            let older_bytes = encode_descriptor(&geometry, &older);
            let (copy, chosen) = choose_descriptor(&geometry, 3, &older_bytes, &torn).unwrap();
            prop_assert_eq!(copy, 0);
            prop_assert_eq!(chosen, older);
        }

        #[test]
        fn superblocks_round_trip(block_shift in 9u32..20, line_blocks in 1u32..2048, lines in 1u64..64) {
            let probe = Geometry { block_bytes: 1 << block_shift, line_blocks, line_count: 1, group_blocks: 1 };
            let capacity = SUPERBLOCK_BYTES + lines * probe.line_bytes();
            let geometry = Geometry::for_capacity(capacity, 1 << block_shift, line_blocks, 1).unwrap();
            prop_assert_eq!(geometry.line_count as u64, lines);
            prop_assert_eq!(geometry.image_bytes(), capacity);
            prop_assert_eq!(decode_superblock(&encode_superblock(&geometry)).unwrap(), geometry);
        }
    }

    #[test]
    fn the_newer_valid_copy_wins_and_two_bad_copies_are_an_error() {
        let geometry = geometry();
        let old = Descriptor { line: 0, sequence: 5, entries: vec![Entry::FREE; 64] };
        let new = Descriptor { sequence: 6, ..old.clone() };
        let (a, b) = (encode_descriptor(&geometry, &old), encode_descriptor(&geometry, &new));
        assert_eq!(choose_descriptor(&geometry, 0, &a, &b).unwrap(), (1, new));
        let junk = vec![0u8; a.len()];
        let error = choose_descriptor(&geometry, 0, &junk, &junk).unwrap_err();
        assert!(error.0.contains("both descriptor copies are damaged"), "{error}");
        let mut superblock = encode_superblock(&geometry);
        superblock[13] ^= 1;
        assert!(decode_superblock(&superblock).unwrap_err().0.contains("CRC32C"));
        assert!(Geometry::for_capacity(1 << 20, 3000, 8, 1).is_err());
        assert!(Geometry::for_capacity(4096, 4096, 8, 1).is_err());
        assert!(Geometry::for_capacity(1 << 20, 4096, 8, 9).is_err());
    }
}
