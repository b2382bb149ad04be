/* One safetensors file: header parsing and validation, tensor views. */
#include "checkpoint/safetensors.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/mapped_file.h"

/* Largest integer a JSON number (a double) holds exactly. */
#define MAX_JSON_INT (1ull << 53)
/* Longest tensor name printed in an error message. */
#define NAME_IN_MSG "%.200s"

struct ml_safetensors {
    const char *label;   /* points into this allocation */
    ml_mapped_file file; /* owned mapping; zeroed for ml_safetensors_parse */
    size_t n;
    ml_tensor_view *tensors; /* (n), sorted by name; points into this allocation */
};

/* ---- tensor views ------------------------------------------------------ */

int64_t ml_tensor_view_numel(const ml_tensor_view *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

ml_status ml_tensor_view_read_f32(const ml_tensor_view *t, float *out, char *err, size_t errlen)
{
    size_t n = (size_t)ml_tensor_view_numel(t);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case ML_DTYPE_F32: memcpy(out, p, n * sizeof *out); return ML_OK;
    case ML_DTYPE_BF16:
    case ML_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            out[i] = t->dtype == ML_DTYPE_BF16 ? ml_bf16_to_f32(h) : ml_f16_to_f32(h);
        }
        return ML_OK;
    case ML_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            out[i] = ml_f8e4m3_to_f32(p[i]);
        return ML_OK;
    case ML_DTYPE_I32:
    case ML_DTYPE_I64:
    case ML_DTYPE_U8: break;
    }
    return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                   "tensor '" NAME_IN_MSG "': dtype %s is not a float type", t->name,
                   ml_dtype_name(t->dtype));
}

ml_status ml_tensor_view_read_i64(const ml_tensor_view *t, int64_t *out, char *err, size_t errlen)
{
    size_t n = (size_t)ml_tensor_view_numel(t);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case ML_DTYPE_I64: memcpy(out, p, n * sizeof *out); return ML_OK;
    case ML_DTYPE_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, sizeof v);
            out[i] = v;
        }
        return ML_OK;
    case ML_DTYPE_U8:
        for (size_t i = 0; i < n; i++)
            out[i] = p[i];
        return ML_OK;
    case ML_DTYPE_BF16:
    case ML_DTYPE_F16:
    case ML_DTYPE_F32:
    case ML_DTYPE_F8_E4M3: break;
    }
    return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                   "tensor '" NAME_IN_MSG "': dtype %s is not an integer type", t->name,
                   ml_dtype_name(t->dtype));
}

/* ---- header parsing ---------------------------------------------------- */

/* Valid safetensors dtypes this build does not handle: ML_ERR_UNSUPPORTED
 * rather than ML_ERR_FORMAT for them. */
static int is_foreign_dtype(const char *s)
{
    static const char *const names[] = {"BOOL", "I8", "I16", "U16", "U32", "U64", "F64", "F8_E5M2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i]))
            return 1;
    return 0;
}

/* v is an integral number in [0, 2^53]. */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)MAX_JSON_INT) || (double)(uint64_t)d != d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Fill *t from the header entry e (name already set). data_size is the size
 * of the data region that begins at data. */
static ml_status parse_entry(ml_tensor_view *t, const cJSON *e, const unsigned char *data,
                             uint64_t data_size, const char *label, char *err, size_t errlen)
{
#define BAD(...) ml_fail(err, errlen, ML_ERR_FORMAT, __VA_ARGS__)
    if (!cJSON_IsObject(e))
        return BAD("%s: tensor '" NAME_IN_MSG "': entry is not an object", label, t->name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype))
        return BAD("%s: tensor '" NAME_IN_MSG "': missing or non-string dtype", label, t->name);
    if (!ml_dtype_from_name(dtype->valuestring, &t->dtype)) {
        if (is_foreign_dtype(dtype->valuestring))
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "%s: tensor '" NAME_IN_MSG "': dtype %s is not supported", label,
                           t->name, dtype->valuestring);
        return BAD("%s: tensor '" NAME_IN_MSG "': unknown dtype \"%.32s\"", label, t->name,
                   dtype->valuestring);
    }
    if (!cJSON_IsArray(shape))
        return BAD("%s: tensor '" NAME_IN_MSG "': missing or non-list shape", label, t->name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ML_TENSOR_MAX_DIMS)
        return BAD("%s: tensor '" NAME_IN_MSG "': %d dimensions, at most %d supported", label,
                   t->name, ndim, ML_TENSOR_MAX_DIMS);
    t->ndim = ndim;
    int i = 0, zero = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t dim;
        if (!json_u53(d, &dim))
            return BAD("%s: tensor '" NAME_IN_MSG "': shape[%d] is not a non-negative integer",
                       label, t->name, i);
        t->shape[i] = (int64_t)dim;
        zero |= dim == 0;
    }
    /* numel × element size without overflow: each partial product of a
     * non-empty tensor must fit the data region. */
    uint64_t bytes = zero ? 0 : ml_dtype_size(t->dtype);
    for (i = 0; i < ndim && bytes; i++)
        if (__builtin_mul_overflow(bytes, (uint64_t)t->shape[i], &bytes) || bytes > data_size)
            return BAD("%s: tensor '" NAME_IN_MSG "': shape needs more than the %llu-byte data "
                       "region",
                       label, t->name, (unsigned long long)data_size);
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u53(offs->child, &begin) ||
        !json_u53(offs->child->next, &end))
        return BAD("%s: tensor '" NAME_IN_MSG "': data_offsets must be [begin, end] integers",
                   label, t->name);
    if (begin > end || end > data_size)
        return BAD("%s: tensor '" NAME_IN_MSG
                   "': data_offsets [%llu, %llu] outside the %llu-byte data "
                   "region",
                   label, t->name, (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)data_size);
    if (end - begin != bytes)
        return BAD("%s: tensor '" NAME_IN_MSG
                   "': data_offsets span %llu bytes, dtype %s x shape needs "
                   "%llu",
                   label, t->name, (unsigned long long)(end - begin), ml_dtype_name(t->dtype),
                   (unsigned long long)bytes);
    t->data = data + begin;
    t->nbytes = (size_t)bytes;
    return ML_OK;
#undef BAD
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const ml_tensor_view *)a)->name, ((const ml_tensor_view *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const ml_tensor_view *x = *(const ml_tensor_view *const *)a;
    const ml_tensor_view *y = *(const ml_tensor_view *const *)b;
    if (x->data != y->data)
        return (const char *)x->data < (const char *)y->data ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Names unique, byte ranges pairwise disjoint (empty tensors excepted). */
static ml_status check_layout(ml_safetensors *st, char *err, size_t errlen)
{
    qsort(st->tensors, st->n, sizeof *st->tensors, cmp_by_name);
    for (size_t i = 1; i < st->n; i++)
        if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: tensor '" NAME_IN_MSG "' appears twice",
                           st->label, st->tensors[i].name);
    const ml_tensor_view **by_off = malloc((st->n ? st->n : 1) * sizeof *by_off);
    if (!by_off)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", st->label);
    size_t m = 0;
    for (size_t i = 0; i < st->n; i++)
        if (st->tensors[i].nbytes)
            by_off[m++] = &st->tensors[i];
    qsort(by_off, m, sizeof *by_off, cmp_by_offset);
    ml_status rc = ML_OK;
    for (size_t i = 1; i < m && rc == ML_OK; i++) {
        const ml_tensor_view *a = by_off[i - 1], *b = by_off[i];
        if ((const char *)a->data + a->nbytes > (const char *)b->data)
            rc = ml_fail(err, errlen, ML_ERR_FORMAT,
                         "%s: tensors '" NAME_IN_MSG "' and '" NAME_IN_MSG "' overlap", st->label,
                         a->name, b->name);
    }
    free(by_off);
    return rc;
}

/* Parse the file image buf[0..size) into a new object; the caller attaches
 * the mapping (if any) on success. */
static ml_status parse(ml_safetensors **out, const unsigned char *buf, size_t size,
                       const char *label, char *err, size_t errlen)
{
    *out = NULL;
    if (size < ML_SAFETENSORS_LEN_BYTES)
        return ml_fail(err, errlen, ML_ERR_FORMAT,
                       "%s: %zu bytes, too short for the 8-byte header length", label, size);
    uint64_t hlen = 0;
    for (int i = ML_SAFETENSORS_LEN_BYTES - 1; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > ML_SAFETENSORS_MAX_HEADER)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: header length %llu exceeds the limit %u",
                       label, (unsigned long long)hlen, ML_SAFETENSORS_MAX_HEADER);
    if (hlen > size - ML_SAFETENSORS_LEN_BYTES)
        return ml_fail(err, errlen, ML_ERR_FORMAT,
                       "%s: header length %llu exceeds the %zu bytes after it (truncated file?)",
                       label, (unsigned long long)hlen, size - ML_SAFETENSORS_LEN_BYTES);
    const char *json = (const char *)buf + ML_SAFETENSORS_LEN_BYTES;
    const unsigned char *data = buf + ML_SAFETENSORS_LEN_BYTES + hlen;
    uint64_t data_size = size - ML_SAFETENSORS_LEN_BYTES - hlen;
    const char *end = NULL;
    /* The reference requires a JSON object, padded with whitespace only. */
    cJSON *root = hlen && json[0] == '{' ? cJSON_ParseWithLengthOpts(json, hlen, &end, 0) : NULL;
    if (!root)
        return ml_fail(err, errlen, ML_ERR_FORMAT,
                       "%s: header is not a JSON object (error near byte %zu)", label,
                       ML_SAFETENSORS_LEN_BYTES + (end ? (size_t)(end - json) : 0));
    ml_status rc = ML_OK;
    for (const char *p = end; p < json + hlen && rc == ML_OK; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            rc = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: header has trailing bytes at byte %zu",
                         label, ML_SAFETENSORS_LEN_BYTES + (size_t)(p - json));
    /* Count the tensors and their name bytes: one allocation holds the
     * object, the views, the names and the label. */
    size_t n = 0, name_bytes = 0;
    for (const cJSON *e = root->child; e && rc == ML_OK; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e))
                rc =
                    ml_fail(err, errlen, ML_ERR_FORMAT, "%s: __metadata__ is not an object", label);
            continue;
        }
        if (!e->string[0])
            rc = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: a tensor has an empty name", label);
        n++;
        name_bytes += strlen(e->string) + 1;
    }
    size_t label_bytes = strlen(label) + 1;
    ml_safetensors *st = NULL;
    if (rc == ML_OK) {
        st = calloc(1, sizeof *st + n * sizeof(ml_tensor_view) + name_bytes + label_bytes);
        if (!st)
            rc = ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory for %zu tensors", label, n);
    }
    if (rc == ML_OK) {
        st->tensors = (ml_tensor_view *)(st + 1);
        char *names = (char *)(st->tensors + n);
        char *lab = names + name_bytes;
        memcpy(lab, label, label_bytes);
        st->label = lab;
        for (const cJSON *e = root->child; e && rc == ML_OK; e = e->next) {
            if (!strcmp(e->string, "__metadata__"))
                continue;
            ml_tensor_view *t = &st->tensors[st->n++];
            size_t len = strlen(e->string) + 1;
            memcpy(names, e->string, len);
            t->name = names;
            names += len;
            rc = parse_entry(t, e, data, data_size, label, err, errlen);
        }
    }
    cJSON_Delete(root);
    if (rc == ML_OK)
        rc = check_layout(st, err, errlen);
    if (rc != ML_OK) {
        free(st);
        return rc;
    }
    *out = st;
    return ML_OK;
}

/* ---- public ------------------------------------------------------------ */

ml_status ml_safetensors_parse(ml_safetensors **out, const void *buf, size_t size,
                               const char *label, char *err, size_t errlen)
{
    if (!label)
        label = "<buffer>";
    if (!buf && size)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "%s: NULL buffer", label);
    return parse(out, buf, size, label, err, errlen);
}

ml_status ml_safetensors_open(ml_safetensors **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    ml_mapped_file mf;
    ml_status rc = ml_mapped_file_init(&mf, path, 0, err, errlen);
    if (rc != ML_OK)
        return rc;
    rc = parse(out, mf.data, mf.size, path, err, errlen);
    if (rc != ML_OK) {
        ml_mapped_file_deinit(&mf);
        return rc;
    }
    (*out)->file = mf;
    return ML_OK;
}

void ml_safetensors_destroy(ml_safetensors *st)
{
    if (!st)
        return;
    ml_mapped_file_deinit(&st->file);
    free(st);
}

const char *ml_safetensors_label(const ml_safetensors *st)
{
    return st->label;
}

size_t ml_safetensors_count(const ml_safetensors *st)
{
    return st->n;
}

const ml_tensor_view *ml_safetensors_tensor(const ml_safetensors *st, size_t i)
{
    return i < st->n ? &st->tensors[i] : NULL;
}

const ml_tensor_view *ml_safetensors_find(const ml_safetensors *st, const char *name)
{
    ml_tensor_view key = {.name = name};
    return bsearch(&key, st->tensors, st->n, sizeof key, cmp_by_name);
}
