//! Fair service across connections: each connection has its own FIFO of jobs, and workers
//! take the next job from the connections in round-robin order (Galley §4.2.2's CacheManager
//! serves its per-thread request lists the same way), so a client with a deep queue gets one
//! turn per round like everyone else.
//!
//! Parking (issue 12): a worker that took a job whose blocks are on their way from the disk
//! may park it (`try_park`) instead of waiting, and take the next job; when the blocks are
//! in, the job comes back through `unpark` into the ready queue, which workers serve before
//! the connections' queues (it already had its turn). At most `parked_max` jobs are parked.
//!
//! Invariants: a connection appears in the ring at most once; a connection is in the ring
//! exactly when its queue is non-empty; `close` drops a connection's queued jobs (not its
//! parked or ready ones: they finish); `parked` counts parks not yet unparked or cancelled,
//! never more than `parked_max`; once stopped, `next` hands out ready jobs until nothing is
//! parked or ready, then `None`, so no parked job is left unfinished.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};

/// Identifies a connection.
pub type ConnectionId = u64;

struct State<J> {
    queues: HashMap<ConnectionId, VecDeque<J>>,
    ring: VecDeque<ConnectionId>,
    /// Parked jobs whose blocks are in, served first.
    ready: VecDeque<(ConnectionId, J)>,
    parked: usize,
    stopped: bool,
}

/// Per-connection job queues served round robin by blocking workers.
pub struct Scheduler<J> {
    state: Mutex<State<J>>,
    ready: Condvar,
    parked_max: usize,
}

impl<J> Default for Scheduler<J> {
    /// A scheduler that parks nothing.
    fn default() -> Self {
        Scheduler::with_parking(0)
    }
}

impl<J> Scheduler<J> {
    /// A scheduler that lets at most `parked_max` jobs be parked at once.
    pub fn with_parking(parked_max: usize) -> Self {
        let state = State {
            queues: HashMap::new(),
            ring: VecDeque::new(),
            ready: VecDeque::new(),
            parked: 0,
            stopped: false,
        };
        Scheduler { state: Mutex::new(state), ready: Condvar::new(), parked_max }
    }

    /// Queues a job for a connection. Bounding the queue is the caller's job (a per-
    /// connection semaphore), so this never refuses.
    pub fn push(&self, connection: ConnectionId, job: J) {
        let mut state = self.state.lock();
        let queue = state.queues.entry(connection).or_default();
        queue.push_back(job);
        if queue.len() == 1 {
            state.ring.push_back(connection);
        }
        drop(state);
        self.ready.notify_one();
    }

    /// Takes the next job — a ready one first, then round robin — waiting while there is
    /// none. `None` once the scheduler is stopped and nothing is parked or ready.
    pub fn next(&self) -> Option<(ConnectionId, J)> {
        let mut state = self.state.lock();
        loop {
            if let Some(ready) = state.ready.pop_front() {
                return Some(ready);
            }
            if state.stopped {
                if state.parked == 0 {
                    return None;
                }
            } else if let Some(taken) = Self::take(&mut state) {
                return Some(taken);
            }
            self.ready.wait(&mut state);
        }
    }

    /// Takes the next job without waiting.
    pub fn try_next(&self) -> Option<(ConnectionId, J)> {
        let mut state = self.state.lock();
        if let Some(ready) = state.ready.pop_front() {
            return Some(ready);
        }
        Self::take(&mut state)
    }

    fn take(state: &mut State<J>) -> Option<(ConnectionId, J)> {
        let connection = state.ring.pop_front()?;
        let queue = state.queues.get_mut(&connection)?;
        let job = queue.pop_front()?;
        if queue.is_empty() {
            state.queues.remove(&connection);
        } else {
            state.ring.push_back(connection);
        }
        Some((connection, job))
    }

    /// Reserves a place for one parked job: false when `parked_max` are parked or the
    /// scheduler is stopped (then the caller runs the job itself). A reservation ends with
    /// `unpark` or `cancel_park`.
    pub fn try_park(&self) -> bool {
        let mut state = self.state.lock();
        if state.stopped || state.parked >= self.parked_max {
            return false;
        }
        state.parked += 1;
        true
    }

    /// Gives back a reservation that parked nothing.
    pub fn cancel_park(&self) {
        let mut state = self.state.lock();
        state.parked -= 1;
        let wake_all = state.stopped;
        drop(state);
        if wake_all {
            // Stopped workers wait for the last parked job; this may have been it.
            self.ready.notify_all();
        }
    }

    /// A parked job is ready to run: queued ahead of every connection's queue.
    pub fn unpark(&self, connection: ConnectionId, job: J) {
        let mut state = self.state.lock();
        state.parked -= 1;
        state.ready.push_back((connection, job));
        drop(state);
        self.ready.notify_one();
    }

    /// Jobs parked now (not yet ready).
    pub fn parked(&self) -> usize {
        self.state.lock().parked
    }

    /// Drops a closed connection's queued jobs.
    pub fn close(&self, connection: ConnectionId) {
        let mut state = self.state.lock();
        if state.queues.remove(&connection).is_some() {
            state.ring.retain(|c| *c != connection);
        }
    }

    /// Wakes every worker; `next` then hands out only parked jobs as they become ready, and
    /// `None` once none is left.
    pub fn stop(&self) {
        self.state.lock().stopped = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_connection_does_not_starve_others() {
        let scheduler = Scheduler::default();
        // Phase 1: connection 1 queues 100 jobs, then connection 2 queues 3.
        for job in 0..100 {
            scheduler.push(1, job);
        }
        for job in 0..3 {
            scheduler.push(2, 1000 + job);
        }
        // Phase 2: the first 6 jobs served alternate between the two connections.
        let served: Vec<ConnectionId> = (0..6).map(|_| scheduler.try_next().unwrap().0).collect();
        assert_eq!(served, vec![1, 2, 1, 2, 1, 2]);
        // Phase 3: connection 2 is drained, connection 1 continues in order.
        assert_eq!(scheduler.try_next(), Some((1, 3)));
    }

    #[test]
    fn closed_connection_leaves_the_ring() {
        let scheduler = Scheduler::default();
        scheduler.push(1, 1);
        scheduler.push(2, 2);
        scheduler.close(1);
        assert_eq!(scheduler.try_next(), Some((2, 2)));
        assert_eq!(scheduler.try_next(), None);
    }

    #[test]
    fn ready_jobs_go_first_and_parks_are_bounded() {
        let scheduler = Scheduler::with_parking(1);
        scheduler.push(1, 10);
        scheduler.push(2, 20);
        let (connection, parked) = scheduler.try_next().unwrap();
        assert!(scheduler.try_park(), "one place");
        assert!(!scheduler.try_park(), "parked_max = 1");
        scheduler.unpark(connection, parked);
        assert_eq!(scheduler.parked(), 0);
        assert_eq!(scheduler.try_next(), Some((1, 10)), "the ready job before connection 2's");
        assert_eq!(scheduler.try_next(), Some((2, 20)));
        assert!(!Scheduler::<u32>::default().try_park(), "the default parks nothing");
    }

    #[test]
    fn stopped_workers_finish_parked_jobs_first() {
        let scheduler = std::sync::Arc::new(Scheduler::with_parking(4));
        scheduler.push(1, 1);
        assert!(scheduler.try_park());
        scheduler.stop();
        assert!(!scheduler.try_park(), "nothing parks once stopped");
        let worker = {
            let scheduler = scheduler.clone();
            std::thread::spawn(move || (scheduler.next(), scheduler.next()))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        scheduler.unpark(2, 7);
        assert_eq!(worker.join().unwrap(), (Some((2, 7)), None), "queued jobs are not served once stopped");
    }

    #[test]
    fn stop_wakes_waiting_workers() {
        let scheduler = std::sync::Arc::new(Scheduler::<u32>::default());
        let worker = {
            let scheduler = scheduler.clone();
            std::thread::spawn(move || scheduler.next())
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        scheduler.stop();
        assert_eq!(worker.join().unwrap(), None);
    }
}
