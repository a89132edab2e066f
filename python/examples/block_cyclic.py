"""A 2-D matrix written by 4 processes in a BLOCK-CYCLIC distribution, read back by columns.

The N x N float64 matrix A[i, j] = i * N + j is stored row-major in one Flotilla file,
striped over (up to) 4 subfiles. Four processes form a 2 x 2 grid (ScaLAPACK style): process
(pr, pc) owns every B x B block (I, J) with I % 2 == pr and J % 2 == pc, and keeps them
packed in one local array. Each process writes ALL its blocks with ONE request: a 4-D view
of its local array, (block row, row in block, block column, column in block), whose file
strides jump 2 blocks down, 1 row, 2 blocks across and 1 element.

Then each process reads a slab of N / 4 whole columns (one strided request of N rows) and
checks it; process 0 also reads single columns into 1-D arrays.

    FLOTILLA_META=127.0.0.1:7770 python block_cyclic.py [--n 1024] [--block 64]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys

import numpy as np

import flotilla

GRID = (2, 2)  # process rows x process columns
ITEM = 8  # bytes of a float64


def global_matrix_rows(rows: np.ndarray, n: int) -> np.ndarray:
    """Rows `rows` of the global matrix A[i, j] = i * n + j."""
    return rows[:, None].astype(np.float64) * n + np.arange(n, dtype=np.float64)[None, :]


def local_blocks(rank: int, n: int, block: int) -> "tuple[np.ndarray, int, tuple]":
    """Process `rank`'s blocks packed in a local array, where its first block starts in the
    file, and the file strides of the 4-D block view."""
    pr, pc = divmod(rank, GRID[1])
    block_rows = range(pr, n // block, GRID[0])
    block_cols = range(pc, n // block, GRID[1])
    rows = np.concatenate([np.arange(I * block, (I + 1) * block) for I in block_rows])
    cols = np.concatenate([np.arange(J * block, (J + 1) * block) for J in block_cols])
    local = global_matrix_rows(rows, n)[:, cols]  # what this process computed
    first = (pr * block * n + pc * block) * ITEM
    file_strides = (GRID[0] * block * n * ITEM, n * ITEM, GRID[1] * block * ITEM, ITEM)
    return local, first, file_strides


def writer(meta: str, path: str, rank: int, n: int, block: int) -> None:
    client = flotilla.connect(meta)
    with client.open(path) as f:
        local, first, file_strides = local_blocks(rank, n, block)
        view = local.reshape(local.shape[0] // block, block, local.shape[1] // block, block)
        assert np.shares_memory(view, local)  # no copy: the request reads local's memory
        f.write_from(view, offset=first, file_strides=file_strides)  # ONE request
    client.close()


def column_reader(meta: str, path: str, rank: int, n: int, processes: int) -> None:
    client = flotilla.connect(meta)
    width = n // processes
    with client.open(path) as f:
        slab = f.read_array(rank * width * ITEM, (n, width), np.float64, file_strides=(n * ITEM, ITEM))
        expected = global_matrix_rows(np.arange(n), n)[:, rank * width:(rank + 1) * width]
        assert np.array_equal(slab, expected), f"process {rank}: column slab differs"
        if rank == 0:
            for column in (0, n // 2 + 1, n - 1):
                values = np.empty(n)
                f.read_into(values, offset=column * ITEM, file_strides=(n * ITEM,))
                assert np.array_equal(values, np.arange(n) * n + column)
    client.close()


def run(meta: str, path: str, n: int, block: int) -> None:
    processes = GRID[0] * GRID[1]
    if n % (block * GRID[0]) or n % (block * GRID[1]) or n % processes:
        raise SystemExit("n must be a multiple of 2 * block and of 4")
    client = flotilla.connect(meta)
    if client.exists(path):
        client.remove(path)
    targets_up = sum(1 for target in client.status() if target["up"])
    client.create(path, subfiles=max(1, min(4, targets_up)), layout="stripe:64k").close()
    context = multiprocessing.get_context("spawn")  # fresh processes, each with its own client
    for phase in (writer, column_reader):
        args = [(meta, path, rank, n, block if phase is writer else processes) for rank in range(processes)]
        workers = [context.Process(target=phase, args=a) for a in args]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if any(w.exitcode != 0 for w in workers):
            raise SystemExit(f"{phase.__name__} failed: exit codes {[w.exitcode for w in workers]}")
    size = client.stat(path).size
    assert size == n * n * ITEM, size
    print(f"block-cyclic {n}x{n} (blocks {block}x{block}, grid {GRID[0]}x{GRID[1]}): written by "
          f"{processes} processes, read back by columns: OK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--meta", default=os.environ.get("FLOTILLA_META"))
    parser.add_argument("--path", default="/block_cyclic.f64")
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args()
    if not args.meta:
        sys.exit("set FLOTILLA_META or pass --meta HOST:PORT")
    run(args.meta, args.path, args.n, args.block)


if __name__ == "__main__":
    main()
