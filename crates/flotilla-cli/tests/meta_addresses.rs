//! Callers take every metadata address (issue 33): `FLOTILLA_META=a,b,c`, `--meta a,b,c` for
//! the CLI, an I/O server and a mount; an address that does not answer is skipped, and a
//! client whose list holds a dead address keeps working while the metadata service is
//! killed (SIGKILL) and restarted on its address. No metadata service runs on the group
//! yet, so `NotLeader`/`NoQuorum` come from a stand-in node in this process.

mod common;

use common::{client_key, path, random_bytes, Cluster, Mount, Process, FLOTILLA};
use flotilla_client::{Client, ClientConfig, CreateOptions};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loopback address nothing listens on (bound, then released).
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").to_string()
}

/// `flotilla ARGS` with `FLOTILLA_META=meta` and the test client credential: (ok, stdout, stderr).
fn cli_with_meta_env(meta: &str, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(FLOTILLA)
        .args(args)
        .env("FLOTILLA_KEY", client_key())
        .env("FLOTILLA_META", meta)
        .output()
        .expect("run flotilla");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// An I/O server of `cluster` on a new target, registered through `--meta meta`.
fn server_with_meta(cluster: &Cluster, meta: &str) -> Process {
    let config = cluster.config();
    let target = cluster.target_dir(0);
    std::fs::create_dir_all(&target).expect("create target dir");
    let target = common::target_spec(&target);
    let args = ["--config", path(&config), "server", "--meta", meta, "--target", path(&target)];
    let mut args = args.to_vec();
    args.extend_from_slice(&["--listen", "127.0.0.1:0"]);
    Process::start(&args, "server").expect("start server")
}

#[test]
fn a_dead_first_address_is_skipped_by_the_cli_a_server_and_a_mount() {
    let mut cluster = Cluster::start(0);
    let list = format!("{},{}", dead_address(), cluster.meta_addr());
    cluster.servers.push(Some(server_with_meta(&cluster, &list)));
    cluster.wait_up(1);

    let dir = tempfile::tempdir().expect("temporary folder");
    let (source, copy) = (dir.path().join("in"), dir.path().join("out"));
    let data = random_bytes(3, 300_000);
    std::fs::write(&source, &data).expect("write the source");
    let (ok, _, stderr) = cli_with_meta_env(&list, &["put", path(&source), "/listed"]);
    assert!(ok, "put with FLOTILLA_META={list}: {stderr}");
    let (ok, _, stderr) = cli_with_meta_env(&list, &["get", "/listed", path(&copy)]);
    assert!(ok, "get with FLOTILLA_META={list}: {stderr}");
    assert_eq!(std::fs::read(&copy).expect("read the copy"), data);

    let mount = Mount::start(&list);
    std::fs::write(mount.path("mounted"), b"through a list").expect("write through the mount");
    let names: Vec<String> = std::fs::read_dir(&mount.dir)
        .expect("list the mount")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"listed".to_string()) && names.contains(&"mounted".to_string()), "{names:?}");
    let (ok, stdout, stderr) = common::cli(&["ls", "--meta", &list, "/"]);
    assert!(ok, "ls --meta {list}: {stderr}");
    assert!(stdout.contains("listed") && stdout.contains("mounted"), "ls: {stdout}");
}

#[test]
fn a_malformed_address_list_is_refused_naming_the_entry() {
    let (ok, _, stderr) = cli_with_meta_env("127.0.0.1:1,,127.0.0.1:2", &["ls", "/"]);
    assert!(!ok, "an empty entry was taken");
    assert!(stderr.contains("entry 2 is empty"), "{stderr}");
}

/// What the writer loop did: files written (name, seed, length, when) and the errors it saw.
#[derive(Default)]
struct Written {
    files: Vec<(String, u64, usize, Instant)>,
    errors: Vec<String>,
}

/// Creates, writes, closes and stats files until `stop`.
fn writer(client: &Client, stop: &AtomicBool) -> Written {
    let mut written = Written::default();
    let options = CreateOptions::default();
    for number in 1u64.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (name, seed, length) = (format!("/f-{number}"), number * 17 + 1, 4_096 + number as usize % 4_096);
        let data = random_bytes(seed, length);
        let outcome = client
            .create(&name, &options)
            .and_then(|file| {
                file.write_at(0, &data)?;
                file.close()
            })
            .and_then(|()| client.stat(&name));
        match outcome {
            Ok(_) => written.files.push((name, seed, length, Instant::now())),
            Err(error) => written.errors.push(format!("{name}: {error}")),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    written
}

#[test]
fn a_client_with_a_dead_address_listed_outlasts_a_metadata_restart() {
    let mut cluster = Cluster::start(1);
    let live = cluster.meta_addr();
    let mut config = ClientConfig::new(format!("{live},{}", dead_address()));
    config.key = Some(client_key());
    config.outage.wait_ms = 20_000;
    let client = Client::with_config(config).expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let (mut killed, mut restarted) = (Instant::now(), Instant::now());
    let written = std::thread::scope(|scope| {
        let task = scope.spawn(|| writer(&client, &stop));
        std::thread::sleep(Duration::from_millis(400));
        let process = cluster.meta.take().expect("meta running");
        process.kill();
        killed = Instant::now();
        std::thread::sleep(Duration::from_millis(700));
        cluster.start_meta(&live);
        restarted = Instant::now();
        println!("metadata service away for {} ms", killed.elapsed().as_millis());
        std::thread::sleep(Duration::from_millis(1_500));
        stop.store(true, Ordering::Relaxed);
        task.join().expect("writer thread")
    });
    assert!(written.errors.is_empty(), "errors across the restart: {:?}", written.errors);
    let before = written.files.iter().filter(|file| file.3 < killed).count();
    let after = written.files.iter().filter(|file| file.3 > restarted).count();
    assert!(before > 0 && after > 0, "{before} files written before the kill, {after} after the restart");
    for (name, seed, length, _) in &written.files {
        let file = client.open(name).unwrap_or_else(|e| panic!("{name} lost: {e}"));
        let mut back = vec![0u8; *length];
        file.read_at(0, &mut back).unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert_eq!(back, random_bytes(*seed, *length), "{name} differs");
    }
}

/// A metadata node of a group as a caller sees it when that node does not serve: it
/// authenticates with the cluster's server credential and answers every request with
/// `refusal`. Counts the requests it refused.
struct RefusingNode {
    addr: String,
    refused: Arc<std::sync::atomic::AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl RefusingNode {
    fn start(refusal: flotilla_proto::NotServed) -> RefusingNode {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("local address").to_string();
        let credential = flotilla_auth::load_credential(
            Some(&common::server_key()),
            "a refusing node",
            flotilla_auth::Role::Server,
        )
        .expect("server credential");
        let roles = vec![flotilla_auth::Role::Client, flotilla_auth::Role::Server];
        let acceptor = Arc::new(flotilla_auth::Acceptor::new(credential, roles, Default::default()));
        let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let body = flotilla_proto::encode_body(&flotilla_proto::MetaReply::NotServed(refusal)).unwrap();
        let counter = refused.clone();
        runtime.spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let (acceptor, body, counter) = (acceptor.clone(), body.clone(), counter.clone());
                tokio::spawn(refuse_all(stream, peer, acceptor, body, counter));
            }
        });
        RefusingNode { addr, refused, _runtime: runtime }
    }

    fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

async fn refuse_all(
    mut stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: Arc<flotilla_auth::Acceptor>,
    body: Vec<u8>,
    refused: Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::AsyncWriteExt;
    let Some(mut secured) = acceptor.accept(&mut stream, Some(peer)).await else { return };
    let mut buffer = bytes::BytesMut::new();
    loop {
        let opener: &mut dyn flotilla_proto::PayloadOpener = &mut secured.opener;
        let Ok(frame) =
            flotilla_proto::read_frame_opened(&mut stream, &mut buffer, 1 << 20, Some(opener)).await
        else {
            return;
        };
        if secured.opener.check(&mut stream, &frame).await.is_err() {
            return;
        }
        refused.fetch_add(1, Ordering::Relaxed);
        if secured.sealer.write_frame(&mut stream, frame.request_id, &body, &[]).await.is_err() {
            return;
        }
        let _ = stream.flush().await;
    }
}

fn client_of(meta: &str, wait_ms: u64) -> Client {
    let mut config = ClientConfig::new(meta);
    config.key = Some(client_key());
    config.outage.wait_ms = wait_ms;
    Client::with_config(config).expect("client")
}

/// Not a running group (the service does not run on one yet): a node that answers
/// `NotLeader` naming the live service, and one that answers `NoQuorum`, in front of it.
#[test]
fn a_client_follows_a_leader_hint_and_leaves_a_node_without_quorum() {
    let cluster = Cluster::start(1);
    let live = cluster.meta_addr();
    let follower = RefusingNode::start(flotilla_proto::NotServed::NotLeader { leader: Some(live.clone()) });
    let client = client_of(&follower.addr, 5_000);
    client.mkdir("/led", 0o755).expect("mkdir sent to a follower naming the leader");
    assert_eq!(client.stat("/led").expect("stat").attrs.kind, flotilla_client::FileKind::Directory);
    let refused = follower.refused();
    assert!(refused >= 1, "the follower was not asked");
    client.rmdir("/led").expect("rmdir");
    client.mkdir("/led", 0o755).expect("mkdir again");
    assert_eq!(follower.refused(), refused, "the leader, outside the list, is kept while it serves");

    let cut_off = RefusingNode::start(flotilla_proto::NotServed::NoQuorum);
    let client = client_of(&format!("{},{live}", cut_off.addr), 5_000);
    client.stat("/led").expect("stat past a node without quorum");
    assert!(cut_off.refused() >= 1, "the node without quorum was not asked first");

    let alone = client_of(&cut_off.addr, 600);
    let started = Instant::now();
    let error = alone.stat("/led").expect_err("only a node without quorum");
    let said = error.to_string();
    assert!(said.contains("stayed unreachable") && said.contains("majority"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(10), "gave up after {:?}", started.elapsed());
}
