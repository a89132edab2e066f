//! The Noise_XX_25519_ChaChaPoly_BLAKE2s handshake every connection starts with.
//!
//! Three messages, each `length (u16 LE) | Noise message`:
//! 1. initiator → responder: `e` + payload: the initiator's integrity level (1 byte);
//! 2. responder → initiator: `e, ee, s, es` + payload: the responder's integrity level
//!    (1 byte) then its signed certificate;
//! 3. initiator → responder: `s, se` + the initiator's signed certificate.
//!
//! Integrity levels: 0 = none, 1 = mac, 2 = encrypt. Both sides use the stronger of the two
//! levels (never weaker than either asked). The first payload travels in clear but is
//! mixed into the handshake hash, so an attacker who lowers it makes the handshake fail.
//!
//! Each side checks the peer certificate's CA signature, expiry, role and that its
//! public key is the Noise remote static key. Both sides then derive the frame tag
//! keys from the handshake hash ([`crate::tag::TagKeys`]), and with `encrypt` the frame
//! encryption keys ([`crate::crypt::CryptKeys`]).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::credential::{Certificate, Credential, Limits, Role, SignedCertificate};
use crate::crypt::CryptKeys;
use crate::integrity::Integrity;
pub use crate::keypair::{generate_static_keypair, public_key_of, StaticKeypair, NOISE_PARAMS};
use crate::keypair::{noise, params};
use crate::tag::TagKeys;
use crate::AuthError;

/// Bound into the handshake so a different protocol version cannot complete it.
pub const PROLOGUE: &[u8] = b"flotilla frame v2";
/// Largest handshake message either side accepts or sends (Noise's own limit is 65535).
pub const HANDSHAKE_MESSAGE_BYTES_MAX: usize = 4096;

/// The authenticated other end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub role: Role,
    /// The credential name from the peer's certificate.
    pub name: String,
    pub limits: Limits,
}

impl From<Certificate> for Peer {
    fn from(cert: Certificate) -> Self {
        Peer { role: cert.role, name: cert.name, limits: cert.limits }
    }
}

/// The result of a completed handshake.
pub struct Established {
    pub peer: Peer,
    pub keys: TagKeys,
    /// The level both sides agreed on: the stronger of the two they asked for.
    pub integrity: Integrity,
    /// The frame encryption keys, when the agreed level is `encrypt`.
    pub crypt: Option<CryptKeys>,
}

/// Runs the initiator side (the connecting side) asking for `integrity = mac`, and
/// requires the peer to hold a server-role certificate (a meta one if this side is a meta
/// node: [`responder_roles`]).
pub async fn initiate<S>(
    stream: &mut S,
    credential: &Credential,
    timeout: Duration,
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    initiate_with(stream, credential, Integrity::Mac, timeout).await
}

/// The roles an initiator holding a `role` credential accepts from the responder: a meta
/// node (metadata group peer link) talks only to meta nodes; clients and servers talk only
/// to servers.
pub fn responder_roles(role: Role) -> &'static [Role] {
    match role {
        Role::Meta => &[Role::Meta],
        Role::Server | Role::Client => &[Role::Server],
    }
}

/// Runs the initiator side asking for `integrity`; the responder's role must be one of
/// [`responder_roles`] of this side's credential.
pub async fn initiate_with<S>(
    stream: &mut S,
    credential: &Credential,
    integrity: Integrity,
    timeout: Duration,
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let allowed = responder_roles(credential.certificate().role);
    initiate_expecting(stream, credential, integrity, timeout, allowed).await
}

/// Runs the initiator side asking for `integrity`, accepting a responder whose role is one
/// of `allowed`.
pub async fn initiate_expecting<S>(
    stream: &mut S,
    credential: &Credential,
    integrity: Integrity,
    timeout: Duration,
    allowed: &[Role],
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(timeout, initiate_inner(stream, credential, integrity, allowed))
        .await
        .map_err(|_| AuthError::Timeout { timeout_ms: timeout.as_millis() as u64 })?
}

async fn initiate_inner<S>(
    stream: &mut S,
    credential: &Credential,
    integrity: Integrity,
    allowed: &[Role],
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut state = snow::Builder::new(params())
        .local_private_key(credential.static_private_key())
        .prologue(PROLOGUE)
        .build_initiator()
        .map_err(noise)?;
    send(stream, &mut state, &[integrity.to_wire()]).await?;
    let payload = receive(stream, &mut state).await?;
    let (peer_integrity, certificate) = payload
        .split_first()
        .ok_or_else(|| AuthError::Handshake("second handshake message carries no integrity level".into()))?;
    let peer_integrity = Integrity::from_wire(*peer_integrity)?;
    let cert = check_peer(&state, certificate, credential, allowed)?;
    send(stream, &mut state, &credential.signed_certificate().to_bytes()).await?;
    finish(state, cert, integrity.max(peer_integrity))
}

/// Runs the responder side (the accepting side) with `integrity = mac`; the peer's role
/// must be one of `allowed`.
pub async fn respond<S>(
    stream: &mut S,
    credential: &Credential,
    allowed: &[Role],
    timeout: Duration,
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    respond_with(stream, credential, allowed, Integrity::Mac, timeout).await
}

/// Runs the responder side configured with `integrity`.
pub async fn respond_with<S>(
    stream: &mut S,
    credential: &Credential,
    allowed: &[Role],
    integrity: Integrity,
    timeout: Duration,
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(timeout, respond_inner(stream, credential, allowed, integrity))
        .await
        .map_err(|_| AuthError::Timeout { timeout_ms: timeout.as_millis() as u64 })?
}

async fn respond_inner<S>(
    stream: &mut S,
    credential: &Credential,
    allowed: &[Role],
    integrity: Integrity,
) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut state = snow::Builder::new(params())
        .local_private_key(credential.static_private_key())
        .prologue(PROLOGUE)
        .build_responder()
        .map_err(noise)?;
    let first = receive(stream, &mut state).await?;
    let peer_integrity = match first[..] {
        [level] => Integrity::from_wire(level)?,
        _ => {
            let message =
                format!("first handshake message carries {} payload bytes, expected 1", first.len());
            return Err(AuthError::Handshake(message));
        }
    };
    let mut second = vec![integrity.to_wire()];
    second.extend_from_slice(&credential.signed_certificate().to_bytes());
    send(stream, &mut state, &second).await?;
    let payload = receive(stream, &mut state).await?;
    let cert = check_peer(&state, &payload, credential, allowed)?;
    finish(state, cert, integrity.max(peer_integrity))
}

fn finish(
    state: snow::HandshakeState,
    cert: Certificate,
    integrity: Integrity,
) -> Result<Established, AuthError> {
    let (hash, initiator) = (state.get_handshake_hash(), state.is_initiator());
    let keys = TagKeys::from_handshake_hash(hash, initiator);
    let crypt = (integrity == Integrity::Encrypt).then(|| CryptKeys::from_handshake_hash(hash, initiator));
    Ok(Established { peer: cert.into(), keys, integrity, crypt })
}

/// Checks the peer certificate carried in `payload` against the handshake state.
fn check_peer(
    state: &snow::HandshakeState,
    payload: &[u8],
    credential: &Credential,
    allowed: &[Role],
) -> Result<Certificate, AuthError> {
    let signed = SignedCertificate::from_bytes(payload)?;
    let cert = signed.verify(credential.ca_public_key(), crate::now_unix_secs())?;
    if !allowed.contains(&cert.role) {
        return Err(AuthError::WrongRole { name: cert.name, role: cert.role });
    }
    let remote = state.get_remote_static().unwrap_or_default();
    if remote != cert.static_public_key {
        return Err(AuthError::Handshake(format!(
            "certificate {:?} is not for the key the peer proved it holds",
            cert.name
        )));
    }
    Ok(cert)
}

async fn send<S>(stream: &mut S, state: &mut snow::HandshakeState, payload: &[u8]) -> Result<(), AuthError>
where
    S: AsyncWrite + Unpin,
{
    let mut message = vec![0u8; HANDSHAKE_MESSAGE_BYTES_MAX];
    let len = state.write_message(payload, &mut message).map_err(noise)?;
    let mut framed = Vec::with_capacity(2 + len);
    framed.extend_from_slice(&(len as u16).to_le_bytes());
    framed.extend_from_slice(&message[..len]);
    stream.write_all(&framed).await.map_err(AuthError::Stream)?;
    stream.flush().await.map_err(AuthError::Stream)
}

async fn receive<S>(stream: &mut S, state: &mut snow::HandshakeState) -> Result<Vec<u8>, AuthError>
where
    S: AsyncRead + Unpin,
{
    let mut len_bytes = [0u8; 2];
    stream.read_exact(&mut len_bytes).await.map_err(AuthError::Stream)?;
    let len = usize::from(u16::from_le_bytes(len_bytes));
    if len > HANDSHAKE_MESSAGE_BYTES_MAX {
        return Err(AuthError::Handshake(format!(
            "handshake message of {len} bytes is over the limit of {HANDSHAKE_MESSAGE_BYTES_MAX}"
        )));
    }
    let mut message = vec![0u8; len];
    stream.read_exact(&mut message).await.map_err(AuthError::Stream)?;
    let mut payload = vec![0u8; len];
    let payload_len = state.read_message(&message, &mut payload).map_err(noise)?;
    payload.truncate(payload_len);
    Ok(payload)
}
