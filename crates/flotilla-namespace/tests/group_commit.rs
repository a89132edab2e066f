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
