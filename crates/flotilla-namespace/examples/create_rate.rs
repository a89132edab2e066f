//! Create rate of the namespace alone (no network): `threads` writers creating files in one
//! directory that already holds `prefill` entries, every create durable (group commit).
//! With `ROUNDS` (default 1) the measured creates are repeated that many times after one
//! prefill, each round's rate printed, then their median (a noisy machine's spread shows).
//! Each round also prints the bytes the process handed to `write`/`pwrite` per create
//! (`wchar` of `/proc/self/io`): the pages the database wrote, which unlike the rate does not
//! depend on how busy the machine and its disk are.
//!
//! ```sh
//! cargo run --release -p flotilla-namespace --example create_rate -- DIR PREFILL THREADS CREATES_PER_THREAD [ROUNDS]
//! ```

use flotilla_namespace::{CommitStats, CreateFile, Namespace, Owner, TargetUsage};
use flotilla_types::TargetId;
use std::time::Instant;

const PREFILL_THREADS: usize = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, prefill, threads, creates, rounds) = match &args[..] {
        [_, dir, prefill, threads, creates] => (dir, prefill, threads, creates, "1"),
        [_, dir, prefill, threads, creates, rounds] => (dir, prefill, threads, creates, rounds.as_str()),
        _ => {
            eprintln!("usage: create_rate DIR PREFILL THREADS CREATES_PER_THREAD [ROUNDS]");
            std::process::exit(2);
        }
    };
    let rounds: usize = rounds.parse().unwrap();
    let (prefill, threads, creates): (usize, usize, usize) =
        (prefill.parse().unwrap(), threads.parse().unwrap(), creates.parse().unwrap());
    let namespace = Namespace::open(&std::path::Path::new(dir).join("namespace.redb")).unwrap();
    let owner = Owner { mode: 0o755, uid: 0, gid: 0 };
    namespace.mkdir("/d", owner, 1).unwrap();
    let started = Instant::now();
    run(&namespace, PREFILL_THREADS, prefill / PREFILL_THREADS, "pre");
    println!("prefill {prefill} in {:.1} s", started.elapsed().as_secs_f64());
    let ops = threads * creates;
    let mut rates = Vec::new();
    for round in 0..rounds {
        let before = namespace.commit_stats();
        let written = written_bytes();
        let started = Instant::now();
        let prefix = if round == 0 { "new".to_string() } else { format!("r{round}n") };
        run(&namespace, threads, creates, &prefix);
        let seconds = started.elapsed().as_secs_f64();
        rates.push(ops as f64 / seconds);
        println!("{ops} creates in {seconds:.2} s: {:.0}/s", ops as f64 / seconds);
        report(&before, &namespace.commit_stats());
        if let (Some(from), Some(to)) = (written, written_bytes()) {
            println!("written per create: {:.1} KiB", (to - from) as f64 / ops as f64 / 1024.0);
        }
    }
    if rounds > 1 {
        rates.sort_by(f64::total_cmp);
        let list: Vec<String> = rates.iter().map(|rate| format!("{rate:.0}")).collect();
        println!("median of {rounds} rounds: {:.0}/s ({})", rates[rounds / 2], list.join(" "));
    }
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let namespace = &namespace;
            scope.spawn(move || {
                for index in 0..creates {
                    namespace.lookup(&format!("/d/new{thread:02}f{index:07}")).unwrap();
                }
            });
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    println!("{ops} lookups in {seconds:.2} s: {:.0}/s", ops as f64 / seconds);
}

fn run(namespace: &Namespace, threads: usize, creates: usize, prefix: &str) {
    let live = [TargetUsage { target: TargetId(7), used_bytes: 0, free_bytes: 1 << 40 }];
    let spec = CreateFile {
        owner: Owner { mode: 0o644, uid: 0, gid: 0 },
        subfile_count: 0,
        targets: None,
        layout: None,
        exclusive: true,
    };
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (spec, live) = (&spec, &live);
            scope.spawn(move || {
                for index in 0..creates {
                    let path = format!("/d/{prefix}{thread:02}f{index:07}");
                    namespace.create_file(&path, spec, live, 2).unwrap();
                }
            });
        }
    });
}

/// Bytes this process has passed to write system calls (`wchar`), where `/proc` has it.
fn written_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|line| line.strip_prefix("wchar: ")).and_then(|value| value.trim().parse().ok())
}

fn report(before: &CommitStats, after: &CommitStats) {
    let batches = (after.batches - before.batches).max(1);
    let changes = (after.changes - before.changes).max(1);
    let per = |a: u64, b: u64, n: u64| (a - b) as f64 / n as f64 / 1000.0;
    println!(
        "batches {batches}, {:.2} changes each; per change: apply {:.0} µs (lock wait {:.0} µs); per batch: gather {:.0} µs, durable commit {:.0} µs",
        changes as f64 / batches as f64,
        per(after.apply_ns, before.apply_ns, changes),
        per(after.lock_ns, before.lock_ns, changes),
        per(after.gather_ns, before.gather_ns, batches),
        per(after.commit_ns, before.commit_ns, batches),
    );
}
