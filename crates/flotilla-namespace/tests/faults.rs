//! Crash consistency: a storage backend that starts failing after a budget of writes, at
//! every possible point of one operation. After reopening on whatever bytes were written,
//! the namespace must show the state from before the operation or the state after it,
//! never a mix (for example a file removed without its pending deletions).
//!
//! Writes that succeed are kept, so this models a disk that starts failing rather than lost
//! power (redb's own crash tests cover unsynced writes being lost).

use flotilla_namespace::*;
use flotilla_types::TargetId;
use redb::backends::InMemoryBackend;
use redb::StorageBackend;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

const OWNER: Owner = Owner { mode: 0o644, uid: 0, gid: 0 };
const TARGETS: [TargetId; 2] = [TargetId(1), TargetId(2)];

/// Shares bytes with the next backend opened on them; fails every write once the budget
/// of writes is spent.
#[derive(Debug, Clone)]
struct Faulty {
    bytes: Arc<InMemoryBackend>,
    writes_left: Arc<AtomicI64>,
}

impl Faulty {
    fn spend(&self) -> io::Result<()> {
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(io::Error::other("injected write failure"));
        }
        Ok(())
    }
}

impl StorageBackend for Faulty {
    fn len(&self) -> io::Result<u64> {
        self.bytes.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.bytes.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.spend()?;
        self.bytes.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.spend()?;
        self.bytes.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.spend()?;
        self.bytes.write(offset, data)
    }
}

fn live() -> Vec<TargetUsage> {
    TARGETS.iter().map(|target| TargetUsage { target: *target, used_bytes: 0, free_bytes: 100 }).collect()
}

/// Every entry (path, kind, nlink, size) in tree order, plus the subfile indexes of every
/// pending deletion (file ids are random, so they differ between runs).
fn snapshot(ns: &Namespace) -> String {
    let mut out = String::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        let path = if dir.is_empty() { "/".to_string() } else { dir.clone() };
        for entry in ns.readdir(&path).unwrap() {
            let child = format!("{dir}/{}", entry.name_lossy());
            let attrs = ns.lookup(&child).unwrap().attrs;
            out += &format!("{child} {:?} {} {}\n", attrs.kind, attrs.nlink, attrs.size_bytes);
            if entry.kind == flotilla_types::FileKind::Directory {
                stack.push(child);
            }
        }
    }
    for target in TARGETS {
        let pending = ns.pending_deletes(target, 100).unwrap();
        let indexes: Vec<u32> = pending.iter().map(|(_, index)| index.0).collect();
        out += &format!("{target}: {indexes:?}\n");
    }
    out
}

fn setup(ns: &Namespace) {
    let spec = CreateFile { owner: OWNER, subfile_count: 2, targets: None, layout: None, exclusive: true };
    ns.mkdir("/d", OWNER, 1).unwrap();
    ns.mkdir("/d/e", OWNER, 1).unwrap();
    ns.create_file("/d/f", &spec, &live(), 2).unwrap();
    ns.create_file("/h", &spec, &live(), 3).unwrap();
}

type Operation = fn(&Namespace) -> Result<(), NamespaceError>;

fn operations() -> Vec<(&'static str, Operation)> {
    vec![
        ("rename over a file", |ns| ns.rename("/d/f", "/h", 9).map(drop)),
        ("rename a directory", |ns| ns.rename("/d/e", "/e", 9).map(drop)),
        ("unlink", |ns| ns.unlink("/h", 9).map(drop)),
        ("create", |ns| {
            let spec =
                CreateFile { owner: OWNER, subfile_count: 1, targets: None, layout: None, exclusive: true };
            ns.create_file("/d/new", &spec, &live(), 9).map(drop)
        }),
    ]
}

/// Runs one operation with a budget of `budget` writes; returns whether it succeeded and
/// the state seen after reopening.
fn run_with_budget(operation: Operation, budget: i64) -> (bool, String, String, String) {
    let faulty =
        Faulty { bytes: Arc::new(InMemoryBackend::new()), writes_left: Arc::new(AtomicI64::new(i64::MAX)) };
    let ns = Namespace::open_with_backend(faulty.clone()).unwrap();
    setup(&ns);
    let before = snapshot(&ns);
    let mut expected_after = String::new();
    {
        // Learn the state after the operation on an unfailing copy of the same history.
        let copy = Namespace::open_in_memory().unwrap();
        setup(&copy);
        operation(&copy).unwrap();
        expected_after += &snapshot(&copy);
    }
    faulty.writes_left.store(budget, Ordering::SeqCst);
    let succeeded = operation(&ns).is_ok();
    drop(ns);
    faulty.writes_left.store(i64::MAX, Ordering::SeqCst);
    let reopened = Namespace::open_with_backend(faulty).unwrap();
    (succeeded, before, expected_after, snapshot(&reopened))
}

#[test]
fn every_failure_point_leaves_before_or_after() {
    for (name, operation) in operations() {
        for budget in 0..200 {
            let (succeeded, before, after, seen) = run_with_budget(operation, budget);
            assert!(
                seen == before || seen == after,
                "{name}, budget {budget}: neither before nor after:\n{seen}"
            );
            if succeeded {
                assert!(budget > 1, "{name}: succeeded with only {budget} writes");
                assert_eq!(seen, after, "{name}: a success must be durable");
                break;
            }
            assert!(budget < 199, "{name} never succeeded");
        }
    }
}
