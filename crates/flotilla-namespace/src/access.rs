//! POSIX permission checks: pure functions of an entry's attributes and a caller, used by
//! the namespace operations inside their transactions (so nothing changes between the check
//! and the act).

use crate::error::NamespaceError;
use crate::request::SetAttr;
use flotilla_types::{Attributes, Caller, FileKind, TimeNs};

/// Read permission (`r`).
pub const READ: u32 = 4;
/// Write permission (`w`).
pub const WRITE: u32 = 2;
/// Search (directories) or execute (files) permission (`x`).
pub const SEARCH: u32 = 1;

/// The set-user-id bit.
pub const SETUID: u32 = 0o4000;
/// The set-group-id bit.
pub const SETGID: u32 = 0o2000;
/// The sticky bit: in a directory, only the owner of an entry or of the directory (or root)
/// may remove or rename the entry.
pub const STICKY: u32 = 0o1000;

/// A setattr that sets times within this distance of now counts as "set to now", which any
/// writer may do (`utimes(path, NULL)`); other times need the owner.
pub const TIMES_NOW_SLACK_NS: TimeNs = 2_000_000_000;

/// Whether `caller` has every permission in `want` (a mix of `READ`, `WRITE`, `SEARCH`) on
/// an entry with `attrs`. Root has all of them, except execute on a file no one may execute.
pub fn allows(attrs: &Attributes, caller: &Caller, want: u32) -> bool {
    if caller.is_root() {
        let executable = attrs.kind == FileKind::Directory || attrs.mode & 0o111 != 0;
        return want & SEARCH == 0 || executable;
    }
    let shift = if caller.uid == attrs.uid {
        6
    } else if caller.in_group(attrs.gid) {
        3
    } else {
        0
    };
    let granted = (attrs.mode >> shift) & 0o7;
    granted & want == want
}

/// `allows`, or an error naming the entry and what was missing.
pub fn require(attrs: &Attributes, caller: &Caller, want: u32, what: &str) -> Result<(), NamespaceError> {
    if allows(attrs, caller, want) {
        return Ok(());
    }
    Err(NamespaceError::AccessDenied { what: format!("{what}: {} permission needed", rights_name(want)) })
}

/// "read", "write+search" and so on.
pub fn rights_name(want: u32) -> String {
    let names: Vec<&str> = [(READ, "read"), (WRITE, "write"), (SEARCH, "search")]
        .iter()
        .filter(|(bit, _)| want & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    names.join("+")
}

/// Whether `caller` may remove or rename away `victim` from directory `dir` (write and
/// search on `dir` are checked separately): in a sticky directory only the owner of the
/// entry or of the directory, or root.
pub fn may_unlink_sticky(dir: &Attributes, victim: &Attributes, caller: &Caller) -> bool {
    dir.mode & STICKY == 0 || caller.is_root() || caller.uid == victim.uid || caller.uid == dir.uid
}

/// Checks that `caller` may remove the name `name` of `victim` from directory `dir`.
pub fn require_remove(
    dir: &Attributes,
    victim: &Attributes,
    caller: &Caller,
    name: &str,
) -> Result<(), NamespaceError> {
    require(dir, caller, WRITE | SEARCH, &format!("directory holding {name:?}"))?;
    if !may_unlink_sticky(dir, victim, caller) {
        return Err(NamespaceError::AccessDenied {
            what: format!("{name:?} is in a sticky directory and owned by another user"),
        });
    }
    Ok(())
}

/// Checks that `caller` owns the entry with `attrs` (or is root): what chmod needs, and what
/// a layout change and a hint change need. `what` names the change for the error.
pub fn require_owner(attrs: &Attributes, caller: &Caller, what: &str) -> Result<(), NamespaceError> {
    if caller.is_root() || caller.uid == attrs.uid {
        return Ok(());
    }
    Err(denied(&format!("{what}: only the owner (uid {}) or root may", attrs.uid)))
}

/// Checks a read's access-time update (`TouchAtime`): the owner (or root) may set any time;
/// anyone else needs read permission and may only set it to now, as a read does.
pub fn check_touch_atime(
    attrs: &Attributes,
    caller: &Caller,
    atime_ns: TimeNs,
    now_ns: TimeNs,
) -> Result<(), NamespaceError> {
    if caller.is_root() || caller.uid == attrs.uid {
        return Ok(());
    }
    if atime_ns.abs_diff(now_ns) > TIMES_NOW_SLACK_NS as u64 {
        return Err(denied("atime: only the owner or root may set an access time other than now"));
    }
    require(attrs, caller, READ, "atime update of a read")
}

/// Checks a setattr against the POSIX rules and returns the change to apply (which may also
/// clear setuid/setgid). `now_ns` tells "set the times to now" from arbitrary times.
pub fn checked_set_attr(
    attrs: &Attributes,
    caller: &Caller,
    change: &SetAttr,
    now_ns: TimeNs,
) -> Result<SetAttr, NamespaceError> {
    let mut change = change.clone();
    let owner = caller.is_root() || caller.uid == attrs.uid;
    if change.size_bytes.is_some() {
        require(attrs, caller, WRITE, "truncate")?;
    }
    check_times(attrs, caller, &change, owner, now_ns)?;
    check_chown(attrs, caller, &mut change, owner)?;
    if let Some(mode) = change.mode {
        if !owner {
            return Err(denied("chmod: only the owner or root may change the mode"));
        }
        let gid = change.gid.unwrap_or(attrs.gid);
        if !caller.is_root() && !caller.in_group(gid) {
            change.mode = Some(mode & !SETGID);
        }
    }
    Ok(change)
}

fn check_times(
    attrs: &Attributes,
    caller: &Caller,
    change: &SetAttr,
    owner: bool,
    now_ns: TimeNs,
) -> Result<(), NamespaceError> {
    let times = [change.atime_ns, change.mtime_ns];
    if owner || times.iter().all(Option::is_none) {
        return Ok(());
    }
    let to_now = times.iter().flatten().all(|t| t.abs_diff(now_ns) <= TIMES_NOW_SLACK_NS as u64);
    if !to_now {
        return Err(denied("utimes: only the owner or root may set arbitrary times"));
    }
    require(attrs, caller, WRITE, "utimes to now")
}

fn check_chown(
    attrs: &Attributes,
    caller: &Caller,
    change: &mut SetAttr,
    owner: bool,
) -> Result<(), NamespaceError> {
    let new_uid = change.uid.filter(|uid| *uid != attrs.uid);
    let new_gid = change.gid.filter(|gid| *gid != attrs.gid);
    if new_uid.is_some() && !caller.is_root() {
        return Err(denied("chown: only root may change the owner"));
    }
    if let Some(gid) = new_gid {
        if !(caller.is_root() || (owner && caller.in_group(gid))) {
            return Err(denied(&format!(
                "chown: only the owner in group {gid}, or root, may set group {gid}"
            )));
        }
    }
    let chowned = change.uid.is_some() || change.gid.is_some();
    if chowned && !caller.is_root() && attrs.kind == FileKind::File {
        let mode = change.mode.unwrap_or(attrs.mode);
        change.mode = Some(mode & !(SETUID | SETGID));
    }
    Ok(())
}

fn denied(what: &str) -> NamespaceError {
    NamespaceError::NotPermitted { what: what.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attrs(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attributes {
        Attributes {
            kind,
            mode,
            uid,
            gid,
            size_bytes: 0,
            nlink: 1,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            rdev: 0,
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn owner_group_other_classes() {
        let file = attrs(FileKind::File, 0o640, 10, 20);
        assert!(allows(&file, &user(10, 1, &[]), READ | WRITE));
        assert!(allows(&file, &user(11, 1, &[20]), READ));
        assert!(!allows(&file, &user(11, 20, &[]), WRITE));
        assert!(!allows(&file, &user(12, 30, &[]), READ));
        // The owner class applies even when it grants less than the group.
        let odd = attrs(FileKind::File, 0o070, 10, 20);
        assert!(!allows(&odd, &user(10, 20, &[]), READ));
    }

    #[test]
    fn root_bypasses_but_cannot_execute_non_executables() {
        let file = attrs(FileKind::File, 0o000, 10, 20);
        assert!(allows(&file, &Caller::root(), READ | WRITE));
        assert!(!allows(&file, &Caller::root(), SEARCH));
        let dir = attrs(FileKind::Directory, 0o000, 10, 20);
        assert!(allows(&dir, &Caller::root(), READ | WRITE | SEARCH));
    }

    #[test]
    fn sticky_directory_protects_other_users_entries() {
        let tmp = attrs(FileKind::Directory, 0o1777, 0, 0);
        let theirs = attrs(FileKind::File, 0o644, 10, 10);
        assert!(require_remove(&tmp, &theirs, &user(10, 10, &[]), "f").is_ok());
        let refused = require_remove(&tmp, &theirs, &user(11, 11, &[]), "f").unwrap_err();
        assert!(refused.to_string().contains("sticky"));
        assert!(require_remove(&tmp, &theirs, &Caller::root(), "f").is_ok());
    }

    #[test]
    fn chown_rules() {
        let file = attrs(FileKind::File, 0o6755, 10, 20);
        let owner = user(10, 20, &[30]);
        let give_away = SetAttr { uid: Some(11), ..Default::default() };
        assert!(checked_set_attr(&file, &owner, &give_away, 0).is_err());
        let to_own_group = SetAttr { gid: Some(30), ..Default::default() };
        let applied = checked_set_attr(&file, &owner, &to_own_group, 0).unwrap();
        assert_eq!(applied.mode, Some(0o755), "setuid/setgid cleared by a non-root chown");
        let to_foreign_group = SetAttr { gid: Some(40), ..Default::default() };
        assert!(checked_set_attr(&file, &owner, &to_foreign_group, 0).is_err());
        let by_root = checked_set_attr(&file, &Caller::root(), &give_away, 0).unwrap();
        assert_eq!(by_root.mode, None);
    }

    #[test]
    fn layout_changes_and_atimes_need_the_owner() {
        let dir = attrs(FileKind::Directory, 0o777, 0, 0);
        let nobody = user(65534, 65534, &[]);
        let refused = require_owner(&dir, &nobody, "set the layout of /").unwrap_err();
        assert_eq!(refused.errno(), crate::EPERM);
        assert!(refused.to_string().contains("only the owner"), "{refused}");
        assert!(require_owner(&dir, &Caller::root(), "x").is_ok());
        assert!(require_owner(&attrs(FileKind::File, 0o600, 65534, 1), &nobody, "x").is_ok());
        let now = 1_000_000_000_000;
        let shared = attrs(FileKind::File, 0o644, 0, 0);
        assert!(check_touch_atime(&shared, &nobody, now, now).is_ok(), "a reader sets now");
        assert!(check_touch_atime(&shared, &nobody, 5, now).is_err(), "not an arbitrary time");
        let private = attrs(FileKind::File, 0o600, 0, 0);
        assert!(check_touch_atime(&private, &nobody, now, now).is_err(), "not without read permission");
        assert!(check_touch_atime(&private, &Caller::root(), 5, now).is_ok());
    }

    #[test]
    fn chmod_and_times_need_the_owner() {
        let file = attrs(FileKind::File, 0o666, 10, 20);
        let other = user(11, 21, &[]);
        let chmod = SetAttr { mode: Some(0o777), ..Default::default() };
        assert!(checked_set_attr(&file, &other, &chmod, 0).is_err());
        let now = 1_000_000_000_000;
        let touch = SetAttr { mtime_ns: Some(now), atime_ns: Some(now), ..Default::default() };
        assert!(checked_set_attr(&file, &other, &touch, now).is_ok(), "a writer may set times to now");
        let back = SetAttr { mtime_ns: Some(5), ..Default::default() };
        assert!(checked_set_attr(&file, &other, &back, now).is_err());
        let setgid = SetAttr { mode: Some(0o2755), ..Default::default() };
        let applied = checked_set_attr(&file, &user(10, 99, &[]), &setgid, now).unwrap();
        assert_eq!(applied.mode, Some(0o755), "setgid dropped when not in the file's group");
    }

    proptest! {
        #[test]
        fn permission_is_monotonic_in_mode(mode in 0u32..0o1000, extra in 0u32..0o1000,
                uid in 1u32..4, gid in 1u32..4, cuid in 1u32..4, cgid in 1u32..4, want in 1u32..8) {
            let caller = user(cuid, cgid, &[]);
            let narrow = attrs(FileKind::File, mode, uid, gid);
            let wide = attrs(FileKind::File, mode | extra, uid, gid);
            if allows(&narrow, &caller, want) {
                prop_assert!(allows(&wide, &caller, want));
            }
        }

        #[test]
        fn non_root_never_gains_setuid_by_chown(mode in 0u32..0o10000, gid in 0u32..4, cuid in 1u32..4) {
            let file = attrs(FileKind::File, mode, cuid, 0);
            let caller = user(cuid, gid, &[]);
            let change = SetAttr { gid: Some(gid), ..Default::default() };
            if let Ok(applied) = checked_set_attr(&file, &caller, &change, 0) {
                prop_assert_eq!(applied.mode.unwrap_or(mode) & SETUID, 0);
            }
        }

        #[test]
        fn other_users_never_change_owner_or_mode(mode in 0u32..0o10000, new_mode in 0u32..0o10000, cuid in 2u32..9) {
            let file = attrs(FileKind::File, mode, 1, 1);
            let caller = user(cuid, cuid, &[]);
            let chmod = SetAttr { mode: Some(new_mode), ..Default::default() };
            prop_assert!(checked_set_attr(&file, &caller, &chmod, 0).is_err());
            let chown = SetAttr { uid: Some(cuid), ..Default::default() };
            prop_assert!(checked_set_attr(&file, &caller, &chown, 0).is_err());
        }
    }
}
