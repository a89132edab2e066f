/*
 * GFS-GROUP from C against a running cluster (FLOTILLA_META=HOST:PORT): a matrix written and
 * read element by element, column c in fork c % FORKS, in both submission modes; a linear
 * file; mixing reads and writes refused; a failed request named. Exits 0 when all pass.
 *
 *   gcc -std=c11 -Wall -I crates/flotilla-capi/include crates/flotilla-capi/examples/group.c \
 *       -L target/debug -lflotilla_c -Wl,-rpath,$PWD/target/debug -o group
 *   FLOTILLA_META=127.0.0.1:7770 ./group
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flotilla.h"

#define ROWS 200
#define COLUMNS 8
#define FORKS 2
#define ELEMENT 16

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

/* Element (row, column) lives in fork column % FORKS at offset ((column / FORKS) * ROWS + row)
 * * ELEMENT, like the paper's programs (one column after another in each fork). */
static uint64_t offset_of(int row, int column) {
    return ((uint64_t)(column / FORKS) * ROWS + (uint64_t)row) * ELEMENT;
}

static void fill(unsigned char *matrix, int mode) {
    for (int c = 0; c < COLUMNS; c++)
        for (int r = 0; r < ROWS; r++)
            for (int b = 0; b < ELEMENT; b++)
                matrix[((size_t)c * ROWS + r) * ELEMENT + b] = (unsigned char)(r * 7 + c * 13 + b + mode);
}

static void matrix_round_trip(flotilla_fork **forks, int mode) {
    static unsigned char matrix[COLUMNS * ROWS * ELEMENT], back[COLUMNS * ROWS * ELEMENT];
    fill(matrix, mode);
    flotilla_group_options options = {0};
    options.mode = mode;
    options.pending_requests_max = 64;
    flotilla_group *group = NULL;
    MUST(flotilla_group_new(&options, &group));
    for (int c = 0; c < COLUMNS; c++) {
        for (int r = 0; r < ROWS; r++)
            MUST(flotilla_group_write_fork(group, forks[c % FORKS], offset_of(r, c),
                                           &matrix[((size_t)c * ROWS + r) * ELEMENT], ELEMENT));
    }
    MUST(flotilla_group_doneio(group));
    MUST(flotilla_group_waitio(group));
    memset(back, 0, sizeof back);
    for (int c = 0; c < COLUMNS; c++) {
        for (int r = 0; r < ROWS; r++)
            MUST(flotilla_group_read_fork(group, forks[c % FORKS], offset_of(r, c),
                                          &back[((size_t)c * ROWS + r) * ELEMENT], ELEMENT));
    }
    /* testio until done (bounded), then waitio (which must find nothing left). */
    struct timespec pause = {0, 100000};
    for (int i = 0; i < 100000 && flotilla_group_testio(group) == 0; i++)
        nanosleep(&pause, NULL);
    MUST(flotilla_group_waitio(group));
    CHECK(memcmp(matrix, back, sizeof matrix) == 0, "mode %d: matrix read back differs", mode);
    MUST(flotilla_group_free(group));
}

int main(void) {
    flotilla_client *client = NULL;
    MUST(flotilla_connect(NULL, &client)); /* FLOTILLA_META */
    char path[64], linear_path[64];
    snprintf(path, sizeof path, "/group-c-%d", (int)getpid());
    snprintf(linear_path, sizeof linear_path, "/group-c-linear-%d", (int)getpid());

    flotilla_create_options explicit_options = {FORKS, 0644, 1, "explicit"};
    flotilla_file *file = NULL;
    MUST(flotilla_create(client, path, &explicit_options, &file));
    flotilla_fork *forks[FORKS];
    for (int i = 0; i < FORKS; i++)
        MUST(flotilla_fork_open(file, (uint32_t)i, NULL, &forks[i]));

    matrix_round_trip(forks, FLOTILLA_GROUP_NOSEND);
    matrix_round_trip(forks, FLOTILLA_GROUP_SEND);

    /* A linear (striped) file, written backwards in 100-byte pieces, read back forwards. */
    flotilla_create_options striped = {2, 0644, 1, "stripe:4096"};
    flotilla_file *linear = NULL;
    MUST(flotilla_create(client, linear_path, &striped, &linear));
    static unsigned char data[50000], again[50000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 31 + 5);
    flotilla_group *group = NULL;
    MUST(flotilla_group_new(NULL, &group));
    for (int piece = 499; piece >= 0; piece--)
        MUST(flotilla_group_write_file(group, linear, (uint64_t)piece * 100, &data[piece * 100], 100));

    /* Reading before doneio is refused, with a message saying why. */
    unsigned char one[1];
    int mixed = flotilla_group_read_file(group, linear, 0, one, 1);
    CHECK(mixed == -EINVAL, "mixing returned %d", mixed);
    CHECK(strstr(flotilla_last_error_message(), "doneio") != NULL, "message: %s",
          flotilla_last_error_message());
    MUST(flotilla_group_doneio(group));
    MUST(flotilla_group_waitio(group));
    for (int piece = 0; piece < 500; piece++)
        MUST(flotilla_group_read_file(group, linear, (uint64_t)piece * 100, &again[piece * 100], 100));
    MUST(flotilla_group_waitio(group));
    CHECK(memcmp(data, again, sizeof data) == 0, "linear file read back differs");

    /* A request to a fork that does not exist fails at waitio, named. */
    MUST(flotilla_group_doneio(group));
    flotilla_fork *missing = NULL;
    MUST(flotilla_fork_open(file, 0, "missing", &missing));
    MUST(flotilla_group_write_fork(group, missing, 4096, data, 10));
    int failed = flotilla_group_waitio(group);
    CHECK(failed < 0, "a write to a missing fork succeeded");
    CHECK(strstr(flotilla_last_error_message(), "offset 4096") != NULL, "message: %s",
          flotilla_last_error_message());
    MUST(flotilla_group_free(group));
    CHECK(flotilla_group_waitio(NULL) == -EINVAL, "NULL group accepted");

    MUST(flotilla_fork_close(missing));
    for (int i = 0; i < FORKS; i++)
        MUST(flotilla_fork_close(forks[i]));
    MUST(flotilla_close(linear));
    MUST(flotilla_close(file));
    MUST(flotilla_disconnect(client));
    if (failures > 0) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
