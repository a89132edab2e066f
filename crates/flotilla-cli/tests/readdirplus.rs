//! `ls -l` through the mount costs round trips per page, not per entry: the mount answers the
//! kernel's READDIRPLUS from `ReaddirPlusId` pages (entries with attributes), so the kernel
//! looks nothing up one entry at a time. Counted on the metadata service's own metrics.

mod common;

use common::{http_get, is_mounted, path, Local, FLOTILLA};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// More than one `READDIR_ENTRIES_MAX` (4096) page.
const ENTRIES: usize = 4500;
const CREATE_THREADS: usize = 8;

/// How many metadata requests of `kind` the cluster's metadata service has answered.
fn answered(cluster: &Local, kind: &str) -> u64 {
    let metrics = cluster.metrics.as_deref().expect("the cluster serves metrics");
    let text = http_get(metrics, "/metrics").expect("cluster metrics");
    let label = format!("kind=\"{kind}\"");
    text.lines()
        .filter(|line| line.starts_with("flotilla_meta_request_duration") && line.contains("_count{"))
        .filter(|line| line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
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
    let cluster = Local::start(1, true);
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

    let (lookups, pages) = (answered(&cluster, "lookup_at"), answered(&cluster, "readdir_plus_id"));
    // `ls -l`: list the directory, then lstat every entry.
    let mut listed = 0;
    for entry in std::fs::read_dir(dir.join("big")).expect("read_dir") {
        let entry = entry.expect("entry");
        let metadata = std::fs::symlink_metadata(entry.path()).expect("lstat");
        assert!(metadata.is_file() && metadata.len() == 0, "{:?}: {metadata:?}", entry.path());
        listed += 1;
    }
    assert_eq!(listed, ENTRIES);
    let lookups = answered(&cluster, "lookup_at") - lookups;
    let pages = answered(&cluster, "readdir_plus_id") - pages;
    assert!(pages >= 2, "{ENTRIES} entries need at least two pages; {pages} were asked");
    assert!(pages <= 8, "{pages} readdirplus pages for {ENTRIES} entries");
    assert!(lookups <= 10, "{lookups} lookups for an `ls -l` of {ENTRIES} entries (readdirplus not used?)");
    drop(mount);
}
