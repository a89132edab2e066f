//! Property test: random sequences of mkdir, create, link, unlink, rmdir and rename run
//! against the namespace and against a plain in-memory model (a map from path to node);
//! after every step the results, errnos, kinds, link counts, listings and pending deletions
//! must agree.

use flotilla_namespace::*;
use flotilla_types::{FileKind, TargetId};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

const NAMES: [&str; 3] = ["a", "b", "c"];
const TARGET: TargetId = TargetId(77);
const OWNER: Owner = Owner { mode: 0o700, uid: 1, gid: 1 };

/// Every path of depth 1 to 3 over `NAMES`.
fn universe() -> Vec<String> {
    let mut paths = Vec::new();
    let mut frontier = vec![String::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for prefix in &frontier {
            for name in NAMES {
                next.push(format!("{prefix}/{name}"));
            }
        }
        paths.extend(next.iter().cloned());
        frontier = next;
    }
    paths
}

#[derive(Clone, Debug)]
enum Op {
    Mkdir(usize),
    Create(usize, bool),
    Unlink(usize),
    Rmdir(usize),
    Rename(usize, usize),
    Link(usize, usize),
}

/// An index into `universe()`, biased toward shallow paths so that deep ones often have
/// parents (depth 1 is `0..3`, depth 2 is `3..12`, depth 3 is `12..39`).
fn path() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..3usize, 4 => 3..12usize, 3 => 12..39usize]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => path().prop_map(Op::Mkdir),
        3 => (path(), any::<bool>()).prop_map(|(p, e)| Op::Create(p, e)),
        2 => path().prop_map(Op::Unlink),
        2 => path().prop_map(Op::Rmdir),
        3 => (path(), path()).prop_map(|(p, q)| Op::Rename(p, q)),
        2 => (path(), path()).prop_map(|(p, q)| Op::Link(p, q)),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    /// A file, by identity (hard links share it).
    File(u32),
}

/// What an operation returned, reduced to what the model can predict.
type Outcome = Result<bool, i32>;

#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    next_file: u32,
    deleted_files: usize,
}

fn parent_of(path: &str) -> &str {
    &path[..path.rfind('/').unwrap_or(0)]
}

impl Model {
    fn node(&self, path: &str) -> Option<Node> {
        if path.is_empty() {
            Some(Node::Dir)
        } else {
            self.nodes.get(path).copied()
        }
    }

    /// The checks of walking to the parent: first missing is ENOENT, first file ENOTDIR.
    fn walk_parent(&self, path: &str) -> Result<(), i32> {
        let mut prefix = String::new();
        let components: Vec<&str> = path.split('/').skip(1).collect();
        for name in &components[..components.len() - 1] {
            prefix = format!("{prefix}/{name}");
            match self.node(&prefix) {
                None => return Err(ENOENT),
                Some(Node::File(_)) => return Err(ENOTDIR),
                Some(Node::Dir) => {}
            }
        }
        Ok(())
    }

    fn locate(&self, path: &str) -> Result<Option<Node>, i32> {
        self.walk_parent(path)?;
        Ok(self.node(path))
    }

    fn children(&self, dir: &str) -> Vec<String> {
        let prefix = format!("{dir}/");
        self.nodes
            .keys()
            .filter(|p| p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
            .map(|p| p[prefix.len()..].to_string())
            .collect()
    }

    fn links(&self, file: u32) -> usize {
        self.nodes.values().filter(|n| **n == Node::File(file)).count()
    }

    fn mkdir(&mut self, path: &str) -> Outcome {
        if self.locate(path)?.is_some() {
            return Err(EEXIST);
        }
        self.nodes.insert(path.into(), Node::Dir);
        Ok(false)
    }

    fn create(&mut self, path: &str, exclusive: bool) -> Outcome {
        match (self.locate(path)?, exclusive) {
            (Some(Node::File(_)), false) => Ok(false),
            (Some(Node::Dir), false) => Err(EISDIR),
            (Some(_), true) => Err(EEXIST),
            (None, _) => {
                self.next_file += 1;
                self.nodes.insert(path.into(), Node::File(self.next_file));
                Ok(false)
            }
        }
    }

    /// Removes a file name; true if it was the file's last link.
    fn drop_name(&mut self, path: &str, file: u32) -> bool {
        self.nodes.remove(path);
        let last = self.links(file) == 0;
        self.deleted_files += usize::from(last);
        last
    }

    fn unlink(&mut self, path: &str) -> Outcome {
        match self.locate(path)? {
            None => Err(ENOENT),
            Some(Node::Dir) => Err(EISDIR),
            Some(Node::File(file)) => Ok(self.drop_name(path, file)),
        }
    }

    fn rmdir(&mut self, path: &str) -> Outcome {
        match self.locate(path)? {
            None => Err(ENOENT),
            Some(Node::File(_)) => Err(ENOTDIR),
            Some(Node::Dir) if !self.children(path).is_empty() => Err(ENOTEMPTY),
            Some(Node::Dir) => {
                self.nodes.remove(path);
                Ok(false)
            }
        }
    }

    fn link(&mut self, existing: &str, new: &str) -> Outcome {
        let file = match self.locate(existing)? {
            None => return Err(ENOENT),
            Some(Node::Dir) => return Err(EPERM),
            Some(Node::File(file)) => file,
        };
        if self.locate(new)?.is_some() {
            return Err(EEXIST);
        }
        self.nodes.insert(new.into(), Node::File(file));
        Ok(false)
    }

    fn rename(&mut self, from: &str, to: &str) -> Outcome {
        let moved = self.locate(from)?.ok_or(ENOENT)?;
        let old = self.locate(to)?;
        if from == to || (old == Some(moved) && moved != Node::Dir) {
            return Ok(false);
        }
        if moved == Node::Dir && to.starts_with(&format!("{from}/")) {
            return Err(EINVAL);
        }
        let last = match (moved, old) {
            (_, None) => false,
            (Node::Dir, Some(Node::File(_))) => return Err(ENOTDIR),
            (Node::File(_), Some(Node::Dir)) => return Err(EISDIR),
            (Node::Dir, Some(Node::Dir)) if !self.children(to).is_empty() => return Err(ENOTEMPTY),
            (Node::Dir, Some(Node::Dir)) => {
                self.nodes.remove(to);
                false
            }
            (Node::File(_), Some(Node::File(file))) => self.drop_name(to, file),
        };
        self.move_subtree(from, to);
        Ok(last)
    }

    fn move_subtree(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let keys: Vec<String> =
            self.nodes.keys().filter(|p| *p == from || p.starts_with(&prefix)).cloned().collect();
        for key in keys {
            let node = self.nodes.remove(&key).unwrap();
            self.nodes.insert(format!("{to}{}", &key[from.len()..]), node);
        }
    }
}

fn errno<T>(result: Result<T, NamespaceError>) -> Result<T, i32> {
    result.map_err(|e| e.errno())
}

fn apply(ns: &Namespace, model: &mut Model, paths: &[String], op: &Op, now: i64) {
    let live = [TargetUsage { target: TARGET, used_bytes: 0, free_bytes: 1 << 40 }];
    let spec =
        |exclusive| CreateFile { owner: OWNER, subfile_count: 1, targets: None, layout: None, exclusive };
    let (real, expected): (Outcome, Outcome) = match *op {
        Op::Mkdir(p) => (errno(ns.mkdir(&paths[p], OWNER, now)).map(|_| false), model.mkdir(&paths[p])),
        Op::Create(p, e) => (
            errno(ns.create_file(&paths[p], &spec(e), &live, now)).map(|_| false),
            model.create(&paths[p], e),
        ),
        Op::Unlink(p) => (errno(ns.unlink(&paths[p], now)).map(|r| r.is_some()), model.unlink(&paths[p])),
        Op::Rmdir(p) => (errno(ns.rmdir(&paths[p], now)).map(|_| false), model.rmdir(&paths[p])),
        Op::Rename(p, q) => (
            errno(ns.rename(&paths[p], &paths[q], now)).map(|r| r.is_some()),
            model.rename(&paths[p], &paths[q]),
        ),
        Op::Link(p, q) => {
            (errno(ns.link(&paths[p], &paths[q], now)).map(|_| false), model.link(&paths[p], &paths[q]))
        }
    };
    assert_eq!(real, expected, "{op:?}");
}

/// Compares every path of the universe, every listing and the pending deletions.
fn check(ns: &Namespace, model: &Model, paths: &[String], ids: &mut HashMap<u32, u64>) {
    for path in paths {
        match (model.locate(path), ns.lookup(path)) {
            (Ok(Some(node)), Ok(entry)) => check_entry(ns, model, path, node, &entry, ids),
            (Ok(None), Err(e)) => assert_eq!(e.errno(), ENOENT, "{path}"),
            (Err(code), Err(e)) => assert_eq!(e.errno(), code, "{path}"),
            (expected, real) => panic!("{path}: model {expected:?}, namespace {real:?}"),
        }
    }
    let root: Vec<String> = ns.readdir("/").unwrap().into_iter().map(|e| e.name_lossy()).collect();
    assert_eq!(root, model.children(""));
    let pending = ns.pending_deletes(TARGET, PENDING_DELETES_BATCH_MAX).unwrap();
    assert_eq!(pending.len(), model.deleted_files);
}

fn check_entry(
    ns: &Namespace,
    model: &Model,
    path: &str,
    node: Node,
    entry: &Entry,
    ids: &mut HashMap<u32, u64>,
) {
    match node {
        Node::Dir => {
            let children = model.children(path);
            let subdirs =
                children.iter().filter(|c| model.node(&format!("{path}/{c}")) == Some(Node::Dir)).count();
            assert_eq!(entry.attrs.kind, FileKind::Directory, "{path}");
            assert_eq!(entry.attrs.nlink as usize, 2 + subdirs, "{path}");
            assert_eq!(entry.attrs.size_bytes as usize, children.len(), "{path}");
            let listed: Vec<String> = ns.readdir(path).unwrap().into_iter().map(|e| e.name_lossy()).collect();
            assert_eq!(listed, children, "{path}");
        }
        Node::File(file) => {
            assert_eq!(entry.attrs.kind, FileKind::File, "{path}");
            assert_eq!(entry.attrs.nlink as usize, model.links(file), "{path}");
            assert_eq!(*ids.entry(file).or_insert(entry.id), entry.id, "{path}");
        }
    }
    let parent = parent_of(path);
    let parent_entry = ns.lookup(if parent.is_empty() { "/" } else { parent }).unwrap();
    assert_eq!(parent_entry.attrs.kind, FileKind::Directory);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn namespace_matches_model(ops in prop::collection::vec(op_strategy(), 1..60)) {
        let paths = universe();
        prop_assert_eq!(paths.len(), 39);
        let ns = Namespace::open_in_memory().unwrap();
        let mut model = Model::default();
        let mut ids = HashMap::new();
        for (step, op) in ops.iter().enumerate() {
            apply(&ns, &mut model, &paths, op, step as i64);
            check(&ns, &model, &paths, &mut ids);
        }
    }
}
