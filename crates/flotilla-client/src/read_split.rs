//! One large read of a replicated subfile spread over its chain's serving members (issue 32,
//! CRAQ-style reads): the pure part, no I/O.
//!
//! Any serving member may answer a read: the head acknowledges a change only once every
//! member applied it, and a server answers a chained read only while it is `Serving` under
//! exactly the chain version the client sends (`flotilla-server` `chain_write::fence_chained`:
//! never at a fenced, syncing or stale member). So a read of a chained subfile is cut into
//! as many parts as the chain has healthy serving members (each part at least
//! [`READ_PART_BYTES_MIN`], so small reads stay one request), each part sent, and failed over,
//! on its own (`file.rs` `read_linear`); the client's turn-taking over the members
//! (`replicas.rs`) sends consecutive parts to different members. Without it a file with
//! `replicas=2` over four servers has half as many subfiles as a plain one, and every read
//! of it kept half the servers idle.

use flotilla_request::Piece;

/// The smallest part a chained read is cut into (bytes): below it one member answers.
pub const READ_PART_BYTES_MIN: u64 = 1 << 20;

/// How many parts a read of `total_bytes` takes over `readers` healthy serving members,
/// none smaller than `part_bytes_min` (at least one part).
pub(crate) fn read_parts(total_bytes: u64, readers: usize, part_bytes_min: u64) -> usize {
    let by_size = (total_bytes / part_bytes_min.max(1)).max(1);
    usize::try_from((readers.max(1) as u64).min(by_size)).unwrap_or(1)
}

/// Cuts `pieces`, in order, into `parts` lists of about equal bytes (they differ by at most
/// one byte), a piece split where a part's end falls inside it. Empty pieces are dropped;
/// with no bytes at all the pieces come back as one list.
pub(crate) fn split_pieces(pieces: &[Piece], parts: usize) -> Vec<Vec<Piece>> {
    let total: u64 = pieces.iter().map(|p| p.length).sum();
    if total == 0 {
        return vec![pieces.to_vec()];
    }
    if parts <= 1 {
        return vec![pieces.iter().filter(|p| p.length > 0).copied().collect()];
    }
    let parts = (parts as u64).min(total);
    // Part `index` ends at byte total * (index + 1) / parts of the read (strictly increasing,
    // since parts <= total; the last is total).
    let end_of = |index: u64| u64::try_from(u128::from(total) * u128::from(index + 1) / u128::from(parts));
    let mut lists = Vec::with_capacity(parts as usize);
    let mut current = Vec::new();
    let (mut done, mut index) = (0u64, 0u64);
    let mut end = end_of(0).unwrap_or(total);
    for piece in pieces {
        let mut rest = *piece;
        while rest.length > 0 {
            if done == end {
                lists.push(std::mem::take(&mut current));
                index += 1;
                end = end_of(index).unwrap_or(total);
            }
            let length = rest.length.min(end - done);
            current.push(Piece { length, ..rest });
            done += length;
            rest = Piece {
                file_offset: rest.file_offset + length,
                memory_offset: rest.memory_offset + length,
                length: rest.length - length,
            };
        }
    }
    if !current.is_empty() {
        lists.push(current);
    }
    lists
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pieces with neighbours joined where they follow each other in the file and in memory.
    fn joined(pieces: impl IntoIterator<Item = Piece>) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for piece in pieces.into_iter().filter(|p| p.length > 0) {
            match out.last_mut() {
                Some(last)
                    if last.file_offset + last.length == piece.file_offset
                        && last.memory_offset + last.length == piece.memory_offset =>
                {
                    last.length += piece.length;
                }
                _ => out.push(piece),
            }
        }
        out
    }

    #[test]
    fn small_reads_stay_whole_and_large_ones_take_every_reader() {
        let mib = 1 << 20;
        assert_eq!(read_parts(0, 2, mib), 1);
        assert_eq!(read_parts(mib - 1, 2, mib), 1, "below the minimum: one member");
        assert_eq!(read_parts(2 * mib, 2, mib), 2);
        assert_eq!(read_parts(8 * mib, 2, mib), 2, "never more parts than readers");
        assert_eq!(read_parts(8 * mib, 3, mib), 3);
        assert_eq!(read_parts(8 * mib, 0, mib), 1, "no reader known: one part, as before");
        assert_eq!(read_parts(8 * mib, 4, 0), 4);
    }

    #[test]
    fn a_piece_is_cut_where_a_part_ends() {
        let pieces = [
            Piece { file_offset: 100, memory_offset: 0, length: 3 },
            Piece { file_offset: 200, memory_offset: 3, length: 5 },
        ];
        let parts = split_pieces(&pieces, 2);
        assert_eq!(
            parts,
            vec![
                vec![
                    Piece { file_offset: 100, memory_offset: 0, length: 3 },
                    Piece { file_offset: 200, memory_offset: 3, length: 1 }
                ],
                vec![Piece { file_offset: 201, memory_offset: 4, length: 4 }],
            ]
        );
        assert_eq!(split_pieces(&pieces, 1), vec![pieces.to_vec()]);
        let with_empty = [Piece { file_offset: 0, memory_offset: 0, length: 0 }, pieces[0]];
        assert_eq!(
            split_pieces(&with_empty, 1),
            vec![vec![pieces[0]]],
            "an empty piece is dropped in one part too"
        );
        assert_eq!(split_pieces(&[], 3), vec![Vec::<Piece>::new()]);
    }

    proptest! {
        #[test]
        fn parts_keep_every_byte_in_order_and_are_even(
            lengths in proptest::collection::vec(0u64..5000, 1..20),
            gaps in proptest::collection::vec(0u64..100, 20),
            parts in 1usize..6,
        ) {
            let (mut file_offset, mut memory_offset) = (0u64, 0u64);
            let pieces: Vec<Piece> = lengths.iter().zip(&gaps).map(|(&length, &gap)| {
                file_offset += gap;
                let piece = Piece { file_offset, memory_offset, length };
                file_offset += length;
                memory_offset += length + gap / 2;
                piece
            }).collect();
            let total: u64 = lengths.iter().sum();
            let lists = split_pieces(&pieces, parts);
            prop_assert_eq!(joined(lists.iter().flatten().copied()), joined(pieces.iter().copied()));
            if total > 0 {
                let expected = (parts as u64).min(total);
                prop_assert_eq!(lists.len() as u64, expected);
                let sizes: Vec<u64> = lists.iter().map(|l| l.iter().map(|p| p.length).sum()).collect();
                let (low, high) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                prop_assert!(high - low <= 1, "uneven parts: {:?}", sizes);
                prop_assert!(lists.iter().flatten().all(|p| p.length > 0));
            }
        }
    }
}
