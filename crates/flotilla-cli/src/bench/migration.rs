//! `flotilla bench paper rama-migration`: a synthetic month of file references with the
//! statistics of the RAMA thesis's chapter 3 (the NCAR mass-storage traces), replayed at high
//! speed on a small `lines` target with a directory archive, once per migration policy:
//! disk hit rate of reads, recalls and bytes moved.
//!
//! The workload (pure, seeded, tested apart from the replay):
//! - files are written at a steady rate over the month (computers wait for writes, §3.3.3);
//!   15% are written a second time;
//! - half the files are never read, a quarter read once, 5% more than ten times (§3.3.5,
//!   Fig. 3-7), so reads are about two thirds of all references (Table 3-2);
//! - a re-reference comes soon after the previous one — most within a day or two — with a
//!   long tail (Fig. 3-8); reads happen in working hours on weekdays (humans wait for reads);
//! - half the files are small (4–64 KiB) and hold about 2% of the data; the rest are
//!   256 KiB–4 MiB (Figs. 3-9, 3-10: the thesis's sizes divided by about 8).
//!
//! Time is compressed: the storage engine's clock is set to the simulated time
//! (`flotilla_store::set_simulated_clock_s`), every simulated hour ends with one pass of the
//! migration manager, and a write that finds the target full of dirty blocks asks for an
//! immediate migration of everything (RAMA's emergency request) and counts as a stall.

use anyhow::Context;
use flotilla_archive::{Archive, ArchiveOptions};
use flotilla_store::{Extent, ForkRef, Store, StoreConfig, StoreError, TierConfig, TierPolicy};
use flotilla_types::{FileId, SubfileIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::sync::Arc;

const HOUR_S: u64 = 3600;
const DAY_S: u64 = 24 * HOUR_S;
/// The simulated month starts on a Monday, 00:00 UTC (2024-01-01).
const START_S: u64 = 1_704_067_200;
/// Files at most this large count as small.
pub const SMALL_BYTES_MAX: u64 = 64 << 10;

/// One file of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileSpec {
    pub size_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Write,
    Read,
}

/// One reference: at `at_s` seconds after the start, `kind` of file `file` (whole file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_s: u64,
    pub file: usize,
    pub kind: Kind,
}

/// A month of references to `files` files.
pub fn generate(files: usize, days: u64, seed: u64) -> (Vec<FileSpec>, Vec<Event>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let span_s = days * DAY_S;
    let mut specs = Vec::with_capacity(files);
    let mut events = Vec::new();
    for file in 0..files {
        let size_bytes = match rng.random_bool(0.5) {
            true => rng.random_range(4u64 << 10..=SMALL_BYTES_MAX),
            false => (2f64.powf(rng.random_range(18.0..22.0))) as u64,
        };
        specs.push(FileSpec { size_bytes });
        // Created at a steady rate over the first three quarters of the month.
        let created = rng.random_range(0..span_s * 3 / 4);
        events.push(Event { at_s: created, file, kind: Kind::Write });
        if rng.random_bool(0.15) {
            let again = created + first_interval_s(&mut rng);
            if again < span_s {
                events.push(Event { at_s: again, file, kind: Kind::Write });
            }
        }
        let mut last = created;
        for index in 0..read_count(&mut rng) {
            let interval = if index == 0 { first_interval_s(&mut rng) } else { next_interval_s(&mut rng) };
            let at = working_hours(last + interval, &mut rng);
            if at >= span_s {
                break;
            }
            events.push(Event { at_s: at, file, kind: Kind::Read });
            last = at;
        }
    }
    events.sort_by_key(|event| (event.at_s, event.file, event.kind == Kind::Read));
    (specs, events)
}

/// Reads of one file (Fig. 3-7): 50% none, 25% one, 18% two to ten, 7% more (some of which
/// fall past the month's end, leaving about 5% referenced more than ten times).
fn read_count(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..100) {
        0..50 => 0,
        50..75 => 1,
        75..93 => rng.random_range(2..=10),
        _ => rng.random_range(12..=40),
    }
}

/// From a write to the first read: 60% within a day, 25% within a week, the rest later.
fn first_interval_s(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..100) {
        0..60 => exponential_s(rng, 6 * HOUR_S).min(DAY_S),
        60..85 => rng.random_range(DAY_S..7 * DAY_S),
        _ => rng.random_range(7 * DAY_S..30 * DAY_S),
    }
}

/// From one read to the next: 80% within two days (most within hours), the rest later.
fn next_interval_s(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..100) {
        0..80 => exponential_s(rng, 8 * HOUR_S).min(2 * DAY_S),
        _ => rng.random_range(2 * DAY_S..20 * DAY_S),
    }
}

fn exponential_s(rng: &mut StdRng, mean_s: u64) -> u64 {
    let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
    (-uniform.ln() * mean_s as f64) as u64
}

/// The next moment in working hours (08:00–18:00, Monday to Friday) at or after `at_s`.
pub fn working_hours(at_s: u64, rng: &mut StdRng) -> u64 {
    let mut at = at_s;
    loop {
        let day = at / DAY_S;
        let hour = (at % DAY_S) / HOUR_S;
        if day % 7 >= 5 {
            at = (day + 7 - day % 7) * DAY_S + 8 * HOUR_S + rng.random_range(0..HOUR_S);
        } else if hour < 8 {
            at = day * DAY_S + 8 * HOUR_S + rng.random_range(0..HOUR_S);
        } else if hour >= 18 {
            at = (day + 1) * DAY_S + 8 * HOUR_S + rng.random_range(0..HOUR_S);
        } else {
            return at;
        }
    }
}

/// What the generated month looks like, for comparison with chapter 3.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadStats {
    pub files: usize,
    pub never_read: f64,
    pub read_once: f64,
    pub referenced_over_ten: f64,
    pub read_share: f64,
    pub small_files: f64,
    pub small_data: f64,
    pub written_bytes: u64,
}

pub fn stats(files: &[FileSpec], events: &[Event]) -> WorkloadStats {
    let mut reads = vec![0u32; files.len()];
    let mut refs = vec![0u32; files.len()];
    let mut written_bytes = 0;
    for event in events {
        refs[event.file] += 1;
        match event.kind {
            Kind::Read => reads[event.file] += 1,
            Kind::Write => written_bytes += files[event.file].size_bytes,
        }
    }
    let fraction = |count: usize| count as f64 / files.len().max(1) as f64;
    let total: u64 = files.iter().map(|f| f.size_bytes).sum();
    let small: Vec<&FileSpec> = files.iter().filter(|f| f.size_bytes <= SMALL_BYTES_MAX).collect();
    WorkloadStats {
        files: files.len(),
        never_read: fraction(reads.iter().filter(|r| **r == 0).count()),
        read_once: fraction(reads.iter().filter(|r| **r == 1).count()),
        referenced_over_ten: fraction(refs.iter().filter(|r| **r > 10).count()),
        read_share: reads.iter().sum::<u32>() as f64 / refs.iter().sum::<u32>().max(1) as f64,
        small_files: fraction(small.len()),
        small_data: small.iter().map(|f| f.size_bytes).sum::<u64>() as f64 / total.max(1) as f64,
        written_bytes,
    }
}

/// One policy's results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub policy: String,
    pub reads: u64,
    pub disk_hits: u64,
    pub small_reads: u64,
    pub small_hits: u64,
    pub recalls: u64,
    pub read_throughs: u64,
    pub recalled_bytes: u64,
    pub archived_bytes: u64,
    pub reclaimed_bytes: u64,
    pub write_stalls: u64,
    pub elapsed_s: f64,
}

impl Outcome {
    pub fn hit_rate(&self) -> f64 {
        self.disk_hits as f64 / self.reads.max(1) as f64
    }

    pub fn small_hit_rate(&self) -> f64 {
        self.small_hits as f64 / self.small_reads.max(1) as f64
    }
}

/// The policies compared: the thesis's advice (migrate early, keep small files), migrate
/// early without the small-file preference, and migrate late (after three days).
pub fn policies() -> Vec<(&'static str, TierPolicy)> {
    let base = TierPolicy {
        archive_age_s: HOUR_S,
        keep_small_bytes: SMALL_BYTES_MAX,
        large_age_bias_s: 7 * DAY_S as u32,
        free_low_percent: 10,
        free_high_percent: 20,
        scan_interval_ms: 1000,
        recall_extent_bytes: 4 << 20,
    };
    vec![
        ("migrate early, keep small files", base.clone()),
        ("migrate early, oldest first", TierPolicy { large_age_bias_s: 0, ..base.clone() }),
        (
            "migrate after 3 days, oldest first",
            TierPolicy { archive_age_s: 3 * DAY_S, large_age_bias_s: 0, ..base },
        ),
    ]
}

/// The bytes of version `version` of file `file`: each 4 KiB chunk names its file, version
/// and place, so a block read from the wrong slot or file is caught.
fn content(file: usize, version: u32, size: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; size as usize];
    for (chunk, piece) in bytes.chunks_mut(4096).enumerate() {
        let stamp = [(file as u64), u64::from(version), chunk as u64];
        for (at, byte) in piece.iter_mut().enumerate() {
            let word = stamp[(at / 8) % 3];
            *byte = (word >> ((at % 8) * 8)) as u8 ^ (at as u8).wrapping_mul(31);
        }
    }
    bytes
}

/// Replays the month on a fresh lines target of `capacity` bytes with a directory archive.
pub fn replay(
    name: &str,
    policy: TierPolicy,
    capacity: u64,
    files: &[FileSpec],
    events: &[Event],
) -> anyhow::Result<Outcome> {
    let started = std::time::Instant::now();
    let (target, archive_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let spec = format!(
        "lines,capacity={capacity},block=64k,line_blocks=256,group_blocks=16,reorganize_ms=0:{}",
        target.path().display()
    );
    let archive =
        Archive::open(archive_dir.path().to_str().context("archive path")?, ArchiveOptions::default())?;
    let config = StoreConfig {
        block_bytes: 64 << 10,
        cache_capacity_bytes: 8 << 20,
        tier: Some(TierConfig { archive: Arc::new(archive), policy }),
        ..StoreConfig::new(vec![spec.into()], true)
    };
    let store = Store::open(config)?;
    let target_id = store.target_ids()[0];
    let mut versions = vec![0u32; files.len()];
    let mut outcome = Outcome { policy: name.to_string(), ..Outcome::default() };
    let mut hour = 0;
    for event in events {
        while hour < event.at_s / HOUR_S {
            hour += 1;
            flotilla_store::set_simulated_clock_s(START_S + hour * HOUR_S);
            store.tier_pass(target_id)?;
        }
        flotilla_store::set_simulated_clock_s(START_S + event.at_s);
        let fork = ForkRef::new(target_id, FileId(event.file as u64 + 1), SubfileIndex(0), "data");
        let size = files[event.file].size_bytes;
        match event.kind {
            Kind::Write => {
                versions[event.file] += 1;
                if versions[event.file] == 1 {
                    store.create_subfile(target_id, fork.file, fork.subfile)?;
                }
                let data = content(event.file, versions[event.file], size);
                write_or_stall(&store, &fork, &data, &mut outcome)?;
            }
            Kind::Read => {
                let misses = |stats: flotilla_store::TierStats| stats.recalls + stats.read_throughs;
                let before = misses(store.tier_stats(target_id)?.unwrap_or_default());
                let mut got = vec![0u8; size as usize];
                store.read(&fork, &[Extent::new(0, size)], &mut got)?;
                anyhow::ensure!(
                    got == content(event.file, versions[event.file], size),
                    "file {} read back wrong under policy {name:?}",
                    event.file
                );
                let hit = misses(store.tier_stats(target_id)?.unwrap_or_default()) == before;
                outcome.reads += 1;
                outcome.disk_hits += u64::from(hit);
                if size <= SMALL_BYTES_MAX {
                    outcome.small_reads += 1;
                    outcome.small_hits += u64::from(hit);
                }
            }
        }
    }
    let stats = store.tier_stats(target_id)?.unwrap_or_default();
    flotilla_store::set_simulated_clock_s(0);
    outcome.recalls = stats.recalls;
    outcome.read_throughs = stats.read_throughs;
    outcome.recalled_bytes = stats.recalled_bytes;
    outcome.archived_bytes = stats.archived_bytes;
    outcome.reclaimed_bytes = stats.reclaimed_blocks * stats.block_bytes;
    outcome.elapsed_s = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// Writes and syncs a file; a target full of dirty blocks gets an emergency migration of
/// everything dirty (the writer waits for it: a stall), then the write is tried again.
fn write_or_stall(
    store: &Store,
    fork: &ForkRef<'_>,
    data: &[u8],
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let write =
        || store.write(fork, &[Extent::new(0, data.len() as u64)], data).and_then(|()| store.sync(fork));
    match write() {
        Ok(()) => Ok(()),
        Err(StoreError::TargetFull { .. }) => {
            outcome.write_stalls += 1;
            store.tier_pass_aged(fork.target, Some(0))?;
            let wanted = (data.len() as u64).div_ceil(64 << 10) + 64;
            store.reclaim(fork.target, wanted)?;
            write().context("write after an emergency migration")
        }
        Err(error) => Err(error.into()),
    }
}

/// Runs every policy and prints (or returns as JSON) the comparison.
pub fn run(quick: bool, json_out: bool) -> anyhow::Result<()> {
    let (files, capacity) = if quick { (120, 24u64 << 20) } else { (1200, 160u64 << 20) };
    let (specs, events) = generate(files, 30, 0x5eed_2026);
    let workload = stats(&specs, &events);
    let mut outcomes = Vec::new();
    for (name, policy) in policies() {
        outcomes.push(replay(name, policy, capacity, &specs, &events)?);
    }
    if json_out {
        let rows: Vec<_> = outcomes
            .iter()
            .map(|o| {
                json!({"policy": o.policy, "reads": o.reads, "disk_hit_rate": o.hit_rate(),
                       "small_file_hit_rate": o.small_hit_rate(), "recalls": o.recalls, "read_throughs": o.read_throughs,
                       "recalled_bytes": o.recalled_bytes, "archived_bytes": o.archived_bytes,
                       "reclaimed_bytes": o.reclaimed_bytes, "write_stalls": o.write_stalls,
                       "elapsed_s": o.elapsed_s})
            })
            .collect();
        let w = workload;
        println!(
            "{}",
            json!({"experiment": "rama-migration", "files": w.files, "capacity_bytes": capacity,
                   "written_bytes": w.written_bytes, "never_read": w.never_read, "read_once": w.read_once,
                   "referenced_over_ten": w.referenced_over_ten, "read_share": w.read_share,
                   "small_files": w.small_files, "small_data": w.small_data, "policies": rows})
        );
        return Ok(());
    }
    print_workload(&workload, capacity);
    println!(
        "{:<36} {:>6} {:>9} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10} {:>7}",
        "policy",
        "reads",
        "disk hit",
        "small hit",
        "recalls",
        "through",
        "recalled",
        "archived",
        "reclaimed",
        "stalls"
    );
    let mib = |bytes: u64| format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64);
    for o in &outcomes {
        println!(
            "{:<36} {:>6} {:>8.1}% {:>9.1}% {:>8} {:>8} {:>10} {:>10} {:>10} {:>7}",
            o.policy,
            o.reads,
            o.hit_rate() * 100.0,
            o.small_hit_rate() * 100.0,
            o.recalls,
            o.read_throughs,
            mib(o.recalled_bytes),
            mib(o.archived_bytes),
            mib(o.reclaimed_bytes),
            o.write_stalls
        );
    }
    Ok(())
}

fn print_workload(w: &WorkloadStats, capacity: u64) {
    println!("== RAMA chapter 3: a synthetic month, replayed on a {} MiB lines target", capacity >> 20);
    println!(
        "{} files, {} MiB written; never read {:.0}% (thesis 50%), read once {:.0}% (25%), \
         referenced >10 times {:.0}% (5%), reads {:.0}% of references (66%), small files {:.0}% \
         holding {:.1}% of the data (about half, 2%)",
        w.files,
        w.written_bytes >> 20,
        w.never_read * 100.0,
        w.read_once * 100.0,
        w.referenced_over_ten * 100.0,
        w.read_share * 100.0,
        w.small_files * 100.0,
        w.small_data * 100.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_month_has_the_theses_reference_statistics() {
        let (files, events) = generate(4000, 30, 7);
        let w = stats(&files, &events);
        // Reads past the month's end are cut, so never-read comes out a little above 50%.
        assert!((0.48..0.62).contains(&w.never_read), "{w:?}");
        assert!((0.18..0.30).contains(&w.read_once), "{w:?}");
        assert!((0.02..0.07).contains(&w.referenced_over_ten), "{w:?}");
        assert!((0.55..0.75).contains(&w.read_share), "{w:?}");
        assert!((0.45..0.55).contains(&w.small_files), "{w:?}");
        assert!(w.small_data < 0.05, "{w:?}");
        assert!(events.windows(2).all(|pair| pair[0].at_s <= pair[1].at_s));
    }

    #[test]
    fn reads_fall_in_working_hours_and_writes_do_not_have_to() {
        let (_, events) = generate(2000, 30, 11);
        for event in events.iter().filter(|e| e.kind == Kind::Read) {
            let (day, hour) = (event.at_s / DAY_S, (event.at_s % DAY_S) / HOUR_S);
            assert!(day % 7 < 5 && (8..18).contains(&hour), "read at day {day} hour {hour}");
        }
        let night_writes =
            events.iter().filter(|e| e.kind == Kind::Write && (e.at_s % DAY_S) / HOUR_S < 8).count();
        assert!(night_writes > 0, "writes come at a steady rate, night included");
    }

    #[test]
    fn content_names_its_file_version_and_chunk() {
        assert_ne!(content(1, 1, 8192)[4096..], content(1, 1, 8192)[..4096]);
        assert_ne!(content(1, 1, 4096), content(1, 2, 4096));
        assert_ne!(content(1, 1, 4096), content(2, 1, 4096));
    }
}
