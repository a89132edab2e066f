//! Settings of the metadata service.

use flotilla_namespace::SUBFILE_COUNT_MAX;
use flotilla_types::{CallerPolicy, LayoutBounds};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The documented default address of the metadata service.
pub const DEFAULT_META_ADDR: &str = "127.0.0.1:7770";

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// A client session's open files are forgotten when it has not renewed them for this long
    /// (a crashed client); no orphan is released before this long after start.
    pub open_lease_ms: u64,
    /// After a restart, for this long every unlinked file is kept as if open and no orphan is
    /// released, while clients re-announce their opens (they renew every `open_renew_ms`,
    /// 1 s by default, which must stay well under this).
    pub open_reclaim_ms: u64,
    /// Files one client session may hold open.
    pub open_files_per_session_max: usize,
    /// Client sessions holding open files at once.
    pub open_sessions_max: usize,
    /// After a restart, a create waits up to this long for the targets the namespace
    /// remembers to register again before it fails for want of live targets.
    pub recovery_window_ms: u64,
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
    /// it held is released (also bounds the wait for a frame's integrity tag).
    pub progress_interval_ms: u64,
    /// See `progress_interval_ms`.
    pub progress_bytes_min: u64,
    /// A frame that has waited this long for more of `frame_bytes_in_memory_max` may grow
    /// past it in the one overdraft lane.
    pub overdraft_wait_ms: u64,
    /// A frame's integrity tag must arrive within this long after its frame.
    pub tag_read_timeout_ms: u64,
    /// Targets one server credential may register.
    pub targets_per_server_max: usize,
    /// Memory all connections' incoming frames may hold at once: a frame reserves its bytes
    /// as they arrive, and keeps them until its reply is written.
    pub frame_bytes_in_memory_max: u64,
    /// A connection silent this long with nothing in flight is closed.
    pub idle_timeout_ms: u64,
    /// A frame must arrive whole within this long of its first byte.
    pub frame_read_timeout_ms: u64,
    /// A reply that cannot be written within this long (peer not reading) drops the
    /// connection and releases what its requests hold.
    pub reply_stall_ms_max: u64,
    /// TCP keepalive: idle time before the first probe.
    pub keepalive_idle_ms: u64,
    /// Connections served at once from one peer IP address.
    pub connections_per_peer_max: usize,
    /// The policy every connection starts with (unrestricted by default; an authenticated
    /// peer's credential will narrow it).
    pub default_policy: CallerPolicy,
    /// How long a capability the service hands out stays valid; clients renew at half.
    pub capability_lifetime_ms: u64,
    /// ENWRICH job groups that may exist at once.
    pub jobs_max: usize,
    /// Members one job group may have.
    pub job_members_max: u32,
    /// Longest a `JobWait` long-poll is held before it is answered anyway.
    pub job_wait_ms_max: u64,
    /// A job none of whose remaining members was heard from for this long is forgotten.
    pub job_member_lease_ms: u64,
    /// Group commit: most namespace changes one durable commit (one `fsync`) covers.
    pub commit_batch_ops_max: usize,
    /// Byte-range locks (fcntl, flock) held in the whole cluster.
    pub locks_max: usize,
    /// Longest one blocking lock request waits before it is answered (the mount asks again).
    pub lock_wait_ms_max: u64,
    /// Lock requests waiting at once (each holds one of the service's blocking threads while
    /// it waits); beyond, a request is answered at once with the conflicting lock.
    pub lock_waiters_max: usize,
    /// After a restart (not on a new database), for this long only the locks clients held
    /// before are granted, as they reclaim them (`ReclaimLocks`); new lock requests are
    /// answered `Recovering` and asked again. Clients reclaim within about a second of
    /// reconnecting (their outage backoff is at most 1 s), so this must stay well above that.
    pub lock_reclaim_ms: u64,
    /// Byte-range tokens (client cache coherence) held in the whole cluster.
    pub tokens_max: usize,
    /// Longest a token request waits for holders to give their tokens back, and longest a
    /// client's revocation poll is held, before either is answered (the client asks again).
    pub token_wait_ms_max: u64,
    /// Token requests waiting for holders at once; beyond, one is answered busy at once.
    pub token_waiters_max: usize,
    /// Revocation polls held at once (one per client with tokens; each holds one of the
    /// service's blocking threads, of which there are 512, while it waits).
    pub token_pollers_max: usize,
    /// After a restart (not on a new database), no token is granted for this long, so that
    /// clients that held tokens learn they were lost before anyone else is given them.
    pub token_recovery_ms: u64,
    /// Inode tokens (attribute and name leases, `LookupCached`) one client session may
    /// hold; past it a lookup is answered without grants (the client does not cache it).
    pub attr_tokens_per_session_max: usize,
    /// Inode tokens held in the whole cluster.
    pub attr_tokens_max: usize,
    /// Group commit: longest the committer waits for changes still being applied to join
    /// its batch (a change is acknowledged only after its batch commits).
    pub commit_batch_delay_us_max: u64,
    /// Group commit: longest the committer waits, with nothing being applied, for the
    /// writers answered by the last batch to send their next change (0: never waits).
    pub commit_batch_linger_us_max: u64,
    /// Smallest stripe unit or hash block a layout may have (create, `layout set`, the
    /// `user.flotilla.layout` attribute); default 4 KiB.
    pub layout_unit_bytes_min: u64,
    /// Largest stripe unit, and largest hash run (block times sequentiality); default 1 GiB.
    pub layout_unit_bytes_max: u64,
    /// Largest subfile count a layout may name, at most 65536 (the default).
    pub layout_count_max: u32,
    /// Replication (issue 32): how long a heartbeat reply lets a server serve chain I/O,
    /// from when it sent the heartbeat; must exceed `heartbeat_ms` (checked).
    pub lease_ms: u64,
    /// Allowance for clock rate drift between the service and a server.
    pub clock_margin_ms: u64,
    /// A target silent this long is taken out of its chains (offline); must exceed
    /// `lease_ms + clock_margin_ms`.
    pub fence_after_ms: u64,
    /// A target silent this long is declared dead and replaced in its chains.
    pub dead_after_ms: u64,
    /// Chains each target is built into (1..=64).
    pub chains_per_target: usize,
    /// Members of every chain of the chain table (1..=7): the table is built once the
    /// targets span this many failure groups.
    pub chain_replicas: usize,
    /// This service's id in its metadata group (issue 33); 0 (the default): no group, the
    /// direct path.
    pub node_id: u64,
    /// The group's members: `ID=META_ADDR[/GROUP_ADDR],…` (a group address left out is the
    /// metadata address's port plus one); needed with `node_id`.
    pub peers: String,
    /// The meta-role credential a group node authenticates its peer links with.
    pub group_key: Option<PathBuf>,
    /// Raft heartbeat interval of the group.
    pub group_heartbeat_ms: u64,
    /// A follower hearing no leader for a time in this range starts an election.
    pub group_election_timeout_ms_min: u64,
    pub group_election_timeout_ms_max: u64,
    /// Most changes in one proposal (one log entry).
    pub group_batch_changes_max: usize,
    /// Most bytes of changes in one proposal.
    pub group_batch_bytes_max: usize,
    /// Proposals (batches) in flight at once; more changes wait and are batched.
    pub group_proposals_in_flight_max: usize,
    /// Most committed log entries a node applies in one namespace transaction.
    pub group_apply_run_entries_max: usize,
    /// A change or read the group cannot confirm within this long is answered `NoQuorum`.
    pub quorum_wait_ms: u64,
    /// A node joining a group that runs already (`flotilla meta --join`): it never
    /// initializes a group, and waits, empty, until the leader adds it (`flotilla meta add`).
    pub join: bool,
    /// A snapshot of the state machine is built after this many log entries since the last
    /// one; the log entries it covers are then compacted away.
    pub group_snapshot_every_entries: u64,
    /// Log entries kept behind the last snapshot (a follower a little behind catches up from
    /// the log rather than a whole snapshot).
    pub group_log_kept_behind_snapshot_entries: u64,
    /// Most bytes of a snapshot built or received (held in memory while it is sent or
    /// received); a larger one is an error.
    pub group_snapshot_bytes_max: usize,
    /// `flotilla meta add` waits at most this long for the new node to catch up before it
    /// makes it a voter; past it the node stays a learner (run add again).
    pub group_catch_up_wait_ms: u64,
}

/// A `[meta]` setting out of its range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("[meta] {name} = {value} is out of range: {reason}")]
pub struct ConfigError {
    pub name: &'static str,
    pub value: u64,
    pub reason: String,
}

impl MetaConfig {
    /// The layout bounds of `layout_unit_bytes_min`, `layout_unit_bytes_max` and
    /// `layout_count_max`, checked to be usable together.
    pub fn layout_bounds(&self) -> Result<LayoutBounds, ConfigError> {
        let bounds = LayoutBounds {
            unit_bytes_min: self.layout_unit_bytes_min,
            unit_bytes_max: self.layout_unit_bytes_max,
            count_max: self.layout_count_max,
        };
        let error = |name, value, reason: String| Err(ConfigError { name, value, reason });
        if bounds.unit_bytes_min == 0 {
            return error("layout_unit_bytes_min", 0, "must be at least 1".into());
        }
        if bounds.unit_bytes_max < bounds.unit_bytes_min {
            let reason = format!("must be at least layout_unit_bytes_min ({})", bounds.unit_bytes_min);
            return error("layout_unit_bytes_max", bounds.unit_bytes_max, reason);
        }
        if !(1..=SUBFILE_COUNT_MAX).contains(&bounds.count_max) {
            let reason = format!("must be in 1..={SUBFILE_COUNT_MAX}");
            return error("layout_count_max", u64::from(bounds.count_max), reason);
        }
        Ok(bounds)
    }
}

impl MetaConfig {
    /// The membership timing and chain table shape of `[meta]`, checked
    /// (`MembershipConfig::validate`: a cut-off server's lease runs out before it is fenced).
    pub fn membership(&self) -> Result<(flotilla_replica::MembershipConfig, usize, usize), ConfigError> {
        let membership = flotilla_replica::MembershipConfig {
            lease_ms: self.lease_ms,
            clock_margin_ms: self.clock_margin_ms,
            fence_after_ms: self.fence_after_ms,
            dead_after_ms: self.dead_after_ms,
        };
        if let Err(error) = membership.validate() {
            let (name, value) = match error {
                flotilla_replica::ConfigError::DeadBeforeFence { dead, .. } => ("dead_after_ms", dead),
                flotilla_replica::ConfigError::Zero { .. } => ("lease_ms", 0),
                _ => ("fence_after_ms", self.fence_after_ms),
            };
            return Err(ConfigError { name, value, reason: error.to_string() });
        }
        if self.lease_ms <= self.heartbeat_ms {
            let reason = format!(
                "must exceed heartbeat_ms ({}): servers heartbeat at that period, and a lease \
                 shorter than it runs out between two heartbeats, stalling every replicated write",
                self.heartbeat_ms
            );
            return Err(ConfigError { name: "lease_ms", value: self.lease_ms, reason });
        }
        let cpt_max = flotilla_replica::CHAINS_PER_TARGET_MAX;
        if !(1..=cpt_max).contains(&self.chains_per_target) {
            let reason = format!("must be in 1..={cpt_max}");
            return Err(ConfigError {
                name: "chains_per_target",
                value: self.chains_per_target as u64,
                reason,
            });
        }
        let replicas_max = flotilla_replica::REPLICAS_MAX;
        if !(1..=replicas_max).contains(&self.chain_replicas) {
            let reason = format!("must be in 1..={replicas_max}");
            return Err(ConfigError { name: "chain_replicas", value: self.chain_replicas as u64, reason });
        }
        Ok((membership, self.chain_replicas, self.chains_per_target))
    }
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
            open_lease_ms: 30_000,
            open_reclaim_ms: 5_000,
            open_files_per_session_max: 65_536,
            open_sessions_max: 16_384,
            recovery_window_ms: 10_000,
            key: None,
            integrity: flotilla_auth::Integrity::Mac,
            handshake_timeout_ms: 3_000,
            handshakes_max: 256,
            handshakes_per_peer_per_second_max: 1000,
            handshake_burst_per_peer_max: 2000,
            progress_interval_ms: 500,
            progress_bytes_min: 64 << 10,
            overdraft_wait_ms: 200,
            tag_read_timeout_ms: 30_000,
            targets_per_server_max: 64,
            frame_bytes_in_memory_max: 64 << 20,
            idle_timeout_ms: 600_000,
            frame_read_timeout_ms: 30_000,
            reply_stall_ms_max: 30_000,
            keepalive_idle_ms: 60_000,
            connections_per_peer_max: 1024,
            default_policy: CallerPolicy::default(),
            capability_lifetime_ms: 600_000,
            jobs_max: 1024,
            job_members_max: 4096,
            job_wait_ms_max: 1000,
            job_member_lease_ms: 30_000,
            commit_batch_ops_max: 1024,
            commit_batch_delay_us_max: 2000,
            commit_batch_linger_us_max: 1000,
            locks_max: 1 << 20,
            lock_wait_ms_max: 1000,
            lock_waiters_max: 64,
            lock_reclaim_ms: 5_000,
            tokens_max: 1 << 20,
            token_wait_ms_max: 1000,
            token_waiters_max: 256,
            token_pollers_max: 256,
            token_recovery_ms: 3000,
            attr_tokens_per_session_max: 1 << 17,
            attr_tokens_max: 1 << 22,
            layout_unit_bytes_min: flotilla_types::LAYOUT_UNIT_BYTES_MIN,
            layout_unit_bytes_max: flotilla_types::LAYOUT_UNIT_BYTES_MAX,
            layout_count_max: flotilla_types::LAYOUT_COUNT_MAX,
            lease_ms: flotilla_replica::MembershipConfig::default().lease_ms,
            clock_margin_ms: flotilla_replica::MembershipConfig::default().clock_margin_ms,
            fence_after_ms: flotilla_replica::MembershipConfig::default().fence_after_ms,
            dead_after_ms: flotilla_replica::MembershipConfig::default().dead_after_ms,
            chains_per_target: 8,
            chain_replicas: 2,
            node_id: 0,
            peers: String::new(),
            group_key: None,
            group_heartbeat_ms: 100,
            group_election_timeout_ms_min: 500,
            group_election_timeout_ms_max: 1_000,
            group_batch_changes_max: 1024,
            group_batch_bytes_max: 4 << 20,
            group_proposals_in_flight_max: 1,
            group_apply_run_entries_max: 256,
            quorum_wait_ms: 3_000,
            join: false,
            group_snapshot_every_entries: 5_000,
            group_log_kept_behind_snapshot_entries: 1_000,
            group_snapshot_bytes_max: 1 << 30,
            group_catch_up_wait_ms: 60_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_bounds_default_and_refusals() {
        let config = MetaConfig::default();
        assert_eq!(config.layout_bounds(), Ok(LayoutBounds::default()));
        let zero = MetaConfig { layout_unit_bytes_min: 0, ..MetaConfig::default() };
        assert!(zero.layout_bounds().unwrap_err().to_string().contains("layout_unit_bytes_min = 0"));
        let crossed = MetaConfig { layout_unit_bytes_max: 1024, ..MetaConfig::default() };
        assert!(crossed.layout_bounds().unwrap_err().to_string().contains("layout_unit_bytes_max = 1024"));
        let wide = MetaConfig { layout_count_max: SUBFILE_COUNT_MAX + 1, ..MetaConfig::default() };
        assert!(wide.layout_bounds().unwrap_err().to_string().contains("layout_count_max"));
    }

    #[test]
    fn membership_settings_are_checked_for_safety() {
        assert!(MetaConfig::default().membership().is_ok());
        let early = MetaConfig { fence_after_ms: 3_500, ..MetaConfig::default() };
        let text = early.membership().unwrap_err().to_string();
        assert!(text.contains("fence_after_ms = 3500") && text.contains("lease_ms (3000)"), "{text}");
        let dead = MetaConfig { dead_after_ms: 10, ..MetaConfig::default() };
        assert!(dead.membership().unwrap_err().to_string().contains("dead_after_ms = 10"));
        let wide = MetaConfig { chains_per_target: 65, ..MetaConfig::default() };
        assert!(wide.membership().unwrap_err().to_string().contains("chains_per_target = 65"));
        let between = MetaConfig {
            lease_ms: 400,
            clock_margin_ms: 100,
            fence_after_ms: 1_000,
            ..MetaConfig::default()
        };
        let text = between.membership().unwrap_err().to_string();
        assert!(text.contains("lease_ms = 400") && text.contains("heartbeat_ms (1000)"), "{text}");
        let short = MetaConfig { heartbeat_ms: 200, ..between };
        assert!(short.membership().is_ok());
        let many = MetaConfig { chain_replicas: 8, ..MetaConfig::default() };
        assert!(many.membership().unwrap_err().to_string().contains("chain_replicas = 8"));
    }
}
