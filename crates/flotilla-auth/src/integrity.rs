//! How strongly frames are protected: CRC32C only, a keyed tag, or encryption. Agreed in the
//! handshake and applied by the wire.

use serde::{Deserialize, Serialize};

use crate::AuthError;

/// Whether frames carry a keyed integrity tag (the default), are encrypted, or carry
/// only CRC32C. Ordered from weakest to strongest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Integrity {
    /// Frames carry CRC32C only (for measuring the tag's cost; not for shared networks).
    None,
    /// Every frame carries a BLAKE3 keyed tag.
    #[default]
    Mac,
    /// Every frame's body and data are encrypted and authenticated (AES-256-GCM).
    Encrypt,
}

impl Integrity {
    /// The level's byte in the handshake.
    pub fn to_wire(self) -> u8 {
        match self {
            Integrity::None => 0,
            Integrity::Mac => 1,
            Integrity::Encrypt => 2,
        }
    }

    /// The level a handshake byte names.
    pub fn from_wire(byte: u8) -> Result<Integrity, AuthError> {
        match byte {
            0 => Ok(Integrity::None),
            1 => Ok(Integrity::Mac),
            2 => Ok(Integrity::Encrypt),
            other => Err(AuthError::Handshake(format!(
                "unknown integrity level {other} (0 none, 1 mac, 2 encrypt)"
            ))),
        }
    }

    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            Integrity::None => "none",
            Integrity::Mac => "mac",
            Integrity::Encrypt => "encrypt",
        }
    }
}

impl std::fmt::Display for Integrity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Integrity {
    type Err = String;

    fn from_str(text: &str) -> Result<Integrity, String> {
        match text {
            "none" => Ok(Integrity::None),
            "mac" => Ok(Integrity::Mac),
            "encrypt" => Ok(Integrity::Encrypt),
            other => Err(format!("unknown integrity {other:?}: expected none, mac or encrypt")),
        }
    }
}
