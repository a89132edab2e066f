"""Namespace calls and the mapping of errors to exceptions."""

import pytest

import flotilla


def test_mkdir_listdir_stat_rename_remove(client, workdir):
    client.mkdir(f"{workdir}/sub")
    with client.create(f"{workdir}/a.dat", subfiles=2, layout="stripe:4k") as f:
        assert f.subfiles == 2
        assert f.layout == "stripe:4K:0"
        f.write_at(0, b"hello")
    assert sorted(client.listdir(workdir)) == ["a.dat", "sub"]
    kinds = {e.name: e.kind for e in client.scandir(workdir)}
    assert kinds == {"a.dat": "file", "sub": "directory"}
    stat = client.stat(f"{workdir}/a.dat")
    assert (stat.kind, stat.size, stat.subfiles) == ("file", 5, 2)
    client.rename(f"{workdir}/a.dat", f"{workdir}/sub/b.dat")
    assert client.exists(f"{workdir}/sub/b.dat") and not client.exists(f"{workdir}/a.dat")
    client.remove(f"{workdir}/sub/b.dat")
    client.rmdir(f"{workdir}/sub")
    assert client.listdir(workdir) == []


def test_errors_are_flotilla_errors_and_builtins(client, workdir):
    with pytest.raises(FileNotFoundError) as missing:
        client.stat(f"{workdir}/nope")
    assert isinstance(missing.value, flotilla.Error)
    assert isinstance(missing.value, flotilla.NotFoundError)
    assert missing.value.errno == 2
    client.mkdir(f"{workdir}/d")
    with pytest.raises(FileExistsError):
        client.mkdir(f"{workdir}/d")
    client.create(f"{workdir}/d/f").close()
    with pytest.raises(flotilla.NotEmptyError):
        client.rmdir(f"{workdir}/d")
    with pytest.raises(FileExistsError):
        client.create(f"{workdir}/d/f")
    with pytest.raises(IsADirectoryError):
        client.open(f"{workdir}/d")
    with pytest.raises(ValueError):
        client.create(f"{workdir}/bad", layout="zigzag:4")


def test_create_not_exclusive_opens_existing(client, workdir):
    with client.create(f"{workdir}/f") as f:
        f.write_at(0, b"abc")
    with client.create(f"{workdir}/f", exclusive=False) as f:
        assert f.read_at(0, 10) == b"abc"


def test_no_overlap_handles_take_no_tokens(client, workdir):
    with client.create(f"{workdir}/tokens") as f:
        assert f.takes_tokens
        f.write_at(0, b"shared")
    with client.create(f"{workdir}/disjoint", no_overlap=True) as f:
        assert not f.takes_tokens
        f.write_at(0, b"mine")
    with client.open(f"{workdir}/tokens", no_overlap=True) as f:
        assert not f.takes_tokens
        assert f.read_at(0, 10) == b"shared"
    with client.open(f"{workdir}/disjoint") as f:
        assert f.takes_tokens and f.read_at(0, 10) == b"mine"


def test_forks_and_status(client, workdir):
    f = client.create(f"{workdir}/forks", subfiles=2, layout="explicit")
    index = f.create_fork(1, "index")
    index.write(flotilla.contiguous(0, 4), b"1234")
    assert dict(f.list_forks(1)) == {"data": 0, "index": 4}
    assert index.size() == 4
    f.remove_fork(1, "index")
    with pytest.raises(FileNotFoundError):
        f.fork(1, "index").size()
    with pytest.raises(ValueError):
        f.fork(5)
    status = client.status()
    assert len(status) == 2 and all(t["up"] for t in status)


def test_closed_client_and_file_raise(meta, workdir):
    other = flotilla.connect(meta)
    f = other.create(f"{workdir}/c")
    fork = f.fork(0)
    f.close()
    f.close()  # twice is fine
    with pytest.raises(flotilla.ClosedError):
        f.read_at(0, 1)
    other.close()
    assert other.closed
    for call in (lambda: other.stat("/"), lambda: fork.size(), lambda: other.create(f"{workdir}/d")):
        with pytest.raises(flotilla.ClosedError) as error:
            call()
        assert isinstance(error.value, ValueError)
