//! The group's identity: a random 64-bit id made when a group is formed, kept in the node's
//! directory (`group.id`) and carried in every Raft request frame, so that a node never takes
//! a vote or an append from a node of another group (a peer list naming a node of another
//! group, a node of a wiped and re-formed group still running).
//!
//! Rules (plain logic, [`GroupIdentity::admit`]): the node that forms a group makes the id
//! ([`GroupIdentity::create`]) before it names the members; a node that has none yet (started
//! for a new group, or joining one) takes the id of the first request it receives and keeps
//! it; a node with an id refuses a request carrying another. A request carrying no id (0: a
//! node of a version before group ids, or of a group formed before them) is accepted, so such
//! a group keeps working.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::types::NodeId;

/// The file holding a node's group id, in its directory.
pub const GROUP_ID_FILE: &str = "group.id";
/// How often a refusal of the same sender and id is logged (the first one always is).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Senders whose refusals are remembered for rate-limiting the log; past it the memory is
/// cleared (at worst a few more lines).
const REFUSALS_REMEMBERED_MAX: usize = 64;

/// Why a group id could not be read or kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} does not hold a group id (16 hex digits, not all zero): {found:?}")]
    Malformed { path: PathBuf, found: String },
}

/// A request from another group, refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Raft request from node {from} of group {theirs:016x} refused: this node belongs to group \
     {ours:016x} (a peer address names a node of another group, or a node of a wiped group still runs)"
)]
pub struct ForeignGroup {
    pub from: NodeId,
    pub theirs: u64,
    pub ours: u64,
}

/// A node's group id (0 while unknown) and where it is kept.
#[derive(Debug)]
pub struct GroupIdentity {
    id: AtomicU64,
    path: Option<PathBuf>,
    /// Serialises adopting (and writing) the id.
    adopting: Mutex<()>,
    refusals_logged: Mutex<HashMap<(NodeId, u64), Instant>>,
}

impl GroupIdentity {
    /// An identity kept in memory only, `id` 0 for unknown (tests, in-process groups).
    pub fn in_memory(id: u64) -> GroupIdentity {
        GroupIdentity {
            id: AtomicU64::new(id),
            path: None,
            adopting: Mutex::new(()),
            refusals_logged: Mutex::new(HashMap::new()),
        }
    }

    /// The identity kept in `dir`/group.id (unknown if the file does not exist).
    pub fn open(dir: &Path) -> Result<GroupIdentity, IdentityError> {
        let path = dir.join(GROUP_ID_FILE);
        let id = match std::fs::read_to_string(&path) {
            Ok(text) => parse(text.trim())
                .ok_or_else(|| IdentityError::Malformed { path: path.clone(), found: text.clone() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(IdentityError::Io { path, source }),
        };
        Ok(GroupIdentity { path: Some(path), ..GroupIdentity::in_memory(id) })
    }

    /// The id, 0 while unknown.
    pub fn id(&self) -> u64 {
        self.id.load(Ordering::Acquire)
    }

    /// Makes (and keeps) a new random id unless this node has one; the id.
    pub fn create(&self) -> Result<u64, IdentityError> {
        let _adopting = self.adopting.lock();
        let current = self.id();
        if current != 0 {
            return Ok(current);
        }
        let id = loop {
            let id: u64 = rand::random();
            if id != 0 {
                break id;
            }
        };
        self.keep(id)?;
        Ok(id)
    }

    /// Whether a request from `from` carrying group id `theirs` may be served; a node with no
    /// id yet takes `theirs` (kept before it answers). A refusal is logged here (the first of
    /// a sender and id at once, then at most once per [`REFUSAL_LOG_INTERVAL`]).
    pub fn admit(&self, from: NodeId, theirs: u64) -> Result<(), ForeignGroup> {
        let ours = self.id();
        if theirs == 0 || ours == theirs {
            return Ok(());
        }
        if ours == 0 {
            let _adopting = self.adopting.lock();
            let now = self.id();
            if now == 0 {
                match self.keep(theirs) {
                    Ok(()) => {
                        tracing::info!(from, group = %format!("{theirs:016x}"), "joined metadata group");
                        return Ok(());
                    }
                    // Not kept: serve anyway (the id is in memory); the next start learns it again.
                    Err(error) => {
                        tracing::warn!(%error, "the metadata group's id could not be kept");
                        return Ok(());
                    }
                }
            }
            if now == theirs {
                return Ok(());
            }
            return self.refuse(ForeignGroup { from, theirs, ours: now });
        }
        self.refuse(ForeignGroup { from, theirs, ours })
    }

    fn refuse(&self, refusal: ForeignGroup) -> Result<(), ForeignGroup> {
        let mut logged = self.refusals_logged.lock();
        let key = (refusal.from, refusal.theirs);
        let due = logged.get(&key).is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL);
        if due {
            if logged.len() >= REFUSALS_REMEMBERED_MAX {
                logged.clear();
            }
            logged.insert(key, Instant::now());
            tracing::error!(%refusal, "refusing a metadata group request from another group");
        }
        Err(refusal)
    }

    /// Sets the id and writes it (a new file, synced, renamed into place).
    fn keep(&self, id: u64) -> Result<(), IdentityError> {
        if let Some(path) = &self.path {
            let io = |source| IdentityError::Io { path: path.clone(), source };
            let staged = path.with_extension("id.new");
            let mut file = std::fs::File::create(&staged).map_err(io)?;
            file.write_all(format!("{id:016x}\n").as_bytes()).map_err(io)?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&staged, path).map_err(io)?;
            if let Some(dir) = path.parent() {
                if let Ok(dir) = std::fs::File::open(dir) {
                    let _ = dir.sync_all();
                }
            }
        }
        self.id.store(id, Ordering::Release);
        Ok(())
    }
}

fn parse(text: &str) -> Option<u64> {
    if text.len() != 16 {
        return None;
    }
    u64::from_str_radix(text, 16).ok().filter(|id| *id != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_with_an_id_refuses_another_groups_requests_by_name() {
        let identity = GroupIdentity::in_memory(0xabc);
        assert_eq!(identity.admit(2, 0xabc), Ok(()));
        let refusal = identity.admit(3, 0xdef).unwrap_err();
        assert_eq!(refusal, ForeignGroup { from: 3, theirs: 0xdef, ours: 0xabc });
        let text = refusal.to_string();
        assert!(text.contains("node 3 of group 0000000000000def"), "{text}");
        assert!(text.contains("belongs to group 0000000000000abc"), "{text}");
        // Still refused the next time, and the id did not change.
        assert!(identity.admit(3, 0xdef).is_err());
        assert_eq!(identity.id(), 0xabc);
    }

    #[test]
    fn a_request_without_an_id_is_accepted_and_changes_nothing() {
        let identity = GroupIdentity::in_memory(0xabc);
        assert_eq!(identity.admit(2, 0), Ok(()));
        assert_eq!(identity.id(), 0xabc);
        let unknown = GroupIdentity::in_memory(0);
        assert_eq!(unknown.admit(2, 0), Ok(()));
        assert_eq!(unknown.id(), 0);
    }

    #[test]
    fn a_new_node_takes_the_first_id_it_hears_keeps_it_and_then_refuses_others() {
        let dir = tempfile::tempdir().unwrap();
        let identity = GroupIdentity::open(dir.path()).unwrap();
        assert_eq!(identity.id(), 0);
        assert_eq!(identity.admit(1, 0x1234), Ok(()));
        assert_eq!(identity.id(), 0x1234);
        assert!(identity.admit(5, 0x9999).is_err());
        drop(identity);
        // Phase: restart; the id was kept.
        let identity = GroupIdentity::open(dir.path()).unwrap();
        assert_eq!(identity.id(), 0x1234);
        assert!(identity.admit(5, 0x9999).is_err());
        assert_eq!(identity.admit(2, 0x1234), Ok(()));
    }

    #[test]
    fn create_makes_one_id_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let identity = GroupIdentity::open(dir.path()).unwrap();
        let id = identity.create().unwrap();
        assert_ne!(id, 0);
        assert_eq!(identity.create().unwrap(), id, "a second create keeps the first id");
        assert_eq!(GroupIdentity::open(dir.path()).unwrap().id(), id);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(GroupIdentity::open(other.path()).unwrap().create().unwrap(), id);
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(GROUP_ID_FILE), "nonsense").unwrap();
        let error = GroupIdentity::open(dir.path()).unwrap_err();
        assert!(error.to_string().contains("group.id"), "{error}");
        std::fs::write(dir.path().join(GROUP_ID_FILE), "0000000000000000\n").unwrap();
        assert!(GroupIdentity::open(dir.path()).is_err(), "an all-zero id is not an id");
    }
}
