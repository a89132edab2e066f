//! `flotilla scrub [PATH]`: checks every block of every file under PATH (default `/`)
//! against its checksum on disk; for replicated files each subfile's serving members are
//! compared and bad blocks are rewritten from a member whose block verifies (issue 32).
//! Prints one line per file and what it found, then a total; fails when a bad block stays
//! unrepaired or replicas differ.

use crate::args::MetaArg;
use clap::Args;
use flotilla_client::{Client, ForkScrub};
use flotilla_types::FileKind;

#[derive(Args)]
pub struct ScrubArgs {
    #[command(flatten)]
    meta: MetaArg,
    /// A file or directory (walked recursively).
    #[arg(default_value = "/")]
    path: String,
}

/// What scrubbing one file found, summed over its forks' ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileTally {
    pub bytes: u64,
    pub blocks: u64,
    /// Most members compared for one range (1: a file with one copy).
    pub members: u32,
    pub bad: u64,
    pub repaired: u64,
    pub differing: u64,
    pub notes: Vec<String>,
}

impl FileTally {
    /// Bad blocks no repair took care of.
    pub fn unrepaired(&self) -> u64 {
        self.bad.saturating_sub(self.repaired)
    }
}

/// Sums one file's ranges (pure).
pub fn tally(ranges: &[ForkScrub]) -> FileTally {
    let mut tally = FileTally::default();
    for range in ranges {
        let report = &range.report;
        tally.bytes += (report.entries.len() as u64 * report.block_bytes)
            .min(report.size_bytes.saturating_sub(report.offset));
        tally.blocks += report.entries.len() as u64;
        tally.members = tally.members.max(report.members);
        tally.bad += report.bad.len() as u64;
        tally.repaired += report.repaired.len() as u64;
        tally.differing += report.differing.len() as u64;
        for note in &report.notes {
            tally.notes.push(format!("subfile {} fork {}: {note}", range.subfile, range.fork));
        }
        for block in &report.bad {
            let fixed = report.repaired.contains(block);
            tally.notes.push(format!(
                "subfile {} fork {}: block at {} on target {} failed its checksum{}",
                range.subfile,
                range.fork,
                block.offset,
                block.target,
                if fixed { "; repaired" } else { "; NOT repaired" }
            ));
        }
        for offset in &report.differing {
            tally.notes.push(format!(
                "subfile {} fork {}: replicas differ at {offset} (each verifies)",
                range.subfile, range.fork
            ));
        }
    }
    tally
}

pub fn scrub(args: ScrubArgs) -> anyhow::Result<()> {
    let client = args.meta.client()?;
    let mut files = Vec::new();
    walk(&client, &args.path, &mut files)?;
    let (mut total, mut failed) = (FileTally::default(), 0usize);
    for path in &files {
        let ranges = match client.open(path).and_then(|file| file.scrub()) {
            Ok(ranges) => ranges,
            Err(error) => {
                println!("{path}: not scrubbed: {error}");
                failed += 1;
                continue;
            }
        };
        let file = tally(&ranges);
        let copies =
            if file.members > 1 { format!("{} replicas compared", file.members) } else { "one copy".into() };
        println!(
            "{path}: checked {} bytes ({} blocks, {copies}): {} bad, {} repaired, {} differing",
            file.bytes, file.blocks, file.bad, file.repaired, file.differing
        );
        for note in &file.notes {
            println!("  {note}");
        }
        total.bytes += file.bytes;
        total.blocks += file.blocks;
        total.bad += file.bad;
        total.repaired += file.repaired;
        total.differing += file.differing;
    }
    println!(
        "scrub: {} files, {} bytes, {} blocks checked; {} bad, {} repaired, {} differing, {} files not scrubbed",
        files.len(),
        total.bytes,
        total.blocks,
        total.bad,
        total.repaired,
        total.differing,
        failed
    );
    if total.unrepaired() > 0 || total.differing > 0 || failed > 0 {
        anyhow::bail!(
            "{} bad blocks not repaired, {} blocks differing between replicas, {failed} files not scrubbed",
            total.unrepaired(),
            total.differing
        );
    }
    Ok(())
}

/// The regular files at or under `path`, in name order.
fn walk(client: &Client, path: &str, out: &mut Vec<String>) -> anyhow::Result<()> {
    let entry = client.stat(path)?;
    if entry.attrs.kind != FileKind::Directory {
        if entry.attrs.kind == FileKind::File {
            out.push(path.to_string());
        }
        return Ok(());
    }
    let mut children = client.readdir(path)?;
    children.sort_by(|a, b| a.name.cmp(&b.name));
    for child in children {
        let full = if path.ends_with('/') {
            format!("{path}{}", child.name)
        } else {
            format!("{path}/{}", child.name)
        };
        match child.kind {
            FileKind::Directory => walk(client, &full, out)?,
            FileKind::File => out.push(full),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::{ScrubBlock, ScrubReport};
    use flotilla_types::TargetId;

    #[test]
    fn tally_counts_blocks_and_what_stays_bad() {
        let mut report = ScrubReport::new(TargetId(1), 0, 4096, 10_000);
        report.entries = vec![1, 2, 3];
        report.members = 2;
        let bad = |target, offset| ScrubBlock { target: TargetId(target), offset };
        report.bad = vec![bad(1, 4096), bad(2, 8192)];
        report.repaired = vec![bad(1, 4096)];
        let range = ForkScrub { subfile: 0, fork: "data".into(), report };
        let file = tally(&[range]);
        assert_eq!((file.bytes, file.blocks, file.members), (10_000, 3, 2));
        assert_eq!((file.bad, file.repaired, file.unrepaired()), (2, 1, 1));
        assert!(file.notes.iter().any(|n| n.contains("at 8192 on target") && n.contains("NOT repaired")));
        assert!(file.notes.iter().any(|n| n.contains("at 4096") && n.ends_with("; repaired")));
    }
}
