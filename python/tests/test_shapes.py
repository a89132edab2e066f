"""Every request shape, blocking and non-blocking, on forks and on linear files, checked
against the shape's own piece list applied to a model of the bytes."""

import asyncio

import numpy as np
import pytest

import flotilla

SIZE = 1 << 16


def pattern(size=SIZE, seed=1):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def shapes():
    leaf = flotilla.BatchNode(count=3, file_stride=100, memory_stride=10, sub=10)
    tree = flotilla.BatchNode(count=4, file_stride=1000, memory_stride=30, sub=[leaf], file_offset=500)
    return {
        "contiguous": flotilla.contiguous(1000, 3000, memory_offset=16),
        "strided": flotilla.strided(64, 48, 512, 40, memory_stride=64),
        "strided-negative": flotilla.strided(40000, 16, -300, 50, memory_stride=-20, memory_offset=2000),
        "nested": flotilla.nested(10, 8, [(24, 8, 5), (1000, 40, 7), (9000, 280, 3)]),
        "batched": flotilla.batched([tree, flotilla.BatchNode(2, 7, 7, 5, file_offset=30000, memory_offset=200, file_absolute=True, memory_absolute=True)]),
        "list": flotilla.pieces([(5, 0, 100), (60000, 100, 50), (300, 150, 7)]),
    }


def expected_read(shape, data):
    _, _, _, memory_end = shape.summary()
    out = np.zeros(memory_end, dtype=np.uint8)
    for file_offset, memory_offset, length in shape.pieces():
        out[memory_offset:memory_offset + length] = data[file_offset:file_offset + length]
    return out


@pytest.fixture(params=["fork", "linear"])
def target(request, client, workdir):
    if request.param == "fork":
        f = client.create(f"{workdir}/explicit", subfiles=2, layout="explicit")
        yield f.fork(1)
    else:
        f = client.create(f"{workdir}/linear", subfiles=2, layout="stripe:4k")
        yield f
    f.close()


@pytest.mark.parametrize("name", list(shapes()))
def test_read_every_shape(target, name):
    data = pattern()
    assert target.write(flotilla.contiguous(0, SIZE), data) == SIZE
    shape = shapes()[name]
    buffer = bytearray(shape.summary()[3])
    assert target.read(shape, buffer) == shape.summary()[1]
    assert np.array_equal(np.frombuffer(buffer, np.uint8), expected_read(shape, data))


@pytest.mark.parametrize("name", list(shapes()))
def test_write_every_shape(target, name):
    shape = shapes()[name]
    source = pattern(shape.summary()[3], seed=2)
    target.write(flotilla.contiguous(0, SIZE), np.zeros(SIZE, np.uint8))
    assert target.write(shape, source) == shape.summary()[1]
    model = np.zeros(SIZE, np.uint8)
    for file_offset, memory_offset, length in shape.pieces():
        model[file_offset:file_offset + length] = source[memory_offset:memory_offset + length]
    back = np.zeros(SIZE, np.uint8)
    target.read(flotilla.contiguous(0, SIZE), back)
    assert np.array_equal(back, model)


def test_non_blocking_handles(target):
    data = pattern()
    handle = target.write_nb(flotilla.contiguous(0, SIZE), data)
    assert handle.wait() == SIZE
    assert handle.done() and handle.wait() == SIZE  # finished handles answer again
    shape = shapes()["nested"]
    buffers = [np.zeros(shape.summary()[3], np.uint8) for _ in range(8)]
    handles = [target.read_nb(shape, b) for b in buffers]
    assert all(h.wait() == shape.summary()[1] for h in handles)
    for b in buffers:
        assert np.array_equal(b, expected_read(shape, data))


def test_handles_are_awaitable(target):
    data = pattern()
    target.write(flotilla.contiguous(0, SIZE), data)

    async def main():
        arrays = [np.zeros(1024, np.uint8) for _ in range(4)]
        counts = await asyncio.gather(*(target.read_into_nb(a, offset=1024 * i) for i, a in enumerate(arrays)))
        return counts, arrays

    counts, arrays = asyncio.run(main())
    assert counts == [1024] * 4
    assert np.array_equal(np.concatenate(arrays), data[:4096])


def test_dropping_an_unfinished_handle_is_safe(target):
    data = pattern()
    target.write(flotilla.contiguous(0, SIZE), data)
    for _ in range(20):
        buffer = np.zeros(SIZE, np.uint8)
        target.read_nb(flotilla.contiguous(0, SIZE), buffer)  # handle dropped at once
        del buffer
    assert target.read_array(0, SIZE, np.uint8).tobytes() == data.tobytes()


def test_summary_and_pieces():
    shape = flotilla.strided(0, 8, 16, 4)
    assert shape.kind == "strided"
    assert shape.summary() == (4, 32, 56, 32)
    assert shape.pieces()[1] == (16, 8, 8)
    assert shape == flotilla.strided(0, 8, 16, 4)
