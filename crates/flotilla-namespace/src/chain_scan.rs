//! Replication's resync (issue 32): the subfiles placed on one chain, listed page by page
//! for the chain's copy source. Replicated files record each subfile's chain in their
//! inode; there is no chain → file index yet, so a page scans at most `scan_max` inode
//! rows in sequence order (replicated files are all in `inodes_by_seq`: the legacy table
//! predates them and never gains a row).

use crate::error::NamespaceError;
use crate::namespace::Namespace;
use crate::record::{Body, Inode};

/// One page of [`Namespace::chain_subfiles`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainSubfilesPage {
    /// (file id, subfile index) of each subfile placed on the chain, in sequence order.
    pub subfiles: Vec<(u64, u32)>,
    /// Where the next page starts (pass it as `after`); `None` when the scan is complete.
    pub next: Option<u64>,
}

impl Namespace {
    /// The subfiles placed on `chain` among the inodes after sequence number `after` (0 for
    /// the first page), scanning at most `scan_max` inode rows (at least one).
    pub fn chain_subfiles(
        &self,
        chain: u32,
        after: u64,
        scan_max: usize,
    ) -> Result<ChainSubfilesPage, NamespaceError> {
        self.read(|tables| {
            let mut page = ChainSubfilesPage::default();
            for (scanned, row) in tables.inodes.range(after.saturating_add(1)..)?.enumerate() {
                let (seq, record) = row?;
                let seq = seq.value();
                if scanned >= scan_max.max(1) {
                    page.next = Some(seq - 1);
                    return Ok(page);
                }
                let inode = Inode::decode(record.value())?;
                if let Body::File { chains, .. } = &inode.body {
                    let id = tables.id_of(seq);
                    for (index, _) in chains.iter().enumerate().filter(|(_, c)| **c == chain) {
                        page.subfiles.push((id, index as u32));
                    }
                }
            }
            Ok(page)
        })
    }
}

impl Namespace {
    /// An estimate of the bytes placed on each of `chains` (for `flotilla status`'s bytes
    /// left to rebuild): every replicated file's size divided evenly over its subfiles
    /// (rounded up), summed per chain, over at most `scan_max` inode rows in sequence order.
    /// `complete` is false when the scan stopped at `scan_max` (the sums are then low).
    pub fn chain_bytes_estimate(
        &self,
        chains: &std::collections::BTreeSet<u32>,
        scan_max: usize,
    ) -> Result<(std::collections::BTreeMap<u32, u64>, bool), NamespaceError> {
        let mut sums = std::collections::BTreeMap::new();
        if chains.is_empty() {
            return Ok((sums, true));
        }
        self.read(|tables| {
            for (scanned, row) in tables.inodes.range(1..)?.enumerate() {
                if scanned >= scan_max {
                    return Ok((sums, false));
                }
                let (_, record) = row?;
                let inode = Inode::decode(record.value())?;
                if let Body::File { chains: placed, .. } = &inode.body {
                    if placed.is_empty() {
                        continue;
                    }
                    let share = inode.attrs.size_bytes.div_ceil(placed.len() as u64);
                    for chain in placed.iter().filter(|c| chains.contains(c)) {
                        *sums.entry(*chain).or_insert(0u64) += share;
                    }
                }
            }
            Ok((sums, true))
        })
    }
}
