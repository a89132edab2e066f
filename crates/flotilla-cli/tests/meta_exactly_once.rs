//! Exactly-once across the nodes of a metadata group (issue 33): a client owns its group
//! session and resends an unanswered change with the same (session, sequence) to the new
//! leader, which answers with the first reply.
//!
//! Each node runs with the debug-build test hook `FLOTILLA_TEST_KILL_AFTER_COMMIT`: the
//! leader that applies a change naming `lost-reply` SIGKILLs itself before answering, so
//! the change is committed and its reply lost. The client (following the leader over all
//! three addresses) must answer each change with success exactly once — including a hard
//! link by path, which a plain resend would answer `AlreadyExists`.

mod common;

/// The I/O server logs errors only (its leader chase is expected here).
fn quiet() -> Vec<(String, String)> {
    vec![("FLOTILLA_LOG".into(), "error".into())]
}

use common::metagroup::MetaGroup;
use std::time::{Duration, Instant};

const REPLAYED: &str = "a resent change answered with its first reply";

/// SIGKILLs the I/O server when the test ends, passed or not.
struct Killed(Option<common::Process>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(process) = self.0.take() {
            process.kill();
        }
    }
}

fn start_server(meta: &str, target: &std::path::Path) -> common::Process {
    let key = common::server_key();
    let spec = common::target_spec(target);
    let args = [
        "--key",
        common::path(&key),
        "server",
        "--meta",
        meta,
        "--target",
        common::path(&spec),
        "--listen",
        "127.0.0.1:0",
    ];
    common::Process::start_with_env(&args, "server", &quiet()).expect("start the I/O server")
}

#[test]
fn a_change_whose_reply_was_lost_is_applied_once_and_answered_by_the_next_leader() {
    if cfg!(not(debug_assertions)) {
        println!("skipped: the kill-after-commit hook exists in debug builds only");
        return;
    }
    let mut group = MetaGroup::loopback(3, &[("FLOTILLA_TEST_KILL_AFTER_COMMIT", "lost-reply")]);
    let meta = group.addresses();
    group.leader();
    let target = group.dir.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let server = Killed(Some(start_server(&meta, &target)));
    let client = common::client_at(&meta);
    // The server registers through the leader; a create waits for it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.status().map(|targets| targets.is_empty()).unwrap_or(true) {
        assert!(Instant::now() < deadline, "the I/O server did not register");
        std::thread::sleep(Duration::from_millis(100));
    }
    client.mkdir("/base", 0o755).expect("mkdir /base");

    type Step<'a> =
        (&'a str, Box<dyn Fn(&flotilla_client::Client) -> Result<(), flotilla_client::ClientError>>);
    let steps: Vec<Step> = vec![
        ("mkdir", Box::new(|c| c.mkdir("/lost-reply-dir", 0o755).map(|_| ()))),
        (
            "create",
            Box::new(|c| {
                c.create("/base/lost-reply-file", &flotilla_client::CreateOptions::default()).map(|_| ())
            }),
        ),
        ("link", Box::new(|c| c.link("/base/lost-reply-file", "/base/lost-reply-link").map(|_| ()))),
        ("rename", Box::new(|c| c.rename("/base/lost-reply-link", "/base/lost-reply-moved"))),
        ("unlink", Box::new(|c| c.remove("/base/lost-reply-moved"))),
    ];
    for (what, step) in &steps {
        let before: usize = group.nodes.iter().map(|n| n.log_text().matches(REPLAYED).count()).sum();
        let leader = group.leader();
        let started = Instant::now();
        step(&client).unwrap_or_else(|e| panic!("{what} after its reply was lost: {e}"));
        println!("{what}: answered {:?} after the leader applied it and was killed", started.elapsed());
        // The leader applied it and died before answering: its reply was lost.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group.nodes[leader].exited() {
            assert!(Instant::now() < deadline, "{what}: the leader did not apply it (the hook did not fire)");
            std::thread::sleep(Duration::from_millis(20));
        }
        let after: usize = group.nodes.iter().map(|n| n.log_text().matches(REPLAYED).count()).sum();
        assert_eq!(after, before + 1, "{what}: the resend was not answered from the reply table");
        group.nodes[leader].start();
    }
    // Each change took effect once: the directory and the file, the link renamed and removed.
    let names = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = client.readdir(dir).unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        names
    };
    assert!(names("/").contains(&"lost-reply-dir".to_string()), "{:?}", names("/"));
    assert_eq!(names("/base"), ["lost-reply-file"]);
    drop(client);
    drop(server);
}
