//! The inodes the kernel knows, with the name each was last seen under.
//!
//! The kernel names entries by inode number and the metadata service by path, so the mount
//! remembers, for every inode the kernel holds a reference to, its parent directory and its
//! name there; a path is rebuilt by walking up to the root. This is sound for directories,
//! which have exactly one name, and gives *a* name of a file with several hard links (the
//! callers that act on a file by path check the id they reach).
//!
//! Invariants: the root (inode 1) is always present and never forgotten; an entry lives while
//! the kernel's lookup count for it is above zero (every successful entry reply adds one,
//! `forget` removes what the kernel says); the table holds at most `nodes_max` entries.

use fuser::Errno;
use std::collections::HashMap;

/// The root directory's inode number, in the kernel and in the namespace alike.
pub const ROOT_INO: u64 = 1;
/// Longest name of one path component, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest path, as on Linux.
const PATH_BYTES_MAX: usize = 4096;

struct Node {
    parent: u64,
    name: String,
    lookups: u64,
}

struct Tables {
    nodes: HashMap<u64, Node>,
    /// (parent, name) → inode, for renames (the kernel names the moved entry by name).
    children: HashMap<(u64, String), u64>,
}

pub struct NodeTable {
    tables: parking_lot::Mutex<Tables>,
    nodes_max: usize,
}

impl NodeTable {
    pub fn new(nodes_max: usize) -> NodeTable {
        assert!(nodes_max >= 1);
        let mut nodes = HashMap::new();
        nodes.insert(ROOT_INO, Node { parent: ROOT_INO, name: String::new(), lookups: 1 });
        NodeTable { tables: parking_lot::Mutex::new(Tables { nodes, children: HashMap::new() }), nodes_max }
    }

    /// Records one more kernel reference to `ino`, known as `name` in `parent`.
    pub fn remember(&self, ino: u64, parent: u64, name: &str) -> Result<(), Errno> {
        if ino == ROOT_INO {
            return Ok(());
        }
        let mut tables = self.tables.lock();
        let full = tables.nodes.len() >= self.nodes_max;
        let previous = match tables.nodes.get_mut(&ino) {
            Some(node) => {
                node.lookups += 1;
                let old = (node.parent, std::mem::replace(&mut node.name, name.to_string()));
                node.parent = parent;
                Some(old)
            }
            None if full => return Err(Errno::ENFILE),
            None => {
                tables.nodes.insert(ino, Node { parent, name: name.to_string(), lookups: 1 });
                None
            }
        };
        if let Some(old) = previous {
            if tables.children.get(&old) == Some(&ino) {
                tables.children.remove(&old);
            }
        }
        tables.children.insert((parent, name.to_string()), ino);
        Ok(())
    }

    /// Drops `count` kernel references to `ino`; forgets it when none are left.
    pub fn forget(&self, ino: u64, count: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut tables = self.tables.lock();
        let Some(node) = tables.nodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(count);
        if node.lookups > 0 {
            return;
        }
        let key = (node.parent, std::mem::take(&mut node.name));
        tables.nodes.remove(&ino);
        if tables.children.get(&key) == Some(&ino) {
            tables.children.remove(&key);
        }
    }

    /// The inode the kernel knows as `name` in `parent`, if any.
    pub fn child(&self, parent: u64, name: &str) -> Option<u64> {
        self.tables.lock().children.get(&(parent, name.to_string())).copied()
    }

    /// After a rename: whatever was `name` in `parent` is now `new_name` in `new_parent`.
    pub fn moved(&self, parent: u64, name: &str, new_parent: u64, new_name: &str) {
        let mut tables = self.tables.lock();
        let Some(ino) = tables.children.remove(&(parent, name.to_string())) else { return };
        if let Some(node) = tables.nodes.get_mut(&ino) {
            node.parent = new_parent;
            node.name = new_name.to_string();
        }
        tables.children.insert((new_parent, new_name.to_string()), ino);
    }

    /// The absolute path of `ino`, rebuilt from the names remembered.
    pub fn path(&self, ino: u64) -> Result<String, Errno> {
        let tables = self.tables.lock();
        let mut names = Vec::new();
        let mut at = ino;
        let mut bytes = 0;
        while at != ROOT_INO {
            // Unknown inode: the kernel holds no reference we know of (or we lost it).
            let node = tables.nodes.get(&at).ok_or(Errno::ESTALE)?;
            bytes += node.name.len() + 1;
            if bytes > PATH_BYTES_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            names.push(node.name.as_str());
            at = node.parent;
        }
        if names.is_empty() {
            return Ok("/".to_string());
        }
        let mut path = String::with_capacity(bytes);
        for name in names.iter().rev() {
            path.push('/');
            path.push_str(name);
        }
        Ok(path)
    }

    /// The parent directory `ino` was last seen in (the root's parent is the root).
    pub fn parent(&self, ino: u64) -> u64 {
        self.tables.lock().nodes.get(&ino).map(|node| node.parent).unwrap_or(ROOT_INO)
    }

    /// The path of `name` in directory `parent`, with the name checked as Linux would.
    pub fn child_path(&self, parent: u64, name: &std::ffi::OsStr) -> Result<(String, String), Errno> {
        let name = check_name(name)?;
        let dir = self.path(parent)?;
        let path = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
        if path.len() > PATH_BYTES_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok((path, name.to_string()))
    }
}

/// A name as the namespace accepts it: UTF-8, at most 255 bytes, no '/' or NUL.
pub fn check_name(name: &std::ffi::OsStr) -> Result<&str, Errno> {
    use std::os::unix::ffi::OsStrExt;
    if name.as_bytes().len() > NAME_BYTES_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    let name = name.to_str().ok_or(Errno::EINVAL)?;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn paths_follow_renames_and_forgets() {
        let table = NodeTable::new(16);
        table.remember(10, ROOT_INO, "a").unwrap();
        table.remember(11, 10, "b").unwrap();
        assert_eq!(table.path(11).unwrap(), "/a/b");
        table.moved(ROOT_INO, "a", ROOT_INO, "c");
        assert_eq!(table.path(11).unwrap(), "/c/b");
        assert_eq!(table.child(ROOT_INO, "c"), Some(10));
        assert_eq!(table.child(ROOT_INO, "a"), None);
        table.remember(11, 10, "b").unwrap();
        table.forget(11, 1);
        assert_eq!(table.path(11).unwrap(), "/c/b");
        table.forget(11, 1);
        assert_eq!(table.path(11), Err(Errno::ESTALE));
        assert_eq!(table.path(ROOT_INO).unwrap(), "/");
    }

    #[test]
    fn table_is_bounded_and_names_are_checked() {
        let table = NodeTable::new(2);
        table.remember(10, ROOT_INO, "a").unwrap();
        assert_eq!(table.remember(11, ROOT_INO, "b"), Err(Errno::ENFILE));
        assert_eq!(table.child_path(ROOT_INO, OsStr::new(&"x".repeat(256))), Err(Errno::ENAMETOOLONG));
        assert_eq!(table.child_path(10, OsStr::new("y")).unwrap().0, "/a/y");
        assert_eq!(check_name(OsStr::new("..")), Err(Errno::EINVAL));
    }
}
