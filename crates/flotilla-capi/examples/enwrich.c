/*
 * ENWRICH from C against a running cluster (FLOTILLA_META=HOST:PORT): a one-process job
 * logs overlapping writes in its cache, syncs (one collective flush), writes more and
 * closes (another); the file read back holds the newest bytes everywhere. A second open
 * joining a full job is refused. Exits 0 when all pass.
 *
 *   gcc -std=c11 -Wall -I crates/flotilla-capi/include crates/flotilla-capi/examples/enwrich.c \
 *       -L target/debug -lflotilla_c -Wl,-rpath,$PWD/target/debug -o enwrich
 *   FLOTILLA_META=127.0.0.1:7770 ./enwrich
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flotilla.h"

#define FILE_BYTES 20000

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

static unsigned char model[FILE_BYTES];

/* Writes `length` bytes of value `value` at `offset`, in the cache and in the model. */
static void put(flotilla_enwrich *file, uint64_t offset, size_t length, unsigned char value) {
    unsigned char buffer[FILE_BYTES];
    memset(buffer, value, length);
    MUST(flotilla_enwrich_write(file, offset, buffer, length));
    memset(model + offset, value, length);
}

int main(void) {
    flotilla_client *client = NULL;
    MUST(flotilla_connect(NULL, &client)); /* FLOTILLA_META */
    flotilla_create_options striped = {2, 0644, 1, "stripe:4096"};
    flotilla_file *created = NULL;
    MUST(flotilla_create(client, "/enwrich-c", &striped, &created));
    MUST(flotilla_close(created));

    flotilla_enwrich_options options = {0};
    options.job_name = "c-example";
    options.job_size = 1;
    options.cache_bytes = 1 << 20;
    flotilla_enwrich *file = NULL;
    MUST(flotilla_enwrich_open(client, "/enwrich-c", &options, &file));
    CHECK(flotilla_enwrich_member(file) == 0, "the only member is member 0");
    flotilla_enwrich *second = NULL;
    CHECK(flotilla_enwrich_open(client, "/enwrich-c", &options, &second) < 0, "a full job refuses a member");

    put(file, 0, 10000, 'a');
    put(file, 5000, 10000, 'b'); /* newer: wins over 'a' in 5000..10000 */
    MUST(flotilla_enwrich_sync(file));
    put(file, 2000, 1000, 'c');
    put(file, 14000, 6000, 'd');
    MUST(flotilla_enwrich_close(file));

    flotilla_file *reading = NULL;
    MUST(flotilla_open(client, "/enwrich-c", &reading));
    uint64_t size = 0;
    MUST(flotilla_file_size(reading, &size));
    CHECK(size == FILE_BYTES, "size %" PRIu64 ", expected %d", size, FILE_BYTES);
    static unsigned char back[FILE_BYTES];
    flotilla_request whole = {.kind = FLOTILLA_SHAPE_CONTIGUOUS, .length = FILE_BYTES};
    MUST(flotilla_file_read(reading, &whole, back, sizeof back));
    CHECK(memcmp(back, model, FILE_BYTES) == 0, "the file differs from the newest-wins model");
    MUST(flotilla_close(reading));
    MUST(flotilla_disconnect(client));
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
