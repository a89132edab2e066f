/*
 * The MPI-IO benchmark of issue 36 (scripts/bench-mpiio.sh runs it; docs/performance.md has
 * the figures). 4 ranks, one path prefix chosen by the caller (`flotilla:/dir/f` through
 * libflotilla_mpiio, `ufs:/mnt/dir/f` through ROMIO's POSIX driver, or a plain local path):
 *
 *   cube_write    each rank writes its block (N x N/2 x N/2, split in y and x) of an N^3
 *                 float64 array through a subarray view, so its part is strided in the file;
 *                 then MPI_File_sync (counted in the time)
 *   cube_read     each rank reads its block back through the same view (checked after the
 *                 clock stops)
 *   records_write rank r writes 4 KiB records r, r+4, r+8, ... (a resized-contiguous
 *                 filetype, one call per rank), as many bytes in all as the cube; then sync
 *
 * MODE `coll` uses the collective calls (write_all, read_all), `indep` the independent ones
 * (write, read). Each phase runs between two barriers and rank 0 prints `PHASE MODE MB/s`
 * (10^6 bytes per second of the whole file). Files PATH.cube and PATH.rec are deleted first.
 *
 *   mpiexec -n 4 mpiio_bench PATH coll|indep N
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORD_BYTES 4096
#define RANKS 4

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

static double cell(long n, long z, long y, long x) { return (double)(z * n * n + y * n + x) + 0.5; }

static void report(const char *phase, const char *mode, double bytes, double seconds) {
    if (rank == 0) printf("%s %s %.1f\n", phase, mode, bytes / seconds / 1e6);
    fflush(stdout);
}

static MPI_File open_fresh(const char *path) {
    if (rank == 0) MPI_File_delete(path, MPI_INFO_NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open");
    return fh;
}

static int write_data(MPI_File fh, int collective, void *data, int count, MPI_Datatype type) {
    MPI_Status status;
    return collective ? MPI_File_write_all(fh, data, count, type, &status)
                      : MPI_File_write(fh, data, count, type, &status);
}

static int read_data(MPI_File fh, int collective, void *data, int count, MPI_Datatype type) {
    MPI_Status status;
    return collective ? MPI_File_read_all(fh, data, count, type, &status)
                      : MPI_File_read(fh, data, count, type, &status);
}

static void cube(const char *path, const char *mode, int collective, int n) {
    int sizes[3] = {n, n, n}, subsizes[3] = {n, n / 2, n / 2};
    int y0 = (rank / 2) * n / 2, x0 = (rank % 2) * n / 2;
    int starts[3] = {0, y0, x0};
    MPI_Datatype block;
    MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_C, MPI_DOUBLE, &block);
    MPI_Type_commit(&block);
    long cells = (long)n * (n / 2) * (n / 2);
    double *mine = malloc(sizeof(double) * cells), *back = calloc(cells, sizeof(double));
    long i = 0;
    for (long z = 0; z < n; z++)
        for (long y = 0; y < n / 2; y++)
            for (long x = 0; x < n / 2; x++) mine[i++] = cell(n, z, y + y0, x + x0);
    double file_bytes = (double)n * n * n * sizeof(double);

    MPI_File fh = open_fresh(path);
    check(MPI_File_set_view(fh, 0, MPI_DOUBLE, block, "native", MPI_INFO_NULL), "set_view");
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    check(write_data(fh, collective, mine, (int)cells, MPI_DOUBLE), "cube write");
    check(MPI_File_sync(fh), "sync");
    MPI_Barrier(MPI_COMM_WORLD);
    report("cube_write", mode, file_bytes, MPI_Wtime() - start);
    check(MPI_File_close(&fh), "close");

    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh), "reopen");
    check(MPI_File_set_view(fh, 0, MPI_DOUBLE, block, "native", MPI_INFO_NULL), "set_view");
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    check(read_data(fh, collective, back, (int)cells, MPI_DOUBLE), "cube read");
    MPI_Barrier(MPI_COMM_WORLD);
    report("cube_read", mode, file_bytes, MPI_Wtime() - start);
    check(MPI_File_close(&fh), "close");
    if (memcmp(mine, back, sizeof(double) * cells) != 0) {
        fprintf(stderr, "rank %d: cube read back differs from what it wrote\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Type_free(&block);
    free(mine);
    free(back);
}

static void records(const char *path, const char *mode, int collective, int n) {
    double file_bytes = (double)n * n * n * sizeof(double);
    int per_rank = (int)(file_bytes / RANKS / RECORD_BYTES);
    MPI_Datatype record, interleaved;
    MPI_Type_contiguous(RECORD_BYTES, MPI_BYTE, &record);
    MPI_Type_create_resized(record, 0, (MPI_Aint)RECORD_BYTES * RANKS, &interleaved);
    MPI_Type_commit(&interleaved);
    size_t bytes = (size_t)per_rank * RECORD_BYTES;
    unsigned char *data = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) data[i] = (unsigned char)(rank * 61 + i);

    MPI_File fh = open_fresh(path);
    check(MPI_File_set_view(fh, (MPI_Offset)rank * RECORD_BYTES, MPI_BYTE, interleaved, "native", MPI_INFO_NULL),
          "set_view");
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    check(write_data(fh, collective, data, (int)bytes, MPI_BYTE), "records write");
    check(MPI_File_sync(fh), "sync");
    MPI_Barrier(MPI_COMM_WORLD);
    report("records_write", mode, (double)bytes * RANKS, MPI_Wtime() - start);
    MPI_Offset size = 0;
    check(MPI_File_get_size(fh, &size), "get_size");
    if (size != (MPI_Offset)bytes * RANKS) {
        fprintf(stderr, "rank %d: records file is %lld bytes, expected %zu\n", rank, (long long)size, bytes * RANKS);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    check(MPI_File_close(&fh), "close");
    MPI_Type_free(&interleaved);
    MPI_Type_free(&record);
    free(data);
}

int main(int argc, char **argv) {
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int collective = argc == 4 && strcmp(argv[2], "coll") == 0;
    int n = argc == 4 ? atoi(argv[3]) : 0;
    if (argc != 4 || size != RANKS || (!collective && strcmp(argv[2], "indep") != 0) || n < 4 || n % 4 != 0) {
        if (rank == 0) fprintf(stderr, "usage: mpiexec -n 4 mpiio_bench PATH coll|indep N (N a multiple of 4)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.cube", argv[1]);
    cube(path, argv[2], collective, n);
    snprintf(path, sizeof path, "%s.rec", argv[1]);
    records(path, argv[2], collective, n);
    MPI_Finalize();
    return 0;
}
