//! `flotilla meta add|remove|status` (issue 33): a metadata group's members, changed online
//! through the leader, over a raw metadata connection with the client credential (the caller
//! must be root on a credential neither read-only, squashed nor confined to a subtree).

use anyhow::Context;
use clap::Subcommand;
use flotilla_proto::{GroupMembershipRequest, GroupStatus, MetaReply, MetaRequest, NotServed};
use flotilla_rpc::{Connection, ConnectionConfig};
use std::time::{Duration, Instant};

/// Pause between tries while no leader answers.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

#[derive(Subcommand)]
pub enum MetaAction {
    /// Add node NODE_ID to the group online: it becomes a learner, catches up from the log
    /// or a snapshot, then a voter. Start the node first with `flotilla meta --join`.
    Add {
        node_id: u64,
        /// `META_ADDR[/GROUP_ADDR]`: where clients reach the node, and its peers (default:
        /// the metadata port plus one).
        address: String,
        #[command(flatten)]
        target: GroupTarget,
    },
    /// Remove node NODE_ID from the group online (not its last voter).
    Remove {
        node_id: u64,
        #[command(flatten)]
        target: GroupTarget,
    },
    /// Each node's view: its role, term, leader, applied index; the members as the leader
    /// sees them (voter or learner, the log index each holds).
    Status {
        #[command(flatten)]
        target: GroupTarget,
    },
}

#[derive(clap::Args)]
pub struct GroupTarget {
    /// Every metadata address of the group, `a,b,c` (the leader is found and followed).
    #[arg(long, env = "FLOTILLA_META")]
    meta: String,
    /// Give up after this long without an answer from the leader (an add waits for the new
    /// node to catch up as well, up to the leader's `group_catch_up_wait_ms`).
    #[arg(long, default_value_t = 90_000)]
    wait_ms: u64,
}

impl GroupTarget {
    fn addresses(&self) -> Vec<String> {
        self.meta.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
    }
}

pub fn run(action: MetaAction) -> anyhow::Result<()> {
    match action {
        MetaAction::Add { node_id, address, target } => {
            let peer = flotilla_meta::grouped::parse_peers(&format!("{node_id}={address}"))
                .map_err(|e| anyhow::anyhow!("meta add {node_id} {address}: {e}"))?;
            let peer = peer.into_iter().next().context("no address")?;
            let request = GroupMembershipRequest::Add {
                node_id,
                meta_addr: peer.meta_addr,
                group_addr: peer.group_addr,
            };
            let status = through_leader(&target, request)?;
            println!("added node {node_id}");
            print_members(&status);
        }
        MetaAction::Remove { node_id, target } => {
            let status = through_leader(&target, GroupMembershipRequest::Remove { node_id })?;
            println!("removed node {node_id}");
            print_members(&status);
        }
        MetaAction::Status { target } => {
            let mut leader_view: Option<GroupStatus> = None;
            for addr in target.addresses() {
                match call(
                    &addr,
                    &MetaRequest::GroupMembership(GroupMembershipRequest::Status),
                    wait(&target),
                ) {
                    Ok(MetaReply::GroupStatus(status)) => {
                        println!("{}", node_line(&addr, &status));
                        if status.role == "leader" {
                            leader_view = Some(status);
                        }
                    }
                    Ok(MetaReply::Error(error)) => anyhow::bail!("{addr}: {}", error.message),
                    Ok(other) => println!("node at {addr}: unexpected answer {other:?}"),
                    Err(error) => println!("node at {addr}: unreachable ({error:#})"),
                }
            }
            match leader_view {
                Some(status) => print_members(&status),
                None => println!("no node asked leads"),
            }
        }
    }
    Ok(())
}

fn wait(target: &GroupTarget) -> Duration {
    Duration::from_millis(target.wait_ms.max(1))
}

/// Sends `request` to the leader, following `NotLeader` hints and trying every address
/// until one answers or `wait_ms` passed.
fn through_leader(target: &GroupTarget, request: GroupMembershipRequest) -> anyhow::Result<GroupStatus> {
    let addresses = target.addresses();
    anyhow::ensure!(!addresses.is_empty(), "--meta names no address");
    let deadline = Instant::now() + wait(target);
    let request = MetaRequest::GroupMembership(request);
    let mut hint: Option<String> = None;
    let mut tried = 0usize;
    let mut last = String::from("nothing tried");
    while Instant::now() < deadline {
        let addr = hint.take().unwrap_or_else(|| addresses[tried % addresses.len()].clone());
        tried += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        match call(&addr, &request, left) {
            Ok(MetaReply::GroupStatus(status)) => return Ok(status),
            Ok(MetaReply::Error(error)) => anyhow::bail!("{}", error.message),
            Ok(MetaReply::NotServed(NotServed::NotLeader { leader })) => {
                last = format!("{addr} is not the leader (leader: {leader:?})");
                hint = leader;
            }
            Ok(MetaReply::NotServed(reason)) => last = format!("{addr}: {reason}"),
            Ok(other) => anyhow::bail!("{addr}: unexpected answer {other:?}"),
            Err(error) => last = format!("{addr}: {error:#}"),
        }
        if hint.is_none() {
            std::thread::sleep(RETRY_PAUSE);
        }
    }
    anyhow::bail!("no leader of the metadata group answered within {} ms; last: {last}", target.wait_ms)
}

/// One request to the node at `addr` with the client credential, within `timeout`.
fn call(addr: &str, request: &MetaRequest, timeout: Duration) -> anyhow::Result<MetaReply> {
    let auth = crate::keys::client_auth()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let call = async {
            let connection = Connection::connect(addr, ConnectionConfig::with_auth(auth))
                .await
                .context("connect to the metadata service")?;
            let (reply, _) = connection.call::<MetaRequest, MetaReply>(request, bytes::Bytes::new()).await?;
            anyhow::Ok(reply)
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))?
    })
}

fn index(index: Option<u64>) -> String {
    index.map_or("-".into(), |i| i.to_string())
}

fn node_line(addr: &str, status: &GroupStatus) -> String {
    format!(
        "node={} meta={addr} role={} term={} leader={} applied={} log={} snapshot={} purged={}",
        status.node_id,
        status.role,
        status.term,
        index(status.leader),
        index(status.applied_index),
        index(status.last_log_index),
        index(status.snapshot_index),
        index(status.purged_index)
    )
}

fn print_members(status: &GroupStatus) {
    println!("members (as node {} sees them, leader {}):", status.node_id, index(status.leader));
    for member in &status.members {
        println!(
            "member={} meta={} group={} {} log_index={}",
            member.node_id,
            member.meta_addr.as_deref().unwrap_or("-"),
            member.group_addr,
            if member.voter { "voter" } else { "learner" },
            index(member.log_index)
        );
    }
}
