//! Storage-target bookkeeping: subfiles waiting to be deleted on each target, and the
//! last known address and usage of every target ever seen.

use crate::error::NamespaceError;
use crate::namespace::Namespace;
use crate::target_record::{TargetRecord, SERVER_ADDR_BYTES_MAX};
use flotilla_types::{FileId, SubfileIndex, TargetId};
use redb::ReadableTable;

/// Most pending deletions fetched or acknowledged in one call.
pub const PENDING_DELETES_BATCH_MAX: usize = 65_536;

impl Namespace {
    /// Up to `max` (capped at `PENDING_DELETES_BATCH_MAX`) subfiles waiting to be deleted
    /// on `target`, in (file id, subfile index) order.
    pub fn pending_deletes(
        &self,
        target: TargetId,
        max: usize,
    ) -> Result<Vec<(FileId, SubfileIndex)>, NamespaceError> {
        let max = max.min(PENDING_DELETES_BATCH_MAX);
        self.read(|tables| {
            let range = tables.pending.range((target.0, 0u64, 0u32)..=(target.0, u64::MAX, u32::MAX))?;
            let mut out = Vec::new();
            for item in range.take(max) {
                let (_, file, index) = item?.0.value();
                out.push((FileId(file), SubfileIndex(index)));
            }
            Ok(out)
        })
    }

    /// Forgets deletions that `target` has carried out. Unknown entries are ignored, so an
    /// acknowledgement may be repeated.
    pub fn ack_deletes(
        &self,
        target: TargetId,
        done: &[(FileId, SubfileIndex)],
    ) -> Result<(), NamespaceError> {
        if done.len() > PENDING_DELETES_BATCH_MAX {
            return Err(NamespaceError::invalid(format!(
                "{} acknowledgements in one call, over {PENDING_DELETES_BATCH_MAX}",
                done.len()
            )));
        }
        self.write(|tables| {
            for (file, index) in done {
                tables.pending.remove((target.0, file.0, index.0))?;
            }
            Ok(())
        })
    }

    /// Remembers a target's server address and usage. Each call is a durable write, so call
    /// it when a target is first seen or moves, and only now and then otherwise.
    pub fn record_target(
        &self,
        target: TargetId,
        server_addr: &str,
        used_bytes: u64,
        free_bytes: u64,
    ) -> Result<(), NamespaceError> {
        if server_addr.len() > SERVER_ADDR_BYTES_MAX {
            return Err(NamespaceError::invalid(format!(
                "server address of {} bytes, over {SERVER_ADDR_BYTES_MAX}",
                server_addr.len()
            )));
        }
        let record = TargetRecord { target, server_addr: server_addr.into(), used_bytes, free_bytes };
        self.write(|tables| {
            tables.targets.insert(target.0, record.encode().as_slice())?;
            Ok(())
        })
    }

    /// Every target ever recorded, in id order.
    pub fn targets(&self) -> Result<Vec<TargetRecord>, NamespaceError> {
        self.read(|tables| {
            let mut out = Vec::new();
            for item in tables.targets.iter()? {
                let (key, value) = item?;
                out.push(TargetRecord::decode(TargetId(key.value()), value.value())?);
            }
            Ok(out)
        })
    }
}
