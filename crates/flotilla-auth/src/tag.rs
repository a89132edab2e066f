//! Keyed integrity tags on frames after the handshake.
//!
//! Each direction has its own 32-byte key, derived with BLAKE3's key derivation from
//! the Noise handshake hash, and its own sequence number starting at 0. The tag of a
//! frame is the 32-byte BLAKE3 keyed hash of
//! `sequence (u64 LE) | request_id (u64 LE) | body_bytes (u32 LE) | data_bytes (u32 LE) | body | data`.
//! A replayed, reordered, dropped or altered frame fails the check.

use crate::AuthError;

/// Length of a frame tag on the wire.
pub const TAG_BYTES: usize = 32;
const INITIATOR_CONTEXT: &str = "flotilla 2026 frame tag initiator to responder";
const RESPONDER_CONTEXT: &str = "flotilla 2026 frame tag responder to initiator";

/// The keys of one connection, as seen from one side.
pub struct TagKeys {
    pub seal: FrameSeal,
    pub open: FrameOpen,
}

impl TagKeys {
    /// Derives both directions' keys; `initiator` tells which side this is.
    pub fn from_handshake_hash(hash: &[u8], initiator: bool) -> Self {
        let (send, receive) = direction_keys(hash, initiator, [INITIATOR_CONTEXT, RESPONDER_CONTEXT]);
        TagKeys { seal: FrameSeal { key: send, sequence: 0 }, open: FrameOpen { key: receive, sequence: 0 } }
    }
}

/// This side's (sending, receiving) keys derived from the handshake hash: one key per
/// direction, under the two contexts `[initiator to responder, responder to initiator]`.
pub(crate) fn direction_keys(hash: &[u8], initiator: bool, contexts: [&str; 2]) -> ([u8; 32], [u8; 32]) {
    let outgoing = blake3::derive_key(contexts[0], hash);
    let incoming = blake3::derive_key(contexts[1], hash);
    if initiator {
        (outgoing, incoming)
    } else {
        (incoming, outgoing)
    }
}

/// The hasher of one frame's tag with everything before the payload already added.
fn tag_start(
    key: &[u8; 32],
    sequence: u64,
    request_id: u64,
    body_bytes: u32,
    data_bytes: u32,
) -> blake3::Hasher {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(&sequence.to_le_bytes());
    hasher.update(&request_id.to_le_bytes());
    hasher.update(&body_bytes.to_le_bytes());
    hasher.update(&data_bytes.to_le_bytes());
    hasher
}

fn tag(key: &[u8; 32], sequence: u64, request_id: u64, body: &[u8], data: &[u8]) -> blake3::Hash {
    let mut hasher = tag_start(key, sequence, request_id, body.len() as u32, data.len() as u32);
    hasher.update(body);
    hasher.update(data);
    hasher.finalize()
}

/// A frame's tag computed as its payload streams in (body, then data, in wire order), for
/// a reader that places the data somewhere other than one buffer. Made by
/// [`FrameOpen::start`], checked by [`FrameOpen::finish`].
pub struct TagHasher {
    hasher: blake3::Hasher,
    request_id: u64,
    sequence: u64,
    bytes_expected: u64,
    bytes_seen: u64,
}

impl TagHasher {
    /// Adds the next payload bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.bytes_seen += bytes.len() as u64;
    }
}

/// Computes tags for outgoing frames.
pub struct FrameSeal {
    key: [u8; 32],
    sequence: u64,
}

impl FrameSeal {
    /// The tag to send after this frame; advances the sequence number.
    pub fn seal(&mut self, request_id: u64, body: &[u8], data: &[u8]) -> [u8; TAG_BYTES] {
        let out = tag(&self.key, self.sequence, request_id, body, data);
        self.sequence += 1;
        *out.as_bytes()
    }
}

/// Checks tags on incoming frames.
pub struct FrameOpen {
    key: [u8; 32],
    sequence: u64,
}

impl FrameOpen {
    /// Checks the tag received after this frame (constant-time compare); advances the
    /// sequence number only on success.
    pub fn open(
        &mut self,
        request_id: u64,
        body: &[u8],
        data: &[u8],
        received: &[u8; TAG_BYTES],
    ) -> Result<(), AuthError> {
        let expected = tag(&self.key, self.sequence, request_id, body, data);
        if expected != blake3::Hash::from(*received) {
            return Err(AuthError::BadTag { request_id, sequence: self.sequence });
        }
        self.sequence += 1;
        Ok(())
    }

    /// Starts checking the next frame's tag while its payload streams in; nothing else may
    /// be opened before [`FrameOpen::finish`] (the sequence number is this frame's).
    pub fn start(&self, request_id: u64, body_bytes: u32, data_bytes: u32) -> TagHasher {
        TagHasher {
            hasher: tag_start(&self.key, self.sequence, request_id, body_bytes, data_bytes),
            request_id,
            sequence: self.sequence,
            bytes_expected: u64::from(body_bytes) + u64::from(data_bytes),
            bytes_seen: 0,
        }
    }

    /// Checks the tag received after a frame whose every payload byte went through
    /// `hasher` (constant-time compare); advances the sequence number only on success.
    pub fn finish(&mut self, hasher: TagHasher, received: &[u8; TAG_BYTES]) -> Result<(), AuthError> {
        let (request_id, sequence) = (hasher.request_id, hasher.sequence);
        let complete = hasher.bytes_seen == hasher.bytes_expected && sequence == self.sequence;
        if !complete || hasher.hasher.finalize() != blake3::Hash::from(*received) {
            return Err(AuthError::BadTag { request_id, sequence });
        }
        self.sequence += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (FrameSeal, FrameOpen) {
        let keys = TagKeys::from_handshake_hash(b"handshake hash", true);
        let other = TagKeys::from_handshake_hash(b"handshake hash", false);
        (keys.seal, other.open)
    }

    #[test]
    fn a_streamed_check_accepts_what_open_accepts_and_nothing_else() {
        let (mut seal, mut open) = pair();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let tag = seal.seal(7, b"body", &data);
        let mut hasher = open.start(7, 4, data.len() as u32);
        hasher.update(b"bo");
        hasher.update(b"dy");
        data.chunks(999).for_each(|chunk| hasher.update(chunk));
        open.finish(hasher, &tag).expect("a streamed check of an intact frame");
        // The next frame: one flipped data byte, then a frame cut short.
        let tag = seal.seal(8, b"", &data);
        let mut flipped = data.clone();
        flipped[4321] ^= 1;
        let mut hasher = open.start(8, 0, data.len() as u32);
        hasher.update(&flipped);
        assert!(open.finish(hasher, &tag).is_err(), "a flipped byte passed");
        let mut hasher = open.start(8, 0, data.len() as u32);
        hasher.update(&data[..100]);
        assert!(open.finish(hasher, &tag).is_err(), "a short payload passed");
        open.open(8, b"", &data, &tag).expect("failures did not advance the sequence");
    }
}
