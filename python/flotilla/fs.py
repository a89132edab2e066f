"""An fsspec file system for Flotilla: ``flotilla://HOST:PORT/path``.

With the package installed, fsspec finds it by protocol (entry point ``fsspec.specs``), so
``fsspec.open("flotilla://10.0.0.1:7770/data/x.csv")``, ``pandas.read_csv(...)``,
``xarray.open_zarr(...)`` and ``zarr`` stores (``fs.get_mapper(path)``) all work. Without a
host (``flotilla:///path``) the ``FLOTILLA_META`` environment variable names the cluster.

Files are read and written through their linear view (their layout maps bytes onto
subfiles). New files get ``subfiles`` subfiles and ``layout`` (default: the directory's
default, or one subfile) — pass them as storage options.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Dict, List, Optional

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from . import Client, connect
from .errors import AlreadyExistsError, NotFoundError

PROTOCOL = "flotilla"
_PREFIX = PROTOCOL + "://"

_KIND_TO_TYPE = {"file": "file", "directory": "directory", "symlink": "other"}


def _split_url(path: str) -> "tuple[Optional[str], str]":
    """``flotilla://HOST:PORT/a/b`` -> ("HOST:PORT", "/a/b"); plain paths keep no host."""
    if path.startswith(_PREFIX):
        rest = path[len(_PREFIX):]
        host, _, tail = rest.partition("/")
        return (host or None), "/" + tail
    return None, path


class FlotillaFileSystem(AbstractFileSystem):
    """fsspec file system over a Flotilla cluster.

    Parameters
    ----------
    meta:
        "HOST:PORT" of the metadata service (default: from the URL, else ``FLOTILLA_META``).
    subfiles:
        Subfiles of files this file system creates (default 1).
    layout:
        Layout of new files, e.g. "stripe:1m" (default: the parent directory's).
    """

    protocol = PROTOCOL
    root_marker = "/"
    sep = "/"

    def __init__(self, meta: Optional[str] = None, subfiles: int = 1, layout: Optional[str] = None, **kwargs: Any):
        super().__init__(meta=meta, subfiles=subfiles, layout=layout, **kwargs)
        self.meta = meta or os.environ.get("FLOTILLA_META")
        if not self.meta:
            raise ValueError("no metadata service: use flotilla://HOST:PORT/... or set FLOTILLA_META")
        self.subfiles = subfiles
        self.layout = layout
        self.client: Client = connect(self.meta)

    # -- paths ---------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):  # type: ignore[override]
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = os.fspath(path)
        _, path = _split_url(path)
        path = "/" + path.strip("/")
        while "//" in path:
            path = path.replace("//", "/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> Dict[str, Any]:
        host, _ = _split_url(path)
        return {"meta": host} if host else {}

    def unstrip_protocol(self, name: str) -> str:
        return f"{_PREFIX}{self.meta}{self._strip_protocol(name)}"

    # -- namespace -----------------------------------------------------------------------

    def _entry(self, path: str, stat) -> Dict[str, Any]:
        return {
            "name": path,
            "size": stat.size if stat.kind == "file" else 0,
            "type": _KIND_TO_TYPE.get(stat.kind, "other"),
            "mode": stat.mode,
            "mtime": stat.mtime_ns / 1e9,
            "created": stat.ctime_ns / 1e9,
            "islink": stat.kind == "symlink",
            "id": stat.id,
            "layout": stat.layout,
            "subfiles": stat.subfiles,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._entry(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        stat = self.client.stat(path)
        if stat.kind != "directory":
            entries = [self._entry(path, stat)]
        else:
            base = path.rstrip("/")
            entries = []
            for entry in self.client.scandir(path):
                child = f"{base}/{entry.name}"
                try:
                    entries.append(self._entry(child, self.client.stat(child)))
                except FileNotFoundError:
                    continue  # removed meanwhile
        return entries if detail else [e["name"] for e in entries]

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            self.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if path == "/":
            return
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            try:
                self.client.mkdir(prefix)
            except FileExistsError:
                if depth == len(parts) and not exist_ok:
                    raise
        self.invalidate_cache(path)

    def rmdir(self, path):
        path = self._strip_protocol(path)
        self.client.rmdir(path)
        self.invalidate_cache(path)

    def _rm(self, path):
        path = self._strip_protocol(path)
        if self.client.stat(path).kind == "directory":
            self.client.rmdir(path)
        else:
            self.client.remove(path)
        self.invalidate_cache(path)

    def rm_file(self, path):
        self._rm(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Renames in the namespace when it can (one path, no glob), else copies and removes."""
        simple = isinstance(path1, str) and isinstance(path2, str) and not any(c in path1 for c in "*?[")
        if simple:
            source, destination = self._strip_protocol(path1), self._strip_protocol(path2)
            if source == destination:
                return
            if self.isdir(destination):
                destination = destination.rstrip("/") + "/" + source.rstrip("/").rsplit("/", 1)[-1]
            if recursive or not self.isdir(source):
                self.client.rename(source, destination)
                self.invalidate_cache()
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        source, destination = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(source):
            self.makedirs(destination, exist_ok=True)
            return
        chunk_bytes = 8 << 20
        with self.open(source, "rb") as reader, self.open(destination, "wb") as writer:
            while True:
                data = reader.read(chunk_bytes)
                if not data:
                    break
                writer.write(data)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        with self.client.open(path) as handle:
            size = handle.size()
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else min(end, size))
            if end <= start:
                return b""
            return handle.read_at(start, end - start)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        with self.open(path, "xb" if mode == "create" else "wb", **kwargs) as writer:
            writer.write(value)

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            with self.open(path, "wb"):
                pass
        self.invalidate_cache(self._parent(path))

    def created(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        return FlotillaBufferedFile(
            self, self._strip_protocol(path), mode, block_size=block_size, autocommit=autocommit,
            cache_options=cache_options, **kwargs,
        )


class FlotillaBufferedFile(AbstractBufferedFile):
    """A buffered file over a Flotilla file's linear bytes (modes rb, wb, ab, xb)."""

    def __init__(self, fs: FlotillaFileSystem, path: str, mode: str = "rb", **kwargs: Any):
        client = fs.client
        self._base = 0
        if mode == "rb":
            self.handle = client.open(path)
            kwargs.setdefault("size", self.handle.size())
        elif mode == "xb":
            self.handle = self._create(fs, path, exclusive=True)
        elif mode == "wb":
            self.handle = self._create(fs, path, exclusive=False)
            if self.handle.size() > 0:
                self.handle.set_size(0)
        elif mode == "ab":
            self.handle = self._create(fs, path, exclusive=False)
            self._base = self.handle.size()
        else:
            raise NotImplementedError(f"mode {mode!r} is not supported")
        super().__init__(fs, path, mode, **kwargs)

    @staticmethod
    def _create(fs: FlotillaFileSystem, path: str, exclusive: bool):
        parent = fs._parent(path)
        if not fs.client.exists(parent):
            fs.makedirs(parent, exist_ok=True)  # like a local file system with auto_mkdir
        try:
            return fs.client.create(path, subfiles=fs.subfiles, layout=fs.layout, exclusive=True)
        except AlreadyExistsError:
            if exclusive:
                raise
            return fs.client.open(path)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.handle.read_at(start, end - start)

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getbuffer()
        if len(data):
            self.handle.write_at(self._base + self.offset, data)
        del data
        if final:
            self.handle.close()
        return True

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.mode == "rb":
                self.handle.close()


__all__ = ["FlotillaFileSystem", "FlotillaBufferedFile", "NotFoundError"]
