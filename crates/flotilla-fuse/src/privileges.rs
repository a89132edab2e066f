//! setuid and setgid on writes, as Linux does for a writer without `CAP_FSETID`: a write
//! by anyone but root clears setuid, and setgid when group execute is set (setgid without
//! group execute marks mandatory locking and stays). The kernel clears them itself for
//! truncate and chown through the mount (it turns them into a mode change), but not for
//! writes to files opened for direct I/O, which every file of this mount is.

use crate::fs::FlotillaFs;
use crate::names::failed;
use flotilla_client::SetAttr;
use fuser::Errno;

/// The mode a write by a user without `CAP_FSETID` leaves, or `None` if it changes nothing.
pub fn killed_mode(mode: u32) -> Option<u32> {
    let mut killed = mode & !libc::S_ISUID;
    let setgid_exec = libc::S_ISGID | libc::S_IXGRP;
    if mode & setgid_exec == setgid_exec {
        killed &= !libc::S_ISGID;
    }
    (killed != mode).then_some(killed)
}

impl FlotillaFs {
    /// Clears setuid/setgid of file `ino` as a write by a user other than root does, reading
    /// the mode afresh (another client may have changed it since the open).
    pub(crate) fn drop_privileges(&self, ino: u64) -> Result<(), Errno> {
        let entry = self.retrying(|| self.client.stat_id(ino)).map_err(failed)?;
        let Some(mode) = killed_mode(entry.attrs.mode) else { return Ok(()) };
        let change = SetAttr { mode: Some(mode & 0o7777), ..SetAttr::default() };
        self.client.set_attr(ino, change).map(|_| ()).map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_rules() {
        assert_eq!(killed_mode(0o6777), Some(0o0777));
        assert_eq!(killed_mode(0o4755), Some(0o0755));
        // setgid without group execute (mandatory locking) stays.
        assert_eq!(killed_mode(0o6745), Some(0o2745));
        assert_eq!(killed_mode(0o2745), None);
        assert_eq!(killed_mode(0o0777), None);
    }

    proptest! {
        #[test]
        fn only_the_two_bits_ever_change(mode in 0u32..0o10000) {
            let after = killed_mode(mode).unwrap_or(mode);
            prop_assert_eq!(after & !0o6000, mode & !0o6000);
            prop_assert_eq!(after & 0o4000, 0);
            prop_assert_eq!(killed_mode(after), None);
        }
    }
}
