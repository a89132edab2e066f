//! The workloads' access patterns as data: for one point (`PointSpec`) and one client, the
//! requests it makes, in order. Pure functions, shared by the driver (setup, checking) and
//! the client processes (execution), and checked byte for byte against reference
//! definitions in the tests below.
//!
//! - Galley §6.2 (per fork): `broadcast` — every client reads every record; `partitioned` —
//!   client c takes the c-th contiguous 1/C of the records; `interleaved` — records c, c+C,
//!   c+2C, …. `traditional`: one request per record, one outstanding per fork (a stream per
//!   fork, §6.3); `strided`: one request per fork (§6.4).
//! - GPFS §3.1 (one shared linear file): `segmented` — client c moves the c-th contiguous
//!   1/C of the file in transfers of T bytes; `strided` — transfers c, c+C, …; and
//!   `file-per-process` — each client its own file of 1/C of the bytes.
//! - RAMA Fig. 7-1: whole-file transfers in iterations, a barrier after each;
//!   `iteration` order — iteration i, node n moves chunk i·N + n; `node` order — node n moves
//!   chunk i of its own 1/N of the file. Fig. 5-7: strided access with computation, I/O of
//!   one iteration overlapping its think time. Fig. 5-8: out-of-core LU on a column-major
//!   matrix of `column_blocks` blocks.

use flotilla_client::{Layout, Shape};
use serde::{Deserialize, Serialize};

/// Seed of the data a file holds after setup.
pub const SEED_INITIAL: u64 = 1;
/// Seed of the data the benchmark writes.
pub const SEED_WRITTEN: u64 = 2;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Read,
    Overwrite,
    Write,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GalleyPattern {
    Broadcast,
    Partitioned,
    Interleaved,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Interface {
    Traditional,
    Strided,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GpfsPattern {
    Segmented,
    Strided,
    FilePerProcess,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RamaOrder {
    Iteration,
    Node,
}

/// Galley's experiments: a file with one subfile per server, addressed fork by fork.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GalleySpec {
    pub pattern: GalleyPattern,
    pub interface: Interface,
    pub op: Op,
    pub record_bytes: u64,
    pub fork_bytes: u64,
    pub subfiles: u32,
}

/// GPFS's experiments: linear files striped over all servers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpfsSpec {
    pub pattern: GpfsPattern,
    pub op: Op,
    pub transfer_bytes: u64,
    /// Bytes over all clients.
    pub file_bytes: u64,
    pub stripe_unit_bytes: u64,
    pub subfiles: u32,
}

/// RAMA's whole-file transfer (Fig. 7-1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RamaWholeSpec {
    pub order: RamaOrder,
    pub op: Op,
    pub layout: String,
    pub chunk_bytes: u64,
    pub file_bytes: u64,
    pub subfiles: u32,
}

/// RAMA's strided access with computation (Fig. 5-7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RamaStridedSpec {
    pub order: RamaOrder,
    pub op: Op,
    pub layout: String,
    pub request_bytes: u64,
    pub chunks_per_iteration: u64,
    pub chunk_delta_bytes: u64,
    pub iterations: u64,
    pub think_us: u64,
    pub subfiles: u32,
}

/// RAMA's out-of-core LU decomposition (Fig. 5-8).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RamaLuSpec {
    pub layout: String,
    /// Matrix order (rows = columns), elements of 8 bytes.
    pub order: u64,
    /// Columns per block (what fits in a quarter of a node's memory).
    pub block_columns: u64,
    /// Computation per block update.
    pub think_us: u64,
    pub subfiles: u32,
}

/// RAMA's climate model skeleton (GATOR, §5.2.3 and Fig. 7-8): every iteration the clients,
/// a `mesh_columns` × (clients / mesh_columns) processor mesh, read one snapshot of a
/// longitude-major grid in blocks dealt block-cyclically (Fig. 5-9), overlapping the reads
/// with the computation on the cells.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RamaGatorSpec {
    pub layout: String,
    pub longitudes: u64,
    pub latitudes: u64,
    pub cell_bytes: u64,
    /// A block of the block-cyclic layout: longitudes × latitudes.
    pub block_longitudes: u64,
    pub block_latitudes: u64,
    pub mesh_columns: u64,
    pub iterations: u64,
    /// Computation per cell per iteration.
    pub think_us_per_cell: u64,
    pub subfiles: u32,
}

/// One measured point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "workload", rename_all = "kebab-case")]
pub enum PointSpec {
    Galley(GalleySpec),
    Gpfs(GpfsSpec),
    RamaWhole(RamaWholeSpec),
    RamaStrided(RamaStridedSpec),
    RamaLu(RamaLuSpec),
    RamaGator(RamaGatorSpec),
    /// A `pread` loop over fork files on the local disk (Galley interleaved reads).
    Pread {
        paths: Vec<String>,
        record_bytes: u64,
        fork_bytes: u64,
    },
}

/// What a request addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The `data` fork of a subfile.
    Fork(u32),
    /// The linear file.
    Linear,
    /// A local file, by index in `PointSpec::Pread::paths`.
    Local(u32),
}

/// One request; memory offsets of its shape are relative to its own buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Io {
    pub place: Place,
    pub shape: Shape,
    pub write: bool,
    /// Data seed: what a write stores, what a read expects.
    pub seed: u64,
    /// Issued without waiting; a later `Wait` collects it.
    pub nonblocking: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Io(Io),
    /// Waits for every non-blocking request of this stream.
    Wait,
    Think {
        us: u64,
    },
    /// Waits until every client reaches the same barrier.
    Barrier,
}

/// How a client gets at its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// Opens the existing file.
    Open,
    /// Creates the file (inside the measured time).
    Create,
    /// Opens the file once another client has created it.
    AwaitCreate,
    /// Uses local files only.
    Local,
}

/// Everything one client does.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientPlan {
    pub path: String,
    pub opening: Opening,
    /// Streams run concurrently, each one step at a time.
    pub streams: Vec<Vec<Step>>,
    /// Sync what was written before closing (writes count only once on the disks).
    pub sync_at_end: bool,
}

impl PointSpec {
    pub fn name(&self) -> &'static str {
        match self {
            PointSpec::Galley(_) => "galley",
            PointSpec::Gpfs(_) => "gpfs",
            PointSpec::RamaWhole(_) => "rama-whole",
            PointSpec::RamaStrided(_) => "rama-strided",
            PointSpec::RamaLu(_) => "rama-lu",
            PointSpec::RamaGator(_) => "rama-gator",
            PointSpec::Pread { .. } => "pread",
        }
    }

    /// Whether the points' files must hold data before the clients run.
    pub fn needs_initial_data(&self) -> bool {
        match self {
            PointSpec::Galley(spec) => spec.op != Op::Write,
            PointSpec::Gpfs(spec) => spec.op == Op::Read,
            PointSpec::RamaWhole(spec) => spec.op != Op::Write,
            PointSpec::RamaStrided(spec) => spec.op != Op::Write,
            PointSpec::RamaLu(_) => true,
            PointSpec::RamaGator(_) => true,
            PointSpec::Pread { .. } => true,
        }
    }

    pub fn writes(&self) -> bool {
        match self {
            PointSpec::Galley(spec) => spec.op != Op::Read,
            PointSpec::Gpfs(spec) => spec.op != Op::Read,
            PointSpec::RamaWhole(spec) => spec.op != Op::Read,
            PointSpec::RamaStrided(spec) => spec.op != Op::Read,
            PointSpec::RamaLu(_) => true,
            PointSpec::RamaGator(_) => false,
            PointSpec::Pread { .. } => false,
        }
    }

    /// Bytes of the linear file or of each fork after setup.
    pub fn file_bytes(&self, clients: u64) -> u64 {
        match self {
            PointSpec::Galley(spec) => spec.fork_bytes,
            PointSpec::Gpfs(spec) => spec.file_bytes,
            PointSpec::RamaWhole(spec) => spec.file_bytes,
            PointSpec::RamaStrided(spec) => strided_file_bytes(spec, clients),
            PointSpec::RamaLu(spec) => spec.order * spec.order * 8,
            PointSpec::RamaGator(spec) => gator_snapshot_bytes(spec) * spec.iterations,
            PointSpec::Pread { fork_bytes, .. } => *fork_bytes,
        }
    }

    /// Checks that the sizes divide as the pattern needs.
    pub fn check(&self, clients: u64) -> Result<(), String> {
        let divides = |what: &str, total: u64, unit: u64| {
            if unit == 0 || total == 0 || !total.is_multiple_of(unit) {
                Err(format!("{what} ({total}) must be a positive multiple of {unit}"))
            } else {
                Ok(())
            }
        };
        if clients == 0 {
            return Err("at least one client is needed".into());
        }
        match self {
            PointSpec::Galley(spec) => {
                if spec.pattern == GalleyPattern::Broadcast && spec.op != Op::Read {
                    return Err("the broadcast pattern is read only (Galley §6.2)".into());
                }
                divides("fork bytes", spec.fork_bytes, spec.record_bytes * clients)
            }
            PointSpec::Gpfs(spec) => divides("file bytes", spec.file_bytes, spec.transfer_bytes * clients),
            PointSpec::RamaWhole(spec) => divides("file bytes", spec.file_bytes, spec.chunk_bytes * clients),
            PointSpec::RamaStrided(spec) => divides("request bytes", spec.request_bytes, 1),
            PointSpec::RamaLu(spec) => divides("matrix order", spec.order, spec.block_columns),
            PointSpec::RamaGator(spec) => {
                divides("clients", clients, spec.mesh_columns)?;
                divides("longitudes", spec.longitudes, spec.block_longitudes * spec.mesh_columns)?;
                divides("latitudes", spec.latitudes, spec.block_latitudes * (clients / spec.mesh_columns))?;
                divides("cell bytes", spec.cell_bytes, 1)
            }
            PointSpec::Pread { record_bytes, fork_bytes, .. } => {
                divides("fork bytes", *fork_bytes, record_bytes * clients)
            }
        }
    }
}

/// The plan of `client` of `clients` for a point on the file at `path`.
pub fn client_plan(spec: &PointSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    assert!(client < clients, "client {client} of {clients}");
    match spec {
        PointSpec::Galley(spec) => galley(spec, path, client, clients),
        PointSpec::Gpfs(spec) => gpfs(spec, path, client, clients),
        PointSpec::RamaWhole(spec) => rama_whole(spec, path, client, clients),
        PointSpec::RamaStrided(spec) => rama_strided(spec, path, client, clients),
        PointSpec::RamaLu(spec) => rama_lu(spec, path, client, clients),
        PointSpec::RamaGator(spec) => rama_gator(spec, path, client, clients),
        PointSpec::Pread { paths, record_bytes, fork_bytes } => {
            pread(paths.len() as u32, *record_bytes, *fork_bytes, client, clients)
        }
    }
}

/// The path of the file a client uses (its own for file-per-process).
pub fn client_path(spec: &PointSpec, path: &str, client: u64) -> String {
    match spec {
        PointSpec::Gpfs(GpfsSpec { pattern: GpfsPattern::FilePerProcess, .. }) => format!("{path}.{client}"),
        _ => path.to_string(),
    }
}

/// The records of a fork a Galley client touches: (first, count, step) in record units.
pub fn galley_records(pattern: GalleyPattern, records: u64, client: u64, clients: u64) -> (u64, u64, u64) {
    match pattern {
        GalleyPattern::Broadcast => (0, records, 1),
        GalleyPattern::Partitioned => (client * records / clients, records / clients, 1),
        GalleyPattern::Interleaved => (client, records / clients, clients),
    }
}

fn galley(spec: &GalleySpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let record = spec.record_bytes;
    let (first, count, step) = galley_records(spec.pattern, spec.fork_bytes / record, client, clients);
    let write = spec.op != Op::Read;
    let seed = if write { SEED_WRITTEN } else { SEED_INITIAL };
    let streams = (0..spec.subfiles)
        .map(|subfile| {
            let io =
                |shape| Step::Io(Io { place: Place::Fork(subfile), shape, write, seed, nonblocking: false });
            match spec.interface {
                Interface::Traditional => {
                    (0..count).map(|k| io(Shape::contiguous((first + k * step) * record, record))).collect()
                }
                Interface::Strided if step == 1 => {
                    vec![io(Shape::contiguous(first * record, count * record))]
                }
                Interface::Strided => vec![io(Shape::Strided {
                    file_offset: first * record,
                    memory_offset: 0,
                    record_bytes: record,
                    file_stride: (step * record) as i64,
                    memory_stride: record as i64,
                    count,
                })],
            }
        })
        .collect();
    ClientPlan { path: path.to_string(), opening: Opening::Open, streams, sync_at_end: write }
}

fn gpfs(spec: &GpfsSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let transfer = spec.transfer_bytes;
    let blocks = spec.file_bytes / transfer;
    let per_client = blocks / clients;
    let write = spec.op != Op::Read;
    let seed = if write { SEED_WRITTEN } else { SEED_INITIAL };
    let offsets: Vec<u64> = match spec.pattern {
        GpfsPattern::Segmented => (0..per_client).map(|k| (client * per_client + k) * transfer).collect(),
        GpfsPattern::Strided => (0..per_client).map(|k| (k * clients + client) * transfer).collect(),
        GpfsPattern::FilePerProcess => (0..per_client).map(|k| k * transfer).collect(),
    };
    let steps = offsets
        .into_iter()
        .map(|offset| {
            let shape = Shape::contiguous(offset, transfer);
            Step::Io(Io { place: Place::Linear, shape, write, seed, nonblocking: false })
        })
        .collect();
    let opening = match (spec.pattern, write) {
        (_, false) => Opening::Open,
        (GpfsPattern::FilePerProcess, true) => Opening::Create,
        (_, true) if client == 0 => Opening::Create,
        (_, true) => Opening::AwaitCreate,
    };
    ClientPlan {
        path: client_path(&PointSpec::Gpfs(spec.clone()), path, client),
        opening,
        streams: vec![steps],
        sync_at_end: write,
    }
}

fn rama_whole(spec: &RamaWholeSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let chunk = spec.chunk_bytes;
    let iterations = spec.file_bytes / (chunk * clients);
    let write = spec.op != Op::Read;
    let seed = if write { SEED_WRITTEN } else { SEED_INITIAL };
    let mut steps = Vec::with_capacity(iterations as usize * 2);
    for iteration in 0..iterations {
        let offset = match spec.order {
            RamaOrder::Iteration => (iteration * clients + client) * chunk,
            RamaOrder::Node => client * (spec.file_bytes / clients) + iteration * chunk,
        };
        let shape = Shape::contiguous(offset, chunk);
        steps.push(Step::Io(Io { place: Place::Linear, shape, write, seed, nonblocking: false }));
        steps.push(Step::Barrier);
    }
    ClientPlan { path: path.to_string(), opening: Opening::Open, streams: vec![steps], sync_at_end: write }
}

/// Node and iteration deltas of the strided model for an access order.
fn strided_deltas(spec: &RamaStridedSpec, clients: u64) -> (u64, u64) {
    let per_iteration = spec.request_bytes * spec.chunks_per_iteration.max(1);
    match spec.order {
        RamaOrder::Node => (per_iteration * spec.iterations, per_iteration),
        RamaOrder::Iteration => (per_iteration, per_iteration * clients),
    }
}

fn strided_file_bytes(spec: &RamaStridedSpec, clients: u64) -> u64 {
    let per_iteration = spec.request_bytes * spec.chunks_per_iteration.max(1);
    per_iteration * spec.iterations * clients + spec.chunk_delta_bytes * spec.chunks_per_iteration
}

fn rama_strided(spec: &RamaStridedSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let (node_delta, iteration_delta) = strided_deltas(spec, clients);
    let write = spec.op != Op::Read;
    let seed = if write { SEED_WRITTEN } else { SEED_INITIAL };
    let chunk_delta = if spec.chunk_delta_bytes == 0 { spec.request_bytes } else { spec.chunk_delta_bytes };
    let mut steps = Vec::new();
    let mut first_offset = client * node_delta;
    for _ in 0..spec.iterations {
        // Fig. 5-7 exactly: the offset advances before each chunk; chunk_delta defaults to
        // the request size, so chunk j of an iteration is at first + j·request.
        let mut offset = first_offset;
        for _ in 0..spec.chunks_per_iteration.max(1) {
            let shape = Shape::contiguous(offset, spec.request_bytes);
            steps.push(Step::Io(Io { place: Place::Linear, shape, write, seed, nonblocking: true }));
            offset += chunk_delta;
        }
        steps.push(Step::Think { us: spec.think_us });
        steps.push(Step::Wait);
        first_offset += iteration_delta;
    }
    ClientPlan { path: path.to_string(), opening: Opening::Open, streams: vec![steps], sync_at_end: write }
}

/// Byte range of column block `block` and the lower-triangular part of it.
fn lu_block(spec: &RamaLuSpec, block: u64) -> (Shape, Shape) {
    let column_bytes = spec.order * 8;
    let start = block * spec.block_columns * column_bytes;
    let whole = Shape::contiguous(start, spec.block_columns * column_bytes);
    let skip = block * spec.block_columns * 8;
    let lower = Shape::Strided {
        file_offset: start + skip,
        memory_offset: 0,
        record_bytes: column_bytes - skip,
        file_stride: column_bytes as i64,
        memory_stride: (column_bytes - skip) as i64,
        count: spec.block_columns,
    };
    (whole, lower)
}

/// Fig. 5-8 with blocks dealt round robin: in step s, node n factors block s·N + n after
/// reading it and the lower parts of every block of earlier steps (the dependence on blocks
/// of the same step is dropped so that a step runs in parallel); a barrier ends each step.
fn rama_lu(spec: &RamaLuSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let blocks = spec.order / spec.block_columns;
    let steps_total = blocks.div_ceil(clients);
    let io =
        |shape, write, seed| Step::Io(Io { place: Place::Linear, shape, write, seed, nonblocking: false });
    let mut steps = Vec::new();
    for step in 0..steps_total {
        let block = step * clients + client;
        if block < blocks {
            let (whole, _) = lu_block(spec, block);
            steps.push(io(whole.clone(), false, SEED_INITIAL));
            for previous in 0..step * clients {
                steps.push(io(lu_block(spec, previous).1, false, SEED_WRITTEN));
                steps.push(Step::Think { us: spec.think_us });
            }
            steps.push(io(whole, true, SEED_WRITTEN));
        }
        steps.push(Step::Barrier);
    }
    ClientPlan { path: path.to_string(), opening: Opening::Open, streams: vec![steps], sync_at_end: true }
}

fn gator_snapshot_bytes(spec: &RamaGatorSpec) -> u64 {
    spec.longitudes * spec.latitudes * spec.cell_bytes
}

/// The cells of one snapshot that `client` owns, as (longitude, first latitude, latitudes):
/// block (bx, by) belongs to mesh position (bx mod columns, by mod rows) (Fig. 5-9).
pub fn gator_pieces(spec: &RamaGatorSpec, client: u64, clients: u64) -> Vec<(u64, u64, u64)> {
    let rows = clients / spec.mesh_columns;
    let (column, row) = (client % spec.mesh_columns, client / spec.mesh_columns);
    let mut pieces = Vec::new();
    for block_x in (column..spec.longitudes / spec.block_longitudes).step_by(spec.mesh_columns as usize) {
        for block_y in (row..spec.latitudes / spec.block_latitudes).step_by(rows as usize) {
            for longitude in block_x * spec.block_longitudes..(block_x + 1) * spec.block_longitudes {
                pieces.push((longitude, block_y * spec.block_latitudes, spec.block_latitudes));
            }
        }
    }
    pieces
}

/// GATOR: per iteration, start the reads of the client's cells of that iteration's snapshot
/// (the grid stored longitude by longitude), compute on the cells, wait for the reads.
fn rama_gator(spec: &RamaGatorSpec, path: &str, client: u64, clients: u64) -> ClientPlan {
    let pieces = gator_pieces(spec, client, clients);
    let cells: u64 = pieces.iter().map(|p| p.2).sum();
    let mut steps = Vec::new();
    for iteration in 0..spec.iterations {
        let snapshot = iteration * gator_snapshot_bytes(spec);
        for &(longitude, latitude, count) in &pieces {
            let offset = snapshot + (longitude * spec.latitudes + latitude) * spec.cell_bytes;
            let shape = Shape::contiguous(offset, count * spec.cell_bytes);
            steps.push(Step::Io(Io {
                place: Place::Linear,
                shape,
                write: false,
                seed: SEED_INITIAL,
                nonblocking: true,
            }));
        }
        steps.push(Step::Think { us: cells * spec.think_us_per_cell });
        steps.push(Step::Wait);
    }
    ClientPlan { path: path.to_string(), opening: Opening::Open, streams: vec![steps], sync_at_end: false }
}

fn pread(files: u32, record_bytes: u64, fork_bytes: u64, client: u64, clients: u64) -> ClientPlan {
    let (first, count, step) =
        galley_records(GalleyPattern::Interleaved, fork_bytes / record_bytes, client, clients);
    let streams = (0..files)
        .map(|file| {
            (0..count)
                .map(|k| {
                    let shape = Shape::contiguous((first + k * step) * record_bytes, record_bytes);
                    Step::Io(Io {
                        place: Place::Local(file),
                        shape,
                        write: false,
                        seed: SEED_INITIAL,
                        nonblocking: false,
                    })
                })
                .collect()
        })
        .collect();
    ClientPlan { path: String::new(), opening: Opening::Local, streams, sync_at_end: false }
}

/// Subfiles and layout of the point's file(s).
pub fn file_layout(spec: &PointSpec) -> anyhow::Result<(u32, Layout)> {
    let parse = |text: &str| Layout::parse(text).map_err(|error| anyhow::anyhow!("{error}"));
    Ok(match spec {
        PointSpec::Galley(spec) => (spec.subfiles, Layout::Explicit),
        PointSpec::Gpfs(spec) => {
            (spec.subfiles, Layout::Stripe { unit_bytes: spec.stripe_unit_bytes, count: 0 })
        }
        PointSpec::RamaWhole(spec) => (spec.subfiles, parse(&spec.layout)?),
        PointSpec::RamaStrided(spec) => (spec.subfiles, parse(&spec.layout)?),
        PointSpec::RamaLu(spec) => (spec.subfiles, parse(&spec.layout)?),
        PointSpec::RamaGator(spec) => (spec.subfiles, parse(&spec.layout)?),
        PointSpec::Pread { .. } => anyhow::bail!("pread points use local files"),
    })
}

/// Bytes a plan moves.
pub fn plan_bytes(plan: &ClientPlan) -> u64 {
    plan.streams
        .iter()
        .flatten()
        .map(|step| match step {
            Step::Io(io) => shape_bytes(&io.shape),
            _ => 0,
        })
        .sum()
}

/// Bytes of a shape (those the generators make).
pub fn shape_bytes(shape: &Shape) -> u64 {
    match shape {
        Shape::Contiguous { length, .. } => *length,
        Shape::Strided { record_bytes, count, .. } => record_bytes * count,
        other => other.pieces().map(|pieces| pieces.iter().map(|piece| piece.length).sum()).unwrap_or(0),
    }
}

/// Memory a shape needs (its pieces' largest memory end).
pub fn shape_memory_bytes(shape: &Shape) -> u64 {
    match shape {
        Shape::Contiguous { memory_offset, length, .. } => memory_offset + length,
        Shape::Strided { memory_offset, record_bytes, memory_stride, count, .. } if *memory_stride >= 0 => {
            memory_offset + (count.saturating_sub(1)) * (*memory_stride as u64) + record_bytes
        }
        other => other
            .pieces()
            .map(|pieces| pieces.iter().map(|piece| piece.memory_offset + piece.length).max().unwrap_or(0))
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// How many times each (place, byte) is touched by every client's plan, for reads and
    /// writes, from expanding each request's pieces.
    fn touches(spec: &PointSpec, clients: u64) -> BTreeMap<(String, u64, bool), u32> {
        let mut counts = BTreeMap::new();
        for client in 0..clients {
            let plan = client_plan(spec, "/f", client, clients);
            for step in plan.streams.iter().flatten() {
                let Step::Io(io) = step else { continue };
                let place = format!("{}:{:?}", plan.path, io.place);
                for piece in io.shape.pieces().unwrap() {
                    for byte in piece.file_offset..piece.file_offset + piece.length {
                        *counts.entry((place.clone(), byte, io.write)).or_insert(0) += 1;
                    }
                }
            }
        }
        counts
    }

    /// Reference: every byte of `places` × `0..bytes`, `times` each, of one kind.
    fn every_byte(
        places: &[String],
        bytes: u64,
        write: bool,
        times: u32,
    ) -> BTreeMap<(String, u64, bool), u32> {
        places
            .iter()
            .flat_map(|place| (0..bytes).map(move |byte| ((place.clone(), byte, write), times)))
            .collect()
    }

    fn forks(subfiles: u32) -> Vec<String> {
        (0..subfiles).map(|s| format!("/f:Fork({s})")).collect()
    }

    #[test]
    fn galley_patterns_touch_exactly_their_bytes() {
        for interface in [Interface::Traditional, Interface::Strided] {
            for (pattern, op, times) in [
                (GalleyPattern::Broadcast, Op::Read, 3),
                (GalleyPattern::Partitioned, Op::Overwrite, 1),
                (GalleyPattern::Interleaved, Op::Write, 1),
                (GalleyPattern::Interleaved, Op::Read, 1),
            ] {
                let spec = PointSpec::Galley(GalleySpec {
                    pattern,
                    interface,
                    op,
                    record_bytes: 8,
                    fork_bytes: 8 * 3 * 5,
                    subfiles: 2,
                });
                spec.check(3).unwrap();
                let write = op != Op::Read;
                assert_eq!(
                    touches(&spec, 3),
                    every_byte(&forks(2), 120, write, times),
                    "{pattern:?} {interface:?}"
                );
            }
        }
    }

    #[test]
    fn galley_interleaved_client_takes_every_cth_record() {
        let spec = GalleySpec {
            pattern: GalleyPattern::Interleaved,
            interface: Interface::Strided,
            op: Op::Read,
            record_bytes: 4,
            fork_bytes: 64,
            subfiles: 1,
        };
        let plan = client_plan(&PointSpec::Galley(spec), "/f", 1, 4);
        let Step::Io(io) = &plan.streams[0][0] else { panic!() };
        let offsets: Vec<u64> = io.shape.pieces().unwrap().iter().map(|p| p.file_offset).collect();
        assert_eq!(offsets, [4, 20, 36, 52]);
        assert_eq!(plan.streams.len(), 1);
        assert_eq!(shape_memory_bytes(&io.shape), 16);
    }

    #[test]
    fn gpfs_patterns_cover_the_file_once() {
        for pattern in [GpfsPattern::Segmented, GpfsPattern::Strided] {
            let spec = PointSpec::Gpfs(GpfsSpec {
                pattern,
                op: Op::Write,
                transfer_bytes: 16,
                file_bytes: 16 * 4 * 3,
                stripe_unit_bytes: 32,
                subfiles: 2,
            });
            assert_eq!(
                touches(&spec, 4),
                every_byte(&["/f:Linear".to_string()], 192, true, 1),
                "{pattern:?}"
            );
        }
        let strided = GpfsSpec {
            pattern: GpfsPattern::Strided,
            op: Op::Read,
            transfer_bytes: 16,
            file_bytes: 128,
            stripe_unit_bytes: 32,
            subfiles: 2,
        };
        let plan = client_plan(&PointSpec::Gpfs(strided), "/f", 1, 4);
        let offsets: Vec<u64> = plan.streams[0]
            .iter()
            .map(|s| match s {
                Step::Io(io) => io.shape.pieces().unwrap()[0].file_offset,
                _ => panic!(),
            })
            .collect();
        assert_eq!(offsets, [16, 80]);
    }

    #[test]
    fn gpfs_file_per_process_gives_each_client_its_own_file() {
        let spec = PointSpec::Gpfs(GpfsSpec {
            pattern: GpfsPattern::FilePerProcess,
            op: Op::Write,
            transfer_bytes: 8,
            file_bytes: 8 * 2 * 3,
            stripe_unit_bytes: 8,
            subfiles: 1,
        });
        let places: Vec<String> = (0..3).map(|c| format!("/f.{c}:Linear")).collect();
        assert_eq!(touches(&spec, 3), every_byte(&places, 16, true, 1));
        assert!((0..3).all(|c| client_plan(&spec, "/f", c, 3).opening == Opening::Create));
    }

    #[test]
    fn gator_reads_every_cell_of_every_snapshot_once() {
        for (clients, columns) in [(1, 1), (2, 2), (4, 2), (6, 3)] {
            let spec = RamaGatorSpec {
                layout: "hash:32k".into(),
                longitudes: 12,
                latitudes: 8,
                cell_bytes: 4,
                block_longitudes: 2,
                block_latitudes: 2,
                mesh_columns: columns,
                iterations: 3,
                think_us_per_cell: 1,
                subfiles: 2,
            };
            let point = PointSpec::RamaGator(spec.clone());
            if point.check(clients).is_err() {
                continue;
            }
            let bytes = point.file_bytes(clients);
            assert_eq!(bytes, 12 * 8 * 4 * 3);
            assert_eq!(touches(&point, clients), every_byte(&["/f:Linear".to_string()], bytes, false, 1));
            // Block-cyclic: a client's cells are spread over the grid, equal shares.
            let cells: Vec<u64> =
                (0..clients).map(|c| gator_pieces(&spec, c, clients).iter().map(|p| p.2).sum()).collect();
            assert!(cells.iter().all(|n| *n == 12 * 8 / clients), "{cells:?}");
        }
    }

    #[test]
    fn rama_orders_cover_the_file_once_in_their_order() {
        for order in [RamaOrder::Iteration, RamaOrder::Node] {
            let spec = PointSpec::RamaWhole(RamaWholeSpec {
                order,
                op: Op::Read,
                layout: "stripe:16".into(),
                chunk_bytes: 8,
                file_bytes: 8 * 4 * 5,
                subfiles: 2,
            });
            assert_eq!(touches(&spec, 4), every_byte(&["/f:Linear".to_string()], 160, false, 1));
        }
        let spec = RamaWholeSpec {
            order: RamaOrder::Node,
            op: Op::Read,
            layout: "hash:8".into(),
            chunk_bytes: 8,
            file_bytes: 64,
            subfiles: 2,
        };
        let plan = client_plan(&PointSpec::RamaWhole(spec.clone()), "/f", 1, 2);
        let offsets: Vec<u64> = plan.streams[0]
            .iter()
            .filter_map(|s| match s {
                Step::Io(io) => Some(io.shape.pieces().unwrap()[0].file_offset),
                _ => None,
            })
            .collect();
        assert_eq!(offsets, [32, 40, 48, 56]);
        let iteration = RamaWholeSpec { order: RamaOrder::Iteration, ..spec };
        let plan = client_plan(&PointSpec::RamaWhole(iteration), "/f", 1, 2);
        let Step::Io(second) = &plan.streams[0][2] else { panic!() };
        assert_eq!(second.shape.pieces().unwrap()[0].file_offset, 24);
        assert_eq!(plan.streams[0].iter().filter(|s| **s == Step::Barrier).count(), 4);
    }

    #[test]
    fn rama_strided_follows_figure_5_7() {
        for order in [RamaOrder::Iteration, RamaOrder::Node] {
            let spec = PointSpec::RamaStrided(RamaStridedSpec {
                order,
                op: Op::Write,
                layout: "stripe:8".into(),
                request_bytes: 8,
                chunks_per_iteration: 2,
                chunk_delta_bytes: 0,
                iterations: 3,
                think_us: 5,
                subfiles: 2,
            });
            let bytes = spec.file_bytes(4);
            assert_eq!(bytes, 8 * 2 * 3 * 4);
            assert_eq!(
                touches(&spec, 4),
                every_byte(&["/f:Linear".to_string()], bytes, true, 1),
                "{order:?}"
            );
            let plan = client_plan(&spec, "/f", 0, 4);
            let thinks = plan.streams[0].iter().filter(|s| matches!(s, Step::Think { us: 5 })).count();
            assert_eq!(thinks, 3);
        }
    }

    #[test]
    fn rama_lu_writes_every_block_once_and_reads_lower_parts() {
        let spec =
            RamaLuSpec { layout: "stripe:64".into(), order: 8, block_columns: 2, think_us: 0, subfiles: 2 };
        let point = PointSpec::RamaLu(spec.clone());
        let counts = touches(&point, 2);
        let written: Vec<u64> =
            counts.iter().filter(|((_, _, write), _)| *write).map(|((_, byte, _), _)| *byte).collect();
        assert_eq!(written, (0..512).collect::<Vec<u64>>());
        assert!(counts.iter().filter(|((_, _, w), _)| *w).all(|(_, n)| *n == 1));
        // Reference for reads: each block is read whole once; in step s the lower parts
        // (rows ≥ first column of the block) of blocks of steps before s are read once by
        // each node that has a block in step s.
        let mut reference: BTreeMap<u64, u32> = BTreeMap::new();
        let (blocks, column) = (4u64, 64u64);
        for block in 0..blocks {
            for byte in block * 2 * column..(block + 1) * 2 * column {
                *reference.entry(byte).or_default() += 1;
            }
            let step = block / 2;
            for previous in 0..step * 2 {
                for c in previous * 2..previous * 2 + 2 {
                    for row in previous * 2..8 {
                        *reference.entry(c * column + row * 8).or_default() += 1;
                    }
                }
            }
        }
        let reads: BTreeMap<u64, u32> = counts
            .iter()
            .filter(|((_, _, write), _)| !*write)
            .filter(|((_, byte, _), _)| byte % 8 == 0)
            .map(|((_, byte, _), n)| (*byte, *n))
            .collect();
        reference.retain(|byte, _| byte % 8 == 0);
        assert_eq!(reads, reference);
    }

    #[test]
    fn checks_refuse_sizes_that_do_not_divide() {
        let bad = PointSpec::Gpfs(GpfsSpec {
            pattern: GpfsPattern::Segmented,
            op: Op::Read,
            transfer_bytes: 10,
            file_bytes: 100,
            stripe_unit_bytes: 10,
            subfiles: 1,
        });
        assert!(bad.check(3).is_err());
        assert!(bad.check(2).is_ok());
        let broadcast_write = PointSpec::Galley(GalleySpec {
            pattern: GalleyPattern::Broadcast,
            interface: Interface::Strided,
            op: Op::Write,
            record_bytes: 8,
            fork_bytes: 64,
            subfiles: 1,
        });
        assert!(broadcast_write.check(2).is_err());
    }
}
