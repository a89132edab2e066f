/*
 * The parallel HDF5 part of the issue-36 benchmark (scripts/bench-mpiio.sh with HDF5=1; built
 * with h5pcc.openmpi, run with libflotilla_mpiio preloaded for `flotilla:` paths): 4 ranks
 * write an N^3 float64 contiguous dataset by hyperslabs (each rank its N x N/2 x N/2 block,
 * split in y and x), then H5Fflush (counted), close, reopen read-only and read the blocks back
 * (checked after the clock stops). MODE `coll` uses H5FD_MPIO_COLLECTIVE transfers, `indep`
 * H5FD_MPIO_INDEPENDENT. Rank 0 prints `h5_write MODE MB/s` and `h5_read MODE MB/s`.
 *
 *   mpirun -n 4 hdf5_bench PATH.h5 coll|indep N
 */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "rank %d: %s failed\n", rank, what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static hid_t access_list(void) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    expect(H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL) >= 0, "H5Pset_fapl_mpio");
    return fapl;
}

/* This rank's block selected in `space`; returns the memory space. */
static hid_t block(hid_t space, hsize_t n) {
    hsize_t start[3] = {0, (hsize_t)(rank / 2) * n / 2, (hsize_t)(rank % 2) * n / 2};
    hsize_t count[3] = {n, n / 2, n / 2};
    expect(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL) >= 0, "select hyperslab");
    return H5Screate_simple(3, count, NULL);
}

static void report(const char *phase, const char *mode, double bytes, double seconds) {
    if (rank == 0) printf("%s %s %.1f\n", phase, mode, bytes / seconds / 1e6);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int collective = argc == 4 && strcmp(argv[2], "coll") == 0;
    hsize_t n = argc == 4 ? (hsize_t)atoi(argv[3]) : 0;
    if (argc != 4 || size != 4 || (!collective && strcmp(argv[2], "indep") != 0) || n < 4 || n % 4 != 0) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -n 4 hdf5_bench PATH.h5 coll|indep N\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t cells = (size_t)n * (n / 2) * (n / 2);
    double *mine = malloc(sizeof(double) * cells), *back = calloc(cells, sizeof(double));
    for (size_t i = 0; i < cells; i++) mine[i] = rank * 1e9 + (double)i + 0.25;
    double file_bytes = (double)n * n * n * sizeof(double);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    expect(H5Pset_dxpl_mpio(dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT) >= 0, "dxpl");

    hid_t fapl = access_list();
    hid_t file = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    expect(file >= 0, "H5Fcreate");
    hsize_t dims[3] = {n, n, n};
    hid_t space = H5Screate_simple(3, dims, NULL);
    hid_t dset = H5Dcreate2(file, "cube", H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    expect(dset >= 0, "H5Dcreate2");
    hid_t memory = block(space, n);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    expect(H5Dwrite(dset, H5T_NATIVE_DOUBLE, memory, space, dxpl, mine) >= 0, "H5Dwrite");
    expect(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, "H5Fflush");
    MPI_Barrier(MPI_COMM_WORLD);
    report("h5_write", argv[2], file_bytes, MPI_Wtime() - start);
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(dset);
    H5Fclose(file);

    file = H5Fopen(argv[1], H5F_ACC_RDONLY, fapl);
    expect(file >= 0, "H5Fopen");
    dset = H5Dopen2(file, "cube", H5P_DEFAULT);
    expect(dset >= 0, "H5Dopen2");
    space = H5Dget_space(dset);
    memory = block(space, n);
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    expect(H5Dread(dset, H5T_NATIVE_DOUBLE, memory, space, dxpl, back) >= 0, "H5Dread");
    MPI_Barrier(MPI_COMM_WORLD);
    report("h5_read", argv[2], file_bytes, MPI_Wtime() - start);
    expect(memcmp(mine, back, sizeof(double) * cells) == 0, "the blocks read back");
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(dset);
    H5Fclose(file);
    H5Pclose(fapl);
    H5Pclose(dxpl);
    free(mine);
    free(back);
    MPI_Finalize();
    return 0;
}
