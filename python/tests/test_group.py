"""GFS-GROUP from Python: element-by-element matrix I/O on forks and a linear file, numpy
buffers filled in place, the context manager, both modes, mixing refused, failures named."""

import numpy as np
import pytest

import flotilla

ROWS, COLUMNS = 300, 6


@pytest.fixture
def forks(client, workdir):
    f = client.create(f"{workdir}/matrix", subfiles=2, layout="explicit")
    yield [f.fork(0), f.fork(1)]
    f.close()


@pytest.mark.parametrize("mode", ["nosend", "send"])
def test_matrix_column_by_column_on_forks(forks, mode):
    matrix = np.random.default_rng(7).integers(0, 2**62, size=(ROWS, COLUMNS), dtype=np.int64)
    with flotilla.Group(mode=mode, pending_requests_max=100) as group:
        for c in range(COLUMNS):
            for r in range(ROWS):
                group.write(forks[c % 2], ((c // 2) * ROWS + r) * 8, matrix[r, c : c + 1])
    requests, submissions, lists = group.stats()
    assert requests == ROWS * COLUMNS
    # Every column starts a new fork; each 100 requests submit: 3 submissions per column.
    assert lists == 3 * COLUMNS if mode == "nosend" else lists >= 3 * COLUMNS
    back = np.zeros((COLUMNS, ROWS), dtype=np.int64)  # column-major copy, filled in place
    address = back.ctypes.data
    with flotilla.Group(mode=mode) as group:
        for c in range(COLUMNS):
            group.read(forks[c % 2], (c // 2) * ROWS * 8, back[c])
    assert back.ctypes.data == address
    np.testing.assert_array_equal(back.T, matrix)


def test_linear_file_pieces_and_testio(client, workdir):
    f = client.create(f"{workdir}/linear", subfiles=2, layout="stripe:4k")
    data = np.arange(20000, dtype=np.uint8)
    group = flotilla.Group(batch_across_forks=True)
    for start in range(19900, -1, -100):  # backwards
        group.write(f, start, data[start : start + 100])
    group.doneio()
    group.waitio()
    back = np.zeros(20000, dtype=np.uint8)
    for start in range(0, 20000, 500):
        group.read(f, start, back[start : start + 500])
    for _ in range(200000):
        if group.testio():
            break
    else:
        pytest.fail("testio never reported the reads done")
    np.testing.assert_array_equal(back, data)
    f.close()


def test_mixing_reads_and_writes_is_refused(forks):
    group = flotilla.Group()
    group.write(forks[0], 0, b"abcd")
    with pytest.raises(flotilla.InvalidRequestError, match="doneio"):
        group.read(forks[0], 0, bytearray(4))
    group.doneio()
    group.waitio()  # doneio does not wait: without this the read could pass the write
    back = bytearray(4)
    group.read(forks[0], 0, back)
    group.waitio()
    assert bytes(back) == b"abcd"


def test_a_failed_request_is_named(client, workdir, forks):
    f = client.create(f"{workdir}/one", subfiles=1, layout="explicit")
    missing = f.fork(0, "missing")
    group = flotilla.Group()
    group.write(forks[0], 0, b"x" * 10)
    group.write(missing, 4096, b"y" * 10)
    with pytest.raises(flotilla.Error, match="request 1 .*offset 4096"):
        group.waitio()
    with pytest.raises(flotilla.InvalidRequestError, match="nosend"):
        flotilla.Group(mode="sometimes")
    f.close()
