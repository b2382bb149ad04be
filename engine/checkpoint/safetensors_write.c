/* safetensors writers: one file, or save_pretrained-style shards + index. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/safetensors.h"

/* The header (after its 8-byte length) is padded to this multiple, so the
 * data region starts aligned (as the reference writer does). */
#define HEADER_ALIGN 8
#define SHARD_NAME_FMT "model-%05d-of-%05d.safetensors"
#define SHARD_NAME_MAX 64
#define NAME_IN_MSG "%.200s"

/* ---- file output ------------------------------------------------------- */

static ml_status pwrite_all(int fd, const void *buf, size_t n, off_t off, const char *path,
                            char *err, size_t errlen)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return ml_fail(err, errlen, ML_ERR_IO, "%s: write: %s", path,
                           w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return ML_OK;
}

/* A file being written as "<path>.tmp" and renamed into place on commit. */
typedef struct out_file {
    int fd;
    char *tmp;        /* owned */
    const char *path; /* borrowed */
} out_file;

static ml_status out_open(out_file *f, const char *path, char *err, size_t errlen)
{
    size_t n = strlen(path) + sizeof ".tmp";
    f->fd = -1;
    f->path = path;
    f->tmp = malloc(n);
    if (!f->tmp)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", path);
    snprintf(f->tmp, n, "%s.tmp", path);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", f->tmp, strerror(errno));
    return ML_OK;
}

/* Close; on rc == ML_OK rename into place, otherwise remove the temporary.
 * Returns the final status. */
static ml_status out_close(out_file *f, ml_status rc, char *err, size_t errlen)
{
    if (f->fd >= 0 && close(f->fd) != 0 && rc == ML_OK)
        rc = ml_fail(err, errlen, ML_ERR_IO, "%s: close: %s", f->tmp, strerror(errno));
    if (rc == ML_OK && rename(f->tmp, f->path) != 0)
        rc = ml_fail(err, errlen, ML_ERR_IO, "%s: rename: %s", f->path, strerror(errno));
    if (rc != ML_OK && f->tmp && f->fd >= 0)
        unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
    f->fd = -1;
    return rc;
}

/* ---- one file ---------------------------------------------------------- */

/* Check t as a writer input; its byte size in *bytes. */
static ml_status check_input(const ml_tensor_view *t, uint64_t *bytes, char *err, size_t errlen)
{
    if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__"))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tensor name \"%s\" is not allowed",
                       t->name ? t->name : "(null)");
    if (t->ndim < 0 || t->ndim > ML_TENSOR_MAX_DIMS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tensor '" NAME_IN_MSG "': ndim %d",
                       t->name, t->ndim);
    uint64_t b = ml_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || __builtin_mul_overflow(b, (uint64_t)t->shape[i], &b))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "tensor '" NAME_IN_MSG "': bad shape[%d] = %lld", t->name, i,
                           (long long)t->shape[i]);
    if (t->data && t->nbytes != b)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "tensor '" NAME_IN_MSG "': nbytes %zu, dtype x shape is %llu", t->name,
                       t->nbytes, (unsigned long long)b);
    *bytes = b;
    return ML_OK;
}

static int cmp_view_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const ml_tensor_view *const *)a)->name,
                  (*(const ml_tensor_view *const *)b)->name);
}

/* check_input on every tensor (sizes in bytes[i]) and no name twice. */
static ml_status check_all(const char *where, const ml_tensor_view *tensors, size_t n,
                           uint64_t *bytes, char *err, size_t errlen)
{
    const ml_tensor_view **by_name = malloc((n ? n : 1) * sizeof *by_name);
    if (!by_name)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", where);
    ml_status rc = ML_OK;
    for (size_t i = 0; i < n && rc == ML_OK; i++) {
        by_name[i] = &tensors[i];
        rc = check_input(&tensors[i], &bytes[i], err, errlen);
    }
    if (rc == ML_OK) {
        qsort(by_name, n, sizeof *by_name, cmp_view_ptr_name);
        for (size_t i = 1; i < n && rc == ML_OK; i++)
            if (!strcmp(by_name[i - 1]->name, by_name[i]->name))
                rc = ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                             "%s: tensor '" NAME_IN_MSG "' given twice", where, by_name[i]->name);
    }
    free(by_name);
    return rc;
}

/* Layout slot of one tensor: its input index and data offsets. */
typedef struct slot {
    const ml_tensor_view *t;
    size_t index;
    uint64_t begin, end;
} slot;

/* Decreasing element size, then input order (qsort is not stable). */
static int cmp_slot_layout(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    size_t sx = ml_dtype_size(x->t->dtype), sy = ml_dtype_size(y->t->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int cmp_slot_name(const void *a, const void *b)
{
    return strcmp(((const slot *)a)->t->name, ((const slot *)b)->t->name);
}

/* The JSON header of the laid-out slots, padded with spaces to
 * HEADER_ALIGN; malloc'd, length in *len. */
static char *build_header(const slot *slots, size_t n, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    int ok = meta && cJSON_AddStringToObject(meta, "format", "pt");
    for (size_t i = 0; i < n && ok; i++) {
        const ml_tensor_view *t = slots[i].t;
        cJSON *e = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        ok = e && shape && offs && cJSON_AddStringToObject(e, "dtype", ml_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim && ok; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)slots[i].begin)) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)slots[i].end));
        if (ok) {
            cJSON_AddItemToObject(e, "shape", shape);
            cJSON_AddItemToObject(e, "data_offsets", offs);
            cJSON_AddItemToObject(root, t->name, e);
        } else {
            cJSON_Delete(e);
            cJSON_Delete(shape);
            cJSON_Delete(offs);
        }
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        return NULL;
    size_t raw = strlen(json);
    size_t padded = (raw + HEADER_ALIGN - 1) / HEADER_ALIGN * HEADER_ALIGN;
    char *out = malloc(padded ? padded : HEADER_ALIGN);
    if (out) {
        memcpy(out, json, raw);
        memset(out + raw, ' ', padded - raw);
        *len = padded;
    }
    cJSON_free(json);
    return out;
}

/* ml_safetensors_write on inputs already checked; bytes[i] is the size of
 * tensors[i]. */
static ml_status write_checked(const char *path, const ml_tensor_view *tensors, size_t n,
                               const uint64_t *bytes, char *err, size_t errlen)
{
    slot *slots = malloc((n ? n : 1) * sizeof *slots);
    if (!slots)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++)
        slots[i] = (slot){&tensors[i], i, 0, 0};
    qsort(slots, n, sizeof *slots, cmp_slot_layout);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        slots[i].begin = total;
        total += bytes[slots[i].index];
        slots[i].end = total;
    }
    size_t hlen = 0;
    char *header = build_header(slots, n, &hlen);
    ml_status rc =
        header ? ML_OK
               : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory for the header", path);
    out_file f = {-1, NULL, path};
    if (rc == ML_OK)
        rc = out_open(&f, path, err, errlen);
    if (rc == ML_OK) {
        unsigned char len_le[ML_SAFETENSORS_LEN_BYTES];
        for (int i = 0; i < ML_SAFETENSORS_LEN_BYTES; i++)
            len_le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
        rc = pwrite_all(f.fd, len_le, sizeof len_le, 0, path, err, errlen);
        if (rc == ML_OK)
            rc = pwrite_all(f.fd, header, hlen, ML_SAFETENSORS_LEN_BYTES, path, err, errlen);
        /* Extend first: tensors without data stay holes. */
        if (rc == ML_OK && ftruncate(f.fd, (off_t)(ML_SAFETENSORS_LEN_BYTES + hlen + total)) != 0)
            rc = ml_fail(err, errlen, ML_ERR_IO, "%s: ftruncate: %s", path, strerror(errno));
        off_t base = (off_t)(ML_SAFETENSORS_LEN_BYTES + hlen);
        for (size_t i = 0; i < n && rc == ML_OK; i++)
            if (slots[i].t->data)
                rc = pwrite_all(f.fd, slots[i].t->data, slots[i].t->nbytes,
                                base + (off_t)slots[i].begin, path, err, errlen);
    }
    if (f.tmp)
        rc = out_close(&f, rc, err, errlen);
    free(header);
    free(slots);
    return rc;
}

ml_status ml_safetensors_write(const char *path, const ml_tensor_view *tensors, size_t n, char *err,
                               size_t errlen)
{
    uint64_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    if (!bytes)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", path);
    ml_status rc = check_all(path, tensors, n, bytes, err, errlen);
    if (rc == ML_OK)
        rc = write_checked(path, tensors, n, bytes, err, errlen);
    free(bytes);
    return rc;
}

/* ---- shards ------------------------------------------------------------ */

static ml_status write_index(const char *dir, const ml_tensor_view *tensors, size_t n,
                             const int *shard_of, int n_shards, uint64_t total, char *err,
                             size_t errlen)
{
    size_t plen = strlen(dir) + sizeof "/" ML_CHECKPOINT_INDEX_FILE;
    char *path = malloc(plen);
    slot *order = malloc((n ? n : 1) * sizeof *order);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = root ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    cJSON *map = root ? cJSON_AddObjectToObject(root, "weight_map") : NULL;
    int ok =
        path && order && meta && map && cJSON_AddNumberToObject(meta, "total_size", (double)total);
    /* save_pretrained writes the map sorted by tensor name. */
    for (size_t i = 0; i < n && ok; i++)
        order[i] = (slot){&tensors[i], i, 0, 0};
    if (ok)
        qsort(order, n, sizeof *order, cmp_slot_name);
    for (size_t i = 0; i < n && ok; i++) {
        char file[SHARD_NAME_MAX];
        snprintf(file, sizeof file, SHARD_NAME_FMT, shard_of[order[i].index] + 1, n_shards);
        ok = cJSON_AddStringToObject(map, order[i].t->name, file) != NULL;
    }
    char *json = ok ? cJSON_Print(root) : NULL;
    ml_status rc = ML_OK;
    if (!json) {
        rc = ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory for the index", dir);
    } else {
        snprintf(path, plen, "%s/%s", dir, ML_CHECKPOINT_INDEX_FILE);
        out_file f;
        rc = out_open(&f, path, err, errlen);
        if (rc == ML_OK)
            rc = pwrite_all(f.fd, json, strlen(json), 0, path, err, errlen);
        if (f.tmp)
            rc = out_close(&f, rc, err, errlen);
    }
    cJSON_free(json);
    cJSON_Delete(root);
    free(order);
    free(path);
    return rc;
}

ml_status ml_safetensors_write_sharded(const char *dir, const ml_tensor_view *tensors, size_t n,
                                       uint64_t max_shard_bytes, int *n_shards, char *err,
                                       size_t errlen)
{
    int *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
    uint64_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    size_t plen = strlen(dir) + 1 + SHARD_NAME_MAX;
    char *path = malloc(plen);
    ml_status rc = shard_of && bytes && path
                       ? check_all(dir, tensors, n, bytes, err, errlen)
                       : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", dir);
    /* Assign shards greedily in input order, as save_pretrained does. */
    int count = 1;
    uint64_t in_shard = 0, total = 0;
    for (size_t i = 0; i < n && rc == ML_OK; i++) {
        if (in_shard > 0 && in_shard + bytes[i] > max_shard_bytes) {
            count++;
            in_shard = 0;
        }
        shard_of[i] = count - 1;
        in_shard += bytes[i];
        total += bytes[i];
    }
    if (rc == ML_OK && count == 1) {
        snprintf(path, plen, "%s/%s", dir, ML_CHECKPOINT_SINGLE_FILE);
        rc = write_checked(path, tensors, n, bytes, err, errlen);
    }
    /* Shard tensors are contiguous runs of the input. */
    size_t start = 0;
    for (int s = 0; count > 1 && s < count && rc == ML_OK; s++) {
        size_t end = start;
        while (end < n && shard_of[end] == s)
            end++;
        snprintf(path, plen, "%s/" SHARD_NAME_FMT, dir, s + 1, count);
        rc = write_checked(path, tensors + start, end - start, bytes + start, err, errlen);
        start = end;
    }
    if (rc == ML_OK && count > 1)
        rc = write_index(dir, tensors, n, shard_of, count, total, err, errlen);
    if (rc == ML_OK && n_shards)
        *n_shards = count;
    free(shard_of);
    free(bytes);
    free(path);
    return rc;
}
