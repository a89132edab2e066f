//! Proposals to the metadata group made by the handler threads themselves (issue 33,
//! fewer hand-offs per round).
//!
//! A handler with a change queues it; if fewer than `in_flight_max` batches are being
//! proposed, it takes every change waiting (bounded by the batch limits) and proposes that
//! batch itself, on its own thread, so no queue task and no spawned proposal task stand
//! between the request and the group. A handler whose proposal ends passes the next batch
//! waiting to one of that batch's own handlers ("your turn"), which proposes it; the slot
//! is given back only when nothing waits. Changes arriving while a batch is in flight so
//! share the next round, as the queue task batched them before.
//!
//! Invariants: at most `in_flight_max` batches are proposed at once; at most
//! `waiting_max` changes wait; every change is in exactly one batch, proposed once; a batch
//! whose proposer stopped waiting (its `quorum_wait_ms` ran out) is finished in a task of its
//! own, so the other changes of that batch still get their outcome.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// What proposes a batch and answers each of its changes.
pub(crate) trait Propose: Send + Sync + 'static {
    type Change: Send + 'static;
    type Outcome: Send + 'static;
    /// A change's size against the batch's byte bound.
    fn bytes(change: &Self::Change) -> usize;
    /// Proposes `batch` and sends each proposal's outcome on its `reply`.
    fn propose(&self, batch: Vec<Proposal<Self>>) -> impl Future<Output = ()> + Send + 'static;
}

/// A change waiting to be proposed, and where its outcome goes.
pub(crate) struct Proposal<P: Propose + ?Sized> {
    pub change: P::Change,
    pub reply: oneshot::Sender<P::Outcome>,
    /// Where this change's handler is told to propose a batch (taken when it is).
    turn: Option<oneshot::Sender<Vec<Proposal<P>>>>,
}

/// Bounds of the proposals.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProposalLimits {
    pub batch_changes_max: usize,
    pub batch_bytes_max: usize,
    pub in_flight_max: usize,
    pub waiting_max: usize,
}

/// Why a change got no outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoOutcome {
    /// `waiting_max` changes wait already: not proposed.
    Full,
    /// No outcome within the wait (or its proposal was dropped): unknown.
    Unknown,
}

struct Waiting<P: Propose> {
    queue: VecDeque<Proposal<P>>,
    /// Batches being proposed.
    proposing: usize,
}

/// The changes waiting and the batches in flight.
pub(crate) struct Proposals<P: Propose> {
    proposer: P,
    limits: ProposalLimits,
    waiting: Mutex<Waiting<P>>,
}

type Turn = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<P: Propose> Proposals<P> {
    pub(crate) fn new(proposer: P, limits: ProposalLimits) -> Arc<Self> {
        let limits = ProposalLimits {
            batch_changes_max: limits.batch_changes_max.max(1),
            batch_bytes_max: limits.batch_bytes_max.max(1),
            in_flight_max: limits.in_flight_max.max(1),
            waiting_max: limits.waiting_max.max(1),
        };
        Arc::new(Proposals {
            proposer,
            limits,
            waiting: Mutex::new(Waiting { queue: VecDeque::new(), proposing: 0 }),
        })
    }

    /// Proposes `change` (with the changes waiting beside it) and waits at most `wait` for
    /// its outcome.
    pub(crate) async fn propose(
        self: &Arc<Self>,
        change: P::Change,
        wait: Duration,
    ) -> Result<P::Outcome, NoOutcome> {
        let deadline = tokio::time::Instant::now() + wait;
        let (reply, mut outcome) = oneshot::channel();
        let (turn, mut my_turn) = oneshot::channel();
        let mine = {
            let mut waiting = self.waiting.lock();
            if waiting.queue.len() >= self.limits.waiting_max {
                return Err(NoOutcome::Full);
            }
            waiting.queue.push_back(Proposal { change, reply, turn: Some(turn) });
            if waiting.proposing < self.limits.in_flight_max {
                waiting.proposing += 1;
                Some(self.take_batch(&mut waiting.queue))
            } else {
                None
            }
        };
        if let Some(batch) = mine {
            self.take_turn(batch, deadline).await;
        }
        let mut turned = false;
        let result = loop {
            tokio::select! {
                biased;
                result = &mut outcome => break result.map_err(|_| NoOutcome::Unknown),
                batch = &mut my_turn, if !turned => {
                    turned = true;
                    if let Ok(batch) = batch {
                        self.take_turn(batch, deadline).await;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break Err(NoOutcome::Unknown),
            }
        };
        if !turned {
            self.leave(&mut my_turn);
        }
        result
    }

    /// A handler stops waiting: a turn handed to it just before is not lost with it (its
    /// batch is proposed in a task of its own).
    fn leave(self: &Arc<Self>, my_turn: &mut oneshot::Receiver<Vec<Proposal<P>>>) {
        my_turn.close();
        if let Ok(batch) = my_turn.try_recv() {
            let this = self.clone();
            let proposing = self.proposer.propose(batch);
            tokio::spawn(async move {
                proposing.await;
                this.hand_on();
            });
        }
    }

    /// Proposes `batch` (this caller's turn) until it ends or `deadline`; past the deadline
    /// it is finished in a task of its own. Either way the next batch is handed on after it.
    async fn take_turn(self: &Arc<Self>, batch: Vec<Proposal<P>>, deadline: tokio::time::Instant) {
        let this = self.clone();
        let proposing = self.proposer.propose(batch);
        let mut turn: Turn = Box::pin(async move {
            proposing.await;
            this.hand_on();
        });
        tokio::select! {
            () = &mut turn => {}
            () = tokio::time::sleep_until(deadline) => {
                tokio::spawn(turn);
            }
        }
    }

    /// After a batch: the next batch waiting goes to one of its own handlers still waiting;
    /// with nothing waiting the slot is given back.
    fn hand_on(&self) {
        loop {
            let mut batch = {
                let mut waiting = self.waiting.lock();
                if waiting.queue.is_empty() {
                    waiting.proposing -= 1;
                    return;
                }
                self.take_batch(&mut waiting.queue)
            };
            for index in 0..batch.len() {
                let Some(turn) = batch[index].turn.take() else { continue };
                match turn.send(batch) {
                    Ok(()) => return,
                    Err(back) => batch = back,
                }
            }
            // Every handler of that batch stopped waiting: nobody to answer, so it is not
            // proposed (never proposed is a safe outcome of an unanswered change).
        }
    }

    /// The changes at the queue's head that fit one batch (at least one).
    fn take_batch(&self, queue: &mut VecDeque<Proposal<P>>) -> Vec<Proposal<P>> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(next) = queue.front() {
            let size = P::bytes(&next.change);
            let fits =
                batch.len() < self.limits.batch_changes_max && bytes + size <= self.limits.batch_bytes_max;
            if !batch.is_empty() && !fits {
                break;
            }
            bytes += size;
            batch.extend(queue.pop_front());
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers each change with (change, batch number, batch size) after `delay`, counting
    /// the batches in flight.
    struct Fake {
        delay: Duration,
        in_flight: Arc<AtomicUsize>,
        in_flight_seen_max: Arc<AtomicUsize>,
        batches: Arc<AtomicUsize>,
    }

    impl Propose for Fake {
        type Change = u64;
        type Outcome = (u64, usize, usize);

        fn bytes(_: &u64) -> usize {
            10
        }

        fn propose(&self, batch: Vec<Proposal<Self>>) -> impl Future<Output = ()> + Send + 'static {
            let (delay, in_flight, seen) =
                (self.delay, self.in_flight.clone(), self.in_flight_seen_max.clone());
            let number = self.batches.fetch_add(1, Ordering::SeqCst);
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                seen.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let size = batch.len();
                for p in batch {
                    let _ = p.reply.send((p.change, number, size));
                }
            }
        }
    }

    fn fake(delay_ms: u64) -> Fake {
        Fake {
            delay: Duration::from_millis(delay_ms),
            in_flight: Arc::default(),
            in_flight_seen_max: Arc::default(),
            batches: Arc::default(),
        }
    }

    fn limits(in_flight_max: usize, batch_changes_max: usize) -> ProposalLimits {
        ProposalLimits { batch_changes_max, batch_bytes_max: 1000, in_flight_max, waiting_max: 1000 }
    }

    /// Many concurrent changes: each answered once with its own outcome, never more batches
    /// in flight than allowed, batches within their bound, and changes that came while one
    /// was in flight shared a batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_changes_are_batched_within_bounds_and_each_answered() {
        for (in_flight_max, batch_max) in [(1, 1000), (2, 3), (4, 1000)] {
            let proposer = fake(5);
            let (seen, batches) = (proposer.in_flight_seen_max.clone(), proposer.batches.clone());
            let proposals = Proposals::new(proposer, limits(in_flight_max, batch_max));
            let mut tasks = Vec::new();
            for change in 0..64u64 {
                let proposals = proposals.clone();
                tasks.push(tokio::spawn(
                    async move { proposals.propose(change, Duration::from_secs(30)).await },
                ));
            }
            for (change, task) in tasks.into_iter().enumerate() {
                let (answered, _, size) = task.await.unwrap().unwrap();
                assert_eq!(answered, change as u64);
                assert!(size <= batch_max, "a batch of {size} over {batch_max}");
            }
            assert!(
                seen.load(Ordering::SeqCst) <= in_flight_max,
                "{} in flight",
                seen.load(Ordering::SeqCst)
            );
            assert!(
                batches.load(Ordering::SeqCst) < 64,
                "nothing was batched: {}",
                batches.load(Ordering::SeqCst)
            );
            assert_eq!(proposals.waiting.lock().proposing, 0, "a slot was not given back");
        }
    }

    /// A proposer whose wait runs out leaves its batch to finish in a task: the other
    /// changes of the batch are answered, and the slot comes back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_outlives_its_proposers_wait() {
        let proposals = Proposals::new(fake(300), limits(1, 1000));
        let first = {
            let proposals = proposals.clone();
            tokio::spawn(async move { proposals.propose(1, Duration::from_millis(50)).await })
        };
        assert_eq!(first.await.unwrap(), Err(NoOutcome::Unknown));
        // Queued behind the first batch, with time to wait for it and its own.
        let second = proposals.propose(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(second.0, 2);
        assert_eq!(proposals.waiting.lock().proposing, 0);
    }

    /// Past `waiting_max` a change is refused, not queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_refuses() {
        let proposals = Proposals::new(
            fake(200),
            ProposalLimits { batch_changes_max: 1, batch_bytes_max: 1000, in_flight_max: 1, waiting_max: 1 },
        );
        let busy = {
            let proposals = proposals.clone();
            tokio::spawn(async move { proposals.propose(1, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let queued = {
            let proposals = proposals.clone();
            tokio::spawn(async move { proposals.propose(2, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(proposals.propose(3, Duration::from_secs(30)).await, Err(NoOutcome::Full));
        assert_eq!(busy.await.unwrap().unwrap().0, 1);
        assert_eq!(queued.await.unwrap().unwrap().0, 2);
    }
}
