"""ENWRICH from Python: a job of two processes (this one and a child `python -c`) writing
overlapping ranges in ENWRICH mode; flushed collectively on sync and close; the file read
back holds the newest bytes."""

import os
import subprocess
import sys
import uuid

import numpy as np

import flotilla

CHILD = """
import sys, flotilla
client = flotilla.connect()
with client.open(sys.argv[1], enwrich=True, cache_bytes=1 << 20) as f:
    stamp = f.write(4096, b"c" * 4096)
    print(f.member, stamp, flush=True)
    sys.stdin.readline()  # the parent's sync flushed the job; close flushes nothing more
"""


def model(writes):
    """Newest wins by (stamp, member), as the servers resolve it."""
    data = bytearray(8192)
    for _, _, offset, payload in sorted(writes):
        data[offset : offset + len(payload)] = payload
    return bytes(data)


def test_two_processes_flush_together(client, workdir):
    path = f"{workdir}/enwrich"
    client.create(path, subfiles=2, layout="stripe:4k").close()
    job = f"py-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, FLOTILLA_JOB_NAME=job, FLOTILLA_JOB_SIZE="2")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        f = client.open(path, enwrich=True, job=job, job_size=2, flush_timeout_ms=0)
        assert isinstance(f, flotilla.EnwrichFile)
        a = f.write(0, np.full(8192, ord("a"), dtype=np.uint8))
        b = f.write(6144, b"b" * 2048)
        assert b > a, "a process's stamps increase"
        child_member, c = (int(word) for word in child.stdout.readline().split())
        member = f.member
        assert {member, child_member} == {0, 1}
        f.sync()
        assert f.flushes == 1
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
        f.close()
        f.close()  # twice is fine
    finally:
        if child.poll() is None:
            child.kill()
    writes = [
        (a, member, 0, b"a" * 8192),
        (b, member, 6144, b"b" * 2048),
        (c, child_member, 4096, b"c" * 4096),
    ]
    reading = client.open(path)
    assert reading.size() == 8192
    back = bytearray(8192)
    reading.read_into(back, 0)
    assert bytes(back) == model(writes)
