//! The environment variables a client reads.

/// The environment variable naming the metadata service's address, or every address of its
/// group as `a,b,c` (`transport/leader.rs`).
pub const META_ENV: &str = "FLOTILLA_META";
/// The environment variable naming the client's credential file.
pub const KEY_ENV: &str = "FLOTILLA_KEY";
/// Where a library client serves its metrics, if set (`ClientConfig::metrics_listen`).
pub const METRICS_LISTEN_ENV: &str = "FLOTILLA_METRICS_LISTEN";
/// Names the environment variables a client takes its job id from (comma-separated).
pub const JOB_ENV_ENV: &str = "FLOTILLA_JOB_ENV";
/// The variables tried when `FLOTILLA_JOB_ENV` is not set, in order.
pub const JOB_ENV_DEFAULT: &str = "SLURM_JOB_ID,FLOTILLA_JOB";
