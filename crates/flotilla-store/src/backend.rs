//! The raw block I/O of one fork, behind a trait so that target kinds other than `dir`
//! (a simulated 1990s disk that sleeps, a fault-injecting one for tests) can plug in.
//!
//! Contract every implementation keeps:
//! - `read_at` fills every byte of the buffers; bytes past the end of the fork read as zeros
//!   (like a sparse file), and it returns how many bytes came from the medium.
//! - `write_at` writes every byte or fails; it never leaves a short write unreported.
//! - After `allocate(offset, length, ..)` succeeded, writes inside that range cannot fail for
//!   lack of space.
//! - Beside the data, a fork keeps one checksum entry (`u32`) per checksum block, addressed by
//!   block index; entries never written read as 0. `sync_data` makes data and entries
//!   durable together. The backend stores entries; it never computes or checks them.

use std::fmt;
use std::io;

/// Block I/O on one fork.
pub trait ForkBackend: Send + Sync + fmt::Debug {
    /// Reads into `buffers`, in order, starting at `offset_bytes`. Returns the number of
    /// bytes that were below the end of the fork; the rest of the buffers are zero-filled.
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize>;

    /// Several reads of one fork at once (each piece as `read_at`), in the order given;
    /// returns each piece's bytes below the end of the fork. A backend whose medium keeps a
    /// fork's non-adjacent ranges side by side (lines) merges them into fewer accesses.
    fn read_gathered(&self, pieces: &mut [(u64, Vec<&mut [u8]>)]) -> io::Result<Vec<usize>> {
        pieces.iter_mut().map(|(offset, buffers)| self.read_at(*offset, buffers)).collect()
    }

    /// Writes all of `buffers`, in order, starting at `offset_bytes`.
    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()>;

    /// Reserves space for `offset_bytes..offset_bytes + length_bytes`. With `grow_size` the
    /// fork's size becomes at least the end of the range; without it the size is unchanged.
    fn allocate(&self, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()>;

    /// Sets the fork's size, dropping data past it or adding zeros.
    fn set_size(&self, size_bytes: u64) -> io::Result<()>;

    /// Reads the entries of checksum blocks `first_block..first_block + entries.len()`;
    /// entries never written (past the end of the checksum file) read as 0.
    fn read_checksums(&self, first_block: u64, entries: &mut [u32]) -> io::Result<()>;

    /// Writes the entries of checksum blocks starting at `first_block`.
    fn write_checksums(&self, first_block: u64, entries: &[u32]) -> io::Result<()>;

    /// Reserves space in the checksum store for bytes `offset_bytes..offset_bytes +
    /// length_bytes` of it (entry `i` lies at byte `4 * i`) without changing its size, so
    /// writing those entries back cannot fail for lack of space.
    fn allocate_checksums(&self, offset_bytes: u64, length_bytes: u64) -> io::Result<()>;

    /// Keeps only the entries of the first `blocks` checksum blocks.
    fn truncate_checksums(&self, blocks: u64) -> io::Result<()>;

    /// Makes written data and checksum entries durable.
    fn sync_data(&self) -> io::Result<()>;

    /// The fork's size on the medium.
    fn size_bytes(&self) -> io::Result<u64>;

    /// Bytes the medium has allocated to the fork's data, when it can tell (`None`: unknown,
    /// so the store reserves before every write into space it has not reserved itself).
    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }

    /// Where the fork lies on the medium (an inode number, a start sector), used only to
    /// order disk work in the scheduler's sweep.
    fn location(&self) -> u64;
}
