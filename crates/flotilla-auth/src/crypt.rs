//! Encrypted frames after the handshake (`integrity = encrypt`): AES-256-GCM from `ring`
//! (chosen over ChaCha20-Poly1305 and over RustCrypto's `aes-gcm` by measurement on machines
//! with AES-NI and PCLMULQDQ: ring's stitched assembly is about twice as fast; see
//! docs/performance.md).
//!
//! Each direction has its own 32-byte key, derived with BLAKE3's key derivation from the
//! Noise handshake hash (contexts distinct from the tag keys'), and its own sequence
//! number starting at 0. A frame's nonce is `0u32 | sequence (u64 LE)`: with one key per
//! direction per connection and a sequence that only grows, no nonce is ever used twice.
//! The associated data is `sequence (u64 LE) | header bytes 0..24` (magic, version,
//! flags, request id, body and data lengths); the payload CRC32C is 0 on encrypted frames
//! (the AEAD tag covers every payload byte) and, like the header CRC32C, not part of it. Body and data
//! are encrypted as one message (body then data); the 16-byte tag follows them.

use flotilla_proto::{FrameHeader, AEAD_TAG_BYTES, FLAG_ENCRYPTED};
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

use crate::AuthError;

const INITIATOR_CONTEXT: &str = "flotilla 2026 frame encryption initiator to responder";
const RESPONDER_CONTEXT: &str = "flotilla 2026 frame encryption responder to initiator";
/// Header bytes covered by the associated data (all but the two checksums).
const AUTHENTICATED_HEADER_BYTES: usize = 24;

/// The encryption keys of one connection, as seen from one side.
pub struct CryptKeys {
    pub seal: FrameEncrypt,
    pub open: FrameDecrypt,
}

impl CryptKeys {
    /// Derives both directions' keys; `initiator` tells which side this is.
    pub fn from_handshake_hash(hash: &[u8], initiator: bool) -> Self {
        let contexts = [INITIATOR_CONTEXT, RESPONDER_CONTEXT];
        let (send, receive) = crate::tag::direction_keys(hash, initiator, contexts);
        CryptKeys {
            seal: FrameEncrypt { cipher: cipher(&send), sequence: 0 },
            open: FrameDecrypt { cipher: cipher(&receive), sequence: 0 },
        }
    }
}

fn cipher(key: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is always valid for AES-256-GCM.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

fn nonce(sequence: u64) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&sequence.to_le_bytes());
    Nonce::assume_unique_for_key(bytes)
}

fn associated_data(sequence: u64, header: &FrameHeader) -> [u8; 8 + AUTHENTICATED_HEADER_BYTES] {
    let mut out = [0u8; 8 + AUTHENTICATED_HEADER_BYTES];
    out[..8].copy_from_slice(&sequence.to_le_bytes());
    out[8..].copy_from_slice(&header.encode()[..AUTHENTICATED_HEADER_BYTES]);
    out
}

/// Encrypts outgoing frames.
pub struct FrameEncrypt {
    cipher: LessSafeKey,
    sequence: u64,
}

impl FrameEncrypt {
    /// Encrypts `payload` (body then data, `body_bytes` of it body) in place and returns
    /// the frame's header (no payload CRC32C) and its tag; advances the sequence number.
    pub fn seal(
        &mut self,
        request_id: u64,
        body_bytes: u32,
        payload: &mut [u8],
    ) -> Result<(FrameHeader, [u8; AEAD_TAG_BYTES]), AuthError> {
        let body_len = body_bytes as usize;
        let data_len = payload.len().checked_sub(body_len).ok_or_else(|| {
            AuthError::Crypt(format!("frame body of {body_len} bytes is longer than its payload"))
        })?;
        let header = FrameHeader::for_protected_payload(request_id, FLAG_ENCRYPTED, body_len, data_len)
            .map_err(|e| AuthError::Crypt(e.to_string()))?;
        let sequence = self.sequence;
        let next =
            sequence.checked_add(1).ok_or_else(|| AuthError::Crypt("frame sequence exhausted".into()))?;
        let aad = associated_data(sequence, &header);
        let tag = self.cipher.seal_in_place_separate_tag(nonce(sequence), Aad::from(aad), payload).map_err(
            |_| AuthError::Crypt(format!("cannot encrypt frame {sequence} (request {request_id})")),
        )?;
        self.sequence = next;
        let mut out = [0u8; AEAD_TAG_BYTES];
        out.copy_from_slice(tag.as_ref());
        Ok((header, out))
    }
}

/// Decrypts incoming frames.
pub struct FrameDecrypt {
    cipher: LessSafeKey,
    sequence: u64,
}

impl FrameDecrypt {
    /// Checks `tag` and decrypts `payload` in place; advances the sequence number only on
    /// success (a replayed, reordered, altered or misdirected frame fails).
    pub fn open(&mut self, header: &FrameHeader, payload: &mut [u8], tag: &[u8]) -> Result<(), AuthError> {
        let (request_id, sequence) = (header.request_id, self.sequence);
        let refused = || AuthError::Decrypt { request_id, sequence };
        if tag.len() != AEAD_TAG_BYTES {
            return Err(refused());
        }
        let aad = associated_data(sequence, header);
        let tag = Tag::try_from(tag).map_err(|_| refused())?;
        self.cipher
            .open_in_place_separate_tag(nonce(sequence), Aad::from(aad), tag, payload, 0..)
            .map_err(|_| refused())?;
        self.sequence = sequence.checked_add(1).ok_or_else(refused)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HASH: [u8; 32] = [42u8; 32];

    /// Seals one frame; returns its header, ciphertext and tag.
    fn seal(
        keys: &mut CryptKeys,
        request_id: u64,
        body: &[u8],
        data: &[u8],
    ) -> (FrameHeader, Vec<u8>, [u8; 16]) {
        let mut payload = [body, data].concat();
        let (header, tag) = keys.seal.seal(request_id, body.len() as u32, &mut payload).unwrap();
        (header, payload, tag)
    }

    #[test]
    fn a_frame_round_trips_and_its_payload_is_ciphertext() {
        let (mut sender, mut receiver) =
            (CryptKeys::from_handshake_hash(&HASH, true), CryptKeys::from_handshake_hash(&HASH, false));
        let data = vec![0x5au8; 4096];
        for request_id in 0..3u64 {
            let (header, mut payload, tag) = seal(&mut sender, request_id, b"body", &data);
            assert_eq!((header.flags, header.body_bytes, header.data_bytes), (FLAG_ENCRYPTED, 4, 4096));
            assert_eq!(header.payload_crc32c, 0, "the AEAD tag, not a CRC32C, covers the payload");
            assert!(!payload.windows(64).any(|w| w == &data[..64]), "plaintext visible in the ciphertext");
            receiver.open.open(&header, &mut payload, &tag).unwrap();
            assert_eq!(&payload[..4], b"body");
            assert_eq!(&payload[4..], &data[..]);
        }
    }

    #[test]
    fn replayed_reordered_and_misdirected_frames_are_refused() {
        let mut initiator = CryptKeys::from_handshake_hash(&HASH, true);
        let mut responder = CryptKeys::from_handshake_hash(&HASH, false);
        let first = seal(&mut initiator, 1, b"one", b"");
        let second = seal(&mut initiator, 2, b"two", b"");
        let open = |keys: &mut CryptKeys, (header, payload, tag): &(FrameHeader, Vec<u8>, [u8; 16])| {
            keys.open.open(header, &mut payload.clone(), tag)
        };
        assert!(
            matches!(open(&mut responder, &second), Err(AuthError::Decrypt { sequence: 0, .. })),
            "reordered"
        );
        open(&mut responder, &first).unwrap();
        assert!(open(&mut responder, &first).is_err(), "replayed");
        open(&mut responder, &second).unwrap();
        // A frame sealed for one direction does not open in the other.
        let echo = seal(&mut initiator, 3, b"x", b"");
        assert!(open(&mut initiator, &echo).is_err(), "opened with the sender's own direction");
        // Nor with the keys of another connection (another handshake hash).
        let mut other = CryptKeys::from_handshake_hash(&[7u8; 32], false);
        assert!(open(&mut other, &first).is_err(), "opened with another connection's key");
    }

    #[test]
    fn the_two_directions_have_different_keys() {
        let mut initiator = CryptKeys::from_handshake_hash(&HASH, true);
        let mut responder = CryptKeys::from_handshake_hash(&HASH, false);
        // Same plaintext, same sequence, both directions: different ciphertexts.
        let (a, b) = (seal(&mut initiator, 1, b"same", b""), seal(&mut responder, 1, b"same", b""));
        assert_ne!(a.1, b.1);
    }

    /// The header a receiver decodes from `bytes` (checksums as sent).
    fn header_from(bytes: &[u8; 32], sent: &FrameHeader) -> FrameHeader {
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut request_id = [0u8; 8];
        request_id.copy_from_slice(&bytes[8..16]);
        FrameHeader {
            version: u16::from_le_bytes([bytes[4], bytes[5]]),
            flags: u16::from_le_bytes([bytes[6], bytes[7]]),
            request_id: u64::from_le_bytes(request_id),
            body_bytes: u32_at(16),
            data_bytes: u32_at(20),
            payload_crc32c: sent.payload_crc32c,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Any one flipped bit in the authenticated header fields (after the magic), the
        /// ciphertext or the tag is refused, and the intact frame still opens afterwards.
        #[test]
        fn any_altered_bit_is_refused(
            body in proptest::collection::vec(any::<u8>(), 0..64),
            data in proptest::collection::vec(any::<u8>(), 0..256),
            bit in any::<usize>(),
        ) {
            let mut sender = CryptKeys::from_handshake_hash(&HASH, true);
            let (header, payload, tag) = seal(&mut sender, 9, &body, &data);
            let mut header_bytes = header.encode();
            let mut wire = [&payload[..], &tag[..]].concat();
            let header_bits = (AUTHENTICATED_HEADER_BYTES - 4) * 8;
            let at = bit % (header_bits + wire.len() * 8);
            if at < header_bits {
                header_bytes[4 + at / 8] ^= 1 << (at % 8);
            } else {
                let at = at - header_bits;
                wire[at / 8] ^= 1 << (at % 8);
            }
            let altered = header_from(&header_bytes, &header);
            let (ciphertext, altered_tag) = wire.split_at_mut(payload.len());
            let mut receiver = CryptKeys::from_handshake_hash(&HASH, false);
            prop_assert!(receiver.open.open(&altered, ciphertext, altered_tag).is_err());
            let mut intact = payload.clone();
            prop_assert!(receiver.open.open(&header, &mut intact, &tag).is_ok());
            prop_assert_eq!(intact, [&body[..], &data[..]].concat());
        }
    }
}
