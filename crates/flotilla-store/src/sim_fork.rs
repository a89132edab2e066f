//! The `sim` target kind's fork: the bytes live in a [`FileFork`], so reads return what was
//! written, and every read and write takes the time the target's simulated disk would
//! (`SimTarget::access`).
//!
//! `allocate`, `set_size` and `size_bytes` are bookkeeping and take no simulated time.
//! `sync_data` does not fdatasync the real file: the simulated disk has no write cache, so a
//! write is on its medium when `write_at` returns, and a real flush would only add the host
//! disk's latency to simulated time. Data on a `sim` target is therefore not crash-durable.

use crate::backend::ForkBackend;
use crate::file_fork::FileFork;
use crate::sim_target::SimTarget;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// A fork on a simulated disk.
#[derive(Debug)]
pub struct SimFork {
    file: FileFork,
    disk: Arc<SimTarget>,
    region_start: u64,
}

impl SimFork {
    pub(crate) fn open(path: &Path, checksum_path: &Path, disk: Arc<SimTarget>) -> io::Result<SimFork> {
        let file = FileFork::open(path, checksum_path)?;
        let region_start = disk.region(file.location(), file.size_bytes()?);
        Ok(SimFork { file, disk, region_start })
    }
}

impl ForkBackend for SimFork {
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        self.disk.access(self.region_start, offset_bytes, length as u64, false, || {
            self.file.read_at(offset_bytes, buffers)
        })
    }

    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()> {
        let length: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        self.disk.access(self.region_start, offset_bytes, length as u64, true, || {
            self.file.write_at(offset_bytes, buffers)
        })
    }

    fn allocate(&self, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()> {
        self.file.allocate(offset_bytes, length_bytes, grow_size)
    }

    fn set_size(&self, size_bytes: u64) -> io::Result<()> {
        self.file.set_size(size_bytes)
    }

    fn read_checksums(&self, first_block: u64, entries: &mut [u32]) -> io::Result<()> {
        self.file.read_checksums(first_block, entries)
    }

    fn write_checksums(&self, first_block: u64, entries: &[u32]) -> io::Result<()> {
        self.file.write_checksums(first_block, entries)
    }

    fn allocate_checksums(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        self.file.allocate_checksums(offset_bytes, length_bytes)
    }

    fn truncate_checksums(&self, blocks: u64) -> io::Result<()> {
        self.file.truncate_checksums(blocks)
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.file.size_bytes()
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        self.file.allocated_bytes()
    }

    fn location(&self) -> u64 {
        self.region_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_model::SimModel;

    #[test]
    fn keeps_the_data_and_places_forks_in_regions() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(SimTarget::new(SimModel::st31200n()));
        let (first_path, second_path) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::File::create(&first_path).unwrap();
        std::fs::File::create(&second_path).unwrap();
        std::fs::File::create(dir.path().join("a.crc")).unwrap();
        std::fs::File::create(dir.path().join("b.crc")).unwrap();
        let first = SimFork::open(&first_path, &dir.path().join("a.crc"), disk.clone()).unwrap();
        let second = SimFork::open(&second_path, &dir.path().join("b.crc"), disk.clone()).unwrap();
        assert!(second.location() > first.location());
        assert_eq!(
            SimFork::open(&first_path, &dir.path().join("a.crc"), disk).unwrap().location(),
            first.location()
        );
        first.write_at(4096, &[b"hello", b" disk"]).unwrap();
        let mut buffer = [0u8; 12];
        assert_eq!(first.read_at(4094, &mut [&mut buffer]).unwrap(), 12);
        assert_eq!(&buffer, b"\0\0hello disk");
        assert_eq!(first.size_bytes().unwrap(), 4106);
    }
}
