//! Which targets are alive, on which server, with how much space.

use flotilla_namespace::{TargetRecord, TargetUsage};
use flotilla_proto::{ErrorCode, TargetReport, TargetState, TargetStatus, WireError};
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
    /// The target lost its contents: reported, never placed on.
    lost: bool,
}

/// Live view of targets, rebuilt from registrations and heartbeats after a restart.
pub(crate) struct Membership {
    members: Mutex<HashMap<TargetId, Member>>,
    down_after: Duration,
    /// The server credential that first reported each target: loaded from the namespace at
    /// start, and persisted there before a new binding is accepted.
    owners: Mutex<HashMap<TargetId, String>>,
}

impl Membership {
    /// A membership that knows the target bindings `owners` (as persisted).
    pub fn new(down_after: Duration, owners: Vec<(TargetId, String)>) -> Membership {
        Membership {
            members: Mutex::new(HashMap::new()),
            down_after,
            owners: Mutex::new(owners.into_iter().collect()),
        }
    }

    /// Binds every target in `targets` to `credential`, refusing a target another
    /// credential holds and more than `targets_max` targets in one report. Targets not bound
    /// yet are handed to `persist` first (with the lock held, so two credentials never race
    /// for one target); they are bound only if it succeeds, and its error is returned as is.
    pub fn bind(
        &self,
        credential: &str,
        targets: &[TargetReport],
        targets_max: usize,
        persist: impl FnOnce(&[TargetId]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        if targets.len() > targets_max {
            return Err(denied(format!(
                "server credential {credential:?} reports {} targets, over targets_per_server_max = {targets_max}",
                targets.len()
            )));
        }
        let mut owners = self.owners.lock();
        if let Some((target, owner)) = targets
            .iter()
            .find_map(|r| owners.get(&r.target).filter(|o| *o != credential).map(|o| (r.target, o)))
        {
            return Err(denied(format!(
                "target {target} is bound to server credential {owner:?}; {credential:?} may not report it"
            )));
        }
        let mut new: Vec<TargetId> =
            targets.iter().map(|r| r.target).filter(|t| !owners.contains_key(t)).collect();
        new.sort_unstable();
        new.dedup();
        if !new.is_empty() {
            persist(&new)?;
        }
        for target in new {
            owners.insert(target, credential.to_string());
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
                lost: report.lost,
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

    /// Live targets and their usage, for placement (a lost target is not live).
    pub fn live(&self) -> Vec<TargetUsage> {
        let members = self.members.lock();
        members
            .iter()
            .filter(|(_, m)| self.is_up(m) && !m.lost)
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
                state: match (self.is_up(m), m.lost) {
                    (false, _) => TargetState::Down,
                    (true, true) => TargetState::Lost,
                    (true, false) => TargetState::Up,
                },
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

fn denied(message: String) -> WireError {
    WireError::new(ErrorCode::PermissionDenied, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(target: u64) -> TargetReport {
        TargetReport { target: TargetId(target), used_bytes: 0, free_bytes: 1, lost: false }
    }

    #[test]
    fn loaded_bindings_refuse_other_credentials_and_new_ones_are_persisted_once() {
        let membership = Membership::new(Duration::from_secs(1), vec![(TargetId(1), "a".into())]);
        let refused = membership.bind("b", &[report(1)], 8, |_| panic!("nothing new to persist"));
        assert!(refused.unwrap_err().message.contains("bound to server credential \"a\""));
        membership.bind("a", &[report(1)], 8, |_| panic!("nothing new to persist")).unwrap();
        let mut persisted = Vec::new();
        membership
            .bind("b", &[report(2), report(2)], 8, |new| {
                persisted.extend_from_slice(new);
                Ok(())
            })
            .unwrap();
        assert_eq!(persisted, vec![TargetId(2)]);
        assert!(membership.bind("a", &[report(2)], 8, |_| Ok(())).is_err());
    }

    #[test]
    fn a_failed_persist_binds_nothing() {
        let membership = Membership::new(Duration::from_secs(1), Vec::new());
        assert!(membership
            .bind("a", &[report(3)], 8, |_| Err(WireError::new(ErrorCode::Io, "disk")))
            .is_err());
        membership.bind("b", &[report(3)], 8, |_| Ok(())).unwrap();
        assert_eq!(membership.owner(TargetId(3)), "b");
    }
}
