//! ENWRICH job groups: named sets of client processes that flush their write caches
//! together. The table is pure (time is passed in); `Jobs` adds the lock and the condition
//! variable long-polls wait on.
//!
//! A job has a fixed size; members join in any order and get indexes `0..size`. Flushes are
//! numbered by generation (`epoch`): any member asks for generation `e` (`JobFlush`), every
//! member learns it from its next `JobWait` and takes part. A member leaves at a generation
//! (`JobLeave` after its last flush): it takes part in no flush from that generation on, and
//! may not leave once a flush of that generation was asked (it must take part first), so
//! the set of members of a generation is fixed when its flush is asked. A job whose members
//! all left, or were not heard from for a lease, is forgotten.
//!
//! The table lives in the service's memory and is **reclaimed** after a failover or a
//! restart (issue 33; docs/architecture-log.md "Metadata group", *A new term*): the new leader
//! starts with no job and a grace period ([`JobTable::begin_grace`]); a member whose request
//! names a job (or a member) the table does not know is answered `NotFound` and presents
//! what it knows (`JobReclaim`: its index, its next generation, the highest generations it
//! asked for or learned were asked, the clock, the members it learned left); the table
//! merges every member's account (maxima and unions, so the order of reclaims does not
//! matter). Joins wait for the grace period to end, so no index a member of the previous
//! term holds is handed to a newcomer; after it, a reclaim of an index a newcomer took is
//! refused. Why this is safe: a generation's flush is keyed by (job, generation) at the
//! servers and each member takes part in each generation once (its own next generation
//! only grows), so nothing is flushed twice; a flush any member asked or took part in is
//! known again as soon as that member reclaims, so no member waits for a flush the table
//! forgot, and a member's logged bytes stay in its cache until it took part.

use flotilla_proto::{ErrorCode, JobEvent, WireError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Bounds of the job table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JobBounds {
    pub jobs_max: usize,
    pub members_max: u32,
    pub wait_ms_max: u64,
    pub lease: Duration,
    pub name_bytes_max: usize,
}

struct Job {
    size: u32,
    joined: u32,
    flush_asked: Option<u64>,
    durable_asked: Option<u64>,
    /// Member index -> the generation from which it takes no part.
    left: BTreeMap<u32, u64>,
    /// Last time each joined member was heard from.
    seen: Vec<Instant>,
    clock: u64,
    /// Members known in this service's term: joined here, or reclaimed. Any other member's
    /// request is answered `NotFound`, so it reclaims (and its account is merged) first.
    present: BTreeSet<u32>,
    /// Indexes handed out by a join in this term (a reclaim of one of them is refused).
    fresh: BTreeSet<u32>,
}

impl Job {
    fn new(size: u32) -> Job {
        Job {
            size,
            joined: 0,
            flush_asked: None,
            durable_asked: None,
            left: BTreeMap::new(),
            seen: Vec::new(),
            clock: 0,
            present: BTreeSet::new(),
            fresh: BTreeSet::new(),
        }
    }

    fn event(&self) -> JobEvent {
        JobEvent {
            flush_asked: self.flush_asked,
            durable_asked: self.durable_asked,
            clock: self.clock,
            left: self.left.iter().map(|(m, e)| (*m, *e)).collect(),
        }
    }

    fn finished(&self, now: Instant, lease: Duration) -> bool {
        let members = (0..self.joined).filter(|m| !self.left.contains_key(m));
        self.joined > 0 && members.clone().all(|m| now.duration_since(self.seen[m as usize]) > lease)
    }
}

/// Every job group, by name.
pub(crate) struct JobTable {
    jobs: HashMap<String, Job>,
    bounds: JobBounds,
    /// Until then (a new term or a restart), members reclaim and joins wait.
    grace_until: Option<Instant>,
}

/// What a member presents in a reclaim (`JobReclaim`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reclaim {
    pub size: u32,
    pub member: u32,
    /// The member's next generation (it took part in every one before it).
    pub epoch: u64,
    /// The highest generations it asked for or learned were asked, its clock, the members
    /// it learned left.
    pub known: JobEvent,
}

fn unknown(name: &str) -> WireError {
    WireError::new(
        ErrorCode::NotFound,
        format!("no job group named {name:?} here (a new metadata leader or a restart): reclaim it"),
    )
}

fn refused(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

impl JobTable {
    pub fn new(bounds: JobBounds) -> JobTable {
        JobTable { jobs: HashMap::new(), bounds, grace_until: None }
    }

    /// A new term (or a restart): every job is forgotten (a deposed leader's table is stale)
    /// and members reclaim until `until`; joins wait for it.
    pub fn begin_grace(&mut self, until: Instant) {
        self.jobs.clear();
        self.grace_until = Some(until);
    }

    /// When the grace period ends, if it has not.
    pub fn grace_left(&self, now: Instant) -> Option<Duration> {
        self.grace_until.filter(|until| *until > now).map(|until| until - now)
    }

    /// Member `reclaim.member` of `name` presents its account of the job: merged into the
    /// job (created if absent). The member's index, its next generation and the job's state.
    pub fn reclaim(
        &mut self,
        name: &str,
        reclaim: &Reclaim,
        now: Instant,
    ) -> Result<(u32, u64, JobEvent), WireError> {
        let bounds = self.bounds;
        let Reclaim { size, member, epoch, known } = reclaim;
        let (size, member, epoch) = (*size, *member, *epoch);
        if name.is_empty() || name.len() > bounds.name_bytes_max {
            return Err(refused(format!("job name must be 1..={} bytes", bounds.name_bytes_max)));
        }
        if size == 0 || size > bounds.members_max || member >= size {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "reclaim of member {member} of job {name:?} of size {size}: outside 1..={} members",
                    bounds.members_max
                ),
            ));
        }
        if known.left.len() > size as usize || known.left.iter().any(|(m, _)| *m >= size) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "reclaim of job {name:?}: its list of members that left names members outside 0..{size}"
                ),
            ));
        }
        if !self.jobs.contains_key(name) && self.jobs.len() >= bounds.jobs_max {
            let message =
                format!("{} jobs exist, the limit jobs_max; job {name:?} not reclaimed", self.jobs.len());
            return Err(WireError::new(ErrorCode::OverLimit, message));
        }
        let job = self.jobs.entry(name.to_string()).or_insert_with(|| Job::new(size));
        if job.size != size {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("job {name:?} has size {}, not {size}: not reclaimed", job.size),
            ));
        }
        if job.fresh.contains(&member) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "member {member} of job {name:?} was given to another process after the reclaim period: \
                     the job's state was lost"
                ),
            ));
        }
        // Every generation below the member's next one was asked (it took part in them).
        let asked = [known.flush_asked, epoch.checked_sub(1)].into_iter().flatten().max();
        job.flush_asked = job.flush_asked.max(asked);
        job.durable_asked = job.durable_asked.max(known.durable_asked);
        job.clock = job.clock.max(known.clock);
        for (gone, from) in &known.left {
            job.left.entry(*gone).or_insert(*from);
        }
        if member >= job.joined {
            job.seen.resize(member as usize + 1, now);
            job.joined = member + 1;
        }
        job.seen[member as usize] = now;
        job.present.insert(member);
        Ok((member, epoch, job.event()))
    }

    /// Joins `name` (created with `size` if absent): the member index, the generation the
    /// member starts at, and the job's state.
    pub fn join(&mut self, name: &str, size: u32, now: Instant) -> Result<(u32, u64, JobEvent), WireError> {
        self.forget_finished(now);
        let bounds = self.bounds;
        if name.is_empty() || name.len() > bounds.name_bytes_max {
            return Err(refused(format!("job name must be 1..={} bytes", bounds.name_bytes_max)));
        }
        if size == 0 || size > bounds.members_max {
            return Err(refused(format!(
                "job size {size} outside 1..={} (job_members_max)",
                bounds.members_max
            )));
        }
        if !self.jobs.contains_key(name) && self.jobs.len() >= bounds.jobs_max {
            let message =
                format!("{} jobs exist, the limit jobs_max; job {name:?} not created", self.jobs.len());
            return Err(WireError::new(ErrorCode::OverLimit, message));
        }
        if let Some(left) = self.grace_left(now) {
            return Err(WireError::new(
                ErrorCode::Recovering,
                format!("jobs are being reclaimed for {} ms more; join after", left.as_millis()),
            ));
        }
        let job = self.jobs.entry(name.to_string()).or_insert_with(|| Job::new(size));
        if job.size != size {
            return Err(refused(format!("job {name:?} has size {}, not {size}", job.size)));
        }
        if job.joined == job.size {
            return Err(refused(format!("job {name:?} is full: all {size} members joined")));
        }
        let member = job.joined;
        job.joined += 1;
        job.seen.push(now);
        job.present.insert(member);
        job.fresh.insert(member);
        let epoch = job.flush_asked.map_or(0, |e| e + 1);
        Ok((member, epoch, job.event()))
    }

    fn job(&mut self, name: &str, member: u32, now: Instant) -> Result<&mut Job, WireError> {
        let job = self.jobs.get_mut(name).ok_or_else(|| unknown(name))?;
        if member >= job.size {
            return Err(refused(format!("job {name:?} has no member {member}")));
        }
        if !job.present.contains(&member) {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!(
                    "member {member} of job {name:?} is not known here (a new metadata leader): reclaim it"
                ),
            ));
        }
        job.seen[member as usize] = now;
        Ok(job)
    }

    /// Member `member` asks for a flush of generation `epoch`.
    pub fn ask_flush(
        &mut self,
        name: &str,
        member: u32,
        (epoch, durable): (u64, bool),
        clock: u64,
        now: Instant,
    ) -> Result<(), WireError> {
        let job = self.job(name, member, now)?;
        if let Some(at) = job.left.get(&member) {
            return Err(refused(format!("member {member} left job {name:?} at generation {at}")));
        }
        job.flush_asked = Some(job.flush_asked.map_or(epoch, |e| e.max(epoch)));
        if durable {
            job.durable_asked = Some(job.durable_asked.map_or(epoch, |e| e.max(epoch)));
        }
        job.clock = job.clock.max(clock);
        Ok(())
    }

    /// The job's state if a flush of `epoch` or later was asked, else `None` (wait).
    pub fn poll(
        &mut self,
        name: &str,
        member: u32,
        (epoch, clock): (u64, u64),
        now: Instant,
    ) -> Result<Option<JobEvent>, WireError> {
        let job = self.job(name, member, now)?;
        job.clock = job.clock.max(clock);
        Ok(job.flush_asked.filter(|asked| *asked >= epoch).map(|_| job.event()))
    }

    /// The job's state now.
    pub fn event(&mut self, name: &str, member: u32, now: Instant) -> Result<JobEvent, WireError> {
        Ok(self.job(name, member, now)?.event())
    }

    /// Member `member` leaves, taking part in no flush from generation `epoch` on.
    pub fn leave(&mut self, name: &str, member: u32, epoch: u64, now: Instant) -> Result<(), WireError> {
        let job = self.job(name, member, now)?;
        if job.flush_asked.is_some_and(|asked| asked >= epoch) {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                format!("a flush of generation {epoch} of job {name:?} was asked: take part before leaving"),
            ));
        }
        job.left.insert(member, epoch);
        if job.left.len() as u32 == job.size {
            self.jobs.remove(name);
        }
        Ok(())
    }

    /// Forgets jobs none of whose remaining members was heard from within the lease.
    pub fn forget_finished(&mut self, now: Instant) {
        let lease = self.bounds.lease;
        self.jobs.retain(|_, job| !job.finished(now, lease));
    }

    pub fn wait_bound(&self, wait_ms: u64) -> Duration {
        Duration::from_millis(wait_ms.min(self.bounds.wait_ms_max))
    }
}

/// The job table with a lock and a condition variable for `JobWait`.
pub(crate) struct Jobs {
    table: parking_lot::Mutex<JobTable>,
    changed: parking_lot::Condvar,
}

impl Jobs {
    pub fn new(bounds: JobBounds) -> Jobs {
        Jobs { table: parking_lot::Mutex::new(JobTable::new(bounds)), changed: parking_lot::Condvar::new() }
    }

    /// Joins `name`; during a grace period, waits (on a blocking thread) for it to end first.
    pub fn join(&self, name: &str, size: u32) -> Result<(u32, u64, JobEvent), WireError> {
        let mut table = self.table.lock();
        while let Some(left) = table.grace_left(Instant::now()) {
            self.changed.wait_for(&mut table, left);
        }
        table.join(name, size, Instant::now())
    }

    /// `JobReclaim`.
    pub fn reclaim(&self, name: &str, reclaim: &Reclaim) -> Result<(u32, u64, JobEvent), WireError> {
        let reclaimed = self.table.lock().reclaim(name, reclaim, Instant::now())?;
        self.changed.notify_all();
        Ok(reclaimed)
    }

    /// A new term or a restart: jobs are forgotten and reclaimed until `until`.
    pub fn begin_grace(&self, until: Instant) {
        self.table.lock().begin_grace(until);
        self.changed.notify_all();
    }

    pub fn ask_flush(
        &self,
        name: &str,
        member: u32,
        asked: (u64, bool),
        clock: u64,
    ) -> Result<(), WireError> {
        self.table.lock().ask_flush(name, member, asked, clock, Instant::now())?;
        self.changed.notify_all();
        Ok(())
    }

    /// Waits (on a blocking thread) up to `wait_ms`, bounded by `job_wait_ms_max`, for a
    /// flush of `epoch` or later; returns the job's state either way.
    pub fn wait(
        &self,
        name: &str,
        member: u32,
        (epoch, clock): (u64, u64),
        wait_ms: u64,
    ) -> Result<JobEvent, WireError> {
        let mut table = self.table.lock();
        let deadline = Instant::now() + table.wait_bound(wait_ms);
        loop {
            if let Some(event) = table.poll(name, member, (epoch, clock), Instant::now())? {
                return Ok(event);
            }
            if self.changed.wait_until(&mut table, deadline).timed_out() {
                return table.event(name, member, Instant::now());
            }
        }
    }

    pub fn leave(&self, name: &str, member: u32, epoch: u64) -> Result<(), WireError> {
        self.table.lock().leave(name, member, epoch, Instant::now())?;
        self.changed.notify_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table() -> JobTable {
        JobTable::new(JobBounds {
            jobs_max: 2,
            members_max: 8,
            wait_ms_max: 100,
            lease: Duration::from_secs(10),
            name_bytes_max: 16,
        })
    }

    #[test]
    fn members_get_indexes_and_learn_of_a_flush() {
        let (mut jobs, now) = (table(), Instant::now());
        assert_eq!(jobs.join("j", 3, now).unwrap().0, 0);
        assert_eq!(jobs.join("j", 3, now).unwrap().0, 1);
        assert!(jobs.join("j", 4, now).unwrap_err().message.contains("has size 3"));
        assert_eq!(jobs.join("j", 3, now).unwrap().0, 2);
        assert!(jobs.join("j", 3, now).unwrap_err().message.contains("full"));
        assert_eq!(jobs.poll("j", 1, (0, 5), now).unwrap(), None);
        jobs.ask_flush("j", 2, (0, false), 9, now).unwrap();
        let event = jobs.poll("j", 0, (0, 0), now).unwrap().unwrap();
        assert_eq!((event.flush_asked, event.durable_asked, event.clock), (Some(0), None, 9));
        jobs.ask_flush("j", 1, (0, true), 3, now).unwrap();
        let event = jobs.poll("j", 0, (0, 0), now).unwrap().unwrap();
        assert_eq!((event.durable_asked, event.clock), (Some(0), 9), "the largest clock is kept");
        assert_eq!(jobs.poll("j", 0, (1, 0), now).unwrap(), None, "generation 1 not asked yet");
    }

    #[test]
    fn leaving_is_refused_once_the_generation_is_asked() {
        let (mut jobs, now) = (table(), Instant::now());
        jobs.join("j", 2, now).unwrap();
        jobs.join("j", 2, now).unwrap();
        jobs.ask_flush("j", 0, (0, false), 1, now).unwrap();
        assert_eq!(jobs.leave("j", 1, 0, now).unwrap_err().code, ErrorCode::Unavailable);
        jobs.leave("j", 1, 1, now).unwrap();
        assert_eq!(jobs.event("j", 0, now).unwrap().left, vec![(1, 1)]);
        jobs.leave("j", 0, 1, now).unwrap();
        assert!(jobs.event("j", 0, now).is_err(), "a job all members left is forgotten");
    }

    #[test]
    fn a_job_is_reclaimed_after_a_failover_and_joins_wait_for_the_grace_period() {
        let (mut jobs, now) = (table(), Instant::now());
        for _ in 0..3 {
            jobs.join("j", 3, now).unwrap();
        }
        jobs.ask_flush("j", 1, (0, true), 4, now).unwrap();
        jobs.begin_grace(now + Duration::from_secs(5));
        assert_eq!(jobs.poll("j", 0, (0, 0), now).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(jobs.join("j", 3, now).unwrap_err().code, ErrorCode::Recovering);
        // Member 2 took part in generation 0 already; member 0 had not heard of it.
        let took_part = Reclaim { size: 3, member: 2, epoch: 1, known: known(Some(0), Some(0), 4) };
        assert_eq!(jobs.reclaim("j", &took_part, now).unwrap().0, 2);
        assert_eq!(jobs.poll("j", 0, (0, 0), now).unwrap_err().code, ErrorCode::NotFound, "0 not reclaimed");
        let unaware = Reclaim { size: 3, member: 0, epoch: 0, known: known(None, None, 0) };
        jobs.reclaim("j", &unaware, now).unwrap();
        jobs.reclaim("j", &unaware, now).unwrap();
        let event = jobs.poll("j", 0, (0, 0), now).unwrap().expect("generation 0 was asked");
        assert_eq!((event.flush_asked, event.durable_asked, event.clock), (Some(0), Some(0), 4));
        assert_eq!(jobs.poll("j", 2, (1, 0), now).unwrap(), None, "generation 1 was never asked");
        let wrong = Reclaim { size: 4, ..unaware.clone() };
        assert_eq!(jobs.reclaim("j", &wrong, now).unwrap_err().code, ErrorCode::InvalidArgument);
        // After the period joins go on: a newcomer's index cannot be reclaimed by a late
        // member of the previous term (refused), an index nobody took can.
        let after = now + Duration::from_secs(6);
        assert_eq!(jobs.join("k", 2, after).unwrap().0, 0);
        let late = Reclaim { size: 2, member: 0, epoch: 0, known: known(None, None, 0) };
        assert!(jobs.reclaim("k", &late, after).unwrap_err().message.contains("another process"));
        let member_one = Reclaim { member: 1, ..late };
        assert_eq!(jobs.reclaim("k", &member_one, after).unwrap().0, 1, "an index nobody took");
        assert!(jobs.join("k", 2, after).unwrap_err().message.contains("full"));
    }

    fn known(flush_asked: Option<u64>, durable_asked: Option<u64>, clock: u64) -> JobEvent {
        JobEvent { flush_asked, durable_asked, clock, left: Vec::new() }
    }

    /// A member as the model knows it: its next generation and what it knows of the job.
    #[derive(Clone, Debug)]
    struct Model {
        epoch: u64,
        known: JobEvent,
        asked: Option<u64>,
    }

    fn merge(known: &mut JobEvent, event: &JobEvent) {
        known.flush_asked = known.flush_asked.max(event.flush_asked);
        known.durable_asked = known.durable_asked.max(event.durable_asked);
        known.clock = known.clock.max(event.clock);
    }

    proptest::proptest! {
        /// A job run under one leader (members asking for flushes, polling, taking part in
        /// what was asked), then a failover: whatever order the members reclaim in, the new
        /// table agrees on one state, forgets no generation a member asked for or took part
        /// in, invents none the old table did not have, and no member is told to flush a
        /// generation it already took part in.
        #[test]
        fn reclaims_in_any_order_rebuild_what_the_members_knew(
            steps in proptest::collection::vec((0u32..4, 0u8..3, proptest::bool::ANY), 0..60),
            order in proptest::sample::subsequence((0u32..4).collect::<Vec<_>>(), 4).prop_shuffle(),
        ) {
            let now = Instant::now();
            let mut old = table();
            let mut members = Vec::new();
            for _ in 0..4 {
                let (_, epoch, event) = old.join("j", 4, now).unwrap();
                members.push(Model { epoch, known: event, asked: None });
            }
            for (member, action, durable) in steps {
                let m = &mut members[member as usize];
                match action {
                    0 => {
                        old.ask_flush("j", member, (m.epoch, durable), 1, now).unwrap();
                        m.asked = m.asked.max(Some(m.epoch));
                        let asked = JobEvent {
                            flush_asked: Some(m.epoch),
                            durable_asked: durable.then_some(m.epoch),
                            clock: 1,
                            left: Vec::new(),
                        };
                        merge(&mut m.known, &asked);
                    }
                    _ => {
                        if let Some(event) = old.poll("j", member, (m.epoch, 0), now).unwrap() {
                            merge(&mut m.known, &event);
                            m.epoch += 1; // took part
                        } else {
                            let event = old.event("j", member, now).unwrap();
                            merge(&mut m.known, &event);
                        }
                    }
                }
            }
            let old_event = old.event("j", 0, now).unwrap();
            let rebuild = |order: &[u32]| {
                let mut new = table();
                new.begin_grace(now + Duration::from_secs(5));
                for member in order {
                    let m = &members[*member as usize];
                    let reclaim = Reclaim { size: 4, member: *member, epoch: m.epoch, known: m.known.clone() };
                    let (index, epoch, _) = new.reclaim("j", &reclaim, now).unwrap();
                    prop_assert_eq!((index, epoch), (*member, m.epoch));
                }
                Ok(new)
            };
            let mut new = rebuild(&order)?;
            let mut reversed = order.clone();
            reversed.reverse();
            let mut other = rebuild(&reversed)?;
            let event = new.event("j", order[0], now).unwrap();
            prop_assert_eq!(&event, &other.event("j", order[0], now).unwrap(), "the order of reclaims matters");
            prop_assert!(event.flush_asked <= old_event.flush_asked, "a generation nobody asked");
            prop_assert!(event.durable_asked <= old_event.durable_asked);
            for member in &order {
                let m = &members[*member as usize];
                prop_assert!(m.asked <= event.flush_asked, "member {}'s ask was forgotten", member);
                prop_assert!(m.epoch == 0 || event.flush_asked >= Some(m.epoch - 1), "a generation taken part in was forgotten");
                // Told to flush only a generation at or past its own next one.
                let polled = new.poll("j", *member, (m.epoch, 0), now).unwrap();
                prop_assert_eq!(polled.is_some(), event.flush_asked >= Some(m.epoch));
            }
        }
    }

    #[test]
    fn jobs_are_bounded_and_silent_ones_forgotten() {
        let (mut jobs, now) = (table(), Instant::now());
        jobs.join("a", 1, now).unwrap();
        jobs.join("b", 1, now).unwrap();
        assert_eq!(jobs.join("c", 1, now).unwrap_err().code, ErrorCode::OverLimit);
        assert!(jobs.join("x", 9, now).unwrap_err().message.contains("job_members_max"));
        let later = now + Duration::from_secs(11);
        assert_eq!(jobs.join("c", 1, later).unwrap().0, 0, "a and b were not heard from for a lease");
    }
}
