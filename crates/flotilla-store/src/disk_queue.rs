//! The disk scheduler's queue: pure ordering logic, no I/O, no threads.
//!
//! Pending block operations are kept sorted by `QueueKey` (fork location on the medium, fork
//! serial, block number). They are served in C-SCAN order: continue upward from the last
//! served key, and when nothing lies above it wrap around to the lowest key. A served run
//! takes the next key plus the following blocks of the same fork, as long as they are
//! adjacent, pending and of the same kind (read or write), up to `run_blocks_max` blocks, so
//! the executor moves them in one system call.
//!
//! Several disk threads may serve one queue (`disk_threads_per_target`): each takes the next
//! run in sweep order. A taken run's keys stay *in flight* until the thread that took it
//! calls `finish`; the sweep skips in-flight keys and a run stops before one, so no two
//! threads ever move the same block (and so the same cache slot and checksum entries) at
//! once — a write-back of block B queued while B's read, or an older write-back of B, is in
//! flight waits in the queue until that transfer is finished.
//!
//! Invariants: `len` is the number of queued operations; no key maps to an empty list;
//! every operation in a run is of the run's kind; blocks of a run are consecutive; no taken
//! run holds a key that was in flight when it was taken.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// Position of a block operation in the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueKey {
    pub location: u64,
    pub fork_serial: u64,
    pub block: u64,
}

impl QueueKey {
    fn next_block(&self) -> Option<QueueKey> {
        Some(QueueKey { block: self.block.checked_add(1)?, ..*self })
    }
}

/// What the queue needs to know about an operation.
pub(crate) trait QueuedOp {
    fn is_write(&self) -> bool;
}

/// Operations on consecutive blocks of one fork, all reads or all writes.
#[derive(Debug)]
pub(crate) struct Run<T> {
    pub first: QueueKey,
    pub is_write: bool,
    /// `blocks[i]` are the operations on block `first.block + i` (identical operations that
    /// were queued more than once are served by one transfer).
    pub blocks: Vec<Vec<T>>,
}

impl<T> Run<T> {
    /// The blocks the run moves, to hand back to `DiskQueue::finish`.
    pub(crate) fn span(&self) -> RunSpan {
        RunSpan { first: self.first, blocks: self.blocks.len() as u64 }
    }
}

/// The keys of a taken run: `blocks` consecutive blocks from `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunSpan {
    pub first: QueueKey,
    pub blocks: u64,
}

impl RunSpan {
    fn keys(self) -> impl Iterator<Item = QueueKey> {
        (0..self.blocks).map(move |offset| QueueKey { block: self.first.block + offset, ..self.first })
    }
}

/// The next key not in `in_flight` to serve in C-SCAN order after `last_served`.
pub(crate) fn cscan_next<V>(
    pending: &BTreeMap<QueueKey, V>,
    last_served: Option<QueueKey>,
    in_flight: &BTreeSet<QueueKey>,
) -> Option<QueueKey> {
    let free = |(key, _): (&QueueKey, &V)| (!in_flight.contains(key)).then_some(*key);
    let above = match last_served {
        Some(last) => pending.range((Bound::Excluded(last), Bound::Unbounded)).find_map(free),
        None => None,
    };
    above.or_else(|| pending.iter().find_map(free))
}

/// Pending operations of one target.
#[derive(Debug)]
pub(crate) struct DiskQueue<T> {
    pending: BTreeMap<QueueKey, Vec<T>>,
    len: usize,
    last_served: Option<QueueKey>,
    /// Keys of runs taken and not yet finished.
    in_flight: BTreeSet<QueueKey>,
}

impl<T: QueuedOp> DiskQueue<T> {
    pub(crate) fn new() -> Self {
        Self { pending: BTreeMap::new(), len: 0, last_served: None, in_flight: BTreeSet::new() }
    }

    /// Number of queued operations (taken runs no longer count).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of blocks in taken runs not yet finished.
    #[cfg(test)]
    pub(crate) fn in_flight_blocks(&self) -> usize {
        self.in_flight.len()
    }

    /// The transfer of a taken run is over: its keys may be taken again.
    pub(crate) fn finish(&mut self, span: RunSpan) {
        for key in span.keys() {
            let was_in_flight = self.in_flight.remove(&key);
            assert!(was_in_flight, "finishing {key:?}, which is not in flight");
        }
    }

    pub(crate) fn push(&mut self, key: QueueKey, op: T) {
        self.pending.entry(key).or_default().push(op);
        self.len += 1;
    }

    /// Takes the next run in C-SCAN order whose blocks are not in flight; its keys are in
    /// flight until `finish`.
    pub(crate) fn pop_run(&mut self, run_blocks_max: usize) -> Option<Run<T>> {
        assert!(run_blocks_max > 0);
        let first = cscan_next(&self.pending, self.last_served, &self.in_flight)?;
        let is_write = self.pending.get(&first)?.first()?.is_write();
        let mut run = Run { first, is_write, blocks: Vec::new() };
        let mut key = first;
        loop {
            let ops = self.take_kind(key, is_write);
            debug_assert!(!ops.is_empty());
            run.blocks.push(ops);
            self.in_flight.insert(key);
            self.last_served = Some(key);
            if run.blocks.len() == run_blocks_max {
                break;
            }
            match key.next_block() {
                Some(next) if self.has_kind(next, is_write) => key = next,
                _ => break,
            }
        }
        Some(run)
    }

    /// Takes the next run, and, when it is a read, the following read runs of the same fork
    /// further up the sweep (gaps between them allowed, no wrap), up to `run_blocks_max`
    /// blocks in all: a target whose backend can merge pieces that are adjacent on its medium
    /// (lines: a fork's blocks with gaps in block numbers can sit in adjacent slots) serves
    /// them in one call.
    pub(crate) fn pop_gathered(&mut self, run_blocks_max: usize) -> Vec<Run<T>> {
        let Some(first) = self.pop_run(run_blocks_max) else { return Vec::new() };
        let (fork, location, is_write) = (first.first.fork_serial, first.first.location, first.is_write);
        let mut blocks = first.blocks.len();
        let mut runs = vec![first];
        while !is_write && blocks < run_blocks_max {
            let Some(last) = self.last_served else { break };
            let next =
                self.pending.range((Bound::Excluded(last), Bound::Unbounded)).next().map(|(key, _)| *key);
            match next {
                Some(key)
                    if key.fork_serial == fork && key.location == location && self.has_kind(key, false) =>
                {
                    let Some(run) = self.pop_run(run_blocks_max - blocks) else { break };
                    blocks += run.blocks.len();
                    runs.push(run);
                }
                _ => break,
            }
        }
        runs
    }

    /// Whether `key` has a queued operation of the kind and is not in flight.
    fn has_kind(&self, key: QueueKey, is_write: bool) -> bool {
        !self.in_flight.contains(&key)
            && self.pending.get(&key).is_some_and(|ops| ops.iter().any(|op| op.is_write() == is_write))
    }

    /// Removes and returns the operations of `key` of the given kind.
    fn take_kind(&mut self, key: QueueKey, is_write: bool) -> Vec<T> {
        let Some(ops) = self.pending.remove(&key) else {
            return Vec::new();
        };
        let (taken, kept): (Vec<T>, Vec<T>) = if ops.iter().all(|op| op.is_write() == is_write) {
            (ops, Vec::new())
        } else {
            ops.into_iter().partition(|op| op.is_write() == is_write)
        };
        if !kept.is_empty() {
            self.pending.insert(key, kept);
        }
        self.len -= taken.len();
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, PartialEq, Eq)]
    struct Op(bool, u32);

    impl QueuedOp for Op {
        fn is_write(&self) -> bool {
            self.0
        }
    }

    fn key(location: u64, block: u64) -> QueueKey {
        QueueKey { location, fork_serial: location, block }
    }

    #[test]
    fn gathering_takes_the_same_forks_later_read_runs_up_the_sweep() {
        let mut queue = DiskQueue::new();
        for block in [0, 1, 5, 6, 9] {
            queue.push(key(10, block), Op(false, block as u32));
        }
        queue.push(key(10, 7), Op(true, 7));
        queue.push(key(20, 0), Op(false, 100));
        let runs = queue.pop_gathered(16);
        let firsts: Vec<u64> = runs.iter().map(|run| run.first.block).collect();
        let lengths: Vec<usize> = runs.iter().map(|run| run.blocks.len()).collect();
        // A pending write of block 7 ends the gathering (the sweep serves it next).
        assert_eq!((firsts, lengths), (vec![0, 5], vec![2, 2]));
        assert!(runs.iter().all(|run| !run.is_write));
        let next = queue.pop_gathered(16);
        assert!(next[0].is_write && next.len() == 1, "writes are never gathered");
        let last = queue.pop_gathered(16);
        assert_eq!(last.len(), 1, "another fork ends the gathering");
        assert_eq!(last[0].first.block, 9);
        let capped = {
            let mut queue = DiskQueue::new();
            for block in [0, 2, 4, 6] {
                queue.push(key(1, block), Op(false, 0));
            }
            queue.pop_gathered(3).len()
        };
        assert_eq!(capped, 3, "at most run_blocks_max blocks in all");
    }

    #[test]
    fn cscan_continues_upward_then_wraps() {
        let pending: BTreeMap<QueueKey, ()> =
            [key(1, 5), key(1, 9), key(2, 0), key(3, 7)].into_iter().map(|k| (k, ())).collect();
        assert_eq!(cscan_next(&pending, None, &BTreeSet::new()), Some(key(1, 5)));
        assert_eq!(cscan_next(&pending, Some(key(1, 6)), &BTreeSet::new()), Some(key(1, 9)));
        assert_eq!(cscan_next(&pending, Some(key(1, 9)), &BTreeSet::new()), Some(key(2, 0)));
        assert_eq!(cscan_next(&pending, Some(key(3, 7)), &BTreeSet::new()), Some(key(1, 5)));
        assert_eq!(cscan_next(&pending, Some(key(9, 0)), &BTreeSet::new()), Some(key(1, 5)));
        let empty: BTreeMap<QueueKey, ()> = BTreeMap::new();
        assert_eq!(cscan_next(&empty, Some(key(1, 1)), &BTreeSet::new()), None);
    }

    #[test]
    fn serves_in_sweep_order_with_arrivals_behind_the_head_waiting() {
        let mut queue = DiskQueue::new();
        for block in [40, 10, 30] {
            queue.push(key(1, block), Op(false, block as u32));
        }
        let first = queue.pop_run(1).unwrap();
        assert_eq!(first.first, key(1, 10));
        // A request behind the head arrives; the sweep goes on upward first.
        queue.push(key(1, 5), Op(false, 5));
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop_run(1)).map(|run| run.first.block).collect();
        assert_eq!(order, [30, 40, 5]);
        assert_eq!(queue.len(), 0);
    }

    #[test]
    fn coalesces_adjacent_blocks_of_one_kind_and_merges_duplicates() {
        let mut queue = DiskQueue::new();
        for block in [3, 4, 5, 7] {
            queue.push(key(1, block), Op(false, block as u32));
        }
        queue.push(key(1, 4), Op(false, 99));
        queue.push(key(1, 6), Op(true, 6));
        let run = queue.pop_run(8).unwrap();
        assert_eq!(run.first, key(1, 3));
        assert!(!run.is_write);
        let sizes: Vec<usize> = run.blocks.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 2, 1]);
        let write = queue.pop_run(8).unwrap();
        assert!(write.is_write);
        assert_eq!((write.first.block, write.blocks.len()), (6, 1));
        let last = queue.pop_run(8).unwrap();
        assert_eq!((last.first.block, last.blocks.len()), (7, 1));
        assert!(queue.pop_run(8).is_none());
    }

    #[test]
    fn runs_stop_at_the_limit_and_at_another_fork() {
        let mut queue = DiskQueue::new();
        for block in 0..5 {
            queue.push(key(1, block), Op(true, 0));
        }
        queue.push(key(2, 5), Op(true, 0));
        assert_eq!(queue.pop_run(3).unwrap().blocks.len(), 3);
        let rest = queue.pop_run(3).unwrap();
        assert_eq!((rest.first.block, rest.blocks.len()), (3, 2));
        assert_eq!(queue.pop_run(3).unwrap().first, key(2, 5));
    }

    /// A step of several disk threads sharing one queue.
    #[derive(Clone, Debug)]
    enum Step {
        Push { fork: u64, block: u64, is_write: bool },
        Take { thread: usize },
        Finish { thread: usize },
    }

    fn step(threads: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (1..3u64, 0..12u64, any::<bool>()).prop_map(|(fork, block, is_write)| Step::Push { fork, block, is_write }),
            2 => (0..threads).prop_map(|thread| Step::Take { thread }),
            2 => (0..threads).prop_map(|thread| Step::Finish { thread }),
        ]
    }

    /// Several threads taking runs off one queue: what each holds, and what was served.
    struct Threads {
        queue: DiskQueue<Op>,
        held: Vec<Option<Run<Op>>>,
        queued: Vec<(QueueKey, u32)>,
        served: Vec<u32>,
        next_id: u32,
    }

    impl Threads {
        fn new(threads: usize) -> Self {
            Self {
                queue: DiskQueue::new(),
                held: (0..threads).map(|_| None).collect(),
                queued: Vec::new(),
                served: Vec::new(),
                next_id: 0,
            }
        }

        fn held_keys(&self) -> BTreeSet<QueueKey> {
            self.held.iter().flatten().flat_map(|run| run.span().keys()).collect()
        }

        fn apply(&mut self, step: &Step, run_blocks_max: usize) {
            match *step {
                Step::Push { fork, block, is_write } => {
                    let key = QueueKey { location: fork, fork_serial: fork, block };
                    self.queue.push(key, Op(is_write, self.next_id));
                    self.queued.push((key, self.next_id));
                    self.next_id += 1;
                }
                Step::Take { thread } if self.held[thread].is_none() => self.take(thread, run_blocks_max),
                Step::Finish { thread } => {
                    if let Some(run) = self.held[thread].take() {
                        self.queue.finish(run.span());
                        self.served.extend(run.blocks.iter().flatten().map(|op| op.1));
                    }
                }
                Step::Take { .. } => {}
            }
            assert_eq!(
                self.queue.len()
                    + self
                        .held
                        .iter()
                        .flatten()
                        .map(|run| run.blocks.iter().map(Vec::len).sum::<usize>())
                        .sum::<usize>()
                    + self.served.len(),
                self.queued.len()
            );
            assert_eq!(self.queue.in_flight_blocks(), self.held_keys().len());
        }

        fn take(&mut self, thread: usize, run_blocks_max: usize) {
            let busy = self.held_keys();
            let Some(run) = self.queue.pop_run(run_blocks_max) else {
                let served: BTreeSet<u32> = self
                    .served
                    .iter()
                    .copied()
                    .chain(
                        self.held.iter().flatten().flat_map(|run| run.blocks.iter().flatten().map(|op| op.1)),
                    )
                    .collect();
                let waiting = self.queued.iter().filter(|(_, id)| !served.contains(id));
                for (key, id) in waiting {
                    assert!(busy.contains(key), "op {id} at {key:?} is free, yet nothing was taken");
                }
                return;
            };
            for key in run.span().keys() {
                assert!(!busy.contains(&key), "{key:?} taken while another thread moves it");
            }
            assert!(!run.blocks.is_empty() && run.blocks.len() <= run_blocks_max);
            for ops in &run.blocks {
                assert!(!ops.is_empty() && ops.iter().all(|op| op.0 == run.is_write), "one kind per run");
            }
            self.held[thread] = Some(run);
        }

        /// Finishes every held run, then serves the rest one run at a time.
        fn drain(&mut self, run_blocks_max: usize) {
            for thread in 0..self.held.len() {
                self.apply(&Step::Finish { thread }, run_blocks_max);
            }
            while self.queue.len() > 0 {
                self.apply(&Step::Take { thread: 0 }, run_blocks_max);
                assert!(self.held[0].is_some(), "a non-empty queue with nothing in flight serves a run");
                self.apply(&Step::Finish { thread: 0 }, run_blocks_max);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn threads_never_move_one_block_at_once_and_every_op_is_served_once(
            threads in 1..5usize,
            run_blocks_max in 1..5usize,
            steps in prop::collection::vec(step(4), 1..120),
        ) {
            let mut model = Threads::new(threads);
            for step in &steps {
                let step = match *step {
                    Step::Take { thread } => Step::Take { thread: thread % threads },
                    Step::Finish { thread } => Step::Finish { thread: thread % threads },
                    ref push => push.clone(),
                };
                model.apply(&step, run_blocks_max);
            }
            model.drain(run_blocks_max);
            let mut served = model.served.clone();
            served.sort_unstable();
            prop_assert_eq!(served, (0..model.next_id).collect::<Vec<u32>>());
            prop_assert_eq!(model.queue.in_flight_blocks(), 0);
        }
    }

    #[test]
    fn a_write_back_queued_while_its_block_is_read_waits_for_the_read() {
        let mut queue = DiskQueue::new();
        queue.push(key(1, 4), Op(false, 0));
        let read = queue.pop_run(8).unwrap();
        queue.push(key(1, 4), Op(true, 1));
        queue.push(key(1, 5), Op(true, 2));
        let other = queue.pop_run(8).unwrap();
        assert_eq!((other.first.block, other.blocks.len()), (5, 1), "the run starts past block 4");
        assert!(queue.pop_run(8).is_none(), "block 4 is in flight");
        queue.finish(read.span());
        let write = queue.pop_run(8).unwrap();
        assert_eq!((write.first.block, write.is_write), (4, true));
        queue.finish(other.span());
        queue.finish(write.span());
        assert_eq!((queue.len(), queue.in_flight_blocks()), (0, 0));
    }
}
