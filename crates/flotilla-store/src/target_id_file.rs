//! The target id file, `<target dir>/flotilla-target`: a small versioned text file that
//! gives a target directory its identity across restarts. Format (see
//! `docs/target-format.md`):
//!
//! ```text
//! # Flotilla storage target. Do not edit.
//! format_version = 1
//! target_id = "0123456789abcdef"
//! ```
//!
//! The id is 16 lowercase or uppercase hex digits and never zero. Blank lines and lines
//! starting with `#` are ignored; an unknown key, a missing key, a repeated key or a version
//! other than 1 makes the file corrupt. The file is written to a temporary name, synced, and
//! renamed into place, so a crash leaves either no file or a whole one.

use crate::error::StoreError;
use flotilla_types::TargetId;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the id file inside a target directory.
pub const TARGET_ID_FILE_NAME: &str = "flotilla-target";
/// The only format version this code reads and writes.
pub const TARGET_FORMAT_VERSION: u32 = 1;
/// A larger file cannot be ours; refuse it before reading it whole.
const TARGET_ID_FILE_BYTES_MAX: u64 = 4096;

/// Renders the file's contents.
pub(crate) fn render(id: TargetId) -> String {
    format!(
        "# Flotilla storage target. Do not edit.\nformat_version = {TARGET_FORMAT_VERSION}\ntarget_id = \"{:016x}\"\n",
        id.0
    )
}

/// Parses the file's contents.
pub(crate) fn parse(text: &str) -> Result<TargetId, String> {
    let mut version = None;
    let mut id = None;
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| format!("line {} has no '='", number + 1))?;
        match key.trim() {
            "format_version" => set_once(&mut version, "format_version", parse_version(value)?)?,
            "target_id" => set_once(&mut id, "target_id", parse_id(value)?)?,
            other => return Err(format!("unknown key {other:?} on line {}", number + 1)),
        }
    }
    match (version, id) {
        (None, _) => Err("no format_version".into()),
        (_, None) => Err("no target_id".into()),
        (Some(_), Some(id)) => Ok(id),
    }
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
    if version != TARGET_FORMAT_VERSION {
        return Err(format!("format_version {version} is not supported (only {TARGET_FORMAT_VERSION})"));
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
pub(crate) fn read(dir: &Path) -> Result<Option<TargetId>, StoreError> {
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
pub(crate) fn write(dir: &Path, id: TargetId) -> Result<(), StoreError> {
    assert_ne!(id.0, 0, "a target id is never zero");
    let path = dir.join(TARGET_ID_FILE_NAME);
    let temporary = dir.join(format!("{TARGET_ID_FILE_NAME}.tmp"));
    let io_error = |action: &str, error| StoreError::io(format!("{action} {temporary:?}"), error);
    let mut file = fs::File::create(&temporary).map_err(|error| io_error("create", error))?;
    file.write_all(render(id).as_bytes()).map_err(|error| io_error("write", error))?;
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
        let id = TargetId(0x00ab_cdef_0123_4567);
        assert_eq!(parse(&render(id)), Ok(id));
    }

    #[test]
    fn refuses_corrupt_files() {
        let cases = [
            "",
            "format_version = 1\n",
            "target_id = \"00000000000000aa\"\n",
            "format_version = 2\ntarget_id = \"00000000000000aa\"\n",
            "format_version = 1\ntarget_id = \"0000000000000000\"\n",
            "format_version = 1\ntarget_id = \"00aa\"\n",
            "format_version = 1\ntarget_id = 00000000000000aa\n",
            "format_version = 1\ntarget_id = \"zz000000000000aa\"\n",
            "format_version = 1\ntarget_id = \"00000000000000aa\"\ncolour = 3\n",
            "format_version = 1\nformat_version = 1\ntarget_id = \"00000000000000aa\"\n",
            "garbage\n",
        ];
        for case in cases {
            assert!(parse(case).is_err(), "accepted {case:?}");
        }
    }
}
