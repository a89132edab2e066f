/*
 * A tour of Flotilla's C API against a running cluster (FLOTILLA_META=HOST:PORT):
 * files, forks, every request shape (contiguous, strided, nested, batched, list), blocking
 * and non-blocking, and error codes with messages. Exits 0 when every check passes.
 *
 *   gcc -std=c11 -Wall -I crates/flotilla-capi/include crates/flotilla-capi/examples/strided.c \
 *       -L target/debug -lflotilla_c -Wl,-rpath,$PWD/target/debug -o strided
 *   FLOTILLA_META=127.0.0.1:7770 ./strided
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flotilla.h"

#define N 64 /* the matrix is N x N doubles, row-major */

static int failures = 0;

#define CHECK(condition, ...)                                                                      \
    do {                                                                                           \
        if (!(condition)) {                                                                        \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", flotilla_last_error_message());                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define MUST(call)                                                                                 \
    do {                                                                                           \
        int64_t status_ = (call);                                                                  \
        if (status_ < 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s = %" PRId64 ": %s\n", __FILE__, __LINE__, #call, status_,   \
                    flotilla_last_error_message());                                                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double element(int row, int column) { return row * 1000.0 + column; }

static int count_entry(const char *name, uint64_t id, uint32_t kind, void *context) {
    (void)name, (void)id, (void)kind;
    (*(int *)context)++;
    return 0;
}

int main(void) {
    flotilla_client *client = NULL;
    MUST(flotilla_connect(NULL, &client)); /* FLOTILLA_META */

    char dir[64], path[96], linear_path[96];
    snprintf(dir, sizeof dir, "/c-example-%d", (int)getpid());
    snprintf(path, sizeof path, "%s/matrix", dir);
    snprintf(linear_path, sizeof linear_path, "%s/linear", dir);
    MUST(flotilla_mkdir(client, dir, 0755));

    /* A file of 2 subfiles addressed explicitly; the matrix goes to subfile 1's data fork. */
    flotilla_create_options options = {.subfiles = 2, .mode = 0644, .exclusive = 1, .layout = "explicit"};
    flotilla_file *file = NULL;
    MUST(flotilla_create(client, path, &options, &file));
    CHECK(flotilla_file_subfiles(file) == 2, "two subfiles");
    flotilla_fork *fork = NULL;
    MUST(flotilla_fork_open(file, 1, NULL, &fork));

    static double matrix[N][N];
    for (int r = 0; r < N; r++)
        for (int c = 0; c < N; c++) matrix[r][c] = element(r, c);

    /* Contiguous write of the whole matrix. */
    flotilla_request whole = {.kind = FLOTILLA_SHAPE_CONTIGUOUS, .length = sizeof matrix};
    CHECK(flotilla_fork_write(fork, &whole, matrix, sizeof matrix) == (int64_t)sizeof matrix, "write");

    /* Strided: column 5, one double per row, packed in memory. */
    double column[N];
    flotilla_request strided = {.kind = FLOTILLA_SHAPE_STRIDED, .file_offset = 5 * sizeof(double),
                                .length = sizeof(double), .file_stride = N * sizeof(double),
                                .memory_stride = sizeof(double), .count = N};
    CHECK(flotilla_fork_read(fork, &strided, column, sizeof column) == (int64_t)sizeof column, "strided");
    for (int r = 0; r < N; r++) CHECK(column[r] == element(r, 5), "column[%d]", r);

    /* Strided backwards: the same column, bottom row first (negative file stride). */
    flotilla_request backwards = strided;
    backwards.file_offset = ((N - 1) * N + 5) * sizeof(double);
    backwards.file_stride = -(int64_t)(N * sizeof(double));
    MUST(flotilla_fork_read(fork, &backwards, column, sizeof column));
    CHECK(column[0] == element(N - 1, 5) && column[N - 1] == element(0, 5), "backwards");

    /* Nested: the 8x4 block at row 10, column 20, into a dense 8x4 array. */
    double block[8][4];
    flotilla_stride_level levels[] = {{.file_stride = N * sizeof(double), .memory_stride = 4 * sizeof(double), .count = 8}};
    flotilla_request nested = {.kind = FLOTILLA_SHAPE_NESTED, .file_offset = (10 * N + 20) * sizeof(double),
                               .length = 4 * sizeof(double), .levels = levels, .level_count = 1};
    CHECK(flotilla_fork_read(fork, &nested, block, sizeof block) == (int64_t)sizeof block, "nested");
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 4; c++) CHECK(block[r][c] == element(10 + r, 20 + c), "block[%d][%d]", r, c);

    /* Batched: the diagonal's first 3 elements of 4 rows 16 apart (a vector inside a loop). */
    double picked[12];
    flotilla_batch_node leaf = {.count = 3, .file_stride = (N + 1) * sizeof(double),
                                .memory_stride = sizeof(double), .size = sizeof(double)};
    flotilla_batch_node outer = {.count = 4, .file_stride = 16 * (N + 1) * sizeof(double),
                                 .memory_stride = 3 * sizeof(double), .children = &leaf, .child_count = 1};
    flotilla_request batched = {.kind = FLOTILLA_SHAPE_BATCHED, .nodes = &outer, .node_count = 1};
    CHECK(flotilla_fork_read(fork, &batched, picked, sizeof picked) == (int64_t)sizeof picked, "batched");
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) CHECK(picked[i * 3 + j] == element(16 * i + j, 16 * i + j), "diagonal");

    /* List: three corners, in any order. */
    double corners[3];
    flotilla_piece pieces[] = {
        {.file_offset = (N * N - 1) * sizeof(double), .memory_offset = 0, .length = sizeof(double)},
        {.file_offset = 0, .memory_offset = sizeof(double), .length = sizeof(double)},
        {.file_offset = (N - 1) * sizeof(double), .memory_offset = 2 * sizeof(double), .length = sizeof(double)}};
    flotilla_request list = {.kind = FLOTILLA_SHAPE_LIST, .pieces = pieces, .piece_count = 3};
    MUST(flotilla_fork_read(fork, &list, corners, sizeof corners));
    CHECK(corners[0] == element(N - 1, N - 1) && corners[1] == 0 && corners[2] == element(0, N - 1), "list");

    /* Non-blocking: 8 column reads in flight at once, then wait for each. */
    static double columns[8][N];
    flotilla_handle *handles[8];
    for (int i = 0; i < 8; i++) {
        flotilla_request one = strided;
        one.file_offset = (uint64_t)i * sizeof(double);
        MUST(flotilla_fork_read_nb(fork, &one, columns[i], sizeof columns[i], &handles[i]));
    }
    for (int i = 0; i < 8; i++) {
        while (flotilla_handle_test(handles[i]) == 0) { /* could do other work here */ }
        CHECK(flotilla_handle_wait(handles[i]) == N * (int64_t)sizeof(double), "wait %d", i);
        flotilla_handle_free(handles[i]);
        CHECK(columns[i][N - 1] == element(N - 1, i), "nb column %d", i);
    }

    /* A second fork next to the data. */
    flotilla_fork *index = NULL;
    MUST(flotilla_fork_create(file, 0, "index", &index));
    const char note[] = "row-major float64";
    flotilla_request note_request = {.kind = FLOTILLA_SHAPE_CONTIGUOUS, .length = sizeof note};
    flotilla_handle *write = NULL;
    MUST(flotilla_fork_write_nb(index, &note_request, note, sizeof note, &write));
    CHECK(flotilla_handle_wait(write) == (int64_t)sizeof note, "nb write");
    flotilla_handle_free(write);
    uint64_t size = 0;
    MUST(flotilla_fork_size(index, &size));
    CHECK(size == sizeof note, "index size %" PRIu64, size);
    MUST(flotilla_fork_close(index));
    MUST(flotilla_fork_remove(file, 0, "index"));

    /* A striped file: linear bytes, every shape works there too. */
    flotilla_create_options striped = {.subfiles = 2, .mode = 0644, .exclusive = 1, .layout = "stripe:4k"};
    flotilla_file *linear = NULL;
    MUST(flotilla_create(client, linear_path, &striped, &linear));
    CHECK(flotilla_file_write(linear, &whole, matrix, sizeof matrix) == (int64_t)sizeof matrix, "linear write");
    MUST(flotilla_file_read(linear, &strided, column, sizeof column));
    CHECK(column[N - 1] == element(N - 1, 5), "linear strided");
    flotilla_handle *linear_read = NULL;
    MUST(flotilla_file_read_nb(linear, &nested, block, sizeof block, &linear_read));
    CHECK(flotilla_handle_wait(linear_read) == (int64_t)sizeof block, "linear nb");
    flotilla_handle_free(linear_read);
    CHECK(block[7][3] == element(17, 23), "linear block");
    MUST(flotilla_close(linear));

    /* Opened with the no-overlap promise: no byte-range tokens, the same bytes. */
    MUST(flotilla_open_flags(client, linear_path, FLOTILLA_OPEN_NO_OVERLAP, &linear));
    MUST(flotilla_file_read(linear, &strided, column, sizeof column));
    CHECK(column[N - 1] == element(N - 1, 5), "no-overlap read");
    MUST(flotilla_close(linear));
    CHECK(flotilla_open_flags(client, linear_path, 0x80, &linear) == -EINVAL, "EINVAL open flags");

    flotilla_attributes stat;
    MUST(flotilla_stat(client, linear_path, &stat));
    CHECK(stat.kind == FLOTILLA_KIND_FILE && stat.size == sizeof matrix && stat.subfiles == 2, "stat");
    int entries = 0;
    MUST(flotilla_readdir(client, dir, count_entry, &entries));
    CHECK(entries == 2, "readdir saw %d entries", entries);

    /* Errors: negative errno plus a message, never a crash. */
    flotilla_file *missing = NULL;
    CHECK(flotilla_open(client, "/no/such/file", &missing) == -ENOENT, "ENOENT");
    CHECK(strstr(flotilla_last_error_message(), "no such") != NULL, "message: %s", flotilla_last_error_message());
    CHECK(flotilla_create(client, path, &options, &missing) == -EEXIST, "EEXIST");
    flotilla_request before_zero = strided;
    before_zero.file_stride = -(int64_t)(N * sizeof(double)); /* runs before offset 0 */
    CHECK(flotilla_fork_read(fork, &before_zero, column, sizeof column) == -EINVAL, "EINVAL before 0");
    CHECK(flotilla_fork_read(fork, &strided, column, 8) == -EINVAL, "EINVAL small buffer");
    flotilla_request unknown = {.kind = 42};
    CHECK(flotilla_fork_read(fork, &unknown, column, sizeof column) == -EINVAL, "EINVAL kind");
    CHECK(flotilla_fork_read(NULL, &strided, column, sizeof column) == -EINVAL, "EINVAL NULL");
    flotilla_batch_node loop = {.count = 1, .size = 8, .child_count = 1};
    loop.children = &loop; /* a cycle: refused by the depth limit */
    flotilla_request cyclic = {.kind = FLOTILLA_SHAPE_BATCHED, .nodes = &loop, .node_count = 1};
    CHECK(flotilla_fork_read(fork, &cyclic, column, sizeof column) == -EINVAL, "EINVAL cycle");

    MUST(flotilla_fork_close(fork));
    MUST(flotilla_close(file));
    MUST(flotilla_remove(client, path));
    MUST(flotilla_remove(client, linear_path));
    MUST(flotilla_rmdir(client, dir));
    MUST(flotilla_disconnect(client));

    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("flotilla C example: all checks passed\n");
    return 0;
}
