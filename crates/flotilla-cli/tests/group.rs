//! GFS-GROUP against a real cluster: random sequences of group calls over forks and linear
//! files checked byte for byte against a reference model; mixing reads and writes refused.

mod common;

use common::{random_bytes, Cluster};
use flotilla_client::{
    Client, CreateOptions, Direction, Fork, Group, GroupConfig, GroupError, GroupMode, GroupTarget, Layout,
    RawBuffer,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of each target the random calls address.
const REGION_BYTES: u64 = 48 << 10;
const REQUEST_BYTES_MAX: u64 = 2500;

#[derive(Clone, Debug)]
enum Op {
    Write { target: usize, offset: u64, length: u64, seed: u64 },
    Read { target: usize, offset: u64, length: u64 },
    Doneio,
    Testio,
    Waitio,
    Mode(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let place = (0usize..TARGETS, 0..REGION_BYTES - REQUEST_BYTES_MAX, 0..REQUEST_BYTES_MAX);
    prop_oneof![
        6 => (place.clone(), any::<u64>())
            .prop_map(|((target, offset, length), seed)| Op::Write { target, offset, length, seed }),
        6 => place.prop_map(|(target, offset, length)| Op::Read { target, offset, length }),
        1 => Just(Op::Doneio),
        2 => Just(Op::Testio),
        1 => Just(Op::Waitio),
        1 => any::<bool>().prop_map(Op::Mode),
    ]
}

/// Two forks of one explicit file (on different servers), one extra fork beside the first,
/// a striped and a hashed linear file.
const TARGETS: usize = 5;

struct Targets {
    forks: Vec<Fork>,
    files: Vec<flotilla_client::File>,
}

impl Targets {
    fn create(client: &Client, case: u64) -> Targets {
        let explicit =
            CreateOptions { subfiles: 2, layout: Some(Layout::Explicit), ..CreateOptions::default() };
        let file = client.create(&format!("/forks-{case}"), &explicit).unwrap();
        let forks = vec![
            file.fork(0, "data").unwrap(),
            file.fork(1, "data").unwrap(),
            file.create_fork(0, "extra").unwrap(),
        ];
        let striped = CreateOptions {
            subfiles: 3,
            layout: Some(Layout::Stripe { unit_bytes: 4096, count: 0 }),
            ..CreateOptions::default()
        };
        let hashed = CreateOptions {
            subfiles: 3,
            layout: Some(Layout::Hash { block_bytes: 8192, sequentiality: 1, count: 0 }),
            ..CreateOptions::default()
        };
        let files = vec![
            client.create(&format!("/striped-{case}"), &striped).unwrap(),
            client.create(&format!("/hashed-{case}"), &hashed).unwrap(),
        ];
        Targets { forks, files }
    }

    fn get(&self, index: usize) -> GroupTarget<'_> {
        match self.forks.get(index) {
            Some(fork) => GroupTarget::Fork(fork),
            None => GroupTarget::File(&self.files[index - self.forks.len()]),
        }
    }
}

/// A read the model expects: where it landed and what it must hold.
struct ExpectedRead {
    buffer: Box<[u8]>,
    expected: Vec<u8>,
    what: String,
}

/// The reference model and the caller's side of the contract (no request overlaps an
/// unfinished write; a read is checked once `waitio` returned).
struct Driver {
    model: Vec<Vec<u8>>,
    unsettled_writes: Vec<(usize, u64, u64)>,
    unsettled_reads: Vec<(usize, u64, u64)>,
    reads: Vec<ExpectedRead>,
    direction: Option<Direction>,
}

fn overlaps(list: &[(usize, u64, u64)], target: usize, offset: u64, length: u64) -> bool {
    list.iter().any(|&(t, o, l)| t == target && o < offset + length && offset < o + l)
}

impl Driver {
    fn new() -> Driver {
        Driver {
            model: vec![vec![0; REGION_BYTES as usize]; TARGETS],
            unsettled_writes: Vec::new(),
            unsettled_reads: Vec::new(),
            reads: Vec::new(),
            direction: None,
        }
    }

    fn waitio(&mut self, group: &mut Group<'static>) -> Result<(), TestCaseError> {
        group.waitio().map_err(|e| TestCaseError::fail(format!("waitio: {e}")))?;
        self.unsettled_writes.clear();
        self.unsettled_reads.clear();
        for read in self.reads.drain(..) {
            prop_assert!(read.buffer[..] == read.expected[..], "{} differs from the model", read.what);
        }
        Ok(())
    }

    /// Calls doneio first when the group goes the other way, after checking it refuses.
    fn turn(
        &mut self,
        group: &mut Group<'static>,
        targets: &Targets,
        wanted: Direction,
    ) -> Result<(), TestCaseError> {
        if self.direction.is_some_and(|d| d != wanted) {
            let refused = match wanted {
                Direction::Read => {
                    let mut one = [0u8; 1];
                    // SAFETY: the request is refused, so the group never keeps the buffer.
                    unsafe { group.group_read_raw(targets.get(0), 0, RawBuffer::new(one.as_mut_ptr(), 1)) }
                }
                Direction::Write => group.group_write(targets.get(0), 0, &[1]),
            };
            match refused {
                Err(GroupError::Mixed { current, wanted: w, .. }) => {
                    prop_assert_eq!(Some(current), self.direction);
                    prop_assert_eq!(w, wanted);
                }
                other => prop_assert!(false, "mixing was not refused: {other:?}"),
            }
            group.doneio().map_err(|e| TestCaseError::fail(format!("doneio: {e}")))?;
        }
        self.direction = Some(wanted);
        Ok(())
    }

    fn apply(&mut self, group: &mut Group<'static>, targets: &Targets, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write { target, offset, length, seed } => {
                if overlaps(&self.unsettled_writes, target, offset, length)
                    || overlaps(&self.unsettled_reads, target, offset, length)
                {
                    self.waitio(group)?;
                }
                self.turn(group, targets, Direction::Write)?;
                let data = random_bytes(seed, length as usize);
                group
                    .group_write(targets.get(target), offset, &data)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                self.model[target][offset as usize..(offset + length) as usize].copy_from_slice(&data);
                self.unsettled_writes.push((target, offset, length));
            }
            Op::Read { target, offset, length } => {
                if overlaps(&self.unsettled_writes, target, offset, length) {
                    self.waitio(group)?;
                }
                self.turn(group, targets, Direction::Read)?;
                let mut buffer = vec![0xEEu8; length as usize].into_boxed_slice();
                // SAFETY: the box's memory does not move when the box does; the driver keeps it
                // in `reads` untouched until waitio returned (or the group is dropped first).
                let raw = unsafe { RawBuffer::new(buffer.as_mut_ptr(), buffer.len()) };
                unsafe { group.group_read_raw(targets.get(target), offset, raw) }
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let expected = self.model[target][offset as usize..(offset + length) as usize].to_vec();
                let what = format!("read of {length} bytes at {offset} of target {target}");
                self.reads.push(ExpectedRead { buffer, expected, what });
                self.unsettled_reads.push((target, offset, length));
            }
            Op::Doneio => {
                group.doneio().map_err(|e| TestCaseError::fail(format!("doneio: {e}")))?;
                self.direction = None;
            }
            Op::Testio => {
                let done = group.testio().map_err(|e| TestCaseError::fail(format!("testio: {e}")))?;
                if done {
                    self.waitio(group)?;
                }
            }
            Op::Waitio => self.waitio(group)?,
            Op::Mode(send) => {
                let mode = if send { GroupMode::Send } else { GroupMode::NoSend };
                group.set_config(GroupConfig { mode, ..group.config().clone() });
            }
        }
        Ok(())
    }
}

fn config() -> impl Strategy<Value = GroupConfig> {
    (1usize..12, 500u64..20_000, any::<bool>(), any::<bool>()).prop_map(|(requests, bytes, send, batch)| {
        GroupConfig {
            mode: if send { GroupMode::Send } else { GroupMode::NoSend },
            pending_requests_max: requests,
            pending_bytes_max: bytes,
            submitted_bytes_max: 64 << 10,
            batch_across_forks: batch,
        }
    })
}

#[test]
fn random_group_calls_match_the_model() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    let cases = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 12,
        max_shrink_iters: 20,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (config(), proptest::collection::vec(op(), 10..80));
    runner
        .run(&strategy, |(config, ops)| {
            let targets = Targets::create(&client, cases.fetch_add(1, Ordering::Relaxed));
            let mut driver = Driver::new();
            let mut group = Group::new(config);
            for op in ops {
                driver.apply(&mut group, &targets, op)?;
            }
            driver.waitio(&mut group)?;
            // Everything reads back as the model says, through plain (non-group) reads.
            for (index, model) in driver.model.iter().enumerate() {
                let mut back = vec![0u8; REGION_BYTES as usize];
                match targets.get(index) {
                    GroupTarget::Fork(fork) => {
                        fork.read(&flotilla_client::Shape::contiguous(0, REGION_BYTES), &mut back).unwrap();
                    }
                    GroupTarget::File(file) => {
                        file.read_shape(&flotilla_client::Shape::contiguous(0, REGION_BYTES), &mut back)
                            .unwrap();
                    }
                }
                prop_assert!(&back == model, "target {} differs from the model", index);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn borrowed_buffers_and_thresholds_on_a_real_cluster() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    let explicit = CreateOptions { subfiles: 2, layout: Some(Layout::Explicit), ..CreateOptions::default() };
    let file = client.create("/matrix", &explicit).unwrap();
    let columns = [file.fork(0, "data").unwrap(), file.fork(1, "data").unwrap()];
    // Write 2 columns of 100 16-byte elements, element by element, paper style.
    let config = GroupConfig { pending_requests_max: 30, ..GroupConfig::default() };
    let mut group = Group::new(config.clone());
    let matrix = random_bytes(5, 2 * 100 * 16);
    for (c, column) in columns.iter().enumerate() {
        for row in 0..100 {
            let at = (c * 100 + row) * 16;
            group.group_write(column, row as u64 * 16, &matrix[at..at + 16]).unwrap();
        }
    }
    let stats = group.finish().unwrap();
    assert_eq!(stats.requests, 200);
    // Per column: 3 threshold submissions of 30 and one at the column change (or doneio).
    assert_eq!(stats.lists, 8, "{stats:?}");
    // Read it back into one borrowed buffer; the buffer is ours again after finish.
    let mut back = vec![0u8; matrix.len()];
    let mut group = Group::new(GroupConfig { batch_across_forks: true, ..config });
    for (c, chunk) in back.chunks_mut(100 * 16).enumerate() {
        for (row, element) in chunk.chunks_mut(16).enumerate() {
            group.group_read(&columns[c], row as u64 * 16, element).unwrap();
        }
    }
    let refused = group.group_write(&columns[0], 0, &[0; 16]).unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("request 200") && message.contains("doneio"), "{message}");
    let stats = group.finish().unwrap();
    assert_eq!(stats.requests, 200, "the refused request is not counted");
    // Batched across forks, the column change does not submit: requests 91..120 (both forks)
    // go in one submission of two lists; 7 submissions, 8 lists (the paper's way: 8 and 8).
    assert_eq!((stats.submissions, stats.lists), (7, 8), "{stats:?}");
    assert!(back == matrix, "group reads differ from what the group wrote");
}

#[test]
fn a_failed_request_is_named_at_waitio() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let file = client
        .create("/one", &CreateOptions { layout: Some(Layout::Explicit), ..CreateOptions::default() })
        .unwrap();
    let missing = file.fork(0, "missing").unwrap();
    let present = file.fork(0, "data").unwrap();
    let mut group = Group::new(GroupConfig::default());
    group.group_write(&present, 0, &[1; 10]).unwrap();
    group.group_write(&missing, 4096, &[2; 10]).unwrap();
    group.group_write(&missing, 8192, &[3; 10]).unwrap();
    group.group_write(&present, 50, &[]).unwrap();
    let error = group.waitio().unwrap_err();
    match &error {
        GroupError::Failed { first, more_failed_lists } => {
            assert_eq!((first.index, first.offset, first.size_bytes, first.list_requests), (1, 4096, 10, 2));
            assert!(first.target.contains("missing"), "{}", first.target);
            assert_eq!(*more_failed_lists, 0);
        }
        other => panic!("unexpected error {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains("request 1") && message.contains("offset 4096"), "{message}");
    assert!(group.waitio().is_ok(), "a failure is reported once");
    // Requests of 0 bytes count but move nothing, in either direction.
    group.doneio().unwrap();
    let (mut empty, mut ten, mut none) = ([0u8; 0], [0u8; 10], [0u8; 0]);
    group.group_read(&present, 0, &mut empty).unwrap();
    group.group_read(&present, 0, &mut ten).unwrap();
    group.group_read(&present, 1 << 20, &mut none).unwrap();
    let stats = group.finish().unwrap();
    assert_eq!(stats.requests, 7);
    assert_eq!(ten, [1; 10]);
}
