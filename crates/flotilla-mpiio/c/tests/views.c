/*
 * The MPI-IO test program of libflotilla_mpiio (4 ranks): run once on a local directory and
 * once on "flotilla:/dir"; the files it leaves must be equal byte for byte, and it prints an
 * FNV-1a digest of each file as rank 0 reads it back through MPI-IO.
 *
 *   views PREFIX      (files PREFIX/cube, PREFIX/records, PREFIX/structs)
 *
 * cube:    a 16x16x16 float64 array, each rank writes a 16x8x8 block through a subarray view
 *          (MPI_File_write_all), then reads its neighbour's block back (MPI_File_read_at_all).
 * records: interleaved records of 48 ints through a resized vector view, written with the
 *          individual file pointer in two calls, read back after a seek; then a strided
 *          memory type (every other int of a buffer) written through a contiguous view.
 * structs: a struct {int; double} resized to 24 bytes as the filetype.
 * entry:   collective writes start only when every rank has entered them (a rank's get_size
 *          before its write_at_all never sees the others' writes of that call).
 * Also: get_size, set_size, get_view, get_position, get_byte_offset, delete, and the error
 * classes of opening a missing file and writing a read-only one.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 16
#define RECORD 48

static int rank, size;
/* Exact error classes are checked on Flotilla; the local run only expects a failure (the
 * MPI libraries' own drivers differ). */
static int on_flotilla;

static void check(int code, const char *what) {
    if (code != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, text);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "rank %d: check failed: %s\n", rank, what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static uint64_t fnv(const unsigned char *data, size_t length) {
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < length; i++) hash = (hash ^ data[i]) * 1099511628211ull;
    return hash;
}

/* Rank 0 reads the whole file through MPI-IO (byte view) and prints its size and digest. */
static void digest(MPI_File fh, const char *name) {
    MPI_Offset bytes;
    check(MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL), "set_view bytes");
    check(MPI_File_get_size(fh, &bytes), "get_size");
    if (rank == 0) {
        unsigned char *all = malloc(bytes + 1);
        MPI_Status status;
        int count;
        check(MPI_File_read_at(fh, 0, all, (int)bytes, MPI_BYTE, &status), "read_at whole");
        MPI_Get_count(&status, MPI_BYTE, &count);
        expect(count == bytes, "whole-file read count");
        printf("%s %lld %016llx\n", name, (long long)bytes, (unsigned long long)fnv(all, bytes));
        free(all);
    }
}

static double cell(int z, int y, int x) { return z * N * N + y * N + x + 0.25; }

static void cube(const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/cube", prefix);
    MPI_File fh;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "striping_factor", "4");
    MPI_Info_set(info, "striping_unit", "4096");
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, info, &fh), "open cube");
    MPI_Info_free(&info);
    int sizes[3] = {N, N, N}, subsizes[3] = {N, N / 2, N / 2};
    MPI_Datatype blocks[4];
    for (int r = 0; r < 4; r++) {
        int starts[3] = {0, (r / 2) * N / 2, (r % 2) * N / 2};
        MPI_Type_create_subarray(3, sizes, subsizes, starts, MPI_ORDER_C, MPI_DOUBLE, &blocks[r]);
        MPI_Type_commit(&blocks[r]);
    }
    int cells = N * (N / 2) * (N / 2);
    double *mine = malloc(sizeof(double) * cells), *theirs = malloc(sizeof(double) * cells);
    int i = 0;
    for (int z = 0; z < N; z++)
        for (int y = 0; y < N / 2; y++)
            for (int x = 0; x < N / 2; x++) mine[i++] = cell(z, y + (rank / 2) * N / 2, x + (rank % 2) * N / 2);
    const MPI_Offset header = 128;
    check(MPI_File_set_view(fh, header, MPI_DOUBLE, blocks[rank], "native", MPI_INFO_NULL), "set_view cube");
    MPI_Status status;
    check(MPI_File_write_all(fh, mine, cells, MPI_DOUBLE, &status), "write_all cube");
    int count;
    MPI_Get_count(&status, MPI_DOUBLE, &count);
    expect(count == cells, "write_all count");
    MPI_Offset position;
    check(MPI_File_get_position(fh, &position), "get_position");
    expect(position == cells, "position after write_all");
    MPI_Offset byte;
    check(MPI_File_get_byte_offset(fh, 8, &byte), "get_byte_offset");
    expect(byte == header + (MPI_Offset)((rank / 2) * N / 2 * N + (rank % 2) * N / 2) * 8 + N * 8,
           "byte offset of the 9th element");
    MPI_Offset disp;
    MPI_Datatype etype, filetype;
    char rep[MPI_MAX_DATAREP_STRING];
    check(MPI_File_get_view(fh, &disp, &etype, &filetype, rep), "get_view");
    expect(disp == header && etype == MPI_DOUBLE && strcmp(rep, "native") == 0, "get_view values");
    MPI_Type_free(&filetype);
    check(MPI_File_sync(fh), "sync cube");
    int next = (rank + 1) % 4;
    check(MPI_File_set_view(fh, header, MPI_DOUBLE, blocks[next], "native", MPI_INFO_NULL), "set_view next");
    check(MPI_File_read_at_all(fh, 0, theirs, cells, MPI_DOUBLE, &status), "read_at_all cube");
    i = 0;
    for (int z = 0; z < N; z++)
        for (int y = 0; y < N / 2; y++)
            for (int x = 0; x < N / 2; x++, i++)
                expect(theirs[i] == cell(z, y + (next / 2) * N / 2, x + (next % 2) * N / 2), "neighbour's block");
    digest(fh, "cube");
    check(MPI_File_close(&fh), "close cube");
    for (int r = 0; r < 4; r++) MPI_Type_free(&blocks[r]);
    free(mine);
    free(theirs);
}

static void records(const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/records", prefix);
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open records");
    MPI_Datatype one, tiled;
    MPI_Type_vector(1, RECORD, RECORD, MPI_INT, &one);
    MPI_Type_create_resized(one, 0, (MPI_Aint)sizeof(int) * RECORD * size, &tiled);
    MPI_Type_commit(&tiled);
    check(MPI_File_set_view(fh, (MPI_Offset)rank * RECORD * sizeof(int), MPI_INT, tiled, "native", MPI_INFO_NULL),
          "set_view records");
    const int total = RECORD * 10;
    int *data = malloc(sizeof(int) * total), *back = calloc(total, sizeof(int));
    for (int i = 0; i < total; i++) data[i] = rank * 1000000 + i;
    MPI_Status status;
    /* Two calls with the individual pointer; the first ends mid-record. */
    check(MPI_File_write(fh, data, 100, MPI_INT, &status), "write records 1");
    check(MPI_File_write(fh, data + 100, total - 100, MPI_INT, &status), "write records 2");
    MPI_Offset position;
    check(MPI_File_get_position(fh, &position), "get_position records");
    expect(position == total, "position after writes");
    check(MPI_File_sync(fh), "sync records");
    MPI_Barrier(MPI_COMM_WORLD); /* sync is collective, not a barrier, in ROMIO */
    MPI_Offset records_bytes;
    check(MPI_File_get_size(fh, &records_bytes), "get_size records");
    if (records_bytes != (MPI_Offset)sizeof(int) * total * size)
        fprintf(stderr, "rank %d: records are %lld bytes\n", rank, (long long)records_bytes);
    expect(records_bytes == (MPI_Offset)sizeof(int) * total * size, "size of the records");
    check(MPI_File_seek(fh, 0, MPI_SEEK_SET), "seek");
    check(MPI_File_read_all(fh, back, total, MPI_INT, &status), "read_all records");
    expect(memcmp(data, back, sizeof(int) * total) == 0, "records read back");
    check(MPI_File_seek(fh, -RECORD, MPI_SEEK_END), "seek end");
    check(MPI_File_get_position(fh, &position), "get_position end");
    /* ROMIO (MPICH) and Flotilla count the etypes of the view before the end of file; Open
     * MPI's OMPIO counts differently, so only the first two are held to it. */
    if (!(position >= 0 && (!on_flotilla || position == total - RECORD)))
        fprintf(stderr, "rank %d: position after seek to the end: %lld\n", rank, (long long)position);
    expect(position >= 0 && (!on_flotilla || position == total - RECORD), "position of the last record");
    /* A strided memory type through a contiguous view past the records. */
    MPI_Datatype every_other;
    MPI_Type_vector(RECORD, 1, 2, MPI_INT, &every_other);
    MPI_Type_commit(&every_other);
    check(MPI_File_set_view(fh, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL), "set_view bytes");
    MPI_Offset after = (MPI_Offset)sizeof(int) * total * size + (MPI_Offset)rank * RECORD * sizeof(int);
    check(MPI_File_write_at_all(fh, after, data, 1, every_other, &status), "write_at_all strided memory");
    check(MPI_File_sync(fh), "sync strided");
    int *plain = malloc(sizeof(int) * RECORD);
    check(MPI_File_read_at(fh, after, plain, RECORD, MPI_INT, &status), "read_at strided");
    for (int i = 0; i < RECORD; i++) expect(plain[i] == data[2 * i], "strided memory written in order");
    /* Non-blocking forms. */
    MPI_Request request;
    memset(plain, 0, sizeof(int) * RECORD);
    check(MPI_File_iread_at(fh, after, plain, RECORD, MPI_INT, &request), "iread_at");
    check(MPI_Wait(&request, &status), "wait");
    int count;
    MPI_Get_count(&status, MPI_INT, &count);
    expect(count == RECORD && plain[1] == data[2], "iread_at data");
    digest(fh, "records");
    check(MPI_File_close(&fh), "close records");
    MPI_Type_free(&one);
    MPI_Type_free(&tiled);
    MPI_Type_free(&every_other);
    free(data);
    free(back);
    free(plain);
}

struct pair { int a; double b; };

static void structs(const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/structs", prefix);
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh), "open structs");
    int lengths[2] = {1, 1};
    MPI_Aint displacements[2] = {offsetof(struct pair, a), offsetof(struct pair, b)};
    MPI_Datatype types[2] = {MPI_INT, MPI_DOUBLE}, pair, spaced;
    MPI_Type_create_struct(2, lengths, displacements, types, &pair);
    MPI_Type_create_resized(pair, 0, 24 * size, &spaced);
    MPI_Type_commit(&pair);
    MPI_Type_commit(&spaced);
    struct pair items[20];
    memset(items, 0, sizeof items); /* the padding too: some MPIs write it */
    for (int i = 0; i < 20; i++) items[i] = (struct pair){rank * 100 + i, i * 0.5 + rank};
    /* The gaps of the view are filled first: MPI leaves unwritten gaps undefined, and ROMIO's
     * data sieving fills them from stale memory when it reads past the end of a file. */
    unsigned char fill[480];
    memset(fill, 0xee, sizeof fill);
    MPI_Status status;
    check(MPI_File_write_at(fh, (MPI_Offset)rank * sizeof fill, fill, sizeof fill, MPI_BYTE, &status), "fill structs");
    check(MPI_File_sync(fh), "sync fill");
    MPI_Barrier(MPI_COMM_WORLD);
    check(MPI_File_sync(fh), "sync fill 2");
    check(MPI_File_set_view(fh, (MPI_Offset)rank * 24, pair, spaced, "native", MPI_INFO_NULL), "set_view structs");
    check(MPI_File_write_all(fh, items, 20, pair, &status), "write_all structs");
    int code = MPI_File_read_at(fh, 0, items, 1, pair, &status), class;
    MPI_Error_class(code, &class);
    expect(code != MPI_SUCCESS && (!on_flotilla || class == MPI_ERR_ACCESS), "reading a WRONLY file is MPI_ERR_ACCESS");
    check(MPI_File_close(&fh), "close structs");
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh), "reopen structs");
    code = MPI_File_write_at(fh, 0, items, 1, pair, &status);
    MPI_Error_class(code, &class);
    expect(code != MPI_SUCCESS && (!on_flotilla || class == MPI_ERR_READ_ONLY), "writing a RDONLY file is MPI_ERR_READ_ONLY");
    digest(fh, "structs");
    check(MPI_File_close(&fh), "close structs 2");
    /* set_size extends; get_size sees it on every rank. */
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open structs rw");
    check(MPI_File_set_size(fh, 24 * 20 * size + 1000), "set_size");
    MPI_Offset bytes;
    check(MPI_File_get_size(fh, &bytes), "get_size after set_size");
    expect(bytes == 24 * 20 * size + 1000, "size after set_size");
    check(MPI_File_close(&fh), "close structs 3");
    MPI_Type_free(&pair);
    MPI_Type_free(&spaced);
}

static void errors_and_delete(const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/missing", prefix);
    MPI_File fh;
    int code = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh), class;
    MPI_Error_class(code, &class);
    expect(code != MPI_SUCCESS && (!on_flotilla || class == MPI_ERR_NO_SUCH_FILE), "opening a missing file is MPI_ERR_NO_SUCH_FILE");
    snprintf(path, sizeof path, "%s/scratch", prefix);
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh), "open scratch");
    check(MPI_File_close(&fh), "close scratch");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) check(MPI_File_delete(path, MPI_INFO_NULL), "delete");
    MPI_Barrier(MPI_COMM_WORLD);
    code = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh);
    MPI_Error_class(code, &class);
    expect(code != MPI_SUCCESS && (!on_flotilla || class == MPI_ERR_NO_SUCH_FILE), "a deleted file is gone");
}

/* A collective access starts only when every rank has entered it: the last rank asks the size
 * ENTRY_ROUNDS times before it enters a write_at_all past the end, which the others enter at
 * once and follow with a sync (which publishes their size); every answer must be the size from
 * before that write. ROMIO and OMPIO begin a collective write with an exchange of offsets, and
 * libflotilla_mpiio with a barrier; without one the others' writes and sync land during the
 * last rank's questions. */
#define ENTRY_BLOCK 64
#define ENTRY_ROUNDS 200

static void collectives_enter_together(const char *prefix) {
    char path[512];
    snprintf(path, sizeof path, "%s/entry", prefix);
    MPI_File fh;
    check(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh), "open entry");
    unsigned char block[ENTRY_BLOCK];
    memset(block, 'a' + rank, sizeof block);
    MPI_Status status;
    check(MPI_File_write_at(fh, (MPI_Offset)rank * ENTRY_BLOCK, block, ENTRY_BLOCK, MPI_BYTE, &status), "write entry");
    check(MPI_File_sync(fh), "sync entry");
    MPI_Barrier(MPI_COMM_WORLD);
    const MPI_Offset before = (MPI_Offset)size * ENTRY_BLOCK;
    if (rank == size - 1) {
        for (int round = 0; round < ENTRY_ROUNDS; round++) {
            MPI_Offset bytes;
            check(MPI_File_get_size(fh, &bytes), "get_size before the collective write");
            if (bytes != before)
                fprintf(stderr, "rank %d: round %d: the size is %lld before the collective write\n", rank, round,
                        (long long)bytes);
            expect(bytes == before, "no rank's collective write before every rank entered it");
        }
    }
    MPI_Offset past = before + (MPI_Offset)rank * ENTRY_BLOCK;
    check(MPI_File_write_at_all(fh, past, block, ENTRY_BLOCK, MPI_BYTE, &status), "write_at_all entry");
    check(MPI_File_sync(fh), "sync entry 2");
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Offset after;
    check(MPI_File_get_size(fh, &after), "get_size after the collective write");
    expect(after == 2 * before, "size after the collective write");
    check(MPI_File_close(&fh), "close entry");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || size != 4) {
        if (rank == 0) fprintf(stderr, "usage: mpiexec -n 4 views PREFIX\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    on_flotilla = strncmp(argv[1], "flotilla:", 9) == 0;
    cube(argv[1]);
    records(argv[1]);
    structs(argv[1]);
    errors_and_delete(argv[1]);
    collectives_enter_together(argv[1]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("all checks passed\n");
    MPI_Finalize();
    return 0;
}
