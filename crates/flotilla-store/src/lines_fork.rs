//! The `lines` target kind's fork: its blocks live in the target's image (`LinesDisk`),
//! found from (fork, block number) alone; its namespace entry stays a file in the `dir`
//! layout, kept *sparse* at the fork's logical size (no data blocks on the host file
//! system), beside the checksum file every fork has.

use crate::backend::ForkBackend;
use crate::file_fork::FileFork;
use crate::lines_disk::LinesDisk;
use crate::lines_format::ForkKey;
use crate::lines_map::home_line;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// A fork of a lines target.
#[derive(Debug)]
pub struct LinesFork {
    marker: FileFork,
    key: ForkKey,
    disk: Arc<LinesDisk>,
}

impl LinesFork {
    /// Opens the fork whose namespace file is `path` and checksum file `checksum_path`.
    pub fn open(
        path: &Path,
        checksum_path: &Path,
        key: ForkKey,
        disk: Arc<LinesDisk>,
    ) -> io::Result<LinesFork> {
        Ok(LinesFork { marker: FileFork::open(path, checksum_path)?, key, disk })
    }

    fn grow_to(&self, end_bytes: u64) -> io::Result<()> {
        if end_bytes > self.marker.size_bytes()? {
            self.marker.set_size(end_bytes)?;
        }
        Ok(())
    }
}

impl ForkBackend for LinesFork {
    /// Several buffers are read as one range (so adjacent slots move in one request), then
    /// scattered.
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize> {
        let size = self.marker.size_bytes()?;
        let total: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        let inside = size.saturating_sub(offset_bytes).min(total as u64) as usize;
        if let [only] = buffers {
            self.disk.read(self.key, offset_bytes, &mut only[..inside])?;
            only[inside..].fill(0);
            return Ok(inside);
        }
        let mut whole = vec![0u8; inside];
        self.disk.read(self.key, offset_bytes, &mut whole)?;
        let mut at = 0usize;
        for buffer in buffers.iter_mut() {
            let take = whole.len().saturating_sub(at).min(buffer.len());
            if take > 0 {
                buffer[..take].copy_from_slice(&whole[at..at + take]);
            }
            buffer[take..].fill(0);
            at += buffer.len();
        }
        Ok(inside)
    }

    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()> {
        let whole = buffers.concat();
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
