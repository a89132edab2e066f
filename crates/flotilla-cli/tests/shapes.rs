//! Every request shape against a real cluster (metadata service + 4 servers, as processes):
//! random data written through the shape, read back byte for byte against an in-memory
//! model of every fork, blocking and non-blocking.

mod common;

use common::{random_bytes, Cluster};
use flotilla_client::{BatchNode, BatchSub, CreateOptions, Fork, Piece, Shape, StrideLevel};

/// A fork and the model of its bytes.
struct Modelled {
    fork: Fork,
    model: Vec<u8>,
}

impl Modelled {
    /// Writes `buffer` through `shape`, applies the same pieces to the model, then reads the
    /// whole fork back and compares it with the model, and reads the shape back too.
    fn check(&mut self, shape: &Shape, buffer: &[u8]) {
        let written = self.fork.write(shape, buffer).expect("write");
        let mut expected_bytes = 0;
        for piece in shape.pieces().expect("pieces") {
            let (f, m, l) = (piece.file_offset as usize, piece.memory_offset as usize, piece.length as usize);
            if self.model.len() < f + l {
                self.model.resize(f + l, 0);
            }
            self.model[f..f + l].copy_from_slice(&buffer[m..m + l]);
            expected_bytes += l as u64;
        }
        assert_eq!(written, expected_bytes);
        let mut whole = vec![0u8; self.model.len()];
        self.fork.read(&Shape::contiguous(0, whole.len() as u64), &mut whole).expect("read whole fork");
        assert!(whole == self.model, "fork differs from the model after {shape:?}");
        let mut back = vec![0u8; buffer.len()];
        self.fork.read(shape, &mut back).expect("read shape");
        for piece in shape.pieces().expect("pieces") {
            let (f, m, l) = (piece.file_offset as usize, piece.memory_offset as usize, piece.length as usize);
            assert_eq!(&back[m..m + l], &self.model[f..f + l], "piece {piece:?} read back wrong");
        }
    }
}

fn batch(
    file: i64,
    memory: i64,
    absolute: bool,
    count: u64,
    strides: (i64, i64),
    sub: BatchSub,
) -> BatchNode {
    BatchNode {
        file_offset: file,
        memory_offset: memory,
        file_absolute: absolute,
        memory_absolute: absolute,
        count,
        file_stride: strides.0,
        memory_stride: strides.1,
        sub,
    }
}

fn shapes() -> Vec<(Shape, usize)> {
    let nested_levels = vec![
        StrideLevel { file_stride: 100, memory_stride: 40, count: 5 },
        StrideLevel { file_stride: 1000, memory_stride: 200, count: 4 },
        StrideLevel { file_stride: -5000, memory_stride: 800, count: 3 },
    ];
    let inner = vec![
        batch(10, 0, false, 3, (50, 20), BatchSub::Size(20)),
        batch(200, 60, false, 2, (7, 10), BatchSub::Size(10)),
    ];
    let batched = vec![
        batch(20_000, 0, true, 3, (1000, 100), BatchSub::Vector(inner)),
        batch(-500, 300, false, 4, (-64, 16), BatchSub::Size(16)),
        batch(40_000, 400, true, 1, (0, 0), BatchSub::Size(333)),
    ];
    vec![
        (Shape::Contiguous { file_offset: 12_345, memory_offset: 7, length: 100_000 }, 100_007),
        (
            Shape::Strided {
                file_offset: 0,
                memory_offset: 0,
                record_bytes: 64,
                file_stride: 256,
                memory_stride: 64,
                count: 2000,
            },
            128_000,
        ),
        (
            Shape::Strided {
                file_offset: 90_000,
                memory_offset: 9_000,
                record_bytes: 10,
                file_stride: -300,
                memory_stride: -30,
                count: 300,
            },
            9_010,
        ),
        (
            Shape::Nested { file_offset: 10_001, memory_offset: 0, record_bytes: 40, levels: nested_levels },
            2_400,
        ),
        (Shape::Batched { nodes: batched }, 800),
        // Records long enough to be read straight into the buffer, memory descending.
        (
            Shape::Strided {
                file_offset: 1_000,
                memory_offset: 29 * 5_000,
                record_bytes: 5_000,
                file_stride: 7_000,
                memory_stride: -5_000,
                count: 30,
            },
            150_000,
        ),
        (
            Shape::List {
                pieces: vec![
                    Piece { file_offset: 300_000, memory_offset: 20_000, length: 9_000 },
                    Piece { file_offset: 10, memory_offset: 8_000, length: 12_000 },
                    Piece { file_offset: 150_000, memory_offset: 0, length: 8_000 },
                ],
            },
            29_000,
        ),
        (
            Shape::List {
                pieces: vec![
                    Piece { file_offset: 500_000, memory_offset: 0, length: 1000 },
                    Piece { file_offset: 3, memory_offset: 1000, length: 5 },
                    Piece { file_offset: 200_000, memory_offset: 1005, length: 70_000 },
                ],
            },
            71_005,
        ),
    ]
}

#[test]
fn every_shape_round_trips_on_every_server() {
    let cluster = Cluster::start(4);
    let client = cluster.client();
    let options = CreateOptions { subfiles: 4, ..CreateOptions::default() };
    let file = client.create("/shapes", &options).expect("create");
    assert_eq!(file.subfile_count(), 4);
    let servers: std::collections::HashSet<_> =
        file.entry().subfiles.iter().map(|p| p.server.clone()).collect();
    assert_eq!(servers.len(), 4, "4 subfiles must be on 4 distinct servers");
    for subfile in 0..4 {
        let mut modelled = Modelled { fork: file.fork(subfile, "data").unwrap(), model: Vec::new() };
        for (index, (shape, buffer_bytes)) in shapes().into_iter().enumerate() {
            let buffer = random_bytes(u64::from(subfile) * 100 + index as u64, buffer_bytes);
            modelled.check(&shape, &buffer);
        }
    }
}

#[test]
fn large_requests_are_split_and_packed() {
    // A strided request of 64-byte records over 96 MiB of file is larger than one request
    // may be (64 MiB), so the client splits it into packed list chunks; every byte must land.
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let file = client.create("/big", &CreateOptions::default()).unwrap();
    let fork = file.fork(0, "data").unwrap();
    let data = random_bytes(7, 96 << 20);
    fork.write(&Shape::contiguous(0, data.len() as u64), &data).unwrap();
    let count = (96 << 20) / 128;
    let shape = Shape::Strided {
        file_offset: 64,
        memory_offset: 0,
        record_bytes: 64,
        file_stride: 128,
        memory_stride: 64,
        count,
    };
    let mut buffer = vec![0u8; (count * 64) as usize];
    fork.read(&shape, &mut buffer).unwrap();
    for (k, record) in buffer.chunks(64).enumerate() {
        let at = 64 + k * 128;
        assert_eq!(record, &data[at..at + 64], "record {k}");
    }
}

#[test]
fn many_nonblocking_requests_in_flight() {
    let cluster = Cluster::start(4);
    let client = cluster.client();
    let file = client.create("/nb", &CreateOptions { subfiles: 4, ..CreateOptions::default() }).unwrap();
    let forks: Vec<Fork> = (0..4).map(|s| file.fork(s, "data").unwrap()).collect();
    // Phase 1: 256 writes in flight across 4 servers.
    let mut writes = Vec::new();
    for i in 0..256u64 {
        let fork = &forks[(i % 4) as usize];
        let data = random_bytes(i, 4096);
        writes.push(fork.write_nb(Shape::contiguous((i / 4) * 4096, 4096), data));
    }
    for handle in writes {
        assert_eq!(handle.wait().unwrap(), 4096);
    }
    // Phase 2: 256 reads in flight; test() before wait() must not lose results.
    let mut reads: Vec<_> = (0..256u64)
        .map(|i| forks[(i % 4) as usize].read_nb(Shape::contiguous((i / 4) * 4096, 4096), vec![0; 4096]))
        .collect();
    let mut finished = 0;
    while finished < reads.len() {
        finished = reads.iter_mut().map(|h| h.test()).filter(|done| *done).count();
        std::thread::yield_now();
    }
    for (i, handle) in reads.into_iter().enumerate() {
        assert_eq!(handle.wait().unwrap(), random_bytes(i as u64, 4096), "read {i}");
    }
}
