"""The fsspec file system: fsspec's own abstract test suites, plus pandas and zarr on top."""

import posixpath
import uuid

import fsspec
import fsspec.tests.abstract as abstract
import numpy as np
import pytest

from flotilla.fs import FlotillaFileSystem


class FlotillaFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, meta):
        return fsspec.filesystem("flotilla", meta=meta)

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs):
        path = f"/fsspec-{uuid.uuid4().hex[:12]}"
        fs.makedirs(path)
        yield path
        if fs.exists(path):
            fs.rm(path, recursive=True)


class TestFlotillaCopy(abstract.AbstractCopyTests, FlotillaFixtures):
    pass


class TestFlotillaGet(abstract.AbstractGetTests, FlotillaFixtures):
    pass


class TestFlotillaPut(abstract.AbstractPutTests, FlotillaFixtures):
    pass


class TestFlotillaOpen(abstract.AbstractOpenTests, FlotillaFixtures):
    pass


class TestFlotillaPipe(abstract.AbstractPipeTests, FlotillaFixtures):
    pass


def test_urls_find_the_cluster(meta):
    path = f"/url-{uuid.uuid4().hex[:8]}.txt"
    with fsspec.open(f"flotilla://{meta}{path}", "wb") as f:
        f.write(b"line one\nline two\n")
    with fsspec.open(f"flotilla://{meta}{path}", "rb") as f:
        f.seek(5)
        assert f.read(3) == b"one"
    fs, stripped = fsspec.core.url_to_fs(f"flotilla://{meta}{path}")
    assert isinstance(fs, FlotillaFileSystem) and stripped == path
    assert fs.cat_file(path, start=-4) == b"two\n"
    assert fs.info(path)["size"] == 18
    fs.rm(path)


def test_append_and_large_writes(meta):
    fs = fsspec.filesystem("flotilla", meta=meta, subfiles=2, layout="stripe:64k")
    path = f"/big-{uuid.uuid4().hex[:8]}"
    data = np.random.default_rng(3).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes()
    with fs.open(path, "wb", block_size=1 << 20) as f:
        f.write(data[: 7 << 20])
    with fs.open(path, "ab") as f:
        f.write(data[7 << 20:])
    assert fs.info(path)["subfiles"] == 2
    assert fs.cat_file(path) == data
    with fs.open(path, "rb", block_size=1 << 16) as f:
        f.seek(5 << 20)
        assert f.read(100) == data[5 << 20: (5 << 20) + 100]
    fs.mv(path, path + ".moved")
    assert not fs.exists(path) and fs.size(path + ".moved") == len(data)
    fs.rm(path + ".moved")


def test_pandas_read_csv(meta):
    pandas = pytest.importorskip("pandas")
    url = f"flotilla://{meta}/frame-{uuid.uuid4().hex[:8]}.csv"
    frame = pandas.DataFrame({"step": range(100), "energy": np.linspace(0, 1, 100)})
    frame.to_csv(url, index=False)
    back = pandas.read_csv(url)
    pandas.testing.assert_frame_equal(back, frame)


def test_zarr_array_through_the_mapper(meta):
    zarr = pytest.importorskip("zarr")
    fs = fsspec.filesystem("flotilla", meta=meta)
    root = f"/zarr-{uuid.uuid4().hex[:8]}"
    data = np.arange(200 * 300, dtype=np.float32).reshape(200, 300)
    mapper = fs.get_mapper(root)
    array = zarr.open_array(store=mapper, mode="w", shape=data.shape, chunks=(64, 64), dtype=data.dtype)
    array[:] = data
    again = zarr.open_array(store=fs.get_mapper(root), mode="r")
    assert np.array_equal(again[:], data)
    assert np.array_equal(again[10:50, 250:], data[10:50, 250:])
    assert len(fs.find(root)) > 10  # one object per chunk, plus metadata
