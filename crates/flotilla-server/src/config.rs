//! Settings of an I/O server.

use flotilla_types::Limits;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default of `parked_requests_max`.
pub const PARKED_REQUESTS_MAX_DEFAULT: usize = 256;
/// Largest `parked_requests_max` accepted.
pub const PARKED_REQUESTS_MAX_LIMIT: usize = 1 << 16;

/// A setting of `[server]` out of its range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("[server] {name} = {value} is out of range: {reason}")]
pub struct ConfigError {
    pub name: &'static str,
    pub value: u64,
    pub reason: String,
}

/// Everything an I/O server needs to run. Every queue and buffer has a limit here.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the metadata service, or every address of its group as `a,b,c`: the server
    /// registers with and heartbeats to the node that serves (flotilla-client `LeaderChase`).
    pub meta: String,
    /// Address to listen on (port 0 picks a free port).
    pub listen: String,
    /// Address clients should use; defaults to the bound listen address.
    pub advertise: Option<String>,
    /// What fails together with this server (replication, issue 32): no chain holds two
    /// targets of one failure group. Default: the host name. 1 to 255 bytes.
    pub failure_group: Option<String>,
    /// Target specs: `DIR` or `dir:DIR`, or `sim:MODEL:DIR` for a simulated 1990s disk
    /// (`hp97560`, `st31200n`) keeping its data in `DIR` (see `flotilla_store::TargetSpec`).
    pub targets: Vec<PathBuf>,
    pub limits: Limits,
    /// Worker threads executing requests.
    pub workers: usize,
    /// Requests one connection may have queued or executing.
    pub connection_queue_max: usize,
    /// Replies one connection may have waiting to be written.
    pub reply_queue_max: usize,
    /// Connections served at once.
    pub connections_max: usize,
    /// Request and reply data the server holds in memory at once, across all connections
    /// (requests wait, not fail, when it is used up).
    pub data_bytes_in_memory_max: u64,
    pub block_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub disk_queue_max: usize,
    /// Disk threads per `dir` target: block reads and write-backs of one target in flight at
    /// once (queue depth), in `1..=64`; `sim` and `lines` targets always have one.
    pub disk_threads_per_target: usize,
    /// Shards of the cache index, each with its own lock (a power of two in `1..=64`; fewer
    /// are used in a small cache, so that windows stay at least half the cache or 64 MiB), so
    /// cache hits on different blocks do not contend.
    pub cache_shards: usize,
    pub fd_cache_max: usize,
    /// Reads and writes parked at once while their blocks load from disk, holding no worker
    /// thread (issue 12), in `0..=PARKED_REQUESTS_MAX_LIMIT`; when full, a worker waits for
    /// the disk as before. 0 turns parking off.
    pub parked_requests_max: usize,
    /// Dirty blocks older than this are written back.
    pub dirty_age_max_ms: u64,
    /// The WriteFull policy (the ENWRICH paper's traditional-caching baseline): a cached block
    /// goes to disk as soon as writes have covered all of it; off (the default), dirty blocks
    /// are written back on eviction, sync and age.
    pub write_full: bool,
    /// Ask the kernel for the cache's memory in transparent huge pages (one mapping for all
    /// blocks): far fewer TLB misses when requests copy small records out of many blocks. A
    /// hint: where huge pages are off, the cache takes small pages and works the same.
    pub cache_huge_pages: bool,
    /// A piece of a request covering at least this many bytes of whole cache blocks on a
    /// `dir` target goes straight between the request or reply buffer and the fork file
    /// (`pwritev`/`preadv` through the kernel's page cache, CRC32C computed or checked once),
    /// not through the server's cache; smaller and strided pieces, and `sim` and `lines`
    /// targets, keep the cache. 0: every piece goes through the cache.
    pub bulk_bytes_min: u64,
    /// Heartbeat period, unless the metadata service asks for another.
    pub heartbeat_ms: u64,
    /// A connection silent this long with nothing in flight is closed.
    pub idle_timeout_ms: u64,
    /// A frame must arrive whole within this long of its first byte.
    pub frame_read_timeout_ms: u64,
    /// A reply that cannot be written within this long (peer not reading) drops the
    /// connection and releases its memory.
    pub reply_stall_ms_max: u64,
    /// TCP keepalive: idle time before the first probe.
    pub keepalive_idle_ms: u64,
    /// Connections served at once from one peer IP address.
    pub connections_per_peer_max: usize,
    /// The server credential (`server.cred`); the CLI also takes `--key` and `FLOTILLA_KEY`.
    pub key: Option<PathBuf>,
    /// `mac` (default): every frame carries a keyed integrity tag; `encrypt`: frames are
    /// encrypted (AES-256-GCM); `none`: CRC32C only. A connection uses the stronger of its
    /// two sides' settings.
    pub integrity: flotilla_auth::Integrity,
    /// A connection must finish its handshake within this long of being accepted.
    pub handshake_timeout_ms: u64,
    /// Connections in their handshake at once (not yet authenticated: a pool of their own,
    /// apart from `connections_max`; when full, the address with the most is evicted from).
    pub handshakes_max: usize,
    /// Handshakes one IP address may start per second, on average (a token bucket) ...
    pub handshakes_per_peer_per_second_max: u32,
    /// ... and at once after a quiet spell (the bucket's depth).
    pub handshake_burst_per_peer_max: u32,
    /// A frame being read or a reply being written must move at least `progress_bytes_min`
    /// bytes (or the rest) in every window of this long, else the connection ends and what
    /// it held is released.
    pub progress_interval_ms: u64,
    /// See `progress_interval_ms`.
    pub progress_bytes_min: u64,
    /// A frame that has waited this long for more of `data_bytes_in_memory_max` may grow
    /// past it in the one overdraft lane (frames growing as their bytes arrive never wait
    /// on each other for ever; memory stays within two budgets).
    pub overdraft_wait_ms: u64,
    /// Request and reply data one connection may hold of `data_bytes_in_memory_max` at
    /// once (a larger request alone); past it, that connection's requests wait, not others'.
    pub connection_data_bytes_max: u64,
    /// ENWRICH flushes (job, generation, file) in progress at once.
    pub flush_sessions_max: usize,
    /// Members one ENWRICH job may have.
    pub flush_members_max: u32,
    /// Directory entries one member may send in one flush.
    pub flush_entries_max: usize,
    /// How long a flush waits for a member's directory, or for its answer to a pull,
    /// before it fails naming the member.
    pub flush_member_wait_ms: u64,
    /// Bytes of one flush block: the unit pulled from the members and written while the
    /// next is pulled (two are in memory at most per flush, from the data budget).
    pub flush_block_bytes: u64,
    /// Pieces one flush block may gather (each one pulled range).
    pub flush_segments_per_step_max: usize,
    /// Count bytes, operations, latencies and jobs for the metrics and `flotilla jobs`
    /// (relaxed atomics; off only to measure their cost).
    pub metrics: bool,
    /// Jobs counted separately; when full, jobs without a connection are folded into `other`.
    pub jobs_max: usize,
    /// Jobs listed by `flotilla jobs` and labelled in the metrics (the busiest; the rest are
    /// `other`); at most 1000.
    pub jobs_listed_max: usize,
    /// The tertiary tier of the server's lines targets (`[server.archive]`; none: no tier).
    pub archive: Option<ArchiveSettings>,
    /// Replication (issue 32): longest wait for a chain successor's answer to one forward
    /// (also its connect timeout); a version change of the chain ends the wait sooner.
    pub chain_forward_timeout_ms: u64,
    /// Once a successor fails, the longest wait for the chain's next version (the metadata
    /// service fences a silent member after its `fence_after_ms`): about `fence_after_ms +
    /// lease_ms` and a margin. Past it the pending request is answered `Unavailable`.
    pub chain_change_wait_ms: u64,
    /// Pause between tries of a failed successor while waiting for the next version (each
    /// try also asks the metadata service for news).
    pub chain_retry_ms: u64,
    /// Changes a chain's head keeps in flight (sent, not yet acknowledged by the tail).
    pub chain_window_max: usize,
    /// Longest time a member holds a forward that arrived ahead of its predecessor's
    /// earlier ones (pipelined forwards may arrive out of order) before refusing it as a
    /// gap, which sends the predecessor back to retransmitting in order.
    pub chain_gap_wait_ms: u64,
    /// Largest piece of a fork one step of a resync copy carries (read from this server's
    /// store and sent to the syncing member in one forward).
    pub chain_copy_chunk_bytes: u64,
    /// How often a copy source looks for a resync to make or report besides every new
    /// chain view.
    pub chain_resync_period_ms: u64,
    /// Bytes per second every resync copy of this server takes together (a token bucket;
    /// 0: unlimited), so a rebuild leaves foreground programs most of the bandwidth.
    pub resync_bytes_per_s: u64,
    /// Bound on the estimated bytes of one chain's resync record (what a serving member
    /// applied while another member was out, per fork ranges): past it the record is
    /// dropped and a returning member gets the whole copy.
    pub resync_record_bytes_max: u64,
    /// Background scrub (issue 32): bytes per second this server reads back from disk and
    /// checks against their checksums, over its serving members of replicated subfiles,
    /// repairing bad blocks from another member; 0 turns it off.
    pub scrub_bytes_per_s: u64,
    /// Bytes one background scrub step checks (under its chain's lock, as a repair).
    pub scrub_step_bytes: u64,
}

impl ServerConfig {
    /// Checks the settings the server itself bounds (the store checks its own).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.parked_requests_max > PARKED_REQUESTS_MAX_LIMIT {
            return Err(ConfigError {
                name: "parked_requests_max",
                value: self.parked_requests_max as u64,
                reason: format!("at most {PARKED_REQUESTS_MAX_LIMIT} (0 turns parking off)"),
            });
        }
        Ok(())
    }
}

/// An archive and its migration policy (RAMA §4.2.3; docs/architecture.md "Tertiary tier").
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiveSettings {
    /// A directory (absolute path or `file:///DIR`) or `s3://BUCKET/PREFIX` (endpoint and
    /// credentials from the `AWS_*` environment variables).
    pub url: String,
    /// A fork is archived once its newest unarchived block is this old.
    pub archive_age_s: u64,
    /// Forks at most this large are kept on disk in preference to larger ones.
    pub keep_small_bytes: u64,
    /// How much older the clean blocks of a larger fork count when space is reclaimed.
    pub large_age_bias_s: u32,
    /// Reclaim starts below this percentage of free space ...
    pub free_low_percent: u8,
    /// ... and stops at this one.
    pub free_high_percent: u8,
    /// How often each target's migration manager scans its line descriptors.
    pub scan_interval_ms: u64,
    /// One recall fetches this much around the block read.
    pub recall_extent_bytes: u64,
    /// Longest wait for one archive call.
    pub timeout_ms: u64,
    /// Retries of a failed S3 request.
    pub retries_max: usize,
    /// Part size of an upload.
    pub part_bytes: usize,
}

impl Default for ArchiveSettings {
    fn default() -> Self {
        let policy = flotilla_store::TierPolicy::default();
        let options = flotilla_archive::ArchiveOptions::default();
        ArchiveSettings {
            url: String::new(),
            archive_age_s: policy.archive_age_s,
            keep_small_bytes: policy.keep_small_bytes,
            large_age_bias_s: policy.large_age_bias_s,
            free_low_percent: policy.free_low_percent,
            free_high_percent: policy.free_high_percent,
            scan_interval_ms: policy.scan_interval_ms,
            recall_extent_bytes: policy.recall_extent_bytes,
            timeout_ms: options.timeout.as_millis() as u64,
            retries_max: options.retries_max,
            part_bytes: options.part_bytes,
        }
    }
}

impl ArchiveSettings {
    /// Opens the archive and pairs it with the policy.
    pub fn open(&self) -> Result<flotilla_store::TierConfig, flotilla_archive::ArchiveError> {
        let options = flotilla_archive::ArchiveOptions {
            timeout: std::time::Duration::from_millis(self.timeout_ms.max(1)),
            retries_max: self.retries_max,
            part_bytes: self.part_bytes,
        };
        let archive = flotilla_archive::Archive::open(&self.url, options)?;
        Ok(flotilla_store::TierConfig { archive: std::sync::Arc::new(archive), policy: self.policy() })
    }

    pub fn policy(&self) -> flotilla_store::TierPolicy {
        flotilla_store::TierPolicy {
            archive_age_s: self.archive_age_s,
            keep_small_bytes: self.keep_small_bytes,
            large_age_bias_s: self.large_age_bias_s,
            free_low_percent: self.free_low_percent,
            free_high_percent: self.free_high_percent,
            scan_interval_ms: self.scan_interval_ms,
            recall_extent_bytes: self.recall_extent_bytes,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            meta: "127.0.0.1:7770".to_string(),
            listen: "127.0.0.1:0".to_string(),
            advertise: None,
            failure_group: None,
            targets: Vec::new(),
            limits: Limits::default(),
            workers: 4,
            connection_queue_max: 64,
            reply_queue_max: 64,
            connections_max: 1024,
            data_bytes_in_memory_max: 32 << 20,
            block_bytes: 32 << 10,
            cache_capacity_bytes: 256 << 20,
            disk_queue_max: 4096,
            disk_threads_per_target: flotilla_store::StoreConfig::default().disk_threads_per_target,
            cache_shards: flotilla_store::CACHE_SHARDS_DEFAULT,
            fd_cache_max: 256,
            parked_requests_max: PARKED_REQUESTS_MAX_DEFAULT,
            dirty_age_max_ms: 5000,
            write_full: false,
            cache_huge_pages: true,
            bulk_bytes_min: flotilla_store::BULK_BYTES_MIN_DEFAULT,
            heartbeat_ms: 1000,
            idle_timeout_ms: 600_000,
            frame_read_timeout_ms: 30_000,
            reply_stall_ms_max: 30_000,
            keepalive_idle_ms: 60_000,
            connections_per_peer_max: 256,
            key: None,
            integrity: flotilla_auth::Integrity::Mac,
            handshake_timeout_ms: 3_000,
            handshakes_max: 256,
            handshakes_per_peer_per_second_max: 1000,
            handshake_burst_per_peer_max: 2000,
            progress_interval_ms: 500,
            progress_bytes_min: 64 << 10,
            overdraft_wait_ms: 200,
            connection_data_bytes_max: 16 << 20,
            flush_sessions_max: 64,
            flush_members_max: 4096,
            flush_entries_max: 1 << 20,
            flush_member_wait_ms: 10_000,
            flush_block_bytes: 1 << 20,
            flush_segments_per_step_max: 1 << 16,
            metrics: true,
            jobs_max: 1024,
            jobs_listed_max: 20,
            archive: None,
            chain_forward_timeout_ms: 10_000,
            chain_change_wait_ms: 10_000,
            chain_retry_ms: 200,
            chain_window_max: flotilla_replica::FORWARD_WINDOW_MAX,
            chain_gap_wait_ms: 1000,
            chain_copy_chunk_bytes: 1 << 20,
            chain_resync_period_ms: 1000,
            resync_bytes_per_s: 200_000_000,
            resync_record_bytes_max: 16 << 20,
            scrub_bytes_per_s: 4 << 20,
            scrub_step_bytes: 1 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_requests_max_is_bounded_and_named() {
        let mut config = ServerConfig { parked_requests_max: 0, ..ServerConfig::default() };
        assert_eq!(config.validate(), Ok(()));
        config.parked_requests_max = PARKED_REQUESTS_MAX_LIMIT + 1;
        let error = config.validate().unwrap_err();
        assert_eq!(error.name, "parked_requests_max");
        assert!(error.to_string().contains("parked_requests_max = 65537"), "{error}");
    }
}
