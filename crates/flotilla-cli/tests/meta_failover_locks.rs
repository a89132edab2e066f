//! fcntl locks survive a failover of the metadata group (issue 33, "what lives only in
//! memory … reclaimed by clients during a grace period after an election"): the locks live
//! in the leader's memory only; a node elected after the leader is SIGKILLed starts a grace
//! period (`lock_reclaim_ms`) in which only reclaimed locks are granted, and the mounts,
//! following the leader with `--meta a,b,c`, present theirs on the new connection.
//!
//! Real processes: three `flotilla meta` nodes with a group key, one I/O server and two
//! `flotilla mount` processes given every metadata address; locks taken with fcntl by this
//! process (mount A) and by Python processes (mount B). Needs root (to mount).
//!
//! Also: a writer holding a write token through mount A across the kill (its data intact);
//! a library client's attribute cache (inode tokens) across a kill, seeing every change
//! acknowledged after it; an ENWRICH job whose members are mid-run when the leader dies,
//! reclaimed by its members and flushed after the election, every byte read back.

mod common;
mod locking;

use common::enwrich_member::{member_bytes, Member};
use common::{cli, client_at, client_key, path, server_key, test_keys, Mount, Process};
use flotilla_proto::{MetaReply, MetaRequest};
use flotilla_rpc::Connection;
use flotilla_types::SetAttr;
use locking::{check, set_lock, TEST_LOCK, TRY_LOCKF};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The grace period the nodes are configured with, in ms.
const RECLAIM_MS: u64 = 3000;
/// Longest the test waits for a node to start or a leader to be elected.
const WAIT: Duration = Duration::from_secs(15);

fn python(script: &str, file: &Path) -> String {
    let output = Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .stdout(Stdio::piped())
        .output()
        .expect("run python3");
    assert!(output.status.success(), "python3 failed: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Three metadata nodes of one group (killed when dropped).
struct Group {
    _dir: tempfile::TempDir,
    /// (client address, process) of each node.
    nodes: Vec<(String, Option<Process>)>,
    runtime: tokio::runtime::Runtime,
}

impl Group {
    fn start() -> Group {
        let dir = tempfile::tempdir().unwrap();
        // Six distinct ports (a port freed by one probe may come back from the next).
        let mut distinct: Vec<u16> = Vec::new();
        while distinct.len() < 6 {
            let port = free_port();
            if !distinct.contains(&port) {
                distinct.push(port);
            }
        }
        let ports: Vec<(u16, u16)> = distinct.chunks(2).map(|pair| (pair[0], pair[1])).collect();
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, (meta, group))| format!("{}=127.0.0.1:{meta}/127.0.0.1:{group}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let config = dir.path().join("flotilla.toml");
        std::fs::write(&config, format!("[meta]\nlock_reclaim_ms = {RECLAIM_MS}\n")).unwrap();
        let ca = test_keys().join("cluster.key");
        let server_key = server_key();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Each node is the group's as soon as it runs: a later node failing to start panics,
        // and the group's drop kills those started before it.
        let mut group = Group { _dir: dir, nodes: Vec::new(), runtime };
        let dir = group._dir.path().to_path_buf();
        for (i, (meta, _)) in ports.iter().enumerate() {
            let id = (i + 1).to_string();
            let key = dir.join(format!("meta-{id}.cred"));
            let name = format!("meta-{id}");
            let issue = [
                "keygen",
                "issue",
                "--ca",
                path(&ca),
                "--role",
                "meta",
                "--name",
                &name,
                "--out",
                path(&key),
            ];
            let (ok, _, stderr) = cli(&issue);
            assert!(ok, "keygen issue --role meta: {stderr}");
            let data = dir.join(&name);
            let args = [
                "--config",
                path(&config),
                "--key",
                path(&server_key),
                "meta",
                "--data",
                path(&data),
                "--node-id",
                &id,
                "--peers",
                &peers,
                "--group-key",
                path(&key),
            ];
            let process = Process::start(&args, "meta").expect("start a metadata node");
            group.nodes.push((format!("127.0.0.1:{meta}"), Some(process)));
        }
        group
    }

    /// Every node's client address, as `--meta` takes them.
    fn addresses(&self) -> String {
        self.nodes.iter().map(|(addr, _)| addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The running node that serves requests (waits for an election, bounded).
    fn leader(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            for (addr, process) in &self.nodes {
                if process.is_some() && self.serves(addr) {
                    return addr.clone();
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `addr` answers a listing (not `NotServed`).
    fn serves(&self, addr: &str) -> bool {
        self.runtime.block_on(async {
            let config = common::connection_config_with(&client_key());
            let call = async {
                let connection = Connection::connect(addr, config).await.ok()?;
                let request = MetaRequest::Readdir { path: "/".into() };
                connection.call::<_, MetaReply>(&request, bytes::Bytes::new()).await.ok().map(|(r, _)| r)
            };
            let reply = tokio::time::timeout(Duration::from_secs(5), call).await.ok().flatten();
            matches!(reply, Some(MetaReply::Entries(_)))
        })
    }

    fn kill(&mut self, addr: &str) {
        let node = self.nodes.iter_mut().find(|(a, _)| a == addr).expect("a node at addr");
        node.1.take().expect("the node runs").kill();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for (_, process) in &mut self.nodes {
            if let Some(process) = process.take() {
                process.kill();
            }
        }
    }
}

/// A process killed when dropped (also when the test fails).
struct KillOnDrop(Option<Process>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(process) = self.0.take() {
            process.kill();
        }
    }
}

fn start_server(meta: &str, target: &Path) -> KillOnDrop {
    let key = server_key();
    let args =
        ["--key", path(&key), "server", "--meta", meta, "--target", path(target), "--listen", "127.0.0.1:0"];
    KillOnDrop(Some(Process::start(&args, "server").expect("start the I/O server")))
}

/// A write lock taken through mount A outlives a SIGKILL of the group's leader: the new
/// leader grants only reclaims during its grace period, so mount B's conflicting F_SETLK
/// fails (EAGAIN) during the period and after it, and F_GETLK on B reports the lock; once A
/// unlocks, B gets it.
#[test]
fn a_held_lock_survives_a_failover_of_the_metadata_group() {
    let mut group = Group::start();
    let first = group.leader();
    let meta = group.addresses();
    let target = tempfile::tempdir().unwrap();
    let _server = start_server(&meta, &common::target_spec(target.path()));
    let (a, b) = (Mount::start(&meta), Mount::start(&meta));
    std::fs::write(a.path("locked"), b"0123456789abcdef").unwrap();
    // A writer through mount A, holding its write token across the kill.
    let half = 256 << 10;
    let expected: Vec<u8> = (0..2 * half).map(|i| (i * 7 % 251) as u8).collect();
    let mut writer =
        std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(a.path("written")).unwrap();
    writer.write_all(&expected[..half]).expect("write before the kill");
    let holder = std::fs::OpenOptions::new().read(true).write(true).open(a.path("locked")).unwrap();
    check(set_lock(holder.as_raw_fd(), libc::F_WRLCK), "F_SETLK through mount A");
    assert_eq!(python(TRY_LOCKF, &b.path("locked")), "busy", "B locked what A holds");

    let killed = Instant::now();
    group.kill(&first);
    let second = group.leader();
    assert_ne!(second, first);
    println!("{second} leads {:?} after {first} was killed", killed.elapsed());
    writer.write_all(&expected[half..]).expect("write after the kill");
    writer.sync_all().expect("fsync after the kill");
    drop(writer);
    // Through the grace period and a while after it, B never gets A's lock.
    let until = Instant::now() + Duration::from_millis(RECLAIM_MS + 2000);
    let mut tries = 0;
    while Instant::now() < until {
        let answer = python(TRY_LOCKF, &b.path("locked"));
        assert_eq!(answer, "busy", "B got A's lock {:?} after the leader was killed", killed.elapsed());
        tries += 1;
    }
    assert!(tries >= 2, "only {tries} attempts in the window");
    assert_eq!(python(TEST_LOCK, &b.path("locked")), "held", "F_GETLK on B sees A's lock");

    check(set_lock(holder.as_raw_fd(), libc::F_UNLCK), "F_UNLCK through mount A");
    assert_eq!(python(TRY_LOCKF, &b.path("locked")), "got", "B gets the lock A let go");

    let mut read = Vec::new();
    std::fs::File::open(b.path("written")).unwrap().read_to_end(&mut read).expect("read through mount B");
    assert_eq!(read.len(), expected.len(), "the writer's file has the wrong size");
    assert!(read == expected, "the writer's bytes differ after the failover");
    let mut again = std::fs::File::open(a.path("written")).unwrap();
    let mut tail = vec![0u8; 16];
    again.seek(SeekFrom::Start(half as u64 - 8)).unwrap();
    again.read_exact(&mut tail).unwrap();
    assert_eq!(tail, expected[half - 8..half + 8], "mount A reads the bytes across the kill");
}

fn mode(mode: u32) -> SetAttr {
    SetAttr { mode: Some(mode), ..SetAttr::default() }
}

/// A library client (A) caches a file's attributes under inode tokens; the leader is
/// SIGKILLed; every change another client (B) makes after the election is seen by A's next
/// stat: the new leader knows none of the old tokens, acknowledges nothing until A's cache
/// went stale, and A's next poll is told its tokens are lost. Once A cached again under the
/// new leader, its tokens are revoked by the next change as before.
#[test]
fn an_attribute_cache_sees_every_change_made_after_a_failover() {
    let mut group = Group::start();
    let first = group.leader();
    let meta = group.addresses();
    let target = tempfile::tempdir().unwrap();
    let _server = start_server(&meta, &common::target_spec(target.path()));
    let (a, b) = (client_at(&meta), client_at(&meta));
    create_when_served(&b, "/cached");
    let id = b.stat("/cached").expect("stat on B").id;
    b.set_attr(id, mode(0o644)).expect("chmod 644");
    for _ in 0..3 {
        assert_eq!(a.stat("/cached").expect("stat on A").attrs.mode & 0o7777, 0o644);
    }

    let killed = Instant::now();
    group.kill(&first);
    let second = group.leader();
    assert_ne!(second, first);
    b.set_attr(id, mode(0o600)).expect("chmod 600 after the failover");
    println!("a change acknowledged {:?} after the leader was killed", killed.elapsed());
    assert_eq!(
        a.stat("/cached").expect("stat on A").attrs.mode & 0o7777,
        0o600,
        "A saw the mode from before the failover"
    );
    // A caches again under the new leader; the next change revokes that.
    for _ in 0..3 {
        assert_eq!(a.stat("/cached").expect("stat on A").attrs.mode & 0o7777, 0o600);
    }
    b.set_attr(id, mode(0o640)).expect("chmod 640");
    assert_eq!(
        a.stat("/cached").expect("stat on A").attrs.mode & 0o7777,
        0o640,
        "A saw the mode the new leader replaced"
    );
}

/// Creates `path` once the I/O server registered with the group (bounded).
fn create_when_served(client: &flotilla_client::Client, path: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        match client.create(path, &flotilla_client::CreateOptions::default()) {
            Ok(file) => return file.close().expect("close"),
            Err(error) if Instant::now() < deadline => {
                println!("create {path}: {error}; the server may not be registered yet");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => panic!("create {path}: {error}"),
        }
    }
}

/// An ENWRICH job of two member processes, mid-run when the leader is SIGKILLed (one flush
/// done, new bytes logged in both caches): after the election a member's sync asks the new
/// leader, which does not know the job; the members reclaim it, the flush runs, each member
/// took part in exactly two flushes, and every byte reads back.
#[test]
fn an_enwrich_job_flushes_across_a_failover() {
    let mut group = Group::start();
    let first = group.leader();
    let meta = group.addresses();
    let target = tempfile::tempdir().unwrap();
    let _server = start_server(&meta, &common::target_spec(target.path()));
    let client = client_at(&meta);
    create_when_served(&client, "/job");
    let mut members: Vec<Member> = (0..2).map(|_| Member::start(&meta, "failover", 2)).collect();
    let mut indexes: Vec<String> = members.iter_mut().map(|m| m.ask("open /job 1048576 0.1 0")).collect();
    indexes.sort();
    assert_eq!(indexes, ["member=0", "member=1"]);
    let chunk = 64 << 10;
    let mut expected = vec![0u8; 4 * chunk];
    let mut write = |members: &mut Vec<Member>, round: usize| {
        for (i, member) in members.iter_mut().enumerate() {
            let (offset, seed) = ((2 * round + i) * chunk, (10 * round + i) as u64 + 1);
            let answer = member.ask(&format!("write {offset} {chunk} {seed}"));
            assert!(answer.starts_with("stamp="), "write: {answer}");
            expected[offset..offset + chunk].copy_from_slice(&member_bytes(seed, chunk));
        }
    };
    write(&mut members, 0);
    assert_eq!(members[0].ask("sync"), "ok");
    members[1].wait_flushes(1);
    write(&mut members, 1);

    let killed = Instant::now();
    group.kill(&first);
    let second = group.leader();
    assert_ne!(second, first);
    assert_eq!(members[1].ask("sync"), "ok", "a sync after the failover");
    println!("a job flush done {:?} after the leader was killed", killed.elapsed());
    for member in &mut members {
        member.wait_flushes(2);
        assert_eq!(member.flushes(), 2, "a member took part in a flush twice");
        assert_eq!(member.ask("failure"), "failure=");
    }
    for member in &mut members {
        assert_eq!(member.ask("close"), "ok");
    }
    let file = client.open("/job").expect("open for reading");
    assert_eq!(file.size(), expected.len() as u64, "the published size");
    let mut read = vec![0u8; expected.len()];
    file.read_at(0, &mut read).expect("read");
    assert!(read == expected, "the job's bytes differ after the failover");
}

/// One request on a new connection to `addr` with credential `key`.
fn call_with(group: &Group, addr: &str, key: &Path, request: &MetaRequest) -> MetaReply {
    group.runtime.block_on(async {
        let config = common::connection_config_with(key);
        let connection = Connection::connect(addr, config).await.expect("connect");
        let (reply, _) = connection.call::<_, MetaReply>(request, bytes::Bytes::new()).await.expect("call");
        reply
    })
}

/// A group session is bound to the credential that opened it: a change sent in it under
/// another client credential is refused `PermissionDenied` (naming the session), an id no
/// one was handed is `SessionExpired`, and neither is applied; the owner's changes go on.
#[test]
fn a_group_session_is_usable_only_by_the_credential_that_opened_it() {
    let group = Group::start();
    let leader = group.leader();
    let keys = tempfile::tempdir().unwrap();
    let intruder = keys.path().join("intruder.cred");
    let ca = test_keys().join("cluster.key");
    let issue = ["keygen", "issue", "--ca", path(&ca), "--role", "client", "--name", "intruder", "--out"];
    let (ok, _, stderr) = cli(&[&issue[..], &[path(&intruder)]].concat());
    assert!(ok, "keygen issue --role client: {stderr}");
    let mkdir = |name: &str| MetaRequest::Mkdir { path: format!("/{name}"), mode: 0o755, uid: 0, gid: 0 };
    let sequenced = |session, sequence, name: &str| MetaRequest::Sequenced {
        session,
        sequence,
        acknowledged_through: 0,
        request: Box::new(mkdir(name)),
    };
    let session = match call_with(&group, &leader, &client_key(), &MetaRequest::OpenGroupSession) {
        MetaReply::GroupSession { session } => session,
        other => panic!("OpenGroupSession: {other:?}"),
    };
    assert!(session > 0, "no group session handed out");
    let mine = call_with(&group, &leader, &client_key(), &sequenced(session, 1, "mine"));
    assert!(matches!(mine, MetaReply::Entry(_)), "the owner's change: {mine:?}");

    match call_with(&group, &leader, &intruder, &sequenced(session, 2, "theirs")) {
        MetaReply::Error(error) => {
            assert_eq!(error.code, flotilla_proto::ErrorCode::PermissionDenied, "{error:?}");
            assert!(error.message.contains(&format!("group session {session}")), "{}", error.message);
            assert!(error.message.contains("another client's credential"), "{}", error.message);
        }
        other => panic!("a change in another credential's session was answered {other:?}"),
    }
    match call_with(&group, &leader, &intruder, &sequenced(session + 1000, 1, "guessed")) {
        MetaReply::Error(error) => {
            assert_eq!(error.code, flotilla_proto::ErrorCode::SessionExpired, "{error:?}")
        }
        other => panic!("a change in a session never handed out was answered {other:?}"),
    }
    // The intruder's own session works for it.
    let own = match call_with(&group, &leader, &intruder, &MetaRequest::OpenGroupSession) {
        MetaReply::GroupSession { session } => session,
        other => panic!("OpenGroupSession: {other:?}"),
    };
    assert_ne!(own, session);
    let listing = call_with(&group, &leader, &client_key(), &MetaRequest::Readdir { path: "/".into() });
    let MetaReply::Entries(entries) = listing else { panic!("readdir: {listing:?}") };
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    assert!(names.contains(&"mine".to_string()), "{names:?}");
    assert!(!names.contains(&"theirs".to_string()) && !names.contains(&"guessed".to_string()), "{names:?}");
    let again = call_with(&group, &leader, &client_key(), &sequenced(session, 2, "mine-too"));
    assert!(matches!(again, MetaReply::Entry(_)), "the owner's next change: {again:?}");
}
