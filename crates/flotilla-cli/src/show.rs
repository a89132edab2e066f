//! How commands print: human units by default, exact bytes with `--bytes`, JSON with
//! `--json` (one document per command, for scripts). Pure formatting, tested apart from the
//! commands.

use clap::Args;
use flotilla_client::{EntryInfo, FileKind, TargetState, TargetStatus};
use serde_json::{json, Value};

/// Output options shared by the commands that print sizes.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct Output {
    /// Print sizes as exact byte counts.
    #[arg(long)]
    pub bytes: bool,
    /// Print one JSON document (sizes in bytes).
    #[arg(long, conflicts_with = "bytes")]
    pub json: bool,
}

impl Output {
    /// `bytes` in the chosen unit style.
    pub fn size(&self, bytes: u64) -> String {
        if self.bytes {
            bytes.to_string()
        } else {
            human_bytes(bytes)
        }
    }
}

/// `bytes` in binary units with three significant digits: `0 B`, `999 B`, `1.00 KiB`,
/// `14.8 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // Rounding may carry to 1024 (e.g. 1023.99 KiB): show the next unit instead.
    if format!("{value:.0}") == "1024" && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// Percentage of `used` in `used + free`, for `df`.
pub fn used_percent(used: u64, free: u64) -> u64 {
    let total = u128::from(used) + u128::from(free);
    if total == 0 {
        return 0;
    }
    (u128::from(used) * 100).div_ceil(total) as u64
}

fn state_name(state: TargetState) -> &'static str {
    match state {
        TargetState::Up => "up",
        TargetState::Down => "down",
        TargetState::Lost => "lost",
    }
}

/// The lines of `flotilla status`.
pub fn status_lines(targets: &[TargetStatus], output: Output) -> Vec<String> {
    let (used, free) = if output.bytes { ("used_bytes", "free_bytes") } else { ("used", "free") };
    targets
        .iter()
        .map(|t| {
            format!(
                "target={} server={} state={} {used}={} {free}={} credential={}",
                t.target,
                t.server,
                state_name(t.state),
                quote_spaces(&output.size(t.used_bytes)),
                quote_spaces(&output.size(t.free_bytes)),
                t.credential
            )
        })
        .collect()
}

fn quote_spaces(text: &str) -> String {
    if text.contains(' ') {
        format!("\"{text}\"")
    } else {
        text.to_string()
    }
}

/// The JSON of `status` and `df`: every target, and the totals.
pub fn targets_json(targets: &[TargetStatus]) -> Value {
    let list: Vec<Value> = targets
        .iter()
        .map(|t| {
            json!({
                "target": t.target.to_string(),
                "server": t.server,
                "state": state_name(t.state),
                "used_bytes": t.used_bytes,
                "free_bytes": t.free_bytes,
                "size_bytes": t.used_bytes.saturating_add(t.free_bytes),
                "credential": t.credential,
            })
        })
        .collect();
    let (used, free) = totals(targets);
    json!({
        "targets": list,
        "total": { "used_bytes": used, "free_bytes": free, "size_bytes": used.saturating_add(free) },
    })
}

fn totals(targets: &[TargetStatus]) -> (u64, u64) {
    targets
        .iter()
        .fold((0u64, 0u64), |(u, f), t| (u.saturating_add(t.used_bytes), f.saturating_add(t.free_bytes)))
}

/// The table of `flotilla df`: one row per target and a total row (targets that are down
/// count in the total with the space they last reported).
pub fn df_table(targets: &[TargetStatus], output: Output) -> String {
    let mut rows =
        vec![["TARGET", "SERVER", "STATE", "SIZE", "USED", "AVAIL", "USE%"].map(String::from).to_vec()];
    for t in targets {
        rows.push(vec![
            t.target.to_string(),
            t.server.clone(),
            state_name(t.state).to_string(),
            output.size(t.used_bytes.saturating_add(t.free_bytes)),
            output.size(t.used_bytes),
            output.size(t.free_bytes),
            format!("{}%", used_percent(t.used_bytes, t.free_bytes)),
        ]);
    }
    let (used, free) = totals(targets);
    rows.push(vec![
        "total".into(),
        format!("{} targets", targets.len()),
        format!("{} up", targets.iter().filter(|t| t.state == TargetState::Up).count()),
        output.size(used.saturating_add(free)),
        output.size(used),
        output.size(free),
        format!("{}%", used_percent(used, free)),
    ]);
    table(&rows)
}

/// Left-aligned text columns, right-aligned numbers, two spaces apart.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let numeric = cell.starts_with(|ch: char| ch.is_ascii_digit());
                if numeric {
                    format!("{cell:>width$}", width = widths[c])
                } else {
                    format!("{cell:<width$}", width = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
    }
}

/// The lines of `flotilla stat`; the layout in the syntax `--layout` and the xattr use.
pub fn stat_lines(entry: &EntryInfo, output: Output) -> Vec<String> {
    let a = &entry.attrs;
    let kind = kind_name(a.kind);
    let size = if output.bytes {
        a.size_bytes.to_string()
    } else {
        format!("{} ({} bytes)", human_bytes(a.size_bytes), a.size_bytes)
    };
    let mut lines = vec![
        format!(
            "id={:016x} kind={kind} mode={:o} uid={} gid={} nlink={}",
            entry.id, a.mode, a.uid, a.gid, a.nlink
        ),
        format!("size={size}"),
        format!("atime_ns={} mtime_ns={} ctime_ns={}", a.atime_ns, a.mtime_ns, a.ctime_ns),
    ];
    if let Some(layout) = &entry.replicated_layout() {
        let label = if a.kind == FileKind::Directory { "default_layout" } else { "layout" };
        lines.push(format!("{label}={layout}"));
    }
    if let Some(target) = &entry.symlink {
        lines.push(format!("symlink={target}"));
    }
    for (index, place) in entry.subfiles.iter().enumerate() {
        let mut line =
            format!("subfile={index} target={} server={} up={}", place.target, place.server, place.up);
        if let Some(chain) = &place.chain {
            let replicas: Vec<String> = chain
                .members
                .iter()
                .map(|m| format!("{}@{}:{}", m.target, m.server, replica_state(m.state)))
                .collect();
            line.push_str(&format!(
                " chain={} version={} replicas={}",
                chain.chain,
                chain.version,
                replicas.join(",")
            ));
        }
        lines.push(line);
    }
    lines
}

/// A replica's state as `stat` shows it.
fn replica_state(state: flotilla_proto::ChainMemberState) -> String {
    use flotilla_proto::ChainMemberState as S;
    match state {
        S::Serving => "serving".into(),
        S::Syncing { missed_since, .. } => format!("syncing@{missed_since}"),
        S::Offline { missed_since, .. } => format!("offline@{missed_since}"),
        S::Dead => "dead".into(),
    }
}

/// The JSON of `flotilla stat`.
pub fn stat_json(entry: &EntryInfo) -> Value {
    let a = &entry.attrs;
    json!({
        "id": entry.id,
        "kind": kind_name(a.kind),
        "mode": a.mode,
        "uid": a.uid,
        "gid": a.gid,
        "nlink": a.nlink,
        "size_bytes": a.size_bytes,
        "atime_ns": a.atime_ns,
        "mtime_ns": a.mtime_ns,
        "ctime_ns": a.ctime_ns,
        "layout": entry.replicated_layout().map(|l| l.to_string()),
        "symlink": entry.symlink,
        "subfiles": entry.subfiles.iter().map(|p| json!({
            "target": p.target.to_string(), "server": p.server, "up": p.up,
            "chain": p.chain.as_ref().map(|c| json!({
                "chain": c.chain,
                "version": c.version,
                "replicas": c.members.iter().map(|m| json!({
                    "target": m.target.to_string(), "server": m.server, "state": replica_state(m.state),
                })).collect::<Vec<_>>(),
            })),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_keeps_three_significant_digits() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(14_764_814_336), "13.8 GiB");
        assert_eq!(human_bytes(1024 * 1024 - 1), "1.00 MiB", "rounding carries to the next unit");
        assert_eq!(human_bytes(150 << 20), "150 MiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn used_percent_rounds_up_and_survives_empty_and_huge_targets() {
        assert_eq!(used_percent(0, 0), 0);
        assert_eq!(used_percent(1, 999), 1, "any use shows as at least 1%");
        assert_eq!(used_percent(50, 50), 50);
        assert_eq!(used_percent(u64::MAX, u64::MAX), 50);
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![vec!["A".to_string(), "SIZE".to_string()], vec!["long".to_string(), "5".to_string()]];
        assert_eq!(table(&rows), "A     SIZE\nlong     5\n");
    }
}
