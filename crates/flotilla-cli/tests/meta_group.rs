//! Three `flotilla meta` processes as one metadata group (issue 33), one I/O server and a
//! client making changes through the leader: a follower points at the leader, the leader is
//! SIGKILLed, a new one serves the next change within a bounded time, nothing acknowledged
//! is lost or applied twice, and the killed node catches up after its restart.
//!
//! Until clients follow the leader themselves (`--meta a,b,c`, another branch), the test
//! follows it: it asks each node in turn and takes the one that does not answer `NotServed`.

mod common;

use common::{cli, client_key, path, server_key, test_keys, Process};
use flotilla_proto::{CreateSpec, MetaReply, MetaRequest, NotServed};
use flotilla_rpc::Connection;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest the test waits for an election or a change (generous: the group's election
/// timeout is at most 1 s, `quorum_wait_ms` 3 s).
const WAIT: Duration = Duration::from_secs(15);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Node {
    id: u64,
    meta: String,
    args: Vec<String>,
    process: Option<Process>,
}

impl Node {
    fn start(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let deadline = Instant::now() + WAIT;
        loop {
            match Process::start(&args, "meta") {
                Ok(process) => {
                    assert_eq!(process.addr, self.meta, "node {} listens on its peers address", self.id);
                    self.process = Some(process);
                    return;
                }
                // A port of the killed process may still be held for a moment.
                Err(e) => assert!(Instant::now() < deadline, "node {} does not start: {e}", self.id),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

struct Group {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    runtime: tokio::runtime::Runtime,
}

impl Group {
    fn start() -> Group {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, (meta, group))| format!("{}=127.0.0.1:{meta}/127.0.0.1:{group}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let ca = test_keys().join("cluster.key");
        let mut nodes = Vec::new();
        for (i, (meta, _)) in ports.iter().enumerate() {
            let id = i as u64 + 1;
            let key = dir.path().join(format!("meta-{id}.cred"));
            let issued =
                ["keygen", "issue", "--ca", path(&ca), "--role", "meta", "--name", &format!("meta-{id}")];
            let (ok, _, stderr) = cli(&[&issued[..], &["--out", path(&key)]].concat());
            assert!(ok, "keygen issue --role meta: {stderr}");
            let data = dir.path().join(format!("meta-{id}"));
            let args = [
                "--key",
                path(&server_key()),
                "meta",
                "--data",
                path(&data),
                "--node-id",
                &id.to_string(),
                "--peers",
                &peers,
                "--group-key",
                path(&key),
            ]
            .map(String::from)
            .to_vec();
            nodes.push(Node { id, meta: format!("127.0.0.1:{meta}"), args, process: None });
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // The group owns its nodes before any starts: a node failing to start panics, and
        // the group's drop kills the nodes started before it.
        let mut group = Group { dir, nodes, runtime };
        for node in &mut group.nodes {
            node.start();
        }
        group
    }

    /// One request to one node on a fresh connection (`None`: no answer).
    fn ask(&self, addr: &str, request: &MetaRequest) -> Option<MetaReply> {
        ask_on(&self.runtime, addr, request)
    }

    /// The test's follow-the-leader loop: asks each running node until one answers other
    /// than `NotServed`; returns that node's address and its reply.
    fn through_leader(&self, request: &MetaRequest) -> (String, MetaReply) {
        let deadline = Instant::now() + WAIT;
        loop {
            for node in self.nodes.iter().filter(|n| n.process.is_some()) {
                match self.ask(&node.meta, request) {
                    Some(MetaReply::NotServed(_)) | None => {}
                    Some(reply) => return (node.meta.clone(), reply),
                }
            }
            assert!(Instant::now() < deadline, "no node served {request:?} within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `through_leader` until the change is applied (the I/O server may still be registering).
    fn until_applied(&self, request: &MetaRequest) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let (leader, reply) = self.through_leader(request);
            if applied(&reply) {
                return leader;
            }
            assert!(Instant::now() < deadline, "{request:?} not applied: {reply:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn node_at(&mut self, addr: &str) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.meta == addr).unwrap()
    }

    fn listing(&self, dir: &str) -> (String, BTreeSet<String>) {
        match self.through_leader(&MetaRequest::Readdir { path: dir.into() }) {
            (leader, MetaReply::Entries(entries)) => (leader, entries.into_iter().map(|e| e.name).collect()),
            (_, other) => panic!("readdir {dir}: {other:?}"),
        }
    }
}

fn ask_on(runtime: &tokio::runtime::Runtime, addr: &str, request: &MetaRequest) -> Option<MetaReply> {
    runtime.block_on(async {
        let config = common::connection_config_with(&client_key());
        let call = async {
            let connection = Connection::connect(addr, config).await.ok()?;
            connection.call::<_, MetaReply>(request, bytes::Bytes::new()).await.ok().map(|(r, _)| r)
        };
        tokio::time::timeout(Duration::from_secs(5), call).await.ok().flatten()
    })
}

impl Drop for Group {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(process) = node.process.take() {
                process.kill();
            }
        }
    }
}

fn mkdir(path: &str) -> MetaRequest {
    MetaRequest::Mkdir { path: path.into(), mode: 0o755, uid: 0, gid: 0 }
}

fn create(path: &str) -> MetaRequest {
    let spec =
        CreateSpec { mode: 0o644, uid: 0, gid: 0, subfiles: 1, targets: None, layout: None, exclusive: true };
    MetaRequest::Create { path: path.into(), spec }
}

fn start_server(leader: &str, target: &Path) -> Process {
    let key = server_key();
    let args = [
        "--key",
        path(&key),
        "server",
        "--meta",
        leader,
        "--target",
        path(target),
        "--listen",
        "127.0.0.1:0",
    ];
    Process::start(&args, "server").expect("start the I/O server")
}

/// A change acknowledged (`true`), refused as already done by an earlier unanswered try
/// (`true`: that try took effect once), or a failure.
fn applied(reply: &MetaReply) -> bool {
    match reply {
        MetaReply::Entry(_) => true,
        MetaReply::Error(e) => e.code == flotilla_proto::ErrorCode::AlreadyExists,
        _ => false,
    }
}

/// Puts one small file through the client library at `leader` (data on the I/O server).
fn put(leader: &str, name: &str) {
    use flotilla_client::{CreateOptions, Shape};
    let client = common::client_at(leader);
    let file = client.create(name, &CreateOptions::default()).expect("create for put");
    let fork = file.fork(0, "data").expect("fork for put");
    fork.write(&Shape::contiguous(0, name.len() as u64), name.as_bytes()).expect("put data");
}

#[test]
fn a_metadata_group_fails_over_without_losing_or_repeating_a_change() {
    let mut group = Group::start();
    // The first change waits for the group's genesis.
    let leader = group.until_applied(&mkdir("/first"));
    let target: PathBuf = group.dir.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let mut server = start_server(&leader, &common::target_spec(&target));
    group.until_applied(&create("/first/f"));

    // A follower names the leader's client address.
    let follower = group.nodes.iter().find(|n| n.meta != leader).unwrap().meta.clone();
    match group.ask(&follower, &mkdir("/nowhere")) {
        Some(MetaReply::NotServed(NotServed::NotLeader { leader: Some(hint) })) => assert_eq!(hint, leader),
        other => panic!("follower {follower} answered {other:?}"),
    }

    // Changes through the leader, every acknowledged one remembered.
    let mut acknowledged = BTreeSet::from(["first".to_string()]);
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let name = format!("d{i}");
        let (_, reply) = group.through_leader(&mkdir(&format!("/{name}")));
        assert!(applied(&reply), "mkdir {name}: {reply:?}");
        acknowledged.insert(name.clone());
        let (_, reply) = group.through_leader(&create(&format!("/{name}/f")));
        assert!(applied(&reply), "create {name}/f: {reply:?}");
        let (from, to) = (format!("/{name}/f"), format!("/{name}/g"));
        let change = match i % 3 {
            1 => MetaRequest::Rename { from, to },
            2 => MetaRequest::Unlink { path: from },
            _ => MetaRequest::Lookup { path: from },
        };
        let (_, reply) = group.through_leader(&change);
        assert!(matches!(reply, MetaReply::Done | MetaReply::Entry(_)), "{change:?}: {reply:?}");
        i += 1;
    }
    // Reads arriving together (they share read-barrier rounds) all see the namespace.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let leader = leader.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                ask_on(&runtime, &leader, &MetaRequest::Readdir { path: "/".into() })
            })
        })
        .collect();
    for reader in readers {
        let reply = reader.join().unwrap();
        assert!(matches!(&reply, Some(MetaReply::Entries(e)) if e.len() > i), "{reply:?}");
    }
    put(&leader, "/put-before");
    acknowledged.insert("put-before".into());
    println!("{i} mkdir+create+rename/unlink/lookup rounds acknowledged before the kill");

    // SIGKILL the leader; the next change succeeds on a new one.
    let killed = group.node_at(&leader).process.take().unwrap();
    let kill_at = Instant::now();
    killed.kill();
    let (new_leader, reply) = group.through_leader(&mkdir("/after"));
    let failover = kill_at.elapsed();
    println!("failover: next change acknowledged {failover:?} after SIGKILL of the leader");
    assert!(applied(&reply), "{reply:?}");
    assert_ne!(new_leader, leader);
    assert!(failover < WAIT, "failover took {failover:?}");
    acknowledged.insert("after".into());

    // The I/O server follows the new leader (restarted: servers take one address here).
    server.child.kill().unwrap();
    let _ = server.child.wait();
    server = start_server(&new_leader, &common::target_spec(&target));
    group.until_applied(&create("/after/f"));
    put(&new_leader, "/put-after");
    acknowledged.insert("put-after".into());

    // Everything acknowledged is on the new leader, and nothing unasked for.
    let (_, listing) = group.listing("/");
    for name in &acknowledged {
        assert!(listing.contains(name), "{name} was acknowledged but is gone: {listing:?}");
    }
    let asked = |name: &String| acknowledged.contains(name) || name.starts_with('d');
    assert!(listing.iter().all(asked), "{listing:?}");
    for name in listing.iter().filter(|n| n.starts_with('d')) {
        let (_, files) = group.listing(&format!("/{name}"));
        let i: usize = name[1..].parse().unwrap();
        let expected = match i % 3 {
            1 => vec!["g"],
            2 => vec![],
            _ => vec!["f"],
        };
        // Every round finished before the kill: each change is there once.
        assert!(files.iter().eq(expected.iter()), "/{name} holds {files:?}, not {expected:?}");
    }

    // The killed node restarts, catches up, and holds the same namespace.
    group.node_at(&leader).start();
    let (_, reply) = group.through_leader(&mkdir("/restarted"));
    assert!(applied(&reply), "{reply:?}");
    let (_, expected) = group.listing("/");
    std::thread::sleep(Duration::from_secs(1));
    let id = group.node_at(&leader).id;
    let data = group.dir.path().join(format!("meta-{id}"));
    group.node_at(&leader).process.take().unwrap().stop();
    let namespace = flotilla_namespace::Namespace::open(&data.join("namespace.redb")).unwrap();
    let caught_up: BTreeSet<String> =
        namespace.readdir("/").unwrap().into_iter().map(|e| e.name_lossy()).collect();
    assert_eq!(caught_up, expected, "the restarted node's namespace differs from the leader's");

    // Alone, the leader acknowledges nothing and says so within quorum_wait_ms (3 s).
    let (leader, _) = group.through_leader(&MetaRequest::Readdir { path: "/".into() });
    let other = group.nodes.iter().find(|n| n.process.is_some() && n.meta != leader).unwrap().meta.clone();
    group.node_at(&other).process.take().unwrap().kill();
    for request in [mkdir("/alone"), MetaRequest::Readdir { path: "/".into() }] {
        let asked = Instant::now();
        let reply = group.ask(&leader, &request);
        println!("a leader without a majority answered {reply:?} after {:?}", asked.elapsed());
        assert!(matches!(reply, Some(MetaReply::NotServed(NotServed::NoQuorum))), "{reply:?}");
        assert!(asked.elapsed() < Duration::from_secs(5), "answered after {:?}", asked.elapsed());
    }
    server.kill();
}

/// `flotilla local --meta-replicas 3` serves through its group's leader: a put and a listing.
#[test]
fn local_runs_three_metadata_nodes() {
    let local = common::Local::start_with(&[], &["--servers", "1", "--meta-replicas", "3"], false);
    let source = local.data_dir().join("hello");
    std::fs::write(&source, b"hello").unwrap();
    let (ok, _, stderr) = local.cli(&["mkdir", "/x"], &[]);
    assert!(ok, "mkdir: {stderr}");
    let (ok, _, stderr) = local.cli(&["put", path(&source), "/x/hello"], &[]);
    assert!(ok, "put: {stderr}");
    let (ok, stdout, stderr) = local.cli(&["ls", "/x"], &[]);
    assert!(ok && stdout.contains("hello"), "ls: {stdout} {stderr}");
    for id in 1..=3 {
        assert!(local.data_dir().join(format!("meta-{id}/log.redb")).exists(), "node {id}'s log");
    }
}

/// A namespace made by the direct path is taken over, nothing lost, by a group of one; a
/// group of three refuses it (its genesis would start from an empty namespace).
#[test]
fn a_group_of_one_adopts_a_namespace_made_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta");
    let key = server_key();
    let (meta, group) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let direct =
        Process::start(&["--key", path(&key), "meta", "--data", path(&data), "--listen", &meta], "meta")
            .expect("direct metadata service");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    assert!(applied(&ask_on(&runtime, &meta, &mkdir("/old")).unwrap()));
    direct.stop();

    let credential = dir.path().join("meta-1.cred");
    let ca = test_keys().join("cluster.key");
    let issued = ["keygen", "issue", "--ca", path(&ca), "--role", "meta", "--name", "meta-1", "--out"];
    let (ok, _, stderr) = cli(&[&issued[..], &[path(&credential)]].concat());
    assert!(ok, "keygen issue --role meta: {stderr}");
    let group_of = |peers: &str| {
        let args = ["--key", path(&key), "meta", "--data", path(&data), "--node-id", "1", "--peers", peers];
        [&args[..], &["--group-key", path(&credential)]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let three = format!("1={meta}/{group},2=127.0.0.1:{}/127.0.0.1:{}", free_port(), free_port());
    let three = format!("{three},3=127.0.0.1:{}/127.0.0.1:{}", free_port(), free_port());
    let args = group_of(&three);
    let refused = Process::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), "meta");
    assert!(refused.is_err(), "a group of three took over a namespace made before it");

    let args = group_of(&format!("1={meta}/{group}"));
    let one =
        Process::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), "meta").expect("group of one");
    let deadline = Instant::now() + WAIT;
    let found = loop {
        match ask_on(&runtime, &meta, &MetaRequest::Lookup { path: "/old".into() }) {
            Some(MetaReply::NotServed(_)) | None if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => break other,
        }
    };
    assert!(matches!(found, Some(MetaReply::Entry(_))), "/old after the takeover: {found:?}");
    assert!(applied(&ask_on(&runtime, &meta, &mkdir("/new")).unwrap()));
    one.kill();
}
