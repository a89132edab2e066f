//! Random readers through the mount (issue 34): the mount's read-ahead recognises them and
//! fetches nothing ahead for them, the reads of one `O_DIRECT` descriptor that the kernel
//! sends at once (asynchronous direct I/O, fio's `iodepth`; one `io_submit` of 16 reads too)
//! reach the servers at once, an `O_DIRECT` open never goes through the kernel's page cache,
//! and a random reader of a page-cache open is sent about what it reads. Counted by the
//! servers (read requests and bytes) and by the bytes queued at a stopped server's socket,
//! not timed.
//!
//! Real processes: a cluster and `flotilla mount` processes. Needs root (to mount).

mod common;

use common::{Cluster, Mount};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

const RECORD: usize = 4096;

/// A buffer aligned for `O_DIRECT` reads.
struct Aligned {
    pointer: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(bytes: usize) -> Aligned {
        let layout = Layout::from_size_align(bytes, 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { alloc_zeroed(layout) };
        assert!(!pointer.is_null(), "allocation failed");
        Aligned { pointer, layout }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_zeroed` with this layout.
        unsafe { dealloc(self.pointer, self.layout) };
    }
}

/// One `pread` of a record at `offset` into an aligned buffer; the bytes read.
fn read_direct(file: &fs::File, offset: u64) -> Vec<u8> {
    let buffer = Aligned::new(RECORD);
    // SAFETY: the buffer holds RECORD bytes and lives through the call.
    let read = unsafe { libc::pread(file.as_raw_fd(), buffer.pointer.cast(), RECORD, offset as i64) };
    assert_eq!(read, RECORD as isize, "O_DIRECT pread at {offset}: {}", std::io::Error::last_os_error());
    // SAFETY: the call filled RECORD bytes.
    unsafe { std::slice::from_raw_parts(buffer.pointer, RECORD) }.to_vec()
}

fn open_direct(path: &Path) -> fs::File {
    fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).expect("open with O_DIRECT")
}

/// Read requests and bytes the cluster's servers have served so far.
fn server_reads(client: &flotilla_client::Client) -> (u64, u64) {
    let servers: std::collections::BTreeSet<String> =
        client.status().expect("status").into_iter().map(|target| target.server).collect();
    servers.iter().fold((0, 0), |(ops, bytes), server| {
        let total = client.server_stats(server).expect("server stats").total;
        (ops + total.read_ops, bytes + total.read_bytes)
    })
}

fn content(bytes: usize) -> Vec<u8> {
    (0..bytes as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// Record offsets a simple generator picks in a file of `records` records: a few alone (the
/// read-ahead sees a random reader within them), then pairs whose second record is right
/// after the first (reads that look sequential by chance).
fn random_pairs(records: u64, pairs: usize) -> Vec<u64> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut offsets = Vec::new();
    for index in 0..4 + pairs {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let record = (state >> 33) % (records - 1);
        offsets.push(record * RECORD as u64);
        if index >= 4 {
            offsets.push((record + 1) * RECORD as u64);
        }
    }
    offsets
}

/// A random `O_DIRECT` reader (the mount's defaults) is served exactly the bytes it reads:
/// the reads that happen to start where the one before ended are not widened once the
/// handle looks random. A sequential reader of the same file still has its reads fetched
/// ahead (a fraction of the requests). Fails before issue 34: every such chance pair
/// fetched 4 more records.
#[test]
fn a_random_reader_gets_no_read_ahead_and_a_sequential_one_does() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let mount = Mount::start(&cluster.meta_addr());
    let bytes = content(4 << 20);
    fs::write(mount.path("data"), &bytes).unwrap();
    let records = (bytes.len() / RECORD) as u64;

    let file = open_direct(&mount.path("data"));
    let offsets = random_pairs(records, 40);
    let (ops_before, bytes_before) = server_reads(&client);
    for offset in &offsets {
        let at = *offset as usize;
        assert!(read_direct(&file, *offset) == bytes[at..at + RECORD], "record at {offset} differs");
    }
    let (ops_after, bytes_after) = server_reads(&client);
    let (random_ops, random_bytes) = (ops_after - ops_before, bytes_after - bytes_before);
    eprintln!("{} random reads: {random_ops} read requests, {random_bytes} bytes", offsets.len());
    assert_eq!(
        random_bytes,
        (offsets.len() * RECORD) as u64,
        "a random reader was sent bytes it did not ask"
    );
    drop(file);

    let file = open_direct(&mount.path("data"));
    let sequential = 256u64;
    for record in 0..sequential {
        let at = record as usize * RECORD;
        assert!(read_direct(&file, at as u64) == bytes[at..at + RECORD], "record {record} differs");
    }
    let (sequential_ops, _) = server_reads(&client);
    let sequential_ops = sequential_ops - ops_after;
    eprintln!("{sequential} sequential reads: {sequential_ops} read requests");
    assert!(sequential_ops * 4 <= sequential, "{sequential_ops} requests for {sequential} sequential reads");
}

/// An `O_DIRECT` open is never served by the kernel's page cache, even of a file under tokens
/// whose read-only opens are: each read of the same record reaches the servers, where a
/// buffered read-only open reads it once. (This held before issue 34 too: a check that it
/// stays so.)
#[test]
fn an_o_direct_open_reaches_the_servers_every_time() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let mount = Mount::start(&cluster.meta_addr());
    let bytes = content(1 << 20);
    fs::write(mount.path("data"), &bytes).unwrap();
    let rounds = 20u64;

    let buffered = fs::File::open(mount.path("data")).unwrap();
    let mut record = vec![0u8; RECORD];
    let (before, _) = server_reads(&client);
    for _ in 0..rounds {
        use std::os::unix::fs::FileExt;
        buffered.read_exact_at(&mut record, 8 * RECORD as u64).unwrap();
    }
    let (after_buffered, _) = server_reads(&client);
    let buffered_ops = after_buffered - before;
    assert!(buffered_ops < rounds / 2, "{buffered_ops} requests for a buffered record read {rounds} times");

    let direct = open_direct(&mount.path("data"));
    for _ in 0..rounds {
        assert!(read_direct(&direct, 8 * RECORD as u64) == bytes[8 * RECORD..9 * RECORD]);
    }
    let (after_direct, _) = server_reads(&client);
    eprintln!(
        "{rounds} reads of one record: buffered {}, O_DIRECT {}",
        after_buffered - before,
        after_direct - after_buffered
    );
    assert!(
        after_direct - after_buffered >= rounds,
        "{} requests for {rounds} O_DIRECT reads",
        after_direct - after_buffered
    );
}

/// A random reader of a page-cache open (a read-only open with the defaults, no `O_DIRECT`)
/// churns no page cache: the kernel reads a small read that follows no sequential run as it
/// is, so the servers are sent about the bytes read, not the mount's kernel read-ahead
/// (`read_ahead_kb`, 4 MiB) per read. Bound: 4 times the bytes read (a page folio may be
/// larger than a record).
#[test]
fn a_random_reader_of_a_page_cache_open_is_sent_about_what_it_reads() {
    let cluster = Cluster::start(1);
    let client = cluster.client();
    let mount = Mount::start(&cluster.meta_addr());
    let bytes = content(16 << 20);
    fs::write(mount.path("data"), &bytes).unwrap();
    let file = fs::File::open(mount.path("data")).unwrap();
    let reads = 64u64;
    let (_, before) = server_reads(&client);
    let mut record = vec![0u8; RECORD];
    for index in 0..reads {
        use std::os::unix::fs::FileExt;
        // Records 1..4000 of the file, scattered (the first record would start a run).
        let offset = RECORD as u64 * (1 + (index.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 4000);
        file.read_exact_at(&mut record, offset).unwrap();
        let at = offset as usize;
        assert!(record == bytes[at..at + RECORD], "record at {offset} differs");
    }
    let (_, after) = server_reads(&client);
    let asked = reads * RECORD as u64;
    eprintln!("{reads} random buffered reads of {RECORD} bytes: {} bytes from the servers", after - before);
    assert!(after - before <= 4 * asked, "{} bytes sent for {asked} bytes read", after - before);
}

/// Bytes waiting in the receive queues of the established TCP connections to local port
/// `port` (IPv4 loopback), from /proc/net/tcp.
fn queued_bytes_at(port: u16) -> u64 {
    let table = fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            let established = *fields.get(3)? == "01";
            let rx = u64::from_str_radix(fields.get(4)?.split(':').nth(1)?, 16).ok()?;
            (local_port == port && established).then_some(rx)
        })
        .sum()
}

/// The offset of a record of a 4 MiB file that no pattern leads to from `index - 1`'s.
fn scattered(index: u64) -> u64 {
    (index.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 1000 * RECORD as u64
}

/// Continues a stopped server when dropped (a failed assertion must not leave it stopped).
struct Stopped(i32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        // SAFETY: kill with a valid pid and signal has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Stopped(pid as i32)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// With the server stopped, starts `readers` threads each reading one random record through
/// the one descriptor `file` and returns the most bytes seen queued at the server's port
/// within `watch` (well under the cluster's 1 s down-after); then lets the server go on and
/// waits for the readers.
fn queued_while_stopped(
    cluster: &Cluster,
    file: &std::sync::Arc<fs::File>,
    readers: u64,
    watch: Duration,
) -> u64 {
    let server = cluster.servers[0].as_ref().expect("server running");
    let port: u16 = server.addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("server port");
    let stopped = Stopped::new(server.child.id());
    let baseline = queued_bytes_at(port);
    let threads: Vec<_> = (0..readers)
        .map(|index| {
            let file = file.clone();
            std::thread::spawn(move || read_direct(&file, scattered(100 + index)))
        })
        .collect();
    let started = Instant::now();
    let mut most = 0;
    while started.elapsed() < watch {
        most = most.max(queued_bytes_at(port).saturating_sub(baseline));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stopped);
    for thread in threads {
        thread.join().expect("a reader failed");
    }
    most
}

/// Reads the kernel sends at once for one `O_DIRECT` descriptor (16 threads here; fio's
/// `iodepth=16` with libaio is the same to the mount: `FUSE_ASYNC_DIO`) reach the server at
/// once: with the server stopped, 16 readers leave many times the bytes of one reader's
/// request queued at its socket. Fails before issue 34: the handle's read-ahead lock was
/// held while each read went to the server, so the 16 went one at a time.
#[test]
fn reads_of_one_o_direct_descriptor_reach_the_server_at_once() {
    let cluster = Cluster::start(1);
    let mount = Mount::start(&cluster.meta_addr());
    fs::write(mount.path("data"), content(4 << 20)).unwrap();
    let file = std::sync::Arc::new(open_direct(&mount.path("data")));
    // Warm: the handle's connection, token and size are in place; the reads look random.
    for index in 0..8u64 {
        read_direct(&file, scattered(index));
    }
    let watch = Duration::from_millis(700);
    let one = queued_while_stopped(&cluster, &file, 1, watch);
    let sixteen = queued_while_stopped(&cluster, &file, 16, watch);
    eprintln!("bytes queued at the stopped server: {one} for 1 reader, {sixteen} for 16");
    assert!(one > 0, "one reader's request never reached the server's socket");
    assert!(
        sixteen >= 8 * one,
        "16 readers queued {sixteen} bytes, one reader {one}: the reads went one at a time"
    );
}

/// The kernel's asynchronous I/O (`io_submit`, what fio's `libaio` engine uses), with the
/// structures of `linux/aio_abi.h` (little-endian layout).
mod aio {
    /// `struct iocb`.
    #[repr(C)]
    #[derive(Default)]
    pub struct Iocb {
        pub data: u64,
        pub key: u32,
        pub rw_flags: i32,
        pub opcode: u16,
        pub reqprio: i16,
        pub fildes: u32,
        pub buf: u64,
        pub nbytes: u64,
        pub offset: i64,
        pub reserved2: u64,
        pub flags: u32,
        pub resfd: u32,
    }

    /// `struct io_event`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct Event {
        pub data: u64,
        pub obj: u64,
        pub res: i64,
        pub res2: i64,
    }

    pub const CMD_PREAD: u16 = 0;

    /// An `io_setup` context, destroyed when dropped.
    pub struct Context(pub u64);

    impl Context {
        pub fn new(events: usize) -> Context {
            let mut context = 0u64;
            // SAFETY: io_setup writes one aio_context_t to the pointer given.
            let done = unsafe { libc::syscall(libc::SYS_io_setup, events as libc::c_long, &mut context) };
            assert_eq!(done, 0, "io_setup: {}", std::io::Error::last_os_error());
            Context(context)
        }

        /// Submits every request; the number the kernel took.
        pub fn submit(&self, requests: &mut [Iocb]) -> usize {
            let mut pointers: Vec<*mut Iocb> = requests.iter_mut().map(|r| r as *mut Iocb).collect();
            // SAFETY: the pointers are to live iocbs whose buffers outlive their completion
            // (the caller reaps every event before dropping them).
            let taken = unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.0,
                    pointers.len() as libc::c_long,
                    pointers.as_mut_ptr(),
                )
            };
            assert!(taken >= 0, "io_submit: {}", std::io::Error::last_os_error());
            taken as usize
        }

        /// Waits for `count` completions.
        pub fn reap(&self, count: usize) -> Vec<Event> {
            let mut events = vec![Event::default(); count];
            let mut reaped = 0;
            while reaped < count {
                let rest = &mut events[reaped..];
                // SAFETY: the kernel writes at most `rest.len()` events into `rest`.
                let got = unsafe {
                    libc::syscall(
                        libc::SYS_io_getevents,
                        self.0,
                        1 as libc::c_long,
                        rest.len() as libc::c_long,
                        rest.as_mut_ptr(),
                        std::ptr::null_mut::<libc::timespec>(),
                    )
                };
                if got < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                assert!(got > 0, "io_getevents: {}", std::io::Error::last_os_error());
                reaped += got as usize;
            }
            events
        }
    }

    impl Drop for Context {
        fn drop(&mut self) {
            // SAFETY: destroys the context this value owns.
            unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
        }
    }
}

/// One thread submitting 16 `O_DIRECT` reads of one descriptor with `io_submit` (fio's
/// `libaio` engine at `iodepth=16`) has 16 requests at the servers at once: the mount asks the
/// kernel for asynchronous direct I/O (`FUSE_ASYNC_DIO`), so `io_submit` hands all of them to
/// the mount instead of waiting for each in turn. With the server stopped, the one submission
/// leaves many times one read's request bytes queued at its socket; then every read completes
/// with the right bytes. Without asynchronous direct I/O the submission would wait on the
/// first read and one request would be queued.
#[test]
fn one_io_submit_of_sixteen_direct_reads_has_sixteen_at_the_server() {
    const DEPTH: usize = 16;
    let cluster = Cluster::start(1);
    let mount = Mount::start(&cluster.meta_addr());
    let bytes = content(4 << 20);
    fs::write(mount.path("data"), &bytes).unwrap();
    let file = std::sync::Arc::new(open_direct(&mount.path("data")));
    for index in 0..8u64 {
        read_direct(&file, scattered(index));
    }
    let watch = Duration::from_millis(700);
    let one = queued_while_stopped(&cluster, &file, 1, watch);

    let server = cluster.servers[0].as_ref().expect("server running");
    let port: u16 = server.addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("server port");
    let stopped = Stopped::new(server.child.id());
    let baseline = queued_bytes_at(port);
    let submitter = {
        let file = file.clone();
        std::thread::spawn(move || {
            let buffers: Vec<Aligned> = (0..DEPTH).map(|_| Aligned::new(RECORD)).collect();
            let offsets: Vec<u64> = (0..DEPTH as u64).map(|index| scattered(200 + index)).collect();
            let mut requests: Vec<aio::Iocb> = (0..DEPTH)
                .map(|index| aio::Iocb {
                    data: index as u64,
                    opcode: aio::CMD_PREAD,
                    fildes: file.as_raw_fd() as u32,
                    buf: buffers[index].pointer as u64,
                    nbytes: RECORD as u64,
                    offset: offsets[index] as i64,
                    ..aio::Iocb::default()
                })
                .collect();
            let context = aio::Context::new(DEPTH);
            let mut taken = 0;
            while taken < DEPTH {
                taken += context.submit(&mut requests[taken..]);
            }
            let events = context.reap(DEPTH);
            let read: Vec<(u64, i64, Vec<u8>)> = events
                .iter()
                .map(|event| {
                    let index = event.data as usize;
                    // SAFETY: the buffer holds RECORD bytes, filled by the completed read.
                    let got = unsafe { std::slice::from_raw_parts(buffers[index].pointer, RECORD) };
                    (offsets[index], event.res, got.to_vec())
                })
                .collect();
            read
        })
    };
    let started = Instant::now();
    let mut most = 0;
    while started.elapsed() < watch {
        most = most.max(queued_bytes_at(port).saturating_sub(baseline));
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stopped);
    let read = submitter.join().expect("the submitting thread failed");
    eprintln!("bytes queued at the stopped server: {one} for one read, {most} for one io_submit of {DEPTH}");
    for (offset, result, got) in read {
        assert_eq!(result, RECORD as i64, "the asynchronous read at {offset}");
        let at = offset as usize;
        assert!(got == bytes[at..at + RECORD], "the asynchronous read at {offset} differs");
    }
    assert!(one > 0, "one read's request never reached the server's socket");
    assert!(
        most >= 8 * one,
        "one io_submit of {DEPTH} reads queued {most} bytes, one read {one}: they went one at a time"
    );
}

/// Record `index` of the growing file: its index, then bytes that depend on it.
fn growing_record(index: u64) -> Vec<u8> {
    let mut bytes = common::random_bytes(index, RECORD);
    bytes[..8].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// One `pread` of record `index` through `file` (aligned for `O_DIRECT`): what it read.
fn pread_record(file: &fs::File, index: u64) -> Vec<u8> {
    let buffer = Aligned::new(RECORD);
    let offset = (index * RECORD as u64) as i64;
    // SAFETY: the buffer holds RECORD bytes and lives through the call.
    let read = unsafe { libc::pread(file.as_raw_fd(), buffer.pointer.cast(), RECORD, offset) };
    assert!(read >= 0, "pread of record {index}: {}", std::io::Error::last_os_error());
    // SAFETY: the call filled `read` bytes.
    unsafe { std::slice::from_raw_parts(buffer.pointer, read as usize) }.to_vec()
}

/// Random readers at the end of a file another handle is extending through the same mount:
/// four threads reading one `O_DIRECT` descriptor (a random reader's reads go without the
/// handle's lock, several at once) and two reading a page-cache descriptor (where a read
/// answered short makes the kernel shrink its size). Every read of a record whose write
/// returned before the read began is whole and right — never short at a size the mount knew
/// before the write — and once the writer closed, both descriptors read the last record and
/// a fresh read sees every record. Half the reads are of the last few records written.
#[test]
fn random_readers_at_the_growing_end_of_a_file_never_read_short() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const FIRST: u64 = 64;
    const RECORDS_MAX: u64 = 4096;
    const READS: usize = 300;
    let cluster = Cluster::start(4);
    let mount = Mount::start(&cluster.meta_addr());
    let path = mount.path("growing");
    fs::write(&path, (0..FIRST).flat_map(growing_record).collect::<Vec<u8>>()).unwrap();
    let direct = Arc::new(open_direct(&path));
    let buffered = Arc::new(fs::File::open(&path).unwrap());
    let written = Arc::new(AtomicU64::new(FIRST));
    let stop = Arc::new(AtomicBool::new(false));

    let writer = {
        let (path, written, stop) = (path.clone(), written.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
            for index in FIRST..RECORDS_MAX {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                file.write_all_at(&growing_record(index), index * RECORD as u64).unwrap();
                written.store(index + 1, Ordering::Release);
                std::thread::yield_now();
            }
        })
    };
    let readers: Vec<_> = (0..6u64)
        .map(|reader| {
            let file = if reader < 4 { direct.clone() } else { buffered.clone() };
            let written = written.clone();
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ reader;
                for read in 0..READS {
                    state =
                        state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let done = written.load(Ordering::Acquire);
                    let back = (state >> 33) % if read % 2 == 0 { 4 } else { done };
                    let index = done - 1 - back;
                    let got = pread_record(&file, index);
                    assert_eq!(
                        got.len(),
                        RECORD,
                        "reader {reader}, read {read}: record {index} of {done} written read short"
                    );
                    assert!(got == growing_record(index), "reader {reader}: record {index} differs");
                }
            })
        })
        .collect();
    readers.into_iter().for_each(|reader| reader.join().unwrap());
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    let done = written.load(Ordering::Acquire);
    eprintln!("{done} records written while {} reads ran", 6 * READS);
    for file in [&direct, &buffered] {
        assert!(pread_record(file, done - 1) == growing_record(done - 1), "the last record after close");
    }
    let whole = fs::read(&path).unwrap();
    assert_eq!(whole.len() as u64, done * RECORD as u64);
    assert!(whole == (0..done).flat_map(growing_record).collect::<Vec<u8>>());
}
