//! Issue 31, items 4 and 7: who may change a layout, which layouts the metadata service
//! accepts, how one-subfile files spread over the targets, and configuration files with
//! keys nobody reads.

mod common;

use common::{cli, path, Cluster, FLOTILLA};
use flotilla_client::{Client, CreateOptions, ErrorCode, Layout, SetAttr};
use flotilla_types::{Caller, NOBODY_ID};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// `flotilla ARGS` run as uid/gid 65534 with its own copy of the client credential;
/// (success, stderr).
fn as_nobody(keys: &std::path::Path, args: &[&str]) -> (bool, String) {
    let key = common::client_key_for(keys, NOBODY_ID);
    let output = Command::new(FLOTILLA)
        .args(["--key", path(&key)])
        .args(args)
        .env_remove("FLOTILLA_KEY")
        .uid(NOBODY_ID)
        .gid(NOBODY_ID)
        .output()
        .expect("run flotilla as nobody");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A folder user 65534 can read (the test's temporary folders are private).
fn open_folder() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let keys = tempfile::tempdir().expect("temporary folder");
    std::fs::set_permissions(keys.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    keys
}

fn nobody(cluster: &Cluster) -> Client {
    let client = cluster.client();
    client.set_caller(Some(Caller { uid: NOBODY_ID, gid: NOBODY_ID, groups: Vec::new() }));
    client
}

/// Issue 31 item 4: uid 65534 with the ordinary client credential may not set the layout of
/// `/`, of a root-owned 0700 directory, or of root's 0600 file, nor reach one through a
/// directory it cannot search, by path (`flotilla layout set`) or by id (what the mount's
/// `user.flotilla.layout` sends); the owner may, and root may.
#[test]
fn only_the_owner_changes_a_layout() {
    let cluster = Cluster::start(2);
    let admin = cluster.client();
    admin.mkdir("/secret", 0o700).unwrap();
    let inner = admin.mkdir("/secret/inner", 0o755).unwrap();
    admin
        .set_attr(inner.id, SetAttr { uid: Some(NOBODY_ID), gid: Some(NOBODY_ID), ..Default::default() })
        .unwrap();
    let private = admin.create("/private", &CreateOptions { mode: 0o600, ..Default::default() }).unwrap();
    let mine = admin.mkdir("/mine", 0o755).unwrap();
    admin
        .set_attr(mine.id, SetAttr { uid: Some(NOBODY_ID), gid: Some(NOBODY_ID), ..Default::default() })
        .unwrap();
    let meta = cluster.meta_addr();
    let keys = open_folder();

    for target in ["/", "/secret", "/private", "/secret/inner"] {
        let (ok, stderr) =
            as_nobody(keys.path(), &["layout", "set", "--meta", &meta, target, "stripe:64K:2"]);
        assert!(!ok, "nobody set the layout of {target}");
        let lower = stderr.to_lowercase();
        assert!(lower.contains("not permitted") || lower.contains("permission denied"), "{target}: {stderr}");
    }
    let refused =
        nobody(&cluster).set_layout_id(private.id(), Some(Layout::Stripe { unit_bytes: 65536, count: 1 }));
    assert_eq!(refused.unwrap_err().code(), Some(ErrorCode::PermissionDenied), "the id form too");
    assert_eq!(admin.stat("/").unwrap().layout, None, "the root's default is untouched");
    assert_eq!(admin.stat("/secret").unwrap().layout, None);
    assert_eq!(admin.stat("/private").unwrap().layout, private.entry().layout);

    let (ok, stderr) = as_nobody(keys.path(), &["layout", "set", "--meta", &meta, "/mine", "stripe:64K:2"]);
    assert!(ok, "the owner sets its own directory's layout: {stderr}");
    assert_eq!(admin.stat("/mine").unwrap().layout, Some(Layout::Stripe { unit_bytes: 65536, count: 2 }));
    let (ok, _, stderr) = cli(&["layout", "set", "--meta", &meta, "/secret", "stripe:64K:2"]);
    assert!(ok, "root may: {stderr}");
}

/// Issue 31 item 4 (the audit of every change): a credential confined to `/project` that
/// claims root may not change `/` by its well-known id, neither its layout nor its mode,
/// though inside its subtree it may.
#[test]
fn a_confined_credential_changes_no_directory_outside_by_id() {
    let cluster = Cluster::start(2);
    let admin = cluster.client();
    let project = admin.mkdir("/project", 0o755).unwrap();
    let root = admin.stat("/").unwrap();
    let out = cluster.dir.path().join("confined.cred");
    let ca = common::test_keys().join("cluster.key");
    let args = ["keygen", "issue", "--ca", path(&ca), "--name", "confined", "--out", path(&out)];
    let (ok, _, stderr) = cli(&[&args[..], &["--role", "client", "--subtree", "/project"]].concat());
    assert!(ok, "keygen issue: {stderr}");
    let mut config = flotilla_client::ClientConfig::new(cluster.meta_addr());
    config.key = Some(out);
    let confined = Client::with_config(config).expect("client");

    let stripe = Some(Layout::Stripe { unit_bytes: 65536, count: 1 });
    let refused = confined.set_layout_id(root.id, stripe).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    let chmod = SetAttr { mode: Some(0o777), ..Default::default() };
    let refused = confined.set_attr(root.id, chmod.clone()).unwrap_err();
    assert!(refused.to_string().contains("outside"), "{refused}");
    let after = admin.stat("/").unwrap();
    assert_eq!((after.layout, after.attrs.mode), (root.layout, root.attrs.mode), "/ is untouched");

    confined.set_layout_id(project.id, stripe).expect("inside its subtree");
    confined.set_attr(project.id, chmod).expect("inside its subtree");
}

/// Issue 31 item 4: a 1-byte stripe unit and one of 2^64-1 are refused, also for root, by
/// `layout set`, by id, and at create, with an error naming the value and the bound; the
/// bound is a `[meta]` setting.
#[test]
fn out_of_bounds_layouts_are_refused_naming_the_bound() {
    let cluster = Cluster::start(2);
    let meta = cluster.meta_addr();
    let admin = cluster.client();
    let max = u64::MAX.to_string();
    let huge = format!("stripe:{max}");
    for (layout, named) in [("stripe:1:2", "stripe unit of 1 is under the bound of 4096"), (&huge, &max)] {
        let (ok, _, stderr) = cli(&["layout", "set", "--meta", &meta, "/", layout]);
        assert!(!ok, "root set {layout} on /");
        assert!(stderr.contains(named), "the error names the value and the bound: {stderr}");
        assert!(stderr.contains("layout_unit_bytes_"), "and the setting: {stderr}");
    }
    assert_eq!(admin.stat("/").unwrap().layout, None);
    let tiny = Some(Layout::Stripe { unit_bytes: 1, count: 2 });
    let root = admin.stat("/").unwrap().id;
    let refused = admin.set_layout_id(root, tiny).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidArgument), "{refused}");
    let options = CreateOptions {
        layout: Some(Layout::Hash { block_bytes: 1 << 20, sequentiality: u32::MAX, count: 0 }),
        ..Default::default()
    };
    let refused = admin.create("/f", &options).unwrap_err();
    assert!(refused.to_string().contains("hash run"), "{refused}");
    assert!(admin.stat("/f").is_err(), "no file was made");
    drop(cluster);

    let relaxed = Cluster::start_with(2, "layout_unit_bytes_min = 1");
    let (ok, _, stderr) = cli(&["layout", "set", "--meta", &relaxed.meta_addr(), "/", "stripe:1:2"]);
    assert!(ok, "a configured bound of 1 byte allows it: {stderr}");
}

/// Issue 31 item 7: eight one-subfile files over four servers take every target, two each,
/// though a file striped over all four is created between each two of them (a placement
/// cursor that moves one step per file sent every one-subfile file to the same two
/// targets). The targets share one file system, so their free space is the same within far
/// less than the factor of two that could give one a third file before another its second.
#[test]
fn one_subfile_files_spread_over_every_target() {
    let cluster = Cluster::start(4);
    let meta = cluster.meta_addr();
    let local = cluster.dir.path().join("one.bin");
    std::fs::write(&local, b"one subfile").unwrap();
    let admin = cluster.client();
    let mut counts = std::collections::BTreeMap::new();
    for index in 0..8 {
        let name = format!("/one-{index}");
        let (ok, _, stderr) = cli(&["put", "--meta", &meta, "--subfiles", "1", path(&local), &name]);
        assert!(ok, "put {name}: {stderr}");
        let entry = admin.stat(&name).unwrap();
        assert_eq!(entry.subfiles.len(), 1);
        *counts.entry(entry.subfiles[0].target).or_insert(0) += 1;
        let wide_options = CreateOptions { subfiles: 4, ..Default::default() };
        let wide = admin.create(&format!("/wide-{index}"), &wide_options).unwrap();
        assert_eq!(wide.subfile_count(), 4);
    }
    assert_eq!(counts.values().copied().collect::<Vec<u32>>(), [2, 2, 2, 2], "{counts:?}");
}

/// Runs `command` until it exits or `limit` passes (then kills it); (exited, success,
/// stderr).
fn run_bounded(command: &mut Command, limit: std::time::Duration) -> (bool, bool, String) {
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start flotilla");
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    (status.is_some(), status.is_some_and(|s| s.success()), stderr)
}

/// Issue 31 item 7: a configuration file with a key no setting has makes `flotilla meta`,
/// `server` and `local` fail at start, naming the key and the file; nested tables and
/// unknown tables are checked too.
#[test]
fn unknown_configuration_keys_fail_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let target = dir.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let meta = ["meta", "--listen", "127.0.0.1:0", "--data", path(&data)];
    let server = ["server", "--meta", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--target", path(&target)];
    let local = ["local", "--servers", "1", "--listen", "127.0.0.1:0", "--data", path(&data)];
    let cases: [(&str, &str, &[&str]); 6] = [
        ("[meta]\nheartbeat_ms = 200\nheartbeat_msec = 100\n", "heartbeat_msec", &meta),
        ("[server]\nworkerz = 2\n", "workerz", &server),
        ("[server.limits]\nframe_byte_max = 1\n", "frame_byte_max", &server),
        ("[local]\nservers = 1\nserver = 2\n", "server", &local),
        ("[meta.default_policy]\nread_only = false\nreadonly = true\n", "readonly", &local),
        ("[metadata]\nheartbeat_ms = 1\n", "metadata", &local),
    ];
    for (index, (text, key, args)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("config-{index}.toml"));
        std::fs::write(&file, text).unwrap();
        let mut command = Command::new(FLOTILLA);
        command.args(["--config", path(&file)]).args(*args).env_remove("FLOTILLA_KEY");
        if args[0] != "local" {
            command.args(["--key", path(&common::server_key())]);
        }
        let (exited, ok, stderr) = run_bounded(&mut command, std::time::Duration::from_secs(10));
        assert!(exited && !ok, "{key}: flotilla {} started with it: {stderr}", args[0]);
        assert!(stderr.contains(&format!("`{key}`")), "the error names the key {key}: {stderr}");
        assert!(stderr.contains(path(&file)), "and the file: {stderr}");
    }
}
