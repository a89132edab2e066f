/*
 * Parallel HDF5 (Debian's libhdf5-openmpi-dev, h5pcc.openmpi) through libflotilla_mpiio,
 * preloaded (HDF5 calls MPI_File_* itself; a program linked with the library but calling none
 * of them would drop it at link time): 4 ranks write a 16x16 float64 dataset by hyperslabs
 * (each rank an 8x8 quarter, collective transfers), once contiguous and once chunked 8x8, close
 * the file, open it again read-only and read every rank's quarter back.
 *
 *   hdf5 flotilla:/dir/file.h5   (or a local path, for the run to compare with)
 */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N 16
#define Q (N / 2)

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

/* The quarter of `rank`, selected in the file space `space`; returns the memory space. */
static hid_t quarter(hid_t space) {
    hsize_t start[2] = {(hsize_t)(rank / 2) * Q, (hsize_t)(rank % 2) * Q}, count[2] = {Q, Q};
    expect(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL) >= 0, "select hyperslab");
    return H5Screate_simple(2, count, NULL);
}

static void write_dataset(hid_t file, const char *name, int chunked, const double *values, hid_t dxpl) {
    hsize_t dims[2] = {N, N}, chunk[2] = {Q, Q};
    hid_t space = H5Screate_simple(2, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunked) expect(H5Pset_chunk(dcpl, 2, chunk) >= 0, "H5Pset_chunk");
    /* No timestamps: the file must equal the same run's on a local directory byte for byte. */
    expect(H5Pset_obj_track_times(dcpl, 0) >= 0, "H5Pset_obj_track_times");
    hid_t dset = H5Dcreate2(file, name, H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    expect(dset >= 0, "H5Dcreate2");
    hid_t memory = quarter(space);
    expect(H5Dwrite(dset, H5T_NATIVE_DOUBLE, memory, space, dxpl, values) >= 0, "H5Dwrite");
    H5Sclose(memory);
    H5Dclose(dset);
    H5Pclose(dcpl);
    H5Sclose(space);
}

static void read_dataset(hid_t file, const char *name, const double *values, hid_t dxpl) {
    double back[Q * Q];
    hid_t dset = H5Dopen2(file, name, H5P_DEFAULT);
    expect(dset >= 0, "H5Dopen2");
    hid_t space = H5Dget_space(dset), memory = quarter(space);
    expect(H5Dread(dset, H5T_NATIVE_DOUBLE, memory, space, dxpl, back) >= 0, "H5Dread");
    for (int i = 0; i < Q * Q; i++) expect(back[i] == values[i], "a value read back");
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(dset);
}

int main(int argc, char **argv) {
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || size != 4) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -n 4 hdf5 flotilla:/dir/file.h5\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double values[Q * Q];
    for (int i = 0; i < Q * Q; i++) values[i] = rank * 1000 + i + 0.25;
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    expect(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0, "H5Pset_dxpl_mpio");
    hid_t fapl = access_list();
    hid_t file = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    expect(file >= 0, "H5Fcreate");
    write_dataset(file, "contiguous", 0, values, dxpl);
    write_dataset(file, "chunked", 1, values, dxpl);
    expect(H5Fclose(file) >= 0, "H5Fclose");
    file = H5Fopen(argv[1], H5F_ACC_RDONLY, fapl);
    expect(file >= 0, "H5Fopen");
    read_dataset(file, "contiguous", values, dxpl);
    read_dataset(file, "chunked", values, dxpl);
    expect(H5Fclose(file) >= 0, "H5Fclose after reading");
    H5Pclose(fapl);
    H5Pclose(dxpl);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("all checks passed\n");
    MPI_Finalize();
    return 0;
}
