/*
 * The counted MPI-IO program of libflotilla_mpiio (4 ranks, flotilla: paths only): each rank
 * writes its block of a 64x64x64 float64 array (64x32x32, split in y and x) through a subarray
 * view with MPI_File_write_all, then reads it back with MPI_File_read_at_all, on a file striped
 * over 4 servers in 4 KiB units. Each rank's block touches every server (a z-plane is 8 units,
 * a rank's rows of it 4 consecutive ones), so the test that runs it (tests/mpi_programs.rs)
 * expects exactly one write request and one read request per rank per server in the servers'
 * statistics, and checks every value of the file.
 *
 *   counted flotilla:/dir/file
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 64

static int rank;

static void check(int code, const char *what) {
    if (code != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, text);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static double cell(int z, int y, int x) { return z * N * N + y * N + x + 0.5; }

int main(int argc, char **argv) {
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || size != 4) {
        if (rank == 0) fprintf(stderr, "usage: mpiexec -n 4 counted flotilla:/dir/file\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "striping_factor", "4");
    MPI_Info_set(info, "striping_unit", "4096");
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_RDWR, info, &fh), "open");
    MPI_Info_free(&info);
    int sizes[3] = {N, N, N}, subsizes[3] = {N, N / 2, N / 2};
    int y0 = (rank / 2) * N / 2, x0 = (rank % 2) * N / 2;
    int starts[3] = {0, y0, x0};
    MPI_Datatype block;
    MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_C, MPI_DOUBLE, &block);
    MPI_Type_commit(&block);
    int cells = N * (N / 2) * (N / 2);
    double *mine = malloc(sizeof(double) * cells), *back = calloc(cells, sizeof(double));
    int i = 0;
    for (int z = 0; z < N; z++)
        for (int y = 0; y < N / 2; y++)
            for (int x = 0; x < N / 2; x++) mine[i++] = cell(z, y + y0, x + x0);
    check(MPI_File_set_view(fh, 0, MPI_DOUBLE, block, "native", MPI_INFO_NULL), "set_view");
    MPI_Status status;
    check(MPI_File_write_all(fh, mine, cells, MPI_DOUBLE, &status), "write_all");
    check(MPI_File_sync(fh), "sync");
    check(MPI_File_read_at_all(fh, 0, back, cells, MPI_DOUBLE, &status), "read_at_all");
    for (i = 0; i < cells; i++)
        if (back[i] != mine[i]) {
            fprintf(stderr, "rank %d: value %d read back as %g, written %g\n", rank, i, back[i], mine[i]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    check(MPI_File_close(&fh), "close");
    MPI_Type_free(&block);
    free(mine);
    free(back);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("all checks passed\n");
    MPI_Finalize();
    return 0;
}
