//! Flotilla's I/O server.
//!
//! A server owns one or more storage targets (through `flotilla-store`), registers them
//! with the metadata service and keeps them alive with heartbeats, and executes the
//! requests clients send over their connections.
//!
//! Data path of a request: the connection's reader decodes a frame, checks the request
//! against the limits (pieces, bytes, in-flight credit) without walking it, and queues it
//! on the [`scheduler`]; worker threads take requests from the connections' queues round
//! robin (so one busy client cannot starve the others), turn the shape into extents, and
//! hand them to the store, whose buffer cache and C-SCAN disk scheduler do the rest; the
//! reply goes back through the connection's bounded writer queue.

mod authorize;
mod chain_path;
mod chain_write;
pub mod config;
mod connection;
mod execute;
mod flush;
mod flush_plan;
mod held_table;
mod membership;
pub use membership::{ChainsSnapshot, HeldChains};
pub mod metrics;
mod rate;
mod reply_writer;
pub mod scheduler;
mod scrub;
mod scrub_plan;
mod server;

pub use config::{ArchiveSettings, ServerConfig};
pub use server::{run, Server};
