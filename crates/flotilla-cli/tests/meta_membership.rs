//! A metadata group's members changed online (issue 33): `flotilla meta add|remove|status`
//! against real `flotilla meta` processes on loopback ports. The group compacts its log
//! every 20 entries here, so a node added after the first names were written can only catch
//! up from a snapshot (the leader's log no longer starts at 1).
//!
//! - A group of three grows to five, loses its leader (SIGKILL), goes on, removes the dead
//!   node and goes on with the rest; unknown nodes, used addresses and the last voter are
//!   refused clearly.
//! - A wiped node (its data deleted) is added again, catches up from a snapshot to the
//!   leader's applied index, and ends with the same namespace as the others.

mod common;

use common::cli;
use common::metagroup::{dump_namespace, MetaGroup, GROUP_WAIT};
use flotilla_proto::{GroupMembershipRequest, GroupStatus, MetaReply, MetaRequest};
use std::time::{Duration, Instant};

/// Snapshots every 20 entries, 5 kept behind: the log is compacted early.
const SMALL_SNAPSHOTS: &str = "group_snapshot_every_entries = 20\ngroup_log_kept_behind_snapshot_entries = 5";

/// Names written before a node is added (well past two snapshots).
const NAMES_BEFORE: usize = 60;

fn mkdir(path: &str) -> MetaRequest {
    MetaRequest::Mkdir { path: path.into(), mode: 0o755, uid: 0, gid: 0 }
}

/// Applies `request` through whichever running node leads, waiting for one.
fn write(group: &MetaGroup, request: &MetaRequest) {
    let deadline = Instant::now() + GROUP_WAIT;
    loop {
        for node in group.nodes.iter().filter(|n| n.running()) {
            match group.ask(&node.meta, request) {
                Some(MetaReply::Entry(_)) => return,
                // An earlier try whose answer was lost took effect.
                Some(MetaReply::Error(e)) if e.code == flotilla_proto::ErrorCode::AlreadyExists => return,
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "no node applied {request:?} within {GROUP_WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every name in `names` is found through the leader.
fn all_found(group: &MetaGroup, names: &[String]) {
    for name in names {
        let deadline = Instant::now() + GROUP_WAIT;
        loop {
            let found = group.nodes.iter().filter(|n| n.running()).find_map(|node| {
                match group.ask(&node.meta, &MetaRequest::Lookup { path: name.clone() }) {
                    Some(MetaReply::Entry(_)) => Some(true),
                    Some(MetaReply::Error(e)) => panic!("{name} lost: {e:?}"),
                    _ => None,
                }
            });
            if found.is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "no node answered a lookup of {name}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A node's own view of the group.
fn status(group: &MetaGroup, addr: &str) -> Option<GroupStatus> {
    match group.ask(addr, &MetaRequest::GroupMembership(GroupMembershipRequest::Status))? {
        MetaReply::GroupStatus(status) => Some(status),
        other => panic!("status from {addr}: {other:?}"),
    }
}

/// The running leader's view (waiting for one).
fn leader_status(group: &MetaGroup) -> GroupStatus {
    let deadline = Instant::now() + GROUP_WAIT;
    loop {
        for node in group.nodes.iter().filter(|n| n.running()) {
            if let Some(s) = status(group, &node.meta).filter(|s| s.role == "leader") {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "no node leads");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `flotilla meta ACTION …` against the running nodes: (success, stdout, stderr).
fn meta_cli(group: &MetaGroup, args: &[&str]) -> (bool, String, String) {
    let running: Vec<&str> = group.nodes.iter().filter(|n| n.running()).map(|n| n.meta.as_str()).collect();
    let meta = running.join(",");
    cli(&[&["meta"], args, &["--meta", &meta, "--wait-ms", "60000"]].concat())
}

/// Waits until node `index` applied at least what the leader had applied when asked.
fn caught_up(group: &MetaGroup, index: usize) -> GroupStatus {
    let target = leader_status(group).applied_index;
    let deadline = Instant::now() + GROUP_WAIT;
    loop {
        if let Some(mine) = status(group, &group.nodes[index].meta) {
            if mine.applied_index >= target {
                return mine;
            }
        }
        assert!(Instant::now() < deadline, "node {} did not apply up to {target:?}", group.nodes[index].id);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("/{prefix}{i}")).collect()
}

#[test]
fn a_group_grows_to_five_survives_its_leader_and_shrinks() {
    let mut group = MetaGroup::loopback_configured(3, &[], SMALL_SNAPSHOTS);
    group.leader();
    let before = names("before", NAMES_BEFORE);
    for name in &before {
        write(&group, &mkdir(name));
    }
    let compacted = leader_status(&group);
    assert!(compacted.purged_index.is_some(), "the leader compacted nothing: {compacted:?}");

    for id in [4, 5] {
        let index = group.start_joining(id);
        let address = format!("{}/{}", group.nodes[index].meta, group.nodes[index].group);
        let (ok, out, err) = meta_cli(&group, &["add", &id.to_string(), &address]);
        assert!(ok, "meta add {id}: {out}{err}");
        assert!(out.contains(&format!("member={id} ")) && out.contains("voter"), "meta add {id}: {out}");
        let joined = caught_up(&group, index);
        assert_eq!(joined.role, "follower", "node {id} after add: {joined:?}");
        assert!(joined.snapshot_index.is_some(), "node {id} did not install a snapshot: {joined:?}");
    }
    let grown = leader_status(&group);
    assert_eq!(grown.members.iter().filter(|m| m.voter).count(), 5, "{grown:?}");

    // Refusals name what was wrong.
    let (ok, _, err) = meta_cli(&group, &["remove", "9"]);
    assert!(!ok && err.contains("node 9 is not a member"), "remove 9: {err}");
    let used = format!("{}/127.0.0.1:1", group.nodes[3].meta);
    let (ok, _, err) = meta_cli(&group, &["add", "6", &used]);
    assert!(!ok && err.contains("already used by node 4"), "add at node 4's address: {err}");

    // SIGKILL the leader: the names survive and changes go on.
    let old = group.leader();
    let old_id = group.nodes[old].id;
    group.nodes[old].kill();
    let after = names("after", 10);
    for name in &after {
        write(&group, &mkdir(name));
    }
    all_found(&group, &before);
    all_found(&group, &after);

    // Remove the dead node: four voters, all running, go on.
    let (ok, out, err) = meta_cli(&group, &["remove", &old_id.to_string()]);
    assert!(ok, "meta remove {old_id}: {out}{err}");
    let shrunk = leader_status(&group);
    assert_eq!(shrunk.members.len(), 4, "{shrunk:?}");
    assert!(shrunk.members.iter().all(|m| m.node_id != old_id && m.voter), "{shrunk:?}");
    let last = names("last", 5);
    for name in &last {
        write(&group, &mkdir(name));
    }
    all_found(&group, &last);

    let (ok, out, err) = meta_cli(&group, &["status"]);
    assert!(ok, "meta status: {err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("node=")).count(), 4, "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("role=leader")).count(), 1, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("member=")).count(), 4, "{out}");
}

#[test]
fn a_wiped_node_rejoins_from_a_snapshot() {
    let mut group = MetaGroup::loopback_configured(3, &[], SMALL_SNAPSHOTS);
    let leader = group.leader();
    let wiped = (leader + 1) % 3;
    let id = group.nodes[wiped].id;
    for name in names("before", NAMES_BEFORE) {
        write(&group, &mkdir(&name));
    }

    // Its disk is lost: out of the group, then back, empty.
    group.nodes[wiped].kill();
    let (ok, out, err) = meta_cli(&group, &["remove", &id.to_string()]);
    assert!(ok, "meta remove {id}: {out}{err}");
    for name in names("while-away", 30) {
        write(&group, &mkdir(&name));
    }
    group.wipe_and_join(wiped);
    let fresh = status(&group, &group.nodes[wiped].meta).expect("the wiped node answers");
    assert_eq!(fresh.applied_index, None, "a wiped node starts empty: {fresh:?}");
    let address = format!("{}/{}", group.nodes[wiped].meta, group.nodes[wiped].group);
    let (ok, out, err) = meta_cli(&group, &["add", &id.to_string(), &address]);
    assert!(ok, "meta add {id} again: {out}{err}");
    let back = caught_up(&group, wiped);
    assert!(back.snapshot_index.is_some(), "the wiped node did not install a snapshot: {back:?}");
    for name in names("back", 5) {
        write(&group, &mkdir(&name));
    }

    // Same namespace everywhere once every node applied everything.
    caught_up(&group, wiped);
    let applied = leader_status(&group).applied_index;
    for index in 0..3 {
        let deadline = Instant::now() + GROUP_WAIT;
        while status(&group, &group.nodes[index].meta).and_then(|s| s.applied_index) < applied {
            assert!(Instant::now() < deadline, "node {index} behind {applied:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for node in &mut group.nodes {
        node.stop();
    }
    let reference = dump_namespace(&group.nodes[leader].data);
    assert!(reference.len() > NAMES_BEFORE + 30, "{} entries", reference.len());
    assert_eq!(dump_namespace(&group.nodes[wiped].data), reference, "the rejoined node diverges");
}

#[test]
fn the_last_voter_is_not_removed() {
    let group = MetaGroup::loopback(1, &[]);
    group.leader();
    let (ok, _, err) = meta_cli(&group, &["remove", "1"]);
    assert!(!ok && err.contains("last voter"), "remove the only voter: {err}");
}
