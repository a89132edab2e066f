//! Which metadata address to call (issue 33): callers take every address of the metadata
//! group (`FLOTILLA_META=a,b,c`, `--meta a,b,c`, the source of an fstab line), connect to
//! the first that answers, and move on when a node cannot be reached, its connection broke,
//! or it says it is not the leader (`NotServed::NotLeader`, whose hint is tried first) or
//! has no quorum (`NotServed::NoQuorum`).
//!
//! Rules: addresses are tried round robin from the one in use; a hinted leader in the list
//! becomes the one in use, one outside it (a node added since the list was written) is
//! tried before the list and kept while it serves. Moving on is immediate until every
//! address failed once since the last success or pause (a round), then the caller pauses
//! with the outage backoff (`OutageWait`, doubling up to `backoff_ms_max`), and gives up
//! only when the outage wait (`outage_wait_ms`) is over. A hint counts as an attempt of the
//! round, so two nodes naming each other cannot keep a caller busy without pauses.
//!
//! The logic here has no sockets: `Transport::meta_call` and the I/O server's heartbeat
//! loop (flotilla-server `membership.rs`) drive it.

use super::outage::{Failure, OutageWait};
pub use crate::error::MetaAddressError;
use std::time::{Duration, Instant};

/// Most addresses a metadata address list may hold (a group has 1, 3 or 5 nodes).
pub const META_ADDRESSES_MAX: usize = 16;

/// The addresses of a list `a,b,c` (spaces around each trimmed, a repeated one dropped).
pub fn parse_meta_addresses(list: &str) -> Result<Vec<String>, MetaAddressError> {
    if list.trim().is_empty() {
        return Err(MetaAddressError::Empty);
    }
    let mut addresses: Vec<String> = Vec::new();
    for (index, entry) in list.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            return Err(MetaAddressError::EmptyEntry { list: list.to_string(), position: index + 1 });
        }
        let max = flotilla_proto::LEADER_ADDRESS_BYTES_MAX;
        if entry.len() > max {
            return Err(MetaAddressError::TooLong { address: entry.to_string(), max });
        }
        if !addresses.iter().any(|known| known == entry) {
            addresses.push(entry.to_string());
        }
    }
    if addresses.len() > META_ADDRESSES_MAX {
        return Err(MetaAddressError::TooMany { count: addresses.len(), max: META_ADDRESSES_MAX });
    }
    Ok(addresses)
}

/// What a caller does after a failure at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Try the next target at once.
    Now,
    /// Every address failed in this round: pause (the outage backoff), then try the next.
    Pause,
}

/// The address list and the node in use: shared by every call of one caller.
#[derive(Clone, Debug)]
pub struct LeaderChase {
    addresses: Vec<String>,
    /// The listed address in use, or tried next.
    next: usize,
    /// A leader named by a refusal that is not in the list: tried, and kept while it
    /// serves, before `next`.
    hint: Option<String>,
    /// Failures since the last success or pause.
    failed_in_round: usize,
}

impl LeaderChase {
    /// A chase over `addresses` (from [`parse_meta_addresses`]), starting at the first.
    pub fn new(addresses: Vec<String>) -> Result<LeaderChase, MetaAddressError> {
        if addresses.is_empty() {
            return Err(MetaAddressError::Empty);
        }
        Ok(LeaderChase { addresses, next: 0, hint: None, failed_in_round: 0 })
    }

    /// A chase over the list `a,b,c`.
    pub fn parse(list: &str) -> Result<LeaderChase, MetaAddressError> {
        LeaderChase::new(parse_meta_addresses(list)?)
    }

    /// The address to call now.
    pub fn target(&self) -> &str {
        self.hint.as_deref().unwrap_or(&self.addresses[self.next])
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// A call at `at` was answered: the round starts over.
    pub fn served(&mut self, at: &str) {
        if at == self.target() {
            self.failed_in_round = 0;
        }
    }

    /// A call at `at` failed (unreachable, broken, not the leader, no quorum); `leader` is the
    /// leader a `NotLeader` reply named. Moves to the next target and says whether to pause
    /// first. A failure at an address no longer in use (another call moved on) moves nothing.
    pub fn failed(&mut self, at: &str, leader: Option<&str>) -> Move {
        if at != self.target() {
            return Move::Now;
        }
        self.failed_in_round += 1;
        if self.hint.take().is_none() {
            self.next = (self.next + 1) % self.addresses.len();
        }
        if let Some(leader) = leader.filter(|leader| *leader != at && !leader.is_empty()) {
            match self.addresses.iter().position(|known| known == leader) {
                Some(index) => self.next = index,
                None => self.hint = Some(leader.to_string()),
            }
        }
        if self.failed_in_round >= self.addresses.len() {
            self.failed_in_round = 0;
            return Move::Pause;
        }
        Move::Now
    }
}

/// Longest pause after a round of a group's addresses during the first
/// [`ELECTION_CHASE_MS`] of an outage: a group elects a new leader within a few election
/// timeouts (500–1000 ms each), and a pause of the full outage backoff (up to 1 s) after the
/// election would add up to that much to a failover.
pub const ELECTION_PAUSE_MS_MAX: u64 = 200;
/// How long into an outage of a group (more than one address) pauses stay short.
pub const ELECTION_CHASE_MS: u64 = 6_000;

/// After a call at `at` failed with `failure` (not `Final`) at `now`: moves `chase` on and
/// returns the pause before the next attempt (zero: at once), or `None` when `wait` is over.
pub(crate) fn next_step(
    chase: &mut LeaderChase,
    wait: &mut OutageWait,
    at: &str,
    leader: Option<&str>,
    failure: Failure,
    now: Instant,
) -> Option<Duration> {
    match chase.failed(at, leader) {
        Move::Now => wait.note(failure, now).then_some(Duration::ZERO),
        Move::Pause => {
            let pause = wait.after_failure(failure, now)?;
            let electing = chase.addresses.len() > 1 && wait.waited_ms(now) < ELECTION_CHASE_MS;
            Some(if electing { pause.min(Duration::from_millis(ELECTION_PAUSE_MS_MAX)) } else { pause })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::outage::OutageSettings;
    use proptest::prelude::*;

    fn chase(list: &str) -> LeaderChase {
        LeaderChase::parse(list).unwrap()
    }

    #[test]
    fn lists_parse_trimmed_deduplicated_and_bounded() {
        assert_eq!(parse_meta_addresses("a:1").unwrap(), ["a:1"]);
        assert_eq!(parse_meta_addresses(" a:1 , b:2,a:1").unwrap(), ["a:1", "b:2"]);
        assert_eq!(parse_meta_addresses(" "), Err(MetaAddressError::Empty));
        assert_eq!(
            parse_meta_addresses("a:1,,b:2"),
            Err(MetaAddressError::EmptyEntry { list: "a:1,,b:2".into(), position: 2 })
        );
        let many: Vec<String> = (0..=META_ADDRESSES_MAX).map(|i| format!("h{i}:1")).collect();
        assert!(matches!(parse_meta_addresses(&many.join(",")), Err(MetaAddressError::TooMany { .. })));
        assert!(matches!(parse_meta_addresses(&"h".repeat(300)), Err(MetaAddressError::TooLong { .. })));
        assert!(LeaderChase::new(Vec::new()).is_err());
    }

    #[test]
    fn failures_go_round_robin_and_pause_after_a_round() {
        let mut chase = chase("a,b,c");
        assert_eq!(chase.target(), "a");
        assert_eq!(chase.failed("a", None), Move::Now);
        assert_eq!(chase.target(), "b");
        assert_eq!(chase.failed("b", None), Move::Now);
        assert_eq!(chase.failed("c", None), Move::Pause, "every address failed once");
        assert_eq!(chase.target(), "a", "round robin wraps");
        chase.served("a");
        assert_eq!(chase.target(), "a", "the serving node stays in use");
    }

    #[test]
    fn a_group_chase_pauses_briefly_while_a_new_leader_is_elected_then_backs_off() {
        let settings = OutageSettings { wait_ms: 60_000, backoff_ms_min: 50, backoff_ms_max: 1_000 };
        let (mut group, mut wait) = (chase("a:1,b:2,c:3"), OutageWait::new(settings));
        let start = Instant::now();
        let (mut now, mut pauses) = (start, Vec::new());
        while now < start + Duration::from_millis(ELECTION_CHASE_MS + 5_000) {
            let at = group.target().to_string();
            let pause = next_step(&mut group, &mut wait, &at, None, Failure::NotSent, now).unwrap();
            if pause > Duration::ZERO {
                pauses.push((now.duration_since(start).as_millis() as u64, pause.as_millis() as u64));
            }
            now += pause + Duration::from_millis(1);
        }
        let early: Vec<u64> =
            pauses.iter().filter(|(at, _)| *at < ELECTION_CHASE_MS).map(|(_, pause)| *pause).collect();
        assert!(early.iter().all(|pause| *pause <= ELECTION_PAUSE_MS_MAX), "{pauses:?}");
        assert_eq!(&early[..3], [50, 100, 200], "{pauses:?}");
        let late: Vec<u64> =
            pauses.iter().filter(|(at, _)| *at >= ELECTION_CHASE_MS).map(|(_, pause)| *pause).collect();
        assert!(late.contains(&1_000), "the full backoff after the election window: {pauses:?}");
        // One address (no group) keeps the full backoff from the start.
        let (mut one, mut wait) = (chase("a:1"), OutageWait::new(settings));
        let pauses: Vec<u64> = (0..6)
            .map(|_| {
                next_step(&mut one, &mut wait, "a:1", None, Failure::NotSent, start).unwrap().as_millis()
                    as u64
            })
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1_000]);
    }

    #[test]
    fn a_single_address_pauses_after_every_failure_as_before() {
        let mut chase = chase("only:1");
        for _ in 0..3 {
            assert_eq!(chase.failed("only:1", None), Move::Pause);
            assert_eq!(chase.target(), "only:1");
        }
    }

    #[test]
    fn a_leader_hint_is_followed_first() {
        let mut chase = chase("a,b,c");
        assert_eq!(chase.failed("a", Some("c")), Move::Now);
        assert_eq!(chase.target(), "c", "the hinted leader in the list, skipping b");
        chase.served("c");
        let mut chase = self::chase("a,b,c");
        assert_eq!(chase.failed("a", Some("d")), Move::Now);
        assert_eq!(chase.target(), "d", "a leader outside the list (a node added since)");
        chase.served("d");
        assert_eq!(chase.target(), "d", "kept while it serves");
        assert_eq!(chase.failed("d", None), Move::Now);
        assert_eq!(chase.target(), "b", "then the list from where it was");
        assert_eq!(chase.failed("b", Some("b")), Move::Now, "a node naming itself is no hint");
        assert_eq!(chase.target(), "c");
    }

    #[test]
    fn two_nodes_naming_each_other_cannot_avoid_the_pause() {
        let mut chase = chase("a,b,c");
        let mut moves = Vec::new();
        for _ in 0..6 {
            let at = chase.target().to_string();
            let other = if at == "a" { "b" } else { "a" };
            moves.push(chase.failed(&at, Some(other)));
        }
        assert_eq!(moves.iter().filter(|m| **m == Move::Pause).count(), 2, "{moves:?}");
    }

    #[test]
    fn a_stale_failure_moves_nothing() {
        let mut chase = chase("a,b");
        assert_eq!(chase.failed("a", None), Move::Now);
        assert_eq!(chase.failed("a", None), Move::Now, "another call already moved past a");
        assert_eq!(chase.target(), "b");
    }

    fn settings(wait_ms: u64) -> OutageSettings {
        OutageSettings { wait_ms, backoff_ms_min: 50, backoff_ms_max: 400 }
    }

    #[test]
    fn pauses_are_bounded_and_the_caller_gives_up_after_the_outage_wait() {
        let mut chase = chase("a,b");
        let mut wait = OutageWait::new(settings(2_000));
        let start = Instant::now();
        let (mut now, mut pauses) = (start, Vec::new());
        let gave_up = loop {
            let at = chase.target().to_string();
            match next_step(&mut chase, &mut wait, &at, None, Failure::NotSent, now) {
                Some(pause) => {
                    pauses.push(pause.as_millis() as u64);
                    now += pause + Duration::from_millis(1);
                }
                None => break now,
            }
        };
        // A group's pauses stay at most ELECTION_PAUSE_MS_MAX early in an outage.
        assert_eq!(&pauses[..8], [0, 50, 0, 100, 0, 200, 0, 200], "at once to the next, pause after a round");
        assert!(pauses.iter().all(|pause| *pause <= 400), "{pauses:?}");
        let waited = gave_up.duration_since(start).as_millis() as u64;
        assert!((2_000..2_100).contains(&waited), "gave up after {waited} ms");
        assert!(!wait.maybe_applied);
    }

    #[test]
    fn an_immediate_move_after_the_wait_is_over_gives_up() {
        let mut chase = chase("a,b");
        let mut wait = OutageWait::new(settings(100));
        let start = Instant::now();
        assert_eq!(
            next_step(&mut chase, &mut wait, "a", None, Failure::MaybeApplied, start),
            Some(Duration::ZERO)
        );
        assert!(wait.maybe_applied, "a broken connection may have applied the request");
        let late = start + Duration::from_millis(100);
        assert_eq!(next_step(&mut chase, &mut wait, "b", None, Failure::NotSent, late), None);
    }

    proptest! {
        /// Whatever the failures and hints, the target is a listed address or the last hint,
        /// and no more than one round of failures passes without a pause.
        #[test]
        fn the_target_stays_known_and_pauses_come_every_round(
            size in 1usize..6,
            events in proptest::collection::vec((0usize..8, any::<bool>()), 1..60),
        ) {
            let addresses: Vec<String> = (0..size).map(|i| format!("n{i}")).collect();
            let mut chase = LeaderChase::new(addresses.clone()).unwrap();
            let mut since_pause = 0;
            for (hint, served) in events {
                let at = chase.target().to_string();
                if served {
                    chase.served(&at);
                    since_pause = 0;
                    continue;
                }
                let hint = format!("n{hint}");
                match chase.failed(&at, Some(&hint)) {
                    Move::Pause => since_pause = 0,
                    Move::Now => since_pause += 1,
                }
                prop_assert!(since_pause < size, "{since_pause} failures without a pause");
                let target = chase.target().to_string();
                prop_assert!(addresses.contains(&target) || target == hint, "{target}");
            }
        }
    }
}
