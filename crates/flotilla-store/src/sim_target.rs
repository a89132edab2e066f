//! Target kinds and the `sim` kind's shared disk: the one arm every fork of a simulated
//! target moves.
//!
//! A target is named by a spec: `DIR` or `dir:DIR` for the `dir` kind, `sim:MODEL:DIR` (for
//! example `sim:hp97560:/data/t0` or `sim:st31200n,track_buffer=256k:/data/t0`) for a
//! simulated disk whose data lives, for real, in the `dir` layout under `DIR`.
//!
//! Each fork is given a region of the simulated disk when it is first opened in this
//! process (its inode is the key, so the fd cache reopening it finds the same region):
//! regions are handed out one after another, each as large as the fork is or
//! `SIM_REGION_BYTES_MIN`, rounded up to a cylinder, wrapping at the disk's capacity. Fork
//! byte `i` lies at `region + i`, where a file system that keeps logical gaps physically
//! (ext4 aims a new extent at its logical distance from its neighbour) would put it; a
//! sparse fork therefore spreads over its whole range. That is the *contiguous* layout; with
//! `layout=random-blocks` each block of a fork lies at a hashed block of the disk instead
//! ([`disk_pieces`]).
//!
//! Simulated time runs in real time: a request computes its service time from the disk's
//! state (`SimDisk`), does the real file I/O, and sleeps until the simulated completion, with
//! the arm held, so requests to one target are served one at a time, as by one disk. The
//! real I/O's own time is thus part of, not added to, the simulated time (Galley §6.1.2).

use crate::error::StoreError;
use crate::sim_disk::SimDisk;
use crate::sim_model::SimModel;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Smallest region a fork gets on a simulated disk.
pub const SIM_REGION_BYTES_MIN: u64 = 32 << 20;
/// Most forks with a remembered region per simulated disk; past it the map starts afresh.
pub const SIM_REGIONS_MAX: usize = 65_536;

/// What kind of storage a target is.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetKind {
    /// Forks are files in a directory.
    Dir,
    /// Forks are files in a directory, timed as on a simulated disk of this model.
    Sim(SimModel),
    /// Fork blocks in one preallocated image cut into RAMA disk lines (`lines:DIR`, see
    /// `lines_disk`), optionally timed as on a simulated disk (`lines+sim:MODEL:DIR`).
    Lines(Box<LinesOptions>),
    /// Tests only (`crash:DIR`, feature `test-support`): the namespace lives in `DIR`, fork
    /// bytes in memory with a simulated power loss (see `CrashDisk`).
    #[cfg(feature = "test-support")]
    Crash,
}

/// Default capacity of a lines image created when a target is initialized.
pub const LINES_CAPACITY_BYTES_DEFAULT: u64 = 256 << 20;
/// Default block size of a new lines image.
pub const LINES_BLOCK_BYTES_DEFAULT: u64 = 64 << 10;
/// Default blocks per line of a new lines image.
pub const LINE_BLOCKS_DEFAULT: u32 = 512;
/// Default RAMA sequentiality (consecutive blocks of a fork per line) of a new lines image.
pub const LINES_GROUP_BLOCKS_DEFAULT: u32 = 64;
/// Default pause of the background reorganizer between passes (0: never reorganize).
pub const LINES_REORGANIZE_INTERVAL_MS_DEFAULT: u64 = 1000;

/// The settings of a `lines` target: the image's geometry (used only when the image is
/// created; an existing image keeps what its superblock says), the reorganizer's interval
/// and the simulated disk under it, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct LinesOptions {
    pub capacity_bytes: u64,
    pub block_bytes: u64,
    pub line_blocks: u32,
    pub group_blocks: u32,
    pub reorganize_interval_ms: u64,
    /// Read a fork's queued pieces whose slots are adjacent in one request (`gather=0`: one
    /// request per run of consecutive blocks, for comparison).
    pub gather_reads: bool,
    pub sim: Option<SimModel>,
}

impl Default for LinesOptions {
    fn default() -> Self {
        LinesOptions {
            capacity_bytes: LINES_CAPACITY_BYTES_DEFAULT,
            block_bytes: LINES_BLOCK_BYTES_DEFAULT,
            line_blocks: LINE_BLOCKS_DEFAULT,
            group_blocks: LINES_GROUP_BLOCKS_DEFAULT,
            reorganize_interval_ms: LINES_REORGANIZE_INTERVAL_MS_DEFAULT,
            gather_reads: true,
            sim: None,
        }
    }
}

impl LinesOptions {
    /// Parses `OPTION=VALUE` pairs separated by commas (`capacity`, `block`, `line_blocks`,
    /// `group_blocks`, `reorganize_ms`, `gather`); sizes take k/m/g suffixes.
    pub fn parse(text: &str) -> Result<LinesOptions, String> {
        let mut options = LinesOptions::default();
        for option in text.split(',').filter(|option| !option.is_empty()) {
            let Some((key, value)) = option.split_once('=') else {
                return Err(format!("lines option {option:?} is not KEY=VALUE"));
            };
            let size =
                || flotilla_types::parse_size(value).ok_or_else(|| format!("bad size {value:?} for {key}"));
            let count = || value.parse::<u32>().map_err(|_| format!("bad count {value:?} for {key}"));
            match key {
                "capacity" => options.capacity_bytes = size()?,
                "block" => options.block_bytes = size()?,
                "line_blocks" => options.line_blocks = count()?,
                "group_blocks" => options.group_blocks = count()?,
                "reorganize_ms" => {
                    options.reorganize_interval_ms =
                        value.parse().map_err(|_| format!("bad interval {value:?} for {key}"))?
                }
                "gather" => {
                    options.gather_reads = match value {
                        "1" => true,
                        "0" => false,
                        _ => return Err(format!("gather must be 0 or 1, not {value:?}")),
                    }
                }
                other => return Err(format!("unknown lines option {other:?}")),
            }
        }
        if options.group_blocks > options.line_blocks {
            options.group_blocks = options.line_blocks;
        }
        Ok(options)
    }

    /// The geometry a new image gets.
    pub fn geometry(&self) -> Result<crate::lines_format::Geometry, String> {
        crate::lines_format::Geometry::for_capacity(
            self.capacity_bytes,
            self.block_bytes,
            self.line_blocks,
            self.group_blocks,
        )
        .map_err(|error| error.0)
    }
}

/// A parsed target spec: its kind and its directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSpec {
    pub kind: TargetKind,
    pub dir: PathBuf,
}

impl TargetSpec {
    /// Parses `DIR`, `dir:DIR` or `sim:MODEL[,OPTION=VALUE]:DIR`.
    pub fn parse(spec: &Path) -> Result<TargetSpec, StoreError> {
        let bad = |reason: String| StoreError::BadConfig { name: "targets", reason };
        let Some(text) = spec.to_str() else {
            return Ok(TargetSpec { kind: TargetKind::Dir, dir: spec.to_path_buf() });
        };
        if let Some(dir) = text.strip_prefix("dir:") {
            return Ok(TargetSpec { kind: TargetKind::Dir, dir: dir.into() });
        }
        #[cfg(feature = "test-support")]
        if let Some(dir) = text.strip_prefix("crash:") {
            return Ok(TargetSpec { kind: TargetKind::Crash, dir: dir.into() });
        }
        if let Some(rest) = text.strip_prefix("lines") {
            if rest.starts_with([',', ':', '+']) {
                return parse_lines(text, rest);
            }
        }
        let Some(rest) = text.strip_prefix("sim:") else {
            return Ok(TargetSpec { kind: TargetKind::Dir, dir: spec.to_path_buf() });
        };
        let Some((model, dir)) = rest.split_once(':') else {
            return Err(bad(format!("target spec {text:?} must be sim:MODEL:DIR")));
        };
        if dir.is_empty() {
            return Err(bad(format!("target spec {text:?} names no directory")));
        }
        let model = SimModel::parse(model).map_err(|error| bad(format!("target spec {text:?}: {error}")))?;
        Ok(TargetSpec { kind: TargetKind::Sim(model), dir: dir.into() })
    }
}

/// Parses what follows `lines` in a spec: `[,OPTIONS][+sim:MODEL]:DIR`.
fn parse_lines(text: &str, rest: &str) -> Result<TargetSpec, StoreError> {
    let bad = |reason: String| StoreError::BadConfig {
        name: "targets",
        reason: format!("target spec {text:?}: {reason}"),
    };
    let options_end = rest.find([':', '+']).unwrap_or(rest.len());
    let mut options = LinesOptions::parse(&rest[..options_end]).map_err(bad)?;
    let mut rest = &rest[options_end..];
    if let Some(sim) = rest.strip_prefix("+sim:") {
        let Some((model, _)) = sim.split_once(':') else {
            return Err(bad("must be lines+sim:MODEL:DIR".into()));
        };
        options.sim = Some(SimModel::parse(model).map_err(|error| bad(error.to_string()))?);
        rest = &sim[model.len()..];
    }
    let Some(dir) = rest.strip_prefix(':').filter(|dir| !dir.is_empty()) else {
        return Err(bad("names no directory (lines[,OPTIONS][+sim:MODEL]:DIR)".into()));
    };
    options.geometry().map_err(bad)?;
    Ok(TargetSpec { kind: TargetKind::Lines(Box::new(options)), dir: dir.into() })
}

#[derive(Debug)]
struct ArmState {
    disk: SimDisk,
    regions: HashMap<u64, u64>,
    next_region: u64,
}

/// The simulated disk of one target, shared by its forks.
#[derive(Debug)]
pub(crate) struct SimTarget {
    epoch: Instant,
    state: Mutex<ArmState>,
}

impl SimTarget {
    pub(crate) fn new(model: SimModel) -> SimTarget {
        SimTarget {
            epoch: Instant::now(),
            state: Mutex::new(ArmState {
                disk: SimDisk::new(model),
                regions: HashMap::new(),
                next_region: 0,
            }),
        }
    }

    /// The region of the fork with this key (inode), allocating one if it has none.
    pub(crate) fn region(&self, key: u64, size_bytes: u64) -> u64 {
        let mut state = self.state.lock();
        if let Some(start) = state.regions.get(&key) {
            return *start;
        }
        if state.regions.len() >= SIM_REGIONS_MAX {
            state.regions.clear();
        }
        let model = state.disk.model();
        let length = size_bytes.max(SIM_REGION_BYTES_MIN).next_multiple_of(model.cylinder_bytes());
        let capacity = model.capacity_bytes();
        let start = state.next_region % capacity;
        state.next_region = (start + length) % capacity;
        state.regions.insert(key, start);
        start
    }

    /// Runs `real_io` as a request for `length_bytes` at byte `offset_bytes` of the fork whose
    /// region starts at `region_start`: holds the arm, and returns no earlier than the
    /// simulated completion. In the contiguous layout that is one disk access; in the
    /// random-blocks layout one access per block of the fork the request touches, in order.
    pub(crate) fn access<T>(
        &self,
        region_start: u64,
        offset_bytes: u64,
        length_bytes: u64,
        is_write: bool,
        real_io: impl FnOnce() -> T,
    ) -> T {
        let mut state = self.state.lock();
        let model = state.disk.model();
        let pieces = disk_pieces(
            region_start,
            offset_bytes,
            length_bytes,
            model.random_block_bytes,
            model.capacity_bytes(),
        );
        let mut done_ns = self.epoch.elapsed().as_nanos() as f64;
        for (position, length) in pieces {
            done_ns = state.disk.service(position, length, is_write, done_ns);
        }
        let result = real_io();
        let done = self.epoch + Duration::from_nanos(done_ns as u64);
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
        drop(state);
        result
    }
}

/// The disk extents (position, length) that hold `length_bytes` at `offset_bytes` of the
/// fork whose region starts at `region_start`. With `random_block_bytes` 0 (contiguous) that
/// is the one extent at `region_start + offset_bytes`; otherwise each block `b` of the fork
/// lies at a block of the disk chosen by a hash of (region, `b`), and extents that happen to
/// be adjacent on the disk are merged. Pure.
pub(crate) fn disk_pieces(
    region_start: u64,
    offset_bytes: u64,
    length_bytes: u64,
    random_block_bytes: u64,
    capacity_bytes: u64,
) -> Vec<(u64, u64)> {
    if random_block_bytes == 0 {
        return vec![(region_start.wrapping_add(offset_bytes), length_bytes)];
    }
    let disk_blocks = (capacity_bytes / random_block_bytes).max(1);
    let mut pieces: Vec<(u64, u64)> = Vec::new();
    let (mut at, end) = (offset_bytes, offset_bytes.saturating_add(length_bytes));
    while at < end {
        let block = at / random_block_bytes;
        let within = at % random_block_bytes;
        let length = (random_block_bytes - within).min(end - at);
        let position = mix(region_start, block) % disk_blocks * random_block_bytes + within;
        match pieces.last_mut() {
            Some(last) if last.0 + last.1 == position => last.1 += length,
            _ => pieces.push((position, length)),
        }
        at += length;
    }
    pieces
}

/// A 64-bit mix of a fork's region and a block number (splitmix64's finalizer).
fn mix(region_start: u64, block: u64) -> u64 {
    let mut z = region_start ^ block.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_target_specs() {
        let dir = TargetSpec::parse(Path::new("/data/t0")).unwrap();
        assert_eq!(dir, TargetSpec { kind: TargetKind::Dir, dir: "/data/t0".into() });
        assert_eq!(TargetSpec::parse(Path::new("dir:/x")).unwrap().dir, PathBuf::from("/x"));
        let sim = TargetSpec::parse(Path::new("sim:hp97560:/data/t1")).unwrap();
        assert_eq!(sim.dir, PathBuf::from("/data/t1"));
        assert!(matches!(sim.kind, TargetKind::Sim(ref model) if model.name == "hp97560"));
        let buffered = TargetSpec::parse(Path::new("sim:st31200n,track_buffer=64k:rel/dir")).unwrap();
        assert!(matches!(buffered.kind, TargetKind::Sim(ref model) if model.track_buffer_bytes == 64 << 10));
        for bad in ["sim:hp97560", "sim:hp97560:", "sim:nope:/x"] {
            assert!(matches!(TargetSpec::parse(Path::new(bad)), Err(StoreError::BadConfig { .. })), "{bad}");
        }
    }

    #[test]
    fn parses_lines_specs() {
        let plain = TargetSpec::parse(Path::new("lines:/data/t0")).unwrap();
        assert_eq!(plain.dir, PathBuf::from("/data/t0"));
        assert_eq!(plain.kind, TargetKind::Lines(Box::default()));
        let tuned =
            TargetSpec::parse(Path::new("lines,capacity=8m,block=4k,line_blocks=32,reorganize_ms=0:/x"))
                .unwrap();
        let TargetKind::Lines(options) = tuned.kind else { panic!("not lines") };
        assert_eq!((options.capacity_bytes, options.block_bytes, options.line_blocks), (8 << 20, 4096, 32));
        assert_eq!((options.group_blocks, options.reorganize_interval_ms), (32, 0));
        let sim = TargetSpec::parse(Path::new("lines+sim:st31200n:/d")).unwrap();
        assert!(matches!(sim.kind, TargetKind::Lines(ref o) if o.sim.as_ref().unwrap().name == "st31200n"));
        assert_eq!(sim.dir, PathBuf::from("/d"));
        for bad in
            ["lines:", "lines,block=3:/x", "lines,speed=1:/x", "lines+sim:nope:/x", "lines+sim:st31200n"]
        {
            assert!(matches!(TargetSpec::parse(Path::new(bad)), Err(StoreError::BadConfig { .. })), "{bad}");
        }
        // A directory whose name starts with "lines" is still a dir target.
        assert_eq!(TargetSpec::parse(Path::new("linesdir")).unwrap().kind, TargetKind::Dir);
    }

    #[test]
    fn regions_are_stable_and_disjoint() {
        let target = SimTarget::new(SimModel::hp97560());
        let first = target.region(10, 0);
        let second = target.region(11, 100 << 20);
        let third = target.region(12, 0);
        assert_eq!(target.region(10, 5), first);
        assert!(second >= first + SIM_REGION_BYTES_MIN);
        assert!(third >= second + (100 << 20));
    }

    #[test]
    fn a_request_takes_its_simulated_time_in_real_time() {
        let target = SimTarget::new(SimModel::hp97560());
        let start = Instant::now();
        // A full-stroke seek and a 64 KiB write: at least 23 ms of seek plus 27 ms of transfer.
        target.access(0, 0, 4096, true, || ());
        let begun = Instant::now();
        target.access(SimModel::hp97560().capacity_bytes() - (64 << 10), 0, 64 << 10, true, || ());
        let took = begun.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_millis(150), "{took:?}");
        assert!(start.elapsed() >= took);
    }

    #[test]
    fn the_contiguous_layout_is_one_extent_at_the_region() {
        assert_eq!(disk_pieces(1 << 20, 4096, 100_000, 0, 1 << 30), vec![((1 << 20) + 4096, 100_000)]);
    }

    #[test]
    fn random_blocks_cost_more_disk_time_than_contiguous() {
        let model = SimModel::parse("hp97560,layout=random-blocks").unwrap();
        let time = |block_bytes: u64| {
            let mut disk = SimDisk::new(model.clone());
            let mut done_ns = 0.0;
            for (position, length) in disk_pieces(64 << 20, 0, 1 << 20, block_bytes, model.capacity_bytes()) {
                done_ns = disk.service(position, length, true, done_ns);
            }
            done_ns
        };
        let (contiguous, random) = (time(0), time(model.random_block_bytes));
        // 128 blocks of 8 KiB, each with a seek and a rotation, against one 1 MiB transfer.
        assert!(random > 3.0 * contiguous, "random {random} ns, contiguous {contiguous} ns");
    }

    proptest::proptest! {
        #[test]
        fn random_blocks_cover_the_request_and_stay_on_the_disk(
            region in 0u64..(1 << 40), offset in 0u64..(1 << 30), length in 0u64..(1 << 20), shift in 9u32..17
        ) {
            let (block, capacity) = (1u64 << shift, 1u64 << 30);
            let pieces = disk_pieces(region, offset, length, block, capacity);
            proptest::prop_assert_eq!(pieces.iter().map(|p| p.1).sum::<u64>(), length);
            for (position, piece) in &pieces {
                proptest::prop_assert!(position + piece <= capacity + block, "{position}+{piece}");
            }
            // A block is always at the same place: asking for the request's first byte alone
            // finds it where the whole request put it.
            if length > 0 {
                let first = disk_pieces(region, offset, 1, block, capacity);
                proptest::prop_assert_eq!(first[0].0, pieces[0].0);
            }
        }
    }
}
