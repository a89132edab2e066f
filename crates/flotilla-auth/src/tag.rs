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

fn tag(key: &[u8; 32], sequence: u64, request_id: u64, body: &[u8], data: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(&sequence.to_le_bytes());
    hasher.update(&request_id.to_le_bytes());
    hasher.update(&(body.len() as u32).to_le_bytes());
    hasher.update(&(data.len() as u32).to_le_bytes());
    hasher.update(body);
    hasher.update(data);
    hasher.finalize()
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
}
