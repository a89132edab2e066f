//! Tagging and checking capabilities with the cluster's capability key.
//!
//! The key is the 32-byte secret every server credential carries (clients never see it).
//! The tag is the BLAKE3 keyed hash, under a key derived from it for this purpose only, of
//! `file (u64 LE) | subfiles (u32 LE) | rights (u8) | issued_unix_ms (u64 LE) |
//! expires_unix_ms (u64 LE) | holder length (u16 LE) | holder (UTF-8)`.
//! A symmetric key keeps checking cheap enough for every request (about a hundred
//! nanoseconds); the price is that any server credential can issue capabilities, which is
//! no more than a server credential can already do to the data it stores.

use flotilla_proto::capability::{Capability, Rights, CAPABILITY_TAG_BYTES, HOLDER_BYTES_MAX};
use flotilla_types::FileId;

const DERIVE_CONTEXT: &str = "flotilla 2026 capability tag v1";

/// Why an I/O server refuses a capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapabilityError {
    #[error("capability tag does not verify (forged or altered capability)")]
    Forged,
    #[error("capability for file {file} expired at {expires_unix_ms} ms (now {now_unix_ms} ms); ask the metadata service for a new one")]
    Expired { file: FileId, expires_unix_ms: u64, now_unix_ms: u64 },
    #[error("capability was issued to {holder:?}, not to this connection's credential {peer:?}")]
    WrongHolder { holder: String, peer: String },
    #[error("capability holder name is longer than {HOLDER_BYTES_MAX} bytes")]
    HolderTooLong,
}

/// What a capability grants, before it is tagged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub file: FileId,
    pub subfiles: u32,
    pub rights: Rights,
    pub holder: String,
    pub lifetime_ms: u64,
}

/// Issues and checks capabilities.
#[derive(Clone)]
pub struct CapabilityKey {
    key: [u8; 32],
}

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

impl CapabilityKey {
    /// The key derived from the cluster's capability secret.
    pub fn new(secret: &[u8; 32]) -> Self {
        CapabilityKey { key: blake3::derive_key(DERIVE_CONTEXT, secret) }
    }

    /// A tagged capability for `grant`, valid from `now_unix_ms` for its lifetime.
    pub fn issue(&self, grant: &Grant, now_unix_ms: u64) -> Result<Capability, CapabilityError> {
        if grant.holder.len() > HOLDER_BYTES_MAX {
            return Err(CapabilityError::HolderTooLong);
        }
        let mut capability = Capability {
            file: grant.file,
            subfiles: grant.subfiles,
            rights: grant.rights,
            holder: grant.holder.clone(),
            issued_unix_ms: now_unix_ms,
            expires_unix_ms: now_unix_ms.saturating_add(grant.lifetime_ms),
            tag: [0; CAPABILITY_TAG_BYTES],
        };
        capability.tag = self.tag(&capability)?;
        Ok(capability)
    }

    /// Checks the tag (constant time), the holder and the expiry.
    pub fn check(
        &self,
        capability: &Capability,
        peer: &str,
        now_unix_ms: u64,
    ) -> Result<(), CapabilityError> {
        let expected = blake3::Hash::from(self.tag(capability)?);
        if expected != blake3::Hash::from(capability.tag) {
            return Err(CapabilityError::Forged);
        }
        if capability.holder != peer {
            return Err(CapabilityError::WrongHolder {
                holder: capability.holder.clone(),
                peer: peer.to_string(),
            });
        }
        if now_unix_ms >= capability.expires_unix_ms {
            return Err(CapabilityError::Expired {
                file: capability.file,
                expires_unix_ms: capability.expires_unix_ms,
                now_unix_ms,
            });
        }
        Ok(())
    }

    fn tag(&self, capability: &Capability) -> Result<[u8; CAPABILITY_TAG_BYTES], CapabilityError> {
        let holder_bytes = u16::try_from(capability.holder.len())
            .ok()
            .filter(|n| usize::from(*n) <= HOLDER_BYTES_MAX)
            .ok_or(CapabilityError::HolderTooLong)?;
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(&capability.file.0.to_le_bytes());
        hasher.update(&capability.subfiles.to_le_bytes());
        hasher.update(&[capability.rights.0]);
        hasher.update(&capability.issued_unix_ms.to_le_bytes());
        hasher.update(&capability.expires_unix_ms.to_le_bytes());
        hasher.update(&holder_bytes.to_le_bytes());
        hasher.update(capability.holder.as_bytes());
        Ok(*hasher.finalize().as_bytes())
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            file: FileId(5),
            subfiles: 4,
            rights: Rights::READ,
            holder: "alice".into(),
            lifetime_ms: 1000,
        }
    }

    #[test]
    fn an_issued_capability_checks_until_it_expires() {
        let key = CapabilityKey::new(&[9; 32]);
        let capability = key.issue(&grant(), 10_000).unwrap();
        assert_eq!(capability.expires_unix_ms, 11_000);
        assert_eq!(key.check(&capability, "alice", 10_999), Ok(()));
        assert!(matches!(key.check(&capability, "alice", 11_000), Err(CapabilityError::Expired { .. })));
    }

    #[test]
    fn every_altered_field_and_another_key_are_refused() {
        let key = CapabilityKey::new(&[9; 32]);
        let good = key.issue(&grant(), 10_000).unwrap();
        let alterations: [fn(&mut Capability); 7] = [
            |c| c.file = FileId(6),
            |c| c.subfiles = 5,
            |c| c.rights = Rights(3),
            |c| c.holder = "mallory".into(),
            |c| c.issued_unix_ms -= 1,
            |c| c.expires_unix_ms += 1,
            |c| c.tag[31] ^= 1,
        ];
        for alter in alterations {
            let mut forged = good.clone();
            alter(&mut forged);
            assert_eq!(key.check(&forged, &forged.holder.clone(), 10_500), Err(CapabilityError::Forged));
        }
        let other = CapabilityKey::new(&[8; 32]);
        assert_eq!(other.check(&good, "alice", 10_500), Err(CapabilityError::Forged));
    }

    #[test]
    fn another_holder_is_refused() {
        let key = CapabilityKey::new(&[9; 32]);
        let capability = key.issue(&grant(), 10_000).unwrap();
        assert!(matches!(key.check(&capability, "bob", 10_500), Err(CapabilityError::WrongHolder { .. })));
    }
}
