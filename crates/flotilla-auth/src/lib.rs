//! Flotilla's authentication: the cluster CA, credentials, the Noise handshake every
//! connection starts with, and the keyed integrity tags on frames after it.

pub mod credential;
pub mod handshake;
pub mod tag;

use std::path::PathBuf;

pub use credential::{Certificate, ClusterCa, Credential, IssueRequest, Limits, Role, SignedCertificate};
pub use handshake::{initiate, respond, Established, Peer};
pub use tag::{FrameOpen, FrameSeal, TagKeys, TAG_BYTES};

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
    #[error("certificate is not signed by this cluster's CA")]
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
    #[error("integrity tag mismatch on frame {sequence} (request {request_id}); closing the connection")]
    BadTag { request_id: u64, sequence: u64 },
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
