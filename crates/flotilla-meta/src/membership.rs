//! Which targets are alive, on which server, with how much space.

use flotilla_namespace::{TargetRecord, TargetUsage};
use flotilla_proto::{TargetReport, TargetState, TargetStatus};
use flotilla_types::TargetId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
struct Member {
    server: String,
    last_seen: Instant,
    used_bytes: u64,
    free_bytes: u64,
}

/// Live view of targets, rebuilt from registrations and heartbeats after a restart.
pub(crate) struct Membership {
    members: Mutex<HashMap<TargetId, Member>>,
    down_after: Duration,
    /// The server credential that first reported each target (since this start).
    owners: Mutex<HashMap<TargetId, String>>,
}

impl Membership {
    pub fn new(down_after: Duration) -> Membership {
        Membership { members: Mutex::new(HashMap::new()), down_after, owners: Mutex::new(HashMap::new()) }
    }

    /// Binds every target in `targets` to `credential`, refusing a target another
    /// credential holds and more than `targets_max` targets in one report.
    pub fn bind(&self, credential: &str, targets: &[TargetReport], targets_max: usize) -> Result<(), String> {
        if targets.len() > targets_max {
            return Err(format!(
                "server credential {credential:?} reports {} targets, over targets_per_server_max = {targets_max}",
                targets.len()
            ));
        }
        let mut owners = self.owners.lock();
        if let Some((target, owner)) = targets
            .iter()
            .find_map(|r| owners.get(&r.target).filter(|o| *o != credential).map(|o| (r.target, o)))
        {
            return Err(format!(
                "target {target} is bound to server credential {owner:?}; {credential:?} may not report it"
            ));
        }
        for report in targets {
            owners.entry(report.target).or_insert_with(|| credential.to_string());
        }
        Ok(())
    }

    fn owner(&self, target: TargetId) -> String {
        self.owners.lock().get(&target).cloned().unwrap_or_default()
    }

    /// Records a report; returns the targets that are new or moved to another server.
    pub fn report(&self, server: &str, targets: &[TargetReport]) -> Vec<TargetReport> {
        let now = Instant::now();
        let mut members = self.members.lock();
        let mut changed = Vec::new();
        for report in targets {
            let member = Member {
                server: server.to_string(),
                last_seen: now,
                used_bytes: report.used_bytes,
                free_bytes: report.free_bytes,
            };
            let previous = members.insert(report.target, member);
            if previous.is_none_or(|p| p.server != server) {
                changed.push(report.clone());
            }
        }
        changed
    }

    fn is_up(&self, member: &Member) -> bool {
        member.last_seen.elapsed() < self.down_after
    }

    /// Live targets and their usage, for placement.
    pub fn live(&self) -> Vec<TargetUsage> {
        let members = self.members.lock();
        members
            .iter()
            .filter(|(_, m)| self.is_up(m))
            .map(|(target, m)| TargetUsage {
                target: *target,
                used_bytes: m.used_bytes,
                free_bytes: m.free_bytes,
            })
            .collect()
    }

    /// Server address and state of one target, if it has been heard from since start.
    pub fn place(&self, target: TargetId) -> Option<(String, bool)> {
        let members = self.members.lock();
        members.get(&target).map(|m| (m.server.clone(), self.is_up(m)))
    }

    /// Status of every target: those heard from, and those only remembered.
    pub fn status(&self, remembered: &[TargetRecord]) -> Vec<TargetStatus> {
        let members = self.members.lock();
        let mut out: Vec<TargetStatus> = members
            .iter()
            .map(|(target, m)| TargetStatus {
                target: *target,
                server: m.server.clone(),
                state: if self.is_up(m) { TargetState::Up } else { TargetState::Down },
                used_bytes: m.used_bytes,
                free_bytes: m.free_bytes,
                credential: self.owner(*target),
            })
            .collect();
        for record in remembered.iter().filter(|r| !members.contains_key(&r.target)) {
            out.push(TargetStatus {
                target: record.target,
                server: record.server_addr.clone(),
                state: TargetState::Down,
                used_bytes: record.used_bytes,
                free_bytes: record.free_bytes,
                credential: self.owner(record.target),
            });
        }
        out.sort_by(|a, b| a.server.cmp(&b.server).then(a.target.cmp(&b.target)));
        out
    }
}
