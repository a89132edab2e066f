//! Flotilla's authentication: the cluster CA, credentials, the Noise handshake every
//! connection starts with, and the keyed integrity tags (or encryption) on frames after it.

pub mod capability;
pub mod credential;
pub mod crypt;
pub mod handshake;
pub mod integrity;
pub mod keypair;
pub mod tag;
pub mod wire;

use std::path::PathBuf;

pub use capability::{now_unix_ms, CapabilityError, CapabilityKey, Grant};
pub use credential::{Certificate, ClusterCa, Credential, IssueRequest, Limits, Role, SignedCertificate};
pub use crypt::{CryptKeys, FrameDecrypt, FrameEncrypt};
pub use handshake::{
    initiate, initiate_expecting, initiate_with, respond, respond_with, responder_roles, Established, Peer,
};
pub use tag::{FrameOpen, FrameSeal, TagHasher, TagKeys, TAG_BYTES};
pub use wire::{Acceptor, AuthBounds, ClientAuth, Integrity, Opener, Sealer, Secured};

/// What went wrong with a key, a credential, a handshake or a tag.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    BadFile { path: PathBuf, message: String },
    #[error("cannot issue credential: {0}")]
    BadRequest(String),
    #[error("the CA public key is not a valid ed25519 key")]
    BadCaKey,
    #[error("certificate is not signed by this cluster's CA (a credential of another cluster?)")]
    BadSignature,
    #[error("certificate {name:?} expired at {expires_unix_secs} (Unix seconds)")]
    Expired { name: String, expires_unix_secs: u64 },
    #[error("peer credential {name:?} has role {role}, which is not allowed here")]
    WrongRole { name: String, role: Role },
    #[error("cannot decode {what}: {message}")]
    Decode { what: &'static str, message: String },
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("handshake did not finish within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("connection failed during the handshake: {0}")]
    Stream(std::io::Error),
    #[error("no credential for {who}: pass --key PATH, set `key` in the config file, or set FLOTILLA_KEY to a credential file (made by `flotilla keygen --out DIR`; `flotilla local` prints key=PATH)")]
    NoCredential { who: String },
    #[error("{path}: credential {name:?} has role {role}, but {who} needs a {wanted} credential")]
    CredentialRole { path: PathBuf, name: String, role: Role, who: String, wanted: Role },
    #[error("integrity tag mismatch on frame {sequence} (request {request_id}); closing the connection")]
    BadTag { request_id: u64, sequence: u64 },
    #[error("encrypted frame {sequence} (request {request_id}) does not decrypt: altered, replayed, reordered or sealed with another key; closing the connection")]
    Decrypt { request_id: u64, sequence: u64 },
    #[error("encryption failed: {0}")]
    Crypt(String),
}

/// Loads the credential `who` (e.g. "the I/O server") runs with and checks its role.
pub fn load_credential(
    path: Option<&std::path::Path>,
    who: &str,
    wanted: Role,
) -> Result<std::sync::Arc<Credential>, AuthError> {
    let path = path.ok_or_else(|| AuthError::NoCredential { who: who.to_string() })?;
    let credential = Credential::load(path)?;
    let cert = credential.certificate();
    if cert.role != wanted {
        return Err(AuthError::CredentialRole {
            path: path.to_path_buf(),
            name: cert.name.clone(),
            role: cert.role,
            who: who.to_string(),
            wanted,
        });
    }
    Ok(std::sync::Arc::new(credential))
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
