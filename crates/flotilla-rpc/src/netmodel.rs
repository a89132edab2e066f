//! An optional model of a slower network, for benchmarks (`flotilla bench --network MODEL`):
//! off unless a process installs one, and then every call on a [`crate::Connection`] of that
//! process is held until the model says its request has arrived, and its reply until the
//! model says the reply has arrived, timed from when the reply's frame header arrived (so the
//! real read of its payload runs inside the modelled transfer rather than adding to it). The model keeps its own links' state in modelled time
//! (as the simulated disks keep their arm's); this module only asks it and waits. When no
//! model is installed a call pays one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// A network model: when a message sent now is delivered.
pub trait NetworkModel: Send + Sync + 'static {
    /// When a request of `bytes` from this process to `peer`, sent at `now`, has arrived.
    fn request_arrives(&self, peer: &str, bytes: u64, now: Instant) -> Instant;
    /// When a reply of `bytes` from `peer` to this process, sent at `now`, has arrived.
    fn reply_arrives(&self, peer: &str, bytes: u64, now: Instant) -> Instant;
}

static ON: AtomicBool = AtomicBool::new(false);
static MODEL: RwLock<Option<Arc<dyn NetworkModel>>> = RwLock::new(None);

/// Installs the process's network model (`None`: none, the default), replacing any other;
/// calls already waiting keep the model they started with.
pub fn install_network_model(model: Option<Arc<dyn NetworkModel>>) {
    let on = model.is_some();
    *MODEL.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = model;
    ON.store(on, Ordering::Release);
}

/// The installed model, if any.
pub(crate) fn model() -> Option<Arc<dyn NetworkModel>> {
    if !ON.load(Ordering::Acquire) {
        return None;
    }
    MODEL.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

/// Waits until `deadline`: precisely (a blocking sleep moved off the runtime's workers, as
/// the simulated disk sleeps) on a multi-threaded runtime, else on the runtime's timer.
pub(crate) async fn hold_until(deadline: Instant) {
    let now = Instant::now();
    if deadline <= now {
        return;
    }
    let wait: Duration = deadline - now;
    let multi = tokio::runtime::Handle::try_current()
        .map(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
        .unwrap_or(false);
    if multi {
        tokio::task::block_in_place(|| std::thread::sleep(wait));
    } else {
        tokio::time::sleep(wait).await;
    }
}
