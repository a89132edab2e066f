//! Fair service across connections: each connection has its own FIFO of jobs, and workers
//! take the next job from the connections in round-robin order (Galley §4.2.2's CacheManager
//! serves its per-thread request lists the same way), so a client with a deep queue gets one
//! turn per round like everyone else.
//!
//! Invariants: a connection appears in the ring at most once; a connection is in the ring
//! exactly when its queue is non-empty; `close` drops a connection's queued jobs.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};

/// Identifies a connection.
pub type ConnectionId = u64;

struct State<J> {
    queues: HashMap<ConnectionId, VecDeque<J>>,
    ring: VecDeque<ConnectionId>,
    stopped: bool,
}

/// Per-connection job queues served round robin by blocking workers.
pub struct Scheduler<J> {
    state: Mutex<State<J>>,
    ready: Condvar,
}

impl<J> Default for Scheduler<J> {
    fn default() -> Self {
        Scheduler {
            state: Mutex::new(State { queues: HashMap::new(), ring: VecDeque::new(), stopped: false }),
            ready: Condvar::new(),
        }
    }
}

impl<J> Scheduler<J> {
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

    /// Takes the next job in round-robin order, waiting while there is none. `None` once
    /// the scheduler is stopped.
    pub fn next(&self) -> Option<(ConnectionId, J)> {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return None;
            }
            if let Some(taken) = Self::take(&mut state) {
                return Some(taken);
            }
            self.ready.wait(&mut state);
        }
    }

    /// Takes the next job without waiting.
    pub fn try_next(&self) -> Option<(ConnectionId, J)> {
        Self::take(&mut self.state.lock())
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

    /// Drops a closed connection's queued jobs.
    pub fn close(&self, connection: ConnectionId) {
        let mut state = self.state.lock();
        if state.queues.remove(&connection).is_some() {
            state.ring.retain(|c| *c != connection);
        }
    }

    /// Wakes every worker and makes `next` return `None`.
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
