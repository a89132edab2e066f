//! `flotilla.Client`: one connection to a cluster, and the namespace calls.
//!
//! Every object made through a client (files, forks) shares its [`Session`]; closing the
//! client makes every later call on any of them raise `flotilla.ClosedError`.

use crate::enwrich::{EnwrichArgs, PyEnwrichFile};
use crate::errors::{closed, invalid, OrRaise};
use crate::file::PyFile;
use flotilla_client::{Client, CreateOptions, EntryInfo, FileKind, Layout, OpenOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A client and whether the program closed it.
pub struct Session {
    client: Client,
    closed: AtomicBool,
}

impl Session {
    /// The client, or `ClosedError` once closed.
    pub fn client(&self, py: Python<'_>) -> PyResult<&Client> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed(py, "client"));
        }
        Ok(&self.client)
    }
}

/// A connection to a Flotilla cluster (its metadata service at `meta`, "HOST:PORT"; default
/// the `FLOTILLA_META` environment variable). Connections open lazily, on the first call.
#[pyclass(frozen, name = "Client", module = "flotilla._native")]
pub struct PyClient {
    session: Arc<Session>,
}

/// What `stat` returns: a namespace entry's attributes and placement.
#[pyclass(frozen, get_all, name = "Stat", module = "flotilla._native")]
pub struct PyStat {
    id: u64,
    /// "file", "directory" or "symlink".
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u32,
    atime_ns: i64,
    mtime_ns: i64,
    ctime_ns: i64,
    /// "stripe:UNIT:COUNT", "hash:BLOCK:SEQ:COUNT", "explicit", or None (a directory with no
    /// default layout).
    layout: Option<String>,
    subfiles: u32,
    symlink: Option<String>,
}

#[pymethods]
impl PyStat {
    fn __repr__(&self) -> String {
        format!(
            "Stat(id={}, kind={:?}, size={}, mode=0o{:o}, layout={:?}, subfiles={})",
            self.id, self.kind, self.size, self.mode, self.layout, self.subfiles
        )
    }
}

pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
    }
}

impl PyStat {
    pub fn from_entry(entry: &EntryInfo) -> PyStat {
        let attrs = &entry.attrs;
        PyStat {
            id: entry.id,
            kind: kind_name(attrs.kind),
            mode: attrs.mode,
            uid: attrs.uid,
            gid: attrs.gid,
            size: attrs.size_bytes,
            nlink: attrs.nlink,
            atime_ns: attrs.atime_ns,
            mtime_ns: attrs.mtime_ns,
            ctime_ns: attrs.ctime_ns,
            layout: entry.layout.map(|l| l.to_string()),
            subfiles: entry.subfiles.len() as u32,
            symlink: entry.symlink.clone(),
        }
    }
}

/// One entry of a directory listing.
#[pyclass(frozen, get_all, name = "DirEntry", module = "flotilla._native")]
pub struct PyDirEntry {
    name: String,
    id: u64,
    /// "file", "directory" or "symlink".
    kind: &'static str,
}

#[pymethods]
impl PyDirEntry {
    fn __repr__(&self) -> String {
        format!("DirEntry(name={:?}, kind={:?}, id={})", self.name, self.kind, self.id)
    }
}

fn parse_layout(py: Python<'_>, layout: Option<&str>) -> PyResult<Option<Layout>> {
    layout.map(|text| Layout::parse(text).map_err(|e| invalid(py, e.to_string()))).transpose()
}

impl PyClient {
    fn client(&self, py: Python<'_>) -> PyResult<Client> {
        self.session.client(py).cloned()
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (meta = None))]
    fn new(py: Python<'_>, meta: Option<&str>) -> PyResult<PyClient> {
        let client = match meta {
            Some(meta) => Client::connect(meta),
            None => Client::from_env(),
        }
        .or_raise(py)?;
        Ok(PyClient { session: Arc::new(Session { client, closed: AtomicBool::new(false) }) })
    }

    /// The metadata service's address.
    #[getter]
    fn meta(&self) -> String {
        self.session.client.meta_addr().to_string()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.session.closed.load(Ordering::Acquire)
    }

    /// Makes every later call through this client, and its files and forks, raise
    /// `ClosedError`. Files opened through it are not flushed: close them first.
    fn close(&self) {
        self.session.closed.store(true, Ordering::Release);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }

    /// Attributes of the entry at `path`.
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<PyStat> {
        let client = self.client(py)?;
        let entry = py.detach(|| client.stat(path)).or_raise(py)?;
        Ok(PyStat::from_entry(&entry))
    }

    /// Whether `path` exists.
    fn exists(&self, py: Python<'_>, path: &str) -> PyResult<bool> {
        let client = self.client(py)?;
        match py.detach(|| client.stat(path)) {
            Ok(_) => Ok(true),
            Err(error) if error.errno() == 2 => Ok(false),
            Err(error) => Err(error).or_raise(py),
        }
    }

    /// Names in the directory at `path`.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        let client = self.client(py)?;
        let entries = py.detach(|| client.readdir(path)).or_raise(py)?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    /// Entries (name, id, kind) of the directory at `path`.
    fn scandir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<PyDirEntry>> {
        let client = self.client(py)?;
        let entries = py.detach(|| client.readdir(path)).or_raise(py)?;
        Ok(entries
            .into_iter()
            .map(|e| PyDirEntry { name: e.name, id: e.id, kind: kind_name(e.kind) })
            .collect())
    }

    /// Creates a directory.
    #[pyo3(signature = (path, mode = 0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        let client = self.client(py)?;
        py.detach(|| client.mkdir(path, mode)).or_raise(py).map(drop)
    }

    /// Removes a file or symlink (its data is deleted by the servers in the background).
    fn remove(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = self.client(py)?;
        py.detach(|| client.remove(path)).or_raise(py)
    }

    /// Removes an empty directory.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = self.client(py)?;
        py.detach(|| client.rmdir(path)).or_raise(py)
    }

    /// Renames `source` to `destination` (replacing a file there).
    fn rename(&self, py: Python<'_>, source: &str, destination: &str) -> PyResult<()> {
        let client = self.client(py)?;
        py.detach(|| client.rename(source, destination)).or_raise(py)
    }

    /// Creates a symbolic link at `path` pointing to `target`.
    fn symlink(&self, py: Python<'_>, path: &str, target: &str) -> PyResult<()> {
        let client = self.client(py)?;
        py.detach(|| client.symlink(path, target)).or_raise(py).map(drop)
    }

    /// Sets a directory's default layout (None clears it) or an empty file's layout, e.g.
    /// "stripe:64k" or "hash:4096:8".
    #[pyo3(signature = (path, layout))]
    fn set_layout(&self, py: Python<'_>, path: &str, layout: Option<&str>) -> PyResult<()> {
        let client = self.client(py)?;
        let layout = parse_layout(py, layout)?;
        py.detach(|| client.set_layout(path, layout)).or_raise(py).map(drop)
    }

    /// Creates a file of `subfiles` subfiles (each with a `data` fork). `layout` maps its
    /// linear bytes onto them ("stripe:UNIT[:COUNT]", "hash:BLOCK[:SEQ[:COUNT]]",
    /// "explicit"; default: the directory's), optionally ending in ",replicas=N" for N copies
    /// of every subfile on chains (issue 32). `exclusive=False` opens an existing file.
    /// `no_overlap=True` promises that no other client writes the bytes this handle reads or
    /// writes: the handle takes no byte-range tokens.
    #[pyo3(signature = (path, subfiles = 1, layout = None, mode = 0o644, exclusive = true, *, no_overlap = false))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        py: Python<'_>,
        path: &str,
        subfiles: u32,
        layout: Option<&str>,
        mode: u32,
        exclusive: bool,
        no_overlap: bool,
    ) -> PyResult<PyFile> {
        let client = self.client(py)?;
        // A layout text may end in `,replicas=N` (issue 32: a replicated file).
        let replicated = layout
            .map(|text| {
                flotilla_client::ReplicatedLayout::parse(text).map_err(|e| invalid(py, e.to_string()))
            })
            .transpose()?;
        let (layout, replicas) = replicated.map_or((None, 1), |r| (Some(r.layout), r.replicas));
        let options =
            CreateOptions { subfiles, targets: None, layout, mode, exclusive, no_overlap, replicas };
        let created = py.detach(|| match client.create(path, &options) {
            Err(error) if !exclusive && error.errno() == 17 => {
                client.open_with(path, &OpenOptions { no_overlap })
            }
            other => other,
        });
        Ok(PyFile::new(self.session.clone(), created.or_raise(py)?))
    }

    /// Opens an existing file. `enwrich=True` opens it for writing in ENWRICH mode as a
    /// member of job `job` of `job_size` processes (default: FLOTILLA_JOB_NAME and
    /// FLOTILLA_JOB_SIZE) and returns an `EnwrichFile`. `no_overlap=True`: the handle takes
    /// no byte-range tokens (see `create`).
    #[pyo3(signature = (path, *, enwrich = false, job = None, job_size = None, cache_bytes = None,
        directory_fraction = None, flush_timeout_ms = None, no_overlap = false))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: &str,
        enwrich: bool,
        job: Option<String>,
        job_size: Option<u32>,
        cache_bytes: Option<u64>,
        directory_fraction: Option<f64>,
        flush_timeout_ms: Option<u64>,
        no_overlap: bool,
    ) -> PyResult<Py<PyAny>> {
        let client = self.client(py)?;
        if enwrich {
            let args = EnwrichArgs { job, job_size, cache_bytes, directory_fraction, flush_timeout_ms };
            let file = PyEnwrichFile::open(py, client, path, args)?;
            return Ok(Py::new(py, file)?.into_any());
        }
        let file = py.detach(|| client.open_with(path, &OpenOptions { no_overlap })).or_raise(py)?;
        Ok(Py::new(py, PyFile::new(self.session.clone(), file))?.into_any())
    }

    /// One dict per storage target: target, server, up, used_bytes, free_bytes.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let client = self.client(py)?;
        let targets = py.detach(|| client.status()).or_raise(py)?;
        targets
            .into_iter()
            .map(|t| {
                let row = PyDict::new(py);
                row.set_item("target", t.target.0)?;
                row.set_item("server", t.server)?;
                row.set_item("up", t.state == flotilla_client::TargetState::Up)?;
                row.set_item("used_bytes", t.used_bytes)?;
                row.set_item("free_bytes", t.free_bytes)?;
                Ok(row)
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<flotilla.Client meta={}{}>",
            self.session.client.meta_addr(),
            if self.closed() { " closed" } else { "" }
        )
    }
}
