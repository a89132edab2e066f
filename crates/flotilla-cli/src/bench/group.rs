//! `flotilla bench paper group`: the four programs of the GFS-GROUP paper (Khanna & Kotz,
//! PCS-TR97-312 §4) writing and reading a matrix column by column, column `c` in the fork of
//! subfile `c % 4` (one subfile per server), on simulated disks:
//!
//! - *synchronous*: one blocking list request per column (one piece per element);
//! - *asynchronous*: the same lists non-blocking, waiting after every four columns (the
//!   hand-written code the library's overhead is measured against);
//! - *group-nosend* / *group-send*: one `group_write`/`group_read` per element, `waitio`
//!   after every four columns (the buffer holds four columns), in the two modes.
//!
//! A write's time includes syncing the four forks (the paper stopped its timer after
//! flushing Galley's disk caches); every read starts with the servers restarted, so it comes
//! from the (simulated) disks. The data read is checked after the timer stops.

use super::cluster::Cluster;
use super::CommonArgs;
use flotilla_client::{Client, CreateOptions, Fork, Group, GroupConfig, GroupMode, Layout, Piece, Shape};
use std::time::Instant;

/// Subfiles (servers) the matrix is striped over, by column (the paper's four IOPs).
const SERVERS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    Synchronous,
    Asynchronous,
    GroupNoSend,
    GroupSend,
}

pub const PROGRAMS: [Program; 4] =
    [Program::Synchronous, Program::Asynchronous, Program::GroupNoSend, Program::GroupSend];

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Program::Synchronous => "synchronous",
            Program::Asynchronous => "asynchronous",
            Program::GroupNoSend => "group-nosend",
            Program::GroupSend => "group-send",
        }
    }
}

/// One matrix: `order` × `order` elements of `element_bytes`.
#[derive(Clone, Copy, Debug)]
pub struct Matrix {
    pub order: u64,
    pub element_bytes: u64,
}

impl Matrix {
    pub fn label(self) -> String {
        format!("{0}x{0}x{1}B", self.order, self.element_bytes)
    }

    fn column_bytes(self) -> u64 {
        self.order * self.element_bytes
    }

    /// Where column `c` lives: its fork and its first byte there.
    fn place(self, c: u64) -> (usize, u64) {
        ((c % SERVERS as u64) as usize, (c / SERVERS as u64) * self.column_bytes())
    }

    /// The list request of one column at `memory_offset` in a buffer.
    fn column_shape(self, c: u64, memory_offset: u64) -> Shape {
        let (_, file_offset) = self.place(c);
        let pieces = (0..self.order)
            .map(|r| Piece {
                file_offset: file_offset + r * self.element_bytes,
                memory_offset: memory_offset + r * self.element_bytes,
                length: self.element_bytes,
            })
            .collect();
        Shape::List { pieces }
    }
}

/// The bytes of column `c` (deterministic, different per column and row).
fn fill_column(matrix: Matrix, c: u64, out: &mut [u8]) {
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (c as usize).wrapping_mul(131).wrapping_add(i.wrapping_mul(7)).wrapping_add(i >> 9) as u8;
    }
    debug_assert_eq!(out.len() as u64, matrix.column_bytes());
}

/// Measured seconds of one program on one matrix.
#[derive(Clone, Debug)]
pub struct Timing {
    pub program: Program,
    pub write_s: Vec<f64>,
    pub read_s: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

impl Timing {
    pub fn write_median_s(&self) -> f64 {
        median(&self.write_s)
    }

    pub fn read_median_s(&self) -> f64 {
        median(&self.read_s)
    }
}

fn forks(client: &Client, path: &str) -> anyhow::Result<Vec<Fork>> {
    let options = CreateOptions {
        subfiles: SERVERS as u32,
        layout: Some(Layout::Explicit),
        ..CreateOptions::default()
    };
    let file = client.create(path, &options)?;
    (0..SERVERS as u32).map(|s| file.fork(s, "data").map_err(anyhow::Error::from)).collect()
}

fn group_config(program: Program) -> GroupConfig {
    let mode = if program == Program::GroupSend { GroupMode::Send } else { GroupMode::NoSend };
    GroupConfig { mode, ..GroupConfig::default() }
}

/// Writes the whole matrix with `program`, then syncs the forks.
fn write(program: Program, matrix: Matrix, forks: &[Fork]) -> anyhow::Result<()> {
    let column = matrix.column_bytes() as usize;
    let mut buffer = vec![0u8; SERVERS * column];
    for first in (0..matrix.order).step_by(SERVERS) {
        let columns: Vec<u64> = (first..(first + SERVERS as u64).min(matrix.order)).collect();
        for (k, &c) in columns.iter().enumerate() {
            fill_column(matrix, c, &mut buffer[k * column..(k + 1) * column]);
        }
        match program {
            Program::Synchronous => {
                for (k, &c) in columns.iter().enumerate() {
                    let (fork, _) = matrix.place(c);
                    forks[fork].write(&matrix.column_shape(c, (k * column) as u64), &buffer)?;
                }
            }
            Program::Asynchronous => {
                let handles: Vec<_> = columns
                    .iter()
                    .enumerate()
                    .map(|(k, &c)| {
                        let (fork, _) = matrix.place(c);
                        let shape = matrix.column_shape(c, 0);
                        forks[fork].write_nb(shape, buffer[k * column..(k + 1) * column].to_vec())
                    })
                    .collect();
                for handle in handles {
                    handle.wait()?;
                }
            }
            Program::GroupNoSend | Program::GroupSend => {
                let mut group = Group::new(group_config(program));
                for (k, &c) in columns.iter().enumerate() {
                    let (fork, start) = matrix.place(c);
                    for r in 0..matrix.order {
                        let at = k * column + (r * matrix.element_bytes) as usize;
                        let element = &buffer[at..at + matrix.element_bytes as usize];
                        group.group_write(&forks[fork], start + r * matrix.element_bytes, element)?;
                    }
                }
                group.waitio()?;
            }
        }
    }
    for fork in forks {
        fork.sync()?;
    }
    Ok(())
}

/// Reads the whole matrix with `program`; returns the number of columns that differ.
fn read(program: Program, matrix: Matrix, forks: &[Fork]) -> anyhow::Result<u64> {
    let column = matrix.column_bytes() as usize;
    let mut buffer = vec![0u8; SERVERS * column];
    let mut expected = vec![0u8; column];
    let mut wrong = 0;
    for first in (0..matrix.order).step_by(SERVERS) {
        let columns: Vec<u64> = (first..(first + SERVERS as u64).min(matrix.order)).collect();
        match program {
            Program::Synchronous => {
                for (k, &c) in columns.iter().enumerate() {
                    let (fork, _) = matrix.place(c);
                    forks[fork].read(&matrix.column_shape(c, (k * column) as u64), &mut buffer)?;
                }
            }
            Program::Asynchronous => {
                let handles: Vec<_> = columns
                    .iter()
                    .map(|&c| {
                        let (fork, _) = matrix.place(c);
                        forks[fork].read_nb(matrix.column_shape(c, 0), vec![0u8; column])
                    })
                    .collect();
                for (k, handle) in handles.into_iter().enumerate() {
                    buffer[k * column..(k + 1) * column].copy_from_slice(&handle.wait()?);
                }
            }
            Program::GroupNoSend | Program::GroupSend => {
                let mut group = Group::new(group_config(program));
                for (c, chunk) in columns.iter().zip(buffer.chunks_mut(column)) {
                    let (fork, start) = matrix.place(*c);
                    for (r, element) in chunk.chunks_mut(matrix.element_bytes as usize).enumerate() {
                        group.group_read(&forks[fork], start + r as u64 * matrix.element_bytes, element)?;
                    }
                }
                group.finish()?;
            }
        }
        for (k, &c) in columns.iter().enumerate() {
            fill_column(matrix, c, &mut expected);
            wrong += u64::from(buffer[k * column..(k + 1) * column] != expected[..]);
        }
    }
    Ok(wrong)
}

/// Runs every program on `matrix` `runs` times on the cluster (restarted before each read).
pub fn measure(
    cluster: &mut Cluster,
    common: &CommonArgs,
    matrix: Matrix,
    runs: usize,
) -> anyhow::Result<Vec<Timing>> {
    let mut timings: Vec<Timing> =
        PROGRAMS.iter().map(|&program| Timing { program, write_s: Vec::new(), read_s: Vec::new() }).collect();
    for run in 0..runs {
        for timing in timings.iter_mut() {
            let client = cluster.client()?;
            let path =
                format!("/group-{}-{}-{run}-{}", matrix.label(), timing.program.name(), std::process::id());
            let forks = forks(&client, &path)?;
            let began = Instant::now();
            write(timing.program, matrix, &forks)?;
            timing.write_s.push(began.elapsed().as_secs_f64());
            drop((forks, client));
            if common.meta.is_none() {
                cluster.cold_start()?;
            }
            let client = cluster.client()?;
            let file = client.open(&path)?;
            let forks: Vec<Fork> =
                (0..SERVERS as u32).map(|s| file.fork(s, "data")).collect::<Result<_, _>>()?;
            let began = Instant::now();
            let wrong = read(timing.program, matrix, &forks)?;
            timing.read_s.push(began.elapsed().as_secs_f64());
            anyhow::ensure!(
                wrong == 0,
                "{}: {wrong} columns of {} read back wrong",
                timing.program.name(),
                path
            );
            drop(file);
            client.remove(&path)?;
        }
    }
    Ok(timings)
}
