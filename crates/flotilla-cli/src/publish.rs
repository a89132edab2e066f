//! Copies into Flotilla are published whole or not at all (`put`, `cp`): the bytes go to a
//! hidden temporary name in the destination's directory, created owner-only, and only once
//! every byte is committed and the size published (`File::sync`) is it given its final mode
//! and renamed onto the destination with `RenameNoReplace` (never over a file that appeared
//! meanwhile; the destination must not exist, as before). A copy that fails drops what it
//! had not made durable, removes the temporary and leaves the destination absent. A copy
//! killed outright leaves its temporary (`.NAME.flotilla-put.HEX`) behind, as rsync leaves
//! its partial files.

use anyhow::Context;
use flotilla_client::{Client, CreateOptions, File, SetAttr};

/// The mode a published file gets (what `put` and `cp` always gave new files).
pub const PUBLISHED_MODE: u32 = 0o644;

/// The mode of the temporary while bytes arrive: nobody else reads a half-copied file.
const TEMP_MODE: u32 = 0o600;

/// Longest name in a directory (bytes), as the metadata service and Linux allow.
const NAME_BYTES_MAX: usize = 255;

/// Temporary names tried before giving up (each random; a clash is already unlikely).
const TEMP_ATTEMPTS_MAX: u32 = 8;

/// What a temporary's name adds to the destination's name: `.` before, this after, then
/// 16 hex digits.
const TEMP_MARK: &str = ".flotilla-put.";

/// A file being copied into Flotilla under its temporary name.
pub struct Staged {
    client: Client,
    file: File,
    temp: String,
    destination: String,
}

impl Staged {
    /// Creates the temporary for `destination` (which must not exist) with the layout and
    /// subfiles of `options`.
    pub fn create(client: &Client, destination: &str, options: &CreateOptions) -> anyhow::Result<Staged> {
        match client.stat(destination) {
            Ok(_) => anyhow::bail!("{destination} already exists"),
            Err(error) if error.errno() == libc::ENOENT => {}
            Err(error) => return Err(error).with_context(|| format!("stat {destination}")),
        }
        let options = CreateOptions { mode: TEMP_MODE, exclusive: true, ..options.clone() };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let temp = temp_path(destination, rand::random());
            match client.create(&temp, &options) {
                Ok(file) => {
                    let (client, destination) = (client.clone(), destination.to_string());
                    return Ok(Staged { client, file, temp, destination });
                }
                Err(error) if error.errno() == libc::EEXIST && attempt < TEMP_ATTEMPTS_MAX => continue,
                Err(error) => {
                    return Err(error).with_context(|| format!("create {temp} (to become {destination})"))
                }
            }
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Makes every byte durable, then publishes the file under its destination; on failure
    /// the temporary is removed and the destination left absent.
    pub fn publish(self) -> anyhow::Result<()> {
        if let Err(error) = self.file.sync() {
            let error = anyhow::Error::new(error).context(format!("commit {}", self.temp));
            return Err(self.abandon_with(error));
        }
        let Staged { client, file, temp, destination } = self;
        let id = file.entry().id;
        let closed = file.close();
        let mode = SetAttr { mode: Some(PUBLISHED_MODE), ..SetAttr::default() };
        let published = closed
            .map_err(anyhow::Error::new)
            .and_then(|()| client.set_attr(id, mode).map(|_| ()).map_err(anyhow::Error::new))
            .and_then(|()| client.rename_no_replace(&temp, &destination).map_err(anyhow::Error::new));
        published.map_err(|error| {
            remove_temp(&client, &temp);
            error.context(format!("publish {temp} as {destination}"))
        })
    }

    /// Gives the copy up: drops what was not made durable and removes the temporary.
    pub fn abandon(self) {
        let Staged { client, file, temp, .. } = self;
        file.discard();
        remove_temp(&client, &temp);
    }

    fn abandon_with(self, error: anyhow::Error) -> anyhow::Error {
        self.abandon();
        error
    }
}

fn remove_temp(client: &Client, temp: &str) {
    if let Err(error) = client.remove(temp) {
        eprintln!("flotilla: could not remove the unfinished copy {temp}: {error}");
    }
}

/// The temporary for `destination` (an absolute, normalized path): `.NAME.flotilla-put.HEX`
/// in the same directory, the name shortened (at a character boundary) so the whole fits
/// in `NAME_BYTES_MAX`.
pub fn temp_path(destination: &str, nonce: u64) -> String {
    let (parent, name) = destination.rsplit_once('/').unwrap_or(("", destination));
    let room = NAME_BYTES_MAX - 1 - TEMP_MARK.len() - 16;
    let mut end = name.len().min(room);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{parent}/.{}{TEMP_MARK}{nonce:016x}", &name[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_is_hidden_beside_the_destination() {
        assert_eq!(temp_path("/a/b/data.h5", 0xab), "/a/b/.data.h5.flotilla-put.00000000000000ab");
        assert_eq!(temp_path("/top", 1), "/.top.flotilla-put.0000000000000001");
    }

    #[test]
    fn a_long_name_is_shortened_to_fit() {
        let long = format!("/d/{}", "é".repeat(200));
        let temp = temp_path(&long, u64::MAX);
        let name = temp.rsplit_once('/').unwrap().1;
        assert!(name.len() <= NAME_BYTES_MAX, "{} bytes", name.len());
        assert!(name.ends_with(".flotilla-put.ffffffffffffffff"));
        assert!(name.starts_with(".éé"), "the name starts with the destination's");
    }
}
