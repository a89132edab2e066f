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
