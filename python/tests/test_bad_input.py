"""Bad input gives clear exceptions, never a crash."""

import numpy as np
import pytest

import flotilla


@pytest.fixture
def fork(client, workdir):
    f = client.create(f"{workdir}/f", layout="explicit")
    fork = f.fork(0)
    fork.write(flotilla.contiguous(0, 4096), bytes(4096))
    return fork


@pytest.fixture
def linear(client, workdir):
    f = client.create(f"{workdir}/linear", subfiles=2, layout="stripe:4k")
    f.write_at(0, bytes(4096))
    return f


def test_object_dtype_is_refused(fork):
    objects = np.array([object(), object()])
    with pytest.raises(flotilla.InvalidRequestError, match="Python objects"):
        fork.write_from(objects)
    with pytest.raises(ValueError):
        fork.read_array(0, 2, object)


def test_unknown_dtype_and_order(fork):
    with pytest.raises(ValueError, match="dtype"):
        fork.read_array(0, 2, "float99")
    with pytest.raises(ValueError, match="order"):
        fork.read_array(0, 2, np.float64, order="K")
    with pytest.raises(ValueError):
        fork.read_array(0, (-1, 2), np.float64)


def test_non_contiguous_buffer_where_contiguous_needed(fork):
    strided = np.zeros((16, 16), np.uint8)[:, ::2]
    with pytest.raises(ValueError, match="not contiguous"):
        fork.read(flotilla.contiguous(0, 16), strided)
    with pytest.raises(ValueError, match="not contiguous"):
        fork.write(flotilla.contiguous(0, 16), strided)


def test_read_only_and_non_buffers(fork):
    with pytest.raises((BufferError, ValueError)):
        fork.read(flotilla.contiguous(0, 4), b"abcd")
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        fork.read_into(frozen)
    with pytest.raises(TypeError):
        fork.write(flotilla.contiguous(0, 4), [1, 2, 3, 4])


def test_buffer_too_small_for_the_shape(fork):
    with pytest.raises(ValueError, match="too small"):
        fork.read(flotilla.strided(0, 8, 16, 10), bytearray(40))


def test_overflowing_shapes(fork, linear):
    huge = flotilla.strided(0, 1 << 40, 1 << 62, 1 << 40)
    with pytest.raises(ValueError):
        huge.summary()
    with pytest.raises(ValueError):
        fork.read(huge, bytearray(8))
    with pytest.raises(ValueError):
        linear.read(flotilla.nested(0, 1, [(2, 1, 1 << 62), (4, 4, 1 << 62)]), bytearray(8))
    with pytest.raises(OverflowError):
        flotilla.contiguous(-1, 4)
    with pytest.raises(OverflowError):
        flotilla.contiguous(0, 1 << 64)
    too_deep = flotilla.nested(0, 1, [(1, 1, 1)] * (flotilla.STRIDE_LEVELS_MAX + 1))
    with pytest.raises(ValueError, match="levels"):
        fork.read(too_deep, bytearray(8))


def test_negative_strides_before_offset_zero(fork, linear):
    for target in (fork, linear):
        with pytest.raises(ValueError, match="before offset 0"):
            target.read(flotilla.strided(100, 8, -16, 10), bytearray(80))
        with pytest.raises(ValueError, match="before offset 0"):
            target.read_into(np.zeros(10), offset=8, file_strides=(-8,))
        with pytest.raises(ValueError, match="before offset 0"):
            target.write_from_nb(np.zeros(10), offset=8, file_strides=(-8,))


def test_file_strides_must_match_dimensions(fork):
    with pytest.raises(ValueError, match="dimensions"):
        fork.read_into(np.zeros((2, 2)), file_strides=(8,))
    with pytest.raises(OverflowError):
        fork.read_into(np.zeros((2, 2)), file_strides=(1 << 63, 8))


def test_huge_array_views_are_refused_before_io(fork):
    ghost = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(1 << 29, 1 << 30), strides=(0, 0))
    with pytest.raises(ValueError):
        fork.write_from(ghost)


def test_linear_calls_on_an_explicit_file(client, workdir):
    f = client.create(f"{workdir}/x", layout="explicit")
    with pytest.raises(ValueError, match="explicit"):
        f.write_at(0, b"data")


def test_bad_batch_nodes():
    with pytest.raises(ValueError):
        flotilla.BatchNode(1, 0, 0, sub="ten")
    with pytest.raises(TypeError):
        flotilla.batched([1, 2])


def test_connect_to_nothing_fails_cleanly():
    client = flotilla.connect("127.0.0.1:1")
    with pytest.raises(flotilla.Error):
        client.stat("/")
