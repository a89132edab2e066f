//! Parameters of a simulated 1990s disk (the `sim` target kind) and the pure arithmetic on
//! them: geometry, the seek curve, skews. No state, no time, no I/O.
//!
//! The seek curve is RAMA's Equation 5-1 (Miller's thesis, §5.1.2, after Lee and Katz):
//! `seek(d) = A·√(d−1) + B·(d−1) + min` for a move of `d ≥ 1` cylinders, `seek(0) = 0`, with
//! `A = (−10·min + 15·avg − 5·max) / (3·√C)` and `B = (7·min − 15·avg + 8·max) / (3·C)` for
//! `C` cylinders. (The thesis as printed has `+5·max` in `A`; with that sign the curve does
//! not reach `max` at full stroke. With `−5·max` it does, and its mean over uniformly random
//! start and end cylinders is exactly `avg` — both are checked by the tests.)
//!
//! Two built-in models carry the papers' figures:
//! - `hp97560` — the disk Galley (§6.1.2) and ENWRICH simulate: 1962 cylinders, 19 surfaces,
//!   72 sectors of 512 bytes per track, 4002 RPM, 13.5 ms average seek, 2.2 MB/s sustained,
//!   a 128 KiB read-ahead track buffer. Minimum and maximum seek are Ruemmler and Wilkes'
//!   fitted curve (3.24 + 0.4·√d ms, 8 + 0.008·d ms) at 1 and 1961 cylinders; the head switch
//!   (1.6 ms) is what makes the published 2.2 MB/s sustained rate.
//! - `st31200n` — RAMA's Table 5-1: 2700 cylinders, 9 surfaces, 40 KiB per track, 5400 RPM,
//!   1 / 9 / 22 ms minimum / average / maximum seek, a 4 MB/s bus; like RAMA's model it has
//!   no track buffer. Its head switch (0.8 ms) is our assumption; the table gives none.
//!
//! Both take 0.5 ms of controller overhead per command (an assumption). A model spec is
//! `NAME[,track_buffer=BYTES]`, e.g. `st31200n,track_buffer=256k` or `hp97560,track_buffer=0`.

use std::fmt;

/// Bytes per sector of every model.
pub const SIM_SECTOR_BYTES: u64 = 512;

/// The random-blocks layout's block unless `layout_block` says otherwise: the ENWRICH paper's
/// 8 KB file-system block.
pub const SIM_LAYOUT_BLOCK_BYTES_DEFAULT: u64 = 8 << 10;

/// A disk model: geometry, mechanics and interface.
#[derive(Clone, Debug, PartialEq)]
pub struct SimModel {
    pub name: &'static str,
    pub cylinders: u32,
    pub surfaces: u32,
    pub sectors_per_track: u32,
    pub rpm: u32,
    pub seek_min_ms: f64,
    pub seek_avg_ms: f64,
    pub seek_max_ms: f64,
    /// Switching to another surface of the same cylinder.
    pub head_switch_ms: f64,
    /// Controller and command overhead, once per request.
    pub overhead_ms: f64,
    /// Interface rate, for data already in the track buffer.
    pub bus_bytes_per_s: f64,
    /// Read-ahead buffer; 0 disables it.
    pub track_buffer_bytes: u64,
    /// Where a fork's bytes lie on the disk: 0 for the *contiguous* layout (fork byte `i` at
    /// its region's start + `i`); otherwise the *random-blocks* layout of the ENWRICH paper
    /// (§4): each block of this many bytes of a fork at a pseudo-random block of the disk.
    pub random_block_bytes: u64,
    /// The published figures the model is checked against.
    pub published: PublishedFigures,
}

/// What the papers and data sheets say about a disk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PublishedFigures {
    pub seek_avg_ms: f64,
    /// Sustained sequential transfer rate, bytes per second.
    pub sustained_bytes_per_s: f64,
    /// Bytes per track times revolutions per second.
    pub media_bytes_per_s: f64,
    pub rpm: u32,
}

impl PublishedFigures {
    /// Average time of a random 4 KiB access from the published figures: average seek, half
    /// a revolution, and the transfer at the media rate.
    pub fn random_4k_access_ms(&self) -> f64 {
        self.seek_avg_ms + 30_000.0 / f64::from(self.rpm) + 4096.0 / self.media_bytes_per_s * 1e3
    }
}

/// Why a model spec cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimModelError(pub String);

impl fmt::Display for SimModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl SimModel {
    /// The HP 97560 of Galley and ENWRICH.
    pub fn hp97560() -> SimModel {
        SimModel {
            name: "hp97560",
            cylinders: 1962,
            surfaces: 19,
            sectors_per_track: 72,
            rpm: 4002,
            seek_min_ms: 3.64,
            seek_avg_ms: 13.5,
            seek_max_ms: 23.69,
            head_switch_ms: 1.6,
            overhead_ms: 0.5,
            bus_bytes_per_s: 10e6,
            track_buffer_bytes: 128 << 10,
            random_block_bytes: 0,
            published: PublishedFigures {
                seek_avg_ms: 13.5,
                sustained_bytes_per_s: 2.2e6,
                media_bytes_per_s: 72.0 * 512.0 * 4002.0 / 60.0,
                rpm: 4002,
            },
        }
    }

    /// The Seagate ST31200N of RAMA's Table 5-1.
    pub fn st31200n() -> SimModel {
        let media = 80.0 * 512.0 * 5400.0 / 60.0;
        SimModel {
            name: "st31200n",
            cylinders: 2700,
            surfaces: 9,
            sectors_per_track: 80,
            rpm: 5400,
            seek_min_ms: 1.0,
            seek_avg_ms: 9.0,
            seek_max_ms: 22.0,
            head_switch_ms: 0.8,
            overhead_ms: 0.5,
            bus_bytes_per_s: 4e6,
            track_buffer_bytes: 0,
            random_block_bytes: 0,
            published: PublishedFigures {
                seek_avg_ms: 9.0,
                sustained_bytes_per_s: media,
                media_bytes_per_s: media,
                rpm: 5400,
            },
        }
    }

    /// Names of the built-in models.
    pub const NAMES: [&'static str; 2] = ["hp97560", "st31200n"];

    /// Parses `NAME[,track_buffer=BYTES][,layout=contiguous|random-blocks][,layout_block=BYTES]`
    /// (sizes take a k, m or g suffix; `layout_block` is the random-blocks layout's block,
    /// [`SIM_LAYOUT_BLOCK_BYTES_DEFAULT`] by default).
    pub fn parse(spec: &str) -> Result<SimModel, SimModelError> {
        let mut parts = spec.split(',');
        let name = parts.next().unwrap_or_default().trim();
        let mut model = match name {
            "hp97560" => SimModel::hp97560(),
            "st31200n" => SimModel::st31200n(),
            other => {
                return Err(SimModelError(format!(
                    "unknown disk model {other:?} (known: {})",
                    SimModel::NAMES.join(", ")
                )))
            }
        };
        let (mut random_blocks, mut layout_block_bytes) = (false, SIM_LAYOUT_BLOCK_BYTES_DEFAULT);
        for option in parts {
            let Some((key, value)) = option.split_once('=') else {
                return Err(SimModelError(format!("disk model option {option:?} is not KEY=VALUE")));
            };
            let size = |what: &str| {
                flotilla_types::parse_size(value)
                    .ok_or_else(|| SimModelError(format!("bad {what} size {value:?}")))
            };
            match key.trim() {
                "track_buffer" => model.track_buffer_bytes = size("track_buffer")?,
                "layout" => {
                    random_blocks = match value.trim() {
                        "contiguous" => false,
                        "random-blocks" => true,
                        other => {
                            return Err(SimModelError(format!(
                                "unknown layout {other:?} (known: contiguous, random-blocks)"
                            )))
                        }
                    }
                }
                "layout_block" => {
                    layout_block_bytes = size("layout_block")?;
                    if layout_block_bytes < SIM_SECTOR_BYTES || layout_block_bytes % SIM_SECTOR_BYTES != 0 {
                        return Err(SimModelError(format!(
                            "layout_block {value:?} must be a positive multiple of {SIM_SECTOR_BYTES} bytes"
                        )));
                    }
                }
                other => return Err(SimModelError(format!("unknown disk model option {other:?}"))),
            }
        }
        if random_blocks {
            model.random_block_bytes = layout_block_bytes;
        }
        Ok(model)
    }

    pub fn revolution_ns(&self) -> f64 {
        60e9 / f64::from(self.rpm)
    }

    pub fn sector_ns(&self) -> f64 {
        self.revolution_ns() / f64::from(self.sectors_per_track)
    }

    pub fn track_bytes(&self) -> u64 {
        u64::from(self.sectors_per_track) * SIM_SECTOR_BYTES
    }

    pub fn cylinder_bytes(&self) -> u64 {
        self.track_bytes() * u64::from(self.surfaces)
    }

    pub fn total_sectors(&self) -> u64 {
        u64::from(self.cylinders) * u64::from(self.surfaces) * u64::from(self.sectors_per_track)
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.total_sectors() * SIM_SECTOR_BYTES
    }

    /// Seek time for a move of `distance` cylinders (Equation 5-1), in nanoseconds.
    pub fn seek_ns(&self, distance: u32) -> f64 {
        if distance == 0 {
            return 0.0;
        }
        let cylinders = f64::from(self.cylinders);
        let (min, avg, max) = (self.seek_min_ms, self.seek_avg_ms, self.seek_max_ms);
        let a = (-10.0 * min + 15.0 * avg - 5.0 * max) / (3.0 * cylinders.sqrt());
        let b = (7.0 * min - 15.0 * avg + 8.0 * max) / (3.0 * cylinders);
        let x = f64::from(distance - 1);
        (a * x.sqrt() + b * x + min) * 1e6
    }

    /// Sectors by which each track's first sector is rotated past the previous track's, so
    /// that a head switch completes just before it comes under the head.
    pub fn head_skew_sectors(&self) -> u32 {
        (self.head_switch_ms * 1e6 / self.sector_ns()).ceil() as u32
    }

    /// The same for the first track of the next cylinder (a one-cylinder seek).
    pub fn cylinder_skew_sectors(&self) -> u32 {
        (self.seek_ns(1) / self.sector_ns()).ceil() as u32
    }

    /// Cylinder, surface and sector-in-track of an absolute sector (wrapping at capacity).
    pub fn locate(&self, sector: u64) -> (u32, u32, u32) {
        let sector = sector % self.total_sectors();
        let per_track = u64::from(self.sectors_per_track);
        let track = sector / per_track;
        let cylinder = (track / u64::from(self.surfaces)) as u32;
        let surface = (track % u64::from(self.surfaces)) as u32;
        (cylinder, surface, (sector % per_track) as u32)
    }

    /// Angular position (in sectors from the index mark) of sector `index` of a track.
    pub fn angle_of(&self, cylinder: u32, surface: u32, index: u32) -> u64 {
        let track = u64::from(cylinder) * u64::from(self.surfaces) + u64::from(surface);
        let head = u64::from(self.head_skew_sectors());
        let cylinder_extra = u64::from(self.cylinder_skew_sectors()).saturating_sub(head);
        (u64::from(index) + track * head + u64::from(cylinder) * cylinder_extra)
            % u64::from(self.sectors_per_track)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_random_seek_ms(model: &SimModel) -> f64 {
        // Exact mean over uniformly random (from, to) cylinder pairs: distance d has weight
        // 2·(C − d) for d ≥ 1 and C for d = 0, over C² pairs.
        let c = u64::from(model.cylinders);
        let total: f64 =
            (1..c).map(|d| 2.0 * (c - d) as f64 * model.seek_ns(d as u32)).sum::<f64>() / (c * c) as f64;
        total / 1e6
    }

    #[test]
    fn seek_curve_meets_min_avg_and_max() {
        for model in [SimModel::hp97560(), SimModel::st31200n()] {
            assert_eq!(model.seek_ns(0), 0.0);
            assert!((model.seek_ns(1) / 1e6 - model.seek_min_ms).abs() < 1e-9);
            let full = model.seek_ns(model.cylinders) / 1e6;
            assert!((full - model.seek_max_ms).abs() / model.seek_max_ms < 0.01, "{}: {full}", model.name);
            let mean = mean_random_seek_ms(&model);
            assert!((mean - model.seek_avg_ms).abs() / model.seek_avg_ms < 0.02, "{}: {mean}", model.name);
            for d in 1..model.cylinders {
                assert!(model.seek_ns(d + 1) >= model.seek_ns(d), "seek curve must not decrease");
            }
        }
    }

    #[test]
    fn geometry_matches_the_papers() {
        let hp = SimModel::hp97560();
        assert_eq!(hp.track_bytes(), 36 << 10);
        assert!((hp.capacity_bytes() as f64 / 1e6 - 1374.0).abs() < 1.0);
        let st = SimModel::st31200n();
        assert_eq!(st.track_bytes(), 40 << 10);
        assert!((st.capacity_bytes() as f64 / (1u64 << 30) as f64 - 0.93).abs() < 0.05);
        assert_eq!(hp.locate(72 * 19), (1, 0, 0));
        assert_eq!(hp.locate(72 + 5), (0, 1, 5));
    }

    #[test]
    fn parses_names_and_options() {
        assert_eq!(SimModel::parse("hp97560").unwrap().track_buffer_bytes, 128 << 10);
        assert_eq!(SimModel::parse("st31200n,track_buffer=256k").unwrap().track_buffer_bytes, 256 << 10);
        assert_eq!(SimModel::parse("hp97560,track_buffer=0").unwrap().track_buffer_bytes, 0);
        assert_eq!(SimModel::parse("hp97560").unwrap().random_block_bytes, 0, "contiguous by default");
        assert_eq!(SimModel::parse("hp97560,layout=random-blocks").unwrap().random_block_bytes, 8 << 10);
        assert_eq!(
            SimModel::parse("hp97560,layout_block=4k,layout=random-blocks").unwrap().random_block_bytes,
            4096
        );
        assert_eq!(SimModel::parse("hp97560,layout=contiguous").unwrap().random_block_bytes, 0);
        for bad in ["hp97560,layout=striped", "hp97560,layout_block=100", "hp97560,layout_block=0"] {
            assert!(SimModel::parse(bad).is_err(), "{bad}");
        }
        assert!(SimModel::parse("rk05").is_err());
        assert!(SimModel::parse("hp97560,speed=9").is_err());
        assert!(SimModel::parse("hp97560,track_buffer").is_err());
    }
}
