"""A real Flotilla cluster for the whole test session: `flotilla local` (a metadata service
and two I/O servers on loopback, data in a temporary folder), started once and stopped with
SIGTERM at the end. The binary is built with cargo if it is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

import flotilla

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60


def flotilla_binary() -> Path:
    """`FLOTILLA_BIN`, or target/debug/flotilla of this repository (built if missing)."""
    explicit = os.environ.get("FLOTILLA_BIN")
    if explicit:
        return Path(explicit)
    binary = REPO / "target" / "debug" / "flotilla"
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "flotilla-cli"], cwd=REPO, check=True)
    return binary


def start_local(data: Path, servers: int) -> "tuple[subprocess.Popen, str, str]":
    process = subprocess.Popen(
        [str(flotilla_binary()), "local", "--data", str(data), "--listen", "127.0.0.1:0", "--servers", str(servers)],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list = []
    reader = threading.Thread(
        target=lambda: lines.extend([process.stdout.readline(), process.stdout.readline()]), daemon=True
    )
    reader.start()
    reader.join(STARTUP_TIMEOUT_S)
    if len(lines) < 2 or not lines[0].startswith("meta=") or not lines[1].startswith("key="):
        stop(process)
        raise RuntimeError(f"flotilla local did not start: {lines!r}")
    return process, lines[0].strip().split("=", 1)[1], lines[1].strip().split("=", 1)[1]


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def meta():
    """The cluster's metadata address ("127.0.0.1:PORT"); also exported as FLOTILLA_META, and
    its client credential as FLOTILLA_KEY."""
    data = Path(tempfile.mkdtemp(prefix="flotilla-pytest-"))
    process, address, key = start_local(data, servers=2)
    previous = {name: os.environ.get(name) for name in ("FLOTILLA_META", "FLOTILLA_KEY")}
    os.environ["FLOTILLA_META"] = address
    os.environ["FLOTILLA_KEY"] = key
    try:
        yield address
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        stop(process)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def client(meta):
    return flotilla.connect(meta)


@pytest.fixture
def workdir(client):
    """A fresh directory in the cluster for one test."""
    path = f"/test-{uuid.uuid4().hex[:12]}"
    client.mkdir(path)
    return path
