//! The bytes the benchmarks store: a pattern of (seed, place, offset), so that every client
//! can check every byte it reads, and the driver every byte that was written, without
//! keeping a copy.

use super::plan::{Io, Place};
use flotilla_client::Shape;

/// The key of the pattern stored with `seed` at `place`; local files hold what the fork of
/// the same index holds.
pub fn pattern_key(seed: u64, place: Place) -> u64 {
    match place {
        Place::Linear => seed << 32,
        Place::Fork(subfile) | Place::Local(subfile) => (seed << 32) | (u64::from(subfile) + 1),
    }
}

/// The multiplier that spreads offsets over byte values.
const OFFSET_MULTIPLIER: u64 = 2_654_435_761;

/// The byte every pattern byte of `key` is xored with.
fn key_byte(key: u64) -> u8 {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (key >> 32) as u8
}

/// The byte at `offset` under `key`. Keys of different seeds differ in every byte.
pub fn pattern_byte(key: u64, offset: u64) -> u8 {
    ((offset.wrapping_mul(OFFSET_MULTIPLIER) >> 13) as u8) ^ key_byte(key)
}

/// The pattern byte is bits 13..21 of the offset's product, which the offset's low 21 bits
/// determine: the pattern of a key repeats every 2 MiB.
const PERIOD_BYTES: usize = 1 << 21;

/// One period of the pattern under a zero key byte, and 1 MiB more, so that every piece of
/// up to 1 MiB is one run of it.
const TABLE_BYTES: usize = PERIOD_BYTES + (1 << 20);

/// The pattern made once per process: filling and checking are then a copy and a compare
/// against it (xored with the key's byte), 3.5× and 1.4× faster than computing every byte's
/// product, and the benchmark's own work competes less with the client and servers for the
/// CPU.
static TABLE: std::sync::LazyLock<Box<[u8]>> = std::sync::LazyLock::new(|| {
    let mut table = vec![0u8; TABLE_BYTES];
    fill_computed(0, 0, &mut table);
    table.into_boxed_slice()
});

/// Makes the pattern's table now: a worker calls this before it says `ready`, so that the
/// table's first use (3 MiB computed and faulted in) does not fall inside a timed transfer,
/// where, although left out of the process's own time, it takes the CPU from the others'.
pub fn prepare() {
    std::sync::LazyLock::force(&TABLE);
}

/// Calls `visit(table run, buffer range)` for runs of the table that hold the pattern (under a
/// zero key byte) of the buffer read from `offset`, in order, covering the buffer.
fn for_each_table_run(offset: u64, length: usize, mut visit: impl FnMut(&[u8], std::ops::Range<usize>)) {
    let table: &[u8] = &TABLE;
    let mut done = 0;
    while done < length {
        let position = (offset.wrapping_add(done as u64) % PERIOD_BYTES as u64) as usize;
        let run = (length - done).min(TABLE_BYTES - position);
        visit(&table[position..position + run], done..done + run);
        done += run;
    }
}

/// Whether `buffer` (read from `offset`) holds the pattern of `key`: one pass over it and
/// the table, differences ored together (no branch per byte, so it vectorizes).
fn holds_pattern(key: u64, offset: u64, buffer: &[u8]) -> bool {
    let key_byte = key_byte(key);
    let mut differs = 0u8;
    for_each_table_run(offset, buffer.len(), |run, range| {
        differs |= differences(&buffer[range], run, key_byte);
    });
    differs == 0
}

/// The bits in which `bytes` differ from a run of the table under `key_byte`, ored together
/// (zero when they hold the pattern): no branch per byte, so it vectorizes.
#[inline(always)]
fn differences(bytes: &[u8], run: &[u8], key_byte: u8) -> u8 {
    bytes.iter().zip(run).fold(0, |differs, (byte, expected)| differs | (*byte ^ *expected ^ key_byte))
}

/// Fills `buffer` with the pattern of `key` from `offset` on, from the table.
pub fn fill(key: u64, offset: u64, buffer: &mut [u8]) {
    let key_byte = key_byte(key);
    let length = buffer.len();
    for_each_table_run(offset, length, |run, range| {
        for (byte, expected) in buffer[range].iter_mut().zip(run) {
            *byte = *expected ^ key_byte;
        }
    });
}

/// Fills `buffer` with the pattern of `key` from `offset` on, computing every byte: what
/// the table is made from. The products are computed in 32-bit lanes (the pattern byte
/// depends on the product's low 32 bits only); wrapping arithmetic keeps
/// `base + index * multiplier` equal to the product's low 32 bits.
fn fill_computed(key: u64, offset: u64, buffer: &mut [u8]) {
    let key_byte = key_byte(key);
    let multiplier = OFFSET_MULTIPLIER as u32;
    let base = (offset as u32).wrapping_mul(multiplier);
    for (index, byte) in buffer.iter_mut().enumerate() {
        let product = base.wrapping_add((index as u32).wrapping_mul(multiplier));
        *byte = (product >> 13) as u8 ^ key_byte;
    }
}

/// The first offset in `buffer` (read from `offset`) that does not hold the pattern.
pub fn first_mismatch(key: u64, offset: u64, buffer: &[u8]) -> Option<u64> {
    if holds_pattern(key, offset, buffer) {
        return None;
    }
    buffer
        .iter()
        .enumerate()
        .find(|(index, byte)| **byte != pattern_byte(key, offset.wrapping_add(*index as u64)))
        .map(|(index, _)| offset.wrapping_add(index as u64))
}

/// Writes the data a write request carries into its buffer.
pub fn fill_request(io: &Io, buffer: &mut [u8]) -> anyhow::Result<()> {
    let key = pattern_key(io.seed, io.place);
    for_each_piece(&io.shape, |file_offset, memory_offset, length| {
        fill(key, file_offset, &mut buffer[memory_offset..memory_offset + length]);
        Ok(())
    })
}

/// Checks what a read request brought back.
pub fn check_request(io: &Io, buffer: &[u8]) -> anyhow::Result<()> {
    let key = pattern_key(io.seed, io.place);
    if strided_holds_pattern(key, &io.shape, buffer) == Some(true) {
        return Ok(());
    }
    // Any other shape, or a strided one that failed: piece by piece, naming the first bad byte.
    for_each_piece(&io.shape, |file_offset, memory_offset, length| {
        match first_mismatch(key, file_offset, &buffer[memory_offset..memory_offset + length]) {
            None => Ok(()),
            Some(bad) => {
                Err(anyhow::anyhow!("{:?} byte {bad} does not hold seed {}'s data", io.place, io.seed))
            }
        }
    })
}

/// Whether a one-level strided read with records of at most 1 MiB holds the pattern of
/// `key`: every record compared with its run of the table in one loop, with no call per
/// record (the interleaved benchmark checks 64-byte records by the hundred thousand, on the
/// cores the clients and servers share). `None` for any other shape, for negative strides
/// and for offsets that do not fit in memory.
fn strided_holds_pattern(key: u64, shape: &Shape, buffer: &[u8]) -> Option<bool> {
    let Shape::Strided { file_offset, memory_offset, record_bytes, file_stride, memory_stride, count } =
        *shape
    else {
        return None;
    };
    let (record, file_stride, memory_stride) = (
        usize::try_from(record_bytes).ok()?,
        u64::try_from(file_stride).ok()?,
        usize::try_from(memory_stride).ok()?,
    );
    if record > TABLE_BYTES - PERIOD_BYTES {
        return None;
    }
    let last = usize::try_from(count.checked_sub(1)?).ok()?;
    let memory_end = usize::try_from(memory_offset)
        .ok()?
        .checked_add(last.checked_mul(memory_stride)?)?
        .checked_add(record)?;
    if memory_end > buffer.len() {
        return None;
    }
    let (table, key_byte): (&[u8], u8) = (&TABLE, key_byte(key));
    let mut differs = 0u8;
    let mut memory = memory_offset as usize;
    let mut file = file_offset;
    for _ in 0..count {
        let position = (file % PERIOD_BYTES as u64) as usize;
        differs |=
            differences(&buffer[memory..memory + record], &table[position..position + record], key_byte);
        memory += memory_stride;
        file = file.wrapping_add(file_stride);
    }
    Some(differs == 0)
}

fn for_each_piece(
    shape: &Shape,
    mut visit: impl FnMut(u64, usize, usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Shape::Contiguous { file_offset, memory_offset, length } = shape {
        return visit(*file_offset, *memory_offset as usize, *length as usize);
    }
    let mut outcome = Ok(());
    shape.for_each_piece(|piece| {
        if outcome.is_ok() {
            outcome = visit(piece.file_offset, piece.memory_offset as usize, piece.length as usize);
        }
        Ok::<(), flotilla_client::ClientError>(())
    })?;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::{SEED_INITIAL, SEED_WRITTEN};

    #[test]
    fn seeds_and_places_differ_in_every_byte() {
        for place in [Place::Linear, Place::Fork(0), Place::Fork(7), Place::Local(7)] {
            let (old, new) = (pattern_key(SEED_INITIAL, place), pattern_key(SEED_WRITTEN, place));
            assert!((0..4096).all(|offset| pattern_byte(old, offset) != pattern_byte(new, offset)));
        }
        assert_eq!(pattern_key(1, Place::Fork(3)), pattern_key(1, Place::Local(3)));
        assert_ne!(pattern_key(1, Place::Fork(3)), pattern_key(1, Place::Fork(4)));
    }

    #[test]
    fn fill_then_check_and_find_a_bad_byte() {
        let io = Io {
            place: Place::Fork(2),
            shape: Shape::Strided {
                file_offset: 10,
                memory_offset: 0,
                record_bytes: 4,
                file_stride: 16,
                memory_stride: 4,
                count: 8,
            },
            write: false,
            seed: 1,
            nonblocking: false,
        };
        let mut buffer = vec![0u8; 32];
        fill_request(&io, &mut buffer).unwrap();
        check_request(&io, &buffer).unwrap();
        buffer[13] ^= 1;
        assert!(check_request(&io, &buffer).is_err());
    }

    /// The strided check's one loop agrees with the piece-by-piece check, and a bad byte in
    /// any record (first, middle, last) or a record of another seed is found.
    #[test]
    fn the_strided_check_agrees_with_the_piece_by_piece_one() {
        let shapes = [
            (0u64, 64u64, 256i64, 64i64, 1024u64),
            (10, 64, 256, 64, 16384),
            ((1 << 32) - 700, 100, 300, 128, 500),
            ((1 << 62) + 12_345, 64, 256, 64, 100),
            (PERIOD_BYTES as u64 - 30, 1 << 20, (1 << 20) + 8, 1 << 20, 3),
        ];
        for (file_offset, record_bytes, file_stride, memory_stride, count) in shapes {
            let shape = Shape::Strided {
                file_offset,
                memory_offset: 8,
                record_bytes,
                file_stride,
                memory_stride,
                count,
            };
            let io =
                Io { place: Place::Fork(3), shape, write: false, seed: SEED_WRITTEN, nonblocking: false };
            let mut buffer =
                vec![0u8; 8 + (count as usize - 1) * memory_stride as usize + record_bytes as usize];
            fill_request(&io, &mut buffer).unwrap();
            let key = pattern_key(io.seed, io.place);
            assert_eq!(strided_holds_pattern(key, &io.shape, &buffer), Some(true), "{:?}", io.shape);
            check_request(&io, &buffer).unwrap();
            let records = [0, count as usize / 2, count as usize - 1];
            for (record, at) in
                records.iter().flat_map(|r| [0, record_bytes as usize - 1].map(move |a| (*r, a)))
            {
                let mut broken = buffer.clone();
                broken[8 + record * memory_stride as usize + at] ^= 0x10;
                assert_eq!(
                    strided_holds_pattern(key, &io.shape, &broken),
                    Some(false),
                    "record {record} byte {at}"
                );
                assert!(check_request(&io, &broken).is_err(), "record {record} byte {at}");
            }
            let other = pattern_key(SEED_INITIAL, io.place);
            assert_eq!(strided_holds_pattern(other, &io.shape, &buffer), Some(false));
        }
        let negative = Shape::Strided {
            file_offset: 1 << 20,
            memory_offset: 0,
            record_bytes: 64,
            file_stride: -256,
            memory_stride: 64,
            count: 4,
        };
        assert_eq!(strided_holds_pattern(1, &negative, &[0u8; 256]), None);
        let short = Shape::Strided {
            file_offset: 0,
            memory_offset: 0,
            record_bytes: 64,
            file_stride: 256,
            memory_stride: 64,
            count: 4,
        };
        assert_eq!(
            strided_holds_pattern(1, &short, &[0u8; 255]),
            None,
            "a buffer too short is not read past"
        );
    }

    #[test]
    fn fill_agrees_with_the_byte_pattern_across_32_bit_wraps() {
        let key = pattern_key(SEED_WRITTEN, Place::Fork(5));
        for offset in [0u64, 7, (1 << 32) - 3000, 1 << 32, (5 << 32) + 12345, u64::MAX - 10_000] {
            let mut buffer = vec![0u8; 9000];
            fill(key, offset, &mut buffer);
            for (index, byte) in buffer.iter().enumerate() {
                assert_eq!(
                    *byte,
                    pattern_byte(key, offset.wrapping_add(index as u64)),
                    "offset {offset} + {index}"
                );
            }
        }
    }

    #[test]
    fn the_one_pass_check_agrees_with_the_byte_by_byte_one() {
        let key = pattern_key(SEED_INITIAL, Place::Fork(1));
        for offset in [0u64, 1, 63, 4096, 1 << 40] {
            let mut buffer = vec![0u8; 257];
            fill(key, offset, &mut buffer);
            assert!(holds_pattern(key, offset, &buffer));
            assert_eq!(first_mismatch(key, offset, &buffer), None);
            for bad in [0usize, 1, 31, 32, 200, 256] {
                let mut broken = buffer.clone();
                broken[bad] ^= 0x80;
                assert!(!holds_pattern(key, offset, &broken));
                assert_eq!(first_mismatch(key, offset, &broken), Some(offset + bad as u64));
            }
        }
    }

    #[test]
    fn the_table_fill_agrees_with_the_computed_one_across_periods() {
        let key = pattern_key(SEED_WRITTEN, Place::Fork(9));
        let lengths = [1usize, 4095, 1 << 20, (1 << 20) + 1, PERIOD_BYTES + 77, TABLE_BYTES + 4099];
        let offsets = [0u64, 5, (PERIOD_BYTES as u64) - 3, (1 << 32) - 1000, u64::MAX - 6000];
        for (length, offset) in lengths.iter().flat_map(|l| offsets.iter().map(move |o| (*l, *o))) {
            let (mut from_table, mut computed) = (vec![0u8; length], vec![0u8; length]);
            fill(key, offset, &mut from_table);
            fill_computed(key, offset, &mut computed);
            assert!(from_table == computed, "offset {offset} length {length}");
            assert!(holds_pattern(key, offset, &computed));
            let last = length - 1;
            computed[last] ^= 0x01;
            assert!(!holds_pattern(key, offset, &computed), "offset {offset} length {length}");
            assert_eq!(first_mismatch(key, offset, &computed), Some(offset.wrapping_add(last as u64)));
        }
    }
}
