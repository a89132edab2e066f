//! A crash-modelling fork backend for tests (feature `test-support`, target spec
//! `crash:DIR`), after redb's crash-consistency backend.
//!
//! The namespace (subfile directories, fork files) lives in `DIR` as for the `dir` kind; the
//! fork's bytes and checksum entries live in memory, in a [`CrashDisk`] shared by every store
//! opened on `DIR` in this process. Each fork keeps two views: what was made durable by its
//! last `sync_data`, and the writes issued since (in order). [`CrashDisk::power_loss`] replays
//! each unsynced write onto the durable view as a real disk might have left it: kept,
//! dropped, or torn (a random subset of its 512-byte sectors, or of its 4-byte checksum
//! entries), from a seed. Afterwards the stores that were open are cut off (their forks fail
//! every operation, so their own shutdown flush cannot undo the crash) and a store reopened on
//! `DIR` sees the crashed state.
//!
//! Memory is not bounded: this is for tests with small forks only.

use crate::backend::ForkBackend;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The atomic unit of a simulated data write.
pub const CRASH_SECTOR_BYTES: u64 = 512;

/// The crash disks of this process, by target directory.
static DISKS: OnceLock<Mutex<HashMap<PathBuf, Arc<CrashDisk>>>> = OnceLock::new();

/// A fork's bytes and checksum entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Content {
    data: Vec<u8>,
    entries: Vec<u32>,
}

/// One write issued since the fork's last sync.
#[derive(Clone, Debug)]
enum PendingOp {
    Data { offset: u64, bytes: Vec<u8> },
    Entries { first: u64, entries: Vec<u32> },
    SetSize(u64),
    TruncateEntries(u64),
}

#[derive(Debug, Default)]
struct ForkImage {
    location: u64,
    durable: Content,
    current: Content,
    pending: Vec<PendingOp>,
}

#[derive(Debug, Default)]
struct DiskState {
    generation: u64,
    next_location: u64,
    images: BTreeMap<PathBuf, ForkImage>,
}

/// What a power loss did to the unsynced writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerLossReport {
    pub writes_kept: u64,
    pub writes_dropped: u64,
    pub writes_torn: u64,
}

/// The in-memory medium of one `crash:` target.
#[derive(Debug, Default)]
pub struct CrashDisk {
    state: Mutex<DiskState>,
}

impl CrashDisk {
    /// The crash disk of target directory `dir` (created empty on first use).
    pub fn for_dir(dir: &Path) -> Arc<CrashDisk> {
        let disks = DISKS.get_or_init(|| Mutex::new(HashMap::new()));
        disks.lock().entry(dir.to_path_buf()).or_default().clone()
    }

    /// Simulates a power loss: every write not covered by a `sync_data` of its fork is kept,
    /// dropped or torn at random (from `seed`); stores open until now are cut off.
    pub fn power_loss(&self, seed: u64) -> PowerLossReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut report = PowerLossReport::default();
        let mut state = self.state.lock();
        state.generation += 1;
        for image in state.images.values_mut() {
            let mut content = image.durable.clone();
            for op in image.pending.drain(..) {
                match rng.random_range(0..3u8) {
                    0 => {
                        apply(&mut content, &op, &mut |_| true);
                        report.writes_kept += 1;
                    }
                    1 => report.writes_dropped += 1,
                    _ => {
                        apply(&mut content, &op, &mut |_| rng.random_bool(0.5));
                        report.writes_torn += 1;
                    }
                }
            }
            image.durable = content.clone();
            image.current = content;
        }
        report
    }

    /// Bytes of the fork at `path` as the medium holds them now (for tests' own checks).
    pub fn current_data(&self, path: &Path) -> Option<Vec<u8>> {
        self.state.lock().images.get(path).map(|image| image.current.data.clone())
    }
}

/// Applies `op` to `content`, each sector (data) or entry (checksums) only if `keep` says so.
fn apply(content: &mut Content, op: &PendingOp, keep: &mut dyn FnMut(()) -> bool) {
    match op {
        PendingOp::Data { offset, bytes } => {
            let mut at = 0usize;
            while at < bytes.len() {
                let absolute = offset + at as u64;
                let sector_end = (absolute / CRASH_SECTOR_BYTES + 1) * CRASH_SECTOR_BYTES;
                let length = ((sector_end - absolute) as usize).min(bytes.len() - at);
                if keep(()) {
                    write_bytes(&mut content.data, absolute, &bytes[at..at + length]);
                }
                at += length;
            }
        }
        PendingOp::Entries { first, entries } => {
            for (index, entry) in entries.iter().enumerate() {
                if keep(()) {
                    write_entries(&mut content.entries, first + index as u64, &[*entry]);
                }
            }
        }
        PendingOp::SetSize(size) => {
            if keep(()) {
                content.data.resize(*size as usize, 0);
            }
        }
        PendingOp::TruncateEntries(blocks) => {
            if keep(()) {
                content.entries.truncate(*blocks as usize);
            }
        }
    }
}

fn write_bytes(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

fn write_entries(entries: &mut Vec<u32>, first: u64, new: &[u32]) {
    let start = first as usize;
    let end = start + new.len();
    if entries.len() < end {
        entries.resize(end, 0);
    }
    entries[start..end].copy_from_slice(new);
}

/// A target's attachment to its crash disk, in the generation it was opened in.
#[derive(Debug)]
pub(crate) struct CrashHandle {
    disk: Arc<CrashDisk>,
    generation: u64,
}

impl CrashHandle {
    pub(crate) fn attach(dir: &Path) -> CrashHandle {
        let disk = CrashDisk::for_dir(dir);
        let generation = disk.state.lock().generation;
        CrashHandle { disk, generation }
    }

    pub(crate) fn open(&self, path: &Path) -> CrashFork {
        let mut state = self.disk.state.lock();
        let location = state.next_location;
        let image = state.images.entry(path.to_path_buf()).or_default();
        if image.location == 0 {
            image.location = location + 1;
        }
        state.next_location += 1;
        CrashFork { disk: self.disk.clone(), generation: self.generation, path: path.to_path_buf() }
    }

    /// Drops the images of forks at or below `path` (their files were removed).
    pub(crate) fn forget(&self, path: &Path) {
        self.disk.state.lock().images.retain(|image_path, _| !image_path.starts_with(path));
    }
}

/// One fork on a crash disk.
#[derive(Debug)]
pub struct CrashFork {
    disk: Arc<CrashDisk>,
    generation: u64,
    path: PathBuf,
}

impl CrashFork {
    /// Runs `action` on the fork's image, unless the power was lost since it was opened.
    fn with_image<T>(&self, action: impl FnOnce(&mut ForkImage) -> T) -> io::Result<T> {
        let mut state = self.disk.state.lock();
        if state.generation != self.generation {
            return Err(io::Error::other("simulated power loss: the device is gone"));
        }
        let image = state.images.entry(self.path.clone()).or_default();
        Ok(action(image))
    }

    fn issue(&self, op: PendingOp) -> io::Result<()> {
        self.with_image(|image| {
            apply(&mut image.current, &op, &mut |_| true);
            image.pending.push(op);
        })
    }
}

impl ForkBackend for CrashFork {
    fn read_at(&self, offset_bytes: u64, buffers: &mut [&mut [u8]]) -> io::Result<usize> {
        self.with_image(|image| {
            let data = &image.current.data;
            let mut position = offset_bytes as usize;
            let mut below_end = 0usize;
            for buffer in buffers.iter_mut() {
                let available = data.len().saturating_sub(position).min(buffer.len());
                if available > 0 {
                    buffer[..available].copy_from_slice(&data[position..position + available]);
                }
                buffer[available..].fill(0);
                below_end += available;
                position += buffer.len();
            }
            below_end
        })
    }

    fn write_at(&self, offset_bytes: u64, buffers: &[&[u8]]) -> io::Result<()> {
        self.issue(PendingOp::Data { offset: offset_bytes, bytes: buffers.concat() })
    }

    fn allocate(&self, offset_bytes: u64, length_bytes: u64, grow_size: bool) -> io::Result<()> {
        let end = offset_bytes + length_bytes;
        if grow_size && end > self.size_bytes()? {
            return self.issue(PendingOp::SetSize(end));
        }
        Ok(())
    }

    fn set_size(&self, size_bytes: u64) -> io::Result<()> {
        self.issue(PendingOp::SetSize(size_bytes))
    }

    fn read_checksums(&self, first_block: u64, entries: &mut [u32]) -> io::Result<()> {
        self.with_image(|image| {
            for (index, entry) in entries.iter_mut().enumerate() {
                let at = first_block as usize + index;
                *entry = image.current.entries.get(at).copied().unwrap_or(0);
            }
        })
    }

    fn write_checksums(&self, first_block: u64, entries: &[u32]) -> io::Result<()> {
        self.issue(PendingOp::Entries { first: first_block, entries: entries.to_vec() })
    }

    fn allocate_checksums(&self, _offset_bytes: u64, _length_bytes: u64) -> io::Result<()> {
        Ok(())
    }

    fn truncate_checksums(&self, blocks: u64) -> io::Result<()> {
        self.issue(PendingOp::TruncateEntries(blocks))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with_image(|image| {
            image.durable = image.current.clone();
            image.pending.clear();
        })
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.with_image(|image| image.current.data.len() as u64)
    }

    fn location(&self) -> u64 {
        self.disk.state.lock().images.get(&self.path).map_or(0, |image| image.location)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_are_lost_or_torn_and_synced_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let handle = CrashHandle::attach(dir.path());
        let path = dir.path().join("fork");
        let fork = handle.open(&path);
        fork.write_at(0, &[&[1u8; 1024]]).unwrap();
        fork.sync_data().unwrap();
        let mut torn_seen = false;
        for seed in 0..64 {
            fork_after_crash(&handle, &path, seed, &mut torn_seen);
        }
        assert!(torn_seen, "no seed tore the unsynced write");
    }

    fn fork_after_crash(handle: &CrashHandle, path: &Path, seed: u64, torn_seen: &mut bool) {
        let fork = CrashHandle::attach(path.parent().unwrap()).open(path);
        fork.write_at(0, &[&[2u8; 1024]]).unwrap();
        handle.disk.power_loss(seed);
        assert!(fork.write_at(0, &[b"x"]).is_err(), "seed {seed}: a cut-off fork still wrote");
        let data = handle.disk.current_data(path).unwrap();
        assert_eq!(data.len(), 1024, "seed {seed}");
        for sector in data.chunks(CRASH_SECTOR_BYTES as usize) {
            assert!(sector.iter().all(|byte| *byte == sector[0]), "seed {seed}: a sector was split");
        }
        *torn_seen |= data[0] != data[1023];
        // Make this seed's outcome the durable state for the next round.
        let fresh = CrashHandle::attach(path.parent().unwrap()).open(path);
        fresh.sync_data().unwrap();
    }
}
