//! Identifiers, attributes, names and limits shared by every Flotilla component.
//!
//! This crate does no I/O. It exists so that the namespace, the storage engine, the wire
//! protocol and the client agree on one definition of a file id, a fork name or a limit.

mod attr;
mod caller;
mod ids;
mod layout;
mod limits;
mod name;
mod replicated;

pub use attr::{Attributes, FileKind, Layout, SetAttr, TimeNs};
pub use caller::{Caller, CallerError, CallerPolicy, CALLER_GROUPS_MAX, NOBODY_ID};
pub use ids::{FileId, SubfileIndex, TargetId};
pub use layout::{
    parse_size, placement_hash, LayoutBounds, LayoutError, LinearExtent, LAYOUT_COUNT_MAX,
    LAYOUT_UNIT_BYTES_MAX, LAYOUT_UNIT_BYTES_MIN,
};
pub use limits::{Limits, LimitsError};
pub use name::{check_fork_name, check_name, split_path, NameError, NAME_BYTES_MAX, PATH_BYTES_MAX};
pub use replicated::{ReplicatedLayout, REPLICAS_MAX};
