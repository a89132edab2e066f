//! Where each command finds its credential: `--key PATH`, then `key` in its table of the
//! config file, then `FLOTILLA_KEY`. Errors say which source was used, or that none was.

use anyhow::Context;
use flotilla_auth::{Integrity, Role};
use flotilla_client::{Client, ClientConfig};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The client credential the file commands use, resolved once in `main`.
static CLIENT_KEY: OnceLock<Option<(PathBuf, String)>> = OnceLock::new();

/// The credential path and a description of where it came from.
pub fn resolve(flag: Option<&Path>, config: Option<&Path>, table: &str) -> Option<(PathBuf, String)> {
    if let Some(path) = flag {
        return Some((path.to_path_buf(), format!("--key {}", path.display())));
    }
    if let Some(path) = config {
        return Some((path.to_path_buf(), format!("`key = {:?}` in [{table}] of the config file", path)));
    }
    let env = std::env::var_os(flotilla_client::KEY_ENV)?;
    let path = PathBuf::from(env);
    let source = format!("{}={}", flotilla_client::KEY_ENV, path.display());
    Some((path, source))
}

/// Resolves and checks the server credential of `flotilla meta` or `flotilla server`.
pub fn server_key(
    flag: Option<&Path>,
    config: Option<&Path>,
    table: &str,
    who: &str,
) -> anyhow::Result<PathBuf> {
    let Some((path, source)) = resolve(flag, config, table) else {
        let missing = flotilla_auth::AuthError::NoCredential { who: who.to_string() };
        return Err(missing.into());
    };
    flotilla_auth::load_credential(Some(&path), who, Role::Server)
        .with_context(|| format!("credential from {source}"))?;
    Ok(path)
}

/// The client's integrity setting (`[client] integrity`), resolved once in `main`.
static CLIENT_INTEGRITY: OnceLock<Integrity> = OnceLock::new();

/// The client's `[client] unstable_bytes_max`, resolved once in `main`.
static CLIENT_UNSTABLE_BYTES_MAX: OnceLock<Option<u64>> = OnceLock::new();

/// Remembers the client credential and integrity setting for the file commands.
pub fn set_client_key(flag: Option<&Path>, config: Option<&Path>, integrity: Integrity) {
    let _ = CLIENT_KEY.set(resolve(flag, config, "client"));
    let _ = CLIENT_INTEGRITY.set(integrity);
}

/// The client's `[client] tokens`, resolved once in `main`.
static CLIENT_TOKENS: OnceLock<Option<bool>> = OnceLock::new();
static CLIENT_ATTR_CACHE: OnceLock<Option<bool>> = OnceLock::new();

/// Remembers `[client] attr_cache` for every client this process makes.
pub fn set_attr_cache(on: Option<bool>) {
    let _ = CLIENT_ATTR_CACHE.set(on);
}

/// `[client] attr_cache` of the config file, if set (passed on to `flotilla bench`'s workers).
pub fn attr_cache() -> Option<bool> {
    CLIENT_ATTR_CACHE.get().copied().flatten()
}

/// Remembers `[client] tokens` for every client this process makes.
pub fn set_tokens(tokens: Option<bool>) {
    let _ = CLIENT_TOKENS.set(tokens);
}

/// `[client] tokens` of the config file, if set (passed on to `flotilla bench`'s workers).
pub fn tokens() -> Option<bool> {
    CLIENT_TOKENS.get().copied().flatten()
}

/// Remembers `[client] unstable_bytes_max` for every client this process makes.
pub fn set_unstable_bytes_max(bytes: Option<u64>) {
    let _ = CLIENT_UNSTABLE_BYTES_MAX.set(bytes);
}

/// `[client] unstable_bytes_max` of the config file, if set (passed on to `flotilla bench`'s
/// workers).
pub fn unstable_bytes_max() -> Option<u64> {
    CLIENT_UNSTABLE_BYTES_MAX.get().copied().flatten()
}

/// `[client] outage_wait_ms`, or `flotilla mount --outage-wait-ms` (which wins).
static CLIENT_OUTAGE_WAIT_MS: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);

/// Makes every client this process makes from now on wait `wait_ms` for an unreachable
/// service (`None` leaves what is set).
pub fn set_outage_wait_ms(wait_ms: Option<u64>) {
    if let (Some(wait_ms), Ok(mut held)) = (wait_ms, CLIENT_OUTAGE_WAIT_MS.lock()) {
        *held = Some(wait_ms);
    }
}

/// Where the next client this process makes serves its metrics (`flotilla mount --metrics-listen`).
static CLIENT_METRICS_LISTEN: OnceLock<String> = OnceLock::new();

/// Makes the clients of this process serve their metrics on `listen`.
pub fn set_metrics_listen(listen: &str) {
    let _ = CLIENT_METRICS_LISTEN.set(listen.to_string());
}

/// `[server] metrics` of the config file, for the servers `flotilla bench` starts.
static SERVER_METRICS: OnceLock<bool> = OnceLock::new();

/// Remembers `[server] metrics` (in `main`).
pub fn set_server_metrics(on: bool) {
    let _ = SERVER_METRICS.set(on);
}

/// Whether the servers `flotilla bench` starts count for metrics (default: yes).
pub fn server_metrics() -> bool {
    SERVER_METRICS.get().copied().unwrap_or(true)
}

static SERVER_BULK_BYTES_MIN: OnceLock<u64> = OnceLock::new();

/// Remembers `[server] bulk_bytes_min` (in `main`).
pub fn set_server_bulk_bytes_min(bytes: u64) {
    let _ = SERVER_BULK_BYTES_MIN.set(bytes);
}

/// The `bulk_bytes_min` of the servers `flotilla bench` starts (default: the server's).
pub fn server_bulk_bytes_min() -> u64 {
    SERVER_BULK_BYTES_MIN.get().copied().unwrap_or(flotilla_store::BULK_BYTES_MIN_DEFAULT)
}

static SERVER_DISK_THREADS: OnceLock<usize> = OnceLock::new();

/// Remembers `[server] disk_threads_per_target` (in `main`).
pub fn set_server_disk_threads(threads: usize) {
    let _ = SERVER_DISK_THREADS.set(threads);
}

/// The `disk_threads_per_target` of the servers `flotilla bench` starts (default: the
/// server's).
pub fn server_disk_threads() -> usize {
    SERVER_DISK_THREADS
        .get()
        .copied()
        .unwrap_or(flotilla_store::StoreConfig::default().disk_threads_per_target)
}

static SERVER_PARKED_REQUESTS_MAX: OnceLock<usize> = OnceLock::new();

/// Remembers `[server] parked_requests_max` (in `main`).
pub fn set_server_parked_requests_max(parked: usize) {
    let _ = SERVER_PARKED_REQUESTS_MAX.set(parked);
}

/// The `parked_requests_max` of the servers `flotilla bench` starts (default: the server's).
pub fn server_parked_requests_max() -> usize {
    SERVER_PARKED_REQUESTS_MAX.get().copied().unwrap_or(flotilla_server::config::PARKED_REQUESTS_MAX_DEFAULT)
}

/// The client's integrity setting.
pub fn integrity() -> Integrity {
    CLIENT_INTEGRITY.get().copied().unwrap_or_default()
}

/// The client credential path the file commands use, if any.
pub fn client_key() -> Option<PathBuf> {
    CLIENT_KEY.get().cloned().flatten().map(|(path, _)| path)
}

/// A client of the cluster at `meta` with the resolved client credential.
pub fn client(meta: &str) -> anyhow::Result<Client> {
    match CLIENT_KEY.get().cloned().flatten() {
        Some((key, source)) => {
            client_with(meta, Some(&key)).with_context(|| format!("credential from {source}"))
        }
        None => client_with(meta, None),
    }
}

/// A client of the cluster at `meta` with the credential at `key`.
pub fn client_with(meta: &str, key: Option<&Path>) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(meta);
    config.integrity = integrity();
    if let Some(bytes) = CLIENT_UNSTABLE_BYTES_MAX.get().copied().flatten() {
        config.unstable_bytes_max = bytes;
    }
    if let Some(tokens) = tokens() {
        config.tokens = tokens;
    }
    if let Some(on) = attr_cache() {
        config.attr_cache = on;
    }
    if let Some(wait_ms) = CLIENT_OUTAGE_WAIT_MS.lock().ok().and_then(|held| *held) {
        config.outage.wait_ms = wait_ms;
    }
    if let Some(key) = key {
        config.key = Some(key.to_path_buf());
    }
    if let Some(listen) = CLIENT_METRICS_LISTEN.get() {
        config.metrics_listen = Some(listen.clone());
    }
    Ok(Client::with_config(config)?)
}

/// The client credential (`FLOTILLA_CLIENT_KEY` or the default key) with this process's
/// integrity setting, for the CLI's own calls to a service.
pub fn client_auth() -> anyhow::Result<flotilla_auth::ClientAuth> {
    let key = client_key();
    let credential = flotilla_auth::load_credential(key.as_deref(), "flotilla", flotilla_auth::Role::Client)?;
    let bounds = flotilla_auth::AuthBounds { integrity: integrity(), ..Default::default() };
    Ok(flotilla_auth::ClientAuth { credential, bounds })
}
