//! The client's copy of its unstable writes: every write a server acknowledged from its cache
//! stays here (the request's shape and a reference to its packed data, no copy) until a Sync
//! of its fork succeeds in the same server boot epoch the write was acknowledged in. When a
//! server restarts (a new epoch), the writes it had acknowledged but not synced are sent
//! again from here. Pure bookkeeping: the network side is in `commit.rs`.

use bytes::Bytes;
use flotilla_proto::ForkRef;
use flotilla_request::Shape;
use flotilla_types::FileId;
use std::collections::{BTreeMap, HashSet};

/// What one kept write costs besides its data (its fork, address, shape and map entry), so
/// that many tiny writes are bounded by memory too, not only by data bytes.
pub(crate) const WRITE_OVERHEAD_BYTES: u64 = 256;

/// Memory one kept write is counted for.
fn held_bytes(write: &UnstableWrite) -> u64 {
    write.data.len() as u64 + WRITE_OVERHEAD_BYTES
}

/// One acknowledged, not yet durable write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnstableWrite {
    pub fork: ForkRef,
    /// The server address the write went to.
    pub addr: String,
    pub shape: Shape,
    /// The write's data, packed in the order of the shape's pieces.
    pub data: Bytes,
    /// The server's boot epoch when it acknowledged the write (or when it was last resent).
    pub epoch: u64,
}

/// Acknowledged writes not yet known durable, in the order they were acknowledged.
#[derive(Debug, Default)]
pub(crate) struct UnstableLog {
    writes: BTreeMap<u64, UnstableWrite>,
    next_sequence: u64,
    bytes: u64,
}

impl UnstableLog {
    /// Memory held: write data plus `WRITE_OVERHEAD_BYTES` per write.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Keeps an acknowledged write; returns the memory the log holds now (see `bytes`).
    pub fn record(&mut self, write: UnstableWrite) -> u64 {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.bytes += held_bytes(&write);
        self.writes.insert(sequence, write);
        self.bytes
    }

    /// The writes matching `select`, oldest first (cheap clones: data is shared).
    pub fn select(&self, select: impl Fn(&UnstableWrite) -> bool) -> Vec<(u64, UnstableWrite)> {
        self.writes.iter().filter(|(_, w)| select(w)).map(|(s, w)| (*s, w.clone())).collect()
    }

    /// The writes matching `select` to send again to a server now in boot epoch `epoch`,
    /// oldest first: the first one acknowledged in another epoch and every one matching
    /// after it, whatever its epoch. Sent again alone, an older write would land over newer
    /// bytes of the same range: a chain's head changed (its writes in the old head's epoch,
    /// the newer ones in the new head's), and the old ones must not be the last applied.
    pub fn to_resend(
        &self,
        epoch: u64,
        select: impl Fn(&UnstableWrite) -> bool,
    ) -> Vec<(u64, UnstableWrite)> {
        let mut matching = self.select(select);
        let first_stale = matching.iter().position(|(_, w)| w.epoch != epoch).unwrap_or(matching.len());
        matching.drain(..first_stale);
        matching
    }

    /// The writes of one file, oldest first.
    #[cfg(test)]
    pub fn of_file(&self, file: FileId) -> Vec<(u64, UnstableWrite)> {
        self.select(|w| w.fork.file == file)
    }

    /// The forks with unstable writes of `file` (or of every file), each once.
    pub fn forks(&self, file: Option<FileId>) -> Vec<(ForkRef, String)> {
        let mut seen = HashSet::new();
        self.writes
            .values()
            .filter(|w| file.is_none_or(|f| w.fork.file == f))
            .filter(|w| seen.insert(w.fork.clone()))
            .map(|w| (w.fork.clone(), w.addr.clone()))
            .collect()
    }

    /// Marks a write as resent (acknowledged again) in `epoch`.
    pub fn resent(&mut self, sequence: u64, epoch: u64) {
        if let Some(write) = self.writes.get_mut(&sequence) {
            write.epoch = epoch;
        }
    }

    /// The sequence number of the newest write recorded (None when nothing was ever recorded).
    pub fn last_sequence(&self) -> Option<u64> {
        self.next_sequence.checked_sub(1)
    }

    /// A Sync of `fork`, sent when `up_to` was the newest sequence recorded, succeeded in
    /// `epoch`: every write of that fork recorded by then and acknowledged in that epoch is
    /// durable and is released. Writes from another epoch stay (they must be resent), and so do
    /// writes recorded after the Sync was sent. Returns the memory released.
    pub fn synced(&mut self, fork: &ForkRef, epoch: u64, up_to: Option<u64>) -> u64 {
        let Some(up_to) = up_to else { return 0 };
        self.release(|sequence, w| sequence <= up_to && w.fork == *fork && w.epoch == epoch)
    }

    /// Drops one write (its fork no longer exists).
    pub fn remove(&mut self, sequence: u64) {
        self.release(|s, _| s == sequence);
    }

    /// Drops every write of `fork` (it no longer exists).
    pub fn forget_fork(&mut self, fork: &ForkRef) {
        self.release(|_, w| w.fork == *fork);
    }

    /// Drops every write of `file` (a failed close given up); returns the memory released.
    pub fn forget_file(&mut self, file: FileId) -> u64 {
        self.release(|_, w| w.fork.file == file)
    }

    fn release(&mut self, drop: impl Fn(u64, &UnstableWrite) -> bool) -> u64 {
        let mut released = 0;
        self.writes.retain(|&sequence, w| {
            let dropped = drop(sequence, w);
            if dropped {
                released += held_bytes(w);
            }
            !dropped
        });
        self.bytes -= released;
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_types::{SubfileIndex, TargetId};
    use proptest::prelude::*;

    fn fork(file: u64, subfile: u32) -> ForkRef {
        ForkRef {
            target: TargetId(1),
            file: FileId(file),
            subfile: SubfileIndex(subfile),
            fork: "data".into(),
        }
    }

    fn write(file: u64, subfile: u32, bytes: usize, epoch: u64) -> UnstableWrite {
        UnstableWrite {
            fork: fork(file, subfile),
            addr: format!("server-{subfile}"),
            shape: Shape::contiguous(0, bytes as u64),
            data: Bytes::from(vec![7u8; bytes]),
            epoch,
        }
    }

    #[test]
    fn a_sync_releases_only_its_fork_and_epoch() {
        let mut log = UnstableLog::default();
        assert_eq!(log.record(write(1, 0, 10, 5)), 10 + WRITE_OVERHEAD_BYTES, "record returns what is held");
        log.record(write(1, 0, 20, 4));
        let old = log.last_sequence().unwrap();
        log.record(write(1, 1, 30, 5));
        log.record(write(2, 0, 40, 5));
        const O: u64 = WRITE_OVERHEAD_BYTES;
        assert_eq!(log.bytes(), 100 + 4 * O);
        let newest = log.last_sequence();
        log.record(write(1, 0, 5, 5));
        // Sent before the newest write was recorded, the sync covers the first only.
        assert_eq!(log.synced(&fork(1, 0), 5, Some(0)), 10 + O);
        assert_eq!(log.synced(&fork(1, 0), 5, newest), 0);
        assert_eq!(log.synced(&fork(1, 0), 5, log.last_sequence()), 5 + O);
        assert_eq!(log.bytes(), 90 + 3 * O);
        // The write acknowledged in epoch 4 survives a sync in epoch 5: it must be resent.
        assert_eq!(log.of_file(FileId(1)).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![old, 2]);
        log.resent(old, 5);
        assert_eq!(log.synced(&fork(1, 0), 5, log.last_sequence()), 20 + O);
        assert_eq!(log.forks(Some(FileId(1))), vec![(fork(1, 1), "server-1".to_string())]);
        log.forget_fork(&fork(1, 1));
        assert_eq!(log.bytes(), 40 + O);
        assert_eq!(log.forks(None).len(), 1);
    }

    #[test]
    fn a_resend_takes_every_write_after_the_first_stale_one() {
        let mut log = UnstableLog::default();
        // Epoch 5 acknowledged the first write; then the chain's head changed (epoch 9):
        // later writes of the same range were acknowledged there.
        log.record(write(1, 0, 10, 9));
        log.record(write(1, 0, 10, 5));
        log.record(write(1, 1, 10, 5));
        log.record(write(1, 0, 10, 9));
        log.record(write(1, 0, 10, 9));
        let mine = |w: &UnstableWrite| w.fork == fork(1, 0);
        // Resent alone, write 1 would be applied over writes 3 and 4: they go again after it.
        let resent: Vec<u64> = log.to_resend(9, mine).into_iter().map(|(s, _)| s).collect();
        assert_eq!(resent, vec![1, 3, 4]);
        // Nothing stale: nothing to send.
        assert!(log.to_resend(5, |w| w.fork == fork(1, 1)).is_empty());
        for sequence in resent {
            log.resent(sequence, 9);
        }
        assert!(log.to_resend(9, mine).is_empty());
    }

    #[test]
    fn forgetting_a_file_drops_all_its_forks_and_only_them() {
        let mut log = UnstableLog::default();
        log.record(write(1, 0, 10, 5));
        log.record(write(1, 1, 20, 6));
        log.record(write(2, 0, 40, 5));
        assert_eq!(log.forget_file(FileId(1)), 30 + 2 * WRITE_OVERHEAD_BYTES);
        assert_eq!(log.bytes(), 40 + WRITE_OVERHEAD_BYTES);
        assert_eq!(log.forks(None), vec![(fork(2, 0), "server-0".to_string())]);
    }

    proptest! {
        /// Whatever is recorded, synced and resent, `bytes` is the sum of what is held, and
        /// a write leaves only through a sync of its own fork in its own epoch.
        #[test]
        fn bytes_match_what_is_held(ops in proptest::collection::vec((0u8..4, 0u64..3, 0u32..3, 1usize..50, 0u64..3), 1..80)) {
            let mut log = UnstableLog::default();
            let mut model: BTreeMap<u64, UnstableWrite> = BTreeMap::new();
            for (op, file, subfile, bytes, epoch) in ops {
                match op {
                    0 | 1 => {
                        let w = write(file, subfile, bytes, epoch);
                        log.record(w.clone());
                        let s = log.last_sequence().unwrap();
                        model.insert(s, w);
                    }
                    2 => {
                        log.synced(&fork(file, subfile), epoch, log.last_sequence());
                        model.retain(|_, w| !(w.fork == fork(file, subfile) && w.epoch == epoch));
                    }
                    _ => {
                        if let Some((&s, _)) = model.iter().next() {
                            log.resent(s, epoch);
                            model.get_mut(&s).unwrap().epoch = epoch;
                        }
                    }
                }
                let held: u64 = model.values().map(held_bytes).sum();
                prop_assert_eq!(log.bytes(), held);
                prop_assert_eq!(log.select(|_| true), model.iter().map(|(s, w)| (*s, w.clone())).collect::<Vec<_>>());
            }
        }
    }
}
