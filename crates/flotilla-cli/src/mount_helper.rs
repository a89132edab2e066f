//! `mount.flotilla`: what mount(8) runs for `mount -t flotilla META:PORT DIR -o OPTIONS` and
//! for `/etc/fstab` lines of type `flotilla` (the source may list every metadata node,
//! `A:PORT,B:PORT,C:PORT`: it becomes `--meta A:PORT,B:PORT,C:PORT`). The flotilla binary
//! answers to that name (`flotilla install` makes the link); it starts `flotilla mount`
//! detached in its own session, waits until the mount serves, and returns, as mount(8)
//! expects.

use anyhow::Context;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The name mount(8) looks for in /sbin.
pub const HELPER_NAME: &str = "mount.flotilla";

/// Options mount(8) or fstab may pass that mean nothing to a FUSE mount of Flotilla.
const IGNORED: [&str; 22] = [
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "nofail", "_netdev", "exec",
    "noexec", "suid", "nosuid", "dev", "nodev", "async", "sync", "atime", "noatime", "relatime", "loud",
];

/// The arguments of `flotilla` that serve the mount described by mount(8)'s arguments.
pub fn mount_arguments(source: &str, dir: &Path, options: &str, sloppy: bool) -> anyhow::Result<Vec<String>> {
    let (mut global, mut local) = (Vec::new(), Vec::new());
    for option in options.split(',').filter(|o| !o.is_empty()) {
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (option, None),
        };
        let flag = match name {
            "key" | "config" => {
                global.extend([format!("--{name}"), required(name, value)?]);
                continue;
            }
            "ro" => {
                local.push("--read-only".to_string());
                continue;
            }
            "enwrich" => {
                local.push("--enwrich".to_string());
                continue;
            }
            "threads" | "attr_timeout_ms" | "write_behind_bytes" | "metrics_listen" | "enwrich_cache_bytes"
            | "readahead_bytes" | "outage_wait_ms" => {
                name.replace('_', "-")
            }
            _ if IGNORED.contains(&name) || name.starts_with("x-") || name.starts_with("comment=") => {
                continue
            }
            _ if sloppy => continue,
            _ => anyhow::bail!(
                "unknown mount option {option:?} (flotilla takes ro, enwrich, key=FILE, config=FILE, threads=N, \
                 attr_timeout_ms=N, write_behind_bytes=N, enwrich_cache_bytes=N, readahead_bytes=N, outage_wait_ms=N, \
                 metrics_listen=ADDR)"
            ),
        };
        local.extend([format!("--{flag}"), required(name, value)?]);
    }
    let mut arguments = global;
    arguments.extend(["mount".to_string(), "--meta".to_string(), source.to_string()]);
    arguments.extend(local);
    arguments.push(dir.display().to_string());
    Ok(arguments)
}

fn required(name: &str, value: Option<&str>) -> anyhow::Result<String> {
    match value {
        Some(value) if !value.is_empty() => Ok(value.to_string()),
        _ => anyhow::bail!("mount option {name} needs a value ({name}=...)"),
    }
}

/// mount(8)'s arguments: `SOURCE DIR [-sfnv] [-o OPTIONS] [-t TYPE] [-N NS]`.
struct HelperArgs {
    source: String,
    dir: PathBuf,
    options: String,
    sloppy: bool,
    fake: bool,
}

fn parse(arguments: &[String]) -> anyhow::Result<HelperArgs> {
    let mut positional = Vec::new();
    let (mut options, mut sloppy, mut fake) = (String::new(), false, false);
    let mut rest = arguments.iter();
    while let Some(argument) = rest.next() {
        match argument.as_str() {
            "-o" => options = rest.next().context("-o needs options")?.clone(),
            "-t" | "-N" => {
                rest.next();
            }
            "-s" => sloppy = true,
            "-f" => fake = true,
            "-n" | "-v" => {}
            other => positional.push(other.to_string()),
        }
    }
    let [source, dir] = <[String; 2]>::try_from(positional)
        .map_err(|_| anyhow::anyhow!("usage: {HELPER_NAME} META:PORT DIR [-o OPTIONS]"))?;
    Ok(HelperArgs { source, dir: PathBuf::from(dir), options, sloppy, fake })
}

/// Runs as `mount.flotilla`: starts the mount detached and returns once it serves.
pub fn run(arguments: &[String]) -> anyhow::Result<()> {
    let args = parse(arguments)?;
    let flotilla = mount_arguments(&args.source, &args.dir, &args.options, args.sloppy)?;
    if args.fake {
        return Ok(());
    }
    let exe = std::env::current_exe().context("find the flotilla binary")?;
    let mut command = Command::new(exe);
    command.args(&flotilla).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; the child gets its own session so it outlives
    // mount(8) and the terminal it ran in.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("start flotilla mount")?;
    let stdout = child.stdout.take().context("read flotilla mount's output")?;
    for line in BufReader::new(stdout).lines() {
        if line.map(|l| l.starts_with("mount=")).unwrap_or(false) {
            return Ok(()); // serving; it carries on without us
        }
    }
    let mut errors = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut errors);
    }
    let status = child.wait().context("wait for flotilla mount")?;
    anyhow::bail!(
        "flotilla mount of {} on {} failed ({status}): {}",
        args.source,
        args.dir.display(),
        errors.trim()
    )
}

/// `flotilla install`: links `DIR/mount.flotilla` to this binary.
pub fn install(dir: &Path, remove: bool) -> anyhow::Result<()> {
    let link = dir.join(HELPER_NAME);
    if remove {
        return std::fs::remove_file(&link).with_context(|| format!("remove {}", link.display()));
    }
    let exe = std::env::current_exe().context("find the flotilla binary")?;
    match std::fs::remove_file(&link) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(error).with_context(|| format!("replace {}", link.display()))
        }
        _ => {}
    }
    std::os::unix::fs::symlink(&exe, &link)
        .with_context(|| format!("link {} to {}", link.display(), exe.display()))?;
    println!("{} -> {}", link.display(), exe.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn options_become_flags() {
        let arguments = mount_arguments(
            "h:7770",
            Path::new("/mnt/f"),
            "rw,ro,key=/k,threads=4,_netdev,x-systemd.automount",
            false,
        );
        assert_eq!(
            arguments.unwrap(),
            strings(&["--key", "/k", "mount", "--meta", "h:7770", "--read-only", "--threads", "4", "/mnt/f"])
        );
    }

    #[test]
    fn unknown_options_are_refused_unless_sloppy() {
        let refused = mount_arguments("h:1", Path::new("/m"), "bogus=1", false).unwrap_err();
        assert!(refused.to_string().contains("bogus"), "{refused}");
        assert!(mount_arguments("h:1", Path::new("/m"), "bogus=1", true).is_ok());
        assert!(mount_arguments("h:1", Path::new("/m"), "key=", false).is_err(), "key needs a value");
    }

    #[test]
    fn mount8_arguments_are_parsed() {
        let parsed = parse(&strings(&["h:1", "/m", "-n", "-o", "ro", "-t", "flotilla"])).unwrap();
        assert_eq!((parsed.source.as_str(), parsed.options.as_str()), ("h:1", "ro"));
        assert!(parse(&strings(&["only-one"])).is_err());
    }

    #[test]
    fn an_fstab_source_listing_several_metadata_nodes_is_one_meta_list() {
        let parsed = parse(&strings(&["a:1,b:1,c:1", "/m", "-o", "ro"])).unwrap();
        let arguments = mount_arguments(&parsed.source, &parsed.dir, &parsed.options, false).unwrap();
        assert_eq!(arguments, strings(&["mount", "--meta", "a:1,b:1,c:1", "--read-only", "/m"]));
    }
}
