//! Layouts: how a file's linear byte sequence maps onto its subfiles (each subfile's `data`
//! fork). Pure arithmetic, shared by every client so that any client finds any byte with no
//! lookup and no per-file block map.
//!
//! - `Stripe{unit_bytes, count}`: round robin in units of `unit_bytes` over `count` subfiles
//!   (CYCLIC; Lustre/GPFS style). Unit `k` lives on subfile `k mod n` at offset
//!   `(k div n) * unit_bytes`.
//! - `Hash{block_bytes, sequentiality, count}`: RAMA's pseudo-random placement. Block `b` lives
//!   on subfile `placement_hash(file, b div sequentiality) mod n`, at the same offset as in the
//!   linear file (`b * block_bytes`), so each subfile's fork is sparse and no map is needed.
//!   Runs of `sequentiality` consecutive blocks stay together.
//! - `Explicit`: the program addresses subfiles and forks itself; there is no linear view.
//!
//! `count == 0` means "every subfile of the file"; otherwise the first `min(count, subfiles)`.

use crate::ids::FileId;
use serde::{Deserialize, Serialize};

/// How a file's linear byte sequence maps onto its subfiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    Explicit,
    Stripe { unit_bytes: u64, count: u32 },
    Hash { block_bytes: u64, sequentiality: u32, count: u32 },
}

/// Why a layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    #[error("file uses the explicit layout: address its subfiles and forks directly")]
    Explicit,
    #[error("layout {what} must be at least 1")]
    Zero { what: &'static str },
    #[error("byte range at {offset} of {length} bytes overflows a 64-bit offset")]
    Overflow { offset: u64, length: u64 },
    #[error("replica count {replicas} is outside 1..={max}")]
    Replicas { replicas: u32, max: u32 },
    #[error("cannot parse layout {text:?}: {reason}")]
    Parse { text: String, reason: String },
    #[error("layout {layout}: {what} of {value} is {side} the bound of {bound} ({key})")]
    OutOfBounds {
        layout: String,
        what: &'static str,
        value: u64,
        /// "under" or "over".
        side: &'static str,
        bound: u64,
        /// The setting that holds the bound.
        key: &'static str,
    },
}

/// The bounds a layout must keep to before the metadata service records it (`[meta]`
/// `layout_unit_bytes_min`, `layout_unit_bytes_max`, `layout_count_max`): a stripe unit or
/// hash block too small turns every write into a storm of tiny pieces, one too large (or a
/// hash run that overflows) breaks the offset arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutBounds {
    /// Smallest stripe unit or hash block.
    pub unit_bytes_min: u64,
    /// Largest stripe unit, and largest hash run (block times sequentiality).
    pub unit_bytes_max: u64,
    /// Largest subfile count a layout may name (0, "every subfile", is always allowed).
    pub count_max: u32,
}

/// Default of `LayoutBounds::unit_bytes_min`: 4 KiB.
pub const LAYOUT_UNIT_BYTES_MIN: u64 = 4 << 10;
/// Default of `LayoutBounds::unit_bytes_max`: 1 GiB.
pub const LAYOUT_UNIT_BYTES_MAX: u64 = 1 << 30;
/// Default of `LayoutBounds::count_max` (the namespace's most subfiles per file).
pub const LAYOUT_COUNT_MAX: u32 = 65_536;

impl Default for LayoutBounds {
    fn default() -> Self {
        LayoutBounds {
            unit_bytes_min: LAYOUT_UNIT_BYTES_MIN,
            unit_bytes_max: LAYOUT_UNIT_BYTES_MAX,
            count_max: LAYOUT_COUNT_MAX,
        }
    }
}

/// One contiguous piece of a linear range on one subfile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearExtent {
    pub subfile: u32,
    /// Offset within the subfile's `data` fork.
    pub subfile_offset: u64,
    /// Offset within the linear file.
    pub linear_offset: u64,
    pub length: u64,
}

/// RAMA-style placement hash: a fixed, seed-free 64-bit mix of a file id and a block group
/// (the SplitMix64 finalizer applied twice). Documented so that any implementation agrees.
pub fn placement_hash(file: FileId, group: u64) -> u64 {
    mix(file.0 ^ mix(group.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Layout {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), LayoutError> {
        match self {
            Layout::Explicit => Ok(()),
            Layout::Stripe { unit_bytes: 0, .. } => Err(LayoutError::Zero { what: "stripe unit" }),
            Layout::Hash { block_bytes: 0, .. } => Err(LayoutError::Zero { what: "hash block size" }),
            Layout::Hash { sequentiality: 0, .. } => Err(LayoutError::Zero { what: "hash sequentiality" }),
            _ => Ok(()),
        }
    }

    /// Checks the parameters and that they keep to `bounds`; the error names the value, the
    /// bound and the setting holding it.
    pub fn check_bounds(&self, bounds: &LayoutBounds) -> Result<(), LayoutError> {
        self.validate()?;
        let fail = |what, value, side, bound, key| LayoutError::OutOfBounds {
            layout: self.to_string(),
            what,
            value,
            side,
            bound,
            key,
        };
        let (what, unit, count) = match *self {
            Layout::Explicit => return Ok(()),
            Layout::Stripe { unit_bytes, count } => ("stripe unit", unit_bytes, count),
            Layout::Hash { block_bytes, count, .. } => ("hash block", block_bytes, count),
        };
        if unit < bounds.unit_bytes_min {
            return Err(fail(what, unit, "under", bounds.unit_bytes_min, "layout_unit_bytes_min"));
        }
        if let Layout::Hash { block_bytes, sequentiality, .. } = *self {
            let run = block_bytes.saturating_mul(u64::from(sequentiality));
            if run > bounds.unit_bytes_max {
                return Err(fail(
                    "hash run (block times sequentiality)",
                    run,
                    "over",
                    bounds.unit_bytes_max,
                    "layout_unit_bytes_max",
                ));
            }
        }
        if unit > bounds.unit_bytes_max {
            return Err(fail(what, unit, "over", bounds.unit_bytes_max, "layout_unit_bytes_max"));
        }
        if count > bounds.count_max {
            let (count, max) = (u64::from(count), u64::from(bounds.count_max));
            return Err(fail("subfile count", count, "over", max, "layout_count_max"));
        }
        Ok(())
    }

    /// The subfile count a new file gets from this layout, if it names one.
    pub fn subfile_count(&self) -> Option<u32> {
        match self {
            Layout::Stripe { count, .. } | Layout::Hash { count, .. } if *count > 0 => Some(*count),
            _ => None,
        }
    }

    /// The unit of placement: bytes that always stay together on one subfile.
    pub fn unit_bytes(&self) -> Option<u64> {
        match self {
            Layout::Explicit => None,
            Layout::Stripe { unit_bytes, .. } => Some(*unit_bytes),
            Layout::Hash { block_bytes, sequentiality, .. } => {
                Some(block_bytes.saturating_mul(u64::from(*sequentiality)))
            }
        }
    }

    fn width(count: u32, subfiles: u32) -> u64 {
        let subfiles = subfiles.max(1);
        u64::from(if count == 0 { subfiles } else { count.min(subfiles) })
    }

    /// Where linear byte `offset` lives: (subfile, offset in its fork, bytes until the next
    /// placement boundary).
    pub fn locate(&self, file: FileId, subfiles: u32, offset: u64) -> Result<(u32, u64, u64), LayoutError> {
        self.validate()?;
        match *self {
            Layout::Explicit => Err(LayoutError::Explicit),
            Layout::Stripe { unit_bytes, count } => {
                let n = Self::width(count, subfiles);
                let unit = offset / unit_bytes;
                let within = offset % unit_bytes;
                Ok(((unit % n) as u32, (unit / n) * unit_bytes + within, unit_bytes - within))
            }
            Layout::Hash { block_bytes, sequentiality, count } => {
                let n = Self::width(count, subfiles);
                let run_bytes = block_bytes.saturating_mul(u64::from(sequentiality));
                let group = offset / run_bytes;
                let subfile = (placement_hash(file, group) % n) as u32;
                Ok((subfile, offset, run_bytes - offset % run_bytes))
            }
        }
    }

    /// Calls `visit` for each piece of linear range [offset, offset+length), in order.
    pub fn for_each_extent(
        &self,
        file: FileId,
        subfiles: u32,
        offset: u64,
        length: u64,
        mut visit: impl FnMut(LinearExtent),
    ) -> Result<(), LayoutError> {
        offset.checked_add(length).ok_or(LayoutError::Overflow { offset, length })?;
        let mut done = 0;
        while done < length {
            let linear_offset = offset + done;
            let (subfile, subfile_offset, run) = self.locate(file, subfiles, linear_offset)?;
            let take = run.min(length - done);
            visit(LinearExtent { subfile, subfile_offset, linear_offset, length: take });
            done += take;
        }
        Ok(())
    }

    /// Parses `explicit`, `stripe:UNIT[:COUNT]` or `hash:BLOCK[:SEQUENTIALITY[:COUNT]]`; sizes
    /// take an optional K, M or G suffix (powers of 1024).
    pub fn parse(text: &str) -> Result<Layout, LayoutError> {
        let fail = |reason: &str| LayoutError::Parse { text: text.to_string(), reason: reason.to_string() };
        if text.contains(',') {
            return Err(fail("a replica count (`,replicas=N`) is not part of a plain layout; give it where replicated layouts are taken"));
        }
        let parts: Vec<&str> = text.trim().split(':').collect();
        let number = |index: usize, default: u64| -> Result<u64, LayoutError> {
            parts.get(index).map_or(Ok(default), |part| parse_size(part).ok_or_else(|| fail("bad number")))
        };
        let small = |value: u64| u32::try_from(value).map_err(|_| fail("count too large"));
        let layout = match parts[0] {
            "explicit" if parts.len() == 1 => Layout::Explicit,
            "stripe" if (2..=3).contains(&parts.len()) => {
                Layout::Stripe { unit_bytes: number(1, 0)?, count: small(number(2, 0)?)? }
            }
            "hash" if (2..=4).contains(&parts.len()) => Layout::Hash {
                block_bytes: number(1, 0)?,
                sequentiality: small(number(2, 1)?)?,
                count: small(number(3, 0)?)?,
            },
            _ => {
                return Err(fail(
                    "expected explicit, stripe:UNIT[:COUNT] or hash:BLOCK[:SEQUENTIALITY[:COUNT]]",
                ))
            }
        };
        layout.validate()?;
        Ok(layout)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layout::Explicit => write!(f, "explicit"),
            Layout::Stripe { unit_bytes, count } => write!(f, "stripe:{}:{count}", size_text(*unit_bytes)),
            Layout::Hash { block_bytes, sequentiality, count } => {
                write!(f, "hash:{}:{sequentiality}:{count}", size_text(*block_bytes))
            }
        }
    }
}

/// A byte count as `parse_size` reads it, with the largest of G, M, K that divides it
/// exactly: `1M`, `64K`, `1000`.
pub fn size_text(bytes: u64) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024): `64`, `16k`, `4M`.
/// `None` for anything else or on overflow.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last()? {
        'k' | 'K' => (&text[..text.len() - 1], 10),
        'm' | 'M' => (&text[..text.len() - 1], 20),
        'g' | 'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_maps_units_round_robin() {
        let layout = Layout::Stripe { unit_bytes: 10, count: 3 };
        assert_eq!(layout.locate(FileId(1), 3, 0).unwrap(), (0, 0, 10));
        assert_eq!(layout.locate(FileId(1), 3, 25).unwrap(), (2, 5, 5));
        assert_eq!(layout.locate(FileId(1), 3, 30).unwrap(), (0, 10, 10));
    }

    #[test]
    fn explicit_has_no_linear_view() {
        assert_eq!(Layout::Explicit.locate(FileId(1), 2, 0), Err(LayoutError::Explicit));
    }

    #[test]
    fn parse_and_display_round_trip() {
        for text in
            ["explicit", "stripe:64K:4", "hash:4K:8:16", "stripe:1000:2", "hash:3M:1:0", "stripe:2G:0"]
        {
            assert_eq!(Layout::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Layout::parse("stripe:64k").unwrap(), Layout::Stripe { unit_bytes: 65536, count: 0 });
        assert_eq!(Layout::parse("stripe:65536:4").unwrap().to_string(), "stripe:64K:4");
        assert!(Layout::parse("stripe:0").is_err());
        assert!(Layout::parse("zigzag:4").is_err());
    }

    #[test]
    fn bounds_name_the_value_the_bound_and_the_setting() {
        let bounds = LayoutBounds::default();
        let tiny = Layout::parse("stripe:1:2").unwrap().check_bounds(&bounds).unwrap_err();
        let text = tiny.to_string();
        assert!(text.contains("stripe unit of 1 is under the bound of 4096"), "{text}");
        assert!(text.contains("layout_unit_bytes_min"), "{text}");
        let huge = Layout::Stripe { unit_bytes: u64::MAX, count: 0 }.check_bounds(&bounds).unwrap_err();
        assert!(
            huge.to_string().contains(&format!("{} is over the bound of {}", u64::MAX, 1u64 << 30)),
            "{huge}"
        );
        let run = Layout::Hash { block_bytes: 1 << 20, sequentiality: u32::MAX, count: 0 };
        assert!(run.check_bounds(&bounds).unwrap_err().to_string().contains("hash run"));
        let wide = Layout::Stripe { unit_bytes: 4096, count: 70_000 };
        assert!(wide.check_bounds(&bounds).unwrap_err().to_string().contains("subfile count of 70000"));
        for fine in ["stripe:4K:2", "stripe:1G", "hash:4K:8:16", "hash:32k:4", "explicit", "stripe:1M:0"] {
            assert_eq!(Layout::parse(fine).unwrap().check_bounds(&bounds), Ok(()), "{fine}");
        }
        let relaxed = LayoutBounds { unit_bytes_min: 1, ..bounds };
        assert_eq!(Layout::parse("stripe:1:2").unwrap().check_bounds(&relaxed), Ok(()));
    }

    proptest::proptest! {
        /// A layout within the bounds never overflows when it locates any byte.
        #[test]
        fn bounded_layouts_locate_every_offset(shift in 0u32..64, low in 0u64..4096, seq_shift in 0u32..32,
                count in 0u32..100, subfiles in 1u32..100, offset in 0u64..u64::MAX, hash in proptest::bool::ANY) {
            let unit = (1u64 << shift).saturating_add(low);
            let seq = 1u32 << seq_shift;
            let layout = if hash {
                Layout::Hash { block_bytes: unit, sequentiality: seq, count }
            } else {
                Layout::Stripe { unit_bytes: unit, count }
            };
            if layout.check_bounds(&LayoutBounds::default()).is_ok() {
                let (subfile, _, run) = layout.locate(FileId(7), subfiles, offset).unwrap();
                proptest::prop_assert!(subfile < subfiles && run >= 1);
            }
        }
    }
}
