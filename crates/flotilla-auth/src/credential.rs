//! Cluster CA, certificates and credential files.
//!
//! Both files are `magic (8 bytes) | version (u16 LE) | postcard body`; see
//! docs/protocol.md "Credentials" for the field order.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::AuthError;

/// First bytes of a CA key file.
pub const CA_MAGIC: [u8; 8] = *b"FLOTCAKY";
/// First bytes of a credential file.
pub const CREDENTIAL_MAGIC: [u8; 8] = *b"FLOTCRED";
/// The only credential/CA file version this build reads.
pub const FILE_VERSION: u16 = 1;
/// Largest credential or CA file this build reads.
pub const FILE_BYTES_MAX: u64 = 16 * 1024;
/// Longest credential name or subtree path.
pub const NAME_BYTES_MAX: usize = 255;
/// Domain separation for certificate signatures.
const CERT_SIGNATURE_CONTEXT: &[u8] = b"flotilla certificate v1\0";

/// What a credential may do on the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A metadata service or I/O server.
    Server,
    /// A library, CLI, C, Python or mount client.
    Client,
    /// A node of the metadata group, on the group's peer links (Raft RPCs) only: it accepts
    /// only other meta nodes and connects only to them. A node serves clients and I/O
    /// servers with a server credential of its own.
    Meta,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Server => "server",
            Role::Client => "client",
            Role::Meta => "meta",
        })
    }
}

/// Restrictions a client credential carries, enforced by the metadata service: the same
/// type as a connection's policy (read-only, subtree, fixed uid/gid, root squash), so a
/// certificate's limits and the service's default combine field by field
/// (`CallerPolicy::narrowed_by`). Its postcard encoding is the certificate's limits field.
pub type Limits = flotilla_types::CallerPolicy;

/// The signed statement binding a handshake key to a role, name and limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certificate {
    pub role: Role,
    pub name: String,
    pub limits: Limits,
    /// Seconds since the Unix epoch after which the certificate is refused.
    pub expires_unix_secs: Option<u64>,
    /// The X25519 static public key used in the Noise handshake.
    pub static_public_key: [u8; 32],
}

/// A certificate with the CA's ed25519 signature over its encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedCertificate {
    /// postcard encoding of [`Certificate`].
    pub body: Vec<u8>,
    /// 64-byte ed25519 signature over `CERT_SIGNATURE_CONTEXT || body`.
    pub signature: Vec<u8>,
}

impl SignedCertificate {
    /// Checks the CA signature and expiry and decodes the certificate.
    pub fn verify(&self, ca_public: &[u8; 32], now_unix_secs: u64) -> Result<Certificate, AuthError> {
        let key = VerifyingKey::from_bytes(ca_public).map_err(|_| AuthError::BadCaKey)?;
        let signature = Signature::from_slice(&self.signature).map_err(|_| AuthError::BadSignature)?;
        key.verify(&signed_message(&self.body), &signature).map_err(|_| AuthError::BadSignature)?;
        let cert: Certificate = postcard::from_bytes(&self.body)
            .map_err(|e| AuthError::Decode { what: "certificate", message: e.to_string() })?;
        if let Some(expiry) = cert.expires_unix_secs {
            if now_unix_secs >= expiry {
                return Err(AuthError::Expired { name: cert.name, expires_unix_secs: expiry });
            }
        }
        Ok(cert)
    }

    /// Encodes for a handshake payload.
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// Decodes a handshake payload.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AuthError> {
        postcard::from_bytes(bytes)
            .map_err(|e| AuthError::Decode { what: "peer certificate", message: e.to_string() })
    }
}

fn signed_message(body: &[u8]) -> Vec<u8> {
    let mut message = CERT_SIGNATURE_CONTEXT.to_vec();
    message.extend_from_slice(body);
    message
}

/// The cluster CA: signs certificates and holds the cluster's capability key.
#[derive(Clone, Serialize, Deserialize)]
pub struct ClusterCa {
    signing_key: [u8; 32],
    capability_key: [u8; 32],
}

/// The stored fields of a credential file, in file order.
#[derive(Clone, Serialize, Deserialize)]
struct CredentialFile {
    static_private_key: [u8; 32],
    certificate: SignedCertificate,
    ca_public_key: [u8; 32],
    capability_key: Option<[u8; 32]>,
}

/// A credential: a handshake key pair, its certificate and the CA's public key.
#[derive(Clone)]
pub struct Credential {
    file: CredentialFile,
    decoded: Certificate,
}

/// What to put into a new credential.
#[derive(Clone, Debug)]
pub struct IssueRequest {
    pub role: Role,
    pub name: String,
    pub limits: Limits,
    pub expires_unix_secs: Option<u64>,
}

fn random_key() -> [u8; 32] {
    rand::random()
}

impl ClusterCa {
    /// A new CA with fresh random keys.
    pub fn generate() -> Self {
        ClusterCa { signing_key: random_key(), capability_key: random_key() }
    }

    /// The CA's ed25519 public key.
    pub fn public_key(&self) -> [u8; 32] {
        SigningKey::from_bytes(&self.signing_key).verifying_key().to_bytes()
    }

    /// Issues a credential signed by this CA.
    pub fn issue(&self, request: IssueRequest) -> Result<Credential, AuthError> {
        check_name(&request.name, "credential name")?;
        if let Some(subtree) = &request.limits.subtree {
            check_name(subtree, "subtree")?;
            if !subtree.starts_with('/') {
                return Err(AuthError::BadRequest(format!("subtree {subtree:?} is not an absolute path")));
            }
        }
        if request.role != Role::Client && request.limits != Limits::default() {
            return Err(AuthError::BadRequest("limits apply to client credentials only".into()));
        }
        let keypair = crate::keypair::generate_static_keypair()?;
        let cert = Certificate {
            role: request.role,
            name: request.name,
            limits: request.limits,
            expires_unix_secs: request.expires_unix_secs,
            static_public_key: keypair.public,
        };
        let body = postcard::to_stdvec(&cert).map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let signature = SigningKey::from_bytes(&self.signing_key).sign(&signed_message(&body));
        let file = CredentialFile {
            static_private_key: keypair.private,
            certificate: SignedCertificate { body, signature: signature.to_bytes().to_vec() },
            ca_public_key: self.public_key(),
            capability_key: (cert.role == Role::Server).then_some(self.capability_key),
        };
        Ok(Credential { file, decoded: cert })
    }

    /// Writes the CA to `path` with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), AuthError> {
        let body = postcard::to_stdvec(self).map_err(|e| AuthError::BadRequest(e.to_string()))?;
        write_private(path, &encode_file(CA_MAGIC, &body))
    }

    /// Reads a CA written by [`ClusterCa::save`].
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let bytes = read_bounded(path)?;
        let body = decode_file(path, CA_MAGIC, &bytes)?;
        postcard::from_bytes(body).map_err(|e| AuthError::BadFile {
            path: path.to_path_buf(),
            message: format!("cannot decode CA key: {e}"),
        })
    }
}

fn check_name(name: &str, what: &str) -> Result<(), AuthError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(AuthError::BadRequest(format!("{what} must be 1..={NAME_BYTES_MAX} bytes")));
    }
    Ok(())
}

impl Credential {
    /// The decoded certificate.
    pub fn certificate(&self) -> &Certificate {
        &self.decoded
    }

    /// The signed certificate sent in the handshake.
    pub fn signed_certificate(&self) -> &SignedCertificate {
        &self.file.certificate
    }

    /// The X25519 static private key used in the handshake.
    pub fn static_private_key(&self) -> &[u8; 32] {
        &self.file.static_private_key
    }

    /// The CA public key peers' certificates are checked against.
    pub fn ca_public_key(&self) -> &[u8; 32] {
        &self.file.ca_public_key
    }

    /// The cluster's capability key; present in server credentials only.
    pub fn capability_key(&self) -> Option<&[u8; 32]> {
        self.file.capability_key.as_ref()
    }

    /// Writes the credential to `path` with mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), AuthError> {
        let body = postcard::to_stdvec(&self.file).map_err(|e| AuthError::BadRequest(e.to_string()))?;
        write_private(path, &encode_file(CREDENTIAL_MAGIC, &body))
    }

    /// Reads and checks a credential file (CA signature and expiry of its own certificate).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let bytes = read_bounded(path)?;
        let body = decode_file(path, CREDENTIAL_MAGIC, &bytes)?;
        let file: CredentialFile = postcard::from_bytes(body).map_err(|e| AuthError::BadFile {
            path: path.to_path_buf(),
            message: format!("cannot decode credential: {e}"),
        })?;
        let bad = |message: String| AuthError::BadFile { path: path.to_path_buf(), message };
        let cert = file
            .certificate
            .verify(&file.ca_public_key, crate::now_unix_secs())
            .map_err(|e| bad(e.to_string()))?;
        let public = crate::keypair::public_key_of(&file.static_private_key)?;
        if public != cert.static_public_key {
            return Err(bad("the certificate does not match the credential's private key".into()));
        }
        Ok(Credential { file, decoded: cert })
    }
}

fn encode_file(magic: [u8; 8], body: &[u8]) -> Vec<u8> {
    let mut bytes = magic.to_vec();
    bytes.extend_from_slice(&FILE_VERSION.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn decode_file<'a>(path: &Path, magic: [u8; 8], bytes: &'a [u8]) -> Result<&'a [u8], AuthError> {
    let bad = |message: String| AuthError::BadFile { path: path.to_path_buf(), message };
    let what = if magic == CA_MAGIC { "CA key" } else { "credential" };
    if bytes.len() < 10 || bytes[..8] != magic {
        return Err(bad(format!("not a Flotilla {what} file (wrong magic bytes)")));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FILE_VERSION {
        return Err(bad(format!("{what} file version {version}; this build reads version {FILE_VERSION}")));
    }
    Ok(&bytes[10..])
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, AuthError> {
    use std::io::Read;
    let io = |source| AuthError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(FILE_BYTES_MAX + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > FILE_BYTES_MAX {
        return Err(AuthError::BadFile {
            path: path.to_path_buf(),
            message: format!("larger than {FILE_BYTES_MAX} bytes"),
        });
    }
    Ok(bytes)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AuthError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| AuthError::Io { path: PathBuf::from(path), source };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}
