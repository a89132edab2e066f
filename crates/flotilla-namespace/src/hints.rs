//! Per-file hints kept beside the inodes: today only the no-overlap hint
//! (`user.flotilla.no_overlap`), which tells clients that the file's writers promised never
//! to write overlapping bytes, so no byte-range tokens are needed for it.

use crate::entry::Entry;
use crate::error::NamespaceError;
use crate::namespace::Namespace;
use crate::schema::NO_OVERLAP;
use crate::tables::Source;
use flotilla_types::{Caller, TimeNs};
use redb::ReadableTable;

impl Namespace {
    /// Sets or clears the no-overlap hint of file `id`. Only the file's owner or root may;
    /// the change is a metadata change (ctime).
    pub fn set_no_overlap_as(
        &self,
        who: &Caller,
        id: u64,
        no_overlap: bool,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| crate::namespace::not_found_id(id))?;
            if inode.file_record(id).is_none() {
                return Err(NamespaceError::InvalidArgument {
                    what: format!("inode {id:016x} is not a file: only files take the no-overlap hint"),
                });
            }
            if !who.is_root() && who.uid != inode.attrs.uid {
                return Err(NamespaceError::NotPermitted {
                    what: format!("set the no-overlap hint of inode {id:016x} (not its owner)"),
                });
            }
            if no_overlap {
                tables.no_overlap.insert(id, ())?;
            } else {
                tables.no_overlap.remove(id)?;
            }
            inode.attrs.ctime_ns = now_ns;
            tables.put(id, &inode)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Every file with the no-overlap hint (read once when the service starts).
    pub fn no_overlap_files(&self) -> Result<Vec<u64>, NamespaceError> {
        self.read_txn(|txn| {
            let table = match txn.open_table(NO_OVERLAP) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(error) => return Err(error.into()),
            };
            let mut ids = Vec::new();
            for item in table.iter()? {
                ids.push(item?.0.value());
            }
            Ok(ids)
        })
    }
}
