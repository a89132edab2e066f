/*
 * libflotilla_mpiio: MPI-IO straight onto Flotilla, through the MPI profiling interface.
 *
 * Compiled once per MPI (the ABIs differ: MPI_Datatype is a pointer in Open MPI, an int in
 * MPICH), by scripts/build-mpiio.sh:
 *   mpicc.openmpi -shared -fPIC flotilla_mpiio.c -lflotilla_mpiio_core -o .../openmpi/libflotilla_mpiio.so
 *   mpicc.mpich   -shared -fPIC flotilla_mpiio.c -lflotilla_mpiio_core -o .../mpich/libflotilla_mpiio.so
 *
 * Every MPI_File_* function is defined here. A call on a file whose name starts with
 * "flotilla:" (or on a handle this library opened) is served by the Rust core
 * (libflotilla_mpiio_core, crates/flotilla-mpiio); every other call goes to PMPI_File_*.
 * What is collective (open, close, set_size, sync) is done here with the file's
 * communicator; datatypes are decoded with MPI_Type_get_envelope/get_contents and flattened
 * by the core into one structured request per call. See docs/mpi-io.md.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Rust core (plain C types). */
extern const char *fmpi_last_error(void);
extern int fmpi_type_named(uint64_t size, int64_t lb, int64_t extent, uint64_t *out);
extern int fmpi_type_build(uint32_t kind, const int64_t *ints, size_t int_count, const int64_t *addresses,
                           size_t address_count, const uint64_t *children, size_t child_count, uint64_t *out);
extern void fmpi_type_free(uint64_t id);
extern int fmpi_open(const char *path, uint32_t amode, uint32_t striping_factor, uint64_t striping_unit,
                     uint64_t *out);
extern int fmpi_close(uint64_t id);
extern int fmpi_delete(const char *path);
extern int fmpi_set_view(uint64_t id, int64_t disp, uint64_t etype, uint64_t filetype);
extern int fmpi_io(uint64_t id, int write, int explicit_offset, int64_t offset, void *buffer, int64_t count,
                   uint64_t memtype, uint64_t *bytes);
extern int fmpi_get_size(uint64_t id, uint64_t *out);
extern int fmpi_set_size(uint64_t id, int64_t size);
extern int fmpi_sync(uint64_t id);
extern int fmpi_seek(uint64_t id, int64_t offset, int whence);
extern int fmpi_position(uint64_t id, int64_t *out);
extern int fmpi_byte_offset(uint64_t id, int64_t offset, int64_t *out);

enum {
    FMPI_ERR_IO = 1, FMPI_ERR_NO_SUCH_FILE, FMPI_ERR_FILE_EXISTS, FMPI_ERR_ACCESS, FMPI_ERR_TYPE, FMPI_ERR_ARG,
    FMPI_ERR_UNSUPPORTED, FMPI_ERR_NO_SPACE, FMPI_ERR_READ_ONLY, FMPI_ERR_BAD_FILE, FMPI_ERR_QUOTA, FMPI_ERR_AMODE
};
enum { FMPI_MODE_RDONLY = 1, FMPI_MODE_WRONLY = 2, FMPI_MODE_RDWR = 4, FMPI_MODE_CREATE = 8, FMPI_MODE_EXCL = 16 };
enum {
    FMPI_TYPE_DUP = 1, FMPI_TYPE_CONTIGUOUS, FMPI_TYPE_VECTOR, FMPI_TYPE_HVECTOR, FMPI_TYPE_INDEXED,
    FMPI_TYPE_HINDEXED, FMPI_TYPE_INDEXED_BLOCK, FMPI_TYPE_HINDEXED_BLOCK, FMPI_TYPE_STRUCT, FMPI_TYPE_SUBARRAY,
    FMPI_TYPE_RESIZED
};

#define PREFIX "flotilla:"
#define MAGIC 0x466c6f74u

/* One open Flotilla file; its address is the MPI_File handle the program sees. */
typedef struct fl_file {
    uint32_t magic;
    uint64_t id;
    MPI_Comm comm;
    int amode;
    MPI_Offset disp;
    MPI_Datatype etype, filetype;
    MPI_Errhandler errhandler;
    int atomic;
    char *name;
    struct fl_file *next;
} fl_file;

static fl_file *open_files;
static char last_message[1024];

/* The message of the last failure of a flotilla: file call in this process. */
const char *flotilla_mpiio_last_error(void) { return last_message; }

static fl_file *ours(MPI_File fh) {
    for (fl_file *f = open_files; f; f = f->next)
        if ((void *)f == (void *)fh) return f;
    return NULL;
}

static int is_flotilla(const char *name) { return name && strncmp(name, PREFIX, strlen(PREFIX)) == 0; }

/* An FMPI_ERR_* code as an MPI error class, keeping the core's message. */
static int mpi_class(int code) {
    switch (code) {
    case 0: return MPI_SUCCESS;
    case FMPI_ERR_NO_SUCH_FILE: return MPI_ERR_NO_SUCH_FILE;
    case FMPI_ERR_FILE_EXISTS: return MPI_ERR_FILE_EXISTS;
    case FMPI_ERR_ACCESS: return MPI_ERR_ACCESS;
    case FMPI_ERR_TYPE: return MPI_ERR_TYPE;
    case FMPI_ERR_ARG: return MPI_ERR_ARG;
    case FMPI_ERR_UNSUPPORTED: return MPI_ERR_UNSUPPORTED_OPERATION;
    case FMPI_ERR_NO_SPACE: return MPI_ERR_NO_SPACE;
    case FMPI_ERR_READ_ONLY: return MPI_ERR_READ_ONLY;
    case FMPI_ERR_BAD_FILE: return MPI_ERR_FILE;
    case FMPI_ERR_QUOTA: return MPI_ERR_QUOTA;
    case FMPI_ERR_AMODE: return MPI_ERR_AMODE;
    default: return MPI_ERR_IO;
    }
}

/* Records a failure and applies the file's error handler (MPI_ERRORS_RETURN by default). */
static int fail(fl_file *f, int code, const char *what, const char *message) {
    if (code == 0) return MPI_SUCCESS;
    snprintf(last_message, sizeof last_message, "%s: %s", what, message ? message : fmpi_last_error());
    if (getenv("FLOTILLA_MPIIO_VERBOSE")) fprintf(stderr, "libflotilla_mpiio: %s\n", last_message);
    if (f && f->errhandler == MPI_ERRORS_ARE_FATAL) {
        fprintf(stderr, "libflotilla_mpiio: %s\n", last_message);
        MPI_Abort(f->comm, mpi_class(code));
    }
    return mpi_class(code);
}

static int core(fl_file *f, int code, const char *what) { return fail(f, code, what, NULL); }

/* ---- Datatypes -------------------------------------------------------------------------- */

static int type_keyval = MPI_KEYVAL_INVALID;

static int forget_type(MPI_Datatype type, int keyval, void *value, void *extra) {
    (void)type; (void)keyval; (void)extra;
    fmpi_type_free((uint64_t)(uintptr_t)value);
    return MPI_SUCCESS;
}

/* Registers `type` with the core; `*owned` says whether the caller frees the id afterwards
 * (not for cached ids). Derived types are cached on the type as an attribute, named ones in
 * a small table (their handles are constants). */
#define NAMED_CACHE 64
static struct { MPI_Datatype type; uint64_t id; } named_cache[NAMED_CACHE];
static int named_count;

static int describe(MPI_Datatype type, int cache, uint64_t *out, int *owned);

static int build(MPI_Datatype type, int combiner, uint64_t *out) {
    int ni, na, nd, ignored;
    MPI_Type_get_envelope(type, &ni, &na, &nd, &ignored);
    int *ints = malloc(sizeof(int) * (ni + 1));
    MPI_Aint *addresses = malloc(sizeof(MPI_Aint) * (na + 1));
    MPI_Datatype *types = malloc(sizeof(MPI_Datatype) * (nd + 1));
    int64_t *wide_ints = malloc(sizeof(int64_t) * (ni + 1));
    int64_t *wide_addresses = malloc(sizeof(int64_t) * (na + 1));
    uint64_t *children = calloc(nd + 1, sizeof(uint64_t));
    int code = 0, built = 0;
    uint32_t kind = 0;
    MPI_Type_get_contents(type, ni, na, nd, ints, addresses, types);
    for (int i = 0; i < ni; i++) wide_ints[i] = ints[i];
    for (int i = 0; i < na; i++) wide_addresses[i] = addresses[i];
    if (combiner == MPI_COMBINER_DUP) kind = FMPI_TYPE_DUP;
    else if (combiner == MPI_COMBINER_CONTIGUOUS) kind = FMPI_TYPE_CONTIGUOUS;
    else if (combiner == MPI_COMBINER_VECTOR) kind = FMPI_TYPE_VECTOR;
    else if (combiner == MPI_COMBINER_HVECTOR) kind = FMPI_TYPE_HVECTOR;
    else if (combiner == MPI_COMBINER_INDEXED) kind = FMPI_TYPE_INDEXED;
    else if (combiner == MPI_COMBINER_HINDEXED) kind = FMPI_TYPE_HINDEXED;
    else if (combiner == MPI_COMBINER_INDEXED_BLOCK) kind = FMPI_TYPE_INDEXED_BLOCK;
    else if (combiner == MPI_COMBINER_HINDEXED_BLOCK) kind = FMPI_TYPE_HINDEXED_BLOCK;
    else if (combiner == MPI_COMBINER_STRUCT) kind = FMPI_TYPE_STRUCT;
    else if (combiner == MPI_COMBINER_SUBARRAY) {
        kind = FMPI_TYPE_SUBARRAY;
        int n = ints[0];
        wide_ints[1 + 3 * n] = ints[1 + 3 * n] == MPI_ORDER_C ? 0 : 1;
    } else if (combiner == MPI_COMBINER_RESIZED) kind = FMPI_TYPE_RESIZED;
    if (kind == 0) {
        snprintf(last_message, sizeof last_message,
                 "datatype combiner %d (darray, Fortran or deprecated constructors) is not supported", combiner);
        code = FMPI_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < nd && code == 0; i++) {
        int child_owned = 0;
        code = describe(types[i], 0, &children[i], &child_owned);
        if (code == 0) built = i + 1;
    }
    if (code == 0)
        code = fmpi_type_build(kind, wide_ints, ni, wide_addresses, na, children, nd, out);
    for (int i = 0; i < nd; i++) {
        int a, b, c, child_combiner;
        MPI_Type_get_envelope(types[i], &a, &b, &c, &child_combiner);
        if (child_combiner == MPI_COMBINER_NAMED) continue;
        if (i < built) fmpi_type_free(children[i]);
        MPI_Type_free(&types[i]);
    }
    free(ints); free(addresses); free(types); free(wide_ints); free(wide_addresses); free(children);
    return code;
}

static int describe(MPI_Datatype type, int cache, uint64_t *out, int *owned) {
    int ni, na, nd, combiner;
    *owned = 0;
    if (type == MPI_DATATYPE_NULL) {
        snprintf(last_message, sizeof last_message, "datatype is MPI_DATATYPE_NULL");
        return FMPI_ERR_TYPE;
    }
    MPI_Type_get_envelope(type, &ni, &na, &nd, &combiner);
    if (combiner == MPI_COMBINER_NAMED) {
        for (int i = 0; i < named_count; i++)
            if (named_cache[i].type == type) { *out = named_cache[i].id; return 0; }
        MPI_Count size, lb, extent;
        MPI_Type_size_x(type, &size);
        MPI_Type_get_extent_x(type, &lb, &extent);
        int code = fmpi_type_named((uint64_t)size, (int64_t)lb, (int64_t)extent, out);
        if (code == 0 && named_count < NAMED_CACHE) {
            named_cache[named_count].type = type;
            named_cache[named_count].id = *out;
            named_count++;
        } else if (code == 0) {
            *owned = 1;
        }
        return code;
    }
    if (cache) {
        if (type_keyval == MPI_KEYVAL_INVALID)
            MPI_Type_create_keyval(MPI_TYPE_NULL_COPY_FN, forget_type, &type_keyval, NULL);
        void *value;
        int found = 0;
        MPI_Type_get_attr(type, type_keyval, &value, &found);
        if (found) { *out = (uint64_t)(uintptr_t)value; return 0; }
    }
    int code = build(type, combiner, out);
    if (code != 0) return code;
    if (cache) MPI_Type_set_attr(type, type_keyval, (void *)(uintptr_t)*out);
    else *owned = 1;
    return 0;
}

/* ---- Files ------------------------------------------------------------------------------ */

static uint32_t core_amode(int amode) {
    uint32_t out = 0;
    if (amode & MPI_MODE_RDONLY) out |= FMPI_MODE_RDONLY;
    if (amode & MPI_MODE_WRONLY) out |= FMPI_MODE_WRONLY;
    if (amode & MPI_MODE_RDWR) out |= FMPI_MODE_RDWR;
    if (amode & MPI_MODE_CREATE) out |= FMPI_MODE_CREATE;
    if (amode & MPI_MODE_EXCL) out |= FMPI_MODE_EXCL;
    return out;
}

static long long info_number(MPI_Info info, const char *key) {
    char value[64];
    int found = 0;
    if (info == MPI_INFO_NULL) return 0;
    MPI_Info_get(info, key, sizeof value - 1, value, &found);
    return found ? atoll(value) : 0;
}

int MPI_File_open(MPI_Comm comm, const char *filename, int amode, MPI_Info info, MPI_File *fh) {
    if (!is_flotilla(filename)) return PMPI_File_open(comm, filename, amode, info, fh);
    int rank, code = 0, worst = 0;
    uint64_t id = 0;
    MPI_Comm_rank(comm, &rank);
    if (amode & MPI_MODE_SEQUENTIAL)
        return fail(NULL, FMPI_ERR_UNSUPPORTED, filename, "MPI_MODE_SEQUENTIAL is not supported");
    uint32_t mode = core_amode(amode);
    uint32_t factor = (uint32_t)info_number(info, "striping_factor");
    uint64_t unit = (uint64_t)info_number(info, "striping_unit");
    /* Rank 0 creates (or opens); then the others open what it made. */
    if (rank == 0) code = fmpi_open(filename, mode, factor, unit, &id);
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (worst == 0 && rank != 0) code = fmpi_open(filename, mode & ~(FMPI_MODE_CREATE | FMPI_MODE_EXCL), 0, 0, &id);
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (worst != 0) {
        if (code == 0 && id != 0) fmpi_close(id);
        return code ? core(NULL, code, filename)
                    : fail(NULL, worst, filename, "another rank of the communicator failed to open the file");
    }
    fl_file *f = calloc(1, sizeof *f);
    f->magic = MAGIC;
    f->id = id;
    MPI_Comm_dup(comm, &f->comm);
    f->amode = amode;
    f->etype = MPI_BYTE;
    f->filetype = MPI_BYTE;
    f->errhandler = MPI_ERRORS_RETURN;
    f->name = strdup(filename);
    f->next = open_files;
    open_files = f;
    *fh = (MPI_File)(void *)f;
    if (amode & MPI_MODE_APPEND) fmpi_seek(id, 0, 2);
    return MPI_SUCCESS;
}

static void free_view_types(fl_file *f) {
    int a, b, c, combiner;
    MPI_Type_get_envelope(f->etype, &a, &b, &c, &combiner);
    if (combiner != MPI_COMBINER_NAMED) MPI_Type_free(&f->etype);
    MPI_Type_get_envelope(f->filetype, &a, &b, &c, &combiner);
    if (combiner != MPI_COMBINER_NAMED) MPI_Type_free(&f->filetype);
}

int MPI_File_close(MPI_File *fh) {
    fl_file *f = fh ? ours(*fh) : NULL;
    if (!f) return PMPI_File_close(fh);
    int code = fmpi_close(f->id), rank;
    MPI_Barrier(f->comm);
    MPI_Comm_rank(f->comm, &rank);
    if (code == 0 && (f->amode & MPI_MODE_DELETE_ON_CLOSE) && rank == 0) code = fmpi_delete(f->name);
    int result = core(NULL, code, f->name);
    for (fl_file **p = &open_files; *p; p = &(*p)->next)
        if (*p == f) { *p = f->next; break; }
    free_view_types(f);
    MPI_Comm_free(&f->comm);
    free(f->name);
    f->magic = 0;
    free(f);
    *fh = MPI_FILE_NULL;
    return result;
}

int MPI_File_delete(const char *filename, MPI_Info info) {
    if (!is_flotilla(filename)) return PMPI_File_delete(filename, info);
    return core(NULL, fmpi_delete(filename), filename);
}

int MPI_File_set_size(MPI_File fh, MPI_Offset size) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_set_size(fh, size);
    int rank, code = fmpi_sync(f->id), worst = 0;
    MPI_Comm_rank(f->comm, &rank);
    MPI_Barrier(f->comm);
    if (code == 0 && rank == 0) code = fmpi_set_size(f->id, size);
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, f->comm);
    return code ? core(f, code, "MPI_File_set_size")
                : fail(f, worst, "MPI_File_set_size", "another rank failed to set the size");
}

int MPI_File_preallocate(MPI_File fh, MPI_Offset size) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_preallocate(fh, size);
    uint64_t now = 0;
    int code = fmpi_sync(f->id);
    MPI_Barrier(f->comm);
    if (code == 0) code = fmpi_get_size(f->id, &now);
    int rank;
    MPI_Comm_rank(f->comm, &rank);
    if (code == 0 && rank == 0 && (MPI_Offset)now < size) code = fmpi_set_size(f->id, size);
    MPI_Barrier(f->comm);
    return core(f, code, "MPI_File_preallocate");
}

int MPI_File_get_size(MPI_File fh, MPI_Offset *size) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_size(fh, size);
    uint64_t out = 0;
    int code = fmpi_get_size(f->id, &out);
    if (code == 0) *size = (MPI_Offset)out;
    return core(f, code, "MPI_File_get_size");
}

int MPI_File_get_group(MPI_File fh, MPI_Group *group) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_group(fh, group);
    return MPI_Comm_group(f->comm, group);
}

int MPI_File_get_amode(MPI_File fh, int *amode) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_amode(fh, amode);
    *amode = f->amode;
    return MPI_SUCCESS;
}

int MPI_File_set_info(MPI_File fh, MPI_Info info) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_set_info(fh, info);
    return MPI_SUCCESS; /* hints after open are ignored */
}

int MPI_File_get_info(MPI_File fh, MPI_Info *info) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_info(fh, info);
    return MPI_Info_create(info);
}

static MPI_Datatype keep_type(MPI_Datatype type) {
    int a, b, c, combiner;
    MPI_Type_get_envelope(type, &a, &b, &c, &combiner);
    if (combiner == MPI_COMBINER_NAMED) return type;
    MPI_Datatype copy;
    MPI_Type_dup(type, &copy);
    return copy;
}

int MPI_File_set_view(MPI_File fh, MPI_Offset disp, MPI_Datatype etype, MPI_Datatype filetype, const char *datarep,
                      MPI_Info info) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_set_view(fh, disp, etype, filetype, datarep, info);
    if (!datarep || strcmp(datarep, "native") != 0)
        return fail(f, FMPI_ERR_UNSUPPORTED, "MPI_File_set_view", "only the \"native\" data representation is supported");
    if (f->amode & MPI_MODE_SEQUENTIAL) return fail(f, FMPI_ERR_UNSUPPORTED, "MPI_File_set_view", "sequential mode");
    uint64_t e = 0, t = 0;
    int owned_e = 0, owned_t = 0;
    int code = describe(etype, 1, &e, &owned_e);
    if (code == 0) code = describe(filetype, 1, &t, &owned_t);
    if (code == 0) code = fmpi_set_view(f->id, (int64_t)disp, e, t);
    if (owned_e) fmpi_type_free(e);
    if (owned_t) fmpi_type_free(t);
    if (code == 0) {
        free_view_types(f);
        f->disp = disp;
        f->etype = keep_type(etype);
        f->filetype = keep_type(filetype);
    }
    return core(f, code, "MPI_File_set_view");
}

int MPI_File_get_view(MPI_File fh, MPI_Offset *disp, MPI_Datatype *etype, MPI_Datatype *filetype, char *datarep) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_view(fh, disp, etype, filetype, datarep);
    *disp = f->disp;
    *etype = keep_type(f->etype);
    *filetype = keep_type(f->filetype);
    strcpy(datarep, "native");
    return MPI_SUCCESS;
}

/* One data access: `write`, at `offset` etypes when `explicit_offset`, else at the
 * individual file pointer. One structured request. */
static int access_data(fl_file *f, int write, int explicit_offset, MPI_Offset offset, void *buf, MPI_Count count,
                       MPI_Datatype type, MPI_Status *status, const char *what) {
    uint64_t memtype = 0, bytes = 0;
    int owned = 0;
    int code = describe(type, 1, &memtype, &owned);
    if (code == 0) code = fmpi_io(f->id, write, explicit_offset, (int64_t)offset, buf, (int64_t)count, memtype, &bytes);
    if (owned) fmpi_type_free(memtype);
    if (code == 0 && status != MPI_STATUS_IGNORE) {
        MPI_Status_set_elements_x(status, MPI_BYTE, (MPI_Count)bytes);
        MPI_Status_set_cancelled(status, 0);
    }
    return core(f, code, what);
}

/* A collective access (`COLLECTIVE` 1) first waits for every rank of the file's communicator
 * to enter it, as ROMIO's and OMPIO's collective paths do (both start with an exchange of
 * every rank's offsets): no rank's data move before the slowest rank has called. Programs
 * count on it: a rank's MPI_File_get_size between a sync-barrier and the next collective write
 * must not see the writes of ranks that went ahead into that write (issue 36: 3 runs of 15 of
 * the views test saw another rank's later records). */
static int enter_collective(fl_file *f, int collective) { return collective ? MPI_Barrier(f->comm) : MPI_SUCCESS; }

#define READ_AT(NAME, COLLECTIVE)                                                                           \
    int NAME(MPI_File fh, MPI_Offset offset, void *buf, int count, MPI_Datatype type, MPI_Status *status) { \
        fl_file *f = ours(fh);                                                                              \
        if (!f) return P##NAME(fh, offset, buf, count, type, status);                                      \
        enter_collective(f, COLLECTIVE);                                                                    \
        return access_data(f, 0, 1, offset, buf, count, type, status, #NAME);                             \
    }
#define WRITE_AT(NAME, COLLECTIVE)                                                                                \
    int NAME(MPI_File fh, MPI_Offset offset, const void *buf, int count, MPI_Datatype type, MPI_Status *status) { \
        fl_file *f = ours(fh);                                                                                    \
        if (!f) return P##NAME(fh, offset, buf, count, type, status);                                            \
        enter_collective(f, COLLECTIVE);                                                                          \
        return access_data(f, 1, 1, offset, (void *)buf, count, type, status, #NAME);                            \
    }
#define READ(NAME, COLLECTIVE)                                                              \
    int NAME(MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Status *status) {    \
        fl_file *f = ours(fh);                                                              \
        if (!f) return P##NAME(fh, buf, count, type, status);                               \
        enter_collective(f, COLLECTIVE);                                                    \
        return access_data(f, 0, 0, 0, buf, count, type, status, #NAME);                   \
    }
#define WRITE(NAME, COLLECTIVE)                                                                  \
    int NAME(MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Status *status) {   \
        fl_file *f = ours(fh);                                                                   \
        if (!f) return P##NAME(fh, buf, count, type, status);                                    \
        enter_collective(f, COLLECTIVE);                                                         \
        return access_data(f, 1, 0, 0, (void *)buf, count, type, status, #NAME);                \
    }

/* The collective forms enter together, then each rank's access is served on its own (no
 * exchange of data between ranks yet, docs/mpi-io.md): every rank's access is still one
 * structured request. */
READ_AT(MPI_File_read_at, 0)
READ_AT(MPI_File_read_at_all, 1)
WRITE_AT(MPI_File_write_at, 0)
WRITE_AT(MPI_File_write_at_all, 1)
READ(MPI_File_read, 0)
READ(MPI_File_read_all, 1)
WRITE(MPI_File_write, 0)
WRITE(MPI_File_write_all, 1)

/* Non-blocking forms complete before they return: the request handed back is a generalized
 * request already complete, whose status carries the bytes moved. */
typedef struct { MPI_Count bytes; } done_state;

static int done_query(void *extra, MPI_Status *status) {
    done_state *state = extra;
    MPI_Status_set_elements_x(status, MPI_BYTE, state->bytes);
    MPI_Status_set_cancelled(status, 0);
    status->MPI_SOURCE = MPI_UNDEFINED;
    status->MPI_TAG = MPI_UNDEFINED;
    return MPI_SUCCESS;
}
static int done_free(void *extra) { free(extra); return MPI_SUCCESS; }
static int done_cancel(void *extra, int complete) { (void)extra; (void)complete; return MPI_SUCCESS; }

static int finished_request(int result, MPI_Status *status, MPI_Request *request) {
    if (result != MPI_SUCCESS) return result;
    done_state *state = calloc(1, sizeof *state);
    MPI_Count count = 0;
    MPI_Get_elements_x(status, MPI_BYTE, &count);
    state->bytes = count;
    MPI_Grequest_start(done_query, done_free, done_cancel, state, request);
    MPI_Grequest_complete(*request);
    return MPI_SUCCESS;
}

#define IREAD_AT(NAME, BLOCKING)                                                                                  \
    int NAME(MPI_File fh, MPI_Offset offset, void *buf, int count, MPI_Datatype type, MPI_Request *request) {   \
        fl_file *f = ours(fh);                                                                                    \
        if (!f) return P##NAME(fh, offset, buf, count, type, request);                                           \
        MPI_Status status;                                                                                        \
        return finished_request(access_data(f, 0, 1, offset, buf, count, type, &status, #NAME), &status, request); \
    }
#define IWRITE_AT(NAME)                                                                                                \
    int NAME(MPI_File fh, MPI_Offset offset, const void *buf, int count, MPI_Datatype type, MPI_Request *request) {   \
        fl_file *f = ours(fh);                                                                                         \
        if (!f) return P##NAME(fh, offset, buf, count, type, request);                                                \
        MPI_Status status;                                                                                             \
        return finished_request(access_data(f, 1, 1, offset, (void *)buf, count, type, &status, #NAME), &status,      \
                                request);                                                                              \
    }
#define IREAD(NAME)                                                                                           \
    int NAME(MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Request *request) {                   \
        fl_file *f = ours(fh);                                                                                \
        if (!f) return P##NAME(fh, buf, count, type, request);                                               \
        MPI_Status status;                                                                                    \
        return finished_request(access_data(f, 0, 0, 0, buf, count, type, &status, #NAME), &status, request); \
    }
#define IWRITE(NAME)                                                                                                   \
    int NAME(MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Request *request) {                      \
        fl_file *f = ours(fh);                                                                                         \
        if (!f) return P##NAME(fh, buf, count, type, request);                                                        \
        MPI_Status status;                                                                                             \
        return finished_request(access_data(f, 1, 0, 0, (void *)buf, count, type, &status, #NAME), &status, request); \
    }

IREAD_AT(MPI_File_iread_at, 0)
IWRITE_AT(MPI_File_iwrite_at)
IREAD(MPI_File_iread)
IWRITE(MPI_File_iwrite)

int MPI_File_seek(MPI_File fh, MPI_Offset offset, int whence) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_seek(fh, offset, whence);
    int code_whence = whence == MPI_SEEK_SET ? 0 : whence == MPI_SEEK_CUR ? 1 : whence == MPI_SEEK_END ? 2 : -1;
    return core(f, fmpi_seek(f->id, offset, code_whence), "MPI_File_seek");
}

int MPI_File_get_position(MPI_File fh, MPI_Offset *offset) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_position(fh, offset);
    int64_t out = 0;
    int code = fmpi_position(f->id, &out);
    *offset = out;
    return core(f, code, "MPI_File_get_position");
}

int MPI_File_get_byte_offset(MPI_File fh, MPI_Offset offset, MPI_Offset *disp) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_byte_offset(fh, offset, disp);
    int64_t out = 0;
    int code = fmpi_byte_offset(f->id, offset, &out);
    *disp = out;
    return core(f, code, "MPI_File_get_byte_offset");
}

int MPI_File_get_type_extent(MPI_File fh, MPI_Datatype type, MPI_Aint *extent) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_type_extent(fh, type, extent);
    MPI_Aint lb;
    return MPI_Type_get_extent(type, &lb, extent);
}

int MPI_File_sync(MPI_File fh) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_sync(fh);
    int code = fmpi_sync(f->id);
    MPI_Barrier(f->comm);
    return core(f, code, "MPI_File_sync");
}

int MPI_File_set_atomicity(MPI_File fh, int flag) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_set_atomicity(fh, flag);
    if (flag) return fail(f, FMPI_ERR_UNSUPPORTED, "MPI_File_set_atomicity", "atomic mode is not supported yet");
    f->atomic = 0;
    return MPI_SUCCESS;
}

int MPI_File_get_atomicity(MPI_File fh, int *flag) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_atomicity(fh, flag);
    *flag = f->atomic;
    return MPI_SUCCESS;
}

int MPI_File_set_errhandler(MPI_File fh, MPI_Errhandler errhandler) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_set_errhandler(fh, errhandler);
    f->errhandler = errhandler;
    return MPI_SUCCESS;
}

int MPI_File_get_errhandler(MPI_File fh, MPI_Errhandler *errhandler) {
    fl_file *f = ours(fh);
    if (!f) return PMPI_File_get_errhandler(fh, errhandler);
    *errhandler = f->errhandler;
    return MPI_SUCCESS;
}

/* ---- Not supported yet on flotilla: files: MPI_ERR_UNSUPPORTED_OPERATION ---------------- */

#define UNSUPPORTED(NAME, PARAMS, ARGS)                                                                    \
    int NAME PARAMS {                                                                                     \
        fl_file *f = ours(fh);                                                                            \
        if (!f) return P##NAME ARGS;                                                                      \
        return fail(f, FMPI_ERR_UNSUPPORTED, #NAME, "not supported on flotilla: files yet (docs/mpi-io.md)"); \
    }

UNSUPPORTED(MPI_File_read_shared, (MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Status *status),
            (fh, buf, count, type, status))
UNSUPPORTED(MPI_File_write_shared, (MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Status *status),
            (fh, buf, count, type, status))
UNSUPPORTED(MPI_File_read_ordered, (MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Status *status),
            (fh, buf, count, type, status))
UNSUPPORTED(MPI_File_write_ordered, (MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Status *status),
            (fh, buf, count, type, status))
UNSUPPORTED(MPI_File_iread_shared, (MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, buf, count, type, request))
UNSUPPORTED(MPI_File_iwrite_shared,
            (MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, buf, count, type, request))
UNSUPPORTED(MPI_File_seek_shared, (MPI_File fh, MPI_Offset offset, int whence), (fh, offset, whence))
UNSUPPORTED(MPI_File_get_position_shared, (MPI_File fh, MPI_Offset *offset), (fh, offset))
UNSUPPORTED(MPI_File_read_at_all_begin, (MPI_File fh, MPI_Offset offset, void *buf, int count, MPI_Datatype type),
            (fh, offset, buf, count, type))
UNSUPPORTED(MPI_File_read_at_all_end, (MPI_File fh, void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_write_at_all_begin,
            (MPI_File fh, MPI_Offset offset, const void *buf, int count, MPI_Datatype type),
            (fh, offset, buf, count, type))
UNSUPPORTED(MPI_File_write_at_all_end, (MPI_File fh, const void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_read_all_begin, (MPI_File fh, void *buf, int count, MPI_Datatype type), (fh, buf, count, type))
UNSUPPORTED(MPI_File_read_all_end, (MPI_File fh, void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_write_all_begin, (MPI_File fh, const void *buf, int count, MPI_Datatype type),
            (fh, buf, count, type))
UNSUPPORTED(MPI_File_write_all_end, (MPI_File fh, const void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_read_ordered_begin, (MPI_File fh, void *buf, int count, MPI_Datatype type),
            (fh, buf, count, type))
UNSUPPORTED(MPI_File_read_ordered_end, (MPI_File fh, void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_write_ordered_begin, (MPI_File fh, const void *buf, int count, MPI_Datatype type),
            (fh, buf, count, type))
UNSUPPORTED(MPI_File_write_ordered_end, (MPI_File fh, const void *buf, MPI_Status *status), (fh, buf, status))
UNSUPPORTED(MPI_File_iread_all, (MPI_File fh, void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, buf, count, type, request))
UNSUPPORTED(MPI_File_iwrite_all, (MPI_File fh, const void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, buf, count, type, request))
UNSUPPORTED(MPI_File_iread_at_all,
            (MPI_File fh, MPI_Offset offset, void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, offset, buf, count, type, request))
UNSUPPORTED(MPI_File_iwrite_at_all,
            (MPI_File fh, MPI_Offset offset, const void *buf, int count, MPI_Datatype type, MPI_Request *request),
            (fh, offset, buf, count, type, request))
