//! Turning an extent list into blocks, a window at a time.
//!
//! A request's extents are walked as *pieces*: the part of one extent inside one block. A
//! window is the longest run of pieces, in extent order, that touches at most `blocks_max`
//! distinct blocks; a request that fits (the usual case) is one window, so all its misses go
//! to the disk scheduler together. Bounding the window keeps a huge request from pinning more
//! of the cache than it may.
//!
//! Cost: O(1) per piece with no allocation. Consecutive pieces in the same block (tiny
//! extents) reuse the last lookup; small windows are searched linearly; larger ones through
//! a hash index built once they grow past `LINEAR_SEARCH_MAX`.
//!
//! Invariants: `blocks` holds distinct block numbers in first-touch order; the window covers
//! the packed data bytes `start.data_offset..end.data_offset`; `covered_bytes` of a block is
//! a prefix of it known to be fully written by the request (used to skip read-modify-write;
//! it may undercount, never overcount).

use crate::extent::Extent;
use std::collections::HashMap;

const LINEAR_SEARCH_MAX: usize = 16;

/// Where a walk over the extents stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub extent_index: usize,
    pub offset_in_extent: u64,
    /// Offset of the next byte in the packed data buffer.
    pub data_offset: usize,
}

/// The part of one extent inside one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub block: u64,
    pub offset_in_block: usize,
    pub length: usize,
    pub data_offset: usize,
}

/// Iterates the pieces of an extent list from a cursor. Extents must be validated (no
/// overflow) and the total must fit in `usize`.
pub(crate) struct Pieces<'a> {
    extents: &'a [Extent],
    cursor: Cursor,
    block_shift: u32,
}

impl<'a> Pieces<'a> {
    pub(crate) fn new(extents: &'a [Extent], cursor: Cursor, block_shift: u32) -> Self {
        Self { extents, cursor, block_shift }
    }

    pub(crate) fn cursor(&self) -> Cursor {
        self.cursor
    }
}

impl Iterator for Pieces<'_> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let cursor = &mut self.cursor;
        loop {
            let extent = self.extents.get(cursor.extent_index)?;
            if cursor.offset_in_extent >= extent.length {
                cursor.extent_index += 1;
                cursor.offset_in_extent = 0;
                continue;
            }
            let offset = extent.offset + cursor.offset_in_extent;
            let block_bytes = 1u64 << self.block_shift;
            let offset_in_block = offset & (block_bytes - 1);
            let length = (extent.length - cursor.offset_in_extent).min(block_bytes - offset_in_block);
            let piece = Piece {
                block: offset >> self.block_shift,
                offset_in_block: offset_in_block as usize,
                length: length as usize,
                data_offset: cursor.data_offset,
            };
            cursor.offset_in_extent += length;
            cursor.data_offset += length as usize;
            return Some(piece);
        }
    }
}

/// What a request does to get a block's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockAction {
    /// It was in the cache (possibly still loading for another request).
    Hit,
    /// Read it from disk.
    Read,
    /// Nothing on disk is needed: past the end of the fork, or fully overwritten.
    Zero,
}

/// One distinct block of a window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WindowBlock {
    pub block: u64,
    pub slot: u32,
    pub action: BlockAction,
    pub covered_bytes: usize,
    /// The request copied data into it (writes).
    pub touched: bool,
}

/// The blocks of one window of a request.
#[derive(Debug)]
pub(crate) struct Window {
    pub blocks: Vec<WindowBlock>,
    index: HashMap<u64, u32>,
    last: Option<(u64, usize)>,
    blocks_max: usize,
    block_shift: u32,
    pub start: Cursor,
    pub end: Cursor,
    /// Largest end offset of any piece in the window.
    pub end_bytes_max: u64,
}

impl Window {
    pub(crate) fn new(blocks_max: usize, block_shift: u32) -> Self {
        assert!(blocks_max > 0);
        Self {
            blocks: Vec::new(),
            index: HashMap::new(),
            last: None,
            blocks_max,
            block_shift,
            start: Cursor::default(),
            end: Cursor::default(),
            end_bytes_max: 0,
        }
    }

    /// Plans the window that starts at `start`; false if no bytes are left.
    pub(crate) fn plan(&mut self, extents: &[Extent], start: Cursor) -> bool {
        self.blocks.clear();
        self.index.clear();
        self.last = None;
        self.start = start;
        self.end_bytes_max = 0;
        let mut pieces = Pieces::new(extents, start, self.block_shift);
        loop {
            let before = pieces.cursor();
            let Some(piece) = pieces.next() else {
                self.end = pieces.cursor();
                break;
            };
            let Some(position) = self.find_or_add(piece.block) else {
                self.end = before;
                break;
            };
            self.cover(position, &piece);
        }
        !self.blocks.is_empty()
    }

    /// The pieces of this window, in extent order.
    pub(crate) fn pieces<'a>(&self, extents: &'a [Extent]) -> impl Iterator<Item = Piece> + 'a {
        let end = self.end.data_offset;
        Pieces::new(extents, self.start, self.block_shift).take_while(move |piece| piece.data_offset < end)
    }

    fn cover(&mut self, position: usize, piece: &Piece) {
        let piece_end =
            ((piece.block << self.block_shift) + piece.offset_in_block as u64) + piece.length as u64;
        self.end_bytes_max = self.end_bytes_max.max(piece_end);
        let entry = &mut self.blocks[position];
        if piece.offset_in_block <= entry.covered_bytes {
            entry.covered_bytes = entry.covered_bytes.max(piece.offset_in_block + piece.length);
        }
    }

    /// Whether the request overwrites every byte of the block at `position`.
    pub(crate) fn fully_covered(&self, position: usize) -> bool {
        self.blocks[position].covered_bytes == 1usize << self.block_shift
    }

    /// Keeps only the blocks `keep` says yes to (by position), in order; the window then no
    /// longer stands for its pieces (`pieces` must not be used), only for a set of blocks
    /// to pin (a write's prefetch keeps the blocks it reads first).
    pub(crate) fn keep_blocks(&mut self, keep: impl Fn(&Window, usize) -> bool) {
        let kept: Vec<WindowBlock> =
            (0..self.blocks.len()).filter(|&position| keep(self, position)).map(|p| self.blocks[p]).collect();
        self.blocks = kept;
        self.last = None;
        self.index.clear();
        if self.blocks.len() > LINEAR_SEARCH_MAX {
            self.index.extend(self.blocks.iter().enumerate().map(|(at, entry)| (entry.block, at as u32)));
        }
    }

    /// Position of a block of the window.
    pub(crate) fn position(&mut self, block: u64) -> Option<usize> {
        if let Some((last_block, position)) = self.last {
            if last_block == block {
                return Some(position);
            }
        }
        let found = if self.blocks.len() <= LINEAR_SEARCH_MAX {
            self.blocks.iter().position(|entry| entry.block == block)
        } else {
            self.index.get(&block).map(|&position| position as usize)
        };
        if let Some(position) = found {
            self.last = Some((block, position));
        }
        found
    }

    fn find_or_add(&mut self, block: u64) -> Option<usize> {
        if let Some(position) = self.position(block) {
            return Some(position);
        }
        if self.blocks.len() == self.blocks_max {
            return None;
        }
        let position = self.blocks.len();
        self.blocks.push(WindowBlock {
            block,
            slot: u32::MAX,
            action: BlockAction::Hit,
            covered_bytes: 0,
            touched: false,
        });
        if self.blocks.len() == LINEAR_SEARCH_MAX + 1 {
            self.index.extend(self.blocks.iter().enumerate().map(|(at, entry)| (entry.block, at as u32)));
        } else if self.blocks.len() > LINEAR_SEARCH_MAX + 1 {
            self.index.insert(block, position as u32);
        }
        self.last = Some((block, position));
        Some(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_extents_at_block_boundaries() {
        let extents = [Extent::new(6, 12), Extent::new(0, 0), Extent::new(40, 2)];
        let pieces: Vec<(u64, usize, usize, usize)> = Pieces::new(&extents, Cursor::default(), 3)
            .map(|p| (p.block, p.offset_in_block, p.length, p.data_offset))
            .collect();
        assert_eq!(pieces, [(0, 6, 2, 0), (1, 0, 8, 2), (2, 0, 2, 10), (5, 0, 2, 12)]);
    }

    #[test]
    fn windows_bound_distinct_blocks_and_resume() {
        // Block size 8; extents touch blocks 0,1,2,3 then 0 again.
        let extents = [Extent::new(0, 32), Extent::new(0, 4)];
        let mut window = Window::new(3, 3);
        assert!(window.plan(&extents, Cursor::default()));
        let blocks: Vec<u64> = window.blocks.iter().map(|b| b.block).collect();
        assert_eq!(blocks, [0, 1, 2]);
        assert_eq!(window.end.data_offset, 24);
        assert!(window.fully_covered(0));
        let start = window.end;
        assert!(window.plan(&extents, start));
        let blocks: Vec<u64> = window.blocks.iter().map(|b| b.block).collect();
        assert_eq!(blocks, [3, 0]);
        assert!(!window.fully_covered(1));
        assert_eq!(window.pieces(&extents).count(), 2);
        let start = window.end;
        assert!(!window.plan(&extents, start));
    }

    #[test]
    fn coverage_never_overcounts_with_gaps_or_disorder() {
        let extents = [Extent::new(4, 4), Extent::new(0, 2)];
        let mut window = Window::new(4, 3);
        window.plan(&extents, Cursor::default());
        assert!(!window.fully_covered(0));
        let extents = [Extent::new(0, 4), Extent::new(2, 6)];
        window.plan(&extents, Cursor::default());
        assert!(window.fully_covered(0));
    }

    #[test]
    fn kept_blocks_are_found_again() {
        // Block size 8: the first extent covers blocks 0..20 whole, the second half of 20.
        let extents = [Extent::new(0, 160), Extent::new(160, 4)];
        let mut window = Window::new(1000, 3);
        window.plan(&extents, Cursor::default());
        window.keep_blocks(|window, position| !window.fully_covered(position));
        let blocks: Vec<u64> = window.blocks.iter().map(|b| b.block).collect();
        assert_eq!(blocks, [20]);
        assert_eq!(window.position(20), Some(0));
        assert_eq!(window.position(3), None);
    }

    #[test]
    fn large_windows_use_the_index() {
        let extents: Vec<Extent> = (0..100u64).rev().map(|i| Extent::new(i * 8, 8)).collect();
        let mut window = Window::new(1000, 3);
        window.plan(&extents, Cursor::default());
        assert_eq!(window.blocks.len(), 100);
        assert_eq!(window.position(0), Some(99));
        assert_eq!(window.position(99), Some(0));
        assert_eq!(window.position(100), None);
    }
}
