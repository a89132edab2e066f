//! Who makes a namespace request: the caller's identity and the policy a connection applies
//! to the identity it claims.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most supplementary groups one caller may name (Linux allows 65536; a parallel file system
/// client with more is refused rather than trusted with an unbounded list).
pub const CALLER_GROUPS_MAX: usize = 256;

/// The uid and gid a squashed root becomes ("nobody").
pub const NOBODY_ID: u32 = 65_534;

/// The identity a request acts as.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, at most [`CALLER_GROUPS_MAX`].
    pub groups: Vec<u32>,
}

/// A caller naming more groups than allowed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CallerError {
    #[error("caller names {count} supplementary groups, at most {max} are allowed")]
    TooManyGroups { count: usize, max: usize },
}

impl Caller {
    /// The superuser (every permission check passes).
    pub fn root() -> Self {
        Caller { uid: 0, gid: 0, groups: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the caller's primary or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Refuses a caller with more than [`CALLER_GROUPS_MAX`] groups.
    pub fn check(&self) -> Result<(), CallerError> {
        if self.groups.len() > CALLER_GROUPS_MAX {
            return Err(CallerError::TooManyGroups { count: self.groups.len(), max: CALLER_GROUPS_MAX });
        }
        Ok(())
    }
}

/// What a connection may do, whoever it claims to be. The default is unrestricted: the
/// claimed identity is believed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallerPolicy {
    /// Refuse every namespace change and every write capability.
    pub read_only: bool,
    /// Confine paths to this directory (an absolute path) and below.
    pub subtree: Option<String>,
    /// Replace the claimed uid with this one.
    pub uid: Option<u32>,
    /// Replace the claimed gid (and the supplementary groups) with this one.
    pub gid: Option<u32>,
    /// Map a claimed uid 0 to [`NOBODY_ID`] (and its gid 0 to `NOBODY_ID`).
    pub root_squash: bool,
}

impl CallerPolicy {
    /// This policy narrowed by `other` (a credential's limits): a restriction in either
    /// applies; `other`'s fixed ids and subtree win over this one's.
    pub fn narrowed_by(&self, other: &CallerPolicy) -> CallerPolicy {
        CallerPolicy {
            read_only: self.read_only || other.read_only,
            subtree: other.subtree.clone().or_else(|| self.subtree.clone()),
            uid: other.uid.or(self.uid),
            gid: other.gid.or(self.gid),
            root_squash: self.root_squash || other.root_squash,
        }
    }

    /// The identity a request claiming `claimed` acts as under this policy.
    pub fn effective(&self, claimed: &Caller) -> Caller {
        let mut caller = claimed.clone();
        if self.root_squash && caller.uid == 0 {
            caller.uid = NOBODY_ID;
            if caller.gid == 0 {
                caller.gid = NOBODY_ID;
            }
            caller.groups.retain(|group| *group != 0);
        }
        if let Some(uid) = self.uid {
            caller.uid = uid;
        }
        if let Some(gid) = self.gid {
            caller.gid = gid;
            caller.groups.clear();
        }
        caller
    }

    /// Whether `path` (absolute, as sent) lies inside the policy's subtree. Compared by
    /// components after dropping `.` and empty ones; a path with `..` is refused under a
    /// subtree, since it could climb out.
    pub fn allows_path(&self, path: &str) -> bool {
        let Some(subtree) = &self.subtree else { return true };
        let parts = |p: &str| -> Vec<String> {
            p.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string).collect()
        };
        let path_parts = parts(path);
        if path_parts.iter().any(|c| c == "..") {
            return false;
        }
        let root_parts = parts(subtree);
        path_parts.len() >= root_parts.len() && path_parts[..root_parts.len()] == root_parts[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn user(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: vec![gid, 100] }
    }

    #[test]
    fn root_squash_maps_root_to_nobody_only() {
        let policy = CallerPolicy { root_squash: true, ..Default::default() };
        let squashed = policy.effective(&Caller { uid: 0, gid: 0, groups: vec![0, 5] });
        assert_eq!((squashed.uid, squashed.gid, squashed.groups), (NOBODY_ID, NOBODY_ID, vec![5]));
        assert_eq!(policy.effective(&user(1000, 1000)), user(1000, 1000));
    }

    #[test]
    fn fixed_ids_replace_the_claim() {
        let policy = CallerPolicy { uid: Some(7), gid: Some(8), ..Default::default() };
        let fixed = policy.effective(&Caller::root());
        assert_eq!((fixed.uid, fixed.gid), (7, 8));
        assert!(fixed.groups.is_empty());
    }

    #[test]
    fn subtree_confines_paths() {
        let policy = CallerPolicy { subtree: Some("/home/a".into()), ..Default::default() };
        assert!(policy.allows_path("/home/a"));
        assert!(policy.allows_path("/home//a/./x"));
        assert!(!policy.allows_path("/home/ab"));
        assert!(!policy.allows_path("/home/a/../b"));
        assert!(!policy.allows_path("/"));
        assert!(CallerPolicy::default().allows_path("/anything/../x"));
    }

    #[test]
    fn too_many_groups_are_refused() {
        let caller = Caller { uid: 1, gid: 1, groups: vec![3; CALLER_GROUPS_MAX + 1] };
        assert!(matches!(caller.check(), Err(CallerError::TooManyGroups { .. })));
        assert!(user(1, 1).check().is_ok());
    }

    proptest! {
        #[test]
        fn squashed_policy_never_yields_root(uid in 0u32..3, gid in 0u32..3, groups in proptest::collection::vec(0u32..3, 0..4)) {
            let policy = CallerPolicy { root_squash: true, ..Default::default() };
            let caller = policy.effective(&Caller { uid, gid, groups });
            prop_assert!(!caller.is_root());
        }
    }
}
