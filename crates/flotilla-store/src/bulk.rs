//! Bulk data straight between a request's buffer and the fork file (issue 12, "one cache,
//! not two").
//!
//! On a `dir` target the fork file lives in the kernel's page cache, so copying a large
//! sequential piece into the store's own cache slots first is a second cache and a second
//! copy. A piece of a request that covers at least `bulk_bytes_min` of whole cache blocks
//! (`split`) therefore goes with one `pwritev`/`preadv` between the request or reply buffer
//! and the fork file, on the worker thread; its head and tail (partial blocks), small pieces
//! and strided requests keep the cache path (Galley's case).
//!
//! Coherence with the cache (`BlockCache::begin_bulk`): the request holds a gate over its
//! blocks, so the cache cannot take them up meanwhile; a write drops every cached copy of
//! its blocks nobody has pinned (clean or dirty: it replaces all of their bytes, so no older
//! copy can be written back over it later) and writes pinned ones through the cache; a read
//! takes every block the cache holds (possibly dirty, or being written back) from the cache.
//!
//! Checksums: a bulk write computes each checksum block's CRC32C once over the request's
//! bytes and writes the entries right after the data, as a write-back does; a bulk read
//! checks every checksum block below the end of the fork against its entry, as the disk
//! thread does after a read, and fails with the same `ChecksumMismatch` (counted) on a
//! mismatch. Durability is unchanged: the fork is marked unsynced after data and entries
//! are written, so the next `sync` fdatasyncs both files.

use crate::block_cache::BulkRun;
use crate::checksum;
use crate::error::StoreError;
use crate::extent::Extent;
use crate::fork::Fork;
use crate::request::{self, RequestEngine};
use crate::stats::{bump, Counters};
use std::ops::Range;
use std::sync::Arc;

/// Part of a request: extents for the cache path, or one bulk extent (whole blocks); each
/// with its range of the packed data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Cache { extents: Vec<Extent>, data: Range<usize> },
    Bulk { extent: Extent, data: Range<usize> },
}

/// The whole blocks inside an extent, if they are at least `bulk_bytes_min` (and a block).
fn bulk_part(extent: &Extent, block_shift: u32, bulk_bytes_min: u64) -> Option<Range<u64>> {
    let block_bytes = 1u64 << block_shift;
    // Most extents of small and strided requests are shorter than a bulk part can be: they
    // are refused before the rounding below (a division) is paid.
    if extent.length < bulk_bytes_min.max(block_bytes) {
        return None;
    }
    let start = extent.offset.next_multiple_of(block_bytes);
    let end = (extent.offset + extent.length) & !(block_bytes - 1);
    (end > start && end - start >= bulk_bytes_min.max(block_bytes)).then_some(start..end)
}

/// Cuts a request into segments, in extent order, when some extent holds a bulk part;
/// `None` (no allocation) when none does or `bulk_bytes_min` is 0.
pub(crate) fn split(extents: &[Extent], block_shift: u32, bulk_bytes_min: u64) -> Option<Vec<Segment>> {
    if bulk_bytes_min == 0
        || !extents.iter().any(|extent| bulk_part(extent, block_shift, bulk_bytes_min).is_some())
    {
        return None;
    }
    let mut segments = Vec::new();
    let mut pending: Vec<Extent> = Vec::new();
    let mut pending_start = 0usize;
    let mut at = 0usize;
    for extent in extents {
        let Some(bulk) = bulk_part(extent, block_shift, bulk_bytes_min) else {
            add_cache(&mut pending, *extent, &mut at);
            continue;
        };
        add_cache(&mut pending, Extent::new(extent.offset, bulk.start - extent.offset), &mut at);
        if !pending.is_empty() {
            segments.push(Segment::Cache { extents: std::mem::take(&mut pending), data: pending_start..at });
        }
        let length = bulk.end - bulk.start;
        segments
            .push(Segment::Bulk { extent: Extent::new(bulk.start, length), data: at..at + length as usize });
        at += length as usize;
        pending_start = at;
        add_cache(&mut pending, Extent::new(bulk.end, extent.offset + extent.length - bulk.end), &mut at);
    }
    if !pending.is_empty() {
        segments.push(Segment::Cache { extents: pending, data: pending_start..at });
    }
    Some(segments)
}

fn add_cache(pending: &mut Vec<Extent>, extent: Extent, at: &mut usize) {
    if extent.length > 0 {
        pending.push(extent);
        *at += extent.length as usize;
    }
}

/// Bytes of `runs` relative to the start of the bulk extent.
fn run_bytes(run: &BulkRun, extent: &Extent, block_shift: u32) -> (Extent, Range<usize>) {
    let offset = run.first << block_shift;
    let length = (run.end - run.first) << block_shift;
    let at = (offset - extent.offset) as usize;
    (Extent::new(offset, length), at..at + length as usize)
}

/// The gate over the extent's blocks and its runs (`BlockCache::begin_bulk`).
fn begin<'c>(
    engine: RequestEngine<'c>,
    fork: &Fork,
    extent: &Extent,
    write: bool,
) -> (Vec<BulkRun>, crate::block_cache::BulkGate<'c>) {
    let shift = engine.block_shift;
    engine.cache.begin_bulk(
        fork.serial(),
        extent.offset >> shift,
        (extent.offset + extent.length) >> shift,
        write,
    )
}

/// Reads a bulk extent (whole blocks) into `out`.
pub(crate) fn read(
    engine: RequestEngine<'_>,
    counters: &Counters,
    fork: &Arc<Fork>,
    extent: Extent,
    out: &mut [u8],
) -> Result<(), StoreError> {
    let shift = engine.block_shift;
    let (runs, gate) = begin(engine, fork, &extent, false);
    let direct = runs.iter().filter(|run| run.direct).try_for_each(|run| {
        let (piece, bytes) = run_bytes(run, &extent, shift);
        read_direct(counters, fork, piece.offset, &mut out[bytes])
    });
    drop(gate);
    direct?;
    for run in runs.iter().filter(|run| !run.direct) {
        let (piece, bytes) = run_bytes(run, &extent, shift);
        request::read(engine, fork, &[piece], &mut out[bytes])?;
    }
    Ok(())
}

/// Writes a bulk extent (whole blocks) from `data`.
pub(crate) fn write(
    engine: RequestEngine<'_>,
    counters: &Counters,
    fork: &Arc<Fork>,
    extent: Extent,
    data: &[u8],
) -> Result<(), StoreError> {
    let shift = engine.block_shift;
    let (runs, gate) = begin(engine, fork, &extent, true);
    let direct = runs.iter().filter(|run| run.direct).try_for_each(|run| {
        let (piece, bytes) = run_bytes(run, &extent, shift);
        write_direct(counters, fork, piece.offset, &data[bytes])?;
        // Before the gate opens: a block past the old end must not be taken for a hole.
        fork.grow_size(piece.offset + piece.length);
        Ok(())
    });
    drop(gate);
    direct?;
    for run in runs.iter().filter(|run| !run.direct) {
        let (piece, bytes) = run_bytes(run, &extent, shift);
        request::write(engine, fork, &[piece], &data[bytes])?;
    }
    Ok(())
}

/// `preadv` into `out`, then every checksum block below the end of the fork is checked.
fn read_direct(counters: &Counters, fork: &Arc<Fork>, offset: u64, out: &mut [u8]) -> Result<(), StoreError> {
    let backend = fork.backend()?;
    let end = offset + out.len() as u64;
    let failed = |what: &str, error| StoreError::io(format!("{what} bytes {offset}..{end} of {fork}"), error);
    let below_end = backend.read_at(offset, &mut [&mut *out]).map_err(|error| failed("read", error))?;
    bump(&counters.bulk_reads, 1);
    bump(&counters.bulk_read_bytes, below_end as u64);
    bump(&counters.disk_reads, 1);
    bump(&counters.disk_read_bytes, below_end as u64);
    let checksum_bytes = fork.target().checksum_block_bytes() as usize;
    let mut entries = vec![0u32; out.len() / checksum_bytes];
    backend
        .read_checksums(offset / checksum_bytes as u64, &mut entries)
        .map_err(|error| failed("read the checksums of", error))?;
    for (index, (chunk, stored)) in out.chunks(checksum_bytes).zip(&entries).enumerate() {
        if index * checksum_bytes >= below_end {
            break;
        }
        if let Err(computed) = checksum::block_matches(chunk, *stored) {
            bump(&counters.checksum_errors, 1);
            let at = offset + (index * checksum_bytes) as u64;
            let mismatch = fork.mismatch(at, checksum_bytes as u64, *stored, computed);
            tracing::error!(error = %mismatch.to_error(), "fork data failed its checksum");
            return Err(mismatch.to_error());
        }
    }
    Ok(())
}

/// Checksums `data` once, `pwritev`s it and then its entries; the fork is unsynced after.
fn write_direct(counters: &Counters, fork: &Arc<Fork>, offset: u64, data: &[u8]) -> Result<(), StoreError> {
    let backend = fork.backend()?;
    let failed = |what: &str, error| {
        StoreError::io(format!("{what} bytes {offset}..{} of {fork}", offset + data.len() as u64), error)
    };
    let checksum_bytes = fork.target().checksum_block_bytes() as usize;
    let mut entries = Vec::with_capacity(data.len() / checksum_bytes);
    checksum::crcs_of(data, checksum_bytes, &mut entries);
    let written = backend.write_at(offset, &[data]).map_err(|error| failed("write", error)).and_then(|()| {
        backend
            .write_checksums(offset / checksum_bytes as u64, &entries)
            .map_err(|error| failed("write the checksums of", error))
    });
    // Whatever reached the files must be covered by the next sync.
    fork.mark_unsynced();
    written?;
    bump(&counters.bulk_writes, 1);
    bump(&counters.bulk_write_bytes, data.len() as u64);
    bump(&counters.disk_writes, 1);
    bump(&counters.disk_write_bytes, data.len() as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(extents: &[(u64, u64)], data: Range<usize>) -> Segment {
        Segment::Cache { extents: extents.iter().map(|&(o, l)| Extent::new(o, l)).collect(), data }
    }

    fn bulk(offset: u64, length: u64, data: Range<usize>) -> Segment {
        Segment::Bulk { extent: Extent::new(offset, length), data }
    }

    #[test]
    fn split_cuts_heads_and_tails_and_keeps_data_offsets() {
        // Blocks of 8 bytes, bulk from 16 bytes.
        let extents = [Extent::new(3, 40), Extent::new(100, 4), Extent::new(200, 16)];
        let segments = split(&extents, 3, 16).unwrap();
        assert_eq!(
            segments,
            [
                cache(&[(3, 5)], 0..5),
                bulk(8, 32, 5..37),
                cache(&[(40, 3), (100, 4)], 37..44),
                bulk(200, 16, 44..60),
            ]
        );
    }

    #[test]
    fn split_leaves_small_and_unaligned_requests_alone() {
        assert_eq!(split(&[Extent::new(0, 4096)], 3, 0), None);
        assert_eq!(split(&[Extent::new(1, 22)], 3, 16), None);
        assert_eq!(split(&[Extent::new(0, 8), Extent::new(16, 8)], 3, 16), None);
        // A threshold below one block still needs a whole block.
        assert_eq!(split(&[Extent::new(1, 10)], 3, 1), None);
        assert_eq!(split(&[Extent::new(8, 8)], 3, 1).unwrap(), [bulk(8, 8, 0..8)]);
    }
}
