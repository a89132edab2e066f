//! Replication's control plane from the command line (issue 32): the chain report of
//! `flotilla status` and replicated creates, over a raw metadata connection (the client
//! library learns replicated files with the data path).

use anyhow::Context;
use flotilla_proto::{
    ChainInfo, ChainMemberState, ChainReport, MemberHealth, MetaReply, MetaRequest, TargetChains,
};
use flotilla_rpc::{Connection, ConnectionConfig};
use flotilla_types::TargetId;
use std::collections::BTreeMap;

/// Sends one request to the metadata service at `meta` with the client credential.
fn call(meta: &str, request: &MetaRequest) -> anyhow::Result<MetaReply> {
    let auth = crate::keys::client_auth()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // `meta` may list every node of a metadata group: the leader answers, a follower names
    // it (`NotServed::NotLeader`), and during an election the call waits (bounded).
    let mut addrs: Vec<String> =
        meta.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
    anyhow::ensure!(!addrs.is_empty(), "no metadata address given");
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    let mut next = 0usize;
    runtime.block_on(async {
        loop {
            let addr = addrs[next % addrs.len()].clone();
            next += 1;
            let outcome = async {
                let connection = Connection::connect(&addr, ConnectionConfig::with_auth(auth.clone()))
                    .await
                    .context("connect to the metadata service")?;
                let (reply, _) =
                    connection.call::<MetaRequest, MetaReply>(request, bytes::Bytes::new()).await?;
                anyhow::Ok(reply)
            }
            .await;
            match outcome {
                Ok(MetaReply::NotServed(flotilla_proto::NotServed::NotLeader { leader: Some(leader) })) => {
                    if !addrs.contains(&leader) {
                        addrs.push(leader.clone());
                    }
                    next = addrs.iter().position(|a| *a == leader).unwrap_or(next);
                }
                Ok(MetaReply::NotServed(_)) | Err(_) if std::time::Instant::now() < deadline => {}
                other => return other,
            }
            if next.is_multiple_of(addrs.len()) {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    })
}

/// How long a chain request looks for the leader of a metadata group.
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// `flotilla target drain|remove TARGET`: asks the metadata service to move every chain
/// off `target` (drain) or to declare it dead now (remove); returns once the change is
/// durable (the copies then run in the background: `flotilla status` shows them).
pub fn target_admin(
    meta: &str,
    target: TargetId,
    action: flotilla_proto::TargetAction,
) -> anyhow::Result<()> {
    match call(meta, &MetaRequest::TargetAdmin { target, action })? {
        MetaReply::Done => Ok(()),
        MetaReply::Error(error) => Err(anyhow::anyhow!("{action} target {target}: {error}")),
        other => anyhow::bail!("unexpected reply to a target {action}: {other:?}"),
    }
}

/// The chain report, or `None` from a service that predates chains.
pub fn report(meta: &str, with_chains: bool) -> anyhow::Result<Option<ChainReport>> {
    match call(meta, &MetaRequest::ChainStatus { chains: with_chains })? {
        MetaReply::Chains(report) => Ok(Some(report)),
        MetaReply::Error(error) if error.code == flotilla_proto::ErrorCode::BadRequest => Ok(None),
        MetaReply::Error(error) => Err(error.into()),
        other => anyhow::bail!("unexpected reply to a chain status: {other:?}"),
    }
}

fn health_name(health: MemberHealth) -> &'static str {
    match health {
        MemberHealth::Up => "up",
        MemberHealth::Down => "down",
        MemberHealth::Dead => "dead",
        MemberHealth::Draining => "draining",
        MemberHealth::Unplaced => "unplaced",
    }
}

/// The chain fields of each target's status line, by target.
pub fn target_fields(report: &ChainReport) -> BTreeMap<TargetId, String> {
    let field = |t: &TargetChains| {
        format!(
            "group={} health={} chains={} degraded={}",
            quote(&t.failure_group),
            match (t.health, t.chains) {
                // The drain finished: it holds no chain any more (and takes no new one).
                (MemberHealth::Draining, 0) => "drained",
                (health, _) => health_name(health),
            },
            t.chains,
            t.degraded
        )
    };
    report.targets.iter().map(|t| (t.target, field(t))).collect()
}

/// The summary line and, when listed, one line per chain.
pub fn summary_lines(report: &ChainReport) -> Vec<String> {
    let mut lines = vec![format!(
        "chains={} degraded={} unavailable={} replicas={} failure_groups={} rebuilding={} rebuild_bytes_left={}",
        report.chains_total,
        report.chains_degraded,
        report.chains_unavailable,
        report.replicas,
        report.failure_groups,
        report.chains_rebuilding,
        report.rebuild_bytes_left
    )];
    lines.extend(report.chains.iter().map(chain_line));
    lines
}

fn chain_line(chain: &ChainInfo) -> String {
    let members: Vec<String> = chain
        .members
        .iter()
        .map(|m| {
            let state = match m.state {
                ChainMemberState::Serving => "serving".to_string(),
                ChainMemberState::Syncing { missed_since, .. } => format!("syncing@{missed_since}"),
                ChainMemberState::Offline { missed_since, .. } => format!("offline@{missed_since}"),
                ChainMemberState::Dead => "dead".to_string(),
            };
            format!("{}:{state}", m.target)
        })
        .collect();
    format!("chain={} version={} members={}", chain.chain, chain.version, members.join(","))
}

/// The report as JSON (under `"chain_table"` of `status --json`).
pub fn json(report: &ChainReport) -> serde_json::Value {
    let targets: Vec<serde_json::Value> = report
        .targets
        .iter()
        .map(|t| {
            serde_json::json!({
                "target": t.target.to_string(), "failure_group": t.failure_group,
                "health": health_name(t.health), "incarnation": t.incarnation,
                "chains": t.chains, "degraded": t.degraded,
            })
        })
        .collect();
    let chains: Vec<serde_json::Value> = report
        .chains
        .iter()
        .map(|c| serde_json::json!({ "chain": c.chain, "version": c.version, "line": chain_line(c) }))
        .collect();
    serde_json::json!({
        "replicas": report.replicas, "failure_groups": report.failure_groups,
        "chains": report.chains_total, "degraded": report.chains_degraded,
        "unavailable": report.chains_unavailable, "targets": targets, "list": chains,
        "rebuilding": report.chains_rebuilding, "rebuild_bytes_left": report.rebuild_bytes_left,
    })
}

fn quote(text: &str) -> String {
    if text.chars().any(|c| c.is_whitespace() || c == '"') {
        format!("{text:?}")
    } else {
        text.to_string()
    }
}
