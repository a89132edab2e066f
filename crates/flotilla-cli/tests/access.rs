//! Permission checks by the metadata service, with real processes: a program acting as one
//! user cannot remove what the POSIX rules protect, and the service keeps serving after.

mod common;

use common::Cluster;
use flotilla_client::{Client, CreateOptions, ErrorCode};
use flotilla_types::Caller;

fn user(cluster: &Cluster, uid: u32) -> Client {
    let client = cluster.client();
    client.set_caller(Some(Caller { uid, gid: uid, groups: Vec::new() }));
    client
}

#[test]
fn non_owner_unlink_is_refused_and_sticky_directories_protect_entries() {
    let cluster = Cluster::start(1);
    let admin = cluster.client();
    admin.mkdir("/home", 0o755).unwrap();
    admin.mkdir("/tmp", 0o1777).unwrap();
    let alice = user(&cluster, 1000);
    let bob = user(&cluster, 1001);

    // /home is root's and 0755: alice may not create or remove there.
    admin.create("/home/kept", &CreateOptions::default()).unwrap();
    let refused = alice.remove("/home/kept").unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    assert!(admin.stat("/home/kept").is_ok(), "the refused unlink left the file");

    // In sticky /tmp bob may not remove alice's file, alice may.
    alice.create("/tmp/alice", &CreateOptions::default()).unwrap();
    assert_eq!(admin.stat("/tmp/alice").unwrap().attrs.uid, 1000, "the caller owns what it creates");
    let refused = bob.remove("/tmp/alice").unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    assert!(refused.to_string().contains("sticky"), "{refused}");
    alice.remove("/tmp/alice").unwrap();
    assert!(admin.stat("/tmp/alice").is_err());

    // After the refusals the service still serves a legitimate client.
    bob.create("/tmp/bob", &CreateOptions::default()).unwrap();
    assert_eq!(admin.stat("/tmp/bob").unwrap().attrs.uid, 1001);
}

/// Issue 9's first reproduction: `flotilla rm`, run as `nobody` with nothing but the
/// metadata address, may not delete a root-owned file in a root-owned directory (the CLI acts
/// as the user running it); root's `rm` still works.
#[test]
fn flotilla_rm_as_nobody_cannot_delete_a_root_owned_file() {
    use std::os::unix::process::CommandExt;
    let cluster = Cluster::start(1);
    let admin = cluster.client();
    admin.mkdir("/data", 0o755).unwrap();
    admin.create("/data/results", &CreateOptions::default()).unwrap();
    // A world-readable folder outside the cluster's private one, holding nobody's credential.
    let keys = tempfile::tempdir().unwrap();
    std::fs::set_permissions(keys.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let key = common::client_key_for(keys.path(), flotilla_types::NOBODY_ID);
    let output = std::process::Command::new(common::FLOTILLA)
        .args(["--key", common::path(&key), "rm", "--meta", &cluster.meta_addr(), "/data/results"])
        .uid(flotilla_types::NOBODY_ID)
        .gid(flotilla_types::NOBODY_ID)
        .output()
        .expect("run flotilla rm as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "nobody's rm succeeded: {stderr}");
    assert!(stderr.to_lowercase().contains("permission"), "the refusal names the reason: {stderr}");
    assert!(admin.stat("/data/results").is_ok(), "the file is still there");
    let (removed, _, stderr) = common::cli(&["rm", "--meta", &cluster.meta_addr(), "/data/results"]);
    assert!(removed, "root's rm failed: {stderr}");
}

/// The capability the metadata service hands a user carries exactly the data rights POSIX
/// gives them, and the I/O servers hold them to it: a non-owner reads a 0644 file but cannot
/// write it, reads nothing of a 0600 file, and cannot grow its size through the service.
#[test]
fn io_servers_give_each_user_only_the_data_rights_posix_gives() {
    use flotilla_client::Shape;
    let cluster = Cluster::start(1);
    let admin = cluster.client();
    let shared = admin.create("/shared", &CreateOptions { mode: 0o644, ..CreateOptions::default() }).unwrap();
    shared.fork(0, "data").unwrap().write(&Shape::contiguous(0, 4), b"open").unwrap();
    shared.close().unwrap();
    let private =
        admin.create("/private", &CreateOptions { mode: 0o600, ..CreateOptions::default() }).unwrap();
    private.write_at(0, b"mine").unwrap();
    private.close().unwrap();

    let alice = user(&cluster, 1000);
    let file = alice.open("/shared").unwrap();
    let rights = file.entry().capability.as_ref().map(|c| c.rights);
    assert_eq!(rights, Some(flotilla_proto::Rights::READ), "read-only rights for a non-owner of a 0644 file");
    let mut back = [0u8; 4];
    file.fork(0, "data").unwrap().read(&Shape::contiguous(0, 4), &mut back).unwrap();
    assert_eq!(&back, b"open");
    let refused = file.fork(0, "data").unwrap().write(&Shape::contiguous(0, 4), b"HACK").unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    assert!(refused.to_string().contains("needs write"), "{refused}");

    let file = alice.open("/private").unwrap();
    assert!(file.entry().capability.is_none(), "no rights, no capability");
    let refused = file.fork(0, "data").unwrap().read(&Shape::contiguous(0, 4), &mut back).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    assert!(refused.to_string().contains("needs a capability"), "{refused}");
    let id = file.entry().id;
    let refused = alice.grow_size(id, 1 << 40).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::PermissionDenied), "{refused}");
    assert_eq!(admin.stat("/private").unwrap().attrs.size_bytes, 4, "the refused grow left the size");

    // The owner still reads and writes both.
    let mut mine = [0u8; 4];
    let private = admin.open("/private").unwrap();
    private.fork(0, "data").unwrap().read(&Shape::contiguous(0, 4), &mut mine).unwrap();
    assert_eq!(&mine, b"mine");
    common::assert_still_serving(&cluster);
}
