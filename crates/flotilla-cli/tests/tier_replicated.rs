//! The tertiary tier on a replicated file (issue 32: recalls from the archive honour
//! replicas): two I/O servers in distinct failure groups, on lines targets, archiving to a
//! real S3 server (`s3s-fs`) on loopback. A `replicas=2` file is archived, released,
//! recalled (`hsm restore`) and read back byte for byte; every step is applied by both
//! members to their own copies (one archive object each, under distinct keys), `hsm state`
//! shows each member; after one member is SIGKILLed the released file still reads back from
//! the other.

mod common;

use common::replication::{chain_table_built, replicated, wait_until};
use common::s3::S3Server;
use common::{cli, random_bytes, seed_for, server_args, Cluster, Process};
use flotilla_client::{File, ForkHsm};
use flotilla_proto::{HsmAction, Residency};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

const LINES: &str = "lines,capacity=64m,block=64k,line_blocks=64,group_blocks=8";
/// Short membership timings (as `replicated.rs`): a killed member is fenced within about a
/// second.
const MEMBERSHIP: &str =
    "lease_ms = 400\nclock_margin_ms = 100\nfence_after_ms = 1000\nchains_per_target = 2\n";
/// Bound on waiting for the chain table or a fence.
const SETTLE: Duration = Duration::from_secs(20);
const GROUPS: [&str; 2] = ["rack-a", "rack-b"];

/// A metadata service and one server per group, each on a lines target and archiving to
/// `s3`; returns once both targets are up and the chain table is built.
fn cluster(s3: &S3Server) -> Cluster {
    let url = format!("s3://{}/flotilla", s3.bucket);
    let setting =
        format!("archive = {{ url = {url:?}, timeout_ms = 3000, retries_max = 0, archive_age_s = 3600 }}");
    let mut cluster = Cluster::start_configured(0, MEMBERSHIP, &setting);
    cluster.server_env = s3.env();
    let (config, meta) = (cluster.config(), cluster.meta_addr());
    for (index, group) in GROUPS.iter().enumerate() {
        let dir = cluster.target_dir(index);
        std::fs::create_dir_all(&dir).expect("create target dir");
        let spec = PathBuf::from(format!("{LINES}:{}", dir.display()));
        let args = server_args(&config, &meta, &spec, "127.0.0.1:0", group);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Process::start_with_env(&args, "server", &cluster.server_env).expect("start server");
        cluster.servers.push(Some(server));
    }
    cluster.wait_up(GROUPS.len());
    wait_until("the chain table", SETTLE, || chain_table_built(&meta));
    cluster
}

fn read_all(file: &File) -> Vec<u8> {
    let mut got = vec![0u8; file.size() as usize];
    let read = file.read_at(0, &mut got).expect("read");
    got.truncate(read);
    got
}

/// Every copy of every fork is in `residency`; returns the servers that answered.
fn all_in(forks: &[ForkHsm], residency: Residency, step: &str) -> BTreeSet<String> {
    assert!(!forks.is_empty(), "{step}: the file has forks");
    for fork in forks {
        assert_eq!(fork.state.residency, residency, "{step}: {fork:?}");
    }
    forks.iter().map(|fork| fork.server.clone()).collect()
}

#[test]
fn a_replicated_file_is_archived_released_and_recalled_on_every_member() {
    let seed = seed_for("tier_replicated");
    let s3 = S3Server::start();
    let mut cluster = cluster(&s3);
    let servers: BTreeSet<String> =
        cluster.servers.iter().map(|s| s.as_ref().expect("running").addr.clone()).collect();
    let client = cluster.client();
    let data = random_bytes(seed, (3 << 20) + 4321);
    let file = client.create("/r", &replicated(1, 256 << 10)).expect("create");
    file.write_at(0, &data).expect("write");
    file.close().expect("close");
    let file = client.open("/r").expect("open");

    let refused = file.hsm(HsmAction::Release).unwrap_err().to_string();
    assert!(refused.contains("no archive copy"), "{refused}");
    let archived = file.hsm(HsmAction::Archive).expect("archive");
    assert_eq!(all_in(&archived, Residency::Archived, "archive"), servers, "each member archived");
    assert_eq!(archived.len(), 2, "the data fork's two copies: {archived:?}");
    let keys: BTreeSet<&str> = archived.iter().map(|fork| fork.state.object_key.as_str()).collect();
    assert_eq!(keys.len(), 2, "every copy has its own archive object: {archived:?}");

    let released = file.hsm(HsmAction::Release).expect("release");
    assert_eq!(all_in(&released, Residency::Released, "release"), servers);
    assert!(released.iter().all(|fork| fork.state.resident_bytes == 0), "{released:?}");
    let (ok, stdout, stderr) = cli(&["hsm", "state", "--meta", &cluster.meta_addr(), "/r"]);
    assert!(ok, "{stderr}");
    for server in &servers {
        assert!(stdout.contains(&format!("server={server} state=released")), "{server}: {stdout}");
    }

    let recalled = file.hsm(HsmAction::Restore).expect("restore");
    assert_eq!(all_in(&recalled, Residency::Archived, "restore"), servers, "each member recalled");
    assert!(recalled.iter().all(|fork| fork.state.resident_bytes >= fork.state.size_bytes), "{recalled:?}");
    assert!(read_all(&client.open("/r").expect("open")) == data, "restored file reads back");

    // Released again, then one member SIGKILLed: the other recalls from its own copy.
    let released = file.hsm(HsmAction::Release).expect("release again");
    assert_eq!(all_in(&released, Residency::Released, "release again"), servers);
    let killed = cluster.servers[0].take().expect("server 0 running");
    let killed_addr = killed.addr.clone();
    killed.kill();
    assert!(read_all(&client.open("/r").expect("open")) == data, "read back from the survivor");
    let meta = cluster.meta_addr();
    // `stat` lists each subfile's replicas as TARGET@SERVER:STATE.
    let fenced = format!("@{killed_addr}:offline");
    wait_until("the killed member fenced", SETTLE, || {
        let (ok, stdout, _) = cli(&["stat", "/r", "--meta", &meta]);
        let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("subfile=")).collect();
        ok && lines.len() == 1 && lines.iter().all(|l| l.contains(&fenced))
    });
    let states =
        client.open("/r").expect("open").hsm(HsmAction::State).expect("state without the killed member");
    assert!(
        states.iter().all(|fork| fork.server != killed_addr),
        "a fenced member is never asked: {states:?}"
    );
    assert_eq!(
        all_in(&states, Residency::Archived, "after the read"),
        BTreeSet::from([states[0].server.clone()])
    );
    assert!(
        states[0].state.resident_bytes >= data.len() as u64,
        "the survivor recalled its copy: {states:?}"
    );
    assert_eq!(states.len(), 1, "one copy is left serving: {states:?}");
}
