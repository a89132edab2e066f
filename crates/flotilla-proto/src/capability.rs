//! Capabilities: what the metadata service lets one credential do to one file's data.
//!
//! The metadata service issues a capability with every file entry it returns to a client
//! (lookup, create, open, get-by-id), tagged with a key only servers hold; a client attaches
//! it to each request it sends an I/O server ([`crate::IoRequest::With`]), which checks the
//! tag, the holder, the expiry and the rights offline. Tagging and checking live in
//! `flotilla-auth` (`capability.rs`); this module is the wire type and the pure coverage
//! rules. Byte layout: docs/protocol.md "Capabilities".

use flotilla_types::FileId;
use serde::{Deserialize, Serialize};

use crate::IoRequest;

/// Longest holder name a capability carries (a credential name).
pub const HOLDER_BYTES_MAX: usize = 255;
/// Length of a capability's tag.
pub const CAPABILITY_TAG_BYTES: usize = 32;

/// A set of rights on a file's data, as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rights(pub u8);

impl Rights {
    /// Read data, fork sizes and fork lists; sync.
    pub const READ: Rights = Rights(1);
    /// Write data, extend, create subfiles and forks; sync.
    pub const WRITE: Rights = Rights(2);
    /// Truncate forks.
    pub const TRUNCATE: Rights = Rights(4);
    /// Remove forks.
    pub const REMOVE: Rights = Rights(8);
    /// No rights.
    pub const NONE: Rights = Rights(0);

    /// Whether every right in `other` is in `self`.
    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets.
    pub fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether any right in `other` is in `self`.
    pub fn intersects(self, other: Rights) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::fmt::Display for Rights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (Rights::READ, "read"),
            (Rights::WRITE, "write"),
            (Rights::TRUNCATE, "truncate"),
            (Rights::REMOVE, "remove"),
        ];
        let held: Vec<&str> = names.iter().filter(|(r, _)| self.contains(*r)).map(|(_, n)| *n).collect();
        if held.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&held.join("+"))
    }
}

/// A tagged grant of `rights` on the subfiles `0..subfiles` of `file` to the credential
/// named `holder`, valid until `expires_unix_ms` (the metadata service's clock).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capability {
    pub file: FileId,
    pub subfiles: u32,
    pub rights: Rights,
    pub holder: String,
    pub issued_unix_ms: u64,
    pub expires_unix_ms: u64,
    /// BLAKE3 keyed hash of the fields above (see `flotilla_auth::capability`).
    pub tag: [u8; CAPABILITY_TAG_BYTES],
}

impl Capability {
    /// The lifetime the issuer gave it, in milliseconds.
    pub fn lifetime_ms(&self) -> u64 {
        self.expires_unix_ms.saturating_sub(self.issued_unix_ms)
    }

    /// Why this capability does not cover `request` (its tag and expiry aside), or `None`.
    pub fn refusal(&self, request: &IoRequest) -> Option<String> {
        let Some((file, subfile, wanted)) = needs(request) else {
            return Some(format!("{} cannot be made with a capability", request_name(request)));
        };
        if file != self.file {
            return Some(format!("capability is for file {}, not file {file}", self.file));
        }
        if subfile >= self.subfiles {
            return Some(format!(
                "capability covers subfiles 0..{} of file {file}, not subfile {subfile}",
                self.subfiles
            ));
        }
        if !self.rights.contains(wanted) {
            return Some(format!(
                "capability grants {} on file {file}; {} needs {wanted}",
                self.rights,
                request_name(request)
            ));
        }
        None
    }
}

/// The file, subfile index and rights a request touches; `None` for requests no client
/// capability covers (greeting, subfile removal).
pub fn needs(request: &IoRequest) -> Option<(FileId, u32, Rights)> {
    Some(match request {
        // A chained request needs what the request it carries needs (never a nested chain).
        IoRequest::Chained { request, .. } if !matches!(**request, IoRequest::Chained { .. }) => {
            return needs(request)
        }
        IoRequest::Chained { .. } => return None,
        IoRequest::Read { fork, .. } | IoRequest::ForkSize { fork } => {
            (fork.file, fork.subfile.0, Rights::READ)
        }
        IoRequest::ListForks { file, subfile, .. } => (*file, subfile.0, Rights::READ),
        IoRequest::Write { fork, .. } | IoRequest::Extend { fork, .. } | IoRequest::CreateFork { fork } => {
            (fork.file, fork.subfile.0, Rights::WRITE)
        }
        IoRequest::CreateSubfile { file, subfile, .. } => (*file, subfile.0, Rights::WRITE),
        IoRequest::Truncate { fork, .. } => (fork.file, fork.subfile.0, Rights::TRUNCATE),
        IoRequest::RemoveFork { fork } => (fork.file, fork.subfile.0, Rights::REMOVE),
        // Syncing moves and exposes no data: any capability for the file suffices.
        IoRequest::Sync { fork } => (fork.file, fork.subfile.0, Rights::NONE),
        // A flush moves data into the file: the member needs write access to it.
        IoRequest::FlushDirectory { job, entries } => {
            let highest = entries.iter().map(|e| e.subfile.0).max().unwrap_or(0);
            (job.file, highest, Rights::WRITE)
        }
        IoRequest::FlushPull { job } | IoRequest::FlushData { job, .. } => (job.file, 0, Rights::WRITE),
        // Releasing drops the disk copy: a writer's right; the rest only reads.
        IoRequest::Hsm { fork, action: crate::io::HsmAction::Release } => {
            (fork.file, fork.subfile.0, Rights::WRITE)
        }
        IoRequest::Hsm { fork, .. } => (fork.file, fork.subfile.0, Rights::READ),
        // A scrub only rewrites a block with the bytes another replica holds: a reader's right.
        IoRequest::BlockChecksums { fork, .. } => (fork.file, fork.subfile.0, Rights::READ),
        IoRequest::Hello { .. }
        | IoRequest::RemoveSubfile { .. }
        | IoRequest::With { .. }
        | IoRequest::Job { .. }
        | IoRequest::Stats
        | IoRequest::HsmStatus
        | IoRequest::Forward { .. } => return None,
    })
}

/// Whether `request` changes stored data (refused to read-only credentials): it needs a
/// right beyond reading, or it removes a subfile.
pub fn changes_data(request: &IoRequest) -> bool {
    let changing = Rights::WRITE.union(Rights::TRUNCATE).union(Rights::REMOVE);
    matches!(request, IoRequest::RemoveSubfile { .. } | IoRequest::Forward { .. })
        || needs(request).is_some_and(|(_, _, wanted)| wanted.intersects(changing))
}

/// A short name of a request, for messages.
pub fn request_name(request: &IoRequest) -> &'static str {
    match request {
        IoRequest::Hello { .. } => "hello",
        IoRequest::Read { .. } => "read",
        IoRequest::Write { .. } => "write",
        IoRequest::CreateSubfile { .. } => "create subfile",
        IoRequest::RemoveSubfile { .. } => "remove subfile",
        IoRequest::CreateFork { .. } => "create fork",
        IoRequest::RemoveFork { .. } => "remove fork",
        IoRequest::ListForks { .. } => "list forks",
        IoRequest::ForkSize { .. } => "fork size",
        IoRequest::Extend { .. } => "extend",
        IoRequest::Truncate { .. } => "truncate",
        IoRequest::Sync { .. } => "sync",
        IoRequest::With { .. } => "capability envelope",
        IoRequest::FlushDirectory { .. } => "flush directory",
        IoRequest::FlushPull { .. } => "flush pull",
        IoRequest::FlushData { .. } => "flush data",
        IoRequest::Job { .. } => "job",
        IoRequest::Stats => "stats",
        IoRequest::Hsm { .. } => "hsm",
        IoRequest::HsmStatus => "hsm status",
        IoRequest::Forward { .. } => "chain forward",
        IoRequest::Chained { .. } => "chained request",
        IoRequest::BlockChecksums { .. } => "block checksums",
    }
}

/// `IoRequest::With { capability, request }` by reference, encoded exactly as the owned
/// variant is, so a client attaches a capability without copying the request.
pub struct WithRef<'a> {
    pub capability: &'a Capability,
    pub request: &'a IoRequest,
}

impl Serialize for WithRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStructVariant;
        let mut variant =
            serializer.serialize_struct_variant("IoRequest", IoRequest::WITH_VARIANT_INDEX, "With", 2)?;
        variant.serialize_field("capability", self.capability)?;
        variant.serialize_field("request", self.request)?;
        variant.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_body, ForkRef};
    use flotilla_request::Shape;
    use flotilla_types::{SubfileIndex, TargetId};

    fn capability(rights: Rights) -> Capability {
        Capability {
            file: FileId(7),
            subfiles: 2,
            rights,
            holder: "client".into(),
            issued_unix_ms: 1,
            expires_unix_ms: 2,
            tag: [3; 32],
        }
    }

    fn fork(file: u64, subfile: u32) -> ForkRef {
        ForkRef {
            target: TargetId(1),
            file: FileId(file),
            subfile: SubfileIndex(subfile),
            fork: "data".into(),
        }
    }

    #[test]
    fn the_borrowed_envelope_encodes_as_the_owned_one() {
        let cap = capability(Rights::READ);
        let request = IoRequest::Read { fork: fork(7, 1), shape: Shape::contiguous(0, 9) };
        let owned = IoRequest::With { capability: cap.clone(), request: Box::new(request.clone()) };
        let borrowed = WithRef { capability: &cap, request: &request };
        assert_eq!(encode_body(&borrowed).unwrap(), encode_body(&owned).unwrap());
    }

    #[test]
    fn coverage_checks_file_subfile_and_rights() {
        let read = capability(Rights::READ);
        let read_request = IoRequest::Read { fork: fork(7, 1), shape: Shape::contiguous(0, 9) };
        assert_eq!(read.refusal(&read_request), None);
        let other_file = IoRequest::Read { fork: fork(8, 1), shape: Shape::contiguous(0, 9) };
        assert!(read.refusal(&other_file).unwrap().contains("not file 0000000000000008"));
        let other_subfile = IoRequest::Read { fork: fork(7, 2), shape: Shape::contiguous(0, 9) };
        assert!(read.refusal(&other_subfile).unwrap().contains("not subfile 2"));
        let write = IoRequest::Write { fork: fork(7, 0), shape: Shape::contiguous(0, 9) };
        assert!(read.refusal(&write).unwrap().contains("needs write"));
        assert_eq!(capability(Rights::WRITE).refusal(&write), None);
        let remove =
            IoRequest::RemoveSubfile { target: TargetId(1), file: FileId(7), subfile: SubfileIndex(0) };
        assert!(capability(Rights(15)).refusal(&remove).is_some(), "no client capability removes subfiles");
        assert!(changes_data(&remove) && changes_data(&write) && !changes_data(&read_request));
        assert!(!changes_data(&IoRequest::Sync { fork: fork(7, 0) }), "a sync changes nothing");
        assert!(changes_data(&IoRequest::Truncate { fork: fork(7, 0), size_bytes: 0 }));
    }
}
