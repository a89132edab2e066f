//! The `dir` target kind's fork: a regular file, accessed with positioned vectored I/O
//! (`preadv`/`pwritev`) so that a run of adjacent cache blocks moves in one system call, and
//! its checksum file: entry `i` (4 bytes, little-endian) at offset `4 * i`.
//!
//! Space is reserved with `fallocate` (`FALLOC_FL_KEEP_SIZE` when the size must not change);
//! on a file system without `fallocate`, growing falls back to `posix_fallocate` and a
//! reservation that keeps the size is skipped with a warning (writes may then hit ENOSPC).

use crate::backend::ForkBackend;
use crate::checksum::{self, CHECKSUM_ENTRY_BYTES};
use rustix::fs::FallocateFlags;
use rustix::io::Errno;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// A fork stored as a regular file.
#[derive(Debug)]
pub struct FileFork {
    file: File,
    checksums: File,
    inode: u64,
}

impl FileFork {
    /// Opens an existing fork file for reading and writing, and its existing checksum file at
    /// `checksum_path` (the target creates both with the fork; a missing one is an error).
    pub fn open(path: &Path, checksum_path: &Path) -> io::Result<FileFork> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path:?} is not a regular file"),
            ));
        }
        let checksums = OpenOptions::new().read(true).write(true).open(checksum_path)?;
        Ok(FileFork { file, checksums, inode: metadata.ino() })
    }

    /// Finishes a short vectored read buffer by buffer, starting after the `already` bytes
    /// it delivered; everything past the end of the file is zero-filled.
    fn read_rest(&self, offset_bytes: u64, buffers: &mut [&mut [u8]], already: usize) -> io::Result<usize> {
        let mut done = 0usize;
        let mut buffer_start = 0usize;
        let mut at_end = false;
        for buffer in buffers.iter_mut() {
            let mut at = already.saturating_sub(buffer_start).min(buffer.len());
            let buffer_offset = offset_bytes + buffer_start as u64;
            buffer_start += buffer.len();
            while at < buffer.len() && !at_end {
                match self.file.read_at(&mut buffer[at..], buffer_offset + at as u64) {
                    Ok(0) => at_end = true,
                    Ok(count) => {
                        at += count;
                        done += count;
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            buffer[at..].fill(0);
        }
        Ok(done)
    }
}

impl ForkBackend for FileFork {
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize> {
        let wanted: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        let mut slices: Vec<IoSliceMut<'_>> =
            buffers.iter_mut().map(|buffer| IoSliceMut::new(buffer)).collect();
        let first = loop {
            match rustix::io::preadv(&self.file, &mut slices, offset_bytes) {
                Err(Errno::INTR) => continue,
                other => break other?,
            }
        };
        drop(slices);
        if first == wanted {
            return Ok(first);
        }
        // Short read: finish buffer by buffer, zero-filling past the end of the file.
        Ok(first + self.read_rest(offset_bytes, buffers, first)?)
    }

    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()> {
        let wanted: usize = buffers.iter().map(|buffer| buffer.len()).sum();
        let slices: Vec<IoSlice<'_>> = buffers.iter().map(|buffer| IoSlice::new(buffer)).collect();
        let first = loop {
            match rustix::io::pwritev(&self.file, &slices, offset_bytes) {
                Err(Errno::INTR) => continue,
                other => break other?,
            }
        };
        if first == wanted {
            return Ok(());
        }
        let mut position = 0usize;
        for buffer in buffers {
            let start = first.saturating_sub(position).min(buffer.len());
            let offset = offset_bytes + (position + start) as u64;
            self.file.write_all_at(&buffer[start..], offset)?;
            position += buffer.len();
        }
        Ok(())
    }

    fn allocate(&self, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()> {
        if length_bytes == 0 {
            return Ok(());
        }
        let flags = if grow_size { FallocateFlags::empty() } else { FallocateFlags::KEEP_SIZE };
        match rustix::fs::fallocate(&self.file, flags, offset_bytes, length_bytes) {
            Ok(()) => Ok(()),
            Err(Errno::OPNOTSUPP) => fallback_allocate(&self.file, offset_bytes, length_bytes, grow_size),
            Err(errno) => Err(errno.into()),
        }
    }

    fn set_size(&self, size_bytes: u64) -> io::Result<()> {
        self.file.set_len(size_bytes)
    }

    fn read_checksums(&self, first_block: u64, entries: &mut [u32]) -> io::Result<()> {
        let mut bytes = vec![0u8; entries.len() * CHECKSUM_ENTRY_BYTES as usize];
        let offset = checksum_offset(first_block)?;
        let mut done = 0usize;
        while done < bytes.len() {
            match self.checksums.read_at(&mut bytes[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(count) => done += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        checksum::decode(&bytes, entries);
        Ok(())
    }

    fn write_checksums(&self, first_block: u64, entries: &[u32]) -> io::Result<()> {
        self.checksums.write_all_at(&checksum::encode(entries), checksum_offset(first_block)?)
    }

    fn allocate_checksums(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        if length_bytes == 0 {
            return Ok(());
        }
        match rustix::fs::fallocate(&self.checksums, FallocateFlags::KEEP_SIZE, offset_bytes, length_bytes) {
            Ok(()) => Ok(()),
            Err(Errno::OPNOTSUPP) => fallback_allocate(&self.checksums, offset_bytes, length_bytes, false),
            Err(errno) => Err(errno.into()),
        }
    }

    fn truncate_checksums(&self, blocks: u64) -> io::Result<()> {
        self.checksums.set_len(checksum_offset(blocks)?)
    }

    fn sync_data(&self) -> io::Result<()> {
        let (data, checksums) = std::thread::scope(|scope| {
            let checksums = scope.spawn(|| self.checksums.sync_data());
            (self.file.sync_data(), checksums.join())
        });
        data?;
        checksums.unwrap_or_else(|_| Err(io::Error::other("fdatasync of a checksum file panicked")))
    }

    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.file.metadata()?.blocks().saturating_mul(512)))
    }

    fn location(&self) -> u64 {
        self.inode
    }
}

/// Where a checksum block's entry lies in the checksum file.
fn checksum_offset(block: u64) -> io::Result<u64> {
    block
        .checked_mul(CHECKSUM_ENTRY_BYTES)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "checksum block index overflows"))
}

fn fallback_allocate(file: &File, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()> {
    if !grow_size {
        tracing::warn!("file system has no fallocate; space for a growing fork is not reserved");
        return Ok(());
    }
    let (Ok(offset), Ok(length)) = (libc::off_t::try_from(offset_bytes), libc::off_t::try_from(length_bytes))
    else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "range too large for off_t"));
    };
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate only reads its integer arguments and acts on a valid open fd
    // owned by `file`, which outlives the call.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, length) };
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork_in(dir: &tempfile::TempDir) -> FileFork {
        let path = dir.path().join("data");
        File::create(&path).unwrap();
        File::create(dir.path().join("data.crc")).unwrap();
        FileFork::open(&path, &dir.path().join("data.crc")).unwrap()
    }

    #[test]
    fn vectored_round_trip_and_zeros_past_end() {
        let dir = tempfile::tempdir().unwrap();
        let fork = fork_in(&dir);
        fork.write_at(10, &[b"abc", b"defg"]).unwrap();
        assert_eq!(fork.size_bytes().unwrap(), 17);
        let mut first = [9u8; 12];
        let mut second = [9u8; 8];
        let got = fork.read_at(5, &mut [&mut first, &mut second]).unwrap();
        assert_eq!(got, 12);
        assert_eq!(&first, b"\0\0\0\0\0abcdefg");
        assert_eq!(second, [0u8; 8]);
    }

    #[test]
    fn checksum_entries_round_trip_and_read_zero_past_end() {
        let dir = tempfile::tempdir().unwrap();
        let fork = fork_in(&dir);
        fork.write_checksums(2, &[7, 8]).unwrap();
        let mut entries = [9u32; 6];
        fork.read_checksums(0, &mut entries).unwrap();
        assert_eq!(entries, [0, 0, 7, 8, 0, 0]);
        fork.truncate_checksums(3).unwrap();
        fork.read_checksums(0, &mut entries).unwrap();
        assert_eq!(entries, [0, 0, 7, 0, 0, 0]);
        fork.sync_data().unwrap();
    }

    #[test]
    fn allocate_keeps_or_grows_size() {
        let dir = tempfile::tempdir().unwrap();
        let fork = fork_in(&dir);
        fork.allocate(0, 1 << 16, false).unwrap();
        assert_eq!(fork.size_bytes().unwrap(), 0);
        fork.allocate(0, 1 << 16, true).unwrap();
        assert_eq!(fork.size_bytes().unwrap(), 1 << 16);
    }
}
