"""numpy views of any strides moved with one request, straight into and out of their memory."""

import threading
import time

import numpy as np
import pytest

import flotilla

N = 64


@pytest.fixture(params=["fork", "linear"])
def target(request, client, workdir):
    if request.param == "fork":
        f = client.create(f"{workdir}/explicit", subfiles=1, layout="explicit")
        yield f.fork(0)
    else:
        f = client.create(f"{workdir}/linear", subfiles=2, layout="stripe:4k")
        yield f
    f.close()


def matrix():
    return np.arange(N * N, dtype=np.float64).reshape(N, N)


VIEWS = {
    "c-order": lambda a: a,
    "fortran": lambda a: np.asfortranarray(a),
    "transposed": lambda a: a.T,
    "column-block": lambda a: a[:, 8:24],
    "row-step": lambda a: a[::3, 5:40:2],
    "reversed": lambda a: a[::-1, ::-2],
    "column": lambda a: a[:, 7],
    "scalar": lambda a: a[3:4, 4:5].reshape(()),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_write_from_any_view_then_read_dense(target, name):
    view = VIEWS[name](matrix())
    view = np.asarray(view)
    written = target.write_from(view, offset=128)
    assert written == view.nbytes
    back = target.read_array(128, view.shape, view.dtype)
    assert np.array_equal(back, view)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("name", [name for name in VIEWS if name != "fortran"])
def test_read_into_any_view(target, name, order):
    m = matrix()
    target.write_from(m)
    out = np.full((N, N), -1.0, order=order)
    source, dest = VIEWS[name](m), VIEWS[name](out)
    assert np.shares_memory(dest, out)
    # Each element of `dest` comes from where the same element of `source` lies in the file.
    first = source.__array_interface__["data"][0] - m.__array_interface__["data"][0]
    assert target.read_into(dest, offset=first, file_strides=source.strides) == dest.nbytes
    expected = np.full((N, N), -1.0)
    VIEWS[name](expected)[...] = source
    assert np.array_equal(out, expected)  # the view filled, nothing else touched


def test_random_views_against_numpy(target):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 1 << 30, size=(6, 7, 8), dtype=np.int32)
    target.write_from(data)
    for _ in range(40):
        slices = tuple(
            slice(int(rng.integers(0, n // 2)), int(rng.integers(n // 2 + 1, n + 1)), int(rng.choice([1, 2, -1])))
            if rng.random() < 0.8 else slice(None, None, -1)
            for n in data.shape
        )
        order = rng.permutation(3)
        source = data[slices].transpose(order)
        out_base = np.zeros(data.shape, np.int32)
        out = out_base[slices].transpose(order)
        first = source.__array_interface__["data"][0] - data.__array_interface__["data"][0]
        target.read_into(out, offset=first, file_strides=source.strides)
        assert np.array_equal(out, source)


def test_file_side_strides_scatter_into_the_file(target):
    # Write a 4x4 block into the middle of an 8x8 row-major int64 matrix, column-major in memory.
    target.write_from(np.zeros((8, 8), np.int64))
    block = np.asfortranarray(np.arange(16, dtype=np.int64).reshape(4, 4))
    target.write_from(block, offset=(2 * 8 + 3) * 8, file_strides=(64, 8))
    whole = target.read_array(0, (8, 8), np.int64)
    assert np.array_equal(whole[2:6, 3:7], block)
    assert whole.sum() == block.sum()


def test_negative_file_strides_read_backwards(target):
    target.write_from(np.arange(10, dtype=np.int16))
    out = np.zeros(10, np.int16)
    target.read_into(out, offset=18, file_strides=(-2,))
    assert list(out) == list(range(9, -1, -1))


def test_read_array_orders_and_dtypes(target):
    data = (np.arange(30, dtype=np.complex128) * (1 + 2j)).reshape(5, 6)
    target.write_from(data)
    f_order = target.read_array(0, (5, 6), "complex128", order="F")
    assert f_order.flags.f_contiguous and np.array_equal(f_order, data)
    records = np.zeros(4, dtype=[("x", "<i4"), ("y", "<f8")])
    records["x"], records["y"] = [1, 2, 3, 4], [0.5, 1.5, 2.5, 3.5]
    target.write_from(records, offset=4096)
    assert np.array_equal(target.read_array(4096, 4, records.dtype), records)


def test_non_blocking_array_calls(target):
    m = matrix()
    assert target.write_from_nb(m).wait() == m.nbytes
    handle = target.read_array_nb(0, (N, N), np.float64)
    back = handle.wait()
    assert np.array_equal(back, m)
    column = np.zeros(N)
    assert target.read_into_nb(column, offset=5 * 8, file_strides=(N * 8,)).wait() == N * 8
    assert np.array_equal(column, m[:, 5])


def test_io_releases_the_gil(client, workdir):
    """A thread doing Python work keeps running while another thread reads 64 MiB."""
    f = client.create(f"{workdir}/big", subfiles=2, layout="stripe:1m")
    big = np.ones(8 << 20, np.float64)
    f.write_from(big)
    out = np.zeros_like(big)
    gaps, stop = [], threading.Event()

    def spin():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    spinner = threading.Thread(target=spin)
    spinner.start()
    started = time.perf_counter()
    for _ in range(3):
        f.read_into(out)
    elapsed = time.perf_counter() - started
    stop.set()
    spinner.join()
    assert np.array_equal(out, big)
    # Holding the GIL through a read would stall the spinner for the whole read.
    assert max(gaps) < elapsed / 2, (max(gaps), elapsed)
