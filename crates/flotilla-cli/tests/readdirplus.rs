//! `ls -l` through the mount costs round trips per page, not per entry: the mount answers the
//! kernel's READDIRPLUS from `ReaddirPlusId` pages (entries with attributes), so the kernel
//! looks nothing up one entry at a time. Counted on the metadata service's own metrics.

mod common;

use common::{is_mounted, path, FLOTILLA};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// More than one `READDIR_ENTRIES_MAX` (4096) page.
const ENTRIES: usize = 4500;
const CREATE_THREADS: usize = 8;

/// A `flotilla local` cluster serving metrics, killed on drop.
struct Local {
    child: Child,
    meta: String,
    key: PathBuf,
    metrics: String,
    _dir: tempfile::TempDir,
}

impl Local {
    fn start() -> Local {
        let dir = tempfile::tempdir().expect("temporary folder");
        let args = ["local", "--servers", "1", "--listen", "127.0.0.1:0", "--data", path(dir.path())];
        let mut child = Command::new(FLOTILLA)
            .args(args)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env_remove("FLOTILLA_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flotilla local");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut next = |name: &str| {
            let line = lines.next().expect("a line from flotilla local").expect("utf-8 line");
            line.strip_prefix(&format!("{name}="))
                .unwrap_or_else(|| panic!("expected {name}=, got {line:?}"))
                .to_string()
        };
        let (meta, key) = (next("meta"), PathBuf::from(next("key")));
        let metrics = next("metrics");
        Local { child, meta, key, metrics, _dir: dir }
    }

    fn client(&self) -> flotilla_client::Client {
        let mut config = flotilla_client::ClientConfig::new(&self.meta);
        config.key = Some(self.key.clone());
        flotilla_client::Client::with_config(config).expect("client")
    }

    /// How many metadata requests of `kind` the service has answered.
    fn answered(&self, kind: &str) -> u64 {
        let text = http_get(&self.metrics, "/metrics").expect("cluster metrics");
        let label = format!("kind=\"{kind}\"");
        text.lines()
            .filter(|line| line.starts_with("flotilla_meta_request_duration") && line.contains("_count{"))
            .filter(|line| line.contains(&label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(addr: &str, target: &str) -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let request = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    Ok(body.to_string())
}

/// The mount process; unmounted and killed on drop.
struct Mount {
    child: Child,
    dir: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(20);
        while is_mounted(&self.dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn mount(cluster: &Local, dir: &Path) -> Mount {
    let mut child = Command::new(FLOTILLA)
        .arg("--key")
        .arg(&cluster.key)
        .args(["mount", "--meta", &cluster.meta, "--attr-timeout-ms", "60000", path(dir)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start flotilla mount");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line from the mount").expect("utf-8 line");
    assert!(first.starts_with("mount="), "the mount said {first:?}");
    let mount = Mount { child, dir: dir.to_path_buf() };
    assert!(is_mounted(dir), "{} is not mounted", dir.display());
    mount
}

#[test]
fn ls_l_of_a_big_directory_costs_round_trips_per_page_not_per_entry() {
    let cluster = Local::start();
    let client = cluster.client();
    client.mkdir("/big", 0o755).expect("mkdir");
    std::thread::scope(|scope| {
        for thread in 0..CREATE_THREADS {
            let client = client.clone();
            scope.spawn(move || {
                for index in (thread..ENTRIES).step_by(CREATE_THREADS) {
                    let name = format!("/big/e{index:05}");
                    client
                        .create(&name, &flotilla_client::CreateOptions::default())
                        .expect("create")
                        .close()
                        .expect("close");
                }
            });
        }
    });
    let holder = tempfile::tempdir().expect("temporary folder");
    let dir = holder.path().join("mnt");
    std::fs::create_dir(&dir).expect("mountpoint");
    let mount = mount(&cluster, &dir);

    let (lookups, pages) = (cluster.answered("lookup_at"), cluster.answered("readdir_plus_id"));
    // `ls -l`: list the directory, then lstat every entry.
    let mut listed = 0;
    for entry in std::fs::read_dir(dir.join("big")).expect("read_dir") {
        let entry = entry.expect("entry");
        let metadata = std::fs::symlink_metadata(entry.path()).expect("lstat");
        assert!(metadata.is_file() && metadata.len() == 0, "{:?}: {metadata:?}", entry.path());
        listed += 1;
    }
    assert_eq!(listed, ENTRIES);
    let lookups = cluster.answered("lookup_at") - lookups;
    let pages = cluster.answered("readdir_plus_id") - pages;
    assert!(pages >= 2, "{ENTRIES} entries need at least two pages; {pages} were asked");
    assert!(pages <= 8, "{pages} readdirplus pages for {ENTRIES} entries");
    assert!(lookups <= 10, "{lookups} lookups for an `ls -l` of {ENTRIES} entries (readdirplus not used?)");
    drop(mount);
}
