//! Permission checks that read the tables, run inside an operation's transaction.

use crate::access::{require, require_remove, SEARCH, WRITE};
use crate::error::NamespaceError;
use crate::tables::Source;
use crate::walk::Located;
use flotilla_types::Caller;

/// `who` may add a name at `place` (write and search on the parent directory).
pub(crate) fn may_add(
    source: &impl Source,
    place: &Located<'_>,
    who: &Caller,
    path: &str,
) -> Result<(), NamespaceError> {
    if who.is_root() {
        return Ok(());
    }
    let parent = source.load(place.parent)?;
    require(&parent.attrs, who, WRITE | SEARCH, &format!("parent directory of {path}"))
}

/// `who` may remove the name at `place`, which names `victim` (write and search on the
/// parent, and the sticky-directory rule).
pub(crate) fn may_remove(
    source: &impl Source,
    place: &Located<'_>,
    victim: u64,
    who: &Caller,
    path: &str,
) -> Result<(), NamespaceError> {
    if who.is_root() {
        return Ok(());
    }
    let parent = source.load(place.parent)?;
    let victim = source.load(victim)?;
    require_remove(&parent.attrs, &victim.attrs, who, path)
}
