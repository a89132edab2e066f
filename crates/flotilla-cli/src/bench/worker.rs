//! One benchmark client process (`flotilla bench-worker`): builds its plan and its streams'
//! buffers from the point's spec, says `ready`, waits for `go` on stdin, then opens, moves its bytes, syncs what it
//! wrote, closes, and prints `report {json}`. A `Barrier` step prints `barrier` and waits
//! for the next `go`. Every byte read is checked against the pattern; the time spent making
//! write data and checking read data is reported as `excluded_ns` and left out of the rate —
//! per stream: streams run side by side, so the client's excluded time is how much earlier
//! its last stream would have ended without its own checks, not the sum over its streams.
//!
//! After its report a client waits for one more `go`, sent once every client has reported,
//! and only then checks the reads it could keep (a stream whose only step is one blocking
//! read: its buffer is not used again) and exits, failing if a check fails. Neither those
//! checks nor a finished client's exit then takes CPU from clients still being timed: on a
//! machine of few cores they share the cores with the servers (issue 12).

use super::data::{check_request, fill_request};
use super::plan::{
    client_plan, file_layout, plan_bytes, shape_memory_bytes, ClientPlan, Io, Opening, Place, PointSpec, Step,
};
use anyhow::Context;
use clap::Args;
use flotilla_client::{Client, CreateOptions, File, Fork, Handle, DEFAULT_FORK};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    meta: String,
    #[arg(long)]
    path: String,
    #[arg(long)]
    client: u64,
    #[arg(long)]
    clients: u64,
    /// The point, as JSON (`PointSpec`).
    #[arg(long)]
    spec: String,
}

/// What one client reports.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct WorkerReport {
    pub start_ns: u128,
    pub end_ns: u128,
    pub excluded_ns: u128,
    pub bytes: u64,
    pub requests: u64,
    pub think_ns: u128,
}

pub fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Waits for the driver's `go`.
pub(super) fn wait_go() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("read go from the driver")?;
    anyhow::ensure!(line.trim() == "go", "expected go, got {line:?}");
    Ok(())
}

pub(super) fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

/// The opened file, forks or local files.
struct Target {
    file: Option<File>,
    forks: Vec<Fork>,
    locals: Vec<std::fs::File>,
}

#[derive(Default)]
struct Tally {
    bytes: u64,
    requests: u64,
    excluded: Duration,
    think: Duration,
    /// Every stream's end and the time it spent outside the rate (its own data checks and
    /// fills), to exclude per stream rather than summed over streams that ran at once.
    streams: Vec<(Instant, Duration)>,
    /// Streams whose read is checked after the run ([`check_later`]).
    deferred: Vec<usize>,
}

/// What a client's streams, run side by side, spent outside the rate: the last stream's end
/// minus the latest end any stream would have had without its own excluded time. Summing
/// the streams' excluded times instead would subtract time during which the other streams
/// were still moving data (four streams checking at once would count four times over).
fn excluded_side_by_side(streams: &[(Instant, Duration)]) -> Duration {
    let last_end = streams.iter().map(|(end, _)| *end).max();
    let last_effective_end = streams.iter().map(|(end, excluded)| *end - *excluded).max();
    match (last_end, last_effective_end) {
        (Some(end), Some(effective)) => end.saturating_duration_since(effective),
        _ => Duration::ZERO,
    }
}

enum Pending {
    Read(Io, Handle<Vec<u8>>),
    Write(Handle<u64>),
}

pub fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let spec: PointSpec = serde_json::from_str(&args.spec).context("parse the point spec")?;
    let plan = client_plan(&spec, &args.path, args.client, args.clients);
    super::network::apply_from_env()?;
    let client = crate::keys::client(&args.meta)?;
    // Connecting to the cluster is the program's setup, as mounting is for a local file
    // system: the handshakes happen before the start. Opening the file is timed.
    if !matches!(spec, PointSpec::Pread { .. }) {
        client.connect_servers().context("connect to the cluster's servers")?;
    }
    // Each stream's buffer is made and touched before the start: faulting in the caller's
    // memory is the application's setup, not part of the transfer being timed.
    let mut buffers: Vec<Vec<u8>> = plan.streams.iter().map(|steps| stream_buffer(steps)).collect();
    super::data::prepare();
    say("ready")?;
    wait_go()?;
    let start_ns = now_ns();
    let target = open(&client, &spec, &plan)?;
    let tally = Mutex::new(Tally::default());
    if let ([steps], [buffer]) = (plan.streams.as_slice(), buffers.as_mut_slice()) {
        run_stream(&target, (0, steps), buffer, &tally)?;
    } else {
        std::thread::scope(|scope| {
            let threads: Vec<_> = plan
                .streams
                .iter()
                .enumerate()
                .zip(buffers.iter_mut())
                .map(|(stream, buffer)| {
                    let (target, tally) = (&target, &tally);
                    scope.spawn(move || run_stream(target, stream, buffer, tally))
                })
                .collect();
            threads
                .into_iter()
                .try_for_each(|t| t.join().map_err(|_| anyhow::anyhow!("stream thread panicked"))?)
        })?;
    }
    close(target, plan.sync_at_end)?;
    let end_ns = now_ns();
    let tally = tally.into_inner().map_err(|_| anyhow::anyhow!("tally poisoned"))?;
    anyhow::ensure!(tally.bytes == plan_bytes(&plan), "moved {} bytes of {}", tally.bytes, plan_bytes(&plan));
    let report = WorkerReport {
        start_ns,
        end_ns,
        excluded_ns: excluded_side_by_side(&tally.streams).as_nanos(),
        bytes: tally.bytes,
        requests: tally.requests,
        think_ns: tally.think.as_nanos(),
    };
    say(&format!("report {}", serde_json::to_string(&report)?))?;
    wait_go()?;
    check_deferred(&plan.streams, &buffers, &tally.deferred)
}

/// The read of a stream that can be checked after the run: its only step is one blocking
/// read, so nothing writes its buffer after it.
fn check_later(steps: &[Step]) -> Option<&Io> {
    match steps {
        [Step::Io(io)] if !io.write && !io.nonblocking => Some(io),
        _ => None,
    }
}

/// Checks the reads of the streams (by index) whose check was left for after the run.
fn check_deferred(streams: &[Vec<Step>], buffers: &[Vec<u8>], deferred: &[usize]) -> anyhow::Result<()> {
    for &index in deferred {
        let (Some(io), Some(buffer)) =
            (streams.get(index).and_then(|steps| check_later(steps)), buffers.get(index))
        else {
            anyhow::bail!("stream {index} has no single read to check");
        };
        let memory = shape_memory_bytes(&io.shape) as usize;
        check_request(io, &buffer[..memory]).with_context(|| format!("stream {index}"))?;
    }
    Ok(())
}

fn open(client: &Client, spec: &PointSpec, plan: &ClientPlan) -> anyhow::Result<Target> {
    if let PointSpec::Pread { paths, .. } = spec {
        let locals =
            paths.iter().map(std::fs::File::open).collect::<Result<_, _>>().context("open fork files")?;
        return Ok(Target { file: None, forks: Vec::new(), locals });
    }
    let file = match plan.opening {
        Opening::Open | Opening::Local => client.open(&plan.path)?,
        Opening::Create => {
            let (subfiles, layout) = file_layout(spec)?;
            client.create(
                &plan.path,
                &CreateOptions { subfiles, layout: Some(layout), ..CreateOptions::default() },
            )?
        }
        Opening::AwaitCreate => await_open(client, &plan.path)?,
    };
    let uses_forks =
        plan.streams.iter().flatten().any(|s| matches!(s, Step::Io(Io { place: Place::Fork(_), .. })));
    let forks = if uses_forks {
        (0..file.subfile_count()).map(|s| file.fork(s, DEFAULT_FORK)).collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(Target { file: Some(file), forks, locals: Vec::new() })
}

/// Opens a file another client is creating (GPFS §3.1: the others wait for process 0).
/// The name appears before the subfiles exist on the servers, so it also waits until every
/// subfile answers.
fn await_open(client: &Client, path: &str) -> anyhow::Result<File> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client.open(path).and_then(|file| {
            (0..file.subfile_count()).try_for_each(|s| file.list_forks(s).map(|_| ()))?;
            Ok(file)
        });
        match ready {
            Ok(file) => return Ok(file),
            Err(error) if Instant::now() > deadline => {
                return Err(error).context("wait for the file's creation")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

fn close(target: Target, sync: bool) -> anyhow::Result<()> {
    if sync {
        // Every fork at once: `File::sync` goes subfile by subfile, which would serialize
        // the servers' write-backs.
        let forks: Vec<Fork> = match (&target.file, target.forks.is_empty()) {
            (Some(file), true) => {
                (0..file.subfile_count()).map(|s| file.fork(s, DEFAULT_FORK)).collect::<Result<_, _>>()?
            }
            _ => target.forks.clone(),
        };
        let handles: Vec<_> = forks.iter().map(Fork::sync_nb).collect();
        for handle in handles {
            handle.wait()?;
        }
    }
    if let Some(file) = target.file {
        file.close()?;
    }
    Ok(())
}

/// The buffer a stream's blocking requests use, every page written once.
fn stream_buffer(steps: &[Step]) -> Vec<u8> {
    let memory = steps
        .iter()
        .filter_map(|s| match s {
            Step::Io(io) if !io.nonblocking => Some(shape_memory_bytes(&io.shape)),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    vec![0xa5u8; memory as usize]
}

fn run_stream(
    target: &Target,
    (index, steps): (usize, &Vec<Step>),
    buffer: &mut [u8],
    tally: &Mutex<Tally>,
) -> anyhow::Result<()> {
    let mut pending: Vec<Pending> = Vec::new();
    let mut local = Tally::default();
    let later = check_later(steps).is_some();
    for step in steps {
        match step {
            Step::Io(io) if io.nonblocking => pending.push(issue(target, io, &mut local)?),
            Step::Io(io) => blocking(target, (io, !later), buffer, &mut local)?,
            Step::Wait => collect(&mut pending, &mut local)?,
            Step::Think { us } => {
                let began = Instant::now();
                std::thread::sleep(Duration::from_micros(*us));
                local.think += began.elapsed();
            }
            Step::Barrier => {
                say("barrier")?;
                wait_go()?;
            }
        }
    }
    collect(&mut pending, &mut local)?;
    let end = Instant::now();
    let mut total = tally.lock().map_err(|_| anyhow::anyhow!("tally poisoned"))?;
    total.streams.push((end, local.excluded));
    total.bytes += local.bytes;
    total.requests += local.requests;
    total.think += local.think;
    if later {
        total.deferred.push(index);
    }
    Ok(())
}

/// One blocking request; a read is checked at once when `check_now`, else after the run.
fn blocking(
    target: &Target,
    (io, check_now): (&Io, bool),
    buffer: &mut [u8],
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let memory = shape_memory_bytes(&io.shape) as usize;
    let buffer = &mut buffer[..memory];
    if io.write {
        let began = Instant::now();
        fill_request(io, buffer)?;
        tally.excluded += began.elapsed();
    }
    let moved = match (io.place, io.write) {
        (Place::Fork(s), false) => fork(target, s)?.read(&io.shape, buffer)?,
        (Place::Fork(s), true) => fork(target, s)?.write(&io.shape, buffer)?,
        (Place::Linear, false) => linear(target)?.read_shape(&io.shape, buffer)?,
        (Place::Linear, true) => linear(target)?.write_shape(&io.shape, buffer)?,
        (Place::Local(index), _) => local_read(target, index, io, buffer)?,
    };
    tally.bytes += moved;
    tally.requests += 1;
    if !io.write && check_now {
        let began = Instant::now();
        check_request(io, buffer)?;
        tally.excluded += began.elapsed();
    }
    Ok(())
}

fn issue(target: &Target, io: &Io, tally: &mut Tally) -> anyhow::Result<Pending> {
    let mut buffer = vec![0u8; shape_memory_bytes(&io.shape) as usize];
    tally.requests += 1;
    if io.write {
        let began = Instant::now();
        fill_request(io, &mut buffer)?;
        tally.excluded += began.elapsed();
        return Ok(Pending::Write(match io.place {
            Place::Fork(s) => fork(target, s)?.write_nb(io.shape.clone(), buffer),
            _ => linear(target)?.write_shape_nb(io.shape.clone(), buffer),
        }));
    }
    Ok(Pending::Read(
        io.clone(),
        match io.place {
            Place::Fork(s) => fork(target, s)?.read_nb(io.shape.clone(), buffer),
            _ => linear(target)?.read_shape_nb(io.shape.clone(), buffer),
        },
    ))
}

fn collect(pending: &mut Vec<Pending>, tally: &mut Tally) -> anyhow::Result<()> {
    for request in pending.drain(..) {
        match request {
            Pending::Write(handle) => tally.bytes += handle.wait()?,
            Pending::Read(io, handle) => {
                let buffer = handle.wait()?;
                let began = Instant::now();
                check_request(&io, &buffer)?;
                tally.excluded += began.elapsed();
                tally.bytes += super::plan::shape_bytes(&io.shape);
            }
        }
    }
    Ok(())
}

fn fork(target: &Target, subfile: u32) -> anyhow::Result<&Fork> {
    target.forks.get(subfile as usize).with_context(|| format!("no subfile {subfile}"))
}

fn linear(target: &Target) -> anyhow::Result<&File> {
    target.file.as_ref().context("no file open")
}

/// One `pread` per piece (the local-disk baseline).
fn local_read(target: &Target, index: u32, io: &Io, buffer: &mut [u8]) -> anyhow::Result<u64> {
    let file = target.locals.get(index as usize).context("no such local file")?;
    let flotilla_client::Shape::Contiguous { file_offset, length, .. } = io.shape else {
        anyhow::bail!("local reads are contiguous");
    };
    file.read_exact_at(&mut buffer[..length as usize], file_offset).context("pread a fork file")?;
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_side_by_side_exclude_their_own_time_not_the_sum() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let ms = Duration::from_millis;
        assert_eq!(excluded_side_by_side(&[]), Duration::ZERO);
        assert_eq!(excluded_side_by_side(&[(at(100), ms(30))]), ms(30));
        // Four streams ending together, each having checked for 30 ms: 30 ms, not 120.
        let together = [(at(100), ms(30)), (at(100), ms(30)), (at(100), ms(30)), (at(100), ms(30))];
        assert_eq!(excluded_side_by_side(&together), ms(30));
        // The slowest stream bounds the rate: one ending at 100 with 10 ms of checks,
        // another at 95 with 40 ms — the transfer took until 90, 10 ms before the end.
        assert_eq!(excluded_side_by_side(&[(at(100), ms(10)), (at(95), ms(40))]), ms(10));
        // A stream whose checks were long ends the transfer earlier than its end.
        assert_eq!(excluded_side_by_side(&[(at(100), ms(50)), (at(60), ms(0))]), ms(40));
    }

    fn strided_read(subfile: u32) -> Io {
        let shape = flotilla_request::Shape::Strided {
            file_offset: 64 * u64::from(subfile),
            memory_offset: 0,
            record_bytes: 64,
            file_stride: 256,
            memory_stride: 64,
            count: 100,
        };
        Io { place: Place::Fork(subfile), shape, write: false, seed: 7, nonblocking: false }
    }

    #[test]
    fn only_a_lone_blocking_read_is_checked_after_the_run() {
        let read = strided_read(0);
        assert_eq!(check_later(&[Step::Io(read.clone())]), Some(&read));
        assert!(check_later(&[Step::Io(read.clone()), Step::Io(read.clone())]).is_none(), "a reused buffer");
        assert!(check_later(&[Step::Io(Io { write: true, ..read.clone() })]).is_none(), "a write");
        assert!(
            check_later(&[Step::Io(Io { nonblocking: true, ..read.clone() })]).is_none(),
            "its own buffer"
        );
        assert!(check_later(&[Step::Io(read), Step::Barrier]).is_none());
        assert!(check_later(&[]).is_none());
    }

    #[test]
    fn a_deferred_check_fails_on_a_wrong_byte_in_any_stream_it_was_left_for() {
        let streams: Vec<Vec<Step>> = (0..3).map(|s| vec![Step::Io(strided_read(s))]).collect();
        let mut buffers: Vec<Vec<u8>> = vec![vec![0u8; 6400]; 3];
        for (steps, buffer) in streams.iter().zip(&mut buffers) {
            let [Step::Io(io)] = steps.as_slice() else { unreachable!() };
            fill_request(io, buffer).unwrap();
        }
        check_deferred(&streams, &buffers, &[0, 1, 2]).expect("intact data");
        buffers[2][6399] ^= 1;
        let error = check_deferred(&streams, &buffers, &[0, 2]).unwrap_err();
        assert!(format!("{error:#}").contains("stream 2"), "{error:#}");
        // A stream not left for later is not checked here; an unknown one is an error.
        check_deferred(&streams, &buffers, &[0, 1]).expect("stream 2 was checked during the run");
        assert!(check_deferred(&streams, &buffers, &[5]).is_err());
    }
}
