//! Inode numbers and names as the kernel passes them.
//!
//! The kernel names every entry by inode number, and the mount passes that number on: the
//! kernel's inode is the namespace's inode id, and every namespace call is addressed by a
//! directory's id and a name in it (or by an entry's id). So the mount keeps no table of
//! paths: any path length the kernel can walk works, and when another client renames or
//! replaces a directory this mount's inodes still name the objects they named (a name is
//! looked up again in the directory the kernel holds, never in a remembered path).

use fuser::Errno;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// The root directory's inode number, in the kernel and in the namespace alike.
pub const ROOT_INO: u64 = 1;
/// Longest name of one path component, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;

/// A name as one directory entry, checked as Linux would: 1 to 255 bytes (any bytes but
/// '/' and NUL), not "." or "..".
pub fn check_name(name: &OsStr) -> Result<&[u8], Errno> {
    let bytes = name.as_bytes();
    if bytes.len() > NAME_BYTES_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_linux_does() {
        assert_eq!(check_name(OsStr::new(&"x".repeat(256))), Err(Errno::ENAMETOOLONG));
        assert_eq!(check_name(OsStr::new(&"x".repeat(255))).map(<[u8]>::len), Ok(255));
        assert_eq!(check_name(OsStr::new("..")), Err(Errno::EINVAL));
        assert_eq!(check_name(OsStr::new("a/b")), Err(Errno::EINVAL));
        assert_eq!(check_name(OsStr::from_bytes(b"\xff\xfe")), Ok(&b"\xff\xfe"[..]));
    }
}
