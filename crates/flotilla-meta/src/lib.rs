//! Flotilla's metadata service.
//!
//! It serves the namespace (kept in `flotilla-namespace`, a crash-safe redb database) and
//! tracks which I/O servers and targets are alive. Servers register their targets and send
//! heartbeats; a target not heard from for `down_after_ms` is shown `down` and gets no new
//! subfiles. Heartbeat replies carry the subfiles a server should delete (files that lost
//! their last link), and the next heartbeat acknowledges them, so deletion survives
//! restarts of either side.

mod admission;
mod chains;
pub mod config;
pub mod grouped;
mod handle;
mod handle_at;
mod inode_cached;
mod inode_tokens;
mod jobs;
mod locks;
mod membership;
mod metrics;
mod opens;
mod policy;
mod proposals;
pub mod replicated;
mod service;
mod tokens;

pub use config::MetaConfig;
pub use service::{run, MetaService};
