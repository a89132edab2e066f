//! The per-process log cache (ENWRICH §3): a data section, where written bytes are
//! appended, and a directory section, one entry per write (file, timestamp, offset, length,
//! place in the data section). The cache's bytes are split between the two by the
//! directory fraction; either section filling up is a flush trigger. Pure: no I/O.

/// Bytes one directory entry is counted as (member, file, timestamp, offset, length and
/// data-section offset, as the paper's 4-byte fields would not hold today's sizes).
pub const DIRECTORY_ENTRY_BYTES: u64 = 48;

/// One logged write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub file: u64,
    pub timestamp: u64,
    pub offset: u64,
    pub length: u64,
    /// Where its bytes start in the data section.
    pub cache_offset: u64,
}

/// Which section filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    Data,
    Directory,
}

/// The log cache of one process.
#[derive(Debug)]
pub struct LogCache {
    data: Vec<u8>,
    entries: Vec<LogEntry>,
    data_bytes_max: u64,
    entries_max: usize,
}

impl LogCache {
    /// A cache of `cache_bytes` of which `directory_fraction` (clamped to 0.001..=0.999)
    /// holds the directory; at least one entry and one data byte.
    pub fn new(cache_bytes: u64, directory_fraction: f64) -> LogCache {
        let fraction = directory_fraction.clamp(0.001, 0.999);
        let directory_bytes = (cache_bytes as f64 * fraction) as u64;
        let entries_max = (directory_bytes / DIRECTORY_ENTRY_BYTES).max(1) as usize;
        let data_bytes_max = cache_bytes.saturating_sub(directory_bytes).max(1);
        LogCache { data: Vec::new(), entries: Vec::new(), data_bytes_max, entries_max }
    }

    pub fn data_bytes_max(&self) -> u64 {
        self.data_bytes_max
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[LogEntry] {
        &self.entries
    }

    pub fn data_bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// Logs as much of `bytes` (written at `offset` of `file` at `timestamp`) as fits; the
    /// count logged, and which section is full if not all of it fitted.
    pub fn append(&mut self, file: u64, offset: u64, bytes: &[u8], timestamp: u64) -> (usize, Option<Full>) {
        if bytes.is_empty() {
            return (0, None);
        }
        if self.entries.len() >= self.entries_max {
            return (0, Some(Full::Directory));
        }
        let room = self.data_bytes_max - self.data.len() as u64;
        let taken = (bytes.len() as u64).min(room) as usize;
        if taken == 0 {
            return (0, Some(Full::Data));
        }
        let cache_offset = self.data.len() as u64;
        self.data.extend_from_slice(&bytes[..taken]);
        self.entries.push(LogEntry { file, timestamp, offset, length: taken as u64, cache_offset });
        let full = if taken < bytes.len() {
            Some(Full::Data)
        } else if self.entries.len() >= self.entries_max {
            Some(Full::Directory)
        } else if self.data.len() as u64 == self.data_bytes_max {
            Some(Full::Data)
        } else {
            None
        };
        (taken, full)
    }

    /// The bytes `cache_offset..cache_offset + length` of the data section, if all are
    /// logged (a server asking for anything else is refused).
    pub fn range(&self, cache_offset: u64, length: u64) -> Option<&[u8]> {
        let end = cache_offset.checked_add(length)?;
        self.data.get(usize::try_from(cache_offset).ok()?..usize::try_from(end).ok()?)
    }

    /// Empties both sections (after a successful flush).
    pub fn clear(&mut self) {
        self.data.clear();
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_directory_fraction_splits_the_cache() {
        let cache = LogCache::new(4800, 0.1);
        assert_eq!((cache.entries_max(), cache.data_bytes_max()), (10, 4320));
    }

    #[test]
    fn each_section_reports_full() {
        let mut cache = LogCache::new(960, 0.1); // 2 entries, 864 data bytes
        assert_eq!(cache.append(1, 0, &[1; 10], 1), (10, None));
        assert_eq!(cache.append(1, 10, &[2; 10], 2), (10, Some(Full::Directory)));
        assert_eq!(cache.append(1, 20, &[3; 10], 3), (0, Some(Full::Directory)));
        cache.clear();
        assert_eq!(cache.append(1, 0, &[4; 900], 4), (864, Some(Full::Data)));
        assert_eq!(cache.append(1, 864, &[4; 36], 5), (0, Some(Full::Data)));
        assert_eq!(cache.range(860, 4), Some(&[4u8; 4][..]));
        assert_eq!(cache.range(860, 5), None, "past the logged bytes");
        assert_eq!(cache.range(u64::MAX, 2), None);
    }

    proptest! {
        #[test]
        fn logged_bytes_come_back_and_bounds_hold(
            writes in prop::collection::vec((0u64..1000, prop::collection::vec(any::<u8>(), 0..200)), 0..50),
            cache_bytes in 100u64..5000,
            fraction in 0.01f64..0.9,
        ) {
            let mut cache = LogCache::new(cache_bytes, fraction);
            for (i, (offset, bytes)) in writes.iter().enumerate() {
                let (taken, _) = cache.append(7, *offset, bytes, i as u64);
                prop_assert!(taken <= bytes.len());
                if taken > 0 {
                    let entry = *cache.entries().last().unwrap();
                    prop_assert_eq!(cache.range(entry.cache_offset, entry.length), Some(&bytes[..taken]));
                }
                prop_assert!(cache.data_bytes() <= cache.data_bytes_max());
                prop_assert!(cache.entries().len() <= cache.entries_max());
            }
        }
    }
}
