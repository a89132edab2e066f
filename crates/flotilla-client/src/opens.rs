//! Opening files: the client calls that hand out a [`File`] (or an [`EnwrichFile`], which joins
//! its job group with one). Every handle is announced to the
//! metadata service (`Opened`, or in the same round trip as the lookup or create) and holds an
//! [`OpenGuard`] that withdraws it when its last clone goes (`lease.rs`).

use crate::client::{current_gid, current_uid, Client, CreateOptions, OpenOptions};
use crate::enwrich::{EnwrichFile, EnwrichOptions};
use crate::error::{entry_reply, unexpected, ClientError};
use crate::file::File;
use crate::handle::Handle;
use crate::lease::OpenGuard;
use crate::transport::Transport;
use flotilla_proto::{CreateSpec, EntryInfo, ErrorCode, MetaReply, MetaRequest};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Client {
    /// Creates a file with `options.subfiles` subfiles, each with a `data` fork.
    pub fn create(&self, path: &str, options: &CreateOptions) -> Result<File, ClientError> {
        let owner = (current_uid(), current_gid());
        let (spec, replicas) = (create_spec(options.clone(), owner), options.replicas);
        let file = self.block_on(create_open_replicated(self.clone(), path.to_string(), spec, replicas))?;
        Ok(file.with_no_overlap(options.no_overlap))
    }

    /// Non-blocking `create`.
    pub fn create_nb(&self, path: &str, options: &CreateOptions) -> Handle<File> {
        let client = self.clone();
        let path = path.to_string();
        let owner = (current_uid(), current_gid());
        let no_overlap = options.no_overlap;
        let created =
            create_open_replicated(client, path, create_spec(options.clone(), owner), options.replicas);
        self.spawn(async move { Ok(created.await?.with_no_overlap(no_overlap)) })
    }

    /// Opens an existing file.
    pub fn open(&self, path: &str) -> Result<File, ClientError> {
        self.open_with(path, &OpenOptions::default())
    }

    /// Opens an existing file with `options`.
    pub fn open_with(&self, path: &str, options: &OpenOptions) -> Result<File, ClientError> {
        if let Some(file) = self.open_path(path)? {
            // Flush-on-read: this process's ENWRICH writes to the file reach the servers first.
            self.flush_enwrich(file.id())?;
            return Ok(file.with_no_overlap(options.no_overlap));
        }
        let entry = self.stat(path)?;
        if entry.attrs.kind != flotilla_types::FileKind::File {
            return Err(ClientError::NotAFile { path: path.to_string() });
        }
        // Flush-on-read: this process's ENWRICH writes to the file reach the servers first.
        self.flush_enwrich(entry.id)?;
        let file = self.block_on(open_file(self.clone(), path.to_string(), entry.id))?;
        Ok(file.with_no_overlap(options.no_overlap))
    }

    /// Opens `path` for writing in ENWRICH mode as a member of job `options.job_name`.
    pub fn open_enwrich(&self, path: &str, options: &EnwrichOptions) -> Result<EnwrichFile, ClientError> {
        let file = self.open(path)?;
        EnwrichFile::join(file, options.clone())
    }

    /// Opens, in ENWRICH mode, a file already open as `file` (the mount opens by id).
    pub fn enwrich_file(&self, file: File, options: &EnwrichOptions) -> Result<EnwrichFile, ClientError> {
        EnwrichFile::join(file, options.clone())
    }

    /// Opens `path` in one round trip (`OpenPath`), unless its attributes are cached (then
    /// the lookup costs nothing and `Opened` alone is sent) or the service does not know the
    /// request (it is then not sent again); `None` in those cases.
    fn open_path(&self, path: &str) -> Result<Option<File>, ClientError> {
        let core = &self.core;
        if core.open_path_refused.load(Ordering::Relaxed) || core.attrs.cached(path).is_some() {
            return Ok(None);
        }
        let request = MetaRequest::OpenPath { path: path.to_string(), session: core.transport.session() };
        let entry = match self.meta(request) {
            Ok(reply) => entry_reply(reply, "open")?,
            Err(ClientError::Meta(error)) if error.code == ErrorCode::BadRequest => {
                tracing::info!(%error, "the metadata service does not know OpenPath; opening in two requests");
                core.open_path_refused.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        if entry.attrs.kind != flotilla_types::FileKind::File {
            return Err(ClientError::NotAFile { path: path.to_string() });
        }
        opened_file(self.clone(), path.to_string(), entry).map(Some)
    }
}

/// Creates the file's entry, owned by `owner` (uid, gid); its subfiles are made by their
/// servers on first use.
pub(crate) async fn create_file(
    transport: Arc<Transport>,
    path: String,
    options: CreateOptions,
    owner: (u32, u32),
) -> Result<EntryInfo, ClientError> {
    // Subfiles are created lazily: each server makes its subfile on the first request for it.
    let create = |path, spec| MetaRequest::Create { path, spec };
    let (entry, _created, _) = create_entry(&transport, &path, create_spec(options, owner), create).await?;
    Ok(entry)
}

/// Creates the file and opens it: one round trip (`CreateOpen`) for a new file.
/// `create_open`, or for more than one replica `CreateReplicated` (which places the file on
/// chains) and then `Opened`.
async fn create_open_replicated(
    client: Client,
    path: String,
    spec: CreateSpec,
    replicas: u32,
) -> Result<File, ClientError> {
    if replicas <= 1 {
        return create_open(client, path, spec).await;
    }
    let request = MetaRequest::CreateReplicated { path: path.clone(), spec, replicas };
    let entry = entry_reply(client.core.transport.meta_call(request).await?, "create")?;
    open_file(client, path, entry.id).await
}

async fn create_open(client: Client, path: String, spec: CreateSpec) -> Result<File, ClientError> {
    let session = client.core.transport.session();
    if client.core.attrs.enabled() {
        // The new file's attributes come with grants: a stat of it asks nothing.
        client.core.attrs.begin(client.meta_line());
        let create = |path, spec| MetaRequest::CreateOpenCached { path, spec, session };
        match create_entry(&client.core.transport, &path, spec.clone(), create).await {
            Ok((entry, _created, grants)) => {
                client.core.attrs.answer(&path, &entry, &grants);
                return opened_file(client, path, entry);
            }
            Err(ClientError::Meta(error)) if error.code == ErrorCode::BadRequest => {
                client.core.attrs.abandon();
                tracing::info!(%error, "the metadata service does not cache attributes");
                client.core.attrs.disable();
            }
            Err(error) => {
                client.core.attrs.abandon();
                return Err(error);
            }
        }
    }
    let create = |path, spec| MetaRequest::CreateOpen { path, spec, session };
    let (entry, _created, _) = create_entry(&client.core.transport, &path, spec, create).await?;
    opened_file(client, path, entry)
}

/// What a program asked for, as the request carries it.
fn create_spec(options: CreateOptions, owner: (u32, u32)) -> CreateSpec {
    CreateSpec {
        mode: options.mode,
        uid: owner.0,
        gid: owner.1,
        subfiles: options.subfiles,
        targets: options.targets,
        layout: options.layout,
        exclusive: options.exclusive,
    }
}

/// Creates the entry, or (without `spec.exclusive`) returns the existing file, with the
/// request `create` makes. The flag says whether this call created it: an exclusive create
/// is tried first, so an existing file is never mistaken for a new one.
async fn create_entry(
    transport: &Transport,
    path: &str,
    spec: CreateSpec,
    create: impl Fn(String, CreateSpec) -> MetaRequest,
) -> Result<(EntryInfo, bool, Vec<flotilla_proto::InodeToken>), ClientError> {
    let exclusive = CreateSpec { exclusive: true, ..spec.clone() };
    let first = transport.meta_call(create(path.to_string(), exclusive)).await;
    let (reply, created) = match first {
        Err(ClientError::Meta(error)) if error.code == ErrorCode::AlreadyExists && !spec.exclusive => {
            (transport.meta_call(create(path.to_string(), spec)).await?, false)
        }
        other => (other?, true),
    };
    match reply {
        MetaReply::Entry(entry) => Ok((entry, created, Vec::new())),
        MetaReply::CachedEntry { entry, grants } => Ok((entry, created, grants)),
        other => Err(unexpected("create", &other)),
    }
}

/// Announces an open of file `id` and returns the file handle (with its fresh entry).
pub(crate) async fn open_file(client: Client, path: String, id: u64) -> Result<File, ClientError> {
    let core = client.core.clone();
    let guard = OpenGuard::register(core.clone(), client.runtime.handle().clone(), id);
    let entry = match core
        .transport
        .meta_call(MetaRequest::Opened { session: core.transport.session(), id })
        .await?
    {
        MetaReply::Entry(entry) => entry,
        other => return Err(unexpected("open", &other)),
    };
    handle(client, path, entry, guard)
}

/// The handle on a file the metadata service already counts as opened by this session (its
/// `CreateOpen` reply): counted here too, and closed there when the handle goes.
pub(crate) fn opened_file(client: Client, path: String, entry: EntryInfo) -> Result<File, ClientError> {
    let guard = OpenGuard::register(client.core.clone(), client.runtime.handle().clone(), entry.id);
    handle(client, path, entry, guard)
}

fn handle(client: Client, path: String, mut entry: EntryInfo, guard: OpenGuard) -> Result<File, ClientError> {
    if entry.attrs.kind != flotilla_types::FileKind::File {
        return Err(ClientError::NotAFile { path });
    }
    client.core.overlay(entry.id, &mut entry.attrs);
    Ok(File::opened(client, path, entry, Arc::new(guard)))
}
