//! The metadata service as a thread outside the client's runtime calls it: the token and
//! inode-token poll threads, which answer revocations while the runtime may be busy. Each
//! call blocks on the runtime. [`WeakMetaLine`] keeps neither the connections nor the
//! runtime alive, so a poll thread never keeps its client from going away.

use super::Transport;
use crate::error::ClientError;
use flotilla_proto::{MetaReply, MetaRequest};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::runtime::Runtime;

/// A line to the metadata service for blocking calls.
pub(crate) struct MetaLine {
    transport: Arc<Transport>,
    runtime: Arc<Runtime>,
}

impl MetaLine {
    /// One metadata call (`Transport::meta_call`), blocking until it is answered.
    pub fn call(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        self.runtime.block_on(self.transport.meta_call(request))
    }

    /// This client's session at the metadata service.
    pub fn session(&self) -> u64 {
        self.transport.session()
    }

    /// Whether the metadata connection was replaced within the last `within`.
    pub fn reconnected_within(&self, within: Duration) -> bool {
        self.transport.meta_reconnected_within(within)
    }
}

/// A [`MetaLine`] that does not keep the client's connections and runtime alive.
#[derive(Clone)]
pub(crate) struct WeakMetaLine {
    transport: Weak<Transport>,
    runtime: Weak<Runtime>,
}

impl WeakMetaLine {
    /// The line to the metadata service of `transport`, calls blocking on `runtime`.
    pub fn new(transport: &Arc<Transport>, runtime: &Arc<Runtime>) -> WeakMetaLine {
        WeakMetaLine { transport: Arc::downgrade(transport), runtime: Arc::downgrade(runtime) }
    }

    /// The line, while the client's connections and runtime live.
    pub fn upgrade(&self) -> Option<MetaLine> {
        Some(MetaLine { transport: self.transport.upgrade()?, runtime: self.runtime.upgrade()? })
    }
}
