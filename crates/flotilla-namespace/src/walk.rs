//! Path resolution: from an absolute path to inode ids, following symbolic links.
//!
//! Symlinks in the middle of a path are always followed (an absolute target restarts at the
//! root, a relative one continues from the link's directory, `..` climbs); a symlink as the
//! last component is followed only on request. At most `SYMLINK_FOLLOWS_MAX` links are
//! followed per path. Resolution keeps the stack of directories walked through (for `..`).
//!
//! A place may also be given as (directory id, name), as the mount does; `is_within` walks
//! up the `dir_parents` table, which `rename` uses to refuse moving a directory into its
//! own subtree whichever way its places were given.

use crate::access::{require, SEARCH};
use crate::error::NamespaceError;
use crate::record::{Body, Inode};
use crate::schema::ROOT_ID;
use crate::tables::Source;
use flotilla_types::{check_name, split_path, Caller, NameError, NAME_BYTES_MAX};
use std::collections::VecDeque;

/// Most symbolic links followed while resolving one path, as on Linux.
pub const SYMLINK_FOLLOWS_MAX: usize = 40;

/// An existing entry found by path.
pub(crate) struct Walked {
    pub(crate) id: u64,
    pub(crate) inode: Inode,
}

/// The place a path names: an existing directory and a name in it, maybe taken.
pub(crate) struct Located<'p> {
    pub(crate) parent: u64,
    pub(crate) name: &'p [u8],
    pub(crate) child: Option<u64>,
}

/// Resolves an existing entry.
/// `who` needs search permission on every directory walked through.
pub(crate) fn resolve(
    source: &impl Source,
    path: &str,
    follow_final: bool,
    who: &Caller,
) -> Result<Walked, NamespaceError> {
    let components = split_path(path)?;
    walk(source, path, owned(&components), follow_final, who)
}

/// Resolves the parent directory of `path` and looks its last component up without
/// following it. The root has no parent, so `/` is refused. `who` needs search permission
/// on every directory walked through, the parent included.
pub(crate) fn locate<'p>(
    source: &impl Source,
    path: &'p str,
    who: &Caller,
) -> Result<Located<'p>, NamespaceError> {
    let mut components = split_path(path)?;
    let name = components
        .pop()
        .ok_or_else(|| NamespaceError::invalid(format!("{path:?} names the root directory")))?;
    let parent = walk(source, path, owned(&components), true, who)?;
    if !parent.inode.is_directory() {
        return Err(NamespaceError::NotADirectory { path: path.into() });
    }
    require(&parent.inode.attrs, who, SEARCH, &format!("parent directory of {path}"))?;
    let name = name.as_bytes();
    Ok(Located { parent: parent.id, name, child: source.child(parent.id, name)? })
}

/// Where a name is: at the end of an absolute path (resolved component by component from
/// the root), or in a directory named by its inode id (the mount's way: the kernel names
/// directories by inode, so no path is ever rebuilt and a rename elsewhere cannot redirect it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place<'a> {
    Path(&'a str),
    /// `name` is one directory entry's name: any bytes but '/' and NUL, not "." or "..".
    At {
        parent: u64,
        name: &'a [u8],
    },
}

impl Place<'_> {
    /// The place in messages: the path, or the name and its directory's id.
    pub fn describe(&self) -> String {
        match self {
            Place::Path(path) => (*path).to_string(),
            Place::At { parent, name } => {
                format!("{:?} in directory {parent:016x}", String::from_utf8_lossy(name))
            }
        }
    }
}

/// Most directories between the root and any directory: bounds the walk up the
/// `dir_parents` table (paths are bounded by `PATH_BYTES_MAX`, ids are not).
pub const DIRECTORY_DEPTH_MAX: usize = 1 << 16;

/// Resolves the directory and name `place` names, as `locate` does for a path. For a place
/// `At` a directory id, `who` needs search permission on that directory only (the caller
/// reached it by an earlier lookup, which checked the way there).
pub(crate) fn locate_place<'p>(
    source: &impl Source,
    place: Place<'p>,
    who: &Caller,
) -> Result<Located<'p>, NamespaceError> {
    let (parent, name) = match place {
        Place::Path(path) => return locate(source, path, who),
        Place::At { parent, name } => (parent, name),
    };
    check_name_bytes(name)?;
    let dir = source.inode(parent)?.ok_or_else(|| crate::namespace::not_found_id(parent))?;
    if !dir.is_directory() {
        return Err(NamespaceError::NotADirectory { path: format!("inode {parent:016x}") });
    }
    require(&dir.attrs, who, SEARCH, &format!("directory {parent:016x}"))?;
    Ok(Located { parent, name, child: source.child(parent, name)? })
}

/// Checks one entry name given as bytes, by the rules `check_name` applies to UTF-8 names.
pub(crate) fn check_name_bytes(name: &[u8]) -> Result<(), NamespaceError> {
    let shown = || String::from_utf8_lossy(name).into_owned();
    let error = if name.is_empty() {
        NameError::Empty
    } else if name.len() > NAME_BYTES_MAX {
        NameError::TooLong { name: shown().chars().take(32).collect(), length: name.len() }
    } else if name.contains(&0) || name.contains(&b'/') {
        NameError::BadCharacter { name: shown() }
    } else if name == b"." || name == b".." {
        NameError::DotComponent { path: shown() }
    } else {
        return Ok(());
    };
    Err(error.into())
}

/// Whether directory `dir` is `ancestor` or lies below it, by walking up `dir_parents`.
pub(crate) fn is_within(source: &impl Source, dir: u64, ancestor: u64) -> Result<bool, NamespaceError> {
    let mut at = dir;
    for _ in 0..DIRECTORY_DEPTH_MAX {
        if at == ancestor {
            return Ok(true);
        }
        if at == ROOT_ID {
            return Ok(false);
        }
        at = source
            .dir_parent(at)?
            .ok_or_else(|| NamespaceError::corrupt(format!("directory {at:016x} has no parent")))?;
    }
    Err(NamespaceError::corrupt(format!(
        "directory {dir:016x} is more than {DIRECTORY_DEPTH_MAX} levels deep (a cycle?)"
    )))
}

fn owned(components: &[&str]) -> VecDeque<String> {
    components.iter().map(|name| name.to_string()).collect()
}

fn walk(
    source: &impl Source,
    path: &str,
    mut queue: VecDeque<String>,
    follow_final: bool,
    who: &Caller,
) -> Result<Walked, NamespaceError> {
    let mut stack = vec![ROOT_ID];
    let mut follows = 0;
    while let Some(name) = queue.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let parent = stack.last().copied().unwrap_or(ROOT_ID);
        crate::touched::note_walk(parent);
        if !who.is_root() {
            require(&source.load(parent)?.attrs, who, SEARCH, &format!("a directory on the way to {path}"))?;
        }
        let id = source
            .child(parent, name.as_bytes())?
            .ok_or_else(|| NamespaceError::NotFound { path: path.into() })?;
        let inode = source.load(id)?;
        let last = queue.is_empty();
        match &inode.body {
            Body::Directory { .. } => stack.push(id),
            Body::Symlink { target } if !last || follow_final => {
                follows += 1;
                if follows > SYMLINK_FOLLOWS_MAX {
                    return Err(NamespaceError::TooManySymlinks { path: path.into() });
                }
                if target.starts_with('/') {
                    stack.truncate(1);
                }
                prepend_target(&mut queue, target)?;
            }
            _ if last => return Ok(Walked { id, inode }),
            _ => return Err(NamespaceError::NotADirectory { path: path.into() }),
        }
    }
    let id = stack.pop().unwrap_or(ROOT_ID);
    let inode = source.load(id)?;
    Ok(Walked { id, inode })
}

/// Puts the components of a symlink target in front of the components still to walk.
fn prepend_target(queue: &mut VecDeque<String>, target: &str) -> Result<(), NamespaceError> {
    let parts: Vec<&str> = target.split('/').filter(|part| !part.is_empty() && *part != ".").collect();
    for part in parts.iter().rev() {
        if *part != ".." {
            check_name(part)?;
        }
        queue.push_front(part.to_string());
    }
    Ok(())
}
