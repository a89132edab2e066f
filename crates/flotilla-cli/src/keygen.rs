//! `flotilla keygen`: creates a cluster CA and its first credentials, or issues more.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use flotilla_auth::{ClusterCa, IssueRequest, Limits, Role};

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct KeygenArgs {
    #[command(subcommand)]
    command: Option<KeygenCommand>,
    /// Folder to create cluster.key, server.cred and client.cred in (created, mode 0700).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum KeygenCommand {
    /// Issues one credential signed by an existing cluster CA.
    Issue(IssueArgs),
}

#[derive(clap::Args, Debug)]
struct IssueArgs {
    /// The cluster CA file made by `flotilla keygen --out DIR` (DIR/cluster.key).
    #[arg(long)]
    ca: PathBuf,
    /// server, client, or meta (a metadata group node's peer links).
    #[arg(long, value_parser = parse_role)]
    role: Role,
    /// Name of the credential (shown by `flotilla status` and in logs).
    #[arg(long)]
    name: String,
    #[arg(long)]
    read_only: bool,
    /// Only paths under this absolute path are reachable.
    #[arg(long)]
    subtree: Option<String>,
    #[arg(long)]
    uid: Option<u32>,
    #[arg(long)]
    gid: Option<u32>,
    #[arg(long)]
    root_squash: bool,
    /// Seconds from now after which the credential is refused.
    #[arg(long)]
    expires_in_secs: Option<u64>,
    /// File to write (mode 0600; must not exist).
    #[arg(long)]
    out: PathBuf,
}

fn parse_role(text: &str) -> Result<Role, String> {
    match text {
        "server" => Ok(Role::Server),
        "client" => Ok(Role::Client),
        "meta" => Ok(Role::Meta),
        other => Err(format!("role {other:?} is not server, client or meta")),
    }
}

pub fn run(args: KeygenArgs) -> anyhow::Result<()> {
    match (args.command, args.out) {
        (Some(KeygenCommand::Issue(issue_args)), _) => issue(issue_args),
        (None, Some(out)) => {
            let keys = create_cluster(&out)?;
            println!("ca={}", keys.ca.display());
            println!("server={}", keys.server.display());
            println!("key={}", keys.client.display());
            Ok(())
        }
        (None, None) => bail!("flotilla keygen needs --out DIR (or the subcommand `issue`)"),
    }
}

/// The files of a cluster's keys.
pub struct KeyPaths {
    pub ca: PathBuf,
    pub server: PathBuf,
    pub client: PathBuf,
}

impl KeyPaths {
    pub fn in_dir(dir: &Path) -> KeyPaths {
        KeyPaths {
            ca: dir.join("cluster.key"),
            server: dir.join("server.cred"),
            client: dir.join("client.cred"),
        }
    }
}

/// The keys in `dir`, created on first use (mode 0600 in a 0700 folder) and reused after.
pub fn ensure_cluster(dir: &Path) -> anyhow::Result<KeyPaths> {
    let keys = KeyPaths::in_dir(dir);
    if keys.ca.exists() && keys.server.exists() && keys.client.exists() {
        return Ok(keys);
    }
    create_cluster(dir)
}

/// Creates `dir/cluster.key`, `dir/server.cred` and `dir/client.cred`; refuses to overwrite.
pub fn create_cluster(dir: &Path) -> anyhow::Result<KeyPaths> {
    use std::os::unix::fs::DirBuilderExt;
    // Only the key folder itself is private; its parents get the usual mode.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create key folder {}", dir.display()))?;
    let keys = KeyPaths::in_dir(dir);
    if keys.ca.exists() {
        bail!("{} already exists; not overwriting a cluster CA", keys.ca.display());
    }
    let ca = ClusterCa::generate();
    ca.save(&keys.ca)?;
    let plain = |role, name: &str| IssueRequest {
        role,
        name: name.into(),
        limits: Limits::default(),
        expires_unix_secs: None,
    };
    ca.issue(plain(Role::Server, "server"))?.save(&keys.server)?;
    ca.issue(plain(Role::Client, "client"))?.save(&keys.client)?;
    Ok(keys)
}

/// `dir/meta-ID.cred`: a metadata group node's credential (role meta), issued by the CA in
/// `dir` on first use and reused after.
pub fn ensure_meta(dir: &Path, id: u64) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("meta-{id}.cred"));
    if path.exists() {
        return Ok(path);
    }
    let ca = ClusterCa::load(&KeyPaths::in_dir(dir).ca).context("the cluster CA")?;
    let request = IssueRequest {
        role: Role::Meta,
        name: format!("meta-{id}"),
        limits: Limits::default(),
        expires_unix_secs: None,
    };
    ca.issue(request)?.save(&path)?;
    Ok(path)
}

fn issue(args: IssueArgs) -> anyhow::Result<()> {
    if args.out.exists() {
        bail!("{} already exists; not overwriting a credential", args.out.display());
    }
    let ca = ClusterCa::load(&args.ca).context("--ca")?;
    let expires_unix_secs = match args.expires_in_secs {
        Some(secs) => Some(now_unix_secs()? + secs),
        None => None,
    };
    let limits = Limits {
        read_only: args.read_only,
        subtree: args.subtree,
        uid: args.uid,
        gid: args.gid,
        root_squash: args.root_squash,
    };
    let request = IssueRequest { role: args.role, name: args.name, limits, expires_unix_secs };
    ca.issue(request)?.save(&args.out)?;
    println!("key={}", args.out.display());
    Ok(())
}

fn now_unix_secs() -> anyhow::Result<u64> {
    Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs())
}
