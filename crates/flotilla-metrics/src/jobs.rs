//! Per-job statistics (as Lustre's jobstats): a bounded table from job id to counters.
//!
//! A connection looks its job's counters up once, when the client names its job, and then
//! counts with relaxed atomics. The table holds at most `jobs_max` jobs; when it is full,
//! jobs no connection uses any more are folded into [`OTHER_JOBS`] to make room, and a new
//! job that still finds no room is counted as [`OTHER_JOBS`] itself. Reports list the
//! busiest jobs and aggregate the rest, so the label set of the metrics stays bounded.

use flotilla_proto::JobStats;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The job name under which jobs that were not kept or not listed are aggregated.
pub const OTHER_JOBS: &str = "other";

/// What one job (or one server) moved and how long its requests took.
#[derive(Debug, Default)]
pub struct JobCounters {
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_ops: AtomicU64,
    write_ops: AtomicU64,
    other_ops: AtomicU64,
    latency_ns: AtomicU64,
}

/// Which counter an operation goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Other,
}

impl JobCounters {
    /// Counts one finished operation that moved `bytes` and took `elapsed`.
    pub fn add(&self, kind: OpKind, bytes: u64, elapsed: Duration) {
        let (ops, moved) = match kind {
            OpKind::Read => (&self.read_ops, Some(&self.read_bytes)),
            OpKind::Write => (&self.write_ops, Some(&self.write_bytes)),
            OpKind::Other => (&self.other_ops, None),
        };
        ops.fetch_add(1, Ordering::Relaxed);
        if let Some(moved) = moved {
            moved.fetch_add(bytes, Ordering::Relaxed);
        }
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A snapshot named `job`.
    pub fn snapshot(&self, job: &str) -> JobStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        JobStats {
            job: job.to_string(),
            read_bytes: get(&self.read_bytes),
            write_bytes: get(&self.write_bytes),
            read_ops: get(&self.read_ops),
            write_ops: get(&self.write_ops),
            other_ops: get(&self.other_ops),
            latency_ns: get(&self.latency_ns),
        }
    }

    /// Adds a snapshot's counts (a job folded into `other`).
    fn absorb(&self, stats: &JobStats) {
        let add = |counter: &AtomicU64, value: u64| counter.fetch_add(value, Ordering::Relaxed);
        add(&self.read_bytes, stats.read_bytes);
        add(&self.write_bytes, stats.write_bytes);
        add(&self.read_ops, stats.read_ops);
        add(&self.write_ops, stats.write_ops);
        add(&self.other_ops, stats.other_ops);
        add(&self.latency_ns, stats.latency_ns);
    }
}

/// Job id to counters, at most `jobs_max` entries besides `other`.
#[derive(Debug)]
pub struct JobTable {
    jobs: Mutex<HashMap<String, Arc<JobCounters>>>,
    other: Arc<JobCounters>,
    jobs_max: usize,
}

impl JobTable {
    pub fn new(jobs_max: usize) -> JobTable {
        JobTable { jobs: Mutex::new(HashMap::new()), other: Arc::default(), jobs_max }
    }

    /// The counters of `job` (looked up once per connection; the caller keeps the `Arc`).
    pub fn counters(&self, job: &str) -> Arc<JobCounters> {
        let mut jobs = self.jobs.lock();
        if let Some(counters) = jobs.get(job) {
            return counters.clone();
        }
        if jobs.len() >= self.jobs_max {
            self.fold_idle(&mut jobs);
        }
        if jobs.len() >= self.jobs_max || job == OTHER_JOBS {
            return self.other.clone();
        }
        let counters = Arc::new(JobCounters::default());
        jobs.insert(job.to_string(), counters.clone());
        counters
    }

    /// Folds every job no connection holds any more into `other`.
    fn fold_idle(&self, jobs: &mut HashMap<String, Arc<JobCounters>>) {
        jobs.retain(|job, counters| {
            let idle = Arc::strong_count(counters) == 1;
            if idle {
                self.other.absorb(&counters.snapshot(job));
            }
            !idle
        });
    }

    /// The `listed_max` busiest jobs (by bytes moved, then operations), then [`OTHER_JOBS`]
    /// with the rest, if it counted anything.
    pub fn top(&self, listed_max: usize) -> Vec<JobStats> {
        // Both under the lock, so a job folded into `other` meanwhile is not counted twice.
        let jobs = self.jobs.lock();
        let mut all: Vec<JobStats> = jobs.iter().map(|(job, counters)| counters.snapshot(job)).collect();
        let other = self.other.snapshot(OTHER_JOBS);
        drop(jobs);
        rank(&mut all, listed_max, other)
    }
}

/// Sorts `all` busiest first, keeps `listed_max`, and appends `other` plus the rest.
fn rank(all: &mut Vec<JobStats>, listed_max: usize, mut other: JobStats) -> Vec<JobStats> {
    all.sort_by(|a, b| busyness(b).cmp(&busyness(a)).then_with(|| a.job.cmp(&b.job)));
    let rest = all.split_off(listed_max.min(all.len()));
    for job in &rest {
        other = add(other, job);
    }
    if busyness(&other) > (0, 0) {
        all.push(other);
    }
    std::mem::take(all)
}

fn busyness(stats: &JobStats) -> (u64, u64) {
    (
        stats.read_bytes.saturating_add(stats.write_bytes),
        stats.read_ops.saturating_add(stats.write_ops).saturating_add(stats.other_ops),
    )
}

fn add(mut sum: JobStats, job: &JobStats) -> JobStats {
    sum.read_bytes = sum.read_bytes.saturating_add(job.read_bytes);
    sum.write_bytes = sum.write_bytes.saturating_add(job.write_bytes);
    sum.read_ops = sum.read_ops.saturating_add(job.read_ops);
    sum.write_ops = sum.write_ops.saturating_add(job.write_ops);
    sum.other_ops = sum.other_ops.saturating_add(job.other_ops);
    sum.latency_ns = sum.latency_ns.saturating_add(job.latency_ns);
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn total(stats: &[JobStats]) -> (u64, u64) {
        stats.iter().fold((0, 0), |(b, o), s| {
            let (sb, so) = busyness(s);
            (b + sb, o + so)
        })
    }

    #[test]
    fn a_full_table_folds_idle_jobs_into_other() {
        let table = JobTable::new(2);
        let held = table.counters("a");
        held.add(OpKind::Write, 10, Duration::ZERO);
        table.counters("b").add(OpKind::Read, 5, Duration::ZERO);
        // "b" is idle (nobody holds it): "c" takes its place, "b" is counted as other.
        table.counters("c").add(OpKind::Read, 1, Duration::ZERO);
        let top = table.top(10);
        let names: Vec<&str> = top.iter().map(|s| s.job.as_str()).collect();
        assert_eq!(names, ["a", "c", OTHER_JOBS]);
        assert_eq!(top[2].read_bytes, 5);
    }

    #[test]
    fn a_full_table_of_busy_jobs_counts_newcomers_as_other() {
        let table = JobTable::new(1);
        let _a = table.counters("a");
        let b = table.counters("b");
        b.add(OpKind::Write, 7, Duration::ZERO);
        let top = table.top(10);
        assert_eq!(top.last().map(|s| (s.job.as_str(), s.write_bytes)), Some((OTHER_JOBS, 7)));
    }

    proptest! {
        #[test]
        fn nothing_is_lost_and_the_table_stays_bounded(
            ops in proptest::collection::vec((0u8..12, 0u64..1000, proptest::bool::ANY), 0..200),
            jobs_max in 1usize..5,
            listed_max in 0usize..4,
        ) {
            let table = JobTable::new(jobs_max);
            let mut held = Vec::new();
            let mut expected = (0, 0);
            for (job, bytes, keep) in ops {
                let counters = table.counters(&format!("job-{job}"));
                counters.add(OpKind::Write, bytes, Duration::ZERO);
                expected = (expected.0 + bytes, expected.1 + 1);
                if keep { held.push(counters); }
                prop_assert!(table.jobs.lock().len() <= jobs_max);
            }
            let top = table.top(listed_max);
            prop_assert!(top.len() <= listed_max + 1);
            prop_assert_eq!(total(&top), expected);
        }
    }
}
