//! A `lines` target's image file: formatting, recovery, block I/O and descriptor commits,
//! and the background reorganizer. The pure rules are in `lines_format` and `lines_map`.
//!
//! Order of writes: a block's data is written to its slot (and, at a sync, made durable with
//! `fdatasync`) before any descriptor names it; a descriptor copy is then written to the
//! copy slot *not* holding the durable descriptor and made durable with a second
//! `fdatasync`. A torn descriptor write thus leaves the other copy, the previous durable
//! state, valid. Reads, writes and commits of one target hold its state lock, so a
//! reorganization's copy never races a write of the same block.

use crate::lines_format::{self, Descriptor, ForkKey, Geometry, SUPERBLOCK_BYTES};
use crate::lines_image::Image;
use crate::lines_map::{CleanBlock, LineMap, SlotAddr, SlotCounts};
use crate::sim_target::SimTarget;
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Name of the image file inside a lines target's directory.
pub const LINES_IMAGE_NAME: &str = "lines.img";

/// What recovery found and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Recovery {
    pub descriptor_area_bytes: u64,
    pub elapsed: Duration,
    pub torn_copies: u64,
    pub duplicates: u64,
}

/// One lines target's image, shared by its forks.
#[derive(Debug)]
pub struct LinesDisk {
    path: PathBuf,
    file: Image,
    geometry: Geometry,
    state: Mutex<LineMap>,
    sim: Option<Arc<SimTarget>>,
    recovery: Recovery,
    /// When the image was opened; `last_io_ms` counts from here.
    opened: Instant,
    /// Milliseconds after `opened` of the last read or write of a fork (the reorganizer
    /// runs only when the disk has been idle for its interval).
    last_io_ms: AtomicU64,
    /// Clean blocks reclaimed since the image was opened.
    reclaimed_blocks: AtomicU64,
    /// Read requests made of the image (after merging adjacent slots).
    image_reads: AtomicU64,
    /// Reads and writes of forks begun (each counts before it waits for the state lock, so a
    /// reorganization step holding the lock sees that one is waiting and yields).
    io_count: AtomicU64,
}

/// Clean blocks a write that finds the target full reclaims at once (one descriptor commit
/// serves the next writes too).
const RECLAIM_BATCH_BLOCKS: u64 = 64;

fn invalid(path: &Path, reason: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("lines image {path:?}: {reason}"))
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

/// The storage engine's clock for block timestamps and the tier's ages: the system clock,
/// unless an experiment that compresses time (`flotilla bench paper rama-migration`, which
/// runs a simulated month in minutes in its own process) set it.
static SIMULATED_NOW_S: AtomicU64 = AtomicU64::new(0);

/// Sets the engine's clock to `now_s` seconds since the Unix epoch for the rest of the
/// process (0: back to the system clock). Only for experiments that replay time.
pub fn set_simulated_clock_s(now_s: u64) {
    SIMULATED_NOW_S.store(now_s, Ordering::SeqCst);
}

pub(crate) fn now_s() -> u32 {
    match SIMULATED_NOW_S.load(Ordering::Relaxed) {
        0 => SystemTime::now().duration_since(UNIX_EPOCH).map(|since| since.as_secs() as u32).unwrap_or(0),
        simulated => simulated as u32,
    }
}

/// Whether `path` (symbolic links followed) is a block device.
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_block_device())
}

/// Opens where a new image goes: a new file with its space reserved, or a block device
/// (refused if it is smaller than the image or already holds a lines superblock).
fn create_image(path: &Path, geometry: &Geometry) -> io::Result<File> {
    if !is_block_device(path) {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, geometry.image_bytes()) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP) => file.set_len(geometry.image_bytes())?,
            Err(errno) => return Err(errno.into()),
        }
        return Ok(file);
    }
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let length = Image::File(file.try_clone()?).length()?;
    if length < geometry.image_bytes() {
        return Err(invalid(
            path,
            format!("the device has {length} bytes, the image needs {}", geometry.image_bytes()),
        ));
    }
    let mut superblock = vec![0u8; SUPERBLOCK_BYTES as usize];
    file.read_exact_at(&mut superblock, 0)?;
    if lines_format::decode_superblock(&superblock).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("block device {path:?} already holds a lines image; wipe its first {SUPERBLOCK_BYTES} bytes to reformat"),
        ));
    }
    Ok(file)
}

/// Writes a new image at `path` — a new file (refusing to overwrite one) or a block device:
/// the space reserved, every line's descriptor copy A (all free, sequence 1), then the
/// superblock last, then fsync.
pub fn format(path: &Path, geometry: &Geometry) -> io::Result<()> {
    let file = create_image(path, geometry)?;
    write_empty(&Image::File(file.try_clone()?), geometry)?;
    file.sync_all()?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Writes an empty image's descriptors (copy A of every line, all free, sequence 1), then
/// the superblock, then makes them durable.
fn write_empty(image: &Image, geometry: &Geometry) -> io::Result<()> {
    let empty = LineMap::formatted(*geometry);
    for line in 0..geometry.line_count {
        let mut descriptor = empty.commit_slots(line, &[]);
        descriptor.sequence = 1;
        let bytes = lines_format::encode_descriptor(geometry, &descriptor);
        image.write_all_at(&bytes, geometry.descriptor_offset(line, 1))?;
    }
    image.write_all_at(&lines_format::encode_superblock(geometry), 0)?;
    image.sync_data()
}

impl LinesDisk {
    /// Opens an image (no simulated disk, no reorganizer) and rebuilds its state from the
    /// descriptors alone; `recovery()` says what that cost.
    pub fn open_image(path: &Path) -> io::Result<Arc<LinesDisk>> {
        LinesDisk::open(path, None)
    }

    /// Opens an image, its I/O timed on `sim` if given, and rebuilds its state from the
    /// descriptors alone.
    pub(crate) fn open(path: &Path, sim: Option<Arc<SimTarget>>) -> io::Result<Arc<LinesDisk>> {
        let file = Image::File(OpenOptions::new().read(true).write(true).open(path)?);
        LinesDisk::open_on(path, file, sim)
    }

    /// Rebuilds a disk's state from the descriptors of `file` alone.
    fn open_on(path: &Path, file: Image, sim: Option<Arc<SimTarget>>) -> io::Result<Arc<LinesDisk>> {
        let started = Instant::now();
        let mut superblock = vec![0u8; SUPERBLOCK_BYTES as usize];
        file.read_exact_at(&mut superblock, 0)
            .map_err(|error| invalid(path, format!("read superblock: {error}")))?;
        let geometry = lines_format::decode_superblock(&superblock).map_err(|error| invalid(path, error))?;
        let length = file.length()?;
        if length < geometry.image_bytes() {
            return Err(invalid(
                path,
                format!("is {length} bytes, its superblock says {}", geometry.image_bytes()),
            ));
        }
        let copy_bytes = geometry.descriptor_copy_bytes() as usize;
        let mut both = vec![0u8; 2 * copy_bytes];
        let mut descriptors = Vec::with_capacity(geometry.line_count as usize);
        let mut torn_copies = 0;
        for line in 0..geometry.line_count {
            file.read_exact_at(&mut both, geometry.descriptor_offset(line, 0))?;
            let (a, b) = both.split_at(copy_bytes);
            let (copy, descriptor) = lines_format::choose_descriptor(&geometry, line, a, b)
                .map_err(|error| invalid(path, error))?;
            let other = if copy == 0 { b } else { a };
            if descriptor.sequence > 1 && lines_format::decode_descriptor(&geometry, line, other).is_err() {
                torn_copies += 1;
            }
            descriptors.push(descriptor);
        }
        let (map, duplicates) = LineMap::recover(geometry, descriptors);
        if duplicates > 0 {
            tracing::warn!(?path, duplicates, "lines image names some blocks twice; kept the first of each");
        }
        let recovery = Recovery {
            descriptor_area_bytes: geometry.descriptor_area_bytes(),
            elapsed: started.elapsed(),
            torn_copies,
            duplicates,
        };
        tracing::info!(?path, ?recovery, "lines target recovered from its descriptors");
        Ok(Arc::new(LinesDisk {
            path: path.to_path_buf(),
            file,
            geometry,
            state: Mutex::new(map),
            sim,
            recovery,
            opened: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            reclaimed_blocks: AtomicU64::new(0),
            image_reads: AtomicU64::new(0),
            io_count: AtomicU64::new(0),
        }))
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether some line holds a fork's durable blocks out of order or with gaps that a
    /// reorganization could close.
    pub fn needs_reorganization(&self) -> bool {
        self.state.lock().plan_reorganization().is_some()
    }

    /// Bytes in slots that may be allocated now.
    pub fn free_bytes(&self) -> u64 {
        self.state.lock().reusable_slots() * u64::from(self.geometry.block_bytes)
    }

    fn block_bytes(&self) -> u64 {
        u64::from(self.geometry.block_bytes)
    }

    fn note_io(&self) {
        self.last_io_ms.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.io_count.fetch_add(1, Ordering::SeqCst);
    }

    /// How long no fork has read or written (since the image was opened, at most).
    pub fn idle_for(&self) -> Duration {
        let now_ms = self.opened.elapsed().as_millis() as u64;
        Duration::from_millis(now_ms.saturating_sub(self.last_io_ms.load(Ordering::Relaxed)))
    }

    fn slot_offset(&self, addr: SlotAddr) -> u64 {
        self.geometry.slot_offset(addr.line, addr.slot)
    }

    /// Read requests made of the image since it was opened.
    pub fn image_reads(&self) -> u64 {
        self.image_reads.load(Ordering::Relaxed)
    }

    fn pread(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        self.image_reads.fetch_add(1, Ordering::Relaxed);
        match &self.sim {
            None => self.file.read_exact_at(buffer, offset),
            Some(sim) => {
                sim.access(0, offset, buffer.len() as u64, false, || self.file.read_exact_at(buffer, offset))
            }
        }
    }

    fn pwrite(&self, buffer: &[u8], offset: u64) -> io::Result<()> {
        match &self.sim {
            None => self.file.write_all_at(buffer, offset),
            Some(sim) => {
                sim.access(0, offset, buffer.len() as u64, true, || self.file.write_all_at(buffer, offset))
            }
        }
    }

    /// Reads `buffer.len()` bytes of a fork at `offset_bytes` (holes read as zeros). Pieces
    /// in adjacent slots move in one request.
    pub fn read(&self, key: ForkKey, offset_bytes: u64, buffer: &mut [u8]) -> io::Result<()> {
        self.read_pieces(key, &mut [(offset_bytes, buffer)], &|_| false).map(|_| ())
    }

    /// Reads several ranges of a fork at once (`pieces`: fork offset and buffer each), holes
    /// as zeros; ranges whose slots are adjacent in the image — even when their block numbers
    /// are not — move in one request. Returns `false` (having read nothing it promises) if a
    /// block with no written slot is one `recall` says the archive holds (a hole the archive
    /// does not hold reads as zeros).
    pub fn read_pieces(
        &self,
        key: ForkKey,
        pieces: &mut [(u64, &mut [u8])],
        recall: &dyn Fn(u64) -> bool,
    ) -> io::Result<bool> {
        self.note_io();
        let map = self.state.lock();
        let block_bytes = self.block_bytes();
        // (offset in the image, piece, position in the piece, length)
        let mut segments: Vec<(u64, usize, usize, usize)> = Vec::new();
        for (index, (offset_bytes, buffer)) in pieces.iter_mut().enumerate() {
            let mut done = 0usize;
            while done < buffer.len() {
                let at = *offset_bytes + done as u64;
                let (block, within) = (at / block_bytes, at % block_bytes);
                let length = ((block_bytes - within) as usize).min(buffer.len() - done);
                match map.lookup(key, block) {
                    Some(addr) if map.written(addr) => {
                        segments.push((self.slot_offset(addr) + within, index, done, length))
                    }
                    _ if recall(block) => return Ok(false),
                    _ => buffer[done..done + length].fill(0),
                }
                done += length;
            }
        }
        segments.sort_unstable();
        let mut start = 0;
        while start < segments.len() {
            let mut end = start + 1;
            while end < segments.len() && segments[end - 1].0 + segments[end - 1].3 as u64 == segments[end].0
            {
                end += 1;
            }
            self.read_segments(pieces, &segments[start..end])?;
            start = end;
        }
        Ok(true)
    }

    /// One image request for segments adjacent in the image (scattered to their pieces).
    fn read_segments(
        &self,
        pieces: &mut [(u64, &mut [u8])],
        segments: &[(u64, usize, usize, usize)],
    ) -> io::Result<()> {
        if let [(image, piece, at, length)] = segments {
            return self.pread(&mut pieces[*piece].1[*at..*at + *length], *image);
        }
        let total: usize = segments.iter().map(|segment| segment.3).sum();
        let mut whole = vec![0u8; total];
        self.pread(&mut whole, segments[0].0)?;
        let mut from = 0;
        for (_, piece, at, length) in segments {
            pieces[*piece].1[*at..*at + *length].copy_from_slice(&whole[from..from + *length]);
            from += *length;
        }
        Ok(())
    }

    /// Writes `data` to a fork at `offset_bytes`, allocating slots as needed (ENOSPC when
    /// the target is full). A new slot gets its whole block (zero padded); pieces bound for
    /// adjacent slots move in one request.
    pub fn write(&self, key: ForkKey, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        self.note_io();
        let mut map = self.state.lock();
        let block_bytes = self.block_bytes();
        let stamp = now_s();
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut slots = Vec::new();
        let mut done = 0usize;
        while done < data.len() {
            let at = offset_bytes + done as u64;
            let (block, within) = (at / block_bytes, at % block_bytes);
            let length = ((block_bytes - within) as usize).min(data.len() - done);
            let addr = self.allocate_or_reclaim(&mut map, key, block, stamp)?;
            let piece = &data[done..done + length];
            let (image, bytes) = if map.written(addr) || length as u64 == block_bytes {
                (self.slot_offset(addr) + within, piece.to_vec())
            } else {
                let mut whole = vec![0u8; block_bytes as usize];
                whole[within as usize..within as usize + length].copy_from_slice(piece);
                (self.slot_offset(addr), whole)
            };
            match runs.last_mut() {
                Some((start, run)) if *start + run.len() as u64 == image => run.extend_from_slice(&bytes),
                _ => runs.push((image, bytes)),
            }
            slots.push(addr);
            done += length;
        }
        for (image, bytes) in &runs {
            self.pwrite(bytes, *image)?;
        }
        for addr in slots {
            map.mark_written(addr, stamp);
        }
        Ok(())
    }

    /// Reserves slots for every block touching `offset_bytes..+length_bytes`.
    pub fn reserve(&self, key: ForkKey, offset_bytes: u64, length_bytes: u64) -> io::Result<()> {
        if length_bytes == 0 {
            return Ok(());
        }
        let mut map = self.state.lock();
        let block_bytes = self.block_bytes();
        let stamp = now_s();
        for block in offset_bytes / block_bytes..=(offset_bytes + length_bytes - 1) / block_bytes {
            self.allocate_or_reclaim(&mut map, key, block, stamp)?;
        }
        Ok(())
    }

    /// A slot for the block; when every slot is taken, reclaims clean blocks (oldest first,
    /// committed before any is reused) and tries once more: ENOSPC only when all are dirty.
    fn allocate_or_reclaim(
        &self,
        map: &mut LineMap,
        key: ForkKey,
        block: u64,
        stamp: u32,
    ) -> io::Result<SlotAddr> {
        if let Some(addr) = map.allocate(key, block, stamp) {
            return Ok(addr);
        }
        if self.reclaim_locked(map, RECLAIM_BATCH_BLOCKS, Some(key))? == 0 {
            return Err(no_space());
        }
        map.allocate(key, block, stamp).ok_or_else(no_space)
    }

    /// Reclaims up to `blocks` clean blocks, oldest timestamp first (§4.2.3: the migration
    /// manager stamps the blocks of files it prefers to keep younger), and commits the
    /// descriptors saying so before returning, so the slots are reusable and no read can
    /// be served from them. Returns how many were reclaimed.
    pub fn reclaim(&self, blocks: u64) -> io::Result<u64> {
        let mut map = self.state.lock();
        self.reclaim_locked(&mut map, blocks, None)
    }

    /// `spare`: a fork whose blocks are not taken (the one being written or recalled, so
    /// that a recall does not drop the blocks it just made resident).
    fn reclaim_locked(&self, map: &mut LineMap, blocks: u64, spare: Option<ForkKey>) -> io::Result<u64> {
        let mut victims: Vec<CleanBlock> = map.clean_blocks();
        victims.retain(|victim| Some(victim.key) != spare);
        victims.sort_unstable_by_key(|victim| (victim.timestamp_s, victim.addr));
        victims.truncate(blocks as usize);
        self.drop_clean(map, &victims)
    }

    /// Releases a fork (`flotilla hsm release`): drops every clean block it has on disk,
    /// committed before returning. Returns how many.
    pub fn release_fork(&self, key: ForkKey) -> io::Result<u64> {
        let mut map = self.state.lock();
        let victims: Vec<CleanBlock> =
            map.clean_blocks().into_iter().filter(|victim| victim.key == key).collect();
        self.drop_clean(&mut map, &victims)
    }

    fn drop_clean(&self, map: &mut LineMap, victims: &[CleanBlock]) -> io::Result<u64> {
        let mut lines: std::collections::BTreeMap<u32, Vec<u32>> = std::collections::BTreeMap::new();
        for victim in victims {
            if map.reclaim(victim) {
                lines.entry(victim.addr.line).or_default().push(victim.addr.slot);
            }
        }
        if lines.is_empty() {
            return Ok(0);
        }
        let descriptors: Vec<Descriptor> =
            lines.iter().map(|(line, slots)| map.commit_slots(*line, slots)).collect();
        for descriptor in &descriptors {
            self.write_descriptor(map, descriptor)?;
        }
        self.file.sync_data()?;
        let reclaimed: u64 = lines.values().map(|slots| slots.len() as u64).sum();
        for descriptor in descriptors {
            map.committed(descriptor, None);
        }
        self.reclaimed_blocks.fetch_add(reclaimed, Ordering::Relaxed);
        #[cfg(test)]
        map.check();
        tracing::debug!(path = ?self.path, reclaimed, "reclaimed clean blocks");
        Ok(reclaimed)
    }

    /// How many times the fork's blocks were written or dropped since the image was opened.
    pub fn generation(&self, key: ForkKey) -> u64 {
        self.state.lock().generation(key)
    }

    /// Marks the fork's blocks below `end_block` clean (a tertiary copy holds them) and makes
    /// that durable — only if the fork's generation is still `generation` (nothing wrote or
    /// dropped a block since its data was read for the copy). Returns whether it did.
    pub fn mark_clean(
        &self,
        key: ForkKey,
        end_block: u64,
        generation: u64,
        age_bias_s: u32,
    ) -> io::Result<bool> {
        let mut map = self.state.lock();
        if map.generation(key) != generation {
            return Ok(false);
        }
        map.mark_clean(key, end_block, age_bias_s);
        self.commit_fork_locked(&mut map, key)?;
        Ok(true)
    }

    /// Whether some block touching `offset_bytes..+length_bytes` has no written slot.
    pub fn any_missing(&self, key: ForkKey, offset_bytes: u64, length_bytes: u64) -> bool {
        if length_bytes == 0 {
            return false;
        }
        let map = self.state.lock();
        let block_bytes = self.block_bytes();
        (offset_bytes / block_bytes..=(offset_bytes + length_bytes - 1) / block_bytes)
            .any(|block| !map.lookup(key, block).is_some_and(|addr| map.written(addr)))
    }

    /// Writes blocks recalled from the tertiary tier: `data` holds whole blocks from block
    /// `first_block`; only blocks with no written slot are written (a block on disk is as new
    /// or newer), marked clean, and committed.
    pub fn write_recalled(
        &self,
        key: ForkKey,
        first_block: u64,
        data: &[u8],
        timestamp_s: u32,
    ) -> io::Result<()> {
        let block_bytes = self.block_bytes() as usize;
        let mut map = self.state.lock();
        let mut written = Vec::new();
        for (index, chunk) in data.chunks(block_bytes).enumerate() {
            let block = first_block + index as u64;
            if map.lookup(key, block).is_some_and(|addr| map.written(addr)) {
                continue;
            }
            let addr = self.allocate_or_reclaim(&mut map, key, block, timestamp_s)?;
            let mut whole;
            let bytes = if chunk.len() == block_bytes {
                chunk
            } else {
                whole = vec![0u8; block_bytes];
                whole[..chunk.len()].copy_from_slice(chunk);
                &whole[..]
            };
            self.pwrite(bytes, self.slot_offset(addr))?;
            written.push(addr);
        }
        map.mark_recalled(&written, timestamp_s);
        self.commit_fork_locked(&mut map, key)
    }

    /// The fork's blocks with a slot: (block, written, clean).
    pub fn fork_blocks(&self, key: ForkKey) -> Vec<(u64, bool, bool)> {
        self.state.lock().fork_blocks(key)
    }

    /// Forks with blocks not yet clean and the newest such block's timestamp.
    pub fn dirty_forks(&self) -> Vec<(ForkKey, u32)> {
        self.state.lock().dirty_forks()
    }

    /// Dirty, clean and reusable slots.
    pub fn counts(&self) -> SlotCounts {
        self.state.lock().counts()
    }

    /// Clean blocks reclaimed since the image was opened.
    pub fn reclaimed_blocks(&self) -> u64 {
        self.reclaimed_blocks.load(Ordering::Relaxed)
    }

    /// Cuts a fork to `size_bytes`: drops whole blocks past it and zeroes the tail of the
    /// block it ends in.
    pub fn truncate(&self, key: ForkKey, size_bytes: u64) -> io::Result<()> {
        let mut map = self.state.lock();
        let block_bytes = self.block_bytes();
        map.drop_from(key, size_bytes.div_ceil(block_bytes));
        let within = size_bytes % block_bytes;
        if within > 0 {
            if let Some(addr) = map.lookup(key, size_bytes / block_bytes).filter(|addr| map.written(*addr)) {
                let zeros = vec![0u8; (block_bytes - within) as usize];
                self.pwrite(&zeros, self.slot_offset(addr) + within)?;
            }
        }
        Ok(())
    }

    /// Makes a fork's written blocks and its dropped slots durable: data first, then the
    /// descriptors of the lines it changed.
    pub fn sync(&self, key: ForkKey) -> io::Result<()> {
        let mut map = self.state.lock();
        self.commit_fork_locked(&mut map, key)
    }

    fn commit_fork_locked(&self, map: &mut LineMap, key: ForkKey) -> io::Result<()> {
        let lines = map.pending_lines(key);
        self.file.sync_data()?;
        if lines.is_empty() {
            return Ok(());
        }
        let descriptors: Vec<Descriptor> = lines.iter().map(|line| map.commit_for(*line, key)).collect();
        for descriptor in &descriptors {
            self.write_descriptor(map, descriptor)?;
        }
        self.file.sync_data()?;
        for descriptor in descriptors {
            map.committed(descriptor, Some(key));
        }
        Ok(())
    }

    /// Commits every fork's pending entries (a clean shutdown: no crash can reorder the
    /// checksum files' page cache against the image).
    pub fn sync_all(&self) -> io::Result<()> {
        let pending = self.state.lock().all_pending();
        let mut keys: Vec<ForkKey> = pending.into_iter().map(|(key, _)| key).collect();
        keys.dedup();
        keys.into_iter().try_for_each(|key| self.sync(key))
    }

    fn write_descriptor(&self, map: &LineMap, descriptor: &Descriptor) -> io::Result<()> {
        let bytes = lines_format::encode_descriptor(&self.geometry, descriptor);
        let copy = map.next_copy(descriptor.line);
        self.pwrite(&bytes, self.geometry.descriptor_offset(descriptor.line, copy))
    }

    /// One reorganization step (§4.2): picks a line where a fork's durable blocks are not
    /// contiguous, copies them into a free run of the same line, makes the copies durable,
    /// then commits the line's descriptor naming the new slots (old slots: reclaimable,
    /// reusable only once that descriptor is durable). Returns whether it moved anything.
    ///
    /// It yields to the foreground: when a fork's read or write begins during the copy (and
    /// waits for the state lock), the step stops before its next block and returns `false`
    /// having changed nothing (the partial copies lie in slots no descriptor names), so a
    /// reorganization never holds a reader up for more than one block copy.
    pub fn reorganize_once(&self) -> io::Result<bool> {
        self.reorganize_step(self.io_count.load(Ordering::SeqCst))
    }

    fn reorganize_step(&self, io_count_at_start: u64) -> io::Result<bool> {
        let mut map = self.state.lock();
        let Some((line, moves)) = map.plan_reorganization() else { return Ok(false) };
        let mut buffer = vec![0u8; self.block_bytes() as usize];
        for (from, to) in &moves {
            if self.io_count.load(Ordering::SeqCst) != io_count_at_start {
                tracing::debug!(path = ?self.path, line, "reorganization yielded to a read or write");
                return Ok(false);
            }
            self.pread(&mut buffer, self.slot_offset(*from))?;
            self.pwrite(&buffer, self.slot_offset(*to))?;
        }
        self.file.sync_data()?;
        map.apply_move(&moves);
        let slots: Vec<u32> = moves.iter().flat_map(|(from, to)| [from.slot, to.slot]).collect();
        let descriptor = map.commit_slots(line, &slots);
        self.write_descriptor(&map, &descriptor)?;
        self.file.sync_data()?;
        map.committed(descriptor, None);
        tracing::debug!(path = ?self.path, line, blocks = moves.len(), "reorganized a line");
        Ok(true)
    }
}

impl Drop for LinesDisk {
    fn drop(&mut self) {
        if let Err(error) = self.sync_all() {
            tracing::warn!(path = ?self.path, %error, "committing the descriptors at close failed");
        }
    }
}

/// The background reorganizer of one lines disk: every `interval` it reorganizes lines until
/// none needs it. Dropping it stops the thread and waits for it, so that the disk is
/// closed (and its descriptors committed) by whoever drops the target.
#[derive(Debug)]
pub struct Reorganizer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reorganizer {
    /// Starts one (`None` for a zero interval: reorganization off).
    pub fn start(disk: &Arc<LinesDisk>, interval: Duration) -> Option<Reorganizer> {
        if interval.is_zero() {
            return None;
        }
        let weak: Weak<LinesDisk> = Arc::downgrade(disk);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("flotilla-lines-reorg".into())
            .spawn(move || reorganize_until_stopped(&weak, &stopping, interval));
        match spawned {
            Ok(thread) => Some(Reorganizer { stop, thread: Some(thread) }),
            Err(error) => {
                tracing::warn!(%error, "could not start the lines reorganizer");
                None
            }
        }
    }
}

impl Drop for Reorganizer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Reorganizes only while the disk is idle (§4.2: RAMA reorganizes lines in the background):
/// a step starts when no fork has read or written for one interval, so the copies never
/// share the arm with the foreground's reads and writes for long.
fn reorganize_until_stopped(weak: &Weak<LinesDisk>, stop: &AtomicBool, interval: Duration) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(interval);
        let Some(disk) = weak.upgrade() else { return };
        while !stop.load(Ordering::SeqCst) && disk.idle_for() >= interval {
            match disk.reorganize_once() {
                Ok(true) => continue,
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(path = ?disk.path, %error, "reorganizing a line failed");
                    break;
                }
            }
        }
    }
}

impl LinesDisk {
    /// Formats and opens a lines disk on a crash-modelling medium (tests).
    #[cfg(test)]
    pub(crate) fn on_crash_image(
        image: &Arc<crate::lines_image::CrashImage>,
        geometry: &Geometry,
        format: bool,
    ) -> io::Result<Arc<LinesDisk>> {
        if format {
            write_empty(&Image::Crash(image.handle()), geometry)?;
        }
        LinesDisk::open_on(Path::new("crash-image"), Image::Crash(image.handle()), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(dir: &tempfile::TempDir, line_blocks: u32, lines: u64) -> PathBuf {
        let probe = Geometry { block_bytes: 4096, line_blocks, line_count: 1, group_blocks: line_blocks };
        let geometry = Geometry::for_capacity(
            SUPERBLOCK_BYTES + lines * probe.line_bytes(),
            4096,
            line_blocks,
            line_blocks,
        )
        .unwrap();
        let path = dir.path().join(LINES_IMAGE_NAME);
        format(&path, &geometry).unwrap();
        path
    }

    fn read(disk: &LinesDisk, key: ForkKey, block: u64) -> Vec<u8> {
        let mut out = vec![0xee; 4096];
        disk.read(key, block * 4096, &mut out).unwrap();
        out
    }

    #[test]
    fn a_reorganization_step_yields_to_a_waiting_read_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let disk = LinesDisk::open_image(&one_line(&dir, 16, 1)).unwrap();
        let (a, b) = (ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"));
        let block = disk.geometry().block_bytes as usize;
        // Interleaved writes fragment both forks in the one line.
        for index in 0..3u64 {
            disk.write(a, index * block as u64, &vec![1; block]).unwrap();
            disk.write(b, index * block as u64, &vec![2; block]).unwrap();
        }
        disk.sync(a).unwrap();
        disk.sync(b).unwrap();
        assert!(disk.needs_reorganization());
        // A read began after the step started: the step stops before copying anything.
        let started = disk.io_count.load(Ordering::SeqCst) - 1;
        assert!(!disk.reorganize_step(started).unwrap());
        assert!(disk.needs_reorganization(), "nothing was moved");
        assert!(disk.reorganize_once().unwrap());
        let mut got = vec![0u8; 3 * block];
        disk.read(a, 0, &mut got).unwrap();
        assert!(got.iter().all(|byte| *byte == 1));
    }

    #[test]
    fn pieces_in_adjacent_slots_are_read_in_one_request() {
        let dir = tempfile::tempdir().unwrap();
        let disk = LinesDisk::open_image(&one_line(&dir, 16, 1)).unwrap();
        let key = ForkKey::new(1, 0, "data");
        let block = disk.geometry().block_bytes as usize;
        // Blocks 0, 2 and 4 of a sparse fork land in consecutive slots.
        for index in [0u64, 2, 4] {
            disk.write(key, index * block as u64, &vec![index as u8 + 1; block]).unwrap();
        }
        let mut buffers = [vec![9u8; block], vec![9u8; block], vec![9u8; block], vec![9u8; block]];
        let before = disk.image_reads();
        {
            let [a, b, c, hole] = &mut buffers;
            let mut pieces: Vec<(u64, &mut [u8])> = vec![
                (0, &mut a[..]),
                (2 * block as u64, &mut b[..]),
                (4 * block as u64, &mut c[..]),
                (6 * block as u64, &mut hole[..]),
            ];
            assert!(disk.read_pieces(key, &mut pieces, &|_| false).unwrap());
        }
        assert_eq!(disk.image_reads() - before, 1, "one request for three adjacent slots");
        for (index, expected) in [1u8, 3, 5, 0].into_iter().enumerate() {
            assert!(buffers[index].iter().all(|byte| *byte == expected), "piece {index}");
        }
        // A missing block below the recall limit reads nothing.
        let mut hole = vec![0u8; block];
        let mut pieces: Vec<(u64, &mut [u8])> = vec![(6 * block as u64, &mut hole[..])];
        assert!(!disk.read_pieces(key, &mut pieces, &|missing| missing < 8).unwrap());
    }

    #[test]
    fn synced_blocks_survive_reopening_and_unsynced_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_line(&dir, 8, 2);
        let key = ForkKey::new(1, 0, "data");
        let disk = LinesDisk::open_image(&path).unwrap();
        disk.write(key, 100, b"durable").unwrap();
        disk.sync(key).unwrap();
        disk.write(key, 3 * 4096, b"lost").unwrap();
        // A crash: the handle vanishes without its closing commit.
        std::mem::forget(disk);
        let disk = LinesDisk::open_image(&path).unwrap();
        assert_eq!(&read(&disk, key, 0)[100..107], b"durable");
        assert_eq!(read(&disk, key, 3), vec![0u8; 4096]);
        let recovery = disk.recovery();
        assert_eq!(recovery.descriptor_area_bytes, 2 * 2 * 4096);
        assert_eq!(recovery.duplicates, 0);
    }

    #[test]
    fn a_torn_descriptor_write_recovers_the_previous_durable_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_line(&dir, 8, 1);
        let key = ForkKey::new(1, 0, "data");
        let disk = LinesDisk::open_image(&path).unwrap();
        disk.write(key, 0, &[1u8; 4096]).unwrap();
        disk.sync(key).unwrap();
        disk.write(key, 4096, &[2u8; 4096]).unwrap();
        disk.sync(key).unwrap();
        let geometry = *disk.geometry();
        std::mem::forget(disk);
        // The last commit (sequence 3) went to copy B; tear it in the middle.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xffu8; 512], geometry.descriptor_offset(0, 1) + 1024).unwrap();
        let disk = LinesDisk::open_image(&path).unwrap();
        assert_eq!(disk.recovery().torn_copies, 1);
        assert_eq!(read(&disk, key, 0), vec![1u8; 4096]);
        assert_eq!(read(&disk, key, 1), vec![0u8; 4096], "block 1's descriptor never became durable");
        // Tearing both copies is an error that names the line.
        drop(disk);
        file.write_all_at(&[0xffu8; 512], geometry.descriptor_offset(0, 0) + 1024).unwrap();
        let error = LinesDisk::open_image(&path).unwrap_err().to_string();
        assert!(error.contains("line 0: both descriptor copies are damaged"), "{error}");
    }

    #[test]
    fn the_reorganizer_waits_for_an_idle_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_line(&dir, 16, 1);
        let (a, b) = (ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"));
        let disk = LinesDisk::open_image(&path).unwrap();
        for block in 0..4u64 {
            disk.write(a, block * 4096, &[1; 4096]).unwrap();
            disk.write(b, block * 4096, &[2; 4096]).unwrap();
        }
        disk.sync(a).unwrap();
        disk.sync(b).unwrap();
        assert!(disk.needs_reorganization());
        let interval = Duration::from_millis(200);
        let reorganizer = Reorganizer::start(&disk, interval).expect("a reorganizer");
        // Busy: a read every few milliseconds for several intervals; nothing moves.
        let busy_until = Instant::now() + interval * 4;
        while Instant::now() < busy_until {
            assert_eq!(read(&disk, a, 0), vec![1; 4096]);
            std::thread::sleep(Duration::from_millis(5));
        }
        let moved_while_busy = !disk.needs_reorganization();
        // Idle: the reorganizer runs within a few intervals.
        let deadline = Instant::now() + Duration::from_secs(30);
        while disk.needs_reorganization() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(reorganizer);
        assert!(!moved_while_busy, "the reorganizer moved blocks while the disk was busy");
        assert!(!disk.needs_reorganization(), "the reorganizer did not run on an idle disk");
    }

    #[test]
    fn reorganization_makes_a_fork_contiguous_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_line(&dir, 16, 1);
        let (a, b) = (ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"));
        let disk = LinesDisk::open_image(&path).unwrap();
        for block in 0..4u64 {
            disk.write(a, block * 4096, &[block as u8 + 1; 4096]).unwrap();
            disk.write(b, block * 4096, &[block as u8 + 100; 4096]).unwrap();
        }
        disk.sync(a).unwrap();
        disk.sync(b).unwrap();
        let slots = |key| -> Vec<u32> {
            (0..4).map(|block| disk.state.lock().lookup(key, block).unwrap().slot).collect()
        };
        assert_eq!(slots(a), [0, 2, 4, 6], "interleaved writes interleave slots");
        let mut moves = 0;
        while disk.reorganize_once().unwrap() {
            moves += 1;
        }
        assert!(moves >= 1);
        for key in [a, b] {
            let slots = slots(key);
            assert!(slots.windows(2).all(|pair| pair[1] == pair[0] + 1), "{slots:?}");
        }
        std::mem::forget(disk);
        let disk = LinesDisk::open_image(&path).unwrap();
        for block in 0..4u64 {
            assert_eq!(read(&disk, a, block), vec![block as u8 + 1; 4096]);
            assert_eq!(read(&disk, b, block), vec![block as u8 + 100; 4096]);
        }
    }

    #[test]
    fn a_full_target_says_no_space_and_dropped_blocks_come_back_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_line(&dir, 4, 1);
        let (a, b) = (ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"));
        let disk = LinesDisk::open_image(&path).unwrap();
        disk.reserve(a, 0, 4 * 4096).unwrap();
        assert_eq!(disk.free_bytes(), 0);
        let error = disk.write(b, 0, b"x").unwrap_err();
        assert!(crate::error::is_no_space(&error), "{error}");
        disk.write(a, 0, &[7u8; 4 * 4096]).unwrap();
        disk.sync(a).unwrap();
        disk.truncate(a, 4096 + 10).unwrap();
        assert_eq!(disk.free_bytes(), 0, "dropped slots are reclaimable until the descriptor is durable");
        assert_eq!(&read(&disk, a, 1)[..12], &[7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0]);
        disk.sync(a).unwrap();
        assert_eq!(disk.free_bytes(), 2 * 4096);
        disk.write(b, 0, b"now fits").unwrap();
    }

    /// The fork blocks a test expects, per fork: the content at its last sync, and the
    /// blocks written or cut since (a crash may leave those either way).
    #[derive(Default, Clone)]
    struct Expected {
        synced: std::collections::BTreeMap<u64, Vec<u8>>,
        current: std::collections::BTreeMap<u64, Vec<u8>>,
        dirty: std::collections::BTreeSet<u64>,
        /// Byte values written to each block since the last sync (blocks are filled with
        /// one value per write, unique among recent writes).
        written: std::collections::BTreeMap<u64, Vec<u8>>,
    }

    /// Power loss on a crash-modelling medium in the middle of random writes, truncates,
    /// syncs and reorganizations of three forks (the medium stops after a random number of
    /// writes; unsynced writes are kept, dropped or torn by 512-byte sector, descriptor
    /// copies included): after recovery from the descriptors
    /// alone, every block synced and not touched since reads back exactly, blocks never
    /// written read as zeros, and no slot is named twice.
    #[test]
    fn synced_blocks_survive_torn_writes_of_data_and_descriptors() {
        use rand::{Rng, SeedableRng};
        let geometry = Geometry { block_bytes: 4096, line_blocks: 16, line_count: 6, group_blocks: 4 };
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let image = crate::lines_image::CrashImage::new(geometry.image_bytes() as usize);
            let mut disk = LinesDisk::on_crash_image(&image, &geometry, true).unwrap();
            let keys = [ForkKey::new(1, 0, "data"), ForkKey::new(2, 0, "data"), ForkKey::new(3, 1, "data")];
            let mut expected = vec![Expected::default(); keys.len()];
            let mut next_value = 0u8;
            for round in 0..4 {
                // The power fails after a random number of writes and syncs, in the middle
                // of whatever operation is under way (a data write, a descriptor copy, a move).
                image.fail_after(rng.random_range(0..60));
                for _ in 0..rng.random_range(5..30) {
                    let fork = rng.random_range(0..keys.len());
                    let (key, state) = (keys[fork], &mut expected[fork]);
                    let failed = match rng.random_range(0..10) {
                        0..6 => {
                            let block = rng.random_range(0..12u64);
                            next_value = next_value % 255 + 1;
                            let content = vec![next_value; 4096];
                            state.dirty.insert(block);
                            state.written.entry(block).or_default().push(next_value);
                            match disk.write(key, block * 4096, &content) {
                                Ok(()) => {
                                    state.current.insert(block, content);
                                    false
                                }
                                Err(error) => error.raw_os_error() != Some(libc::ENOSPC),
                            }
                        }
                        6 => {
                            let blocks = rng.random_range(0..12u64);
                            state.dirty.extend(blocks..12);
                            state.current.retain(|block, _| *block < blocks);
                            disk.truncate(key, blocks * 4096).is_err()
                        }
                        7 | 8 => match disk.sync(key) {
                            Ok(()) => {
                                state.synced = state.current.clone();
                                state.dirty.clear();
                                state.written.clear();
                                false
                            }
                            Err(_) => true,
                        },
                        _ => disk.reorganize_once().is_err(),
                    };
                    if failed {
                        break;
                    }
                }
                let counts = image.power_loss(seed * 16 + round);
                std::mem::forget(disk);
                disk = LinesDisk::on_crash_image(&image, &geometry, false).unwrap_or_else(|e| {
                    panic!("seed {seed} round {round}: recovery failed after {counts:?}: {e}")
                });
                assert_eq!(disk.recovery().duplicates, 0, "seed {seed} round {round}: a slot named twice");
                for (key, state) in keys.iter().zip(expected.iter_mut()) {
                    for block in 0..12u64 {
                        if state.dirty.contains(&block) {
                            // Unknown, but made only of this block's own bytes: zeros, its
                            // synced value, or values written to it since (torn by sector).
                            let mut allowed = [false; 256];
                            let given = state.synced.get(&block).into_iter().flatten();
                            for byte in given.chain(state.written.get(&block).into_iter().flatten()) {
                                allowed[usize::from(*byte)] = true;
                            }
                            allowed[0] = true;
                            let got = read(&disk, *key, block);
                            assert!(
                                got.iter().all(|byte| allowed[usize::from(*byte)]),
                                "seed {seed} round {round}: block {block} of {key:?} holds bytes it was never given"
                            );
                            continue;
                        }
                        let want = state.synced.get(&block).cloned().unwrap_or_else(|| vec![0; 4096]);
                        assert!(
                            read(&disk, *key, block) == want,
                            "seed {seed} round {round}: block {block} of {key:?} lost or stale after {counts:?}"
                        );
                    }
                    // What a crash left of unsynced changes is unknown: learn it, as a
                    // program would by reading, before going on.
                    state.current = (0..12u64)
                        .filter_map(|block| disk.state.lock().lookup(*key, block).map(|_| block))
                        .map(|block| (block, read(&disk, *key, block)))
                        .collect();
                    state.synced = state.current.clone();
                    state.dirty.clear();
                    state.written.clear();
                }
            }
            std::mem::forget(disk);
        }
    }
}
