//! Scrub and repair of stored blocks (issue 32): a fork's blocks read straight from disk
//! and checked against their checksum entries, and blocks rewritten with bytes another
//! replica holds (data and entries, then synced).
//!
//! Both first write back and sync the fork's dirty blocks, so what is checked or replaced
//! is what lies on disk. They hold the fork shared, as reads and writes do: a write that
//! runs meanwhile may be checked half-written (a false mismatch, which a second look
//! clears) or be overwritten by a rewrite, so callers that rewrite keep writes of the fork
//! out for the duration (the I/O server does it under its chain's lock, see
//! `docs/architecture-log.md` "Read repair and scrub").

use super::Store;
use crate::checksum;
use crate::error::StoreError;
use crate::fork_ref::ForkRef;
use crate::stats::bump;

/// Bytes read from disk at a time while checking.
const CHECK_CHUNK_BYTES: u64 = 1 << 20;

/// What a check of a fork range found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCheck {
    /// Bytes one checksum entry covers.
    pub block_bytes: u64,
    /// The fork's size.
    pub size_bytes: u64,
    /// Offset of the first block checked (a multiple of `block_bytes`).
    pub offset: u64,
    /// The stored entry of each block checked (blocks below the fork's end only).
    pub entries: Vec<u32>,
    /// Offsets of the blocks whose data fails their entry.
    pub bad: Vec<u64>,
}

impl Store {
    /// Checks the checksum blocks overlapping `offset..offset + length` (clipped to the
    /// fork's size) against their entries, reading the data from disk (not the cache).
    /// A block found bad is checked once more after the fork is synced again, so a write
    /// racing the check is not taken for damage.
    pub fn check_blocks(
        &self,
        fork: &ForkRef<'_>,
        offset: u64,
        length: u64,
    ) -> Result<BlockCheck, StoreError> {
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        self.sync_locked(&live)?;
        let block_bytes = live.target().checksum_block_bytes();
        let size_bytes = live.size_bytes();
        let first = offset / block_bytes * block_bytes;
        let end = offset.saturating_add(length).min(size_bytes).next_multiple_of(block_bytes);
        let mut check =
            BlockCheck { block_bytes, size_bytes, offset: first, entries: Vec::new(), bad: Vec::new() };
        let mut at = first;
        while at < end {
            let chunk = (end - at).min(CHECK_CHUNK_BYTES.max(block_bytes)) / block_bytes * block_bytes;
            let (entries, bad) = self.check_span(&live, at, chunk, block_bytes)?;
            check.entries.extend(entries);
            check.bad.extend(bad);
            at += chunk;
        }
        if !check.bad.is_empty() {
            self.sync_locked(&live)?;
            let mut still = Vec::new();
            for &block in &check.bad {
                let (entries, bad) = self.check_span(&live, block, block_bytes, block_bytes)?;
                let index = ((block - first) / block_bytes) as usize;
                if let (Some(slot), Some(entry)) = (check.entries.get_mut(index), entries.first()) {
                    *slot = *entry;
                }
                still.extend(bad);
            }
            check.bad = still;
        }
        Ok(check)
    }

    /// Reads `length` bytes (whole checksum blocks) at `offset` from disk and checks each
    /// block: its entries and the offsets of the bad ones.
    fn check_span(
        &self,
        live: &std::sync::Arc<crate::fork::Fork>,
        offset: u64,
        length: u64,
        block_bytes: u64,
    ) -> Result<(Vec<u32>, Vec<u64>), StoreError> {
        let backend = live.backend()?;
        let failed = |what: &str, error| {
            StoreError::io(format!("{what} bytes {offset}..{} of {live}", offset + length), error)
        };
        let mut data = vec![0u8; length as usize];
        backend.read_at(offset, &mut [&mut data[..]]).map_err(|error| failed("check", error))?;
        let mut entries = vec![0u32; (length / block_bytes) as usize];
        backend
            .read_checksums(offset / block_bytes, &mut entries)
            .map_err(|error| failed("read the checksums of", error))?;
        let mut bad = Vec::new();
        for (index, (chunk, stored)) in data.chunks(block_bytes as usize).zip(&entries).enumerate() {
            if let Err(computed) = checksum::block_matches(chunk, *stored) {
                bump(&self.counters.checksum_errors, 1);
                let at = offset + index as u64 * block_bytes;
                let mismatch = live.mismatch(at, block_bytes, *stored, computed);
                tracing::warn!(error = %mismatch.to_error(), "scrub: block failed its checksum");
                bad.push(at);
            }
        }
        Ok((entries, bad))
    }

    /// Replaces the bytes at `offset` (a multiple of the checksum block) with `data` (whole
    /// checksum blocks, or ending at the fork's end) and their checksum entries, straight on
    /// disk, then syncs the fork. Cached copies of the blocks are dropped first. The fork's
    /// size does not change: bytes past its end are refused.
    pub fn rewrite_blocks(&self, fork: &ForkRef<'_>, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let live = self.fork(fork)?;
        let _shared = live.lock_shared()?;
        self.sync_locked(&live)?;
        let block_bytes = live.target().checksum_block_bytes();
        let end = offset.saturating_add(data.len() as u64);
        let size_bytes = live.size_bytes();
        if !offset.is_multiple_of(block_bytes)
            || end > size_bytes
            || (!end.is_multiple_of(block_bytes) && end != size_bytes)
        {
            return Err(StoreError::io(
                format!("rewrite bytes {offset}..{end} of {live}"),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "a rewrite covers whole checksum blocks of {block_bytes} bytes inside the fork's {size_bytes} bytes"
                    ),
                ),
            ));
        }
        let shift = self.block_shift;
        let cache_end = end.next_multiple_of(1 << shift) >> shift;
        let (_runs, gate) = self.cache.begin_bulk(live.serial(), offset >> shift, cache_end, true);
        let backend = live.backend()?;
        let failed =
            |what: &str, error| StoreError::io(format!("{what} bytes {offset}..{end} of {live}"), error);
        let mut entries = Vec::with_capacity(data.len() / block_bytes as usize + 1);
        checksum::crcs_of(data, block_bytes as usize, &mut entries);
        let written =
            backend.write_at(offset, &[data]).map_err(|error| failed("rewrite", error)).and_then(|()| {
                backend
                    .write_checksums(offset / block_bytes, &entries)
                    .map_err(|error| failed("rewrite the checksums of", error))
            });
        live.mark_unsynced();
        drop(gate);
        written?;
        self.sync_locked(&live)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Store, StoreConfig};
    use flotilla_types::{FileId, SubfileIndex};
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_corrupted_block_is_found_and_a_rewrite_repairs_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreConfig::new(vec![dir.path().to_path_buf()], true)).unwrap();
        let target = store.target_ids()[0];
        let (file, subfile) = (FileId(7), SubfileIndex(0));
        store.create_subfile(target, file, subfile).unwrap();
        let fork = crate::ForkRef::new(target, file, subfile, crate::DEFAULT_FORK_NAME);
        let block = store.checksum_block_bytes(target).unwrap();
        let data: Vec<u8> = (0..block * 3 + 100).map(|i| (i % 251) as u8).collect();
        store.write(&fork, &[crate::Extent::new(0, data.len() as u64)], &data).unwrap();
        store.sync(&fork).unwrap();
        let clean = store.check_blocks(&fork, 0, u64::MAX).unwrap();
        assert_eq!(clean.entries.len(), 4);
        assert!(clean.bad.is_empty(), "{clean:?}");
        let path = store.target_dir(target).unwrap().join(crate::SUBFILES_DIR_NAME);
        let fork_file = walk(&path).into_iter().find(|p| p.ends_with(crate::DEFAULT_FORK_NAME)).unwrap();
        let raw = std::fs::OpenOptions::new().write(true).open(&fork_file).unwrap();
        raw.write_all_at(b"XYZ", block + 17).unwrap();
        let found = store.check_blocks(&fork, 0, u64::MAX).unwrap();
        assert_eq!(found.bad, vec![block]);
        store.rewrite_blocks(&fork, block, &data[block as usize..2 * block as usize]).unwrap();
        assert!(store.check_blocks(&fork, 0, u64::MAX).unwrap().bad.is_empty());
        let mut back = vec![0u8; data.len()];
        store.read(&fork, &[crate::Extent::new(0, data.len() as u64)], &mut back).unwrap();
        assert_eq!(back, data);
        // The last, partial block is rewritten up to the fork's end; past it is refused.
        store.rewrite_blocks(&fork, 3 * block, &data[3 * block as usize..]).unwrap();
        assert!(store.rewrite_blocks(&fork, 3 * block, &vec![0u8; block as usize]).is_err());
        assert!(store.rewrite_blocks(&fork, 1, &[0u8; 4]).is_err());
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(walk(&path));
            } else {
                found.push(path);
            }
        }
        found
    }
}
