//! The background scrub (issue 32): at `scrub_bytes_per_s`, this server reads back every
//! fork of the replicated subfiles its serving members hold, checks each block against its
//! checksum and repairs a bad one from another member (`ChainPaths::repair_range`, under
//! the chain's lock), `scrub_step_bytes` at a time. One pass walks every chain held, then
//! the next starts; a failing step is logged and skipped.

use crate::chain_path::ChainPaths;
use crate::membership::HeldChains;
use crate::scrub_plan::{scrub_pause, serving};
use flotilla_proto::{ForkRef, MetaReply, MetaRequest, CHAIN_SUBFILES_SCAN_MAX};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The rest between passes that found nothing to check.
const IDLE_PAUSE: Duration = Duration::from_secs(5);

/// Runs passes forever at `bytes_per_s` (never when 0).
pub(crate) async fn scrub_loop(
    paths: Arc<ChainPaths>,
    held: Arc<HeldChains>,
    bytes_per_s: u64,
    step_bytes: u64,
) {
    if bytes_per_s == 0 {
        return;
    }
    let step_bytes = step_bytes.max(1);
    loop {
        let checked = pass(&paths, &held, bytes_per_s, step_bytes).await;
        if checked == 0 {
            tokio::time::sleep(IDLE_PAUSE).await;
        }
    }
}

/// One pass over every chain held; returns the bytes checked.
async fn pass(paths: &ChainPaths, held: &HeldChains, bytes_per_s: u64, step_bytes: u64) -> u64 {
    let mine = paths.targets();
    let mut checked = 0u64;
    for info in held.snapshot().chains {
        let Some(me) = info.members.iter().map(|m| m.target).find(|t| mine.contains(t)) else { continue };
        if !serving(&info, me) {
            continue;
        }
        let mut after = 0u64;
        loop {
            let ask =
                MetaRequest::ChainSubfiles { chain: info.chain, after, scan_max: CHAIN_SUBFILES_SCAN_MAX };
            let (subfiles, next) = match held.ask_meta(ask, Duration::from_secs(10)).await {
                Ok(MetaReply::ChainSubfiles { subfiles, next }) => (subfiles, next),
                Ok(other) => {
                    tracing::debug!(chain = info.chain, reply = ?other, "scrub: cannot list the chain's subfiles");
                    break;
                }
                Err(error) => {
                    tracing::debug!(chain = info.chain, %error, "scrub: cannot list the chain's subfiles");
                    break;
                }
            };
            for (file, subfile) in subfiles {
                checked += subfile_pass(
                    paths,
                    info.chain,
                    me,
                    (FileId(file), SubfileIndex(subfile)),
                    (bytes_per_s, step_bytes),
                )
                .await;
            }
            match next {
                Some(next) => after = next,
                None => break,
            }
        }
    }
    checked
}

/// Checks every fork of one subfile of member `me`, step by step at the rate.
async fn subfile_pass(
    paths: &ChainPaths,
    chain: u32,
    me: TargetId,
    (file, subfile): (FileId, SubfileIndex),
    (bytes_per_s, step_bytes): (u64, u64),
) -> u64 {
    let store = paths.store();
    let Ok(forks) = store.list_forks(me, file, subfile) else { return 0 };
    let mut checked = 0u64;
    for (name, size_bytes) in forks {
        let fork = ForkRef { target: me, file, subfile, fork: name };
        let mut offset = 0u64;
        while offset < size_bytes {
            let length = step_bytes.min(size_bytes - offset);
            match paths.repair_range(chain, &fork, offset, length).await {
                Ok(done) if !done.check.bad.is_empty() => tracing::warn!(
                    chain, %file, subfile = subfile.0, fork = %fork.fork, bad = done.check.bad.len(),
                    repaired = done.repaired.len(), "scrub found blocks failing their checksum"
                ),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(chain, %file, subfile = subfile.0, %error, "scrub step skipped")
                }
            }
            paths.repairs.scrubbed_bytes.fetch_add(length, Ordering::Relaxed);
            checked += length;
            offset += length;
            if let Some(pause) = scrub_pause(length, bytes_per_s) {
                tokio::time::sleep(pause).await;
            }
        }
    }
    checked
}
