//! The optional TOML configuration file: `[meta]`, `[server]` and `[local]` tables whose
//! keys are the fields of the services' configurations. Command-line flags win.

use anyhow::Context;
use flotilla_meta::MetaConfig;
use flotilla_server::ServerConfig;
use serde::Deserialize;
use std::path::Path;

/// Settings of `flotilla local`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    pub servers: usize,
    pub data: std::path::PathBuf,
    pub listen: String,
    /// Kind of every server's target: `dir` or `sim:MODEL`.
    pub target_kind: String,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            servers: 4,
            data: "flotilla-data".into(),
            listen: flotilla_meta::config::DEFAULT_META_ADDR.to_string(),
            target_kind: "dir".to_string(),
        }
    }
}

/// Settings of the file commands, the mount and the benchmarks.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientFileConfig {
    /// The client credential file.
    pub key: Option<std::path::PathBuf>,
    /// `mac` (default), `encrypt` or `none`; `flotilla bench`'s embedded cluster uses it for every process.
    pub integrity: flotilla_auth::Integrity,
    /// Most bytes of acknowledged, not yet durable writes a client keeps to resend after a
    /// server restart (`ClientConfig::unstable_bytes_max`; default 64 MiB).
    pub unstable_bytes_max: Option<u64>,
    /// Byte-range tokens on the library's file reads and writes (`ClientConfig::tokens`;
    /// default on). The mount's are set by `flotilla mount --tokens`.
    pub tokens: Option<bool>,
    /// The library's coherent attribute cache for `stat` (`ClientConfig::attr_cache`;
    /// default on).
    pub attr_cache: Option<bool>,
    /// How long a call keeps trying an unreachable I/O server or metadata service before it
    /// fails (`ClientConfig::outage`; default 60 000, or `FLOTILLA_OUTAGE_WAIT_MS`).
    pub outage_wait_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub meta: MetaConfig,
    pub server: ServerConfig,
    pub local: LocalConfig,
    pub client: ClientFileConfig,
}

impl FileConfig {
    pub fn load(path: Option<&Path>) -> anyhow::Result<FileConfig> {
        let Some(path) = path else { return Ok(FileConfig::default()) };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parse config file {}", path.display()))
    }
}
