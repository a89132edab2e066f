//! `flotilla hsm`: the tertiary tier from the command line (after Lustre's `lfs hsm_state`,
//! `hsm_archive`, `hsm_release`, `hsm_restore`). A file's data lives in its subfiles' forks,
//! each on one server's lines target; the file's state sums up its forks' states. The
//! summary is pure and tested apart from the commands.

use crate::args::MetaArg;
use crate::show::{table, Output};
use clap::{Args, Subcommand};
use flotilla_client::{Client, ForkHsm};
use flotilla_proto::{ErrorCode, HsmAction, Residency};
use serde_json::json;

#[derive(Subcommand)]
pub enum HsmCommand {
    /// Where a file's data is: resident (disk only), archived (disk and archive), released
    /// (some or all only in the archive; reads recall it) or modified (changed since archived).
    State(HsmPathArgs),
    /// Copies the file's data to the archive now and marks its disk blocks clean.
    Archive(HsmPathArgs),
    /// Drops the file's data from the disks (refused unless its archive copy holds every byte).
    Release(HsmPathArgs),
    /// Recalls every part of the file that is only in the archive.
    Restore(HsmPathArgs),
    /// The tier counters of every server's targets: archived, recalled, reclaimed, space.
    Status(crate::args::ReportArgs),
}

#[derive(Args)]
pub struct HsmPathArgs {
    #[command(flatten)]
    meta: MetaArg,
    path: String,
    #[command(flatten)]
    output: Output,
}

/// A file's place in the hierarchy, summed over its forks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub residency: Residency,
    pub size_bytes: u64,
    pub resident_bytes: u64,
    pub archived_bytes: u64,
    pub forks: usize,
}

/// The file's state: modified if any fork is, else released if any is, else resident if any
/// fork has no archive copy, else archived. A file with no forks yet is resident.
pub fn summarize(forks: &[ForkHsm]) -> Summary {
    let has = |residency: Residency| forks.iter().any(|fork| fork.state.residency == residency);
    let residency = if has(Residency::Modified) {
        Residency::Modified
    } else if has(Residency::Released) {
        Residency::Released
    } else if has(Residency::Resident) || forks.is_empty() {
        Residency::Resident
    } else {
        Residency::Archived
    };
    // A replicated subfile's fork appears once per copy: its data counts once, its bytes on
    // disk and in the archive once per copy (each member holds and archives its own).
    let mut sizes = std::collections::BTreeMap::new();
    for fork in forks {
        let size = sizes.entry((fork.subfile, fork.fork.as_str())).or_insert(0u64);
        *size = (*size).max(fork.state.size_bytes);
    }
    Summary {
        residency,
        size_bytes: sizes.values().sum(),
        resident_bytes: forks.iter().map(|fork| fork.state.resident_bytes).sum(),
        archived_bytes: forks.iter().map(|fork| fork.state.archived_bytes).sum(),
        forks: sizes.len(),
    }
}

pub fn residency_name(residency: Residency) -> &'static str {
    match residency {
        Residency::Resident => "resident",
        Residency::Archived => "archived",
        Residency::Released => "released",
        Residency::Modified => "modified",
    }
}

pub fn run(command: HsmCommand) -> anyhow::Result<()> {
    let (args, action) = match command {
        HsmCommand::Status(args) => return status(args),
        HsmCommand::State(args) => (args, HsmAction::State),
        HsmCommand::Archive(args) => (args, HsmAction::Archive),
        HsmCommand::Release(args) => (args, HsmAction::Release),
        HsmCommand::Restore(args) => (args, HsmAction::Restore),
    };
    let client = args.meta.client()?;
    let forks = client.open(&args.path)?.hsm(action)?;
    print_state(&args.path, &forks, args.output);
    Ok(())
}

fn print_state(path: &str, forks: &[ForkHsm], output: Output) {
    let summary = summarize(forks);
    if output.json {
        let forks: Vec<_> = forks
            .iter()
            .map(|fork| {
                json!({
                    "subfile": fork.subfile, "fork": fork.fork, "server": fork.server,
                    "state": residency_name(fork.state.residency), "size_bytes": fork.state.size_bytes,
                    "resident_bytes": fork.state.resident_bytes, "archived_bytes": fork.state.archived_bytes,
                    "archived_at_s": fork.state.archived_at_s, "object": fork.state.object_key,
                })
            })
            .collect();
        let document = json!({
            "path": path, "state": residency_name(summary.residency), "size_bytes": summary.size_bytes,
            "resident_bytes": summary.resident_bytes, "archived_bytes": summary.archived_bytes, "forks": forks,
        });
        println!("{document}");
        return;
    }
    println!(
        "{path}: {} (data {}, on disk {}, archived {}, {} forks)",
        residency_name(summary.residency),
        output.size(summary.size_bytes),
        output.size(summary.resident_bytes),
        output.size(summary.archived_bytes),
        summary.forks
    );
    for fork in forks {
        println!(
            "  subfile={} fork={} server={} state={} on_disk={} archived={} object={}",
            fork.subfile,
            fork.fork,
            fork.server,
            residency_name(fork.state.residency),
            output.size(fork.state.resident_bytes),
            output.size(fork.state.archived_bytes),
            if fork.state.object_key.is_empty() { "-" } else { &fork.state.object_key }
        );
    }
}

/// The `tier=` line of `flotilla stat` for a regular file: `None` when its servers have no
/// tier.
pub fn stat_line(client: &Client, path: &str) -> Option<String> {
    match client.open(path).and_then(|file| file.hsm(HsmAction::State)) {
        Ok(forks) => {
            let summary = summarize(&forks);
            Some(format!(
                "tier={} on_disk_bytes={} archived_bytes={}",
                residency_name(summary.residency),
                summary.resident_bytes,
                summary.archived_bytes
            ))
        }
        Err(error) if error.code() == Some(ErrorCode::InvalidArgument) => None,
        Err(error) => Some(format!("tier=unknown ({error})")),
    }
}

fn status(args: crate::args::ReportArgs) -> anyhow::Result<()> {
    let (client, output) = args.parts()?;
    let mut servers: Vec<String> = client.status()?.into_iter().map(|target| target.server).collect();
    servers.sort();
    servers.dedup();
    let mut rows = vec![[
        "server",
        "target",
        "archived",
        "archived_bytes",
        "recalls",
        "recalled",
        "failed",
        "reclaimed",
        "dirty",
        "clean",
        "free",
    ]
    .map(String::from)
    .to_vec()];
    let mut documents = Vec::new();
    for server in &servers {
        let targets = match client.hsm_status(server) {
            Ok(targets) => targets,
            Err(error) => {
                eprintln!("flotilla: no hsm status from {server}: {error}");
                continue;
            }
        };
        for t in targets {
            let bytes = |blocks: u64| output.size(blocks * t.block_bytes);
            rows.push(vec![
                server.clone(),
                t.target.to_string(),
                t.archived_forks.to_string(),
                output.size(t.archived_bytes),
                t.recalls.to_string(),
                output.size(t.recalled_bytes),
                t.recall_failures.to_string(),
                bytes(t.reclaimed_blocks),
                bytes(t.dirty_blocks),
                bytes(t.clean_blocks),
                bytes(t.free_blocks),
            ]);
            documents.push(json!({
                "server": server, "target": t.target.to_string(), "archived_forks": t.archived_forks,
                "archived_bytes": t.archived_bytes, "recalls": t.recalls, "recalled_bytes": t.recalled_bytes,
                "recall_failures": t.recall_failures, "released_forks": t.released_forks,
                "superseded_copies": t.superseded_copies, "read_throughs": t.read_throughs, "reclaimed_bytes": t.reclaimed_blocks * t.block_bytes,
                "dirty_bytes": t.dirty_blocks * t.block_bytes, "clean_bytes": t.clean_blocks * t.block_bytes,
                "free_bytes": t.free_blocks * t.block_bytes,
            }));
        }
    }
    if output.json {
        println!("{}", json!({ "targets": documents }));
    } else if rows.len() == 1 {
        println!("no server has an archive (start them with --archive or [server.archive])");
    } else {
        print!("{}", table(&rows));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::HsmForkState;

    fn fork(subfile: u32, residency: Residency, size: u64, on_disk: u64, archived: u64) -> ForkHsm {
        ForkHsm {
            subfile,
            fork: "data".into(),
            server: "s".into(),
            state: HsmForkState {
                residency,
                size_bytes: size,
                resident_bytes: on_disk,
                archived_bytes: archived,
                archived_at_s: 0,
                object_key: String::new(),
            },
        }
    }

    #[test]
    fn a_file_is_as_far_from_its_disks_as_its_worst_fork() {
        let archived = fork(0, Residency::Archived, 10, 10, 10);
        let released = fork(1, Residency::Released, 10, 0, 10);
        let resident = fork(2, Residency::Resident, 10, 10, 0);
        let modified = fork(3, Residency::Modified, 12, 12, 10);
        assert_eq!(summarize(&[]).residency, Residency::Resident);
        assert_eq!(summarize(&[archived.clone(), archived.clone()]).residency, Residency::Archived);
        assert_eq!(summarize(&[archived.clone(), resident.clone()]).residency, Residency::Resident);
        assert_eq!(summarize(&[resident.clone(), released.clone()]).residency, Residency::Released);
        let all = summarize(&[archived, released, resident, modified]);
        assert_eq!(all.residency, Residency::Modified);
        assert_eq!((all.size_bytes, all.resident_bytes, all.archived_bytes, all.forks), (42, 32, 30, 4));
    }

    #[test]
    fn a_replicated_forks_data_counts_once_and_its_copies_bytes_each() {
        let head = fork(0, Residency::Archived, 10, 10, 10);
        let tail = ForkHsm { server: "t".into(), ..fork(0, Residency::Released, 10, 0, 10) };
        let both = summarize(&[head, tail]);
        assert_eq!(both.residency, Residency::Released);
        assert_eq!((both.size_bytes, both.resident_bytes, both.archived_bytes, both.forks), (10, 10, 20, 1));
    }
}
