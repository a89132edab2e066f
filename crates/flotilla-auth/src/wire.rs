//! Frames on an authenticated connection, and the two ends of the handshake as a
//! connection's reader and writer use them.
//!
//! A frame sent with `integrity = mac` has the header flag `FLAG_TAGGED` set and is
//! followed by the 32-byte tag of [`crate::tag`]; the lengths in its header do not count
//! the tag. A receiver checks the tag of every tagged frame, and with `integrity = mac`
//! refuses frames without one. Any failure breaks the connection: its byte stream can no
//! longer be trusted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::{Frame, FrameError, FrameHeader, FLAG_TAGGED};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::handshake::{initiate, respond, Peer};
use crate::tag::{FrameOpen, FrameSeal, TAG_BYTES};
use crate::{AuthError, Credential, Role};

/// Whether frames carry a keyed integrity tag (the default) or only CRC32C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Integrity {
    /// Frames carry CRC32C only (for measuring the tag's cost; not for shared networks).
    None,
    /// Every frame carries a BLAKE3 keyed tag.
    #[default]
    Mac,
}

/// Adds tags to outgoing frames.
pub struct Sealer {
    seal: FrameSeal,
    integrity: Integrity,
}

impl Sealer {
    /// The header of the next frame and its tag (with `integrity = mac`).
    fn next(
        &mut self,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> Result<(FrameHeader, Option<[u8; TAG_BYTES]>), FrameError> {
        match self.integrity {
            Integrity::Mac => {
                let header = FrameHeader::for_tagged_payload(request_id, body, data)?;
                Ok((header, Some(self.seal.seal(request_id, body, data))))
            }
            Integrity::None => Ok((FrameHeader::for_payload(request_id, body, data)?, None)),
        }
    }

    /// The bytes of one frame and its tag, for tools and tests that write raw bytes.
    pub fn seal_frame(&mut self, request_id: u64, body: &[u8], data: &[u8]) -> Result<Vec<u8>, FrameError> {
        let (header, tag) = self.next(request_id, body, data)?;
        let mut out = header.encode().to_vec();
        out.extend_from_slice(body);
        out.extend_from_slice(data);
        out.extend_from_slice(tag.as_ref().map_or(&[][..], |t| &t[..]));
        Ok(out)
    }

    /// Writes one frame, followed by its tag with `integrity = mac`.
    pub async fn write_frame<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> Result<(), FrameError> {
        let (header, tag) = self.next(request_id, body, data)?;
        writer.write_all(&header.encode()).await?;
        writer.write_all(body).await?;
        if !data.is_empty() {
            writer.write_all(data).await?;
        }
        if let Some(tag) = tag {
            writer.write_all(&tag).await?;
        }
        Ok(())
    }
}

/// Checks the tags of incoming frames.
pub struct Opener {
    open: FrameOpen,
    integrity: Integrity,
    tag_timeout: Duration,
}

impl Opener {
    /// Reads and checks the tag that follows `frame` (read by `read_frame*` from the same
    /// reader); refuses an untagged frame when this side requires tags.
    pub async fn check<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        frame: &Frame,
    ) -> Result<(), FrameError> {
        if frame.flags & FLAG_TAGGED == 0 {
            if self.integrity == Integrity::Mac {
                return Err(FrameError::Integrity(format!(
                    "frame of request {} carries no integrity tag, and this side requires integrity = mac",
                    frame.request_id
                )));
            }
            return Ok(());
        }
        let mut tag = [0u8; TAG_BYTES];
        let ms = self.tag_timeout.as_millis() as u64;
        match tokio::time::timeout(self.tag_timeout, reader.read_exact(&mut tag)).await {
            Err(_) => return Err(FrameError::FrameTimeout { ms }),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
            Ok(Err(e)) => return Err(FrameError::Io(e)),
            Ok(Ok(_)) => {}
        }
        self.open
            .open(frame.request_id, &frame.body, &frame.data, &tag)
            .map_err(|e| FrameError::Integrity(e.to_string()))
    }
}

/// Writes a frame through `sealer`, or as a plain frame on an unauthenticated connection.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    sealer: Option<&mut Sealer>,
    writer: &mut W,
    request_id: u64,
    body: &[u8],
    data: &[u8],
) -> Result<(), FrameError> {
    match sealer {
        Some(sealer) => sealer.write_frame(writer, request_id, body, data).await,
        None => flotilla_proto::write_frame(writer, request_id, body, data).await,
    }
}

/// Checks `frame`'s tag through `opener`; an unauthenticated connection refuses tagged frames.
pub async fn check_frame<R: AsyncRead + Unpin>(
    opener: Option<&mut Opener>,
    reader: &mut R,
    frame: &Frame,
) -> Result<(), FrameError> {
    match opener {
        Some(opener) => opener.check(reader, frame).await,
        None if frame.flags & FLAG_TAGGED != 0 => {
            Err(FrameError::Integrity("tagged frame on a connection without a handshake".into()))
        }
        None => Ok(()),
    }
}

/// One side's half of a connection after the handshake.
pub struct Secured {
    pub peer: Peer,
    pub sealer: Sealer,
    pub opener: Opener,
}

/// Bounds of the handshake and of reading a tag after its frame.
#[derive(Clone, Copy, Debug)]
pub struct AuthBounds {
    pub integrity: Integrity,
    pub handshake_timeout: Duration,
    pub tag_timeout: Duration,
}

impl Default for AuthBounds {
    fn default() -> Self {
        AuthBounds {
            integrity: Integrity::Mac,
            handshake_timeout: Duration::from_secs(10),
            tag_timeout: Duration::from_secs(30),
        }
    }
}

fn secured(established: crate::Established, bounds: AuthBounds) -> Secured {
    let keys = established.keys;
    Secured {
        peer: established.peer,
        sealer: Sealer { seal: keys.seal, integrity: bounds.integrity },
        opener: Opener { open: keys.open, integrity: bounds.integrity, tag_timeout: bounds.tag_timeout },
    }
}

/// What a connecting side (client, or I/O server towards the metadata service) needs.
#[derive(Clone)]
pub struct ClientAuth {
    pub credential: Arc<Credential>,
    pub bounds: AuthBounds,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("name", &self.credential.certificate().name)
            .field("bounds", &self.bounds)
            .finish()
    }
}

impl ClientAuth {
    /// Runs the initiator's handshake; the peer must hold a server credential.
    pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
    ) -> Result<Secured, AuthError> {
        let established = initiate(stream, &self.credential, self.bounds.handshake_timeout).await?;
        Ok(secured(established, self.bounds))
    }
}

/// What an accepting service needs: its credential, the roles it admits, and a count of
/// the handshakes that failed.
pub struct Acceptor {
    pub credential: Arc<Credential>,
    pub allowed: Vec<Role>,
    pub bounds: AuthBounds,
    failures: AtomicU64,
}

impl Acceptor {
    pub fn new(credential: Arc<Credential>, allowed: Vec<Role>, bounds: AuthBounds) -> Acceptor {
        Acceptor { credential, allowed, bounds, failures: AtomicU64::new(0) }
    }

    /// Runs the responder's handshake within the handshake timeout. A failure is logged
    /// with the peer address and counted; the caller closes the connection.
    pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        peer_addr: Option<SocketAddr>,
    ) -> Option<Secured> {
        let outcome = respond(stream, &self.credential, &self.allowed, self.bounds.handshake_timeout).await;
        match outcome {
            Ok(established) => {
                tracing::debug!(?peer_addr, peer = %established.peer.name, "authenticated");
                Some(secured(established, self.bounds))
            }
            Err(error) => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(?peer_addr, %error, failures, "refusing connection: authentication failed");
                None
            }
        }
    }

    /// Handshakes that failed since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}
