//! Small identifiers of replication: failure groups, chains, chain versions, incarnations.
//!
//! A failure group names what fails together (a host, a rack, a power feed): no chain holds
//! two targets of one group. A chain version only grows; a server's incarnation changes every
//! time it starts, so the metadata service can tell a restart (which lost unsynced state)
//! from a late heartbeat.

use crate::error::PlacementError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest failure group name accepted, in bytes.
pub const FAILURE_GROUP_BYTES_MAX: usize = 255;

/// What fails together: a server declares its group (default: its host name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FailureGroup(String);

impl FailureGroup {
    /// A group named `name`, of 1 to [`FAILURE_GROUP_BYTES_MAX`] bytes.
    pub fn new(name: &str) -> Result<FailureGroup, PlacementError> {
        if name.is_empty() || name.len() > FAILURE_GROUP_BYTES_MAX {
            return Err(PlacementError::FailureGroupName {
                name_bytes: name.len(),
                max: FAILURE_GROUP_BYTES_MAX,
            });
        }
        Ok(FailureGroup(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FailureGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A chain's id, dense from 0, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChainId(pub u32);

impl fmt::Display for ChainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chain {}", self.0)
    }
}

/// A chain's version: starts at 1, grows by one with every change of the chain's members or
/// their states. Every chain request carries the version its sender holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChainVersion(pub u64);

impl ChainVersion {
    pub const FIRST: ChainVersion = ChainVersion(1);

    /// The version after this one.
    pub fn next(self) -> ChainVersion {
        ChainVersion(self.0.checked_add(1).expect("a chain version never reaches 2^64"))
    }
}

impl fmt::Display for ChainVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A server's incarnation: a number that grows every time the server starts (for example the
/// boot time in ms, or a counter kept in the target directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Incarnation(pub u64);
