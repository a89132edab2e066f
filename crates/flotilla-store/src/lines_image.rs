//! Where a lines image lives: a file or block device, or (tests) a crash-modelling medium.
//!
//! [`CrashImage`] keeps two views of the bytes — what the last `sync` made durable, and the
//! writes issued since, in order — and [`CrashImage::power_loss`] replays each unsynced write
//! onto the durable view as a disk might have left it: kept, dropped, or torn (a random
//! subset of its 512-byte sectors), from a seed. Handles opened before the power loss are
//! cut off (every operation fails), so only a reopened disk sees the crashed image. The
//! recovery tests run the lines target on it: descriptor copies torn mid-write, data written
//! after the descriptors that name it, every interleaving a crash can leave.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
#[cfg(test)]
use std::sync::Arc;

/// The bytes of one lines image.
#[derive(Debug)]
pub(crate) enum Image {
    File(File),
    #[cfg(test)]
    Crash(CrashHandle),
}

impl Image {
    pub(crate) fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Image::File(file) => file.read_exact_at(buffer, offset),
            #[cfg(test)]
            Image::Crash(handle) => handle.read(buffer, offset),
        }
    }

    pub(crate) fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        match self {
            Image::File(file) => file.write_all_at(data, offset),
            #[cfg(test)]
            Image::Crash(handle) => handle.write(data, offset),
        }
    }

    /// Makes every write issued so far durable.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        match self {
            Image::File(file) => file.sync_data(),
            #[cfg(test)]
            Image::Crash(handle) => handle.sync(),
        }
    }

    /// Bytes of the image (a block device's metadata says 0: seek to its end).
    pub(crate) fn length(&self) -> io::Result<u64> {
        match self {
            Image::File(file) => {
                let mut handle = file;
                handle.seek(SeekFrom::End(0))
            }
            #[cfg(test)]
            Image::Crash(handle) => handle.length(),
        }
    }
}

/// The atomic unit of a simulated write.
#[cfg(test)]
pub(crate) const CRASH_SECTOR_BYTES: usize = 512;

#[cfg(test)]
#[derive(Debug)]
struct CrashState {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
    generation: u64,
    /// Writes and syncs still allowed before the medium stops answering (a power loss in
    /// the middle of an operation); `None`: no limit.
    allowed: Option<usize>,
}

/// A crash-modelling medium (tests only; the bytes live in memory).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CrashImage {
    state: parking_lot::Mutex<CrashState>,
}

/// One opening of a [`CrashImage`]; cut off by the next power loss.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CrashHandle {
    image: Arc<CrashImage>,
    generation: u64,
}

#[cfg(test)]
impl CrashImage {
    pub(crate) fn new(bytes: usize) -> Arc<CrashImage> {
        Arc::new(CrashImage {
            state: parking_lot::Mutex::new(CrashState {
                durable: vec![0; bytes],
                current: vec![0; bytes],
                pending: Vec::new(),
                generation: 0,
                allowed: None,
            }),
        })
    }

    pub(crate) fn handle(self: &Arc<Self>) -> CrashHandle {
        CrashHandle { image: self.clone(), generation: self.state.lock().generation }
    }

    /// After `operations` more writes and syncs, every write and sync fails (the power is
    /// going): an operation under way stops between two of its writes.
    pub(crate) fn fail_after(&self, operations: usize) {
        self.state.lock().allowed = Some(operations);
    }

    /// Loses power: each unsynced write is kept, dropped or torn by sector (from `seed`);
    /// open handles are cut off. Returns (kept, dropped, torn) counts.
    pub(crate) fn power_loss(&self, seed: u64) -> (usize, usize, usize) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut state = self.state.lock();
        let pending = std::mem::take(&mut state.pending);
        let mut counts = (0, 0, 0);
        for (offset, data) in pending {
            let at = offset as usize;
            match rng.random_range(0..3) {
                0 => {
                    state.durable[at..at + data.len()].copy_from_slice(&data);
                    counts.0 += 1;
                }
                1 => counts.1 += 1,
                _ => {
                    for (index, sector) in data.chunks(CRASH_SECTOR_BYTES).enumerate() {
                        if rng.random_bool(0.5) {
                            let start = at + index * CRASH_SECTOR_BYTES;
                            state.durable[start..start + sector.len()].copy_from_slice(sector);
                        }
                    }
                    counts.2 += 1;
                }
            }
        }
        state.current = state.durable.clone();
        state.generation += 1;
        state.allowed = None;
        counts
    }
}

#[cfg(test)]
impl CrashHandle {
    fn live(&self) -> io::Result<parking_lot::MutexGuard<'_, CrashState>> {
        let state = self.image.state.lock();
        if state.generation != self.generation {
            return Err(io::Error::other("the crash image lost power since this handle was opened"));
        }
        Ok(state)
    }

    /// Counts one write or sync against `allowed`; fails once none is left.
    fn spend(state: &mut CrashState) -> io::Result<()> {
        match &mut state.allowed {
            Some(0) => Err(io::Error::other("the crash image's power is failing")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn span(state: &CrashState, offset: u64, length: usize) -> io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start.checked_add(length).filter(|end| *end <= state.current.len());
        end.map(|end| start..end).ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))
    }

    fn read(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        let state = self.live()?;
        let span = Self::span(&state, offset, buffer.len())?;
        buffer.copy_from_slice(&state.current[span]);
        Ok(())
    }

    fn write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.live()?;
        Self::spend(&mut state)?;
        let span = Self::span(&state, offset, data.len())?;
        state.current[span].copy_from_slice(data);
        state.pending.push((offset, data.to_vec()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.live()?;
        Self::spend(&mut state)?;
        state.durable = state.current.clone();
        state.pending.clear();
        Ok(())
    }

    fn length(&self) -> io::Result<u64> {
        Ok(self.live()?.current.len() as u64)
    }
}
