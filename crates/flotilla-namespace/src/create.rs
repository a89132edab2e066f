//! The operations that add names: `mkdir`, `create_file`, `symlink` and `link`, plus
//! `set_default_layout`, which decides the layout of files created later.

use crate::edit::{
    adjust_dir, check_layout, check_owner, check_subfile_count, insert_new, refuse_taken, Change, NLINK_MAX,
};
use crate::entry::Entry;
use crate::error::NamespaceError;
use crate::guard::may_add;
use crate::namespace::{new_attrs, Namespace};
use crate::placement::{check_targets, choose_targets, Spread, TargetUsage};
use crate::record::{Body, Inode};
use crate::request::{CreateFile, Owner};
use crate::schema::PLACEMENT_CURSOR_KEY;
use crate::tables::{Source, WriteTables};
use crate::walk::{locate_place, resolve, Place};
use flotilla_types::{
    split_path, Caller, FileKind, Layout, NameError, ReplicatedLayout, TargetId, TimeNs, PATH_BYTES_MAX,
};

impl Namespace {
    /// Creates a directory; it inherits its parent's default layout.
    pub fn mkdir(&self, path: &str, owner: Owner, now_ns: TimeNs) -> Result<Entry, NamespaceError> {
        self.mkdir_as(&Caller::root(), path, owner, now_ns)
    }

    /// `mkdir` for `who` (write and search on the parent).
    pub fn mkdir_as(
        &self,
        who: &Caller,
        path: &str,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.mkdir_in(who, Place::Path(path), owner, now_ns)
    }

    /// `mkdir_as` at a path or in a directory named by id.
    pub fn mkdir_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        check_owner(&owner)?;
        let path = &at.describe();
        if matches!(at, Place::Path(path) if split_path(path)?.is_empty()) {
            return Err(NamespaceError::AlreadyExists { path: path.into() });
        }
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
            refuse_taken(&place, path)?;
            may_add(tables, &place, who, path)?;
            let (default_layout, default_replicas) = parent_default_layout(tables, place.parent)?;
            let inode = Inode {
                attrs: new_attrs(FileKind::Directory, &owner, now_ns),
                body: Body::Directory { default_layout, default_replicas },
            };
            let id = insert_new(tables, &place, &inode, now_ns)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Creates a file and places its subfiles on `live` targets (or on the targets `spec`
    /// names). Without `spec.exclusive`, an existing file at `path` is returned unchanged.
    pub fn create_file(
        &self,
        path: &str,
        spec: &CreateFile,
        live: &[TargetUsage],
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.create_file_as(&Caller::root(), path, spec, live, now_ns)
    }

    /// `create_file` for `who` (write and search on the parent when the file is new).
    pub fn create_file_as(
        &self,
        who: &Caller,
        path: &str,
        spec: &CreateFile,
        live: &[TargetUsage],
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.create_file_in(who, Place::Path(path), spec, live, now_ns)
    }

    /// `create_file_as` at a path or in a directory named by id.
    pub fn create_file_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        spec: &CreateFile,
        live: &[TargetUsage],
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.create_placed(who, at, spec, Placer::Spread(live), now_ns)
    }

    /// `create_file_in` with the placement decided by the caller: `ranked` is every live
    /// target in order of preference (`placement::rank_targets`), and the file takes the
    /// first as many as it has subfiles (the targets it names must be among them). The
    /// result depends only on the namespace and the arguments (no placement memory, no
    /// cursor), as a replicated state machine needs.
    pub fn create_file_ranked_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        spec: &CreateFile,
        ranked: &[TargetId],
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.create_placed(who, at, spec, Placer::Ranked(ranked), now_ns)
    }

    /// Replication (issue 32): `create_file_in` of a file whose every subfile has `replicas`
    /// copies, subfile `i` on chain `chains[i].0` (its head then, `chains[i].1`, is recorded
    /// as the subfile's target). The caller chose the chains for the subfile count the layout
    /// (`spec.layout`, else the parent's default) gives, or as many as it found when the
    /// layout leaves the count open; a layout that asks for another count is refused.
    pub fn create_file_chained_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        spec: &CreateFile,
        replicas: u8,
        chains: &[(u32, TargetId)],
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        if !(2..=flotilla_types::REPLICAS_MAX).contains(&u32::from(replicas)) {
            return Err(NamespaceError::invalid(format!("{replicas} replicas for a chained file")));
        }
        if spec.targets.is_some() {
            return Err(NamespaceError::invalid(
                "a replicated file's subfiles are placed on chains; it cannot name its targets".to_string(),
            ));
        }
        let heads: Vec<TargetId> = chains.iter().map(|(_, head)| *head).collect();
        if chains.is_empty() || !crate::record::all_distinct(&heads) {
            return Err(NamespaceError::invalid(
                "chains with distinct heads needed for a replicated file".to_string(),
            ));
        }
        self.create_placed(who, at, spec, Placer::Chains { replicas, chains }, now_ns)
    }

    fn create_placed(
        &self,
        who: &Caller,
        at: Place<'_>,
        spec: &CreateFile,
        placer: Placer<'_>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        let path = &at.describe();
        check_owner(&spec.owner)?;
        if spec.subfile_count != 0 {
            check_subfile_count(spec.subfile_count)?;
        }
        if let Some(layout) = &spec.layout {
            check_layout(layout)?;
        }
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
            if let Some(id) = place.child {
                return existing_file(tables, id, spec.exclusive, path);
            }
            may_add(tables, &place, who, path)?;
            let (default_layout, _) = parent_default_layout(tables, place.parent)?;
            let layout = spec.layout.or(default_layout).unwrap_or(DEFAULT_LAYOUT);
            let (targets, replicas, chains) = match placer {
                Placer::Spread(live) => {
                    let count = subfile_count(spec, &layout, live.len());
                    (place_subfiles(tables, &self.spread, spec, count, live)?, 1, Vec::new())
                }
                Placer::Ranked(ranked) => (place_ranked(spec, &layout, ranked)?, 1, Vec::new()),
                Placer::Chains { replicas, chains } => {
                    let count = subfile_count(spec, &layout, chains.len());
                    if count != chains.len() {
                        return Err(NamespaceError::invalid(format!(
                            "{path}: layout {layout} has {count} subfiles, but {} chains were chosen \
                             (the parent's default layout changed meanwhile?)",
                            chains.len()
                        )));
                    }
                    let heads = chains.iter().map(|(_, head)| *head).collect();
                    (heads, replicas, chains.iter().map(|(chain, _)| *chain).collect())
                }
            };
            let inode = Inode {
                attrs: new_attrs(FileKind::File, &spec.owner, now_ns),
                body: Body::File { layout, targets, replicas, chains },
            };
            let id = insert_new(tables, &place, &inode, now_ns)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Creates a symbolic link at `path` whose content is `target`.
    pub fn symlink(
        &self,
        path: &str,
        target: &str,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.symlink_as(&Caller::root(), path, target, owner, now_ns)
    }

    /// `symlink` for `who` (write and search on the parent).
    pub fn symlink_as(
        &self,
        who: &Caller,
        path: &str,
        target: &str,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.symlink_in(who, Place::Path(path), target, owner, now_ns)
    }

    /// `symlink_as` at a path or in a directory named by id.
    pub fn symlink_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        target: &str,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        let path = &at.describe();
        check_owner(&owner)?;
        check_symlink_target(target)?;
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
            refuse_taken(&place, path)?;
            may_add(tables, &place, who, path)?;
            let mut inode = Inode {
                attrs: new_attrs(FileKind::Symlink, &owner, now_ns),
                body: Body::Symlink { target: target.into() },
            };
            inode.attrs.size_bytes = target.len() as u64;
            let id = insert_new(tables, &place, &inode, now_ns)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Gives the file or symlink at `existing` a second name, `new`.
    pub fn link(&self, existing: &str, new: &str, now_ns: TimeNs) -> Result<Entry, NamespaceError> {
        self.link_as(&Caller::root(), existing, new, now_ns)
    }

    /// `link` for `who` (search along both paths, write and search on the new parent).
    pub fn link_as(
        &self,
        who: &Caller,
        existing: &str,
        new: &str,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.write(|tables| {
            let found = resolve(tables, existing, false, who)?;
            add_link(tables, who, found.id, found.inode, Place::Path(new), now_ns)
        })
    }

    /// Gives the file, symlink or special file with inode id `id` a name at `at` (a hard
    /// link by identity: no path to the existing entry is needed, so none can be stale).
    pub fn link_in(
        &self,
        who: &Caller,
        id: u64,
        at: Place<'_>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.write(|tables| {
            let inode = tables.inode(id)?.ok_or_else(|| crate::namespace::not_found_id(id))?;
            if inode.attrs.nlink == 0 {
                return Err(crate::namespace::not_found_id(id));
            }
            add_link(tables, who, id, inode, at, now_ns)
        })
    }

    /// Creates a FIFO, socket or device node (`mknod`) at `at`; `rdev` is the device
    /// number of a device node and must be 0 for the others.
    pub fn mknod_in(
        &self,
        who: &Caller,
        at: Place<'_>,
        kind: FileKind,
        rdev: u64,
        owner: Owner,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        let path = &at.describe();
        check_owner(&owner)?;
        if !kind.is_special() {
            return Err(NamespaceError::invalid(format!(
                "mknod {path}: {kind:?} is not a special file kind"
            )));
        }
        let device = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
        if !device && rdev != 0 {
            return Err(NamespaceError::invalid(format!("mknod {path}: a {kind:?} has no device number")));
        }
        self.write(|tables| {
            let place = locate_place(tables, at, who)?;
            refuse_taken(&place, path)?;
            may_add(tables, &place, who, path)?;
            let mut inode = Inode { attrs: new_attrs(kind, &owner, now_ns), body: Body::Special };
            inode.attrs.rdev = rdev;
            let id = insert_new(tables, &place, &inode, now_ns)?;
            Ok(inode.into_entry(id))
        })
    }

    /// Sets (or clears) the layout that files created in the directory at `path` take when
    /// they name none, and that new subdirectories inherit.
    pub fn set_default_layout(
        &self,
        path: &str,
        layout: Option<Layout>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.set_default_layout_replicated(path, layout.map(ReplicatedLayout::single), now_ns)
    }

    /// `set_default_layout` with a replica count (issue 32): files created in the directory
    /// without a count of their own keep `replicas` copies.
    pub fn set_default_layout_replicated(
        &self,
        path: &str,
        layout: Option<ReplicatedLayout>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        if let Some(layout) = &layout {
            check_layout(&layout.layout)?;
        }
        let id = self.lookup_follow(path)?.id;
        self.set_default_layout_id_replicated(id, layout, now_ns)
    }

    /// `set_default_layout` of the directory with inode id `id`.
    pub fn set_default_layout_id(
        &self,
        id: u64,
        layout: Option<Layout>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        self.set_default_layout_id_replicated(id, layout.map(ReplicatedLayout::single), now_ns)
    }

    /// `set_default_layout_replicated` of the directory with inode id `id`.
    pub fn set_default_layout_id_replicated(
        &self,
        id: u64,
        layout: Option<ReplicatedLayout>,
        now_ns: TimeNs,
    ) -> Result<Entry, NamespaceError> {
        let replicas = replicas_byte(layout.as_ref())?;
        if let Some(layout) = &layout {
            check_layout(&layout.layout)?;
        }
        self.write(|tables| {
            let mut inode = tables.inode(id)?.ok_or_else(|| crate::namespace::not_found_id(id))?;
            let Body::Directory { default_layout, default_replicas } = &mut inode.body else {
                return Err(NamespaceError::NotADirectory { path: format!("inode {id:016x}") });
            };
            *default_layout = layout.map(|l| l.layout);
            *default_replicas = replicas;
            inode.attrs.ctime_ns = now_ns;
            tables.put(id, &inode)?;
            Ok(inode.into_entry(id))
        })
    }
}

/// Names entry `id` (not a directory) at `at` too: one more link, checked against `NLINK_MAX`.
fn add_link(
    tables: &mut WriteTables<'_>,
    who: &Caller,
    id: u64,
    mut inode: Inode,
    at: Place<'_>,
    now_ns: TimeNs,
) -> Result<Entry, NamespaceError> {
    let new = &at.describe();
    if inode.is_directory() {
        return Err(NamespaceError::NotPermitted { what: format!("{new}: hard link to a directory") });
    }
    let place = locate_place(tables, at, who)?;
    refuse_taken(&place, new)?;
    may_add(tables, &place, who, new)?;
    inode.attrs.nlink = inode
        .attrs
        .nlink
        .checked_add(1)
        .filter(|nlink| *nlink <= NLINK_MAX)
        .ok_or_else(|| NamespaceError::TooManyLinks { path: new.clone(), nlink_max: NLINK_MAX })?;
    inode.attrs.ctime_ns = now_ns;
    tables.put(id, &inode)?;
    tables.insert_dirent(place.parent, place.name, id)?;
    adjust_dir(tables, place.parent, Change::Added, false, now_ns)?;
    Ok(inode.into_entry(id))
}

/// The replica count of a default layout as the record keeps it, checked.
pub(crate) fn replicas_byte(layout: Option<&ReplicatedLayout>) -> Result<u8, NamespaceError> {
    match layout {
        None => Ok(1),
        Some(layout) => {
            layout.validate().map_err(|e| NamespaceError::invalid(e.to_string()))?;
            u8::try_from(layout.replicas).map_err(|_| NamespaceError::invalid("replica count out of range"))
        }
    }
}

/// A directory's default layout and replica count.
fn parent_default_layout(tables: &impl Source, parent: u64) -> Result<(Option<Layout>, u8), NamespaceError> {
    match tables.load(parent)?.body {
        Body::Directory { default_layout, default_replicas } => Ok((default_layout, default_replicas)),
        _ => Err(NamespaceError::corrupt(format!("parent {parent:016x} is not a directory"))),
    }
}

/// The answer to a non-exclusive create of a name that exists.
fn existing_file(
    tables: &impl Source,
    id: u64,
    exclusive: bool,
    path: &str,
) -> Result<Entry, NamespaceError> {
    let inode = tables.load(id)?;
    match inode.attrs.kind {
        FileKind::File if !exclusive => Ok(inode.into_entry(id)),
        FileKind::Directory if !exclusive => Err(NamespaceError::IsADirectory { path: path.into() }),
        _ => Err(NamespaceError::AlreadyExists { path: path.into() }),
    }
}

/// The layout of a file when neither the creator nor the parent directory names one:
/// 1 MiB stripes over every subfile.
pub const DEFAULT_LAYOUT: Layout = Layout::Stripe { unit_bytes: 1 << 20, count: 0 };

/// Subfiles of a new file: as asked; else as many as named targets; else the layout's count;
/// else one per live target.
fn subfile_count(spec: &CreateFile, layout: &Layout, live_count: usize) -> usize {
    if spec.subfile_count > 0 {
        return spec.subfile_count as usize;
    }
    if let Some(named) = &spec.targets {
        return named.len();
    }
    layout.subfile_count().map_or(live_count.max(1), |count| count as usize)
}

/// Where a create's subfiles go.
#[derive(Clone, Copy)]
enum Placer<'a> {
    /// The live targets; the namespace's spread and cursor choose.
    Spread(&'a [TargetUsage]),
    /// The live targets in the caller's order of preference; the first ones are taken.
    Ranked(&'a [TargetId]),
    /// Replicated: the caller's chains, one per subfile, with their heads.
    Chains { replicas: u8, chains: &'a [(u32, TargetId)] },
}

/// The targets of a new file placed by a ranking: the ones the program named (each in the
/// ranking), or the first of the ranking.
fn place_ranked(
    spec: &CreateFile,
    layout: &Layout,
    ranked: &[TargetId],
) -> Result<Vec<TargetId>, NamespaceError> {
    let count = subfile_count(spec, layout, ranked.len());
    if let Some(named) = &spec.targets {
        if named.len() != count {
            return Err(NamespaceError::invalid(format!(
                "{} targets named for {count} subfiles",
                named.len()
            )));
        }
        let live: Vec<TargetUsage> = ranked
            .iter()
            .map(|target| TargetUsage { target: *target, used_bytes: 0, free_bytes: 1 })
            .collect();
        check_targets(&live, named)?;
        return Ok(named.clone());
    }
    crate::placement::take_ranked(ranked, count)
}

/// The targets of a new file: the ones the program named, or the spread's choice.
fn place_subfiles(
    tables: &mut WriteTables<'_>,
    spread: &parking_lot::Mutex<Spread>,
    spec: &CreateFile,
    count: usize,
    live: &[TargetUsage],
) -> Result<Vec<TargetId>, NamespaceError> {
    if let Some(named) = &spec.targets {
        if named.len() != count {
            return Err(NamespaceError::invalid(format!(
                "{} targets named for {count} subfiles",
                named.len()
            )));
        }
        check_targets(live, named)?;
        return Ok(named.clone());
    }
    let cursor = tables.counter(PLACEMENT_CURSOR_KEY)?.unwrap_or(0);
    let chosen = choose_targets(live, count, cursor, &mut spread.lock())?;
    tables.set_counter(PLACEMENT_CURSOR_KEY, cursor.wrapping_add(1))?;
    Ok(chosen)
}

fn check_symlink_target(target: &str) -> Result<(), NamespaceError> {
    if target.is_empty() {
        return Err(NamespaceError::invalid("empty symlink target"));
    }
    if target.len() > PATH_BYTES_MAX {
        return Err(NameError::PathTooLong { length: target.len() }.into());
    }
    if target.contains('\0') {
        return Err(NamespaceError::invalid("symlink target contains a NUL byte"));
    }
    Ok(())
}
