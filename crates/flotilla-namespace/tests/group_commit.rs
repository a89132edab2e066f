//! Group commit with concurrent writers: changes that fail fail alone, the changes around
//! them in the same batches commit, and everything acknowledged is in the database when it
//! is opened again.

use flotilla_namespace::*;

const OWNER: Owner = Owner { mode: 0o755, uid: 0, gid: 0 };
const THREADS: usize = 8;
const DIRS_PER_THREAD: usize = 60;

#[test]
fn failing_changes_fail_alone_and_every_acknowledged_change_is_kept() {
    let holder = tempfile::tempdir().unwrap();
    let path = holder.path().join("namespace.redb");
    let namespace = Namespace::open(&path).unwrap();
    // Long delay, small batches: batches fill up and mix failing and succeeding changes.
    namespace.set_group_commit(GroupCommit {
        batch_ops_max: 5,
        batch_delay_us_max: 20_000,
        batch_linger_us_max: 20_000,
    });
    namespace.mkdir("/taken", OWNER, 1).unwrap();
    let outcomes: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let namespace = &namespace;
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    let (mut made, mut refused) = (0, 0);
                    for index in 0..DIRS_PER_THREAD {
                        namespace.mkdir(&format!("/t{thread}-{index}"), OWNER, 2).expect("a new name");
                        made += 1;
                        let error = namespace.mkdir("/taken", OWNER, 3).expect_err("an existing name");
                        assert!(matches!(error, NamespaceError::AlreadyExists { .. }), "{error}");
                        refused += 1;
                    }
                    (made, refused)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("writer thread")).collect()
    });
    assert!(outcomes.iter().all(|&(made, refused)| made == DIRS_PER_THREAD && refused == DIRS_PER_THREAD));
    // An existing name is refused before anything is written, so the refusals left the
    // changes sharing their transactions alone: none was applied again, and every made
    // directory (and "/taken") joined a batch once.
    let stats = namespace.commit_stats();
    assert_eq!(stats.reapplied, 0, "{stats:?}");
    assert_eq!(stats.changes, (THREADS * DIRS_PER_THREAD) as u64 + 1, "{stats:?}");
    drop(namespace);

    let reopened = Namespace::open(&path).unwrap();
    let names = reopened.readdir("/").unwrap();
    assert_eq!(names.len(), THREADS * DIRS_PER_THREAD + 1, "entries after reopening");
    for thread in 0..THREADS {
        for index in 0..DIRS_PER_THREAD {
            reopened.lookup(&format!("/t{thread}-{index}")).expect("an acknowledged mkdir");
        }
    }
}

/// Changes that must be visible when their call returns (inside `with_deferred_ack`)
/// commit their shared transaction at once, so committers often find no transaction open
/// and begin an empty one while other writers open theirs: a mix that must never stall.
#[test]
fn deferred_and_grouped_changes_mixed_never_stall_and_all_are_kept() {
    const WRITERS: usize = 6;
    const CHANGES_PER_WRITER: usize = 150;
    let holder = tempfile::tempdir().unwrap();
    let path = holder.path().join("namespace.redb");
    let namespace = std::sync::Arc::new(Namespace::open(&path).unwrap());
    namespace.set_group_commit(GroupCommit {
        batch_ops_max: 4,
        batch_delay_us_max: 200,
        batch_linger_us_max: 200,
    });
    let (done, finished) = std::sync::mpsc::channel();
    // Threads of their own, not scoped: a stalled writer must fail the test, not hang it.
    for writer in 0..WRITERS {
        let (namespace, done) = (std::sync::Arc::clone(&namespace), done.clone());
        std::thread::spawn(move || {
            for index in 0..CHANGES_PER_WRITER {
                let path = format!("/w{writer}-{index}");
                if (writer + index) % 2 == 0 {
                    namespace.with_deferred_ack(|| namespace.mkdir(&path, OWNER, 2)).unwrap().unwrap();
                } else {
                    namespace.mkdir(&path, OWNER, 2).unwrap();
                }
            }
            drop(namespace);
            done.send(writer).unwrap();
        });
    }
    for _ in 0..WRITERS {
        // Far longer than the work needs on a loaded machine: not reaching it means a stall.
        finished.recv_timeout(std::time::Duration::from_secs(120)).expect("a writer stalled");
    }
    drop(namespace);
    let reopened = Namespace::open(&path).unwrap();
    assert_eq!(reopened.readdir("/").unwrap().len(), WRITERS * CHANGES_PER_WRITER, "entries after reopening");
}
