//! The mechanical state of one simulated disk and the time each request takes: pure logic,
//! no sleeping, no I/O, so that the models can be checked without waiting (RAMA Fig. 5-2).
//!
//! A request is served as: controller overhead; then, track by track, a seek to the track's
//! cylinder (Equation 5-1; the head switch happens during the seek) or a head switch, a
//! rotational wait until the track's next wanted sector comes under the head (the disk's
//! rotational position is a function of time: the platter turned since time 0), and the
//! transfer at the media rate. Tracks are skewed (see `SimModel::angle_of`), so a long
//! sequential transfer loses only the switch time at each track boundary.
//!
//! With a track buffer, the drive keeps reading ahead after a read until the buffer is full or
//! the next request comes; a read that starts inside what was read ahead is served at bus
//! speed and, if it runs past it, continues from where the read-ahead has got to without a
//! seek or a rotational wait. A write invalidates the buffer.
//!
//! Invariants: times are nanoseconds since the disk's time 0 and never go backwards for one
//! request; the head's cylinder is always below `cylinders`.

use crate::sim_model::{SimModel, SIM_SECTOR_BYTES};

/// Read-ahead after the last read.
#[derive(Clone, Copy, Debug)]
struct ReadAhead {
    /// First sector of the last read (the buffer also holds it, as far as it fits).
    first: u64,
    /// Where read-ahead starts: the sector after the last read.
    next: u64,
    /// When the last read finished and read-ahead started.
    started_ns: f64,
}

/// One simulated disk: its model, where its head is, what its buffer holds.
#[derive(Clone, Debug)]
pub struct SimDisk {
    model: SimModel,
    cylinder: u32,
    surface: u32,
    read_ahead: Option<ReadAhead>,
}

/// Where a walk over consecutive sectors ended.
#[derive(Clone, Copy, Debug)]
struct Walk {
    sectors: u64,
    end_ns: f64,
    cylinder: u32,
    surface: u32,
}

impl SimDisk {
    pub fn new(model: SimModel) -> SimDisk {
        SimDisk { model, cylinder: 0, surface: 0, read_ahead: None }
    }

    pub fn model(&self) -> &SimModel {
        &self.model
    }

    /// Serves a request of `length_bytes` at byte `position` of the disk arriving at `now_ns`
    /// (with the disk idle); returns when it completes.
    pub fn service(&mut self, position: u64, length_bytes: u64, is_write: bool, now_ns: f64) -> f64 {
        let first = position / SIM_SECTOR_BYTES;
        let end = position.saturating_add(length_bytes.max(1)).div_ceil(SIM_SECTOR_BYTES);
        let sectors = end - first;
        let start_ns = now_ns + self.model.overhead_ms * 1e6;
        let finish_ns = if is_write {
            self.settle_read_ahead(now_ns);
            self.read_ahead = None;
            self.media(first, sectors, start_ns)
        } else {
            let finish_ns = self.read(first, sectors, now_ns, start_ns);
            self.read_ahead = Some(ReadAhead { first, next: end, started_ns: finish_ns });
            finish_ns
        };
        debug_assert!(finish_ns >= now_ns);
        finish_ns
    }

    fn buffer_sectors(&self) -> u64 {
        self.model.track_buffer_bytes / SIM_SECTOR_BYTES
    }

    /// A read: from the buffer if it starts inside what was read ahead, else from the media.
    fn read(&mut self, first: u64, sectors: u64, now_ns: f64, start_ns: f64) -> f64 {
        let Some(ahead) = self.read_ahead.filter(|_| self.buffer_sectors() > 0) else {
            return self.media(first, sectors, start_ns);
        };
        let progress = self.read_ahead_progress(ahead, now_ns);
        let buffered_end = ahead.next + progress.sectors;
        let buffered_start = ahead.first.max(buffered_end.saturating_sub(self.buffer_sectors()));
        self.cylinder = progress.cylinder;
        self.surface = progress.surface;
        if first < buffered_start || first >= buffered_end {
            return self.media(first, sectors, start_ns);
        }
        let hit = sectors.min(buffered_end - first);
        let bus_done_ns = start_ns + (hit * SIM_SECTOR_BYTES) as f64 / self.model.bus_bytes_per_s * 1e9;
        if hit == sectors {
            return bus_done_ns;
        }
        // The rest streams on: the read-ahead simply goes on reading.
        let already = buffered_end - ahead.next;
        let media_done_ns = self.media(ahead.next, already + sectors - hit, ahead.started_ns);
        bus_done_ns.max(media_done_ns)
    }

    /// How far read-ahead got by `now_ns` (it stops when the buffer is full).
    fn read_ahead_progress(&self, ahead: ReadAhead, now_ns: f64) -> Walk {
        let limit = self.buffer_sectors().max(1);
        let mut probe = self.clone();
        probe.walk(ahead.next, limit, ahead.started_ns, Some(now_ns))
    }

    /// Moves the head to where read-ahead left it (before a write).
    fn settle_read_ahead(&mut self, now_ns: f64) {
        if let Some(ahead) = self.read_ahead.filter(|_| self.buffer_sectors() > 0) {
            let progress = self.read_ahead_progress(ahead, now_ns);
            self.cylinder = progress.cylinder;
            self.surface = progress.surface;
        }
    }

    /// Transfers `sectors` from `first` on the media, starting at `start_ns`.
    fn media(&mut self, first: u64, sectors: u64, start_ns: f64) -> f64 {
        let walk = self.walk(first, sectors, start_ns, None);
        debug_assert_eq!(walk.sectors, sectors);
        walk.end_ns
    }

    /// Walks `sectors` consecutive sectors from `first`, track by track, starting at
    /// `start_ns`; with a deadline, stops there and reports how many sectors were passed.
    fn walk(&mut self, first: u64, sectors: u64, start_ns: f64, deadline_ns: Option<f64>) -> Walk {
        let model = &self.model;
        let sector_ns = model.sector_ns();
        let per_track = f64::from(model.sectors_per_track);
        let mut now = start_ns;
        let mut done = 0u64;
        let tracks_max = sectors / u64::from(model.sectors_per_track) + 2;
        for _ in 0..tracks_max {
            if done == sectors {
                break;
            }
            let (cylinder, surface, index) = model.locate(first + done);
            let positioning_ns = if cylinder != self.cylinder {
                model.seek_ns(cylinder.abs_diff(self.cylinder)).max(model.head_switch_ms * 1e6)
            } else if surface != self.surface {
                model.head_switch_ms * 1e6
            } else {
                0.0
            };
            now += positioning_ns;
            if deadline_ns.is_some_and(|deadline| now >= deadline) {
                break;
            }
            self.cylinder = cylinder;
            self.surface = surface;
            let under_head = (now / sector_ns).rem_euclid(per_track);
            let mut wait =
                (model.angle_of(cylinder, surface, index) as f64 - under_head).rem_euclid(per_track);
            if wait > per_track - 1e-6 {
                wait = 0.0;
            }
            now += wait * sector_ns;
            let in_track = (u64::from(model.sectors_per_track) - u64::from(index)).min(sectors - done);
            if let Some(deadline) = deadline_ns {
                if now + in_track as f64 * sector_ns > deadline {
                    let passed = ((deadline - now).max(0.0) / sector_ns) as u64;
                    done += passed.min(in_track);
                    return Walk { sectors: done, end_ns: deadline, cylinder, surface };
                }
            }
            now += in_track as f64 * sector_ns;
            done += in_track;
        }
        Walk { sectors: done, end_ns: now, cylinder: self.cylinder, surface: self.surface }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Mean time of random 4 KiB reads, each arriving at a random moment after the last.
    fn mean_random_4k_ms(model: SimModel) -> f64 {
        let mut disk = SimDisk::new(model.clone());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let sectors = model.total_sectors() - 8;
        let (mut now, mut total, count) = (0.0f64, 0.0f64, 20_000);
        for _ in 0..count {
            now += rng.random_range(0.0..model.revolution_ns() * 3.0);
            let position = rng.random_range(0..sectors) * SIM_SECTOR_BYTES;
            let done = disk.service(position, 4096, rng.random_bool(0.5), now);
            total += done - now;
            now = done;
        }
        total / count as f64 / 1e6
    }

    /// Rate of one long sequential read, and of a stream of 1 MiB reads issued back to back
    /// with `gap_ns` between one's completion and the next one's arrival.
    fn sequential_rates(model: SimModel, gap_ns: f64) -> (f64, f64) {
        let mut disk = SimDisk::new(model.clone());
        let bytes = 64u64 << 20;
        let single = bytes as f64 / (disk.service(0, bytes, false, 0.0) / 1e9);
        let mut disk = SimDisk::new(model);
        let mut now = 0.0;
        for index in 0..64u64 {
            now = disk.service(index << 20, 1 << 20, false, now) + gap_ns;
        }
        (single, bytes as f64 / (now / 1e9))
    }

    #[test]
    fn random_4k_access_time_is_within_ten_percent_of_the_published_figure() {
        for model in [SimModel::hp97560(), SimModel::st31200n()] {
            let published = model.published.random_4k_access_ms();
            let measured = mean_random_4k_ms(model.clone());
            eprintln!("{}: random 4 KiB {measured:.2} ms (published {published:.2} ms)", model.name);
            let error = (measured - published).abs() / published;
            assert!(error < 0.10, "{}: {measured:.2} ms vs {published:.2} ms", model.name);
        }
    }

    #[test]
    fn sustained_rate_is_within_ten_percent_of_the_published_figure() {
        for model in [SimModel::hp97560(), SimModel::st31200n()] {
            let published = model.published.sustained_bytes_per_s;
            let (single, _) = sequential_rates(model.clone(), 0.0);
            eprintln!("{}: sustained {single:.0} B/s (published {published:.0} B/s)", model.name);
            let error = (single - published).abs() / published;
            assert!(error < 0.10, "{}: {single:.0} B/s vs {published:.0} B/s", model.name);
        }
    }

    #[test]
    fn track_buffer_hides_gaps_between_sequential_reads() {
        let gap_ns = 2e6;
        let (single, with_buffer) = sequential_rates(SimModel::hp97560(), gap_ns);
        assert!(with_buffer > 0.9 * single, "{with_buffer} vs {single}");
        let mut unbuffered = SimModel::hp97560();
        unbuffered.track_buffer_bytes = 0;
        let (_, without_buffer) = sequential_rates(unbuffered, gap_ns);
        assert!(without_buffer < with_buffer, "{without_buffer} vs {with_buffer}");
    }

    #[test]
    fn rereading_buffered_data_costs_only_the_bus() {
        let mut disk = SimDisk::new(SimModel::hp97560());
        let done = disk.service(1 << 20, 32 << 10, false, 0.0);
        let again = disk.service(1 << 20, 32 << 10, false, done);
        let bus_ms = (32 << 10) as f64 / 10e6 * 1e3 + 0.5;
        assert!(((again - done) / 1e6 - bus_ms).abs() < 0.01);
    }

    #[test]
    fn far_requests_cost_more_than_near_ones() {
        let model = SimModel::st31200n();
        let mut near = SimDisk::new(model.clone());
        let mut far = SimDisk::new(model.clone());
        let mut total_near = 0.0;
        let mut total_far = 0.0;
        for i in 0..100u64 {
            let now = i as f64 * 1e8;
            total_near += near.service((i % 2) * model.cylinder_bytes(), 4096, true, now) - now;
            total_far += far.service((i % 2) * (model.capacity_bytes() - 4096), 4096, true, now) - now;
        }
        assert!(total_far > total_near + 100.0 * 15e6, "{total_far} vs {total_near}");
    }
}
