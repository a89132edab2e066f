//! ENWRICH mode for POSIX programs (issue 10): with the mount's `enwrich` option, a file a
//! process opens write-only is opened in ENWRICH mode when that process's environment names
//! a job (`FLOTILLA_JOB_NAME` and `FLOTILLA_JOB_SIZE`, or SLURM's or an MPI launcher's
//! variables, as `EnwrichOptions::from_env` reads them): its writes go to an `EnwrichFile`
//! (a log cache in the mount, one per open, so one job member per process and file), `fsync`
//! and `close` flush the whole job durably, and any other open of the file through the mount
//! flushes it first (flush-on-read). A process whose environment names no job gets an
//! ordinary open.
//!
//! The environment is read from `/proc/PID/environ` of the process the kernel names in the
//! open request, at most [`ENVIRON_BYTES_MAX`] bytes of it.

use flotilla_client::EnwrichOptions;
use std::io::Read;

/// Most bytes of a process's environment the mount reads (Linux allows a few MiB of
/// arguments and environment together; job variables are set by launchers early on).
pub const ENVIRON_BYTES_MAX: u64 = 1 << 20;

/// The value of `name` in an environment block (`KEY=VALUE` entries separated by NULs).
/// Pure.
pub fn environ_var(environ: &[u8], name: &str) -> Option<String> {
    environ.split(|byte| *byte == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        String::from_utf8(value.to_vec()).ok()
    })
}

/// The ENWRICH job of the process `pid`, if its environment names one; the log cache size
/// `cache_bytes`.
pub fn job_of_process(pid: u32, cache_bytes: u64) -> Option<EnwrichOptions> {
    let mut environ = Vec::new();
    let file = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    file.take(ENVIRON_BYTES_MAX).read_to_end(&mut environ).ok()?;
    let mut options = EnwrichOptions::from_vars(|name| environ_var(&environ, name))?;
    options.cache_bytes = cache_bytes;
    Some(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_variables_by_exact_name() {
        let environ = b"PATH=/bin\0FLOTILLA_JOB_NAMES=no\0FLOTILLA_JOB_NAME=climate\0FLOTILLA_JOB_SIZE=8\0";
        assert_eq!(environ_var(environ, "FLOTILLA_JOB_NAME").as_deref(), Some("climate"));
        assert_eq!(environ_var(environ, "FLOTILLA_JOB_SIZE").as_deref(), Some("8"));
        assert_eq!(environ_var(environ, "HOME"), None);
        let options = EnwrichOptions::from_vars(|name| environ_var(environ, name)).unwrap();
        assert_eq!((options.job_name.as_str(), options.job_size), ("climate", 8));
    }

    #[test]
    fn no_job_without_a_size() {
        let environ = b"FLOTILLA_JOB_NAME=climate\0";
        assert!(EnwrichOptions::from_vars(|name| environ_var(environ, name)).is_none());
    }

    #[test]
    fn reads_this_process() {
        // The test runner's own environment has PATH; no job unless the caller set one.
        let mine = std::fs::read(format!("/proc/{}/environ", std::process::id())).unwrap();
        assert_eq!(environ_var(&mine, "PATH"), std::env::var("PATH").ok());
        assert_eq!(
            job_of_process(std::process::id(), 1 << 20).is_some(),
            EnwrichOptions::from_env().is_some()
        );
    }
}
