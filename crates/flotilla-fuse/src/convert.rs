//! Conversions between the client library's types and the kernel's: errors to errno values
//! that match Linux, attributes to `stat` fields, times.

use flotilla_client::{Attributes, ClientError, FileKind};
use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `st_blksize`: the preferred I/O size, one kernel request's worth.
pub const BLOCK_BYTES_PREFERRED: u32 = 1 << 20;

/// The errno the kernel should return for a failed call.
pub fn errno(error: &ClientError) -> Errno {
    match error.errno() {
        // A server or target that cannot be reached: the file's data is unavailable.
        libc::EHOSTDOWN => Errno::EIO,
        // A request over a server limit cannot come from one kernel request; say so plainly.
        libc::E2BIG => Errno::EINVAL,
        code => Errno::from_i32(code),
    }
}

/// Whether the failure may be cured by asking the metadata service where the data lives now
/// (a server restarted on another address, a connection that broke). The metadata service
/// itself unreachable for the whole outage wait is not: asking it again would wait again.
pub fn is_transport(error: &ClientError) -> bool {
    if let ClientError::Unreachable { service, .. } = error {
        return *service == flotilla_client::Service::Server;
    }
    let unreachable = matches!(error.errno(), libc::EIO | libc::EHOSTDOWN);
    matches!(error, ClientError::Rpc(_)) || (unreachable && !matches!(error, ClientError::Meta(_)))
}

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Directory => FileType::Directory,
        FileKind::File => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub fn file_attr(ino: u64, attrs: &Attributes) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: attrs.size_bytes,
        blocks: attrs.size_bytes.div_ceil(512),
        atime: time(attrs.atime_ns),
        mtime: time(attrs.mtime_ns),
        ctime: time(attrs.ctime_ns),
        crtime: time(attrs.ctime_ns),
        kind: file_type(attrs.kind),
        perm: (attrs.mode & 0o7777) as u16,
        nlink: attrs.nlink,
        uid: attrs.uid,
        gid: attrs.gid,
        // The kernel's FUSE `rdev` is the 32-bit encoding it passed to `mknod`, kept as is.
        rdev: u32::try_from(attrs.rdev).unwrap_or(0),
        blksize: BLOCK_BYTES_PREFERRED,
        flags: 0,
    }
}

pub fn time(ns: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH.checked_sub(magnitude).unwrap_or(UNIX_EPOCH)
    }
}

pub fn nanoseconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map(|ns| -ns).unwrap_or(i64::MIN),
    }
}

pub fn time_or_now(time: TimeOrNow) -> i64 {
    match time {
        TimeOrNow::SpecificTime(time) => nanoseconds(time),
        TimeOrNow::Now => nanoseconds(SystemTime::now()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for ns in [0, 1, 1_700_000_000_123_456_789, -5_000_000_001] {
            assert_eq!(nanoseconds(time(ns)), ns);
        }
    }

    #[test]
    fn unreachable_servers_are_eio() {
        let down = ClientError::Server {
            server: "x".into(),
            error: flotilla_client::WireError::new(flotilla_client::ErrorCode::Unavailable, "down"),
        };
        assert_eq!(errno(&down), Errno::EIO);
        let missing =
            ClientError::Meta(flotilla_client::WireError::new(flotilla_client::ErrorCode::NotFound, "gone"));
        assert_eq!(errno(&missing), Errno::ENOENT);
        assert!(!is_transport(&missing));
    }
}
