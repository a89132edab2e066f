//! Network namespaces for process tests (issue 33; reusable by the replication tests): each
//! host gets its own namespace, its own address in a private /24 the test picks
//! (`10.233.S.0/24`), and a veth link to a bridge in the test's own namespace, which has
//! the bridge's address `.1` and so reaches every host. A host's link is cut by setting
//! its bridge end down (`link_down`), which cuts it from everyone else.
//!
//! Needs root and `ip` (iproute2): [`Netns::usable`] says why not otherwise. Everything made
//! is removed on drop (also when a test panics), and namespaces left by a run that was
//! killed are removed by the next one (their names carry the dead run's pid).

use std::process::{Command, Stdio};

/// Prefix of every name made here (namespaces, bridge, links).
const PREFIX: &str = "flt";

/// The namespaces of one test, with their links and bridge.
pub struct Netns {
    tag: u32,
    subnet: u8,
    hosts: usize,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

impl Netns {
    /// `Ok` if this process may make namespaces (root, `ip` present), else why not.
    pub fn usable() -> Result<(), String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: network namespaces need root".into());
        }
        ip(&["netns", "list"]).map(|_| ())
    }

    /// `hosts` namespaces linked to a new bridge.
    pub fn create(hosts: usize) -> Result<Netns, String> {
        assert!(hosts < 100, "at most 99 hosts");
        Netns::remove_stale();
        let pid = std::process::id();
        let tag = pid % 100_000;
        let netns = Netns { tag, subnet: 100 + (tag % 150) as u8, hosts };
        let made = netns.make();
        if made.is_err() {
            netns.remove();
        }
        made.map(|()| netns)
    }

    fn make(&self) -> Result<(), String> {
        let bridge = self.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", self.bridge_address()), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for host in 0..self.hosts {
            let (name, outer, inner) = (self.name(host), self.outer_link(host), self.inner_link(host));
            ip(&["netns", "add", &name])?;
            ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &name])?;
            ip(&["-n", &name, "addr", "add", &format!("{}/24", self.address(host)), "dev", &inner])?;
            ip(&["-n", &name, "link", "set", &inner, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            ip(&["link", "set", &outer, "master", &bridge])?;
            ip(&["link", "set", &outer, "up"])?;
        }
        Ok(())
    }

    /// Namespace of host `host`.
    pub fn name(&self, host: usize) -> String {
        format!("{PREFIX}m{}-{host}", self.tag)
    }

    fn bridge(&self) -> String {
        format!("{PREFIX}b{}", self.tag)
    }

    /// The bridge end of host `host`'s link (in the test's namespace).
    pub fn outer_link(&self, host: usize) -> String {
        format!("{PREFIX}v{}-{host}", self.tag)
    }

    fn inner_link(&self, host: usize) -> String {
        format!("{PREFIX}p{}-{host}", self.tag)
    }

    /// Host `host`'s address.
    pub fn address(&self, host: usize) -> String {
        format!("10.233.{}.{}", self.subnet, 11 + host)
    }

    /// The test's own address on the bridge.
    pub fn bridge_address(&self) -> String {
        format!("10.233.{}.1", self.subnet)
    }

    /// The command prefix that runs a program in host `host`'s namespace. `ip netns exec`
    /// execs the program in place, so the child's pid is the program's own (a SIGKILL
    /// reaches it).
    pub fn exec_prefix(&self, host: usize) -> Vec<String> {
        vec!["netns".into(), "exec".into(), self.name(host)]
    }

    /// Runs `work` on a thread of this process moved into host `host`'s namespace (sockets
    /// it opens are the host's), and returns its result.
    pub fn run_in<T: Send + 'static>(&self, host: usize, work: impl FnOnce() -> T + Send + 'static) -> T {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::File::open(format!("/run/netns/{}", self.name(host))).expect("open the namespace");
        std::thread::spawn(move || {
            // SAFETY: setns on an open namespace file moves only this thread.
            let moved = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(moved, 0, "setns: {}", std::io::Error::last_os_error());
            work()
        })
        .join()
        .expect("the thread in the namespace panicked")
    }

    /// Cuts host `host` off (its link's bridge end down).
    pub fn link_down(&self, host: usize) -> Result<(), String> {
        ip(&["link", "set", &self.outer_link(host), "down"]).map(|_| ())
    }

    /// Links host `host` again.
    pub fn link_up(&self, host: usize) -> Result<(), String> {
        ip(&["link", "set", &self.outer_link(host), "up"]).map(|_| ())
    }

    fn remove(&self) {
        for host in 0..self.hosts {
            // Deleting a namespace deletes the link end in it, and so its peer.
            let _ = ip(&["netns", "del", &self.name(host)]);
            let _ = ip(&["link", "del", &self.outer_link(host)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }

    /// Removes namespaces and bridges of earlier runs whose process is gone.
    fn remove_stale() {
        let Ok(list) = ip(&["netns", "list"]) else { return };
        let alive = |tag: u32| {
            // The tag is the pid modulo 100 000: a live process with that remainder keeps it.
            std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|pid| pid % 100_000 == tag)
            })
        };
        for name in list.lines().filter_map(|line| line.split_whitespace().next()) {
            let Some(rest) = name.strip_prefix(&format!("{PREFIX}m")) else { continue };
            let Some(tag) = rest.split('-').next().and_then(|t| t.parse::<u32>().ok()) else { continue };
            if !alive(tag) {
                let _ = ip(&["netns", "del", name]);
                let _ = ip(&["link", "del", &format!("{PREFIX}b{tag}")]);
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}
