//! Settings of the metadata service.

use flotilla_types::CallerPolicy;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The documented default address of the metadata service.
pub const DEFAULT_META_ADDR: &str = "127.0.0.1:7770";

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct MetaConfig {
    /// Directory holding `namespace.redb`.
    pub data: PathBuf,
    pub listen: String,
    /// Heartbeat period asked of I/O servers.
    pub heartbeat_ms: u64,
    /// A target not heard from for this long is down.
    pub down_after_ms: u64,
    pub connections_max: usize,
    /// Requests one connection may have in progress.
    pub connection_requests_max: usize,
    pub frame_bytes_max: u32,
    /// The policy every connection starts with (unrestricted by default; an authenticated
    /// peer's credential will narrow it).
    pub default_policy: CallerPolicy,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            data: PathBuf::from("flotilla-data/meta"),
            listen: DEFAULT_META_ADDR.to_string(),
            heartbeat_ms: 1000,
            down_after_ms: 3500,
            connections_max: 4096,
            connection_requests_max: 64,
            frame_bytes_max: 4 << 20,
            default_policy: CallerPolicy::default(),
        }
    }
}
