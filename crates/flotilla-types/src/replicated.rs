//! A layout with its replica count (issue 32): `stripe:1M:4,replicas=2` keeps every subfile
//! on `replicas` targets in distinct failure groups. `replicas=1` is a plain [`Layout`] (one
//! copy of every byte), the default, and prints without the suffix, so every layout text
//! written before replicas existed reads back unchanged.
//!
//! The replica count travels beside the [`Layout`] rather than inside its variants, so
//! every user of `Layout` keeps compiling; the metadata service stores both in the inode's
//! layout record.

use crate::layout::LayoutError;
use crate::Layout;
use serde::{Deserialize, Serialize};

/// Most replicas a file may ask for (one slot of a chain's eight stays free for a
/// replacement that syncs while the member it replaces still serves).
pub const REPLICAS_MAX: u32 = 7;

/// The suffix option naming the replica count.
const REPLICAS_OPTION: &str = "replicas";

/// A layout and how many copies of every subfile a file keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicatedLayout {
    pub layout: Layout,
    /// 1 to [`REPLICAS_MAX`].
    pub replicas: u32,
}

impl ReplicatedLayout {
    /// `layout` with `replicas` copies of every subfile, checked.
    pub fn new(layout: Layout, replicas: u32) -> Result<ReplicatedLayout, LayoutError> {
        let replicated = ReplicatedLayout { layout, replicas };
        replicated.validate()?;
        Ok(replicated)
    }

    /// `layout` with one copy of every byte (what a plain layout means).
    pub fn single(layout: Layout) -> ReplicatedLayout {
        ReplicatedLayout { layout, replicas: 1 }
    }

    /// Whether the file keeps more than one copy.
    pub fn is_replicated(&self) -> bool {
        self.replicas > 1
    }

    /// Checks the layout and the replica count.
    pub fn validate(&self) -> Result<(), LayoutError> {
        self.layout.validate()?;
        if !(1..=REPLICAS_MAX).contains(&self.replicas) {
            return Err(LayoutError::Replicas { replicas: self.replicas, max: REPLICAS_MAX });
        }
        Ok(())
    }

    /// Parses a [`Layout`] text (see [`Layout::parse`]) with an optional `,replicas=N`.
    pub fn parse(text: &str) -> Result<ReplicatedLayout, LayoutError> {
        let fail = |reason: String| LayoutError::Parse { text: text.to_string(), reason };
        let mut parts = text.trim().split(',');
        let layout = Layout::parse(parts.next().unwrap_or_default())?;
        let mut replicas = None;
        for option in parts {
            let (key, value) = option.trim().split_once('=').unwrap_or((option.trim(), ""));
            if key != REPLICAS_OPTION {
                return Err(fail(format!("unknown option {key:?} (expected {REPLICAS_OPTION}=N)")));
            }
            if replicas.is_some() {
                return Err(fail(format!("{REPLICAS_OPTION} given twice")));
            }
            let count =
                value.trim().parse::<u32>().map_err(|_| fail(format!("bad replica count {value:?}")))?;
            replicas = Some(count);
        }
        ReplicatedLayout::new(layout, replicas.unwrap_or(1))
    }
}

impl From<Layout> for ReplicatedLayout {
    fn from(layout: Layout) -> ReplicatedLayout {
        ReplicatedLayout::single(layout)
    }
}

impl std::fmt::Display for ReplicatedLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.layout)?;
        if self.replicas != 1 {
            write!(f, ",{REPLICAS_OPTION}={}", self.replicas)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_replica_suffix() {
        let two = ReplicatedLayout::parse("stripe:1m:4,replicas=2").unwrap();
        assert_eq!(
            two,
            ReplicatedLayout { layout: Layout::Stripe { unit_bytes: 1 << 20, count: 4 }, replicas: 2 }
        );
        assert_eq!(two.to_string(), "stripe:1M:4,replicas=2");
        let hash = ReplicatedLayout::parse("hash:64K:2:3, replicas=3").unwrap();
        assert_eq!(hash.to_string(), "hash:64K:2:3,replicas=3");
        let one = ReplicatedLayout::parse("stripe:1M:4,replicas=1").unwrap();
        assert_eq!(one, ReplicatedLayout::single(Layout::Stripe { unit_bytes: 1 << 20, count: 4 }));
        assert_eq!(one.to_string(), "stripe:1M:4");
        assert_eq!(ReplicatedLayout::parse("stripe:64K").unwrap().replicas, 1);
    }

    #[test]
    fn refusals_name_what_was_wrong() {
        let zero = ReplicatedLayout::parse("stripe:1M,replicas=0").unwrap_err().to_string();
        assert!(zero.contains("replica count 0") && zero.contains("1..=7"), "{zero}");
        let many = ReplicatedLayout::parse("stripe:1M,replicas=8").unwrap_err().to_string();
        assert!(many.contains("replica count 8"), "{many}");
        let unknown = ReplicatedLayout::parse("stripe:1M,copies=2").unwrap_err().to_string();
        assert!(unknown.contains("unknown option \"copies\""), "{unknown}");
        let twice = ReplicatedLayout::parse("stripe:1M,replicas=2,replicas=3").unwrap_err().to_string();
        assert!(twice.contains("given twice"), "{twice}");
        assert!(ReplicatedLayout::parse("stripe:1M,replicas=x").is_err());
        let plain = Layout::parse("stripe:1M:4,replicas=2").unwrap_err().to_string();
        assert!(plain.contains("replica count"), "{plain}");
    }

    proptest::proptest! {
        /// Every valid replicated layout prints to a text that parses back to it.
        #[test]
        fn print_then_parse_round_trips(unit in 1u64..(1 << 40), seq in 1u32..64, count in 0u32..70_000,
                replicas in 1u32..=REPLICAS_MAX, kind in 0u8..3) {
            let layout = match kind {
                0 => Layout::Explicit,
                1 => Layout::Stripe { unit_bytes: unit, count },
                _ => Layout::Hash { block_bytes: unit, sequentiality: seq, count },
            };
            let replicated = ReplicatedLayout::new(layout, replicas).unwrap();
            let text = replicated.to_string();
            proptest::prop_assert_eq!(ReplicatedLayout::parse(&text).unwrap(), replicated, "{}", text);
            proptest::prop_assert_eq!(text.contains("replicas="), replicas > 1);
        }
    }
}
