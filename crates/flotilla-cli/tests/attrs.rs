//! The library's coherent attribute cache (issue 12; inode tokens, GPFS §2): a library
//! client's `stat` answers from its cache without asking the metadata service (counted by
//! the service's metrics), and yet after another client's change was acknowledged — a
//! chmod, a write and close (size), a rename, a rename over, an unlink — the very next
//! stat sees it. A holder that is stopped (SIGSTOP) holds a change up only for the
//! service's bounded wait, and answers from the service once it runs again.
//!
//! Real processes: `flotilla local` (metadata service, I/O server and metrics endpoint) on
//! loopback ports it picks; two library clients in this process, and one in a helper
//! process (this test binary run again) for the stopped holder.

mod common;

use common::Local;
use flotilla_client::{Client, ClientError, CreateOptions, ErrorCode, SetAttr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Lookups of any kind (a stat that asks the service makes one).
fn lookups(local: &Local) -> u64 {
    local.meta_requests("lookup") + local.meta_requests("lookup_cached")
}

/// Stats `path` through `client` until a stat asks the service nothing (the cache holds
/// it and the client's token poll is fresh); fails after 10 s.
fn stat_until_cached(local: &Local, client: &Client, path: &str) -> flotilla_client::EntryInfo {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = lookups(local);
        let entry = client.stat(path).expect("stat");
        if lookups(local) == before {
            return entry;
        }
        assert!(Instant::now() < deadline, "{path} never came from the cache");
    }
}

fn mode_change(mode: u32) -> SetAttr {
    SetAttr { mode: Some(mode), ..SetAttr::default() }
}

fn is_not_found(result: Result<flotilla_client::EntryInfo, ClientError>) -> bool {
    matches!(result, Err(ClientError::Meta(error)) if error.code == ErrorCode::NotFound)
}

/// The cases: A caches a file's entry, B changes it, A's next stat after B's call
/// returned sees the change.
#[test]
fn a_change_by_another_client_is_seen_by_the_next_stat() {
    let local = Local::start(1, true);
    let (a, b) = (local.client(), local.client());
    b.mkdir("/d", 0o755).expect("mkdir");
    b.create("/d/f", &CreateOptions::default()).expect("create").close().expect("close");
    let id = b.stat("/d/f").expect("stat on B").id;

    // chmod
    assert_eq!(stat_until_cached(&local, &a, "/d/f").attrs.mode & 0o7777, 0o644);
    b.set_attr(id, mode_change(0o600)).expect("chmod on B");
    assert_eq!(a.stat("/d/f").expect("stat on A").attrs.mode & 0o7777, 0o600, "A saw the old mode");

    // a write and close: the size
    assert_eq!(stat_until_cached(&local, &a, "/d/f").attrs.size_bytes, 0);
    let file = b.open("/d/f").expect("open on B");
    file.write_at(0, b"hello, attributes").expect("write on B");
    file.close().expect("close on B");
    assert_eq!(a.stat("/d/f").expect("stat on A").attrs.size_bytes, 17, "A saw the old size");

    // rename
    stat_until_cached(&local, &a, "/d/f");
    b.rename("/d/f", "/d/g").expect("rename on B");
    assert!(is_not_found(a.stat("/d/f")), "A still found the renamed name");
    assert_eq!(a.stat("/d/g").expect("stat the new name on A").id, id);

    // rename over an entry A cached
    b.create("/d/h", &CreateOptions::default()).expect("create h").close().expect("close h");
    let replaced = stat_until_cached(&local, &a, "/d/h").id;
    assert_ne!(replaced, id);
    b.rename("/d/g", "/d/h").expect("rename over on B");
    assert_eq!(a.stat("/d/h").expect("stat on A").id, id, "A saw the replaced file");

    // unlink
    stat_until_cached(&local, &a, "/d/h");
    b.remove("/d/h").expect("unlink on B");
    assert!(is_not_found(a.stat("/d/h")), "A still found the removed file");

    // a directory on the way renamed: the path through it goes
    b.create("/d/k", &CreateOptions::default()).expect("create k").close().expect("close k");
    stat_until_cached(&local, &a, "/d/k");
    b.rename("/d", "/e").expect("rename the directory on B");
    assert!(is_not_found(a.stat("/d/k")), "A still found a name under the renamed directory");
    assert!(a.stat("/e/k").is_ok());
}

/// A client that creates files and then stats them never asks the service for them (the
/// creates bring the grants), while a client with the cache off asks once per stat.
#[test]
fn stats_of_files_a_client_created_ask_nothing() {
    const FILES: usize = 200;
    let local = Local::start(1, true);
    let a = local.client();
    a.mkdir("/many", 0o755).expect("mkdir");
    for i in 0..FILES {
        a.create(&format!("/many/f{i:04}"), &CreateOptions::default())
            .expect("create")
            .close()
            .expect("close");
    }
    // The poll thread's first poll makes the cache usable (it returns at once).
    stat_until_cached(&local, &a, "/many/f0000");
    let before = lookups(&local);
    for round in 0..3 {
        for i in 0..FILES {
            let entry = a.stat(&format!("/many/f{i:04}")).expect("stat");
            assert_eq!(entry.attrs.size_bytes, 0, "round {round}");
        }
    }
    assert_eq!(lookups(&local) - before, 0, "stats of created files asked the service");

    let mut config = flotilla_client::ClientConfig::new(&local.meta);
    config.key = Some(local.key.clone());
    config.attr_cache = false;
    let off = Client::with_config(config).expect("client with the cache off");
    let before = lookups(&local);
    for i in 0..FILES {
        off.stat(&format!("/many/f{i:04}")).expect("stat");
    }
    assert_eq!(lookups(&local) - before, FILES as u64, "with the cache off every stat asks once");
}

/// A holder that is SIGSTOPped holds another client's change up for the service's bounded
/// wait only (`token_wait_ms_max`, 1 s); the change then succeeds, and the holder, running
/// again, sees it on its next stat (its cache went stale while it was stopped).
#[test]
fn a_stopped_holder_delays_a_change_only_for_the_bounded_wait() {
    let local = Local::start(1, true);
    let b = local.client();
    b.create("/held", &CreateOptions::default()).expect("create").close().expect("close");
    let id = b.stat("/held").expect("stat").id;
    let mut holder = Holder::start(&local);
    // The helper caches it (its repeated stats stop asking the service).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = lookups(&local);
        assert_eq!(holder.stat("/held"), "mode=644");
        if lookups(&local) == before {
            break;
        }
        assert!(Instant::now() < deadline, "the helper never cached /held");
    }
    holder.signal(libc::SIGSTOP);
    let started = Instant::now();
    let outcome = b.set_attr(id, mode_change(0o640));
    let waited = started.elapsed();
    holder.signal(libc::SIGCONT);
    outcome.expect("the chmod succeeds after the bounded wait");
    eprintln!("a chmod with a stopped holder took {waited:?}");
    assert!(waited < Duration::from_secs(5), "the chmod waited {waited:?}");
    assert_eq!(holder.stat("/held"), "mode=640", "the stopped holder answered from its stale cache");
    // And it caches again, coherently.
    b.set_attr(id, mode_change(0o604)).expect("chmod again");
    assert_eq!(holder.stat("/held"), "mode=604");
}

/// The helper process: `flotilla stat --json -`, one library client that stats each path
/// read from stdin and prints one JSON line per path (`mode=...` or `error=...` here).
struct Holder {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Holder {
    fn start(local: &Local) -> Holder {
        let mut child = Command::new(common::FLOTILLA)
            .args(["--key", common::path(&local.key), "stat", "--meta", &local.meta, "--json", "-"])
            .env_remove("FLOTILLA_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the helper");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Holder { child, stdin, lines }
    }

    fn stat(&mut self, path: &str) -> String {
        writeln!(self.stdin, "{path}").expect("ask the helper");
        self.stdin.flush().expect("flush");
        let line = self.lines.next().expect("a line from the helper").expect("utf-8");
        let answer: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        match answer["mode"].as_u64() {
            Some(mode) => format!("mode={:o}", mode & 0o7777),
            None => format!("error={}", answer["error"]),
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill with a valid signal on our own child's pid.
        let done = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(done, 0, "signal the helper");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
