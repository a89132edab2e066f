//! Access times of reads. The kernel leaves a FUSE file's atime to the file system, and the
//! mount's reads go to the I/O servers, so the mount tells the metadata service
//! (`TouchAtime`, which changes nothing but the atime) under the mount's rule:
//! - `relatime` (the default, as Linux's): at the first read through an open handle, if the
//!   atime is not after the mtime or the ctime, or is more than a day old;
//! - `strictatime`: at every read;
//! - `noatime`: never.
//!
//! An update that fails (a read-only credential, say) does not fail the read.

use crate::fs::FlotillaFs;
use flotilla_client::Attributes;

/// relatime updates an atime older than this even when it is after mtime and ctime.
const RELATIME_AGE_NS: i64 = 24 * 3600 * 1_000_000_000;

/// When reads update the access time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    NoAtime,
    #[default]
    RelAtime,
    StrictAtime,
}

impl std::str::FromStr for AtimeMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "noatime" => Ok(AtimeMode::NoAtime),
            "relatime" => Ok(AtimeMode::RelAtime),
            "strictatime" => Ok(AtimeMode::StrictAtime),
            other => Err(format!("atime mode {other:?} is not noatime, relatime or strictatime")),
        }
    }
}

/// Whether a read at `now_ns` updates the atime of a file with `attrs`, under `mode`, given
/// whether this open handle already read (relatime looks at the first read only).
pub fn updates(mode: AtimeMode, attrs: &Attributes, first_read: bool, now_ns: i64) -> bool {
    match mode {
        AtimeMode::NoAtime => false,
        AtimeMode::StrictAtime => true,
        AtimeMode::RelAtime => {
            first_read
                && (attrs.atime_ns <= attrs.mtime_ns
                    || attrs.atime_ns <= attrs.ctime_ns
                    || now_ns.saturating_sub(attrs.atime_ns) > RELATIME_AGE_NS)
        }
    }
}

impl FlotillaFs {
    /// After a read of `ino` through a handle: updates the atime if the mount's rule says so.
    pub(crate) fn note_read(&self, ino: u64, attrs: &Attributes, first_read: bool) {
        let now = crate::convert::nanoseconds(std::time::SystemTime::now());
        if !updates(self.atime, attrs, first_read, now) {
            return;
        }
        if let Err(error) = self.client.touch_atime(ino, now) {
            tracing::debug!(%error, ino, "atime not updated");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_client::FileKind;

    fn attrs(atime_ns: i64, mtime_ns: i64) -> Attributes {
        Attributes {
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size_bytes: 0,
            nlink: 1,
            atime_ns,
            mtime_ns,
            ctime_ns: mtime_ns,
            rdev: 0,
        }
    }

    #[test]
    fn relatime_updates_only_stale_atimes_on_the_first_read() {
        let now = 10 * RELATIME_AGE_NS;
        let written_after_read = attrs(now - 10, now - 5);
        let read_after_write = attrs(now - 5, now - 10);
        let old_read = attrs(now - 2 * RELATIME_AGE_NS, now - 3 * RELATIME_AGE_NS);
        assert!(updates(AtimeMode::RelAtime, &written_after_read, true, now));
        assert!(!updates(AtimeMode::RelAtime, &written_after_read, false, now));
        assert!(!updates(AtimeMode::RelAtime, &read_after_write, true, now));
        assert!(updates(AtimeMode::RelAtime, &old_read, true, now));
        assert!(updates(AtimeMode::StrictAtime, &read_after_write, false, now));
        assert!(!updates(AtimeMode::NoAtime, &written_after_read, true, now));
        assert_eq!("strictatime".parse(), Ok(AtimeMode::StrictAtime));
        assert!("sometimes".parse::<AtimeMode>().is_err());
    }
}
