//! GFS-GROUP's submission decisions, without I/O: when pending requests are submitted, and
//! which requests a group refuses. [`crate::Group`] asks a [`Planner`] at every call and does
//! what it says; the planner only counts.

/// When a group submits pending requests besides thresholds, fork changes, `doneio` and `waitio`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GroupMode {
    /// The paper's *group-nosend*: submit only on a threshold, a fork change, `doneio`,
    /// `waitio` (and `testio` when nothing is outstanding).
    #[default]
    NoSend,
    /// The paper's *group-send*: also submit at every call made while nothing submitted is
    /// still outstanding, to keep the servers busy.
    Send,
}

/// Whether a group reads or writes (a group does one until `doneio`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::Read => "read",
            Direction::Write => "write",
        })
    }
}

/// A group's settings, changeable between calls (`Group::set_config`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    pub mode: GroupMode,
    /// Pending requests that trigger a submission (paper: 1024).
    pub pending_requests_max: usize,
    /// Pending bytes that trigger a submission (paper: 16 MB).
    pub pending_bytes_max: u64,
    /// Most bytes of submitted, unfinished lists; a submission past it first waits for the
    /// oldest lists to finish.
    pub submitted_bytes_max: u64,
    /// `false` (the paper): a request to a fork other than the last submits what is pending.
    /// `true`: requests to several forks and files stay pending together until a threshold,
    /// and are then sent at once, one list per fork, all lists to one server pipelined on
    /// its connection.
    pub batch_across_forks: bool,
}

impl Default for GroupConfig {
    fn default() -> GroupConfig {
        GroupConfig {
            mode: GroupMode::NoSend,
            pending_requests_max: 1024,
            pending_bytes_max: 16 << 20,
            submitted_bytes_max: 256 << 20,
            batch_across_forks: false,
        }
    }
}

/// The planner refused a request: the group is going the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mixed {
    pub current: Direction,
}

/// What the group must do around one admitted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Admission {
    /// Submit what is pending before adding the request (a fork change).
    pub submit_before: bool,
    /// Submit everything, the request included, after adding it.
    pub submit_after: bool,
}

/// Counts of pending requests, the last target and the group's direction.
#[derive(Clone, Debug, Default)]
pub struct Planner {
    pending_requests: usize,
    pending_bytes: u64,
    last_target: Option<usize>,
    direction: Option<Direction>,
}

impl Planner {
    /// Decides about one request of `size_bytes` to `target` (any stable id of a fork or
    /// file); `outstanding` says whether submitted requests are still unfinished. On success
    /// the request counts as pending (after the submission before it, if any).
    pub fn admit(
        &mut self,
        config: &GroupConfig,
        target: usize,
        direction: Direction,
        size_bytes: u64,
        outstanding: bool,
    ) -> Result<Admission, Mixed> {
        match self.direction {
            Some(current) if current != direction => return Err(Mixed { current }),
            _ => self.direction = Some(direction),
        }
        let changed = self.last_target.is_some_and(|last| last != target);
        let submit_before = changed && !config.batch_across_forks && self.pending_requests > 0;
        if submit_before {
            self.submitted();
        }
        self.last_target = Some(target);
        self.pending_requests += 1;
        self.pending_bytes = self.pending_bytes.saturating_add(size_bytes);
        let threshold = self.pending_requests >= config.pending_requests_max.max(1)
            || self.pending_bytes >= config.pending_bytes_max.max(1);
        // In send mode a fork change's submission makes something outstanding: the new
        // request waits for it like any other.
        let idle = !outstanding && !submit_before;
        let submit_after = threshold || (config.mode == GroupMode::Send && idle);
        if submit_after {
            self.submitted();
        }
        Ok(Admission { submit_before, submit_after })
    }

    /// Everything pending was submitted.
    pub fn submitted(&mut self) {
        self.pending_requests = 0;
        self.pending_bytes = 0;
    }

    /// `doneio`: pending requests are submitted and the next request may go either way.
    pub fn done(&mut self) {
        self.submitted();
        self.direction = None;
        self.last_target = None;
    }

    /// `testio` submits pending requests only when nothing submitted is outstanding.
    pub fn testio_submits(&mut self, outstanding: bool) -> bool {
        let submit = self.pending_requests > 0 && !outstanding;
        if submit {
            self.submitted();
        }
        submit
    }

    pub fn pending_requests(&self) -> usize {
        self.pending_requests
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn direction(&self) -> Option<Direction> {
        self.direction
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(requests: usize, bytes: u64) -> GroupConfig {
        GroupConfig { pending_requests_max: requests, pending_bytes_max: bytes, ..GroupConfig::default() }
    }

    #[test]
    fn count_threshold_submits_the_request_that_reaches_it() {
        let config = config(4, 1 << 30);
        let mut planner = Planner::default();
        for i in 1..=12 {
            let admission = planner.admit(&config, 0, Direction::Write, 16, true).unwrap();
            assert!(!admission.submit_before);
            assert_eq!(admission.submit_after, i % 4 == 0, "request {i}");
        }
        assert_eq!(planner.pending_requests(), 0);
    }

    #[test]
    fn byte_threshold_submits_the_request_that_reaches_it() {
        let config = config(1024, 100);
        let mut planner = Planner::default();
        let sizes = [40, 40, 19, 1, 150, 99, 2];
        let expected = [false, false, false, true, true, false, true];
        for (size, want) in sizes.into_iter().zip(expected) {
            let admission = planner.admit(&config, 0, Direction::Read, size, true).unwrap();
            assert_eq!(admission.submit_after, want, "size {size}");
        }
    }

    #[test]
    fn defaults_are_the_papers() {
        let config = GroupConfig::default();
        assert_eq!(config.pending_requests_max, 1024);
        assert_eq!(config.pending_bytes_max, 16 << 20);
        assert_eq!(config.mode, GroupMode::NoSend);
        let mut planner = Planner::default();
        let submits: Vec<usize> = (0..3000)
            .filter(|_| planner.admit(&config, 0, Direction::Write, 16, true).unwrap().submit_after)
            .collect();
        assert_eq!(submits, vec![1023, 2047], "the 1024th and 2048th requests submit");
    }

    #[test]
    fn a_fork_change_submits_what_is_pending_first() {
        let config = GroupConfig::default();
        let mut planner = Planner::default();
        assert_eq!(planner.admit(&config, 7, Direction::Write, 8, false).unwrap(), Admission::default());
        assert_eq!(planner.admit(&config, 7, Direction::Write, 8, true).unwrap(), Admission::default());
        let change = planner.admit(&config, 9, Direction::Write, 8, true).unwrap();
        assert!(change.submit_before && !change.submit_after);
        assert_eq!(planner.pending_requests(), 1, "only the new request is pending");
    }

    #[test]
    fn batching_across_forks_keeps_them_pending() {
        let config = GroupConfig { batch_across_forks: true, ..config(3, 1 << 30) };
        let mut planner = Planner::default();
        assert!(!planner.admit(&config, 1, Direction::Read, 8, false).unwrap().submit_before);
        assert!(!planner.admit(&config, 2, Direction::Read, 8, false).unwrap().submit_before);
        let third = planner.admit(&config, 3, Direction::Read, 8, false).unwrap();
        assert_eq!(third, Admission { submit_before: false, submit_after: true });
    }

    #[test]
    fn mixing_reads_and_writes_is_refused_until_done() {
        let config = GroupConfig::default();
        let mut planner = Planner::default();
        planner.admit(&config, 0, Direction::Write, 8, false).unwrap();
        assert_eq!(
            planner.admit(&config, 0, Direction::Read, 8, false),
            Err(Mixed { current: Direction::Write })
        );
        assert_eq!(planner.pending_requests(), 1, "a refused request is not counted");
        planner.done();
        assert!(planner.admit(&config, 0, Direction::Read, 8, false).is_ok());
    }

    #[test]
    fn send_mode_submits_only_while_nothing_is_outstanding() {
        let config = GroupConfig { mode: GroupMode::Send, ..GroupConfig::default() };
        let mut planner = Planner::default();
        assert!(planner.admit(&config, 0, Direction::Write, 8, false).unwrap().submit_after);
        assert!(!planner.admit(&config, 0, Direction::Write, 8, true).unwrap().submit_after);
        assert!(planner.admit(&config, 0, Direction::Write, 8, false).unwrap().submit_after);
        assert!(!planner.admit(&config, 0, Direction::Write, 8, true).unwrap().submit_after);
        let change = planner.admit(&config, 1, Direction::Write, 8, false).unwrap();
        assert_eq!(change, Admission { submit_before: true, submit_after: false });
    }

    #[test]
    fn testio_submits_only_when_nothing_is_outstanding() {
        let config = GroupConfig::default();
        let mut planner = Planner::default();
        assert!(!planner.testio_submits(false), "nothing pending: nothing to submit");
        planner.admit(&config, 0, Direction::Write, 8, true).unwrap();
        assert!(!planner.testio_submits(true));
        assert_eq!(planner.pending_requests(), 1);
        assert!(planner.testio_submits(false));
        assert_eq!(planner.pending_requests(), 0);
    }

    /// A plain restatement of §3.1, one request at a time, for the property test.
    fn reference(config: &GroupConfig, calls: &[(usize, u64, bool)]) -> Vec<Admission> {
        let (mut count, mut bytes, mut last): (usize, u64, Option<usize>) = (0, 0, None);
        let mut out = Vec::new();
        for &(target, size, outstanding) in calls {
            let before = !config.batch_across_forks && count > 0 && last.is_some_and(|l| l != target);
            if before {
                (count, bytes) = (0, 0);
            }
            last = Some(target);
            count += 1;
            bytes += size;
            let send = config.mode == GroupMode::Send && !outstanding && !before;
            let after = count >= config.pending_requests_max || bytes >= config.pending_bytes_max || send;
            if after {
                (count, bytes) = (0, 0);
            }
            out.push(Admission { submit_before: before, submit_after: after });
        }
        out
    }

    proptest! {
        #[test]
        fn planner_matches_the_reference(
            requests_max in 1usize..20,
            bytes_max in 1u64..5000,
            send in any::<bool>(),
            batch in any::<bool>(),
            calls in proptest::collection::vec((0usize..4, 0u64..1000, any::<bool>()), 0..200),
        ) {
            let mode = if send { GroupMode::Send } else { GroupMode::NoSend };
            let config = GroupConfig {
                mode,
                pending_requests_max: requests_max,
                pending_bytes_max: bytes_max,
                batch_across_forks: batch,
                ..GroupConfig::default()
            };
            let mut planner = Planner::default();
            let got: Vec<Admission> = calls
                .iter()
                .map(|&(t, s, o)| planner.admit(&config, t, Direction::Write, s, o).unwrap())
                .collect();
            prop_assert_eq!(got, reference(&config, &calls));
        }
    }
}
