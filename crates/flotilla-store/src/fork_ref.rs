//! How a caller names a fork: target, file, subfile and fork name.

use crate::error::StoreError;
use flotilla_types::{check_fork_name, FileId, SubfileIndex, TargetId};
use std::fmt;

/// A fork of a subfile on a target. The name is borrowed, so building one per request does
/// not allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ForkRef<'a> {
    pub target: TargetId,
    pub file: FileId,
    pub subfile: SubfileIndex,
    pub fork: &'a str,
}

impl<'a> ForkRef<'a> {
    pub fn new(target: TargetId, file: FileId, subfile: SubfileIndex, fork: &'a str) -> Self {
        Self { target, file, subfile, fork }
    }

    /// Checks the fork name.
    pub(crate) fn check_name(&self) -> Result<(), StoreError> {
        check_fork_name(self.fork).map_err(|source| StoreError::BadForkName { source })
    }
}

impl fmt::Display for ForkRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fork {} of {}:{} on target {}", self.fork, self.file, self.subfile, self.target)
    }
}
