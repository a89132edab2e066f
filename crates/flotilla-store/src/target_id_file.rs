//! The target id file, `<target dir>/flotilla-target`: a small versioned text file that
//! gives a target directory its identity across restarts. Format (see
//! `docs/target-format.md`):
//!
//! ```text
//! # Flotilla storage target. Do not edit.
//! format_version = 3
//! target_id = "0123456789abcdef"
//! checksum_block_bytes = 4096
//! ```
//!
//! The id is 16 lowercase or uppercase hex digits and never zero; `checksum_block_bytes` is a
//! power of two in `CHECKSUM_BLOCK_BYTES_MIN..=CHECKSUM_BLOCK_BYTES_MAX`, fixed when the
//! target is created. Blank lines and lines starting with `#` are ignored; an unknown key, a
//! missing key, a repeated key or a version other than 2 or 3 makes the file corrupt (version 1
//! targets, which have no checksums, are refused with a message saying so). Version 3 says
//! the target's content directories carry markers (`target::content_marker_name`); a version 2
//! target is upgraded at start (see `Target::open_spec`). The file is written to a temporary
//! name, synced, and renamed into place, so a crash leaves either no file or a whole one.

use crate::error::StoreError;
use flotilla_types::TargetId;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the id file inside a target directory.
pub const TARGET_ID_FILE_NAME: &str = "flotilla-target";
/// The format version this code writes (2: fork data carries CRC32Cs; 3: the content
/// directories carry markers, so a lost directory is told apart from an empty one).
pub const TARGET_FORMAT_VERSION: u32 = 3;
/// The older version this code still reads, and upgrades at start.
pub const TARGET_FORMAT_VERSION_UNMARKED: u32 = 2;
/// Smallest and largest checksum block a target may record.
pub const CHECKSUM_BLOCK_BYTES_MIN: u64 = 512;
pub const CHECKSUM_BLOCK_BYTES_MAX: u64 = 1 << 20;
/// The checksum block of a new target, unless the cache block is smaller.
pub const CHECKSUM_BLOCK_BYTES_DEFAULT: u64 = 4096;

/// What the id file says about a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TargetIdentity {
    pub id: TargetId,
    /// Each run of this many bytes of a fork (from offset 0) has one CRC32C.
    pub checksum_block_bytes: u64,
    /// `TARGET_FORMAT_VERSION`, or `TARGET_FORMAT_VERSION_UNMARKED` for a target not yet
    /// upgraded (`render` always writes the current version).
    pub format_version: u32,
}
/// A larger file cannot be ours; refuse it before reading it whole.
const TARGET_ID_FILE_BYTES_MAX: u64 = 4096;

/// Renders the file's contents.
pub(crate) fn render(identity: TargetIdentity) -> String {
    format!(
        "# Flotilla storage target. Do not edit.\nformat_version = {TARGET_FORMAT_VERSION}\n\
         target_id = \"{:016x}\"\nchecksum_block_bytes = {}\n",
        identity.id.0, identity.checksum_block_bytes
    )
}

/// Parses the file's contents.
pub(crate) fn parse(text: &str) -> Result<TargetIdentity, String> {
    let mut version = None;
    let mut id = None;
    let mut checksum_block_bytes = None;
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| format!("line {} has no '='", number + 1))?;
        match key.trim() {
            "format_version" => set_once(&mut version, "format_version", parse_version(value)?)?,
            "target_id" => set_once(&mut id, "target_id", parse_id(value)?)?,
            "checksum_block_bytes" => {
                set_once(&mut checksum_block_bytes, "checksum_block_bytes", parse_checksum_block(value)?)?
            }
            other => return Err(format!("unknown key {other:?} on line {}", number + 1)),
        }
    }
    match (version, id, checksum_block_bytes) {
        (None, _, _) => Err("no format_version".into()),
        (_, None, _) => Err("no target_id".into()),
        (_, _, None) => Err("no checksum_block_bytes".into()),
        (Some(format_version), Some(id), Some(checksum_block_bytes)) => {
            Ok(TargetIdentity { id, checksum_block_bytes, format_version })
        }
    }
}

fn parse_checksum_block(value: &str) -> Result<u64, String> {
    let bytes: u64 = value
        .trim()
        .parse()
        .map_err(|_| format!("checksum_block_bytes {:?} is not a number", value.trim()))?;
    if !bytes.is_power_of_two() || !(CHECKSUM_BLOCK_BYTES_MIN..=CHECKSUM_BLOCK_BYTES_MAX).contains(&bytes) {
        return Err(format!(
            "checksum_block_bytes {bytes} is not a power of two in \
             {CHECKSUM_BLOCK_BYTES_MIN}..={CHECKSUM_BLOCK_BYTES_MAX}"
        ));
    }
    Ok(bytes)
}

fn set_once<T>(slot: &mut Option<T>, key: &str, value: T) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("{key} appears twice"));
    }
    *slot = Some(value);
    Ok(())
}

fn parse_version(value: &str) -> Result<u32, String> {
    let version: u32 =
        value.trim().parse().map_err(|_| format!("format_version {:?} is not a number", value.trim()))?;
    if version == 1 {
        return Err("format_version 1 (a target without checksums) is no longer supported: \
                    copy its data into a new target"
            .into());
    }
    if version != TARGET_FORMAT_VERSION && version != TARGET_FORMAT_VERSION_UNMARKED {
        return Err(format!(
            "format_version {version} is not supported (only {TARGET_FORMAT_VERSION_UNMARKED} and {TARGET_FORMAT_VERSION})"
        ));
    }
    Ok(version)
}

fn parse_id(value: &str) -> Result<TargetId, String> {
    let quoted = value.trim();
    let digits = quoted
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .ok_or_else(|| format!("target_id {quoted:?} is not a quoted string"))?;
    if digits.len() != 16 || !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(format!("target_id {digits:?} is not 16 hex digits"));
    }
    let id = u64::from_str_radix(digits, 16).map_err(|error| error.to_string())?;
    if id == 0 {
        return Err("target_id is zero".into());
    }
    Ok(TargetId(id))
}

/// Reads the id file of `dir`; `Ok(None)` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<TargetIdentity>, StoreError> {
    let path = dir.join(TARGET_ID_FILE_NAME);
    let metadata = match fs::metadata(&path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io(format!("stat {path:?}"), error)),
    };
    if metadata.len() > TARGET_ID_FILE_BYTES_MAX {
        return Err(corrupt(path, format!("{} bytes is too long", metadata.len())));
    }
    let bytes = fs::read(&path).map_err(|error| StoreError::io(format!("read {path:?}"), error))?;
    let text = String::from_utf8(bytes).map_err(|_| corrupt(path.clone(), "not UTF-8".into()))?;
    parse(&text).map(Some).map_err(|reason| corrupt(path, reason))
}

fn corrupt(path: PathBuf, reason: String) -> StoreError {
    StoreError::TargetIdCorrupt { path, reason }
}

/// Writes a new id file into `dir` atomically (temporary file, fsync, rename, fsync dir).
pub(crate) fn write(dir: &Path, identity: TargetIdentity) -> Result<(), StoreError> {
    assert_ne!(identity.id.0, 0, "a target id is never zero");
    let path = dir.join(TARGET_ID_FILE_NAME);
    let temporary = dir.join(format!("{TARGET_ID_FILE_NAME}.tmp"));
    let io_error = |action: &str, error| StoreError::io(format!("{action} {temporary:?}"), error);
    let mut file = fs::File::create(&temporary).map_err(|error| io_error("create", error))?;
    file.write_all(render(identity).as_bytes()).map_err(|error| io_error("write", error))?;
    file.sync_all().map_err(|error| io_error("sync", error))?;
    fs::rename(&temporary, &path).map_err(|error| StoreError::io(format!("rename into {path:?}"), error))?;
    sync_dir(dir)
}

/// fsyncs a directory so that entries created or removed in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    fs::File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|error| StoreError::io(format!("sync directory {dir:?}"), error))
}

/// A random nonzero target id.
pub(crate) fn random_id() -> TargetId {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return TargetId(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_then_parse_round_trips() {
        let identity = TargetIdentity {
            id: TargetId(0x00ab_cdef_0123_4567),
            checksum_block_bytes: 4096,
            format_version: TARGET_FORMAT_VERSION,
        };
        assert_eq!(parse(&render(identity)), Ok(identity));
        let old = "format_version = 2\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4096\n";
        assert_eq!(parse(old).map(|identity| identity.format_version), Ok(TARGET_FORMAT_VERSION_UNMARKED));
    }

    #[test]
    fn version_1_is_refused_by_name() {
        let error = parse("format_version = 1\ntarget_id = \"00000000000000aa\"\n").unwrap_err();
        assert!(error.contains("without checksums"), "{error}");
    }

    #[test]
    fn refuses_corrupt_files() {
        let cases = [
            "",
            "format_version = 2\n",
            "target_id = \"00000000000000aa\"\n",
            "format_version = 2\ntarget_id = \"00000000000000aa\"\n",
            "format_version = 4\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4096\n",
            "format_version = 1\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4096\n",
            "format_version = 2\ntarget_id = \"0000000000000000\"\nchecksum_block_bytes = 4096\n",
            "format_version = 2\ntarget_id = \"00aa\"\nchecksum_block_bytes = 4096\n",
            "format_version = 2\ntarget_id = 00000000000000aa\nchecksum_block_bytes = 4096\n",
            "format_version = 2\ntarget_id = \"zz000000000000aa\"\nchecksum_block_bytes = 4096\n",
            "format_version = 2\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4000\n",
            "format_version = 2\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 256\n",
            "format_version = 2\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4096\ncolour = 3\n",
            "format_version = 2\nformat_version = 2\ntarget_id = \"00000000000000aa\"\nchecksum_block_bytes = 4096\n",
            "garbage\n",
        ];
        for case in cases {
            assert!(parse(case).is_err(), "accepted {case:?}");
        }
    }
}
