//! The X25519 static keys of the Noise handshake: made with a credential, checked against
//! its certificate. Below both `credential.rs` and `handshake.rs`.

use snow::params::{DHChoice, NoiseParams};
use snow::resolvers::{CryptoResolver, DefaultResolver};

use crate::AuthError;

/// The Noise protocol name.
pub const NOISE_PARAMS: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";
/// An X25519 key pair.
pub struct StaticKeypair {
    pub private: [u8; 32],
    pub public: [u8; 32],
}

pub(crate) fn params() -> NoiseParams {
    // The constant is a valid Noise name; parsing it cannot fail.
    NOISE_PARAMS.parse().unwrap_or_else(|_| unreachable!("NOISE_PARAMS is valid"))
}

/// A fresh X25519 key pair.
pub fn generate_static_keypair() -> Result<StaticKeypair, AuthError> {
    let pair = snow::Builder::new(params()).generate_keypair().map_err(noise)?;
    Ok(StaticKeypair { private: to_key(&pair.private)?, public: to_key(&pair.public)? })
}

/// The X25519 public key of `private`.
pub fn public_key_of(private: &[u8; 32]) -> Result<[u8; 32], AuthError> {
    let mut dh = DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .ok_or_else(|| AuthError::Handshake("no X25519 implementation".into()))?;
    dh.set(private);
    to_key(dh.pubkey())
}

fn to_key(bytes: &[u8]) -> Result<[u8; 32], AuthError> {
    bytes.try_into().map_err(|_| AuthError::Handshake(format!("key of {} bytes, expected 32", bytes.len())))
}

pub(crate) fn noise(e: snow::Error) -> AuthError {
    AuthError::Handshake(format!("noise: {e}"))
}
