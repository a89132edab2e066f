//! The `lines` target kind's fork: its blocks live in the target's image (`LinesDisk`),
//! found from (fork, block number) alone; its namespace entry stays a file in the `dir`
//! layout, kept *sparse* at the fork's logical size (no data blocks on the host file
//! system), beside the checksum file every fork has.

use crate::backend::ForkBackend;
use crate::file_fork::FileFork;
use crate::lines_disk::LinesDisk;
use crate::lines_format::ForkKey;
use crate::lines_map::home_line;
use crate::tier::TargetTier;
use crate::tier_record::ArchiveRecord;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The byte ranges `pieces` cover, adjacent pieces merged (in the order given).
fn contiguous_ranges(pieces: &[(u64, &mut [u8])]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (offset, buffer) in pieces {
        let end = offset + buffer.len() as u64;
        match ranges.last_mut() {
            Some((_, last_end)) if *last_end == *offset => *last_end = end,
            _ => ranges.push((*offset, end)),
        }
    }
    ranges
}

/// Recalls of one read before it gives up (each undone by reclaims for other forks).
const RECALL_ATTEMPTS: usize = 8;

/// A fork of a lines target.
#[derive(Debug)]
pub struct LinesFork {
    marker: FileFork,
    key: ForkKey,
    disk: Arc<LinesDisk>,
    /// The target's tier and this fork's archive record path, when it has an archive.
    tier: Option<(Arc<TargetTier>, PathBuf)>,
}

impl LinesFork {
    /// Opens the fork whose namespace file is `path` and checksum file `checksum_path`.
    pub fn open(
        path: &Path,
        checksum_path: &Path,
        key: ForkKey,
        disk: Arc<LinesDisk>,
        tier: Option<(Arc<TargetTier>, PathBuf)>,
    ) -> io::Result<LinesFork> {
        Ok(LinesFork { marker: FileFork::open(path, checksum_path)?, key, disk, tier })
    }

    /// Recalls from the archive whatever of the range the disk lacks (no tier: nothing).
    fn ensure_resident(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        match &self.tier {
            Some((tier, record_path)) => {
                tier.ensure_resident(self.key, record_path, offset_bytes, length_bytes)
            }
            None => Ok(()),
        }
    }

    /// Reads `pieces` (fork offset and buffer each; holes as zeros) after recalling what the
    /// archive holds and the disk lacks; should a reclaim (space wanted by another fork) drop
    /// some of it in between, recalls again, a bounded number of times. Pieces adjacent in the
    /// image move in one request.
    fn read_pieces(&self, pieces: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let Some((tier, record_path)) = &self.tier else {
            return self.disk.read_pieces(self.key, pieces, &|_| false).map(|_| ());
        };
        let record = tier.record(self.key, record_path)?;
        let block_bytes = u64::from(self.disk.geometry().block_bytes);
        let held = |block: u64| {
            let start = block * block_bytes;
            record.as_ref().is_some_and(|record| record.holds(start, start + block_bytes))
        };
        for _ in 0..RECALL_ATTEMPTS {
            for (start, end) in contiguous_ranges(pieces) {
                match self.ensure_resident(start, end - start) {
                    Ok(()) => {}
                    Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => {
                        let record = record.as_ref().expect("a recall needs a record");
                        for (offset, buffer) in pieces.iter_mut() {
                            self.read_through(tier, record, *offset, buffer)?;
                        }
                        return Ok(());
                    }
                    Err(error) => return Err(error),
                }
            }
            if self.disk.read_pieces(self.key, pieces, &held)? {
                return Ok(());
            }
        }
        Err(io::Error::other(format!(
            "blocks of a fork recalled {RECALL_ATTEMPTS} times were reclaimed again before they could be read: \
             the lines target {:?} is too small for the data being read",
            self.disk.path()
        )))
    }

    /// Serves a read straight from the archive where the disk lacks blocks the archive holds,
    /// without keeping them: what a read gets when a recall finds the target full of dirty
    /// blocks (nothing can be reclaimed until the migration manager archives some). The
    /// target's one disk thread runs this read, so no write-back can fill a missing block in
    /// between. Holes the archive does not hold stay zeros.
    fn read_through(
        &self,
        tier: &TargetTier,
        record: &ArchiveRecord,
        offset_bytes: u64,
        buffer: &mut [u8],
    ) -> io::Result<()> {
        self.disk.read(self.key, offset_bytes, buffer)?;
        let block_bytes = u64::from(self.disk.geometry().block_bytes);
        let end = offset_bytes + buffer.len() as u64;
        for (fork_at, object_at, length) in record.held(offset_bytes, end) {
            let mut from = fork_at;
            while from < fork_at + length {
                let to = ((from / block_bytes + 1) * block_bytes).min(fork_at + length);
                if self.disk.any_missing(self.key, from, to - from) {
                    let object_from = object_at + (from - fork_at);
                    let bytes = tier.fetch(record, object_from..object_from + (to - from))?;
                    let at = (from - offset_bytes) as usize;
                    buffer[at..at + bytes.len()].copy_from_slice(&bytes);
                }
                from = to;
            }
        }
        Ok(())
    }

    /// A write that covers part of a block keeps the rest of it: a block only in the archive
    /// is recalled first.
    fn ensure_partial_blocks(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        if self.tier.is_none() || length_bytes == 0 {
            return Ok(());
        }
        let block_bytes = u64::from(self.disk.geometry().block_bytes);
        let end = offset_bytes + length_bytes;
        if !offset_bytes.is_multiple_of(block_bytes) {
            self.ensure_resident(offset_bytes, 1)?;
        }
        if !end.is_multiple_of(block_bytes) {
            self.ensure_resident(end - 1, 1)?;
        }
        Ok(())
    }

    fn grow_to(&self, end_bytes: u64) -> io::Result<()> {
        if end_bytes > self.marker.size_bytes()? {
            self.marker.set_size(end_bytes)?;
        }
        Ok(())
    }
}

impl ForkBackend for LinesFork {
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize> {
        let buffers: Vec<&mut [u8]> = buffers.iter_mut().map(|buffer| &mut **buffer).collect();
        Ok(self.read_gathered(&mut [(offset_bytes, buffers)])?[0])
    }

    /// Every piece's slots are looked up at once and runs adjacent in the image are read in
    /// one request (a hash-placed fork's pieces with gaps in block numbers often sit side by
    /// side in a line), straight into the buffers. Bytes past the fork's size read as zeros.
    fn read_gathered(&self, pieces: &mut [(u64, Vec<&mut [u8]>)]) -> io::Result<Vec<usize>> {
        let size = self.marker.size_bytes()?;
        let mut inside = Vec::with_capacity(pieces.len());
        let mut flat: Vec<(u64, &mut [u8])> = Vec::new();
        for (offset, buffers) in pieces.iter_mut() {
            let total: usize = buffers.iter().map(|buffer| buffer.len()).sum();
            let below_end = size.saturating_sub(*offset).min(total as u64) as usize;
            inside.push(below_end);
            let (mut at, mut left) = (*offset, below_end);
            for buffer in buffers.iter_mut() {
                let length = buffer.len();
                let (head, tail) = buffer.split_at_mut(left.min(length));
                tail.fill(0);
                if !head.is_empty() {
                    left -= head.len();
                    flat.push((at, head));
                }
                at += length as u64;
            }
        }
        self.read_pieces(&mut flat)?;
        Ok(inside)
    }

    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()> {
        let whole = buffers.concat();
        self.ensure_partial_blocks(offset_bytes, whole.len() as u64)?;
        self.disk.write(self.key, offset_bytes, &whole)?;
        self.grow_to(offset_bytes + whole.len() as u64)
    }

    fn allocate(&self, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()> {
        self.disk.reserve(self.key, offset_bytes, length_bytes)?;
        if grow_size {
            self.grow_to(offset_bytes + length_bytes)?;
        }
        Ok(())
    }

    fn set_size(&self, size_bytes: u64) -> io::Result<()> {
        if let Some((tier, record_path)) = &self.tier {
            // Archived bytes past the new size are no longer the fork's (a later growth
            // reads zeros there, not the old copy).
            tier.truncated(self.key, record_path, size_bytes)?;
        }
        self.disk.truncate(self.key, size_bytes)?;
        self.marker.set_size(size_bytes)
    }

    fn read_checksums(&self, first_block: u64, entries: &mut [u32]) -> io::Result<()> {
        self.marker.read_checksums(first_block, entries)
    }

    fn write_checksums(&self, first_block: u64, entries: &[u32]) -> io::Result<()> {
        self.marker.write_checksums(first_block, entries)
    }

    fn allocate_checksums(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        self.marker.allocate_checksums(offset_bytes, length_bytes)
    }

    fn truncate_checksums(&self, blocks: u64) -> io::Result<()> {
        self.marker.truncate_checksums(blocks)
    }

    /// Checksums and size first, then the image's data, then the descriptors naming it.
    fn sync_data(&self) -> io::Result<()> {
        self.marker.sync_data()?;
        self.disk.sync(self.key)
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.marker.size_bytes()
    }

    fn location(&self) -> u64 {
        let geometry = self.disk.geometry();
        geometry.descriptor_offset(home_line(geometry, self.key, 0), 2)
    }
}
