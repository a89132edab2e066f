"""mpi4py's MPI.File through libflotilla_mpiio (preloaded into Debian's python3-mpi4py, which
is built with Open MPI): 4 ranks each write their block of a 16x16x16 float64 array through a
subarray view (Write_all), read it back (Read_at_all) and check the file's size. The test that
runs it (tests/mpi_programs.rs) checks every value of the file.

    mpirun -n 4 -x LD_PRELOAD=.../libflotilla_mpiio.so python3 subarray.py flotilla:/dir/file
"""

import sys
from array import array

from mpi4py import MPI

N = 16


def main(path):
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 4:
        raise SystemExit("4 ranks, please")
    y0, x0 = (rank // 2) * N // 2, (rank % 2) * N // 2
    block = MPI.DOUBLE.Create_subarray(
        [N, N, N], [N, N // 2, N // 2], [0, y0, x0], order=MPI.ORDER_C
    ).Commit()
    mine = array(
        "d",
        (
            z * N * N + (y + y0) * N + (x + x0) + 0.5
            for z in range(N)
            for y in range(N // 2)
            for x in range(N // 2)
        ),
    )
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
    fh.Set_view(0, MPI.DOUBLE, block)
    fh.Write_all([mine, MPI.DOUBLE])
    fh.Sync()
    back = array("d", bytes(8 * len(mine)))
    fh.Read_at_all(0, [back, MPI.DOUBLE])
    if back != mine:
        raise AssertionError(f"rank {rank}: the block read back differs")
    if fh.Get_size() != N * N * N * 8:
        raise AssertionError(f"rank {rank}: size {fh.Get_size()}")
    fh.Close()
    block.Free()
    comm.Barrier()
    if rank == 0:
        print("all checks passed", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException as error:  # one rank's failure ends the job, not a hang
        print(f"rank {MPI.COMM_WORLD.Get_rank()}: {error!r}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
