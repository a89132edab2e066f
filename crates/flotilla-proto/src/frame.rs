//! Frames: the unit of transfer on every Flotilla connection.
//!
//! ```text
//! offset size field
//!  0     4    magic            b"FLOT"
//!  4     2    version          u16 LE, 2
//!  6     2    flags            u16 LE, bit 0 = FLAG_TAGGED, bit 1 = FLAG_ENCRYPTED (other bits 0)
//!  8     8    request_id       u64 LE, echoed by the reply
//! 16     4    body_bytes       u32 LE
//! 20     4    data_bytes       u32 LE
//! 24     4    payload_crc32c   CRC32C of body then data; 0 and not checked when
//!                                 FLAG_TAGGED or FLAG_ENCRYPTED is set (the keyed
//!                                 tag or the AEAD tag covers the payload)
//! 28     4    header_crc32c    CRC32C of bytes 0..28
//! 32     body_bytes + data_bytes
//! ..     32   integrity tag    only when FLAG_TAGGED is set (see flotilla-auth `wire`)
//! ..     16   AEAD tag         only when FLAG_ENCRYPTED is set (see flotilla-auth `crypt`)
//! ```
//!
//! With FLAG_ENCRYPTED, body and data are ciphertext and `payload_crc32c` is 0. The reader reads the AEAD tag with the payload (same deadline, same
//! memory reservation) and hands both to a [`PayloadOpener`], which decrypts the payload
//! in place before it is split into body and data.

use crate::budget::Window;
pub use crate::budget::{FrameBudget, ProgressRule, Reservation};
use crate::buffers::{BufferPool, POOLED_BYTES_MIN};
pub use crate::frame_error::FrameError;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"FLOT";
/// The only protocol version this build speaks.
pub const VERSION: u16 = 2;
/// Header flag: a 32-byte integrity tag follows the payload (not counted in its lengths).
pub const FLAG_TAGGED: u16 = 1;
/// Header flag: body and data are encrypted and a 16-byte AEAD tag follows them (not
/// counted in their lengths).
pub const FLAG_ENCRYPTED: u16 = 2;
/// Length of the AEAD tag after the payload of a frame with [`FLAG_ENCRYPTED`].
pub const AEAD_TAG_BYTES: usize = 16;
/// Length of the fixed frame header.
pub const HEADER_BYTES: usize = 32;

/// Decrypts the payload of a frame with [`FLAG_ENCRYPTED`] in place (flotilla-auth's
/// `Opener`), between reading it and splitting it into body and data.
pub trait PayloadOpener: Send {
    /// Checks `trailer` (the AEAD tag) and decrypts `payload` (body then data) in place.
    fn open_payload(
        &mut self,
        header: &FrameHeader,
        payload: &mut [u8],
        trailer: &[u8],
    ) -> Result<(), FrameError>;
}

impl FrameError {
    /// Whether the byte stream can no longer be trusted to be at a frame boundary.
    pub fn breaks_stream(&self) -> bool {
        !matches!(
            self,
            FrameError::Decode { .. } | FrameError::Encode { .. } | FrameError::PayloadChecksum { .. }
        )
    }
}

/// The decoded fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u16,
    pub flags: u16,
    pub request_id: u64,
    pub body_bytes: u32,
    pub data_bytes: u32,
    pub payload_crc32c: u32,
}

/// A received frame: its request id, the encoded message body and the raw data.
#[derive(Clone, Debug)]
pub struct Frame {
    pub request_id: u64,
    /// The header's flags ([`FLAG_TAGGED`]).
    pub flags: u16,
    pub body: Bytes,
    pub data: Bytes,
}

impl FrameHeader {
    /// Builds the header of a frame carrying `body` and `data`.
    pub fn for_payload(request_id: u64, body: &[u8], data: &[u8]) -> Result<FrameHeader, FrameError> {
        let (body_bytes, data_bytes) = payload_lengths(body.len(), data.len())?;
        let payload_crc32c = crc32c::crc32c_append(crc32c::crc32c(body), data);
        Ok(FrameHeader { version: VERSION, flags: 0, request_id, body_bytes, data_bytes, payload_crc32c })
    }

    /// Builds the header of a frame whose payload a keyed tag (`FLAG_TAGGED`) or an AEAD
    /// tag (`FLAG_ENCRYPTED`, in `flags`) will cover: the tag covers every byte the CRC32C
    /// would, so no payload checksum is computed (one pass over the data fewer on each side).
    pub fn for_protected_payload(
        request_id: u64,
        flags: u16,
        body_len: usize,
        data_len: usize,
    ) -> Result<FrameHeader, FrameError> {
        debug_assert!(flags & (FLAG_TAGGED | FLAG_ENCRYPTED) != 0, "a protected frame names its protection");
        let (body_bytes, data_bytes) = payload_lengths(body_len, data_len)?;
        Ok(FrameHeader { version: VERSION, flags, request_id, body_bytes, data_bytes, payload_crc32c: 0 })
    }

    /// The 32 header bytes, checksum included.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&self.flags.to_le_bytes());
        out[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.body_bytes.to_le_bytes());
        out[20..24].copy_from_slice(&self.data_bytes.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and checks a header: magic, header checksum, version and total length.
    pub fn decode(bytes: &[u8; HEADER_BYTES], frame_bytes_max: u32) -> Result<FrameHeader, FrameError> {
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != MAGIC {
            return Err(FrameError::BadMagic { found });
        }
        let stored = le_u32(bytes, 28);
        let computed = crc32c::crc32c(&bytes[0..28]);
        if stored != computed {
            return Err(FrameError::HeaderChecksum { computed, stored });
        }
        let header = FrameHeader {
            version: le_u16(bytes, 4),
            flags: le_u16(bytes, 6),
            request_id: le_u64(bytes, 8),
            body_bytes: le_u32(bytes, 16),
            data_bytes: le_u32(bytes, 20),
            payload_crc32c: le_u32(bytes, 24),
        };
        if header.version != VERSION {
            return Err(FrameError::UnsupportedVersion { found: header.version });
        }
        let total = header.frame_bytes();
        if total > u64::from(frame_bytes_max) {
            return Err(FrameError::TooLarge { bytes: total, limit: frame_bytes_max });
        }
        Ok(header)
    }

    /// Length of the whole frame, header included.
    pub fn frame_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + u64::from(self.body_bytes) + u64::from(self.data_bytes)
    }

    /// Bytes that follow the payload and are read with it (the AEAD tag of an encrypted frame).
    pub fn trailer_bytes(&self) -> usize {
        if self.flags & FLAG_ENCRYPTED != 0 {
            AEAD_TAG_BYTES
        } else {
            0
        }
    }

    /// Checks the payload CRC32C, except on a tagged or encrypted frame: there the reader
    /// checks the tag instead (the `PayloadOpener` the AEAD tag as it reads the payload, the
    /// caller the keyed tag with flotilla-auth `Opener::check`) before anything decodes it.
    fn check_payload(&self, body: &[u8], data: &[u8]) -> Result<(), FrameError> {
        if self.flags & (FLAG_TAGGED | FLAG_ENCRYPTED) != 0 {
            return Ok(());
        }
        let computed = crc32c::crc32c_append(crc32c::crc32c(body), data);
        if computed != self.payload_crc32c {
            let request_id = self.request_id;
            return Err(FrameError::PayloadChecksum { request_id, computed, stored: self.payload_crc32c });
        }
        Ok(())
    }
}

/// Body and data lengths as the header's u32 fields.
fn payload_lengths(body_len: usize, data_len: usize) -> Result<(u32, u32), FrameError> {
    let too_large = |bytes: usize| FrameError::TooLarge { bytes: bytes as u64, limit: u32::MAX };
    let body_bytes = u32::try_from(body_len).map_err(|_| too_large(body_len))?;
    let data_bytes = u32::try_from(data_len).map_err(|_| too_large(data_len))?;
    Ok((body_bytes, data_bytes))
}

fn le_u16(bytes: &[u8; HEADER_BYTES], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn le_u32(bytes: &[u8; HEADER_BYTES], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn le_u64(bytes: &[u8; HEADER_BYTES], at: usize) -> u64 {
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(out)
}

/// Decodes one frame from the front of `input`, returning it and the bytes it used.
/// This is the pure decoder the fuzz target drives.
pub fn decode_frame(input: &[u8], frame_bytes_max: u32) -> Result<(Frame, usize), FrameError> {
    let header_bytes: &[u8; HEADER_BYTES] = input
        .get(..HEADER_BYTES)
        .and_then(|h| h.try_into().ok())
        .ok_or(FrameError::Truncated { needed: HEADER_BYTES as u64, available: input.len() as u64 })?;
    let header = FrameHeader::decode(header_bytes, frame_bytes_max)?;
    let total = header.frame_bytes() as usize;
    let payload = input
        .get(HEADER_BYTES..total)
        .ok_or(FrameError::Truncated { needed: total as u64, available: input.len() as u64 })?;
    let (body, data) = payload.split_at(header.body_bytes as usize);
    header.check_payload(body, data)?;
    let frame = Frame {
        request_id: header.request_id,
        flags: header.flags,
        body: Bytes::copy_from_slice(body),
        data: Bytes::copy_from_slice(data),
    };
    Ok((frame, total))
}

/// Reads one frame. `buffer` is reused between calls so that steady traffic does not
/// allocate: a frame's bytes are split off it and its capacity is reclaimed once the
/// previous frame's `Bytes` are dropped. The payload buffer grows as bytes arrive (never
/// by more than [`GROWTH_BYTES_MAX`] ahead of them) and is never zero-filled. (With a
/// budget's pool, `read_frame_bounded_opened` reads a large payload into one buffer of its
/// whole length: an idle pooled one, already resident, or a fresh mapping whose pages
/// become resident only as the bytes arrive — so resident memory still follows the bytes.)
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    frame_bytes_max: u32,
) -> Result<Frame, FrameError> {
    read_frame_opened(reader, buffer, frame_bytes_max, None).await
}

/// [`read_frame`] on a connection whose encrypted frames `opener` decrypts.
pub async fn read_frame_opened<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    frame_bytes_max: u32,
    opener: Option<&mut dyn PayloadOpener>,
) -> Result<Frame, FrameError> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    read_exact_or_closed(reader, &mut header_bytes).await?;
    let header = FrameHeader::decode(&header_bytes, frame_bytes_max)?;
    read_payload(reader, buffer, &header, opener).await
}

/// Reads and checks the next frame header, for a reader that places the payload itself
/// ([`read_frame_body`], then the data wherever the reader wants it).
pub async fn read_frame_header<R: AsyncRead + Unpin>(
    reader: &mut R,
    frame_bytes_max: u32,
) -> Result<FrameHeader, FrameError> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    read_exact_or_closed(reader, &mut header_bytes).await?;
    FrameHeader::decode(&header_bytes, frame_bytes_max)
}

/// Reads the rest of the frame whose header `header` was just read by
/// [`read_frame_header`], as [`read_frame_opened`] would.
pub async fn read_frame_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    header: &FrameHeader,
    opener: Option<&mut dyn PayloadOpener>,
) -> Result<Frame, FrameError> {
    read_payload(reader, buffer, header, opener).await
}

/// Reads only the body of the frame whose header was just read (its data section is left
/// in the stream for the caller); the body is not checked here: the caller feeds it and the
/// data to the frame's [`PayloadCrc`] or keyed tag.
pub async fn read_frame_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    header: &FrameHeader,
) -> Result<Bytes, FrameError> {
    debug_assert!(header.flags & FLAG_ENCRYPTED == 0, "an encrypted body cannot be read alone");
    buffer.clear();
    fill_payload(reader, buffer, header.body_bytes as usize).await?;
    Ok(buffer.split_to(header.body_bytes as usize).freeze())
}

/// The payload CRC32C of an unprotected frame computed as its bytes stream in (body first,
/// then data, in wire order), for readers that never hold the payload in one buffer.
#[derive(Clone, Copy, Debug)]
pub struct PayloadCrc {
    request_id: u64,
    stored: u32,
    computed: u32,
    bytes_expected: u64,
    bytes_seen: u64,
}

impl PayloadCrc {
    /// Starts the check of `header`'s payload; a tagged or encrypted frame has no CRC32C.
    pub fn new(header: &FrameHeader) -> Result<PayloadCrc, FrameError> {
        if header.flags & (FLAG_TAGGED | FLAG_ENCRYPTED) != 0 {
            return Err(FrameError::Integrity(format!(
                "frame of request {} is protected by a tag, not a CRC32C",
                header.request_id
            )));
        }
        let bytes_expected = u64::from(header.body_bytes) + u64::from(header.data_bytes);
        let (request_id, stored) = (header.request_id, header.payload_crc32c);
        Ok(PayloadCrc { request_id, stored, computed: 0, bytes_expected, bytes_seen: 0 })
    }

    /// Adds the next payload bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.computed = crc32c::crc32c_append(self.computed, bytes);
        self.bytes_seen += bytes.len() as u64;
    }

    /// Compares with the header's checksum once every payload byte was added.
    pub fn finish(self) -> Result<(), FrameError> {
        if self.bytes_seen != self.bytes_expected {
            return Err(FrameError::Truncated { needed: self.bytes_expected, available: self.bytes_seen });
        }
        if self.computed != self.stored {
            let (request_id, computed, stored) = (self.request_id, self.computed, self.stored);
            return Err(FrameError::PayloadChecksum { request_id, computed, stored });
        }
        Ok(())
    }
}

/// Most bytes the payload buffer grows by ahead of the bytes that have arrived.
pub const GROWTH_BYTES_MAX: usize = 1 << 20;

/// Bounds on reading frames from an untrusted peer.
#[derive(Clone, Copy, Debug)]
pub struct ReadBounds {
    pub frame_bytes_max: u32,
    /// How long a connection may stay silent between frames.
    pub idle_timeout: Duration,
    /// How long a frame may take from its first byte to its last (time spent waiting for
    /// the memory budget not counted).
    pub frame_timeout: Duration,
    /// How slowly a frame's bytes may arrive.
    pub progress: ProgressRule,
}

/// Bytes a connection reads of a frame before any of the budget is reserved for them: its
/// own small share, so that reserving follows bytes that arrived, not bytes claimed.
pub const UNRESERVED_BYTES_MAX: usize = 64 << 10;
/// How far the reservation runs ahead of the bytes that arrived (one grow per this many).
const RESERVE_AHEAD_BYTES: usize = 256 << 10;

/// Reads one frame from an untrusted peer. Waits for its first byte as long as `busy()`
/// says requests are in flight, else at most `idle_timeout`. From that byte on, the frame
/// must arrive within `frame_timeout` and at `bounds.progress` (at least `bytes_min` bytes
/// in every `interval`). Its memory is reserved from `budget` as its bytes arrive (at most
/// [`UNRESERVED_BYTES_MAX`] read ahead of the reservation, which runs at most 256 KiB ahead
/// of the bytes), never for what the header merely claims: a peer that stalls holds what it
/// sent, for at most one progress interval. Time spent waiting for the budget counts against
/// neither timeout; a frame that waited `budget.overdraft_wait` may grow in the overdraft
/// lane. The reservation is returned with the frame; hold it until the reply is sent.
pub async fn read_frame_bounded<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    bounds: ReadBounds,
    budget: &FrameBudget,
    busy: &(dyn Fn() -> bool + Sync),
) -> Result<(Frame, Reservation), FrameError> {
    read_frame_bounded_opened(reader, buffer, bounds, budget, busy, None).await
}

/// [`read_frame_bounded`] on a connection whose encrypted frames `opener` decrypts; the
/// AEAD tag after the payload is read within the same deadline and reservation.
pub async fn read_frame_bounded_opened<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    bounds: ReadBounds,
    budget: &FrameBudget,
    busy: &(dyn Fn() -> bool + Sync),
    opener: Option<&mut dyn PayloadOpener>,
) -> Result<(Frame, Reservation), FrameError> {
    let mut header_bytes = [0u8; HEADER_BYTES];
    wait_first_byte(reader, &mut header_bytes[..1], bounds.idle_timeout, busy).await?;
    let mut clock = FrameClock::start(&bounds);
    clock.read_header(reader, &mut header_bytes[1..]).await?;
    let header = FrameHeader::decode(&header_bytes, bounds.frame_bytes_max)?;
    let payload_bytes = header.body_bytes as usize + header.data_bytes as usize + header.trailer_bytes();
    let mut held = budget.empty()?;
    let pool =
        budget.pool.as_ref().filter(|_| header.trailer_bytes() == 0 && payload_bytes >= POOLED_BYTES_MIN);
    if let Some(pool) = pool {
        let mut pooled = pool.take(payload_bytes);
        fill_reserving(reader, &mut pooled, payload_bytes, (budget, &mut held), &mut clock).await?;
        budget.grow(&mut held, budget.units(payload_bytes as u64)).await?;
        return Ok((split_pooled(pool, pooled, &header)?, held));
    }
    buffer.clear();
    fill_reserving(reader, buffer, payload_bytes, (budget, &mut held), &mut clock).await?;
    budget.grow(&mut held, budget.units(payload_bytes as u64)).await?;
    Ok((split_payload(buffer, &header, opener)?, held))
}

/// A frame's deadline (pushed back by the time it waited for memory) and progress window.
struct FrameClock {
    deadline: tokio::time::Instant,
    frame_timeout: Duration,
    window: Window,
}

impl FrameClock {
    fn start(bounds: &ReadBounds) -> FrameClock {
        let deadline = tokio::time::Instant::now() + bounds.frame_timeout;
        FrameClock { deadline, frame_timeout: bounds.frame_timeout, window: Window::start(bounds.progress) }
    }

    /// The rest of the header, within the deadline and the first window.
    async fn read_header<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        rest: &mut [u8],
    ) -> Result<(), FrameError> {
        let until = self.deadline.min(self.window.end());
        match tokio::time::timeout_at(until, read_exact_or_closed(reader, rest)).await {
            Ok(read) => read,
            Err(_) => Err(self.expired()),
        }
    }

    /// One read, within the deadline and the current window.
    async fn read<F: std::future::Future<Output = std::io::Result<usize>>>(
        &mut self,
        read: F,
    ) -> Result<usize, FrameError> {
        let until = self.deadline.min(self.window.end());
        let got = tokio::time::timeout_at(until, read).await.map_err(|_| self.expired())??;
        self.window.record(got as u64);
        Ok(got)
    }

    fn expired(&self) -> FrameError {
        if tokio::time::Instant::now() >= self.deadline {
            FrameError::FrameTimeout { ms: self.frame_timeout.as_millis() as u64 }
        } else {
            self.window.stalled()
        }
    }

    /// The frame waited `waited` for memory: neither its deadline nor its window runs meanwhile.
    fn paused(&mut self, waited: Duration) {
        if !waited.is_zero() {
            self.deadline += waited;
            self.window = Window::start(self.window_rule());
        }
    }

    fn window_rule(&self) -> ProgressRule {
        self.window.rule()
    }
}

/// Reads until `buffer` holds `payload_bytes`, reserving from the budget as bytes arrive.
async fn fill_reserving<R: AsyncRead + Unpin, B: bytes::BufMut + BufferLen>(
    reader: &mut R,
    buffer: &mut B,
    payload_bytes: usize,
    (budget, held): (&FrameBudget, &mut Reservation),
    clock: &mut FrameClock,
) -> Result<(), FrameError> {
    let mut reserved_bytes = 0usize;
    while buffer.filled() < payload_bytes {
        let (filled, remaining) = (buffer.filled(), payload_bytes - buffer.filled());
        let limit = reserved_bytes.saturating_sub(filled).max(UNRESERVED_BYTES_MAX).min(remaining);
        buffer.make_room(limit.min(GROWTH_BYTES_MAX));
        let got = clock.read((&mut *reader).take(limit as u64).read_buf(buffer)).await?;
        if got == 0 {
            let error = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "frame payload cut short");
            return Err(FrameError::Io(error));
        }
        let filled = buffer.filled();
        if filled < payload_bytes && filled + UNRESERVED_BYTES_MAX > reserved_bytes {
            reserved_bytes = (filled + RESERVE_AHEAD_BYTES).min(payload_bytes);
            let waited = budget.grow(held, budget.units(reserved_bytes as u64)).await?;
            clock.paused(waited);
        }
    }
    Ok(())
}

/// What `fill_payload` needs of a buffer besides `BufMut`: its length and room to grow.
trait BufferLen {
    fn filled(&self) -> usize;
    fn make_room(&mut self, bytes: usize);
}

impl BufferLen for BytesMut {
    fn filled(&self) -> usize {
        self.len()
    }
    fn make_room(&mut self, bytes: usize) {
        self.reserve(bytes);
    }
}

impl BufferLen for Vec<u8> {
    fn filled(&self) -> usize {
        self.len()
    }
    fn make_room(&mut self, bytes: usize) {
        self.reserve(bytes);
    }
}

/// A complete unencrypted payload read into a pooled buffer, split into body and data that
/// share it (it goes back to `pool` when both are dropped); checked as `split_payload` does.
fn split_pooled(pool: &Arc<BufferPool>, payload: Vec<u8>, header: &FrameHeader) -> Result<Frame, FrameError> {
    let body_bytes = header.body_bytes as usize;
    assert_eq!(payload.len(), body_bytes + header.data_bytes as usize, "a whole payload");
    let whole = pool.into_bytes(payload);
    let (body, data) = (whole.slice(..body_bytes), whole.slice(body_bytes..));
    header.check_payload(&body, &data)?;
    Ok(Frame { request_id: header.request_id, flags: header.flags, body, data })
}

async fn wait_first_byte<R: AsyncRead + Unpin>(
    reader: &mut R,
    first: &mut [u8],
    idle_timeout: Duration,
    busy: &(dyn Fn() -> bool + Sync),
) -> Result<(), FrameError> {
    loop {
        // Reading one byte is cancel-safe: it either arrived or it did not.
        match tokio::time::timeout(idle_timeout, read_exact_or_closed(reader, first)).await {
            Ok(outcome) => return outcome,
            Err(_) if busy() => continue,
            Err(_) => return Err(FrameError::IdleTimeout { ms: idle_timeout.as_millis() as u64 }),
        }
    }
}

async fn read_exact_or_closed<R: AsyncRead + Unpin>(
    reader: &mut R,
    out: &mut [u8],
) -> Result<(), FrameError> {
    match reader.read_exact(out).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Closed),
        Err(e) => Err(FrameError::Io(e)),
    }
}

/// Reads the payload into `buffer`'s spare capacity, growing it as bytes arrive.
async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    header: &FrameHeader,
    opener: Option<&mut dyn PayloadOpener>,
) -> Result<Frame, FrameError> {
    buffer.clear();
    let payload_bytes = header.body_bytes as usize + header.data_bytes as usize + header.trailer_bytes();
    fill_payload(reader, buffer, payload_bytes).await?;
    split_payload(buffer, header, opener)
}

/// Reads until `buffer` holds `payload_bytes`; cancel-safe (what was read stays in `buffer`).
async fn fill_payload<R: AsyncRead + Unpin, B: bytes::BufMut + BufferLen>(
    reader: &mut R,
    buffer: &mut B,
    payload_bytes: usize,
) -> Result<(), FrameError> {
    while buffer.filled() < payload_bytes {
        let remaining = payload_bytes - buffer.filled();
        buffer.make_room(remaining.min(GROWTH_BYTES_MAX));
        let got = (&mut *reader).take(remaining as u64).read_buf(buffer).await?;
        if got == 0 {
            let error = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "frame payload cut short");
            return Err(FrameError::Io(error));
        }
    }
    Ok(())
}

/// Splits a complete payload off `buffer` into body and data and checks its checksum; an
/// encrypted payload carries no CRC32C (its AEAD tag covers it) and is checked and decrypted
/// in place by the opener first.
fn split_payload(
    buffer: &mut BytesMut,
    header: &FrameHeader,
    opener: Option<&mut dyn PayloadOpener>,
) -> Result<Frame, FrameError> {
    let mut payload = buffer.split_to(header.body_bytes as usize + header.data_bytes as usize);
    if header.flags & FLAG_ENCRYPTED != 0 {
        let trailer = buffer.split_to(header.trailer_bytes());
        let opener = opener.ok_or_else(|| {
            FrameError::Integrity(format!(
                "encrypted frame of request {} on a connection without encryption keys",
                header.request_id
            ))
        })?;
        opener.open_payload(header, &mut payload, &trailer)?;
    }
    let data = payload.split_off(header.body_bytes as usize);
    header.check_payload(&payload, &data)?;
    let (request_id, flags) = (header.request_id, header.flags);
    Ok(Frame { request_id, flags, body: payload.freeze(), data: data.freeze() })
}

/// Writes one frame (header, body, data). Small frames go out in one write.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    request_id: u64,
    body: &[u8],
    data: &[u8],
) -> Result<(), FrameError> {
    let header = FrameHeader::for_payload(request_id, body, data)?;
    writer.write_all(&header.encode()).await?;
    writer.write_all(body).await?;
    if !data.is_empty() {
        writer.write_all(data).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(request_id: u64, body: &[u8], data: &[u8]) -> Vec<u8> {
        let header = FrameHeader::for_payload(request_id, body, data).unwrap();
        let mut out = header.encode().to_vec();
        out.extend_from_slice(body);
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn round_trip() {
        let bytes = encode(7, b"body", b"data!");
        let (frame, used) = decode_frame(&bytes, 1 << 20).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(frame.request_id, 7);
        assert_eq!(&frame.body[..], b"body");
        assert_eq!(&frame.data[..], b"data!");
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let bytes = encode(1, b"hello", b"world");
        for bit in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_frame(&bad, 1 << 20).is_err(), "bit {bit} flip went unnoticed");
        }
    }

    #[test]
    fn oversize_frames_are_refused_before_reading() {
        let bytes = encode(1, &[0u8; 100], &[]);
        let error = decode_frame(&bytes, 64).unwrap_err();
        assert!(error.to_string().contains("frame_bytes_max"), "{error}");
    }

    #[test]
    fn other_versions_are_refused() {
        let mut header = FrameHeader::for_payload(1, b"", b"").unwrap();
        header.version = 9;
        let error = FrameHeader::decode(&header.encode(), 1 << 20).unwrap_err();
        assert!(matches!(error, FrameError::UnsupportedVersion { found: 9 }));
    }

    #[tokio::test]
    async fn async_round_trip_reuses_buffer() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 3, b"b", &[5u8; 1000]).await.unwrap();
        write_frame(&mut wire, 4, b"c", b"").await.unwrap();
        let mut reader = &wire[..];
        let mut buffer = BytesMut::new();
        let first = read_frame(&mut reader, &mut buffer, 1 << 20).await.unwrap();
        assert_eq!((first.request_id, first.data.len()), (3, 1000));
        let second = read_frame(&mut reader, &mut buffer, 1 << 20).await.unwrap();
        assert_eq!(second.request_id, 4);
        assert!(matches!(read_frame(&mut reader, &mut buffer, 1 << 20).await, Err(FrameError::Closed)));
    }

    /// A stand-in for flotilla-auth's opener: records what it was given, flips every
    /// payload byte, and refuses a trailer other than `b"T"` repeated.
    #[derive(Default)]
    struct Recorder {
        trailers: Vec<Vec<u8>>,
    }

    impl PayloadOpener for Recorder {
        fn open_payload(
            &mut self,
            _: &FrameHeader,
            payload: &mut [u8],
            trailer: &[u8],
        ) -> Result<(), FrameError> {
            self.trailers.push(trailer.to_vec());
            if trailer != [b'T'; AEAD_TAG_BYTES] {
                return Err(FrameError::Integrity("bad trailer".into()));
            }
            payload.iter_mut().for_each(|b| *b ^= 0xff);
            Ok(())
        }
    }

    /// An "encrypted" frame: flipped payload, checksum of the flipped bytes, then `trailer`.
    fn flipped_frame(request_id: u64, body: &[u8], data: &[u8], trailer: u8) -> Vec<u8> {
        let flip = |bytes: &[u8]| bytes.iter().map(|b| b ^ 0xff).collect::<Vec<u8>>();
        let (body, data) = (flip(body), flip(data));
        let header = FrameHeader {
            flags: FLAG_ENCRYPTED,
            ..FrameHeader::for_payload(request_id, &body, &data).unwrap()
        };
        let mut out = header.encode().to_vec();
        out.extend_from_slice(&body);
        out.extend_from_slice(&data);
        out.extend_from_slice(&[trailer; AEAD_TAG_BYTES]);
        out
    }

    #[tokio::test]
    async fn an_encrypted_frame_is_read_with_its_trailer_and_opened_in_place() {
        let mut wire = flipped_frame(3, b"body", &[9u8; 3000], b'T');
        wire.extend_from_slice(&flipped_frame(4, b"next", b"", b'T'));
        wire.extend_from_slice(&flipped_frame(5, b"bad", b"", b'X'));
        let (mut reader, mut buffer, mut opener) = (&wire[..], BytesMut::new(), Recorder::default());
        let budget = FrameBudget::new(1 << 20);
        let (frame, permit) = read_frame_bounded_opened(
            &mut reader,
            &mut buffer,
            bounds(),
            &budget,
            &|| false,
            Some(&mut opener),
        )
        .await
        .unwrap();
        assert_eq!((frame.request_id, &frame.body[..], &frame.data[..]), (3, &b"body"[..], &[9u8; 3000][..]));
        assert_eq!(permit.num_permits(), 3, "3020 bytes (tag included) hold 3 KiB");
        let frame = read_frame_opened(&mut reader, &mut buffer, 1 << 20, Some(&mut opener)).await.unwrap();
        assert_eq!((frame.request_id, &frame.body[..]), (4, &b"next"[..]));
        let error =
            read_frame_opened(&mut reader, &mut buffer, 1 << 20, Some(&mut opener)).await.unwrap_err();
        assert!(error.to_string().contains("bad trailer"), "{error}");
        assert_eq!(opener.trailers.len(), 3);
        // Without an opener, an encrypted frame is refused.
        let wire = flipped_frame(6, b"x", b"", b'T');
        let error = read_frame(&mut &wire[..], &mut buffer, 1 << 20).await.unwrap_err();
        assert!(error.to_string().contains("without encryption keys"), "{error}");
    }

    /// With a pool, a large unencrypted payload is read into a pooled buffer that comes back
    /// when the frame's data is dropped, and is handed out again for the next large frame; a
    /// flipped byte is still caught; small frames keep the connection's buffer.
    #[tokio::test]
    async fn large_payloads_are_read_into_pooled_buffers_and_still_checked() {
        let data: Vec<u8> = (0..(1 << 20) + 77).map(|i| (i % 251) as u8).collect();
        let mut wire = encode(1, b"first", &data);
        wire.extend_from_slice(&encode(2, b"small", b"tiny"));
        wire.extend_from_slice(&encode(3, b"again", &data));
        let mut bad = encode(4, b"bad", &data);
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        wire.extend_from_slice(&bad);
        let pool = crate::buffers::BufferPool::new(8 << 20);
        let budget = FrameBudget { pool: Some(pool.clone()), ..FrameBudget::new(64 << 20) };
        let (mut reader, mut buffer) = (&wire[..], BytesMut::new());
        async fn read(
            reader: &mut &[u8],
            buffer: &mut BytesMut,
            budget: &FrameBudget,
        ) -> Result<(Frame, Reservation), FrameError> {
            read_frame_bounded_opened(reader, buffer, bounds(), budget, &|| false, None).await
        }
        macro_rules! next {
            () => {
                read(&mut reader, &mut buffer, &budget)
            };
        }
        let (frame, _permit) = next!().await.unwrap();
        assert_eq!((frame.request_id, &frame.body[..], &frame.data[..]), (1, &b"first"[..], &data[..]));
        let first_address = frame.body.as_ptr();
        assert_eq!(pool.kept_bytes(), 0, "the frame holds its buffer");
        drop(frame);
        assert!(pool.kept_bytes() > 1 << 20, "the buffer came back");
        let (frame, _permit) = next!().await.unwrap();
        assert_eq!((frame.request_id, &frame.data[..]), (2, &b"tiny"[..]));
        assert!(pool.kept_bytes() > 1 << 20, "a small frame does not take it");
        let (frame, _permit) = next!().await.unwrap();
        assert_eq!((frame.request_id, &frame.data[..]), (3, &data[..]));
        assert_eq!(frame.body.as_ptr(), first_address, "the same memory, reused");
        drop(frame);
        let error = next!().await.unwrap_err();
        assert!(matches!(error, FrameError::PayloadChecksum { request_id: 4, .. }), "{error}");
        assert!(pool.kept_bytes() > 1 << 20, "a refused frame's buffer comes back too");
    }

    fn bounds() -> ReadBounds {
        ReadBounds {
            frame_bytes_max: 64 << 20,
            idle_timeout: Duration::from_millis(200),
            frame_timeout: Duration::from_millis(200),
            progress: ProgressRule { interval: Duration::from_millis(100), bytes_min: 1024 },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_claim_holds_none_of_the_budget_and_ends_within_one_window() {
        let header = FrameHeader {
            body_bytes: 32 << 20,
            data_bytes: 0,
            ..FrameHeader::for_payload(1, b"", b"").unwrap()
        };
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client.write_all(&header.encode()).await.unwrap();
        let budget = FrameBudget::new(64 << 20);
        let mut buffer = BytesMut::new();
        let started = tokio::time::Instant::now();
        let reading = read_frame_bounded(&mut server, &mut buffer, bounds(), &budget, &|| false);
        let watch = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            budget.kib.available_permits()
        };
        let (outcome, free) = tokio::join!(reading, watch);
        assert_eq!(free, (64 << 10) as usize, "a claim with no bytes reserved memory");
        assert!(matches!(outcome, Err(FrameError::Stalled { ms: 100, bytes_min: 1024 })), "{outcome:?}");
        assert!(started.elapsed() <= Duration::from_millis(110), "stalled for {:?}", started.elapsed());
        assert!(
            buffer.capacity() <= GROWTH_BYTES_MAX,
            "buffer grew to {} before bytes arrived",
            buffer.capacity()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_frame_holds_about_what_it_sent() {
        let header = FrameHeader { body_bytes: 8 << 20, ..FrameHeader::for_payload(1, b"", b"").unwrap() };
        let (mut client, mut server) = tokio::io::duplex(1 << 20);
        let budget = FrameBudget::new(64 << 20);
        let send = async {
            client.write_all(&header.encode()).await.unwrap();
            client.write_all(&vec![1u8; 1 << 20]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            let held_kib = (64 << 10) - budget.kib.available_permits();
            // 1 MiB sent: it holds that and at most one step ahead, not the 8 MiB claimed.
            assert!(held_kib <= 1024 + 256 + 64, "holds {held_kib} KiB after sending 1 MiB");
            assert!(held_kib >= 960, "holds {held_kib} KiB, less than it read");
        };
        let mut buffer = BytesMut::new();
        let (outcome, ()) =
            tokio::join!(read_frame_bounded(&mut server, &mut buffer, bounds(), &budget, &|| false), send);
        assert!(matches!(outcome, Err(FrameError::Stalled { .. })), "{outcome:?}");
        assert_eq!(budget.kib.available_permits(), (64 << 10) as usize, "reservation released");
    }

    #[tokio::test(start_paused = true)]
    async fn silence_between_frames_is_an_idle_timeout() {
        let (_client, mut server) = tokio::io::duplex(1 << 16);
        let budget = FrameBudget::new(1 << 20);
        let outcome =
            read_frame_bounded(&mut server, &mut BytesMut::new(), bounds(), &budget, &|| false).await;
        assert!(matches!(outcome, Err(FrameError::IdleTimeout { ms: 200 })), "{outcome:?}");
    }

    #[tokio::test]
    async fn bounded_read_holds_the_payload_length_of_the_budget() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 9, b"body", &[7u8; 5000]).await.unwrap();
        let budget = FrameBudget::new(1 << 20);
        let (frame, permit) =
            read_frame_bounded(&mut &wire[..], &mut BytesMut::new(), bounds(), &budget, &|| false)
                .await
                .unwrap();
        assert_eq!((frame.request_id, frame.data.len()), (9, 5000));
        assert_eq!(permit.num_permits(), 5, "5004 bytes hold 5 KiB");
        assert_eq!(budget.kib.available_permits(), 1024 - 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_not_idle() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let budget = FrameBudget::new(1 << 20);
        let polls = std::sync::atomic::AtomicU32::new(0);
        // Busy for the first three idle periods, then the frame arrives.
        let busy = || polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3;
        let send = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            write_frame(&mut client, 5, b"late", b"").await.unwrap();
        };
        let mut buffer = BytesMut::new();
        let (outcome, ()) =
            tokio::join!(read_frame_bounded(&mut server, &mut buffer, bounds(), &budget, &busy), send);
        assert_eq!(outcome.expect("frame after a busy wait").0.request_id, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_frame_waiting_for_memory_held_elsewhere_is_served_through_the_overdraft_lane() {
        let budget = FrameBudget::new(1 << 20);
        let _held = budget.take(budget.kib_max).await.unwrap();
        let mut wire = Vec::new();
        write_frame(&mut wire, 9, b"body", &[7u8; 5000]).await.unwrap();
        let started = tokio::time::Instant::now();
        let (frame, reservation) =
            read_frame_bounded(&mut &wire[..], &mut BytesMut::new(), bounds(), &budget, &|| false)
                .await
                .expect("served beside a full budget");
        assert_eq!(frame.data.len(), 5000);
        assert!(reservation.overdrawn() && reservation.units() == 5, "{reservation:?}");
        assert!(started.elapsed() >= budget.overdraft_wait, "waited {:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_frame_is_served_when_memory_frees() {
        let budget = FrameBudget::new(1 << 20);
        let held = budget.take(budget.kib_max).await.unwrap();
        let _lane = budget.overdraft.clone().acquire_owned().await.unwrap();
        let mut wire = Vec::new();
        write_frame(&mut wire, 9, b"body", &[7u8; 5000]).await.unwrap();
        let release = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        };
        let (mut buffer, mut reader) = (BytesMut::new(), &wire[..]);
        let (outcome, ()) =
            tokio::join!(read_frame_bounded(&mut reader, &mut buffer, bounds(), &budget, &|| false), release);
        assert_eq!(outcome.expect("served once memory freed").0.data.len(), 5000);
    }
}
