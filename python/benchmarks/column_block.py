"""Reading a column block of a row-major float64 matrix: one `read_into` versus a Python loop
of per-row reads, and versus numpy `memmap` of the same bytes on the local disk.

The matrix (N x N float64, row-major) is written to a Flotilla file once; then the block of
COLUMNS columns starting at FIRST is read into a dense (N, COLUMNS) array:

- flotilla, one request: `file.read_into(block, offset, file_strides=(N * 8, 8))`, one
  strided request of N records of COLUMNS * 8 bytes, straight into the array's memory;
- flotilla, per-row loop: `file.read_into(block[i], offset_i)` for every row i (N calls);
- numpy memmap: `np.array(memmap[:, first:first + columns])` of the same matrix stored in a
  local file, with the page cache warm and with the file's pages dropped first (cold).

Without --meta (or FLOTILLA_META) it starts `flotilla local` from target/release (or
target/debug) itself, with two I/O servers, data in a temporary folder.

    python python/benchmarks/column_block.py --n 4096 --columns 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import flotilla

REPO = Path(__file__).resolve().parents[2]


def start_cluster(data: str) -> "tuple[subprocess.Popen, str]":
    for profile in ("release", "debug"):
        binary = REPO / "target" / profile / "flotilla"
        if binary.exists():
            break
    else:
        raise SystemExit("no flotilla binary: run `cargo build --release` first")
    process = subprocess.Popen(
        [str(binary), "local", "--data", data, "--listen", "127.0.0.1:0", "--servers", "2"],
        stdout=subprocess.PIPE, text=True,
    )
    line: list = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not line or not line[0].startswith("meta="):
        process.kill()
        raise SystemExit(f"flotilla local did not start: {line!r}")
    return process, line[0].strip().split("=", 1)[1]


def timed(call, repeat: int) -> float:
    """Median seconds of `repeat` runs of `call`."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def drop_cached_pages(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(meta: str, n: int, columns: int, first: int, repeat: int, local_dir: str) -> dict:
    item = 8
    matrix = np.random.default_rng(0).random((n, n))
    expected = matrix[:, first:first + columns]
    client = flotilla.connect(meta)
    path = f"/column_block_{n}.f64"
    if client.exists(path):
        client.remove(path)
    f = client.create(path, subfiles=2, layout="stripe:1m")
    f.write_from(matrix)
    f.flush()

    block = np.empty((n, columns))
    offset = first * item

    def one_request():
        f.read_into(block, offset=offset, file_strides=(n * item, item))

    def row_loop():
        for i in range(n):
            f.read_into(block[i], offset=(i * n + first) * item)

    results = {}
    one_request()  # connect, warm the servers' caches
    results["flotilla, one read_into"] = timed(one_request, repeat)
    assert np.array_equal(block, expected)
    block[:] = 0
    results["flotilla, per-row loop"] = timed(row_loop, max(1, repeat // 2))
    assert np.array_equal(block, expected)

    with tempfile.NamedTemporaryFile(dir=local_dir, suffix=".f64", delete=False) as local:
        matrix.tofile(local)
    try:
        mapped = np.memmap(local.name, dtype=np.float64, mode="r", shape=(n, n))
        copy = lambda: np.array(mapped[:, first:first + columns])  # noqa: E731
        copy()
        results["numpy memmap, warm page cache"] = timed(copy, repeat)
        del mapped

        def cold():
            # A fresh mapping after dropping the file's pages: every page faults from disk.
            drop_cached_pages(local.name)
            fresh = np.memmap(local.name, dtype=np.float64, mode="r", shape=(n, n))
            block_copy = np.array(fresh[:, first:first + columns])
            del fresh
            return block_copy

        results["numpy memmap, pages dropped"] = timed(cold, repeat)
        assert np.array_equal(cold(), expected)
    finally:
        os.unlink(local.name)
    f.close()
    client.remove(path)

    block_bytes = n * columns * item
    print(f"column block: {n} x {columns} float64 ({block_bytes / 2**20:.1f} MiB) of a {n} x {n} "
          f"row-major matrix, columns {first}..{first + columns - 1}; median of {repeat} runs")
    for name, seconds in results.items():
        print(f"  {name:32s} {seconds * 1e3:9.2f} ms  {block_bytes / seconds / 2**20:9.1f} MiB/s")
    speedup = results["flotilla, per-row loop"] / results["flotilla, one read_into"]
    print(f"  one read_into vs per-row loop: {speedup:.1f}x")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--meta", default=os.environ.get("FLOTILLA_META"))
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--columns", type=int, default=256)
    parser.add_argument("--first", type=int, default=None, help="first column (default: n / 4)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--local-dir", default=tempfile.gettempdir(), help="where the memmap file goes")
    args = parser.parse_args()
    first = args.n // 4 if args.first is None else args.first
    if first + args.columns > args.n:
        raise SystemExit("the column block must fit in the matrix")
    process = None
    data = None
    meta = args.meta
    if not meta:
        data = tempfile.mkdtemp(prefix="flotilla-bench-")
        process, meta = start_cluster(data)
    try:
        run(meta, args.n, args.columns, first, args.repeat, args.local_dir)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
            subprocess.run(["rm", "-rf", data], check=False)


if __name__ == "__main__":
    main()
