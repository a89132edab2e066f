//! Frames on an authenticated connection, and the two ends of the handshake as a
//! connection's reader and writer use them.
//!
//! A frame sent with `integrity = mac` has the header flag `FLAG_TAGGED` set and is
//! followed by the 32-byte tag of [`crate::tag`]; the lengths in its header do not count
//! the tag. A receiver checks the tag of every tagged frame, and with `integrity = mac`
//! refuses frames without one. Any failure breaks the connection: its byte stream can no
//! longer be trusted.
//!
//! A frame sent with `integrity = encrypt` has the flag `FLAG_ENCRYPTED`, an encrypted
//! payload and a 16-byte AEAD tag after it ([`crate::crypt`]). The sender copies body and
//! data once into a buffer of its own (reused from frame to frame) and encrypts that copy,
//! since it only borrows them; the receiver's reader decrypts in place in the frame's own
//! buffer ([`Opener`] is the reader's [`PayloadOpener`]). The level a connection uses is
//! the stronger of the two sides' settings, agreed in the handshake.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::{
    Frame, FrameError, FrameHeader, PayloadCrc, PayloadOpener, FLAG_ENCRYPTED, FLAG_TAGGED,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::crypt::{FrameDecrypt, FrameEncrypt};
use crate::handshake::{initiate_with, respond_with, Peer};
pub use crate::integrity::Integrity;
use crate::tag::{FrameOpen, FrameSeal, TagHasher, TAG_BYTES};
use crate::{AuthError, Credential, Role};

/// Adds tags to outgoing frames, or encrypts them.
pub struct Sealer {
    seal: FrameSeal,
    integrity: Integrity,
    encrypt: Option<FrameEncrypt>,
    /// The copy of body and data an encrypted frame is encrypted in (reused).
    scratch: Vec<u8>,
}

impl Sealer {
    /// The level this side's frames are sent with (agreed in the handshake).
    pub fn integrity(&self) -> Integrity {
        self.integrity
    }

    /// Copies body and data into the scratch buffer and encrypts them there; the header
    /// and AEAD tag to send with them.
    fn encrypt(
        &mut self,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> Result<(FrameHeader, [u8; flotilla_proto::AEAD_TAG_BYTES]), FrameError> {
        let encrypt =
            self.encrypt.as_mut().ok_or_else(|| FrameError::Integrity("no encryption keys".into()))?;
        let body_bytes = u32::try_from(body.len())
            .map_err(|_| FrameError::TooLarge { bytes: body.len() as u64, limit: u32::MAX })?;
        self.scratch.clear();
        self.scratch.reserve(body.len() + data.len());
        self.scratch.extend_from_slice(body);
        self.scratch.extend_from_slice(data);
        encrypt
            .seal(request_id, body_bytes, &mut self.scratch)
            .map_err(|e| FrameError::Integrity(e.to_string()))
    }

    /// The header of the next frame and its tag (with `integrity = mac`).
    fn next(
        &mut self,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> Result<(FrameHeader, Option<[u8; TAG_BYTES]>), FrameError> {
        match self.integrity {
            Integrity::Mac => {
                let header =
                    FrameHeader::for_protected_payload(request_id, FLAG_TAGGED, body.len(), data.len())?;
                Ok((header, Some(self.seal.seal(request_id, body, data))))
            }
            // Encrypted frames are written by `encrypt`, never through here.
            Integrity::None | Integrity::Encrypt => {
                Ok((FrameHeader::for_payload(request_id, body, data)?, None))
            }
        }
    }

    /// The header and tag of one frame, for a writer that sends the body and data it holds
    /// in place with one vectored write (no copy into a write buffer). Not for encrypted
    /// frames (their payload is a new ciphertext): `Integrity` error; use `write_frame`.
    pub fn seal_parts(
        &mut self,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> Result<FrameParts, FrameError> {
        if self.integrity == Integrity::Encrypt {
            return Err(FrameError::Integrity("an encrypted frame is written whole, not in parts".into()));
        }
        let (header, tag) = self.next(request_id, body, data)?;
        Ok(FrameParts { header: header.encode(), tag })
    }

    /// The bytes of one frame and its tag, for tools and tests that write raw bytes.
    pub fn seal_frame(&mut self, request_id: u64, body: &[u8], data: &[u8]) -> Result<Vec<u8>, FrameError> {
        if self.integrity == Integrity::Encrypt {
            let (header, tag) = self.encrypt(request_id, body, data)?;
            let mut out = header.encode().to_vec();
            out.extend_from_slice(&self.scratch);
            out.extend_from_slice(&tag);
            return Ok(out);
        }
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
        if self.integrity == Integrity::Encrypt {
            let (header, tag) = self.encrypt(request_id, body, data)?;
            writer.write_all(&header.encode()).await?;
            writer.write_all(&self.scratch).await?;
            writer.write_all(&tag).await?;
            return Ok(());
        }
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

/// What goes before and after a frame's body and data on the wire: its header, and its
/// tag with `integrity = mac` ([`Sealer::seal_parts`]).
#[derive(Clone, Copy, Debug)]
pub struct FrameParts {
    pub header: [u8; flotilla_proto::HEADER_BYTES],
    pub tag: Option<[u8; TAG_BYTES]>,
}

/// Checks the tags of incoming frames, and decrypts encrypted ones (as the reader's
/// [`PayloadOpener`]: pass it to `read_frame_opened` / `read_frame_bounded_opened`).
pub struct Opener {
    open: FrameOpen,
    integrity: Integrity,
    tag_timeout: Duration,
    decrypt: Option<FrameDecrypt>,
    /// Frames decrypted by `open_payload` and not yet passed through `check`.
    decrypted_unchecked: u64,
}

impl PayloadOpener for Opener {
    fn open_payload(
        &mut self,
        header: &FrameHeader,
        payload: &mut [u8],
        trailer: &[u8],
    ) -> Result<(), FrameError> {
        let Some(decrypt) = self.decrypt.as_mut() else {
            return Err(FrameError::Integrity(format!(
                "encrypted frame of request {}, but this connection agreed on integrity = {}",
                header.request_id, self.integrity
            )));
        };
        decrypt.open(header, payload, trailer).map_err(|e| FrameError::Integrity(e.to_string()))?;
        self.decrypted_unchecked += 1;
        Ok(())
    }
}

impl Opener {
    /// The level this side requires of incoming frames (agreed in the handshake).
    pub fn integrity(&self) -> Integrity {
        self.integrity
    }

    /// Reads and checks the tag that follows `frame` (read by `read_frame*` from the same
    /// reader); refuses an untagged frame when this side requires tags, and an unencrypted
    /// one (or one the reader did not decrypt through this opener) when it requires
    /// encryption.
    pub async fn check<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        frame: &Frame,
    ) -> Result<(), FrameError> {
        if self.integrity == Integrity::Encrypt || frame.flags & FLAG_ENCRYPTED != 0 {
            return self.check_decrypted(frame);
        }
        if frame.flags & FLAG_TAGGED == 0 {
            if self.integrity == Integrity::Mac {
                return Err(FrameError::Integrity(format!(
                    "frame of request {} carries no integrity tag, and this side requires integrity = mac",
                    frame.request_id
                )));
            }
            return Ok(());
        }
        let tag = self.read_tag(reader).await?;
        self.open
            .open(frame.request_id, &frame.body, &frame.data, &tag)
            .map_err(|e| FrameError::Integrity(e.to_string()))
    }

    /// Reads the tag after a frame's payload, within `tag_timeout`.
    async fn read_tag<R: AsyncRead + Unpin>(&self, reader: &mut R) -> Result<[u8; TAG_BYTES], FrameError> {
        let mut tag = [0u8; TAG_BYTES];
        let ms = self.tag_timeout.as_millis() as u64;
        match tokio::time::timeout(self.tag_timeout, reader.read_exact(&mut tag)).await {
            Err(_) => Err(FrameError::FrameTimeout { ms }),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Closed),
            Ok(Err(e)) => Err(FrameError::Io(e)),
            Ok(Ok(_)) => Ok(tag),
        }
    }

    /// How the payload of `header` is checked as it streams in, by the same rules as
    /// [`Opener::check`]: `None` for a frame that must be read whole (encrypted, or on a
    /// connection that requires encryption: `check` refuses or opens it).
    fn stream_check(&self, header: &FrameHeader) -> Result<Option<PayloadCheck>, FrameError> {
        if self.integrity == Integrity::Encrypt || header.flags & FLAG_ENCRYPTED != 0 {
            return Ok(None);
        }
        if header.flags & FLAG_TAGGED != 0 {
            let (request_id, body_bytes, data_bytes) =
                (header.request_id, header.body_bytes, header.data_bytes);
            return Ok(Some(PayloadCheck::Tag(Box::new(
                self.open.start(request_id, body_bytes, data_bytes),
            ))));
        }
        if self.integrity == Integrity::Mac {
            return Err(FrameError::Integrity(format!(
                "frame of request {} carries no integrity tag, and this side requires integrity = mac",
                header.request_id
            )));
        }
        Ok(Some(PayloadCheck::Crc(PayloadCrc::new(header)?)))
    }

    /// An encrypted frame must have been decrypted by this opener as the reader read it.
    fn check_decrypted(&mut self, frame: &Frame) -> Result<(), FrameError> {
        let request_id = frame.request_id;
        if frame.flags & FLAG_ENCRYPTED == 0 {
            return Err(FrameError::Integrity(format!(
                "frame of request {request_id} is not encrypted, and this connection requires integrity = encrypt"
            )));
        }
        if self.decrypted_unchecked == 0 {
            return Err(FrameError::Integrity(format!(
                "encrypted frame of request {request_id} was not decrypted by this connection's reader"
            )));
        }
        self.decrypted_unchecked -= 1;
        Ok(())
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
        None if frame.flags & (FLAG_TAGGED | FLAG_ENCRYPTED) != 0 => {
            Err(FrameError::Integrity("tagged or encrypted frame on a connection without a handshake".into()))
        }
        None => Ok(()),
    }
}

/// The check of one frame's payload computed while the payload streams in, so that its data
/// can be read straight to where it belongs (flotilla-rpc's scatter reads): the keyed tag,
/// or the CRC32C of a frame sent without one. Every payload byte goes through
/// [`PayloadCheck::update`], in wire order, before [`finish_stream_check`] says whether the
/// frame may be used.
pub enum PayloadCheck {
    /// Boxed: a BLAKE3 hasher is ~2 KB, the CRC a few words.
    Tag(Box<TagHasher>),
    Crc(PayloadCrc),
}

impl PayloadCheck {
    /// Adds the next payload bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            PayloadCheck::Tag(hasher) => hasher.update(bytes),
            PayloadCheck::Crc(crc) => crc.update(bytes),
        }
    }
}

/// How the payload of `header` is checked as it streams in through `opener` (a connection
/// without a handshake: CRC32C only, and tagged or encrypted frames are refused); `None`:
/// the frame must be read whole with `read_frame_payload` and checked with [`check_frame`].
pub fn stream_check(
    opener: Option<&Opener>,
    header: &FrameHeader,
) -> Result<Option<PayloadCheck>, FrameError> {
    match opener {
        Some(opener) => opener.stream_check(header),
        None if header.flags & (FLAG_TAGGED | FLAG_ENCRYPTED) != 0 => {
            Err(FrameError::Integrity("tagged or encrypted frame on a connection without a handshake".into()))
        }
        None => Ok(Some(PayloadCheck::Crc(PayloadCrc::new(header)?))),
    }
}

/// Ends a streamed check once every payload byte went through it: reads and checks the tag
/// that follows the payload (within the opener's tag timeout), or compares the CRC32C.
pub async fn finish_stream_check<R: AsyncRead + Unpin>(
    opener: Option<&mut Opener>,
    reader: &mut R,
    check: PayloadCheck,
) -> Result<(), FrameError> {
    match (check, opener) {
        (PayloadCheck::Crc(crc), _) => crc.finish(),
        (PayloadCheck::Tag(hasher), Some(opener)) => {
            let tag = opener.read_tag(reader).await?;
            opener.open.finish(*hasher, &tag).map_err(|e| FrameError::Integrity(e.to_string()))
        }
        (PayloadCheck::Tag(_), None) => {
            Err(FrameError::Integrity("tagged frame on a connection without a handshake".into()))
        }
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
    let (keys, integrity) = (established.keys, established.integrity);
    let (encrypt, decrypt) = match established.crypt {
        Some(crypt) => (Some(crypt.seal), Some(crypt.open)),
        None => (None, None),
    };
    if integrity != bounds.integrity {
        tracing::debug!(asked = %bounds.integrity, agreed = %integrity, peer = %established.peer.name, "the peer asked for a stronger integrity level");
    }
    Secured {
        peer: established.peer,
        sealer: Sealer { seal: keys.seal, integrity, encrypt, scratch: Vec::new() },
        opener: Opener {
            open: keys.open,
            integrity,
            tag_timeout: bounds.tag_timeout,
            decrypt,
            decrypted_unchecked: 0,
        },
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
    /// Runs the initiator's handshake; the peer must hold a server credential (a meta one
    /// when this side holds a meta credential: `responder_roles`).
    pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
    ) -> Result<Secured, AuthError> {
        let (integrity, timeout) = (self.bounds.integrity, self.bounds.handshake_timeout);
        let established = initiate_with(stream, &self.credential, integrity, timeout).await?;
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
    failure_log: LogGate,
}

/// At most one warning about failed handshakes per this long (a flood of bad peers must
/// not fill the log); the others are counted and logged at debug.
pub const FAILURE_LOG_INTERVAL_MS: u64 = 1000;

/// Lets one log line through per interval and counts those held back (lock-free).
struct LogGate {
    started: std::time::Instant,
    interval_ms: u64,
    /// Milliseconds since `started` at the last line let through, plus one (0: none yet).
    last_ms_plus_one: AtomicU64,
    held_back: AtomicU64,
}

impl LogGate {
    fn new(interval_ms: u64) -> LogGate {
        LogGate {
            started: std::time::Instant::now(),
            interval_ms,
            last_ms_plus_one: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may go out now.
    fn pass(&self) -> Option<u64> {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.pass_at(now_ms)
    }

    fn pass_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms_plus_one.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last - 1) >= self.interval_ms;
        let swapped = due
            && self
                .last_ms_plus_one
                .compare_exchange(last, now_ms + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if swapped {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Acceptor {
    pub fn new(credential: Arc<Credential>, allowed: Vec<Role>, bounds: AuthBounds) -> Acceptor {
        Acceptor {
            credential,
            allowed,
            bounds,
            failures: AtomicU64::new(0),
            failure_log: LogGate::new(FAILURE_LOG_INTERVAL_MS),
        }
    }

    /// Runs the responder's handshake within the handshake timeout. A failure is logged
    /// with the peer address and counted; the caller closes the connection.
    pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        peer_addr: Option<SocketAddr>,
    ) -> Option<Secured> {
        let (integrity, timeout) = (self.bounds.integrity, self.bounds.handshake_timeout);
        let outcome = respond_with(stream, &self.credential, &self.allowed, integrity, timeout).await;
        match outcome {
            Ok(established) => {
                tracing::debug!(?peer_addr, peer = %established.peer.name, "authenticated");
                Some(secured(established, self.bounds))
            }
            Err(error) => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                match self.failure_log.pass() {
                    Some(held_back) => tracing::warn!(
                        ?peer_addr,
                        %error,
                        failures,
                        held_back,
                        "refusing connection: authentication failed (one line a second at most; \
                         held_back: failures since the last line)"
                    ),
                    None => {
                        tracing::debug!(?peer_addr, %error, failures, "refusing connection: authentication failed")
                    }
                }
                None
            }
        }
    }

    /// Handshakes that failed since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::LogGate;

    #[test]
    fn one_failure_line_a_second_goes_out_and_the_others_are_counted() {
        let gate = LogGate::new(1000);
        assert_eq!(gate.pass_at(0), Some(0), "the first line goes out");
        for now_ms in [1, 10, 999] {
            assert_eq!(gate.pass_at(now_ms), None, "a line {now_ms} ms after the last was let through");
        }
        assert_eq!(gate.pass_at(1000), Some(3), "a line a second later carries the three held back");
        assert_eq!(gate.pass_at(1500), None);
        assert_eq!(gate.pass_at(5000), Some(1));
    }
}
