//! Namespace calls addressed by identity, for the mount: a directory by its inode id and a
//! name in it as bytes. Nothing here rebuilds a path, so a name that another client moved
//! or replaced is never mistaken for the entry this client knew.

use crate::client::{Client, CreateOptions};
use crate::error::{done_reply, entry_reply, unexpected, ClientError};
use crate::file::File;
use crate::posix::Owner;
use crate::transport::Transport;
use flotilla_proto::{
    CreateSpec, EntryInfo, ErrorCode, ListedEntry, MetaReply, MetaRequest, RenameMode, READDIR_ENTRIES_MAX,
};
use flotilla_types::FileKind;
use std::sync::atomic::Ordering;

/// A directory entry's place: the directory's inode id and the name in it.
#[derive(Clone, Copy, Debug)]
pub struct At<'a> {
    pub parent: u64,
    pub name: &'a [u8],
}

impl At<'_> {
    fn describe(&self) -> String {
        format!("{:?} in directory {:016x}", String::from_utf8_lossy(self.name), self.parent)
    }
}

impl Client {
    /// The entry `at` names (a symlink is returned, not followed).
    pub fn lookup_at(&self, at: At<'_>) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::LookupAt { parent: at.parent, name: at.name.to_vec() };
        let mut entry = entry_reply(self.meta(request)?, "lookup")?;
        self.overlay(entry.id, &mut entry.attrs);
        Ok(entry)
    }

    /// Creates a file at `at` owned by `owner`, with its subfiles, and opens it. Fails with
    /// `AlreadyExists` if the name is taken (the caller decides whether to open that instead).
    pub fn create_at(&self, at: At<'_>, options: &CreateOptions, owner: Owner) -> Result<File, ClientError> {
        let spec = CreateSpec {
            mode: options.mode,
            uid: owner.uid,
            gid: owner.gid,
            subfiles: options.subfiles,
            targets: options.targets.clone(),
            layout: options.layout,
            exclusive: true,
        };
        let (core, parent, name) = (self.core.clone(), at.parent, at.name.to_vec());
        let client = self.clone();
        let path = at.describe();
        let file = self.block_on(async move {
            if !core.create_at_open_refused.load(Ordering::Relaxed) {
                let request = MetaRequest::CreateAtOpen { parent, name: name.clone(), spec: spec.clone(), session: core.transport.session() };
                match core.transport.meta_call(request).await {
                    Ok(reply) => return crate::opens::opened_file(client, path, entry_reply(reply, "create")?),
                    Err(ClientError::Meta(error)) if error.code == ErrorCode::BadRequest => {
                        tracing::info!(%error, "the metadata service does not know CreateAtOpen; creating in two requests");
                        core.create_at_open_refused.store(true, Ordering::Relaxed);
                    }
                    Err(error) => return Err(error),
                }
            }
            let entry = create_entry_at(&core.transport, parent, name, spec).await?;
            crate::opens::open_file(client, path, entry.id).await
        })?;
        Ok(file.with_no_overlap(options.no_overlap))
    }

    pub fn mkdir_at(&self, at: At<'_>, mode: u32, owner: Owner) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::MkdirAt {
            parent: at.parent,
            name: at.name.to_vec(),
            mode,
            uid: owner.uid,
            gid: owner.gid,
        };
        entry_reply(self.meta(request)?, "mkdir")
    }

    /// A FIFO, socket or device node (`rdev` for devices, else 0).
    pub fn mknod_at(
        &self,
        at: At<'_>,
        kind: FileKind,
        rdev: u64,
        mode: u32,
        owner: Owner,
    ) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::MknodAt {
            parent: at.parent,
            name: at.name.to_vec(),
            kind,
            rdev,
            mode,
            uid: owner.uid,
            gid: owner.gid,
        };
        entry_reply(self.meta(request)?, "mknod")
    }

    pub fn symlink_at(&self, at: At<'_>, target: &str, owner: Owner) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::SymlinkAt {
            parent: at.parent,
            name: at.name.to_vec(),
            target: target.to_string(),
            uid: owner.uid,
            gid: owner.gid,
        };
        entry_reply(self.meta(request)?, "symlink")
    }

    /// A new name `at` for entry `id` (a hard link by identity).
    pub fn link_at(&self, id: u64, at: At<'_>) -> Result<EntryInfo, ClientError> {
        let request = MetaRequest::LinkAt { id, parent: at.parent, name: at.name.to_vec() };
        entry_reply(self.meta(request)?, "link")
    }

    pub fn unlink_at(&self, at: At<'_>) -> Result<(), ClientError> {
        let request = MetaRequest::UnlinkAt { parent: at.parent, name: at.name.to_vec(), id: None };
        done_reply(self.meta(request)?, "unlink")
    }

    pub fn rmdir_at(&self, at: At<'_>) -> Result<(), ClientError> {
        done_reply(self.meta(MetaRequest::RmdirAt { parent: at.parent, name: at.name.to_vec() })?, "rmdir")
    }

    /// `renameat2` between places by directory id.
    pub fn rename_at(&self, from: At<'_>, to: At<'_>, mode: RenameMode) -> Result<(), ClientError> {
        let request = MetaRequest::RenameAt {
            from_parent: from.parent,
            from_name: from.name.to_vec(),
            to_parent: to.parent,
            to_name: to.name.to_vec(),
            mode,
        };
        done_reply(self.meta(request)?, "rename")
    }

    /// How many inodes the namespace holds (`statfs`'s files in use).
    pub fn inode_count(&self) -> Result<u64, ClientError> {
        match self.meta(MetaRequest::CountInodes)? {
            MetaReply::Inodes { count } => Ok(count),
            other => Err(unexpected("count inodes", &other)),
        }
    }

    /// Sets entry `id`'s atime as a read does (no ctime change).
    pub fn touch_atime(&self, id: u64, atime_ns: i64) -> Result<(), ClientError> {
        match self.meta(MetaRequest::TouchAtime { id, atime_ns })? {
            MetaReply::Attributes(_) => Ok(()),
            other => Err(unexpected("touch atime", &other)),
        }
    }

    /// Sets the default layout of directory `id` (`None` clears it) or the layout of the
    /// empty file `id`.
    pub fn set_layout_id(
        &self,
        id: u64,
        layout: Option<flotilla_types::Layout>,
    ) -> Result<EntryInfo, ClientError> {
        self.set_layout_id_replicated(id, layout.map(flotilla_types::ReplicatedLayout::single))
    }

    /// `set_layout_id` with a directory's default replica count (`Client::set_layout_replicated`).
    pub fn set_layout_id_replicated(
        &self,
        id: u64,
        layout: Option<flotilla_types::ReplicatedLayout>,
    ) -> Result<EntryInfo, ClientError> {
        let replicas = layout.map_or(1, |l| l.replicas);
        let layout = layout.map(|l| l.layout);
        entry_reply(self.meta(MetaRequest::SetLayoutId { id, layout, replicas })?, "set layout")
    }

    /// Sets or clears file `id`'s no-overlap hint (`user.flotilla.no_overlap`): its writers
    /// promise never to write overlapping bytes, so clients take no byte-range tokens for
    /// it. The file's owner or root only.
    pub fn set_no_overlap_id(&self, id: u64, no_overlap: bool) -> Result<EntryInfo, ClientError> {
        entry_reply(self.meta(MetaRequest::SetNoOverlapId { id, no_overlap })?, "set the no-overlap hint")
    }

    /// Every entry of directory `id` with its attributes (readdirplus), fetched in pages of
    /// `READDIR_ENTRIES_MAX` (one round trip each), at most `entries_max` (`OverLimit`
    /// beyond).
    pub fn readdir_plus_id(
        &self,
        id: u64,
        entries_max: usize,
    ) -> Result<Vec<flotilla_proto::ListedEntryPlus>, ClientError> {
        self.paged(
            id,
            entries_max,
            |entry: &flotilla_proto::ListedEntryPlus| &entry.name,
            |after| match self.meta(MetaRequest::ReaddirPlusId {
                id,
                after,
                entries_max: READDIR_ENTRIES_MAX,
            })? {
                MetaReply::ListingPlus(page) => Ok(page),
                other => Err(unexpected("readdirplus", &other)),
            },
        )
    }

    /// Every entry of directory `id`, fetched in pages of `READDIR_ENTRIES_MAX`, at most
    /// `entries_max` (`OverLimit` beyond: the caller bounds what it holds).
    pub fn readdir_id(&self, id: u64, entries_max: usize) -> Result<Vec<ListedEntry>, ClientError> {
        self.paged(
            id,
            entries_max,
            |entry: &ListedEntry| &entry.name,
            |after| match self.meta(MetaRequest::ReaddirId { id, after, entries_max: READDIR_ENTRIES_MAX })? {
                MetaReply::Listing(page) => Ok(page),
                other => Err(unexpected("readdir", &other)),
            },
        )
    }

    /// Gathers the pages `fetch` returns (each after the last name so far) until one is short
    /// of `READDIR_ENTRIES_MAX`; `OverLimit` past `entries_max` entries.
    fn paged<T>(
        &self,
        id: u64,
        entries_max: usize,
        name_of: impl Fn(&T) -> &Vec<u8>,
        fetch: impl Fn(Option<Vec<u8>>) -> Result<Vec<T>, ClientError>,
    ) -> Result<Vec<T>, ClientError> {
        let mut all: Vec<T> = Vec::new();
        loop {
            let page = fetch(all.last().map(|entry| name_of(entry).clone()))?;
            let last = page.len() < READDIR_ENTRIES_MAX as usize;
            all.extend(page);
            if all.len() > entries_max {
                let message = format!("directory {id:016x} has more than {entries_max} entries");
                return Err(ClientError::Meta(flotilla_proto::WireError::new(ErrorCode::OverLimit, message)));
            }
            if last {
                return Ok(all);
            }
        }
    }
}

/// Creates the entry (exclusively); its subfiles are made by their servers on first use.
async fn create_entry_at(
    transport: &Transport,
    parent: u64,
    name: Vec<u8>,
    spec: CreateSpec,
) -> Result<EntryInfo, ClientError> {
    let request = MetaRequest::CreateAt { parent, name, spec };
    entry_reply(transport.meta_call(request).await?, "create")
}
