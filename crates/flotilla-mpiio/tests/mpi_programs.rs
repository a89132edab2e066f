//! libflotilla_mpiio end to end, under both of Debian's MPIs: the C shim is compiled with
//! `mpicc.mpich` and with `mpicc.openmpi` against the core library this build made, the test
//! program `c/tests/views.c` is linked with it and run on 4 ranks (`--oversubscribe`) once on
//! a local directory and once on `flotilla:/` paths of a live cluster (a metadata service and
//! four I/O servers in this process, on loopback ports they pick). The files of both runs must
//! be equal byte for byte, and so must the digests the program prints. The program also checks
//! that a collective write starts only once every rank has entered it (`entry`).
//!
//! MPI is installed by `scripts/test.sh` (openmpi-bin, libopenmpi-dev, mpich, libmpich-dev); a
//! missing MPI fails this test with that message rather than skipping it.

use flotilla_meta::{MetaConfig, MetaService};
use flotilla_server::{Server, ServerConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Each MPI by its own name: the compiler, and the launcher with its arguments.
const MPIS: [(&str, &str, &[&str]); 2] = [
    ("mpich", "mpicc.mpich", &["mpiexec.mpich", "-n", "4"]),
    (
        "openmpi",
        "mpicc.openmpi",
        &[
            "mpirun.openmpi",
            "--allow-run-as-root",
            "--oversubscribe",
            "-x",
            "FLOTILLA_META",
            "-x",
            "FLOTILLA_KEY",
            "-n",
            "4",
        ],
    ),
];

/// How long one run of the program may take before the test fails.
const RUN_TIMEOUT_S: u64 = 120;

struct Cluster {
    meta: String,
    client_key: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
    stop: tokio::sync::watch::Sender<bool>,
    _data: tempfile::TempDir,
}

fn make_keys(dir: &Path) -> (PathBuf, PathBuf) {
    use flotilla_auth::{ClusterCa, IssueRequest, Limits, Role};
    let ca = ClusterCa::generate();
    let issue = |role, name: &str, path: PathBuf| {
        let request =
            IssueRequest { role, name: name.into(), limits: Limits::default(), expires_unix_secs: None };
        ca.issue(request).expect("issue credential").save(&path).expect("save credential");
        path
    };
    (
        issue(Role::Server, "server", dir.join("server.cred")),
        issue(Role::Client, "client", dir.join("client.cred")),
    )
}

async fn until(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

impl Cluster {
    fn start(servers: usize) -> Cluster {
        let data = tempfile::tempdir().expect("temporary folder");
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (server_key, client_key) = make_keys(data.path());
        let meta = runtime.block_on(async {
            let config = MetaConfig {
                data: data.path().join("meta"),
                listen: "127.0.0.1:0".to_string(),
                heartbeat_ms: 200,
                key: Some(server_key.clone()),
                ..MetaConfig::default()
            };
            let service = MetaService::bind(config).await.expect("bind meta");
            let meta = service.local_addr().to_string();
            tokio::spawn(service.serve(until(stopped.clone())));
            for index in 0..servers {
                let target = data.path().join(format!("target-{index}"));
                std::fs::create_dir_all(&target).expect("target directory");
                let config = ServerConfig {
                    meta: meta.clone(),
                    listen: "127.0.0.1:0".to_string(),
                    targets: vec![target],
                    heartbeat_ms: 200,
                    key: Some(server_key.clone()),
                    ..ServerConfig::default()
                };
                let server = Server::bind(config).await.expect("bind server");
                tokio::spawn(server.serve(until(stopped.clone())));
            }
            meta
        });
        let cluster = Cluster { meta, client_key, runtime: Some(runtime), stop, _data: data };
        let client = cluster.client();
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.status().map(|targets| targets.len()).unwrap_or(0) < servers {
            assert!(Instant::now() < deadline, "servers did not register");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn client(&self) -> flotilla_client::Client {
        let mut config = flotilla_client::ClientConfig::new(&self.meta);
        config.key = Some(self.client_key.clone());
        flotilla_client::Client::with_config(config).expect("client")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// The folder holding libflotilla_mpiio_core.so for this build (the newer of target/<profile>
/// and its deps/).
fn core_library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps folder");
    let profile = deps.parent().expect("profile folder");
    let modified =
        |dir: &Path| std::fs::metadata(dir.join("libflotilla_mpiio_core.so")).and_then(|m| m.modified()).ok();
    [profile, deps]
        .into_iter()
        .filter_map(|dir| modified(dir).map(|time| (time, dir)))
        .max_by_key(|(time, _)| *time)
        .map(|(_, dir)| dir.to_path_buf())
        .unwrap_or_else(|| panic!("libflotilla_mpiio_core.so not found next to {}", exe.display()))
}

fn require(program: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "{program} is not installed: scripts/test.sh installs it (apt-get install openmpi-bin libopenmpi-dev mpich libmpich-dev)"
    );
}

fn run(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Builds libflotilla_mpiio.so for one MPI, and each of `programs` (`c/tests/NAME.c`) linked
/// with it, in `dir`; returns the programs' paths.
fn build<const N: usize>(compiler: &str, dir: &Path, programs: [&str; N]) -> [PathBuf; N] {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let core = core_library_dir();
    let library = dir.join("libflotilla_mpiio.so");
    run(
        Command::new(compiler)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC"])
            .arg(crate_dir.join("c/flotilla_mpiio.c"))
            .arg("-L")
            .arg(&core)
            .arg("-lflotilla_mpiio_core")
            .arg(format!("-Wl,-rpath,{}", core.display()))
            .arg("-o")
            .arg(&library),
        &format!("{compiler} libflotilla_mpiio.so"),
    );
    programs.map(|name| {
        let program = dir.join(name);
        run(
            Command::new(compiler)
                .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
                .arg(crate_dir.join(format!("c/tests/{name}.c")))
                .arg("-L")
                .arg(dir)
                .arg("-lflotilla_mpiio")
                .arg(format!("-Wl,-rpath,{}", dir.display()))
                .arg("-o")
                .arg(&program),
            &format!("{compiler} {name}.c"),
        );
        program
    })
}

/// Runs the program on 4 ranks with `prefix`; returns its stdout.
fn run_program(launcher: &[&str], program: &Path, prefix: &str, cluster: &Cluster) -> String {
    let mut command = Command::new("timeout");
    command
        .arg(RUN_TIMEOUT_S.to_string())
        .args(launcher)
        .arg(program)
        .arg(prefix)
        .env_remove("LD_LIBRARY_PATH")
        .env("FLOTILLA_META", &cluster.meta)
        .env("FLOTILLA_KEY", &cluster.client_key)
        .env("FLOTILLA_MPIIO_VERBOSE", "1");
    let stdout = run(&mut command, &format!("{} {prefix}", launcher.join(" ")));
    assert!(stdout.contains("all checks passed"), "{stdout}");
    stdout
}

fn digests(stdout: &str) -> Vec<String> {
    let mut lines: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("cube ") || l.starts_with("records ") || l.starts_with("structs "))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[test]
fn views_and_datatypes_match_a_local_run_under_both_mpis() {
    for (_, compiler, launcher) in MPIS {
        require(compiler);
        require(launcher[0]);
    }
    let cluster = Cluster::start(4);
    let client = cluster.client();
    for (name, compiler, launcher) in MPIS {
        let work = tempfile::tempdir().expect("work folder");
        let [program] = build(compiler, work.path(), ["views"]);
        let local = work.path().join("local");
        std::fs::create_dir(&local).expect("local folder");
        let local_out = run_program(launcher, &program, &local.display().to_string(), &cluster);
        client.mkdir(&format!("/{name}"), 0o755).expect("mkdir");
        let remote_out = run_program(launcher, &program, &format!("flotilla:/{name}"), &cluster);
        assert_eq!(
            digests(&local_out),
            digests(&remote_out),
            "{name}: digests of the local and the Flotilla run"
        );
        assert_eq!(digests(&local_out).len(), 3, "{local_out}");
        for file in ["cube", "records", "structs", "entry"] {
            let expected = std::fs::read(local.join(file)).expect("local file");
            let remote = client.open(&format!("/{name}/{file}")).expect("open the Flotilla file");
            let mut got = vec![0u8; expected.len() + 64];
            let read = remote.read_at(0, &mut got).expect("read the Flotilla file");
            got.truncate(read);
            if file == "structs" {
                // set_size extended the file by 1000 bytes at the end of the program.
                assert_eq!(got.len(), expected.len(), "{name}: {file} size");
            }
            assert!(
                got == expected,
                "{name}: {file} differs from the local run's ({} vs {} bytes)",
                got.len(),
                expected.len()
            );
        }
    }
}

/// Write and read requests each server has served so far, by server address.
fn requests_per_server(client: &flotilla_client::Client) -> BTreeMap<String, (u64, u64)> {
    let servers: BTreeSet<String> =
        client.status().expect("status").into_iter().map(|target| target.server).collect();
    servers
        .into_iter()
        .map(|server| {
            let stats = client.server_stats(&server).expect("server statistics");
            (server, (stats.total.write_ops, stats.total.read_ops))
        })
        .collect()
}

/// Issue 36's counted test: a 4-rank subarray write of a 3-D block (each rank's block strided
/// in the file and touching every one of the file's 4 servers) is one write request per rank
/// per server, and its collective read one read request per rank per server, by the servers'
/// own statistics; the file holds every value.
#[test]
fn a_subarray_write_is_one_request_per_rank_per_server_under_both_mpis() {
    const RANKS: u64 = 4;
    const SERVERS: usize = 4;
    const N: usize = 64;
    for (_, compiler, launcher) in MPIS {
        require(compiler);
        require(launcher[0]);
    }
    let cluster = Cluster::start(SERVERS);
    let client = cluster.client();
    for (name, compiler, launcher) in MPIS {
        let work = tempfile::tempdir().expect("work folder");
        let [program] = build(compiler, work.path(), ["counted"]);
        client.mkdir(&format!("/{name}"), 0o755).expect("mkdir");
        let before = requests_per_server(&client);
        assert_eq!(before.len(), SERVERS, "servers: {before:?}");
        run_program(launcher, &program, &format!("flotilla:/{name}/cube"), &cluster);
        let after = requests_per_server(&client);
        for (server, (writes, reads)) in &after {
            let (writes_before, reads_before) = before[server];
            assert_eq!(
                (writes - writes_before, reads - reads_before),
                (RANKS, RANKS),
                "{name}: write and read requests served by {server}"
            );
        }
        check_cube(&client, &format!("/{name}/cube"), N);
    }
}

/// The Flotilla file `path` is an `n`³ float64 array whose cell i holds i + 0.5, no longer.
fn check_cube(client: &flotilla_client::Client, path: &str, n: usize) {
    let file = client.open(path).expect("open the cube");
    let mut bytes = vec![0u8; n * n * n * 8 + 8];
    assert_eq!(file.read_at(0, &mut bytes).expect("read the cube"), n * n * n * 8, "{path}: size");
    for (index, value) in bytes[..n * n * n * 8].chunks_exact(8).enumerate() {
        let value = f64::from_ne_bytes(value.try_into().expect("8 bytes"));
        assert_eq!(value, index as f64 + 0.5, "{path}: cell {index}");
    }
}

/// Open MPI's `launcher` with `library` preloaded into the ranks only (not into `mpirun`).
fn preloading(launcher: &[&str], library: &Path) -> Vec<String> {
    let ranks = launcher.iter().position(|argument| *argument == "-n").unwrap_or(launcher.len());
    let mut arguments: Vec<String> = launcher[..ranks].iter().map(|a| a.to_string()).collect();
    arguments.extend(["-x".to_string(), format!("LD_PRELOAD={}", library.display())]);
    arguments.extend(launcher[ranks..].iter().map(|a| a.to_string()));
    arguments
}

/// mpi4py's `MPI.File` with a subarray type, through the Open MPI build of the library
/// preloaded into Debian's `python3-mpi4py` (built with Open MPI; `scripts/test.sh` installs
/// it): `tests/python/subarray.py` on 4 ranks, then every value of the file.
#[test]
fn mpi4py_writes_a_subarray_through_the_preloaded_library() {
    const PYTHON: &str = "/usr/bin/python3";
    let (_, compiler, launcher) = MPIS[1];
    require(compiler);
    require(launcher[0]);
    let found = Command::new(PYTHON).args(["-c", "import mpi4py.MPI"]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "Debian's mpi4py is not installed: scripts/test.sh installs it (apt-get install python3-mpi4py)"
    );
    let cluster = Cluster::start(4);
    let client = cluster.client();
    let work = tempfile::tempdir().expect("work folder");
    build(compiler, work.path(), []);
    client.mkdir("/py", 0o755).expect("mkdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/subarray.py");
    let launcher = preloading(launcher, &work.path().join("libflotilla_mpiio.so"));
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let mut command = Command::new("timeout");
    command
        .arg(RUN_TIMEOUT_S.to_string())
        .args(&launcher)
        .arg(PYTHON)
        .arg(&script)
        .arg("flotilla:/py/cube")
        .env_remove("LD_LIBRARY_PATH")
        .env("FLOTILLA_META", &cluster.meta)
        .env("FLOTILLA_KEY", &cluster.client_key)
        .env("FLOTILLA_MPIIO_VERBOSE", "1");
    let stdout = run(&mut command, "mpi4py subarray.py");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    check_cube(&client, "/py/cube", 16);
}

/// Parallel HDF5 from Debian (`libhdf5-openmpi-dev`, `h5pcc.openmpi`; `scripts/test.sh`
/// installs it) through the Open MPI build of the library, preloaded: `c/tests/hdf5.c` writes a
/// contiguous and a chunked dataset by hyperslabs from 4 ranks with collective transfers, closes,
/// opens the file again and reads every rank's part back, once on a local directory and once on
/// Flotilla; the two files must be equal byte for byte.
#[test]
fn parallel_hdf5_writes_and_reads_hyperslabs_through_the_preloaded_library() {
    const H5PCC: &str = "h5pcc.openmpi";
    let (_, compiler, launcher) = MPIS[1];
    require(compiler);
    require(launcher[0]);
    require(H5PCC);
    let cluster = Cluster::start(4);
    let client = cluster.client();
    let work = tempfile::tempdir().expect("work folder");
    build(compiler, work.path(), []);
    let program = work.path().join("hdf5");
    run(
        Command::new(H5PCC)
            .args(["-Wall", "-Werror"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("c/tests/hdf5.c"))
            .arg("-o")
            .arg(&program)
            .current_dir(work.path()),
        "h5pcc.openmpi hdf5.c",
    );
    client.mkdir("/h5", 0o755).expect("mkdir");
    let launcher = preloading(launcher, &work.path().join("libflotilla_mpiio.so"));
    let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
    let local = work.path().join("local.h5");
    run_program(&launcher, &program, &local.display().to_string(), &cluster);
    run_program(&launcher, &program, "flotilla:/h5/data.h5", &cluster);
    let expected = std::fs::read(&local).expect("the local run's file");
    assert!(expected.starts_with(b"\x89HDF\r\n\x1a\n"), "the local file is an HDF5 file");
    let file = client.open("/h5/data.h5").expect("the HDF5 file is on Flotilla");
    let mut got = vec![0u8; expected.len() + 64];
    let read = file.read_at(0, &mut got).expect("read the HDF5 file");
    got.truncate(read);
    assert!(
        got == expected,
        "the HDF5 file differs from the local run's ({read} vs {} bytes)",
        expected.len()
    );
}
